/* `krun chat`: an interactive conversation in a terminal, keeping the model's state between
 * turns so that each turn runs only its new tokens.  main() dispatches here when argv[1] is
 * "chat". */
#ifndef KRUN_CMD_CHAT_H
#define KRUN_CMD_CHAT_H

/* argv[0] is "chat".  Returns the process exit status (krun_err.h). */
int krun_chat_main(int argc, char **argv);

#endif
