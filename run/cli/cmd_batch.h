/* `krun batch MODEL.kpk IN.jsonl OUT.jsonl`: OpenAI Batch requests, many to a sweep, resumable. */
#ifndef KRUN_CMD_BATCH_H
#define KRUN_CMD_BATCH_H

int krun_batch_main(int argc, char **argv);

#endif
