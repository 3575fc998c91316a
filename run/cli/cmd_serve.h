/* `krun serve`: an OpenAI-compatible HTTP server over the session API, batching concurrent
 * requests into one forward sweep (docs/SERVE.md).  main() dispatches here when argv[1] is
 * "serve". */
#ifndef KRUN_CMD_SERVE_H
#define KRUN_CMD_SERVE_H

/* argv[0] is "serve".  Returns the process exit status (krun_err.h). */
int krun_serve_main(int argc, char **argv);

#endif
