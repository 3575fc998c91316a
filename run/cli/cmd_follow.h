/* A rank other than 0 under mpirun: cmd_follow.c. */
#ifndef KRUN_CMD_FOLLOW_H
#define KRUN_CMD_FOLLOW_H

int krun_follow_main(int argc, char **argv);

#endif
