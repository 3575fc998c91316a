/* Shared by the libFuzzer harnesses (tests/fuzz/fuzz_NAME.c) and their replay
 * driver (tests/fuzz/replay.c).
 *
 * A harness defines LLVMFuzzerTestOneInput (and may define
 * LLVMFuzzerInitialize).  Besides memory errors, which the sanitizers catch,
 * it checks what must hold of any answer the code under test gives
 * (FUZZ_CHECK): a broken invariant aborts, so a wrong result is a crash too.
 * It counts inputs the code accepted in fuzz_accepted, which lets the replay
 * test prove that a known-good input really goes all the way through. */
#ifndef FUZZ_H
#define FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

extern unsigned long fuzz_accepted;

#define FUZZ_CHECK(cond)                                                                               \
    do {                                                                                               \
        if (!(cond)) {                                                                                 \
            fprintf(stderr, "fuzz invariant broken: %s (%s:%d)\n", #cond, __FILE__, __LINE__);        \
            abort();                                                                                   \
        }                                                                                              \
    } while (0)

/* FUZZ_HARNESS_LOOP marks a harness's own checking code (walks, searches,
 * comparisons of results): libFuzzer's comparison tracing there costs most
 * of an execution (fuzz_schema: 3/4 of its time in __sanitizer_cov_trace_cmp
 * called from its walk) and finds nothing, since the code under test is what
 * the coverage should steer.  The code under test keeps full instrumentation. */
#if defined(__clang__) && __clang_major__ >= 13
#define FUZZ_HARNESS_LOOP __attribute__((no_sanitize("coverage")))
#else
#define FUZZ_HARNESS_LOOP
#endif

/* The input as a file the code under test can open by path: one memfd per
 * process, rewritten for every input.  Writes "/proc/self/fd/N" into path
 * (at least 64 bytes).  Returns 0, or -1 if the file cannot be written (the
 * input is then skipped: that is the harness's trouble, not a finding). */
int fuzz_as_file(const uint8_t *data, size_t size, char *path);

#endif
