/* Does io_uring read a krun read pattern faster than krun's pread pool?
 *
 * Replays the reads of a `krun --trace` file (in the order they started)
 * against the .kpk it came from, with O_DIRECT and the page cache dropped
 * before each run, through
 *   - run/store/iopool.c, the pool krun uses (N threads, each a blocking pread), and
 *   - liburing with N requests in flight (one ring, refilled as completions arrive),
 * and, for scale, one thread reading the same bytes sequentially.  Both
 * engines keep the same number of reads in flight, so the difference is the
 * cost of the submission path, not the queue depth.  Medians of several runs.
 *
 *   bench_io FILE.kpk TRACE.tsv [runs] [depth...]
 *
 * Built by `make bench` only when liburing's header is installed; it is a
 * measurement, not a dependency of krun. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "format/kprogress.h"
#include "run/store/iopool.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ALIGN 4096u
#define MAX_RUNS 15
#define POOL_BUFS 128

struct rd { uint64_t off, len; double start; };

static int by_start(const void *a, const void *b)
{
    const struct rd *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

static struct rd *load_trace(const char *path, size_t *n, size_t *max_len)
{
    FILE *f = fopen(path, "r");
    char line[256];
    size_t cap = 0;
    struct rd *r = NULL;
    *n = 0;
    *max_len = 0;
    if (!f) { fprintf(stderr, "bench_io: %s: %s\n", path, strerror(errno)); return NULL; }
    if (!fgets(line, sizeof line, f)) { fprintf(stderr, "bench_io: %s: empty\n", path); fclose(f); return NULL; }
    while (fgets(line, sizeof line, f)) {
        char kind;
        unsigned member;
        unsigned long long off, len;
        double s, e;
        if (sscanf(line, "%c\t%u\t%llu\t%llu\t%lf\t%lf", &kind, &member, &off, &len, &s, &e) != 6) {
            fprintf(stderr, "bench_io: %s: bad line: %s", path, line);
            free(r); fclose(f); return NULL;
        }
        if (member != 0) continue;                /* a set's other member files: this replays one file */
        if (off % ALIGN || len % ALIGN) continue; /* not an O_DIRECT read: krun read it buffered */
        if (*n == cap) {
            size_t nc = cap ? 2 * cap : 1024;
            struct rd *t = realloc(r, nc * sizeof *t);
            if (!t) { free(r); fclose(f); return NULL; }
            r = t;
            cap = nc;
        }
        r[(*n)++] = (struct rd){off, len, s};
        if (len > *max_len) *max_len = len;
    }
    fclose(f);
    qsort(r, *n, sizeof *r, by_start);
    return r;
}

static void drop_cache(void)
{
    FILE *f;
    sync();
    f = fopen("/proc/sys/vm/drop_caches", "w");
    if (!f || fputs("3\n", f) < 0 || fclose(f)) { fprintf(stderr, "bench_io: cannot drop the page cache (not root?)\n"); exit(2); }
}

/* The pool, as krun drives it: requests queued in batches, each buffer reused
 * only after the batch that used it completed (two batches in flight). */
static double run_pool(int fd, const struct rd *r, size_t n, int depth, uint8_t **buf, int nbuf)
{
    const kiop_member m = {fd, 0};
    kiop_pool *p = kiop_pool_create(&m, 1, &depth, NULL, 0);
    kiop_batch b[2];
    size_t half = (size_t)nbuf / 2, i = 0;
    int cur = 0, err = 0;
    double t0;
    kiop_req *q = malloc(half * sizeof *q);
    if (!p || !q) { fprintf(stderr, "bench_io: out of memory\n"); exit(2); }
    memset(b, 0, sizeof b);
    t0 = know();
    while (i < n) {
        size_t k = 0;
        if (b[cur].pending || b[cur].bytes) { err |= kiop_wait(p, &b[cur]); memset(&b[cur], 0, sizeof b[cur]); }
        for (; k < half && i < n; k++, i++)
            q[k] = (kiop_req){.member = 0, .buf = buf[(size_t)cur * half + k], .off = r[i].off, .len = r[i].len,
                              .first = r[i].len, .prio = KIOP_URGENT, .kind = 'B', .batch = &b[cur]};
        if (kiop_submit(p, q, k)) { fprintf(stderr, "bench_io: out of memory\n"); exit(2); }
        cur ^= 1;
    }
    err |= kiop_wait(p, &b[0]) | kiop_wait(p, &b[1]);
    t0 = know() - t0;
    if (err) { fprintf(stderr, "bench_io: pool read failed: %s\n", strerror(err)); exit(1); }
    kiop_pool_destroy(p);
    free(q);
    return t0;
}

/* io_uring: keep `depth` reads in flight.  Buffers are taken from a FIFO of
 * all nbuf of them, as the pool's batches rotate through theirs: on this VM
 * an O_DIRECT read into the buffer just read into is ~1.5x slower than into
 * another one, which would otherwise make io_uring at depth 1 look bad. */
static double run_uring(int fd, const struct rd *r, size_t n, int depth, uint8_t **buf, int nbuf)
{
    struct io_uring ring;
    size_t next = 0, done = 0, fh = 0, ft = (size_t)nbuf; /* free buffers: fifo[fh..ft) mod nbuf */
    int *fifo = malloc((size_t)nbuf * sizeof *fifo), in_flight = 0, rc;
    double t0;
    if (!fifo) { fprintf(stderr, "bench_io: out of memory\n"); exit(2); }
    for (int s = 0; s < nbuf; s++) fifo[s] = s;
    if ((rc = io_uring_queue_init((unsigned)depth, &ring, 0)) < 0) { fprintf(stderr, "bench_io: io_uring_queue_init: %s\n", strerror(-rc)); exit(2); }
    t0 = know();
    while (done < n) {
        struct io_uring_cqe *cqe;
        int queued = 0;
        while (in_flight < depth && next < n) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            int s;
            if (!sqe) break;
            s = fifo[fh++ % (size_t)nbuf];
            in_flight++;
            io_uring_prep_read(sqe, fd, buf[s], (unsigned)r[next].len, r[next].off);
            io_uring_sqe_set_data64(sqe, ((uint64_t)next << 16) | (uint64_t)s);
            next++;
            queued++;
        }
        if (queued && (rc = io_uring_submit(&ring)) < 0) { fprintf(stderr, "bench_io: io_uring_submit: %s\n", strerror(-rc)); exit(2); }
        if ((rc = io_uring_wait_cqe(&ring, &cqe)) < 0) { fprintf(stderr, "bench_io: io_uring_wait_cqe: %s\n", strerror(-rc)); exit(2); }
        do {
            uint64_t d = io_uring_cqe_get_data64(cqe);
            size_t i = (size_t)(d >> 16);
            if (cqe->res < 0 || (uint64_t)cqe->res != r[i].len) {
                /* a short O_DIRECT read of an aligned range inside the file does not happen here */
                fprintf(stderr, "bench_io: read of %llu bytes at %llu: %s\n", (unsigned long long)r[i].len,
                        (unsigned long long)r[i].off, cqe->res < 0 ? strerror(-cqe->res) : "short read");
                exit(1);
            }
            fifo[ft++ % (size_t)nbuf] = (int)(d & 0xffff);
            in_flight--;
            done++;
            io_uring_cqe_seen(&ring, cqe);
        } while (io_uring_peek_cqe(&ring, &cqe) == 0);
    }
    t0 = know() - t0;
    io_uring_queue_exit(&ring);
    free(fifo);
    return t0;
}

/* One thread, the same byte count, front to back in max_len reads (from the
 * start again at the end of the file: a trace of several steps reads more
 * than the file holds; the page cache is dropped once, so a second pass is
 * only cached if the file fits in memory, which the bench prints). */
static double run_sequential(int fd, uint64_t bytes, uint64_t file_size, uint8_t **buf, int nbuf, size_t max_len)
{
    uint64_t span = file_size / max_len * max_len, done = 0, i = 0;
    double t0 = know();
    while (done < bytes) {
        size_t len = bytes - done < max_len ? (size_t)(bytes - done) : max_len;
        uint64_t pos = done % span;
        len = (len + ALIGN - 1) / ALIGN * ALIGN;
        if (pread(fd, buf[i++ % (uint64_t)nbuf], len, (off_t)pos) != (ssize_t)len) { fprintf(stderr, "bench_io: sequential read failed at %llu\n", (unsigned long long)pos); exit(1); }
        done += len;
    }
    return know() - t0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    size_t n, max_len;
    uint64_t bytes = 0, file_size;
    int runs = argc > 3 ? atoi(argv[3]) : 5, depths[8] = {8}, n_depth = 1, fd, nbuf;
    struct rd *r;
    uint8_t **buf;
    double seq;
    if (argc < 3) { fprintf(stderr, "usage: bench_io FILE.kpk TRACE.tsv [runs] [depth...]\n"); return 2; }
    if (runs < 1 || runs > MAX_RUNS) runs = 5;
    if (argc > 4) {
        n_depth = 0;
        for (int a = 4; a < argc && n_depth < 8; a++) {
            int d = atoi(argv[a]);
            if (d < 1 || d > 256) { fprintf(stderr, "bench_io: depth %s: 1..256\n", argv[a]); return 2; }
            depths[n_depth++] = d;
        }
    }
    if (!(r = load_trace(argv[2], &n, &max_len)) || !n) { fprintf(stderr, "bench_io: no aligned reads in %s\n", argv[2]); return 2; }
    for (size_t i = 0; i < n; i++) bytes += r[i].len;
    if ((fd = open(argv[1], O_RDONLY | O_DIRECT)) < 0) { fprintf(stderr, "bench_io: %s: %s\n", argv[1], strerror(errno)); return 2; }
    {
        off_t end = lseek(fd, 0, SEEK_END);
        if (end < (off_t)max_len) { fprintf(stderr, "bench_io: %s: smaller than one read\n", argv[1]); return 2; }
        file_size = (uint64_t)end;
    }
    /* the pool reuses two batches of 64 buffers; io_uring needs one per slot */
    nbuf = POOL_BUFS;
    for (int di = 0; di < n_depth; di++) if (depths[di] > nbuf) nbuf = depths[di];
    buf = calloc((size_t)nbuf, sizeof *buf);
    if (!buf) { fprintf(stderr, "bench_io: out of memory\n"); return 2; }
    for (int i = 0; i < nbuf; i++)
        if (posix_memalign((void **)&buf[i], ALIGN, max_len)) { fprintf(stderr, "bench_io: out of memory\n"); return 2; }
    printf("%zu reads, %.2f GB (largest %.1f MB) from %s, O_DIRECT, page cache dropped, median of %d\n", n, (double)bytes / 1e9,
           (double)max_len / 1e6, argv[2], runs);
    {
        double t[MAX_RUNS];
        for (int k = 0; k < runs; k++) { drop_cache(); t[k] = run_sequential(fd, bytes, file_size, buf, nbuf, max_len); }
        seq = median(t, runs);
        printf("%-30s %7.3f s  %6.0f MB/s  1.00x\n", "sequential, 1 thread", seq, (double)bytes / seq / 1e6);
    }
    for (int di = 0; di < n_depth; di++) {
        double tp[MAX_RUNS], tu[MAX_RUNS], ratio[MAX_RUNS], mp, mu;
        char label[64];
        int d = depths[di];
        for (int k = 0; k < runs; k++) {
            /* alternate so drift in the disk's speed hits both alike */
            drop_cache(); tp[k] = run_pool(fd, r, n, d, buf, POOL_BUFS);
            drop_cache(); tu[k] = run_uring(fd, r, n, d, buf, nbuf);
            ratio[k] = tp[k] / tu[k]; /* paired: the two runs saw the disk in the same mood */
        }
        mp = median(tp, runs);
        mu = median(tu, runs);
        snprintf(label, sizeof label, "pread pool, %d threads", d);
        printf("%-30s %7.3f s  %6.0f MB/s  %.2fx\n", label, mp, (double)bytes / mp / 1e6, seq / mp);
        snprintf(label, sizeof label, "io_uring, %d in flight", d);
        printf("%-30s %7.3f s  %6.0f MB/s  %.2fx   (uring speed / pool speed, median of the pairs: %.3f)\n", label, mu,
               (double)bytes / mu / 1e6, seq / mu, median(ratio, runs));
    }
    for (int i = 0; i < nbuf; i++) free(buf[i]);
    free(buf);
    free(r);
    close(fd);
    return 0;
}
