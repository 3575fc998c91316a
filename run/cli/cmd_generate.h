/* `krun MODEL.kpk --prompt ...`: the one-shot command.  A prompt in, the
 * generated text out, with the statistics of every decoding step on stderr
 * and in --json.  main() dispatches here when argv[1] is no other command. */
#ifndef KRUN_CMD_GENERATE_H
#define KRUN_CMD_GENERATE_H

/* argv as main's.  Returns the process exit status (krun_err.h). */
int krun_generate_main(int argc, char **argv);

#endif
