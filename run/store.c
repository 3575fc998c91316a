/* The extent store: in-place mapping, the trunk ring and the expert cache. */
#include "store.h"

#include "iopool.h"
#include "kio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#define READ_CHUNK ((size_t)8 << 20)   /* one request: large, aligned, several in flight */
#define HASH_WINDOW ((size_t)64 << 20) /* in-place mode: hash a mapped extent this much at a time */
#define FAULT_AROUND ((uint64_t)64 << 10) /* the kernel maps up to this much around a faulting page */

/* ROLE_MAPPED: in place from the mapping (no plan).  With a plan: ROLE_RESIDENT
 * is read once into its own budgeted buffer, ROLE_RING and ROLE_EXPERT go
 * through slots. */
enum role { ROLE_MAPPED = 0, ROLE_RING = 1, ROLE_EXPERT = 2, ROLE_RESIDENT = 3 };

struct slot {
    uint8_t *buf;          /* pread/direct: an aligned buffer of the slot size; mmap: NULL */
    int64_t extent;        /* -1: empty */
    int refs;
    int loading, fresh;
    uint64_t last_use;
    kio_batch batch;
};

struct kstore {
    kpk_file *f;
    kstore_opts opt;
    const uint8_t *map;
    uint64_t map_len;
    int fd_read;           /* the fd reads go through (O_DIRECT for --io direct) */
    uint8_t *role;         /* per extent */
    uint8_t *verified;     /* per extent */
    uint8_t *touched;      /* per mapped extent: counted once as read */
    uint8_t **decoded;     /* compressed extents, unplanned mode */
    uint8_t **res_buf;     /* per resident extent: its bytes from res_first on */
    uint64_t *res_first;
    uint8_t *res_loaded;
    uint8_t *window;       /* KSTORE_WINDOW_BYTES: hashing the part of the globals never held */
    XXH3_state_t *xxh;
    uint64_t drop_off, drop_len; /* the embedding: never kept resident */
    int64_t drop_extent;
    struct slot ring[2];
    int n_ring;
    struct slot *eslots;
    int n_eslots;
    int32_t *slot_of;      /* per extent: expert slot, -1 */
    uint32_t *uses;        /* per extent: times requested (LFU history) */
    uint64_t tick;
    kio_pool *io;
    kstore_stats st;
};

static uint64_t padded(const kstore *s, uint32_t i) { return kpk_extent_padded_len(s->f, kpk_extent_at(s->f, i)); }

static void err_extent(kstore *s, uint32_t i, kpk_err *err, int code, const char *what)
{
    char d[64];
    kpk_extent_describe(kpk_extent_at(s->f, i), d, sizeof d);
    kpk_err_set(err, code, "%s: %s (extent %u at offset %llu): %s", kpk_path(s->f), d, i,
                (unsigned long long)kpk_extent_at(s->f, i)->offset, what);
}

/* Release the pages of [off, off+len) of the mapping from our resident set
 * (whole pages inside the range only). */
static void drop_pages(kstore *s, uint64_t off, uint64_t len)
{
    uint64_t a = (off + 4095) / 4096 * 4096, b = (off + len) / 4096 * 4096;
    if (b > a) madvise((void *)(s->map + a), b - a, MADV_DONTNEED);
}

/* ---- open / close ------------------------------------------------------------ */

static uint8_t *alloc_aligned(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, n ? n : 4096)) return NULL;
    return p;
}

int kstore_open(kpk_file *f, const kstore_opts *opt, kstore **out, kpk_err *err)
{
    kstore *s = calloc(1, sizeof *s);
    uint32_t n = kpk_extent_count(f);
    const kmemplan *p = opt->plan;
    *out = NULL;
    if (!s) { kpk_err_set(err, KPK_ENOMEM, "out of memory"); return -1; }
    s->f = f;
    s->opt = *opt;
    s->fd_read = -1;
    s->drop_extent = -1;
    s->map_len = kpk_size(f);
    s->role = calloc(n + 1, 1);
    s->verified = calloc(n + 1, 1);
    s->touched = calloc(n + 1, 1);
    s->decoded = calloc(n + 1, sizeof *s->decoded);
    s->slot_of = malloc((n + 1) * sizeof *s->slot_of);
    s->uses = calloc(n + 1, sizeof *s->uses);
    s->xxh = XXH3_createState();
    if (!s->role || !s->verified || !s->touched || !s->decoded || !s->slot_of || !s->uses || !s->xxh) goto oom;
    for (uint32_t i = 0; i <= n; i++) s->slot_of[i] = -1;
    /* In place, everything comes from one mapping.  With a plan only --io
     * mmap maps the file (for the streaming slots): a resident extent touched
     * through a shared mapping would count toward RSS outside the plan, and
     * the kernel maps pages around each fault when the page cache is warm. */
    if (!p || opt->io == KSTORE_IO_MMAP) {
        s->map = mmap(NULL, s->map_len, PROT_READ, MAP_SHARED, kpk_fd(f), 0);
        if (s->map == MAP_FAILED) {
            s->map = NULL;
            kpk_err_set(err, KPK_EIO, "%s: mmap: %s", kpk_path(f), strerror(errno));
            goto fail;
        }
    }
    if (!p) { *out = s; return 0; }

    /* planned mode: who is where; resident extents get their buffers now */
    {
        const k3_model *m = opt->model;
        s->res_buf = calloc(n + 1, sizeof *s->res_buf);
        s->res_first = calloc(n + 1, sizeof *s->res_first);
        s->res_loaded = calloc(n + 1, 1);
        s->window = alloc_aligned(KSTORE_WINDOW_BYTES);
        if (!s->res_buf || !s->res_first || !s->res_loaded || !s->window) goto oom;
        for (uint32_t i = 0; i < n; i++) {
            const kpk_extent *x = kpk_extent_at(f, i);
            if (x->codec != KPK_CODEC_NONE) {
                kpk_err_set(err, KPK_EVERSION, "%s: compressed extents cannot be streamed yet; run without --mem", kpk_path(f));
                goto fail;
            }
            if (x->kind == KPK_KIND_TRUNK && (int)x->layer >= p->pin) s->role[i] = ROLE_RING;
            else if (x->kind == KPK_KIND_EXPERT) s->role[i] = ROLE_EXPERT;
            else if (x->kind == KPK_KIND_TRUNK || i == m->globals_extent) {
                s->role[i] = ROLE_RESIDENT;
                s->res_first[i] = i == m->globals_extent ? kmem_globals_first(m) : 0;
                if (!(s->res_buf[i] = alloc_aligned(padded(s, i) - s->res_first[i]))) goto oom;
            }
        }
        s->drop_extent = m->globals_extent;
        s->drop_off = m->globals[K3T_EMBED].offset;
        s->drop_len = m->globals[K3T_EMBED].nbytes;
    }
    if (opt->io == KSTORE_IO_DIRECT) {
        s->fd_read = open(kpk_path(f), O_RDONLY | O_DIRECT | O_CLOEXEC);
        if (s->fd_read < 0) {
            kpk_err_set(err, KPK_EIO, "%s: cannot open with O_DIRECT (%s); this file system may not support it, use --io pread",
                        kpk_path(f), strerror(errno));
            goto fail;
        }
    } else {
        s->fd_read = dup(kpk_fd(f));
        if (s->fd_read < 0) { kpk_err_set(err, KPK_EIO, "%s: %s", kpk_path(f), strerror(errno)); goto fail; }
    }
    s->io = kio_pool_create(opt->io_threads > 0 ? opt->io_threads : 8);
    if (!s->io) goto oom;
    /* every read that can be in flight at once has its queue entry now */
    if (kio_reserve(s->io, (size_t)(p->ring_slots * (p->ring_slot_bytes / READ_CHUNK + 1) +
                                    (uint64_t)p->expert_slots * (p->expert_slot_bytes / READ_CHUNK + 1) + 64)))
        goto oom;
    if (opt->trace) kio_trace_enable(s->io);
    s->n_ring = p->ring_slots;
    for (int k = 0; k < s->n_ring; k++) {
        s->ring[k].extent = -1;
        if (opt->io != KSTORE_IO_MMAP && !(s->ring[k].buf = alloc_aligned(p->ring_slot_bytes))) goto oom;
    }
    s->n_eslots = p->expert_slots;
    s->eslots = calloc((size_t)s->n_eslots + 1, sizeof *s->eslots);
    if (!s->eslots) goto oom;
    for (int k = 0; k < s->n_eslots; k++) {
        s->eslots[k].extent = -1;
        if (opt->io != KSTORE_IO_MMAP && !(s->eslots[k].buf = alloc_aligned(p->expert_slot_bytes))) goto oom;
    }
    *out = s;
    return 0;
oom:
    kpk_err_set(err, KPK_ENOMEM, "out of memory setting up the store");
fail:
    kstore_close(s);
    return -1;
}

/* Free a per-extent table of buffers and the table. */
static void free_table(uint8_t **t, uint32_t n)
{
    if (t)
        for (uint32_t i = 0; i < n; i++) free(t[i]);
    free(t);
}

void kstore_close(kstore *s)
{
    if (!s) return;
    kio_pool_destroy(s->io);
    for (int k = 0; k < 2; k++) free(s->ring[k].buf);
    if (s->eslots)
        for (int k = 0; k < s->n_eslots; k++) free(s->eslots[k].buf);
    free(s->eslots);
    if (s->map) munmap((void *)s->map, s->map_len);
    if (s->fd_read >= 0) close(s->fd_read);
    free_table(s->decoded, kpk_extent_count(s->f));
    free(s->role);
    free(s->verified);
    free(s->touched);
    free(s->slot_of);
    free(s->uses);
    free_table(s->res_buf, kpk_extent_count(s->f));
    free(s->res_first);
    free(s->res_loaded);
    free(s->window);
    if (s->xxh) XXH3_freeState(s->xxh);
    free(s);
}

/* ---- verification ---------------------------------------------------------- */

static int need_verify(kstore *s, uint32_t i)
{
    return s->opt.verify == KSTORE_VERIFY_ALWAYS || (s->opt.verify == KSTORE_VERIFY_FIRST && !s->verified[i]);
}

/* Hash a mapped extent window by window, dropping the embedding's pages as we go. */
static int verify_mapped(kstore *s, uint32_t i, kpk_err *err)
{
    const kpk_extent *x = kpk_extent_at(s->f, i);
    XXH3_state_t *st = s->xxh;
    uint64_t h;
    XXH3_64bits_reset(st);
    for (uint64_t pos = 0; pos < x->stored_len; pos += HASH_WINDOW) {
        uint64_t n = x->stored_len - pos < HASH_WINDOW ? x->stored_len - pos : HASH_WINDOW;
        XXH3_64bits_update(st, s->map + x->offset + pos, n);
        if ((int64_t)i == s->drop_extent && s->opt.plan) {
            uint64_t a = pos > s->drop_off ? pos : s->drop_off;
            uint64_t b = pos + n < s->drop_off + s->drop_len ? pos + n : s->drop_off + s->drop_len;
            if (b > a) drop_pages(s, x->offset + a, b - a);
        }
    }
    h = XXH3_64bits_digest(st);
    if (h != x->stored_xxh3) { err_extent(s, i, err, KPK_ECHECKSUM, "checksum mismatch"); return -1; }
    s->verified[i] = 1;
    s->st.extents_verified++;
    return 0;
}

static int verify_buffer(kstore *s, uint32_t i, const uint8_t *buf, kpk_err *err)
{
    if (kpk_extent_check(s->f, i, buf, err)) return -1;
    s->verified[i] = 1;
    s->st.extents_verified++;
    return 0;
}

/* ---- loading a slot ---------------------------------------------------------- */

static const uint8_t *slot_data(const kstore *s, const struct slot *sl)
{
    return sl->buf ? sl->buf : s->map + kpk_extent_at(s->f, (uint32_t)sl->extent)->offset;
}

static void slot_evict(kstore *s, struct slot *sl)
{
    if (sl->extent < 0) return;
    if (s->opt.io == KSTORE_IO_MMAP) {
        /* out of our resident set, and out of the page cache too: the next use
         * reads the disk again, as the budget says it must */
        uint64_t off = kpk_extent_at(s->f, (uint32_t)sl->extent)->offset, len = padded(s, (uint32_t)sl->extent);
        /* with the pages the kernel mapped around our faults (fault-around) */
        uint64_t a = off > FAULT_AROUND ? off - FAULT_AROUND : 0;
        uint64_t b = off + len + FAULT_AROUND < s->map_len ? off + len + FAULT_AROUND : s->map_len;
        drop_pages(s, a, b - a);
        posix_fadvise(s->fd_read, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
    }
    if (s->slot_of[sl->extent] >= 0 && sl >= s->eslots && sl < s->eslots + s->n_eslots) s->slot_of[sl->extent] = -1;
    sl->extent = -1;
}

static int slot_load(kstore *s, struct slot *sl, uint32_t i, int prio, char kind)
{
    const kpk_extent *x = kpk_extent_at(s->f, i);
    uint64_t len = padded(s, i);
    slot_evict(s, sl);
    sl->extent = i;
    sl->fresh = 1;
    sl->loading = 1;
    memset(&sl->batch, 0, sizeof sl->batch);
    if (s->opt.io == KSTORE_IO_MMAP) {
        madvise((void *)(s->map + x->offset), len, MADV_WILLNEED);
        return 0;
    }
    {
        kio_req reqs[64];
        size_t nr = 0;
        for (uint64_t pos = 0; pos < len; pos += READ_CHUNK) {
            kio_req *r = &reqs[nr++];
            r->fd = s->fd_read;
            r->buf = sl->buf + pos;
            r->off = x->offset + pos;
            r->len = len - pos < READ_CHUNK ? (size_t)(len - pos) : READ_CHUNK;
            r->prio = prio;
            r->kind = kind;
            r->drop_cache = s->opt.io == KSTORE_IO_PREAD;
            r->batch = &sl->batch;
            if (nr == 64) { if (kio_submit(s->io, reqs, nr)) return -1; nr = 0; }
        }
        if (nr && kio_submit(s->io, reqs, nr)) return -1;
    }
    return 0;
}

static int slot_wait(kstore *s, struct slot *sl, kpk_err *err)
{
    uint32_t i = (uint32_t)sl->extent;
    if (sl->loading) {
        int e = s->opt.io == KSTORE_IO_MMAP ? 0 : kio_wait(s->io, &sl->batch);
        sl->loading = 0;
        if (e) {
            err_extent(s, i, err, KPK_EIO, strerror(e));
            slot_evict(s, sl);
            return -1;
        }
    }
    return 0;
}

/* ---- the ring ---------------------------------------------------------------- */

static int64_t next_ring_extent(const kstore *s, uint32_t i)
{
    const k3_model *m = s->opt.model;
    int L = (int)kpk_extent_at(s->f, i)->layer;
    for (int d = 1; d <= m->cfg.n_layers; d++) {
        int n = (L + d) % m->cfg.n_layers;
        if (n >= s->opt.plan->pin) return n == L ? -1 : (int64_t)m->trunk_extent[n];
    }
    return -1;
}

static struct slot *ring_find(kstore *s, uint32_t i)
{
    for (int k = 0; k < s->n_ring; k++) if (s->ring[k].extent == (int64_t)i) return &s->ring[k];
    return NULL;
}

static struct slot *ring_free(kstore *s, int64_t keep)
{
    struct slot *best = NULL;
    for (int k = 0; k < s->n_ring; k++) {
        struct slot *sl = &s->ring[k];
        if (sl->refs || (keep >= 0 && sl->extent == keep)) continue;
        if (sl->loading) continue; /* never reuse a slot with reads in flight */
        if (!best || sl->extent < 0) best = sl;
    }
    return best;
}

static const uint8_t *ring_get(kstore *s, uint32_t i, kpk_err *err)
{
    struct slot *sl = ring_find(s, i);
    int64_t nx;
    if (!sl) {
        sl = ring_free(s, -1);
        if (!sl) {
            /* the read-ahead slot is still loading something else: let it finish */
            for (int k = 0; k < s->n_ring && !sl; k++)
                if (!s->ring[k].refs && s->ring[k].loading && !slot_wait(s, &s->ring[k], err)) sl = &s->ring[k];
            if (!sl) { err_extent(s, i, err, KPK_EINVAL, "no free trunk ring slot"); return NULL; }
        }
        if (slot_load(s, sl, i, KIO_URGENT, 'T')) { err_extent(s, i, err, KPK_ENOMEM, "cannot queue reads"); return NULL; }
    }
    if (slot_wait(s, sl, err)) return NULL;
    if (sl->fresh) {
        s->st.bytes_trunk += padded(s, i);
        s->st.bytes_read += padded(s, i);
        sl->fresh = 0;
    }
    if (need_verify(s, i) && (sl->buf ? verify_buffer(s, i, sl->buf, err) : verify_mapped(s, i, err))) {
        slot_evict(s, sl);
        return NULL;
    }
    sl->refs++;
    /* read the next streamed layer into the other slot while this one computes */
    nx = next_ring_extent(s, i);
    if (nx >= 0 && !ring_find(s, (uint32_t)nx)) {
        struct slot *o = ring_free(s, i);
        if (o) slot_load(s, o, (uint32_t)nx, KIO_AHEAD, 'T');
    }
    return slot_data(s, sl);
}

/* ---- the expert cache ----------------------------------------------------------- */

static struct slot *expert_victim(kstore *s)
{
    struct slot *best = NULL;
    for (int k = 0; k < s->n_eslots; k++) {
        struct slot *sl = &s->eslots[k];
        if (sl->refs) continue;
        if (sl->extent < 0) return sl;
        if (!best) { best = sl; continue; }
        if (s->opt.policy == KSTORE_LFU) {
            /* least often requested; among equals the MOST recently used: layers
             * come round in a fixed cycle, so the expert used last is the one
             * needed latest (LRU evicts exactly what the next step needs) */
            uint32_t a = s->uses[sl->extent], b = s->uses[best->extent];
            if (a < b || (a == b && sl->last_use > best->last_use)) best = sl;
        } else if (sl->last_use < best->last_use) {
            best = sl;
        }
    }
    return best;
}

/* Extents in file order (insertion sort: a layer's misses are few, and qsort may allocate). */
static void sort_by_offset(const kstore *s, uint32_t *v, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        uint32_t x = v[i];
        uint64_t off = kpk_extent_at(s->f, x)->offset;
        size_t j = i;
        for (; j > 0 && kpk_extent_at(s->f, v[j - 1])->offset > off; j--) v[j] = v[j - 1];
        v[j] = x;
    }
}

size_t kstore_expert_capacity(const kstore *s) { return s->opt.plan ? (size_t)s->n_eslots : 256; }

int kstore_get_many(kstore *s, const uint32_t *ids, size_t n, const uint8_t **out, kpk_err *err)
{
    uint32_t miss[256];
    size_t nm = 0;
    if (!s->opt.plan || n == 0) {
        for (size_t k = 0; k < n; k++)
            if (!(out[k] = kstore_get(s, ids[k], NULL, err))) return -1;
        return 0;
    }
    if (n > 256 || n > (size_t)s->n_eslots) {
        kpk_err_set(err, KPK_EINVAL, "%zu experts requested at once, the cache has %d slots", n, s->n_eslots);
        return -1;
    }
    s->tick++;
    for (size_t k = 0; k < n; k++) {
        int32_t sl = s->slot_of[ids[k]];
        s->uses[ids[k]]++;
        if (sl >= 0) {                        /* resident before this request: a true hit */
            s->eslots[sl].refs++;
            s->eslots[sl].last_use = s->tick;
            s->st.expert_hits++;
        } else {
            miss[nm++] = ids[k];
        }
    }
    /* the misses, read concurrently in file order */
    sort_by_offset(s, miss, nm);
    for (size_t k = 0; k < nm; k++) {
        struct slot *v = expert_victim(s);
        if (!v) { kpk_err_set(err, KPK_EINVAL, "expert cache full (%d slots in use)", s->n_eslots); goto fail; }
        slot_evict(s, v);
        s->slot_of[miss[k]] = (int32_t)(v - s->eslots);
        v->refs = 1;
        v->last_use = s->tick;
        if (slot_load(s, v, miss[k], KIO_URGENT, 'E')) { err_extent(s, miss[k], err, KPK_ENOMEM, "cannot queue reads"); goto fail; }
    }
    for (size_t k = 0; k < nm; k++) {
        struct slot *v = &s->eslots[s->slot_of[miss[k]]];
        if (slot_wait(s, v, err)) goto fail;
        s->st.bytes_experts += padded(s, miss[k]);
        s->st.bytes_read += padded(s, miss[k]);
        s->st.expert_misses++;
        v->fresh = 0;
    }
    for (size_t k = 0; k < n; k++) {
        struct slot *v = &s->eslots[s->slot_of[ids[k]]];
        if (need_verify(s, ids[k]) && (v->buf ? verify_buffer(s, ids[k], v->buf, err) : verify_mapped(s, ids[k], err))) {
            for (size_t q = 0; q < n; q++) if (s->slot_of[ids[q]] >= 0) s->eslots[s->slot_of[ids[q]]].refs--;
            slot_evict(s, v);
            return -1;
        }
        out[k] = slot_data(s, v);
    }
    return 0;
fail:
    for (size_t q = 0; q < n; q++) {
        int32_t sl = s->slot_of[ids[q]];
        if (sl >= 0 && s->eslots[sl].refs) {
            s->eslots[sl].refs--;
            if (s->eslots[sl].loading) { kpk_err e2; slot_wait(s, &s->eslots[sl], &e2); }
        }
    }
    return -1;
}

/* ---- resident extents (with a plan) ------------------------------------------- */

/* The whole stored extent's hash: the part never held (the embedding of the
 * globals) is streamed through the window and dropped from the page cache. */
static int verify_resident(kstore *s, uint32_t i, kpk_err *err)
{
    const kpk_extent *x = kpk_extent_at(s->f, i);
    const uint64_t first = s->res_first[i];
    XXH3_64bits_reset(s->xxh);
    for (uint64_t pos = 0; pos < first; pos += KSTORE_WINDOW_BYTES) {
        size_t n = first - pos < KSTORE_WINDOW_BYTES ? (size_t)(first - pos) : KSTORE_WINDOW_BYTES;
        if (kio_pread_full(s->fd_read, s->window, n, x->offset + pos)) { err_extent(s, i, err, KPK_EIO, strerror(errno)); return -1; }
        posix_fadvise(s->fd_read, (off_t)(x->offset + pos), (off_t)n, POSIX_FADV_DONTNEED);
        XXH3_64bits_update(s->xxh, s->window, n);
        s->st.bytes_resident += n;
        s->st.bytes_read += n;
    }
    XXH3_64bits_update(s->xxh, s->res_buf[i], x->stored_len - first);
    if (XXH3_64bits_digest(s->xxh) != x->stored_xxh3) { err_extent(s, i, err, KPK_ECHECKSUM, "checksum mismatch"); return -1; }
    s->verified[i] = 1;
    s->st.extents_verified++;
    return 0;
}

static const uint8_t *resident_get(kstore *s, uint32_t i, uint64_t *first, kpk_err *err)
{
    if (s->res_first[i] && !first) { err_extent(s, i, err, KPK_EINVAL, "asked for whole, held in part"); return NULL; }
    if (!s->res_loaded[i]) {
        const kpk_extent *x = kpk_extent_at(s->f, i);
        uint64_t len = padded(s, i) - s->res_first[i];
        kio_batch b;
        kio_req reqs[64];
        size_t nr = 0;
        int e = 0;
        memset(&b, 0, sizeof b);
        for (uint64_t pos = 0; pos < len && !e; pos += READ_CHUNK) {
            kio_req *r = &reqs[nr++];
            r->fd = s->fd_read;
            r->buf = s->res_buf[i] + pos;
            r->off = x->offset + s->res_first[i] + pos;
            r->len = len - pos < READ_CHUNK ? (size_t)(len - pos) : READ_CHUNK;
            r->prio = KIO_URGENT;
            r->kind = 'R';
            r->drop_cache = s->opt.io != KSTORE_IO_DIRECT;
            r->batch = &b;
            if (nr == 64 || pos + READ_CHUNK >= len) { e = kio_submit(s->io, reqs, nr); nr = 0; }
        }
        if (kio_wait(s->io, &b) || e) { err_extent(s, i, err, KPK_EIO, strerror(b.err ? b.err : ENOMEM)); return NULL; }
        s->res_loaded[i] = 1;
        s->st.bytes_resident += len;
        s->st.bytes_read += len;
    }
    if (need_verify(s, i) && verify_resident(s, i, err)) return NULL;
    if (first) *first = s->res_first[i];
    return s->res_buf[i];
}

/* ---- get / put ---------------------------------------------------------------- */

const uint8_t *kstore_get(kstore *s, uint32_t i, uint64_t *first, kpk_err *err)
{
    const kpk_extent *x = kpk_extent_at(s->f, i);
    if (!x) { kpk_err_set(err, KPK_EINVAL, "no extent %u", i); return NULL; }
    if (first) *first = 0;
    if (s->role[i] == ROLE_RING) return ring_get(s, i, err);
    if (s->role[i] == ROLE_RESIDENT) return resident_get(s, i, first, err);
    if (s->role[i] == ROLE_EXPERT) {
        const uint8_t *p;
        return kstore_get_many(s, &i, 1, &p, err) ? NULL : p;
    }
    if (!s->map) { err_extent(s, i, err, KPK_EINVAL, "not part of the plan"); return NULL; }
    /* in place from the mapping */
    if (need_verify(s, i) && verify_mapped(s, i, err)) return NULL;
    if (!s->touched[i]) {
        s->touched[i] = 1;
        s->st.bytes_resident += x->stored_len;
        s->st.bytes_read += x->stored_len;
    }
    if (x->codec == KPK_CODEC_NONE) return s->map + x->offset;
    if (!s->decoded[i]) {
        s->decoded[i] = malloc(x->raw_len ? x->raw_len : 1);
        if (!s->decoded[i]) { kpk_err_set(err, KPK_ENOMEM, "out of memory"); return NULL; }
        if (kpk_extent_decode_into(s->f, i, s->map + x->offset, s->decoded[i], err)) {
            free(s->decoded[i]);
            s->decoded[i] = NULL;
            return NULL;
        }
    }
    return s->decoded[i];
}

void kstore_put(kstore *s, uint32_t i)
{
    struct slot *sl = NULL;
    if (s->role[i] == ROLE_RING) sl = ring_find(s, i);
    else if (s->role[i] == ROLE_EXPERT && s->slot_of[i] >= 0) sl = &s->eslots[s->slot_of[i]];
    if (sl && sl->refs > 0) sl->refs--;
}

int kstore_read(kstore *s, uint32_t i, uint64_t off, size_t len, void *dst, kpk_err *err)
{
    const kpk_extent *x = kpk_extent_at(s->f, i);
    if (!x || off + len > x->raw_len || x->codec != KPK_CODEC_NONE) { kpk_err_set(err, KPK_EINVAL, "bad read of extent %u", i); return -1; }
    if (!s->opt.plan) { memcpy(dst, s->map + x->offset + off, len); return 0; }
    if (kio_pread_full(kpk_fd(s->f), dst, len, x->offset + off)) { err_extent(s, i, err, KPK_EIO, strerror(errno)); return -1; }
    s->st.bytes_globals += len;
    s->st.bytes_read += len;
    return 0;
}

void kstore_stats_get(const kstore *s, kstore_stats *st)
{
    *st = s->st;
    st->io_wait_seconds = s->io ? kio_wait_seconds(s->io) : 0;
}

int kstore_trace_write(kstore *s, const char *path)
{
    if (!s->io) {
        FILE *f = fopen(path, "w"); /* no streaming reads: an empty trace */
        if (!f) return -1;
        fprintf(f, "kind\toffset\tlength\tstart_s\tend_s\n");
        return fclose(f);
    }
    return kio_trace_write(s->io, path);
}
