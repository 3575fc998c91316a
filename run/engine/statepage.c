/* Sequences' states paged to disk: the window, the file and its I/O thread (statepage.h). */
#include "statepage.h"

#include "format/kos.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

enum { JOB_READ, JOB_WRITE };
#define QUEUE 8                     /* jobs in flight: at most a write and a read, and the block's first read */
/* Regions tracked in write-back at once, at most (beyond: the oldest waited for).  A sweep writes
 * at most n_layers x slots of them (K3: 61 x 16 = 976): 4096 is four sweeps of slack, and a write
 * four sweeps old (a sweep reads every weight once) has long reached the disk. */
#define WB_RANGES 4096
#define CACHE_SHARE 4               /* the states' page cache: at most 1/CACHE_SHARE of the memory available at the start */

struct k3_pager {
    const k3_config *c;
    size_t ctx, nslots;
    size_t win[2], R[2];            /* per kind (0 KDA, 1 MLA): the window's layers, and one slot's region */
    int NL;
    uint8_t *window;                /* [K3_PAGE_WINDOW][nslots][R] */
    uint64_t *layer_off;            /* [NL]: where layer L's section of the file starts */
    uint64_t *layer_region;         /* [NL]: one slot's region of layer L in the file */
    size_t *ord;                    /* [NL]: layer L is the ord[L]-th layer of its kind */
    uint8_t *on_disk;               /* [nslots][NL]: 0: the layer is zeros (reset), 1: its bytes are in the file */
    uint64_t *sum;                  /* [nslots][NL]: XXH3-64 of the bytes on disk (MLA: rows 0..rows) */
    size_t *rows;                   /* [nslots][NL]: MLA rows on disk */
    /* the block in flight: its slots, their positions before it and their new positions */
    size_t nseg, *slot, *pos, *n;
    int fd, direct, made_dir;
    /* bounded write-back (direct: the weights' --io direct): regions written, whose write-back was
     * started and whose pages are dropped from the page cache once they are on the disk; at most
     * wb_limit bytes of them at a time (statepage.h); UINT64_MAX: the whole file may stay cached */
    uint64_t wb_off[WB_RANGES], wb_len[WB_RANGES];
    size_t wb_head, wb_n;
    uint64_t wb_bytes, wb_limit;
    char *dir, *path;
    long flip_at;                   /* test hook KRUN_TEST_STATE_FLIP: damage the Nth region written (0: none) */
    long writes;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    int job_kind[QUEUE], job_L[QUEUE];
    uint64_t queued, finished;      /* jobs handed to the thread, and done (in order) */
    int running, quit, failed;
    krun_err error;                 /* the first failure, reported by the next wait */
    uint64_t bytes_read, bytes_written;
    double wait_seconds;            /* the forward pass's time waiting for the state file (the caller's thread) */
};

static size_t up(size_t n) { return (n + K3_PAGE_ALIGN - 1) / K3_PAGE_ALIGN * K3_PAGE_ALIGN; }
static size_t down(size_t n) { return n / K3_PAGE_ALIGN * K3_PAGE_ALIGN; }
static size_t kda_bytes(const k3_config *c) { return (k3_kda_S_floats(c) + k3_kda_conv_floats(c)) * sizeof(float); }
static size_t row_bytes(const k3_config *c) { return k3_mla_row(c) * sizeof(float); }

/* The window holds each kind of layer apart: a KDA layer's region is its state and history, an MLA
 * layer's its ctx rows, and K3 has 3 KDA layers to an MLA one.  Of a kind, the window needs as many
 * layers as any K3_PAGE_WINDOW consecutive layers hold of it: the j-th layer of the kind goes to
 * window layer j mod that, so the layers in flight (L-1, L, L+1) never share one. */
static size_t kind_window(const k3_config *c, int mla)
{
    size_t most = 0;
    for (int L = 0; L < c->n_layers; L++) {
        size_t n = 0;
        for (int i = L; i < L + K3_PAGE_WINDOW && i < c->n_layers; i++) n += (c->layer_is_mla[i] != 0) == mla;
        if (n > most) most = n;
    }
    return most;
}

static size_t kind_region(const k3_config *c, size_t ctx, int mla) { return mla ? up(ctx * row_bytes(c)) : up(kda_bytes(c)); }

uint64_t k3_page_window_bytes(const k3_config *c, size_t ctx, size_t nslots)
{
    return ((uint64_t)kind_window(c, 0) * kind_region(c, ctx, 0) + (uint64_t)kind_window(c, 1) * kind_region(c, ctx, 1)) * nslots;
}

static uint64_t layer_region(const k3_config *c, size_t ctx, int L) { return kind_region(c, ctx, c->layer_is_mla[L] != 0); }

uint64_t k3_page_file_bytes(const k3_config *c, size_t ctx, size_t nslots)
{
    uint64_t t = 0;
    for (int L = 0; L < c->n_layers; L++) t += nslots * layer_region(c, ctx, L);
    return t;
}

void k3_page_sweep_bytes(const k3_config *c, size_t B, size_t pos, uint64_t *read, uint64_t *written)
{
    const size_t rb = row_bytes(c);
    uint64_t r = 0, w = 0;
    for (int L = 0; L < c->n_layers; L++) {
        if (c->layer_is_mla[L]) {
            r += up(pos * rb);
            w += up((pos + 1) * rb) - down(pos * rb);
        } else {
            r += up(kda_bytes(c));
            w += up(kda_bytes(c));
        }
    }
    *read = r * B;
    *written = w * B;
}

/* ---- the file's I/O: whole lengths or an error ------------------------------------------- */

static int pread_all(k3_pager *p, uint8_t *buf, size_t len, uint64_t off, krun_err *err)
{
    while (len) {
        ssize_t got = pread(p->fd, buf, len, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0)
            return krun_err_set(err, KRUN_EINPUT, "%s: reading %zu bytes at %llu: %s", p->path, len, (unsigned long long)off,
                                got < 0 ? strerror(errno) : "the file is shorter than it was made (was it truncated?)");
        buf += got;
        len -= (size_t)got;
        off += (uint64_t)got;
        p->bytes_read += (uint64_t)got;
    }
    return 0;
}

/* The oldest region in write-back: waited for (it has usually long reached the disk), and its pages
 * dropped from the page cache. */
static int wb_retire(k3_pager *p, krun_err *err)
{
    const uint64_t off = p->wb_off[p->wb_head], len = p->wb_len[p->wb_head];
    if (kos_writeback_wait(p->fd, off, len) && errno != ENOSYS && errno != EINVAL && errno != EOPNOTSUPP)
        return krun_err_set(err, KRUN_EINPUT, "%s: writing %llu bytes at %llu back: %s (is the state directory's disk full?)", p->path,
                            (unsigned long long)len, (unsigned long long)off, strerror(errno));
    kos_cache_drop(p->fd, off, len);
    p->wb_head = (p->wb_head + 1) % WB_RANGES;
    p->wb_n--;
    p->wb_bytes -= len;
    return 0;
}

/* A region just written (to the page cache): its write-back started at once, so that dirty pages do
 * not pile up, and the regions before it retired while more than wb_limit bytes are in flight. */
static int wb_add(k3_pager *p, uint64_t off, uint64_t len, krun_err *err)
{
    if (!p->direct) return 0;             /* buffered (--io pread, mmap): the page cache absorbs them */
    kos_writeback_start(p->fd, off, len);  /* unsupported: the kernel writes it back in its own time; still bounded below */
    if (p->wb_limit == UINT64_MAX) return 0;   /* the whole file may stay in the page cache: nothing to drop */
    while (p->wb_n && (p->wb_n == WB_RANGES || p->wb_bytes + len > p->wb_limit))
        if (wb_retire(p, err)) return -1;
    p->wb_off[(p->wb_head + p->wb_n) % WB_RANGES] = off;
    p->wb_len[(p->wb_head + p->wb_n) % WB_RANGES] = len;
    p->wb_n++;
    p->wb_bytes += len;
    return 0;
}

static int pwrite_all(k3_pager *p, const uint8_t *buf, size_t len, uint64_t off, krun_err *err)
{
    const uint64_t off0 = off, len0 = len;
    while (len) {
        ssize_t put = pwrite(p->fd, buf, len, (off_t)off);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0)
            return krun_err_set(err, KRUN_EINPUT, "%s: writing %zu bytes at %llu: %s (is the state directory's disk full?)", p->path,
                                len, (unsigned long long)off, put < 0 ? strerror(errno) : "nothing written");
        buf += put;
        len -= (size_t)put;
        off += (uint64_t)put;
        p->bytes_written += (uint64_t)put;
    }
    return wb_add(p, off0, len0, err);
}

/* The test hook: one byte of the region just written, flipped on disk (buffered: a byte). */
static int damage(k3_pager *p, uint64_t off, krun_err *err)
{
    int fd = open(p->path, O_RDWR);
    uint8_t b;
    if (fd < 0) return krun_err_set(err, KRUN_EINPUT, "%s: %s", p->path, strerror(errno));
    if (pread(fd, &b, 1, (off_t)off) != 1 || (b ^= 0x20, pwrite(fd, &b, 1, (off_t)off) != 1) || fsync(fd)) {
        close(fd);
        return krun_err_set(err, KRUN_EINPUT, "%s: the test hook could not damage it", p->path);
    }
    close(fd);
    fprintf(stderr, "krun: KRUN_TEST_STATE_FLIP: flipped a byte of %s at %llu\n", p->path, (unsigned long long)off);
    return 0;
}

/* Where layer L of a slot is in RAM: its kind's part of the window (KDA first), window layer
 * (its ordinal among the layers of its kind) mod the kind's window (kind_window). */
static uint8_t *region(const k3_pager *p, int L, size_t slot)
{
    const int mla = p->c->layer_is_mla[L] != 0;
    uint8_t *base = p->window + (mla ? p->win[0] * p->nslots * p->R[0] : 0);
    return base + ((p->ord[L] % p->win[mla]) * p->nslots + slot) * p->R[mla];
}

static int mismatch(const k3_pager *p, size_t k, int L, krun_err *err)
{
    return krun_err_set(err, KRUN_EDATA, "%s: the state of session slot %zu, layer %d, does not match its checksum (the file was "
                        "changed or the disk returned bad data); nothing is computed from it", p->path,
                        k, L);
}

/* Layer L of the block's sequences into the window: read and checked, or zeros. */
static int read_layer(k3_pager *p, int L, krun_err *err)
{
    const size_t rb = row_bytes(p->c);
    for (size_t g = 0; g < p->nseg; g++) {
        const size_t k = p->slot[g], at = k * (size_t)p->NL + (size_t)L;
        const uint64_t off = p->layer_off[L] + k * p->layer_region[L];
        uint8_t *mem = region(p, L, k);
        if (!p->c->layer_is_mla[L]) {
            const size_t len = kda_bytes(p->c), NL = (size_t)p->NL;
            size_t run = 1;
            if (!p->on_disk[at]) { memset(mem, 0, len); continue; }
            /* the block's next slots that follow this one, on disk too: one read (their regions
             * follow each other in the window and in the file) */
            while (g + run < p->nseg && p->slot[g + run] == k + run && p->on_disk[at + run * NL]) run++;
            if (pread_all(p, mem, run * up(len), off, err)) return -1;
            for (size_t i = 0; i < run; i++)
                if (XXH3_64bits(mem + i * up(len), len) != p->sum[at + i * NL]) return mismatch(p, k + i, L, err);
            g += run - 1;
        } else {
            /* rows 0..pos; the rows after them are the block's to write (mla.c).  A verification's
             * rejected rows may follow them (the state's position went back to the ones kept) */
            const size_t have = p->on_disk[at] ? p->rows[at] : 0;
            if (have < p->pos[g])
                return krun_err_set(err, KRUN_EINPUT, "%s: session slot %zu, layer %d: %zu positions on disk, the sequence is at %zu "
                                    "(a bug: the state was changed outside a forward pass)", p->path, k, L, have, p->pos[g]);
            if (!have) continue;
            if (pread_all(p, mem, up(have * rb), off, err)) return -1;
            if (XXH3_64bits(mem, have * rb) != p->sum[at]) return mismatch(p, k, L, err);
            /* the rows before the block's page are read, never written again: not kept in the page
             * cache when it holds a bounded part of the file (the pages written are, wb_add) */
            if (p->direct && p->wb_limit != UINT64_MAX && down(have * rb)) kos_cache_drop(p->fd, off, down(have * rb));
        }
    }
    return 0;
}

/* Layer L of the block's sequences back to the file, each region with its checksum. */
static int write_layer(k3_pager *p, int L, krun_err *err)
{
    const size_t rb = row_bytes(p->c);
    for (size_t g = 0; g < p->nseg; g++) {
        const size_t k = p->slot[g];
        size_t at = k * (size_t)p->NL + (size_t)L;
        const uint64_t off = p->layer_off[L] + k * p->layer_region[L];
        const uint8_t *mem = region(p, L, k);
        uint64_t mid;
        if (!p->c->layer_is_mla[L]) {
            /* a run of the block's slots that follow each other: one write (as read_layer) */
            const size_t len = kda_bytes(p->c), NL = (size_t)p->NL;
            size_t run = 1;
            while (g + run < p->nseg && p->slot[g + run] == k + run) run++;
            for (size_t i = 0; i < run; i++) p->sum[at + i * NL] = XXH3_64bits(mem + i * up(len), len);
            if (pwrite_all(p, mem, run * up(len), off, err)) return -1;
            for (size_t i = 0; i + 1 < run; i++) {
                p->on_disk[at + i * NL] = 1;
                if (++p->writes == p->flip_at && damage(p, off + i * up(len) + len / 2, err)) return -1;
            }
            at += (run - 1) * NL;
            mid = off + (run - 1) * up(len) + len / 2;
            g += run - 1;
        } else {
            /* only the pages that hold the new rows: the ones before are on disk already */
            const size_t end = p->pos[g] + p->n[g], from = down(p->pos[g] * rb);
            p->sum[at] = XXH3_64bits(mem, end * rb);
            p->rows[at] = end;
            if (pwrite_all(p, mem + from, up(end * rb) - from, off + from, err)) return -1;
            mid = off + end * rb / 2;
        }
        p->on_disk[at] = 1;
        if (++p->writes == p->flip_at && damage(p, mid, err)) return -1;
    }
    return 0;
}

static void *io_main(void *arg)
{
    k3_pager *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        int kind, L, rc, skip;
        krun_err e;
        while (!p->quit && p->finished == p->queued) pthread_cond_wait(&p->work, &p->mu);
        if (p->finished == p->queued) break;
        kind = p->job_kind[p->finished % QUEUE];
        L = p->job_L[p->finished % QUEUE];
        skip = p->failed;
        pthread_mutex_unlock(&p->mu);
        /* after a failure the block is lost: the rest of its jobs do nothing */
        rc = skip ? 0 : kind == JOB_READ ? read_layer(p, L, &e) : write_layer(p, L, &e);
        pthread_mutex_lock(&p->mu);
        if (rc && !p->failed) { p->failed = 1; p->error = e; }
        p->finished++;
        pthread_cond_broadcast(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void submit(k3_pager *p, int kind, int L)
{
    pthread_mutex_lock(&p->mu);
    while (p->queued - p->finished >= QUEUE) pthread_cond_wait(&p->done, &p->mu);
    p->job_kind[p->queued % QUEUE] = kind;
    p->job_L[p->queued % QUEUE] = L;
    p->queued++;
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->mu);
}

/* Wait until job `upto` (a count of jobs) is done; the first failure, if any. */
static int wait_for(k3_pager *p, uint64_t upto, krun_err *err)
{
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    if (p->finished < upto) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        while (p->finished < upto) pthread_cond_wait(&p->done, &p->mu);
        clock_gettime(CLOCK_MONOTONIC, &b);
        p->wait_seconds += (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    }
    if (p->failed) { *err = p->error; rc = -1; }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* ---- the forward pass's calls -------------------------------------------------------------- */

int k3_pager_block_begin(k3_pager *p, k3_state *const *sts, const size_t *n, size_t nseg, krun_err *err)
{
    krun_err stale;
    /* a failed block may have left jobs behind: let them finish, and forget its failure (reported) */
    wait_for(p, p->queued, &stale);
    pthread_mutex_lock(&p->mu);
    p->failed = 0;
    pthread_mutex_unlock(&p->mu);
    if (nseg > p->nslots) return krun_err_set(err, KRUN_EINPUT, "%zu sequences in a block: the state file has %zu slots", nseg, p->nslots);
    for (size_t g = 0; g < nseg; g++) {
        if (sts[g]->pager != p) return krun_err_set(err, KRUN_EINPUT, "a sequence of the block is not in the state file %s", p->path);
        p->slot[g] = sts[g]->page_slot;
        p->pos[g] = sts[g]->pos;
        p->n[g] = n[g];
    }
    p->nseg = nseg;
    submit(p, JOB_READ, 0);
    return 0;
}

int k3_pager_layer_begin(k3_pager *p, int L, krun_err *err)
{
    /* layer L's read is the last job queued (layer 0's by block_begin, the others by layer L-1's begin,
     * before layer L-1's write): wait for it, not for the write that may follow it */
    uint64_t upto = p->queued - (L > 0 ? 1 : 0);
    if (wait_for(p, upto, err)) return -1;
    /* L+1's region last held a layer before L-1 (kind_window), whose write was queued before:
     * the thread runs jobs in order */
    if (L + 1 < p->NL) submit(p, JOB_READ, L + 1);
    return 0;
}

void k3_pager_layer_end(k3_pager *p, int L) { submit(p, JOB_WRITE, L); }

int k3_pager_block_end(k3_pager *p, krun_err *err) { return wait_for(p, p->queued, err); }

/* ---- open, attach, close ----------------------------------------------------------------- */

void k3_pager_attach(k3_pager *p, k3_state *st, size_t slot)
{
    const k3_config *c = p->c;
    for (int L = 0; L < c->n_layers; L++) {
        uint8_t *mem = region(p, L, slot);
        st->kda_S[L] = c->layer_is_mla[L] ? NULL : (float *)(void *)mem;
        st->kda_conv[L] = c->layer_is_mla[L] ? NULL : (float *)(void *)mem + k3_kda_S_floats(c);
        st->mla_cache[L] = c->layer_is_mla[L] ? (float *)(void *)mem : NULL;
    }
    st->pager = p;
    st->page_slot = slot;
    k3_pager_reset(p, slot);
}

void k3_pager_reset(k3_pager *p, size_t slot)
{
    krun_err ignored;
    /* a failed block may have left a write of this slot in flight: it must not mark the slot
     * on disk after the reset (its failure was reported by the block) */
    wait_for(p, p->queued, &ignored);
    memset(p->on_disk + slot * (size_t)p->NL, 0, (size_t)p->NL);
}

static int open_file(k3_pager *p, krun_err *err)
{
    const uint64_t size = k3_page_file_bytes(p->c, p->ctx, p->nslots);
    struct stat sb;
    int rc;
    if (stat(p->dir, &sb)) {
        if (errno != ENOENT || mkdir(p->dir, 0700))
            return krun_err_set(err, KRUN_EINPUT, "%s: cannot make the state directory: %s", p->dir, strerror(errno));
        p->made_dir = 1;
    } else if (!S_ISDIR(sb.st_mode)) {
        return krun_err_set(err, KRUN_EINPUT, "%s: not a directory (--state-dir names a directory for the states' file)", p->dir);
    }
    /* buffered, with the write-back bounded (wb_add) where the weights are read with O_DIRECT: a
     * state written goes to the page cache at once and to the disk behind it, so the forward pass
     * never waits for a write queued behind the weights' reads or anyone else's (issue 34.15: O_DIRECT
     * writes of a few pages each waited their turn behind 8 MB reads, up to 16 s of a 30 s job) */
    p->fd = open(p->path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (p->fd < 0) return krun_err_set(err, KRUN_EINPUT, "%s: %s", p->path, strerror(errno));
    if (flock(p->fd, LOCK_EX | LOCK_NB))
        return krun_err_set(err, KRUN_EINPUT, "%s: another krun is using this state file (give each job its own --state-dir)", p->path);
    /* whatever a killed run left is scratch: nothing of it is trusted (the checksums were in its RAM) */
    if (ftruncate(p->fd, 0))
        return krun_err_set(err, KRUN_EINPUT, "%s: cannot truncate the state file: %s", p->path, strerror(errno));
    /* allocated up front: a full disk is said now, not mid-job, and direct writes do not allocate
     * blocks as they go; a file system without fallocate gets a sparse file */
    rc = posix_fallocate(p->fd, 0, (off_t)size);
    if (rc == ENOSPC)
        return krun_err_set(err, KRUN_EINPUT, "%s: no room for the state file (%llu bytes): free space there or give another "
                            "--state-dir", p->path, (unsigned long long)size);
    if (rc && ftruncate(p->fd, (off_t)size))
        return krun_err_set(err, KRUN_EINPUT, "%s: cannot size the state file to %llu bytes: %s", p->path, (unsigned long long)size,
                            strerror(errno));
    return 0;
}

int k3_pager_open(k3_pager **out, const k3_config *c, size_t ctx, size_t nslots, const char *dir, int direct, krun_err *err)
{
    k3_pager *p = calloc(1, sizeof *p);
    const size_t NL = (size_t)c->n_layers;
    const char *flip = getenv("KRUN_TEST_STATE_FLIP");
    uint64_t off = 0;
    *out = NULL;
    if (!p) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
    p->fd = -1;
    p->direct = direct;
    p->c = c;
    p->ctx = ctx;
    p->nslots = nslots;
    p->NL = c->n_layers;
    for (int mla = 0; mla < 2; mla++) {
        p->win[mla] = kind_window(c, mla);
        p->R[mla] = kind_region(c, ctx, mla);
    }
    p->flip_at = flip ? atol(flip) : 0;
    {
        /* the page cache the states may take (statepage.h): a quarter of the memory the system had
         * available at the start.  The whole file while it fits (every read is then served from the
         * page cache, as buffered I/O did, and the disk only takes the writes behind); else that
         * many bytes of the regions written last, at least a window's worth.  (The test hook
         * KRUN_TEST_STATE_WINDOW_CACHE: a window's worth, the least.) */
        const uint64_t win = k3_page_window_bytes(c, ctx, nslots), file = k3_page_file_bytes(c, ctx, nslots),
                       share = kos_mem_available() / CACHE_SHARE;
        p->wb_limit = getenv("KRUN_TEST_STATE_WINDOW_CACHE") ? win : file <= share ? UINT64_MAX : share > win ? share : win;
    }
    p->dir = strdup(dir);
    p->path = malloc(strlen(dir) + sizeof K3_PAGE_FILE + 1);
    p->layer_off = calloc(NL, sizeof *p->layer_off);
    p->layer_region = calloc(NL, sizeof *p->layer_region);
    p->ord = calloc(NL, sizeof *p->ord);
    p->on_disk = calloc(nslots * NL, 1);
    p->sum = calloc(nslots * NL, sizeof *p->sum);
    p->rows = calloc(nslots * NL, sizeof *p->rows);
    p->slot = calloc(nslots, sizeof *p->slot);
    p->pos = calloc(nslots, sizeof *p->pos);
    p->n = calloc(nslots, sizeof *p->n);
    p->window = aligned_alloc(K3_PAGE_ALIGN, (size_t)k3_page_window_bytes(c, ctx, nslots));
    if (!p->dir || !p->path || !p->layer_off || !p->layer_region || !p->ord || !p->on_disk || !p->sum || !p->rows || !p->slot || !p->pos || !p->n ||
        !p->window) {
        krun_err_set(err, KRUN_ENOMEM, "out of memory: %llu bytes for the states' window (%zu KDA and %zu MLA layers of %zu sequences)",
                     (unsigned long long)k3_page_window_bytes(c, ctx, nslots), p->win[0], p->win[1], nslots);
        k3_pager_close(p);
        return -1;
    }
    /* zeros: the bytes past a region's last MLA row are written too (whole pages) and must be defined */
    memset(p->window, 0, (size_t)k3_page_window_bytes(c, ctx, nslots));
    sprintf(p->path, "%s/%s", dir, K3_PAGE_FILE);
    for (int L = 0; L < p->NL; L++) {
        for (int i = 0; i < L; i++) p->ord[L] += (c->layer_is_mla[i] != 0) == (c->layer_is_mla[L] != 0);
        p->layer_off[L] = off;
        p->layer_region[L] = layer_region(c, ctx, L);
        off += nslots * p->layer_region[L];
    }
    if (open_file(p, err)) {
        k3_pager_close(p);
        return -1;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    if (pthread_create(&p->thread, NULL, io_main, p)) {
        krun_err_set(err, KRUN_ENOMEM, "cannot start the state file's I/O thread");
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->work);
        pthread_cond_destroy(&p->done);
        k3_pager_close(p);
        return -1;
    }
    p->running = 1;
    *out = p;
    return 0;
}

void k3_pager_close(k3_pager *p)
{
    if (!p) return;
    if (p->running) {
        pthread_mutex_lock(&p->mu);
        p->quit = 1;
        pthread_cond_signal(&p->work);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->thread, NULL);
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->work);
        pthread_cond_destroy(&p->done);
    }
    if (p->fd >= 0) {
        /* scratch: removed (a killed run's file is truncated by the next), its pages dropped with it */
        kos_cache_drop(p->fd, 0, 0);
        unlink(p->path);
        close(p->fd);
        if (p->made_dir) rmdir(p->dir);
    }
    free(p->window);
    free(p->layer_off);
    free(p->layer_region);
    free(p->ord);
    free(p->on_disk);
    free(p->sum);
    free(p->rows);
    free(p->slot);
    free(p->pos);
    free(p->n);
    free(p->dir);
    free(p->path);
    free(p);
}

void k3_pager_counters(const k3_pager *p, uint64_t *read, uint64_t *written, double *wait_seconds)
{
    *read = p->bytes_read;
    *written = p->bytes_written;
    *wait_seconds = p->wait_seconds;
}

const char *k3_pager_path(const k3_pager *p) { return p->path; }
int k3_pager_direct(const k3_pager *p) { return p->direct; }
