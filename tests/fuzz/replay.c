/* Replays inputs through a fuzz harness without libFuzzer: the regression
 * test of every crash the fuzzers found (tests/fuzz/regress/NAME/) and of
 * the seeds, in the normal and sanitizer builds.
 *
 *   fuzz_replay_NAME FILE|DIR...
 *
 * Runs every file once; an input that crashes or breaks an invariant aborts
 * (the test fails).  Prints one line: inputs run, and how many the code
 * under test accepted all the way through. */
#include "fuzz.h"

#include "format/kio.h"

#include <dirent.h>
#include <string.h>
#include <sys/stat.h>

__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

static unsigned long n_run;

static int run_file(const char *path)
{
    char *buf;
    size_t len;
    if (kio_read_file(path, (size_t)1 << 30, &buf, &len)) {
        perror(path);
        return -1;
    }
    LLVMFuzzerTestOneInput((const uint8_t *)buf, len);
    free(buf);
    n_run++;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int run_path(const char *path)
{
    struct stat st;
    DIR *d;
    struct dirent *de;
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    if (stat(path, &st)) { perror(path); return -1; }
    if (!S_ISDIR(st.st_mode)) return run_file(path);
    if (!(d = opendir(path))) { perror(path); return -1; }
    while ((de = readdir(d))) {
        char *full;
        if (de->d_name[0] == '.') continue;
        if (n == cap) {
            char **p = realloc(names, (cap = cap ? cap * 2 : 64) * sizeof *names);
            if (!p) { rc = -1; break; }
            names = p;
        }
        if (asprintf(&full, "%s/%s", path, de->d_name) < 0) { rc = -1; break; }
        names[n++] = full;
    }
    closedir(d);
    if (names) qsort(names, n, sizeof *names, cmp_str); /* same order every run */
    for (size_t i = 0; i < n; i++) {
        if (!rc && run_path(names[i])) rc = -1;
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    int rc = 0;
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
        return 2;
    }
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    for (int i = 1; i < argc; i++)
        if (run_path(argv[i])) rc = 2;
    printf("replayed %lu inputs, %lu accepted\n", n_run, fuzz_accepted);
    return rc;
}
