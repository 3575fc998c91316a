/* kpack check-source DIR: is this download complete and intact? */
#include "cli.h"
#include "drafter.h"
#include "report.h"
#include "source.h"
#include "format/kargs.h"
#include "format/kprogress.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: kpack check-source DIR [--sha256 SUMS] [--threads N] [--json] [--quiet]\n"
    "\n"
    "Checks a Kimi K3 download before converting it: config.json parses; every\n"
    "shard the index names exists; every header parses; each file holds 8 +\n"
    "header + the largest data end (a partial download is caught; bytes after\n"
    "the last tensor are kept in the archive); every tensor the model needs is\n"
    "present with the right dtype and shape (a non-text tensor may have any\n"
    "safetensors dtype), nothing overlaps, nothing unknown. With --sha256\n"
    "(sha256sum format), or when DIR is a Hugging Face cache snapshot (blob\n"
    "names are SHA-256), every shard is hashed, N at a time (default: all\n"
    "cores; use 1 on a single HDD).\n"
    "\n"
    "  --sha256 SUMS   expected SHA-256 of the files, as printed by sha256sum\n"
    "  --threads N     files hashed at once\n"
    "  --json          machine-readable report on stdout\n"
    "  --quiet         no progress line\n"
    "\n"
    "Prints a verdict per shard and names every problem.\n"
    "Exit: 0 all good, 1 problems found, 2 cannot run (usage; DIR or a file in it\n"
    "      cannot be read: an I/O error or a permission, not a verdict on the download).\n";

int cmd_check_source(int argc, char **argv)
{
    const char *dir = NULL, *sums = NULL, *v;
    int json = 0, quiet = 0, threads = kx_cpus();
    k3_source src;
    char err[1500];
    double t0, t_index, t_sha = 0;
    long n;

    for (int i = 1; i < argc; i++) {
        if (kx_flag(argc, argv, &i, "--help", NULL) || kx_flag(argc, argv, &i, "-h", NULL)) { fputs(usage, stdout); return KX_OK; }
        else if (kx_flag(argc, argv, &i, "--sha256", &v)) sums = v;
        else if (kx_flag(argc, argv, &i, "--threads", &v)) {
            if (kargs_long(v, 1, 256, &n)) { kx_error("--threads: expected 1..256, got %s", v); return KX_FAIL; }
            threads = (int)n;
        } else if (kx_flag(argc, argv, &i, "--json", NULL)) json = 1;
        else if (kx_flag(argc, argv, &i, "--quiet", NULL)) quiet = 1;
        else if (argv[i][0] == '-') { kx_error("check-source: unknown option %s", argv[i]); fputs(usage, stderr); return KX_FAIL; }
        else if (!dir) dir = argv[i];
        else { kx_error("check-source: unexpected argument %s", argv[i]); return KX_FAIL; }
    }
    if (!dir) { fputs(usage, stderr); return KX_FAIL; }

    if (!kx_is_dir(dir)) return KX_FAIL;
    switch (kd_is_drafter_dir(dir)) {
    case 1: return kd_check_source(dir, sums, json, quiet);
    case -1: kx_error("%s/config.json: %s", dir, strerror(errno)); return KX_FAIL;
    }
    t0 = know();
    /* The directory is readable; failing to index it means the download is
     * bad, unless a file could not be read at all (exit 2, as for any I/O error). */
    if (ks_open(dir, sums, &src, err, sizeof err)) {
        int io = ks_io_errno(&src);
        kx_error("%s%s", err, io ? "; an I/O error, not a verdict on the download: fix the cause and rerun" : "");
        ks_free(&src);
        return io ? KX_FAIL : KX_BAD;
    }
    t_index = know() - t0;
    if (ks_sha_bytes(&src)) {
        double t1 = know();
        ks_check_sha256(&src, threads, !quiet && !json);
        t_sha = know() - t1;
    }
    if (json) {
        json_t *j = kr_source_json(&src);
        json_object_set_new(j, "index_seconds", json_real(t_index));
        json_object_set_new(j, "sha256_seconds", json_real(t_sha));
        json_dumpf(j, stdout, JSON_INDENT(1) | JSON_SORT_KEYS);
        fputc('\n', stdout);
        json_decref(j);
    } else {
        kr_source_print(&src, stdout);
        printf("indexed %zu headers in %.2f s%s", src.n_shards, t_index, t_sha > 0 ? "" : "\n");
        if (t_sha > 0) {
            char b[32];
            kfmt_bytes(ks_sha_bytes(&src), b, sizeof b);
            printf("; SHA-256 of %s in %.1f s (%.0f MB/s)\n", b, t_sha, (double)ks_sha_bytes(&src) / t_sha / 1e6);
        }
        printf("verdict: %s\n", ks_ok(&src) ? "OK" : "BAD");
    }
    {
        int ok = ks_ok(&src), io = ks_io_errno(&src);
        if (io) kx_error("%s could not be read (%s): an I/O error, not a verdict on the download; fix the cause and rerun",
                         dir, strerror(io));
        ks_free(&src);
        return io ? KX_FAIL : ok ? KX_OK : KX_BAD;
    }
}
