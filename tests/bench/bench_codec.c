/* bench_codec: the codec-2 measurements of docs/PERFORMANCE.md ("Compressed
 * blocks").  CPU only: everything is read into memory first (page cache warm).
 *
 *   bench_codec decode FILE.kpk [--threads N] [--runs R]
 *       decodes every codec-2 block of a converted file (its real blocks, as
 *       kpack wrote them), on 1 thread and on N: stored/raw and GB/s of raw
 *       output by kind and by block class, the median of R runs.
 *   bench_codec explore FILE.kpk --levels 1,3 --blocks 1M,2M [--min-saving F]
 *                       [--sample-mb N] [--threads N] [--runs R]
 *       cuts the (uncompressed) file's globals, trunk and expert extents into
 *       blocks as kpack would, encodes a sample of every class at each level
 *       and block size, and reports stored/raw, encode MB/s (1 thread) and
 *       decode GB/s (1 and N threads) per class: how the defaults were chosen.
 *
 * Build (tests/bench/bench_kpack.sh does):
 *   cc -O2 -I. tests/bench/bench_codec.c build/libkpack.a build/libkpkformat.a \
 *      -lzstd -lxxhash -lcrypto -ljansson -lpcre2-8 -lpthread -lm */
#include "format/kpk_encode.h"
#include "format/kpk_reader.h"
#include "pack/blocks.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* CPU seconds of the whole process (every thread): "per core" figures divide
 * by this, so they hold on a machine others are using too. */
static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void die(const char *m)
{
    fprintf(stderr, "bench_codec: %s\n", m);
    exit(2);
}

/* One block in memory: its record, its stored bytes, where to decode it. */
struct blk { kpk_block rec; uint8_t *stored; int cls, kind; };

struct set {
    struct blk *b;
    size_t n, cap;
};

static void push(struct set *s, struct blk b)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 1024;
        if (!(s->b = realloc(s->b, sizeof *s->b * s->cap))) die("out of memory");
    }
    s->b[s->n++] = b;
}

/* ---- decoding, 1..N threads ------------------------------------------------ */

struct djob { const struct set *s; int cls; _Atomic size_t next; uint8_t *out; int failed; };

static void *dworker(void *arg)
{
    struct djob *j = arg;
    uint8_t *raw = malloc(KPK_MAX_BLOCK_RAW);
    if (!raw) die("out of memory");
    for (;;) {
        size_t i = atomic_fetch_add(&j->next, 1);
        kpk_err e = {0};
        if (i >= j->s->n) break;
        if (j->cls >= 0 && j->s->b[i].cls != j->cls) continue;
        if (kpk_block_decode_one(&j->s->b[i].rec, j->s->b[i].stored, raw, &e)) { fprintf(stderr, "decode: %s\n", e.msg); j->failed = 1; }
    }
    free(raw);
    return NULL;
}

static void sort(double *t, int n)
{
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++)
            if (t[b] < t[a]) { double x = t[a]; t[a] = t[b]; t[b] = x; }
}

/* Seconds to decode every block of class cls (-1: all) with n threads: the
 * median of runs, wall clock; *cpu: the median CPU seconds (all threads). */
static double decode_time(const struct set *s, int cls, int threads, int runs, double *cpu)
{
    double t[32], c[32];
    if (runs > 32) runs = 32;
    for (int r = 0; r < runs; r++) {
        struct djob j = {.s = s, .cls = cls};
        pthread_t tid[64];
        double t0 = now(), c0 = cpu_now();
        for (int k = 1; k < threads; k++) pthread_create(&tid[k], NULL, dworker, &j);
        dworker(&j);
        for (int k = 1; k < threads; k++) pthread_join(tid[k], NULL);
        t[r] = now() - t0;
        c[r] = cpu_now() - c0;
        if (j.failed) die("a block failed to decode");
    }
    sort(t, runs);
    sort(c, runs);
    *cpu = c[runs / 2];
    return t[runs / 2];
}

struct tally { uint64_t raw, stored, n; uint64_t method[3]; };

static void tally_of(const struct set *s, int cls, int kind, struct tally *t)
{
    memset(t, 0, sizeof *t);
    for (size_t i = 0; i < s->n; i++) {
        if ((cls >= 0 && s->b[i].cls != cls) || (kind >= 0 && s->b[i].kind != kind)) continue;
        t->raw += s->b[i].rec.raw_len;
        t->stored += s->b[i].rec.stored_len;
        t->n++;
        if (s->b[i].rec.method < 3) t->method[s->b[i].rec.method]++;
    }
}

/* Decode GB/s of raw output: wall clock, and per CPU second (what one core
 * does when it has the core to itself). */
static void report(const struct set *s, int threads, int runs, const char *indent)
{
    printf("%s%-15s %8s %6s %5s %5s %6s | %-22s | %-32s\n", indent, "class", "raw MB", "stored", "raw", "zstd", "split2",
           "1 thread: wall, per CPU s", "all threads: wall, per CPU s");
    for (int cls = -1; cls < KP_BC_COUNT; cls++) {
        struct tally t;
        double t1, tn, c1, cn, gb;
        tally_of(s, cls, -1, &t);
        if (!t.n) continue;
        t1 = decode_time(s, cls, 1, runs, &c1);
        tn = decode_time(s, cls, threads, runs, &cn);
        gb = (double)t.raw / 1e9;
        printf("%s%-15s %8.1f %6.3f %5llu %5llu %6llu | %5.2f GB/s, %5.2f GB/s | %5.2f GB/s (%d threads), %5.2f GB/s\n", indent,
               cls < 0 ? "all" : kp_class_name(cls), (double)t.raw / 1e6, (double)t.stored / (double)t.raw,
               (unsigned long long)t.method[0], (unsigned long long)t.method[1], (unsigned long long)t.method[2], gb / t1,
               gb / c1, gb / tn, threads, gb / cn);
    }
}

/* ---- decode: the blocks of a converted file --------------------------------- */

static int cmd_decode(kpk_file *f, int threads, int runs)
{
    struct set s = {0};
    kpk_err e = {0};
    for (uint32_t i = 0; i < kpk_extent_count(f); i++) {
        const kpk_extent *x = kpk_extent_at(f, i);
        const kpk_block *b = kpk_extent_blocks(f, i);
        uint32_t n = kpk_extent_block_count(f, i);
        uint8_t *stored;
        kpk_tensor t;
        if (x->codec != KPK_CODEC_BLOCKS) continue;
        if (!(stored = malloc(x->stored_len + 1))) die("out of memory");
        if (kpk_extent_pread(f, i, stored, x->stored_len, 0, &e)) die(e.msg);
        for (uint32_t k = 0; k < n; k++) {
            struct blk bl = {b[k], stored + b[k].stored_off, KP_BC_OTHER, x->kind};
            /* the class of the block: from the tensor it starts in */
            for (uint64_t ti = x->first_tensor; ti < (uint64_t)x->first_tensor + x->tensor_count; ti++) {
                kpk_tensor_at(f, ti, &t);
                if (t.offset + t.nbytes > b[k].raw_off || ti + 1 == (uint64_t)x->first_tensor + x->tensor_count) {
                    kpk_tensor one = t;
                    kp_codec_opts o;
                    kp_cut *c;
                    uint32_t nc;
                    char err[200];
                    kp_codec_defaults(&o);
                    one.offset = 0;
                    if (kp_cut_blocks(&o, &one, 1, one.nbytes, &c, &nc, err, sizeof err) == 0 && nc) bl.cls = c[0].cls;
                    free(c);
                    break;
                }
            }
            push(&s, bl);
        }
    }
    if (!s.n) die("the file has no codec-2 blocks");
    printf("%s: %zu blocks; decode GB/s of raw output, median of %d runs, page cache warm (in memory)\n", kpk_path(f), s.n,
           runs);
    for (int kind = KPK_KIND_META; kind <= KPK_KIND_MAX; kind++) {
        struct tally t;
        tally_of(&s, -1, kind, &t);
        if (t.n) printf("  %-8s %6llu blocks  stored/raw %.3f\n", kpk_kind_name(kind), (unsigned long long)t.n,
                        (double)t.stored / (double)t.raw);
    }
    report(&s, threads, runs, "  ");
    return 0;
}

/* ---- explore: other levels and block sizes ------------------------------------ */

struct ejob { struct set *s; const uint8_t *const *raw; int level; double min_saving; _Atomic size_t next; double enc_s; int failed; };

static int cmd_explore(kpk_file *f, const int *levels, int nl, const uint32_t *sizes, int ns, double min_saving,
                       uint64_t sample, int threads, int runs)
{
    for (int si = 0; si < ns; si++) {
        kp_codec_opts o;
        struct set s = {0};
        uint8_t **raw = NULL;
        uint64_t total[KP_BC_COUNT] = {0}, taken[KP_BC_COUNT] = {0}, seen[KP_BC_COUNT] = {0};
        size_t nraw = 0, capraw = 0;
        kpk_err e = {0};
        kp_codec_defaults(&o);
        o.compress = KP_COMPRESS_ALL;
        o.block_size = sizes[si];
        /* two passes: how many bytes of each class, then a strided sample of it */
        for (int pass = 0; pass < 2; pass++) {
            for (uint32_t i = 0; i < kpk_extent_count(f); i++) {
                const kpk_extent *x = kpk_extent_at(f, i);
                kpk_tensor *t;
                kp_cut *c;
                uint32_t nc;
                char err[300];
                if (x->kind != KPK_KIND_GLOBALS && x->kind != KPK_KIND_TRUNK && x->kind != KPK_KIND_EXPERT) continue;
                if (!(t = calloc(x->tensor_count + 1, sizeof *t))) die("out of memory");
                for (uint32_t k = 0; k < x->tensor_count; k++) kpk_tensor_at(f, x->first_tensor + k, &t[k]);
                if (kp_cut_blocks(&o, t, x->tensor_count, x->raw_len, &c, &nc, err, sizeof err)) die(err);
                for (uint32_t k = 0; k < nc; k++) {
                    int cls = c[k].cls;
                    uint64_t want = total[cls] < sample ? total[cls] : sample;
                    if (pass == 0) { total[cls] += c[k].raw_len; continue; }
                    /* take the block when the sample is behind its share of what was seen */
                    seen[cls] += c[k].raw_len;
                    if (taken[cls] * (double)total[cls] > (double)want * (double)seen[cls]) continue;
                    if (nraw == capraw) {
                        capraw = capraw ? 2 * capraw : 1024;
                        if (!(raw = realloc(raw, sizeof *raw * capraw))) die("out of memory");
                    }
                    if (!(raw[nraw] = malloc(c[k].raw_len))) die("out of memory");
                    if (kpk_extent_read_raw(f, i, raw[nraw], c[k].raw_len, c[k].raw_off, &e)) die(e.msg);
                    {
                        struct blk b = {{.raw_off = c[k].raw_off, .raw_len = c[k].raw_len}, NULL, cls, x->kind};
                        if (!(b.stored = malloc(kpk_encode_bound(c[k].raw_len)))) die("out of memory");
                        push(&s, b);
                    }
                    nraw++;
                    taken[cls] += c[k].raw_len;
                }
                free(c);
                free(t);
            }
        }
        for (int li = 0; li < nl; li++) {
            kpk_encoder *enc = kpk_encoder_new(levels[li], levels[li], min_saving); /* both: every class at this level */
            double enc_t[KP_BC_COUNT] = {0};
            if (!enc) die("out of memory");
            for (size_t k = 0; k < s.n; k++) {
                double t0 = now();
                if (kpk_encode_block(enc, kp_class_recipe(s.b[k].cls), raw[k], s.b[k].rec.raw_len, s.b[k].stored,
                                     kpk_encode_bound(s.b[k].rec.raw_len), &s.b[k].rec))
                    die("encode failed");
                enc_t[s.b[k].cls] += now() - t0;
            }
            kpk_encoder_free(enc);
            printf("level %d, blocks of %u KiB, min saving %.0f %%: sample of up to %llu MB per class\n", levels[li],
                   sizes[si] >> 10, min_saving * 100, (unsigned long long)(sample / 1000000));
            for (int cls = 0; cls < KP_BC_COUNT; cls++)
                if (taken[cls]) printf("    encode %-15s %7.0f MB/s (1 thread)\n", kp_class_name(cls), (double)taken[cls] / enc_t[cls] / 1e6);
            report(&s, threads, runs, "    ");
        }
        for (size_t k = 0; k < s.n; k++) { free(s.b[k].stored); free(raw[k]); }
        free(s.b);
        free(raw);
    }
    return 0;
}

static int parse_list(const char *s, long long *out, int max, int sizes)
{
    int n = 0;
    char *dup = strdup(s), *save = NULL;
    for (char *t = strtok_r(dup, ",", &save); t && n < max; t = strtok_r(NULL, ",", &save)) {
        char *end;
        long long v = strtoll(t, &end, 10);
        if (sizes && (*end == 'K' || *end == 'k')) v <<= 10;
        if (sizes && (*end == 'M' || *end == 'm')) v <<= 20;
        out[n++] = v;
    }
    free(dup);
    return n;
}

int main(int argc, char **argv)
{
    const char *mode, *path;
    int threads = 2, runs = 5, nl = 1, ns = 1;
    long long lv[16] = {KP_LEVEL_DEFAULT}, sz[16] = {KP_BLOCK_SIZE_DEFAULT};
    int levels[16];
    uint32_t sizes[16];
    double min_saving = KP_MIN_SAVING_DEFAULT;
    uint64_t sample = 256000000ull;
    kpk_file *f;
    kpk_err e = {0};
    if (argc < 3) die("usage: bench_codec decode|explore FILE.kpk [options] (see the source's header)");
    mode = argv[1];
    path = argv[2];
    for (int i = 3; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--threads") == 0) threads = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--runs") == 0) runs = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--levels") == 0) nl = parse_list(argv[i + 1], lv, 16, 0);
        else if (strcmp(argv[i], "--blocks") == 0) ns = parse_list(argv[i + 1], sz, 16, 1);
        else if (strcmp(argv[i], "--min-saving") == 0) min_saving = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--sample-mb") == 0) sample = (uint64_t)atoll(argv[i + 1]) * 1000000ull;
        else die("unknown option");
    }
    if (threads < 1 || threads > 64 || runs < 1) die("bad --threads or --runs");
    for (int i = 0; i < nl; i++) levels[i] = (int)lv[i];
    for (int i = 0; i < ns; i++) sizes[i] = (uint32_t)sz[i];
    if (kpk_open(path, &f, &e)) die(e.msg);
    if (strcmp(mode, "decode") == 0) cmd_decode(f, threads, runs);
    else if (strcmp(mode, "explore") == 0) cmd_explore(f, levels, nl, sizes, ns, min_saving, sample, threads, runs);
    else die("mode: decode or explore");
    kpk_close(f);
    return 0;
}
