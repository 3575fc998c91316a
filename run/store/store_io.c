/* The store's reads: member files (O_DIRECT, or buffered with drop-behind),
 * and the requests that bring a range of an extent into a buffer through
 * the per-member queues (iopool.h). */
#include "store_internal.h"

#include "format/kio.h"
#include "format/kos.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- which members are read, and by how many workers ------------------------------ */

static int read_by_krun(uint8_t kind) { return kind == KPK_KIND_GLOBALS || kind == KPK_KIND_TRUNK || kind == KPK_KIND_EXPERT; }

int kstore_io_threads(const kpk_file *f, int io_threads, int *per_member)
{
    const uint16_t nm = kpk_member_count(f);
    uint8_t used[KSTORE_MAX_MEMBERS] = {0};
    int n_used = 0, per, total = 0;
    if (io_threads <= 0) io_threads = 8;
    for (uint32_t i = 0; i < kpk_extent_count(f); i++) {
        const kpk_extent *x = kpk_extent_at(f, i);
        if (!read_by_krun(x->kind)) continue;
        if (x->member != KPK_STRIPED) { used[x->member] = 1; continue; }
        for (uint16_t m = 0; m < nm; m++) used[m] |= kpk_member_at(f, m)->role == KPK_ROLE_STRIPE;
    }
    for (uint16_t m = 0; m < nm; m++) used[m] &= kpk_member_here(f, m);   /* a member on another machine: not read here */
    for (uint16_t m = 0; m < nm; m++) n_used += used[m];
    /* one file: all of them on its queue; a set: a share each, but at least
     * two per disk, so one request is always queued behind the one reading */
    per = n_used <= 1 ? io_threads : (io_threads + n_used - 1) / n_used;
    if (n_used > 1 && per < 2) per = 2;
    for (uint16_t m = 0; m < nm; m++) {
        if (per_member) per_member[m] = used[m] ? per : 0;
        total += used[m] ? per : 0;
    }
    return total;
}

/* ---- opening the members -------------------------------------------------------------- */

static void member_label(const kstore *s, uint16_t m, char *buf, size_t n)
{
    if (kpk_member_count(s->f) == 1) snprintf(buf, n, "%s", kpk_path(s->f));
    else snprintf(buf, n, "member %u (%s)", m, kpk_member_path(s->f, m));
}

/* O_DIRECT on member m: opened and one aligned block read, or -1 with errno. */
static int open_direct(kstore *s, uint16_t m)
{
    int fd = kos_open_uncached(kpk_member_path(s->f, m));
    if (fd < 0) return -1;
    if (!kpk_member_same_file(s->f, m, fd)) {
        /* the path names another file than the one opened (replaced since): EINVAL is taken for
         * "O_DIRECT refused", so ESTALE says it */
        close(fd);
        errno = ESTALE;
        return -1;
    }
    if (kio_pread_full(fd, s->window, KPIECE_ALIGN, 0)) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

int kstore_map_members(kstore *s, krun_err *err)
{
    char label[600];
    s->map = calloc(s->nm, sizeof *s->map);
    s->map_len = calloc(s->nm, sizeof *s->map_len);
    s->map_watch = malloc(s->nm * sizeof *s->map_watch);
    if (!s->map || !s->map_len || !s->map_watch) { krun_err_set(err, KRUN_ENOMEM, "out of memory setting up the store"); return -1; }
    for (uint16_t m = 0; m < s->nm; m++) s->map_watch[m] = -1;
    for (uint16_t m = 0; m < s->nm; m++) {
        void *p;
        if (!kpk_member_here(s->f, m)) continue;           /* on another machine: never read here */
        s->map_len[m] = kpk_member_at(s->f, m)->file_size;
        p = mmap(NULL, s->map_len[m], PROT_READ, MAP_SHARED, kpk_member_fd(s->f, m), 0);
        if (p == MAP_FAILED) {
            member_label(s, m, label, sizeof label);
            krun_err_set(err, KRUN_EINPUT, "%s: mmap %s: %s", kpk_path(s->f), label, strerror(errno));
            return -1;
        }
        s->map[m] = p;
        s->map_watch[m] = kstore_ident_watch(p, s->map_len[m]);   /* a truncated file: SIGBUS caught, the block failed */
    }
    return 0;
}

int kstore_io_open(kstore *s, krun_err *err)
{
    int threads[KSTORE_MAX_MEMBERS];
    size_t used = 0;
    char label[600];
    s->io_m = calloc(s->nm, sizeof *s->io_m);
    s->sync_bytes = calloc(s->nm, sizeof *s->sync_bytes);
    if (!s->io_m || !s->sync_bytes) { krun_err_set(err, KRUN_ENOMEM, "out of memory setting up the store"); return -1; }
    for (uint16_t m = 0; m < s->nm; m++) s->io_m[m].fd = -1;
    for (uint16_t m = 0; m < s->nm; m++) {
        kiop_member *im = &s->io_m[m];
        if (!kpk_member_here(s->f, m)) continue;           /* on another machine: never read here */
        if (s->opt.io == KSTORE_IO_DIRECT) {
            im->fd = open_direct(s, m);
            if (im->fd >= 0) continue;
            if (errno != EINVAL) {
                member_label(s, m, label, sizeof label);
                if (errno == ESTALE)
                    krun_err_set(err, KRUN_EDATA, "%s: %s was replaced after it was opened: its path names another file now; "
                                 "restart with the file intact", kpk_path(s->f), label);
                else
                    krun_err_set(err, KRUN_EINPUT, "%s: cannot open %s with O_DIRECT: %s", kpk_path(s->f), label, strerror(errno));
                return -1;
            }
            /* the file system refuses O_DIRECT (tmpfs on older kernels, ramfs,
             * some network file systems): buffered reads, dropped behind */
            member_label(s, m, label, sizeof label);
            if (!used) used = (size_t)snprintf(s->notice, sizeof s->notice, "--io direct: the file system of ");
            else if (used < sizeof s->notice) used += (size_t)snprintf(s->notice + used, sizeof s->notice - used, ", ");
            if (used < sizeof s->notice) used += (size_t)snprintf(s->notice + used, sizeof s->notice - used, "%s", label);
        }
        im->fd = dup(kpk_member_fd(s->f, m));
        im->drop_cache = 1;
        if (im->fd < 0) { krun_err_set(err, KRUN_EINPUT, "%s: %s", kpk_path(s->f), strerror(errno)); return -1; }
    }
    if (used && used < sizeof s->notice)
        snprintf(s->notice + used, sizeof s->notice - used, " refuses O_DIRECT: reading it buffered instead, dropping what is "
                 "read from the page cache");
    if (s->opt.io == KSTORE_IO_MMAP && kstore_map_members(s, err)) return -1;
    kstore_io_threads(s->f, s->opt.io_threads, threads);
    s->io = kiop_pool_create(s->io_m, s->nm, threads, s->stage_bytes ? s->f : NULL, s->stage_bytes);
    if (!s->io) { krun_err_set(err, KRUN_ENOMEM, "out of memory starting the I/O threads"); return -1; }
    if (s->opt.trace) kiop_trace_enable(s->io);
    return 0;
}

void kstore_io_close(kstore *s)
{
    kiop_pool_destroy(s->io);
    s->io = NULL;
    if (s->io_m)
        for (uint16_t m = 0; m < s->nm; m++)
            if (s->io_m[m].fd >= 0) close(s->io_m[m].fd);
    free(s->io_m);
    free(s->sync_bytes);
    s->io_m = NULL;
    s->sync_bytes = NULL;
}

int kstore_mappable(const kstore *s, uint32_t i)
{
    const kpk_extent *x = kpk_extent_at(s->f, i);
    return s->map && x->codec == KPK_CODEC_NONE && x->member != KPK_STRIPED && s->map[x->member];
}

void kstore_drop_mapped(kstore *s, uint16_t m, uint64_t off, uint64_t len)
{
    if (off < s->map_len[m]) kos_map_dontneed(s->map[m] + off, (size_t)(off + len > s->map_len[m] ? s->map_len[m] - off : len));
    kos_cache_drop(kpk_member_fd(s->f, m), off, len);
}

/* ---- building requests -------------------------------------------------------------------- */

struct kstore_sub {
    kstore *s;
    int prio, count, failed;
    char kind;
    kiop_batch *b;
    kiop_req q[64];
    size_t nq, total;
    krun_err *err;
    /* plain reads: the open request of each member */
    kiop_req open[KSTORE_MAX_MEMBERS];
    int runs[KSTORE_MAX_MEMBERS];
    /* decode requests */
    uint32_t extent;
    uint8_t *dst;
    uint64_t a0;
};

static void push(struct kstore_sub *u, const kiop_req *r)
{
    u->total++;
    if (u->count || u->failed) return;
    u->q[u->nq++] = *r;
    if (u->nq == sizeof u->q / sizeof u->q[0]) {
        if (kiop_submit(u->s->io, u->q, u->nq)) u->failed = 1;
        u->nq = 0;
    }
}

static void flush(struct kstore_sub *u, uint16_t m)
{
    if (!u->runs[m]) return;
    push(u, &u->open[m]);
    u->runs[m] = 0;
}

/* Bytes [off, off + len) of member m go to bp: appended to the member's open
 * request when they continue it in the file and in the unit pattern. */
static void place(struct kstore_sub *u, uint16_t m, uint64_t off, uint64_t len, uint8_t *bp, uint64_t unit)
{
    kiop_req *o = &u->open[m];
    if (u->runs[m] && unit && o->off + o->len == off && u->runs[m] < KIOP_MAX_RUNS && o->len + len <= READ_CHUNK) {
        uint64_t at = (uint64_t)(bp - o->buf);
        /* run j >= 1 of a request lies at run1 + (j - 1) * stride: the second
         * run fixes run1, the third the stride, the others must follow it */
        int fits = u->runs[m] == 1 || (u->runs[m] == 2 && at > o->run1) ||
                   (u->runs[m] > 2 && at == o->run1 + (uint64_t)(u->runs[m] - 1) * o->stride);
        if (fits) {
            if (u->runs[m] == 1) o->run1 = at;
            else if (u->runs[m] == 2) o->stride = at - o->run1;
            o->len += len;
            u->runs[m]++;
            return;
        }
    }
    flush(u, m);
    while (len > READ_CHUNK) { /* a long run alone: requests of READ_CHUNK */
        kiop_req r;
        memset(&r, 0, sizeof r);
        r.member = m;
        r.off = off;
        r.len = r.first = READ_CHUNK;
        r.buf = bp;
        r.prio = u->prio;
        r.kind = u->kind;
        r.batch = u->b;
        push(u, &r);
        off += READ_CHUNK;
        bp += READ_CHUNK;
        len -= READ_CHUNK;
    }
    memset(o, 0, sizeof *o);
    o->member = m;
    o->off = off;
    o->len = o->first = len;
    o->unit = unit;
    o->buf = bp;
    o->prio = u->prio;
    o->kind = u->kind;
    o->batch = u->b;
    u->runs[m] = 1;
}

static void group(void *ctx, uint32_t g0, uint32_t g1, uint64_t span0, uint64_t span_len)
{
    struct kstore_sub *u = ctx;
    const kpk_block *b = kpk_extent_blocks(u->s->f, u->extent);
    kpk_seg seg;
    uint64_t done;
    kiop_req r;
    memset(&r, 0, sizeof r);
    /* queued on the disk that holds its first bytes (a block crossing a stripe unit is read from two) */
    r.member = kpk_extent_segments(u->s->f, u->extent, span0, 1, &seg, 1, &done) ? seg.member : 0;
    r.off = span0;
    r.len = span_len;
    r.extent = u->extent;
    r.b0 = g0;
    r.b1 = g1;
    r.raw = u->dst + (b[g0].raw_off - u->a0);
    r.prio = u->prio;
    r.kind = u->kind;
    r.batch = u->b;
    push(u, &r);
}

size_t kstore_sub_size(void) { return sizeof(struct kstore_sub); }

size_t kstore_submit(kstore *s, uint32_t i, const krange *rg, uint8_t *dst, int prio, char kind, kiop_batch *b, int count, krun_err *err)
{
    const kpk_file *f = s->f;
    const kpk_extent *x = kpk_extent_at(f, i);
    struct kstore_sub *u = s->sub; /* large (an open request per member): allocated with the store */
    /* not cleared whole: open[m] is set when runs[m] is 0, q[] as filled */
    u->nq = u->total = 0;
    u->failed = 0;
    memset(u->runs, 0, s->nm * sizeof *u->runs);
    u->s = s;
    u->prio = prio;
    u->kind = kind;
    u->b = b;
    u->count = count;
    u->err = err;
    u->extent = i;
    u->dst = dst;
    u->a0 = rg->a0;
    if (x->codec == KPK_CODEC_BLOCKS) {
        kring_groups(f, i, rg->b0, rg->b1, s->stage_bytes, group, u);
    } else {
        const uint64_t unit = x->member == KPK_STRIPED ? kpk_super(f)->stripe_unit : 0;
        uint64_t pos = rg->a0;
        while (pos < rg->a1) {
            kpk_seg seg[64];
            uint64_t done = 0;
            size_t n = kpk_extent_segments(f, i, pos, rg->a1 - pos, seg, 64, &done);
            if (!n) { u->failed = 1; break; }
            for (size_t k = 0; k < n; k++) {
                place(u, seg[k].member, seg[k].off, seg[k].len, dst + (pos - rg->a0), unit);
                pos += seg[k].len;
            }
        }
        for (uint16_t m = 0; m < s->nm; m++) flush(u, m);
    }
    if (!count && !u->failed && u->nq && kiop_submit(s->io, u->q, u->nq)) u->failed = 1;
    if (u->failed && !count) {
        kstore_err_extent(s, i, err, KRUN_ENOMEM, "cannot queue its reads");
        return 0;
    }
    return u->total;
}

int kstore_wait(kstore *s, uint32_t i, kiop_batch *b, krun_err *err)
{
    int e = kiop_wait(s->io, b);
    char what[700], label[600];
    if (b->decode_failed) {
        return krun_err_kpk(err, &b->decode_err);
    }
    if (!e) return 0;
    member_label(s, b->err_member, label, sizeof label);
    snprintf(what, sizeof what, "reading %s at offset %llu: %s", label, (unsigned long long)b->err_off,
             e == ENODATA ? "unexpected end of file" : strerror(e));
    kstore_err_extent(s, i, err, KRUN_EINPUT, what);
    return -1;
}

void kstore_count_sync(kstore *s, uint32_t i, uint64_t pos, uint64_t len)
{
    while (len) {
        kpk_seg seg[64];
        uint64_t done = 0;
        size_t n = kpk_extent_segments(s->f, i, pos, len, seg, 64, &done);
        if (!n) return;
        for (size_t k = 0; k < n; k++) s->sync_bytes[seg[k].member] += seg[k].len;
        pos += done;
        len -= done;
    }
}

int kstore_read_stored(kstore *s, uint32_t i, uint64_t pos, uint64_t len, uint8_t *buf, krun_err *err)
{
    while (len) {
        kpk_seg seg[64];
        uint64_t done = 0;
        size_t n = kpk_extent_segments(s->f, i, pos, len, seg, 64, &done);
        if (!n) { kstore_err_extent(s, i, err, KRUN_EDATA, "read outside the extent"); return -1; }
        for (size_t k = 0; k < n; k++) {
            const kiop_member *m = &s->io_m[seg[k].member];
            if (kio_pread_full(m->fd, buf, (size_t)seg[k].len, seg[k].off)) {
                char what[700], label[600];
                member_label(s, seg[k].member, label, sizeof label);
                snprintf(what, sizeof what, "reading %s at offset %llu: %s", label, (unsigned long long)seg[k].off,
                         errno == ENODATA ? "unexpected end of file" : strerror(errno));
                kstore_err_extent(s, i, err, KRUN_EINPUT, what);
                return -1;
            }
            if (m->drop_cache) kos_cache_drop(m->fd, seg[k].off, seg[k].len);
            s->sync_bytes[seg[k].member] += seg[k].len;
            buf += seg[k].len;
        }
        pos += done;
        len -= done;
    }
    return 0;
}

/* ---- a tensor read now, for the prediction (store.h) ---------------------------------- */

static uint64_t align_down(uint64_t x) { return x / KPIECE_ALIGN * KPIECE_ALIGN; }
static uint64_t align_up(uint64_t x) { return (x + KPIECE_ALIGN - 1) / KPIECE_ALIGN * KPIECE_ALIGN; }

/* The blocks [*b0, *b1) of extent i that are exactly raw [off, off + len); 0 if none are. */
/* The blocks that hold raw bytes [off, off + len) of extent i: [*b0, *b1).
 * A tensor need not start or end on a block boundary (a writer may cut
 * blocks across tensors, FORMAT.md §8.1): the first and last may hold more. */
static int blocks_over(const kpk_file *f, uint32_t i, uint64_t off, uint64_t len, uint32_t *b0, uint32_t *b1)
{
    const kpk_block *b = kpk_extent_blocks(f, i);
    uint32_t n = kpk_extent_block_count(f, i), k = 0;
    while (k < n && b[k].raw_off + b[k].raw_len <= off) k++;
    if (k == n || b[k].raw_off > off || len == 0) return 0;
    *b0 = k;
    while (k < n && b[k].raw_off < off + len) k++;
    *b1 = k;
    return b[k - 1].raw_off + b[k - 1].raw_len >= off + len;
}

void kstore_tensor_read_bytes(const kpk_file *f, uint32_t i, uint64_t off, uint64_t len, uint64_t *buf, uint64_t *stage)
{
    const kpk_extent *x = kpk_extent_at(f, i);
    uint32_t b0, b1;
    *buf = align_up(len) + 2 * KPIECE_ALIGN;
    *stage = 0;
    if (x->codec == KPK_CODEC_BLOCKS && blocks_over(f, i, off, len, &b0, &b1)) {
        const kpk_block *b = kpk_extent_blocks(f, i);
        uint64_t span = b[b1 - 1].raw_off + b[b1 - 1].raw_len - b[b0].raw_off;
        if (align_up(span) > *buf) *buf = align_up(span);
        *stage = align_up(b[b1 - 1].stored_off + b[b1 - 1].stored_len) - align_down(b[b0].stored_off);
    }
}

const uint8_t *kstore_tensor_read(kstore *s, uint32_t i, uint64_t off, uint64_t len, uint8_t *buf, uint8_t *stage, krun_err *err)
{
    const kpk_extent *x = kpk_extent_at(s->f, i);
    const uint64_t end = kpk_extent_padded_len(s->f, x);
    if (x->codec == KPK_CODEC_NONE) {
        uint64_t a = align_down(off), e = align_up(off + len);
        if (e > end) e = end;
        if (off + len > x->raw_len || kstore_read_stored(s, i, a, e - a, buf, err)) return NULL;
        s->st.bytes_router += e - a;
        return buf + (off - a);
    }
    if (x->codec == KPK_CODEC_BLOCKS) {
        const kpk_block *b = kpk_extent_blocks(s->f, i);
        uint32_t b0, b1;
        uint64_t a, e;
        if (!stage || !blocks_over(s->f, i, off, len, &b0, &b1)) {
            kstore_err_extent(s, i, err, KRUN_EDATA, "internal: a tensor read outside the extent's blocks");
            return NULL;
        }
        a = align_down(b[b0].stored_off);
        e = align_up(b[b1 - 1].stored_off + b[b1 - 1].stored_len);
        if (e > end) e = end;
        if (kstore_read_stored(s, i, a, e - a, stage, err)) return NULL;
        s->st.bytes_router += e - a;
        for (uint32_t k = b0; k < b1; k++)
            if (kstore_block_decode(s, i, k, stage + (b[k].stored_off - a), buf + (b[k].raw_off - b[b0].raw_off), err)) return NULL;
        return buf + (off - b[b0].raw_off);
    }
    kstore_err_extent(s, i, err, KRUN_EDATA, "internal: a tensor read of a whole-frame extent");
    return NULL;
}
