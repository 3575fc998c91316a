/* The conversion's reader thread: each extent's raw bytes gathered from the
 * source into chunks (copy_pipe.h).  Holes in sparse sources are found with
 * SEEK_DATA and never read; source pages are dropped once read. */
#include "copy_pipe.h"

#include "archive.h"
#include "consume.h"
#include "format/kio.h"
#include "format/kos.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HOLE_RUN 1024               /* hole extents handed over at once (one per extent costs a thread switch) */
#define VERIFY_SCRATCH ((size_t)8 << 20)

/* ---- holes ----------------------------------------------------------------- */

/* 1 if [off, off+len) of fd is a hole (reads as zeros without I/O). */
static int fd_range_is_hole(int fd, uint64_t off, uint64_t len)
{
    off_t d = lseek(fd, (off_t)off, SEEK_DATA);
    return (d < 0 && errno == ENXIO) || (d >= 0 && (uint64_t)d >= off + len);
}

/* A source KPK extent's decoded range [pos, pos+len) is holes (codec 0 only). */
static int kpk_range_is_hole(kpk_file *f, uint32_t i, uint64_t pos, uint64_t len)
{
    kpk_seg seg[64];
    if (kpk_extent_at(f, i)->codec != KPK_CODEC_NONE) return 0;
    while (len) {
        uint64_t done;
        size_t n = kpk_extent_segments(f, i, pos, len, seg, 64, &done);
        if (!n) return 0;
        for (size_t s = 0; s < n; s++)
            if (!fd_range_is_hole(kpk_member_fd(f, seg[s].member), seg[s].off, seg[s].len)) return 0;
        pos += done;
        len -= done;
    }
    return 1;
}

/* A shard's bytes that come from the consume log: it was deleted (consume.h). */
static int from_log(struct pipe *pp, const kp_source_ref *from)
{
    return pp->in->consume && pp->in->src && from->shard < pp->in->src->n_shards && kc_released(pp->in->consume, from->shard);
}

/* A tensor's source range is a hole.  A shard range past the end of the
 * file is not: reading it reports the shrink. */
static int source_is_hole(struct pipe *pp, const kp_source_ref *from, uint64_t off, uint64_t len)
{
    if (from->shard == KP_FROM_EXTRA || from->shard == KP_FROM_FILE) return 0;
    if (from->shard == KP_FROM_KPK) return kpk_range_is_hole(pp->in->kpk, from->extra, from->offset + off, len);
    if (from_log(pp, from)) return 0;
    if (from->offset + off + len > pp->shard_size[from->shard]) return 0;
    return fd_range_is_hole(pp->shard_fd[from->shard], from->offset + off, len);
}

int kp_extent_is_hole(struct pipe *pp, uint32_t e)
{
    const kp_plan *p = pp->p;
    const kpk_extent *x = &p->extents[e];
    if (pp->p->origin[e].identical) return kpk_range_is_hole(pp->in->kpk, p->origin[e].extent, 0, x->raw_len);
    for (uint64_t ti = x->first_tensor; ti < (uint64_t)x->first_tensor + x->tensor_count; ti++)
        if (p->tensors[ti].nbytes && !source_is_hole(pp, &p->from[ti], 0, p->tensors[ti].nbytes)) return 0;
    return 1;
}

/* ---- reading the source ------------------------------------------------------- */

/* The part [*a, *b) of tensor t that lies in [pos, pos+len): 1 if it is not
 * empty, 0 if the tensor lies before the range, -1 if it lies past it (and,
 * since tensors are in offset order, so do all that follow). */
static int tensor_in_range(const kpk_tensor *t, uint64_t pos, uint64_t len, uint64_t *a, uint64_t *b)
{
    *a = t->offset > pos ? t->offset : pos;
    *b = t->offset + t->nbytes < pos + len ? t->offset + t->nbytes : pos + len;
    if (*a < *b) return 1;
    return t->offset >= pos + len ? -1 : 0;
}

static int read_failed(struct pipe *pp, const char *fmt, const char *a, const char *b)
{
    snprintf(pp->err, sizeof pp->err, fmt, a, b);
    return -1;
}

/* A kept file of the download (archive), opened on first use. */
static int kept_file_read(struct pipe *pp, uint32_t i, uint8_t *dst, uint64_t len, uint64_t off)
{
    const ka_file *kf = &pp->in->arch->files[i];
    if (pp->file_fd[i] < 0 && (pp->file_fd[i] = open(kf->path, O_RDONLY | O_CLOEXEC)) < 0)
        return read_failed(pp, "%s: %s", kf->path, strerror(errno));
    if (kio_pread_full(pp->file_fd[i], dst, len, off))
        return read_failed(pp, "%s: %s", kf->path,
                           errno == ENODATA ? "unexpected end of file (it changed since the conversion began?)" : strerror(errno));
    return 0;
}

/* Bytes [off, off+len) of a tensor from its source into dst. */
static int read_tensor(struct pipe *pp, const kpk_tensor *t, const kp_source_ref *from, uint64_t off, uint64_t len,
                       uint8_t *dst)
{
    if (from->shard == KP_FROM_EXTRA) {
        memcpy(dst, pp->in->src->extras[from->extra].data + off, len);
        return 0;
    }
    if (from->shard == KP_FROM_FILE) {
        if (kept_file_read(pp, from->extra, dst, len, from->offset + off)) return -1;
        pp->bytes_read += len;
        return 0;
    }
    if (from_log(pp, from)) {
        if (kc_read(pp->in->consume, from->shard, from->offset, off, dst, len))
            return read_failed(pp, "reading %s from the consume log: %s", pp->in->src->shards[from->shard].name, strerror(errno));
        pp->bytes_read += len;
        return 0;
    }
    if (source_is_hole(pp, from, off, len)) {
        memset(dst, 0, len);
        return 0;
    }
    if (from->shard == KP_FROM_KPK) {
        kpk_err e = {0};
        if (kpk_extent_read_raw(pp->in->kpk, from->extra, dst, len, from->offset + off, &e)) {
            pp->damaged = kpk_err_is_damage(e.code);
            return read_failed(pp, "reading the source: %s%s", e.msg, "");
        }
    } else {
        int fd = pp->shard_fd[from->shard];
        uint64_t so = from->offset + off;
        if (kio_pread_full(fd, dst, len, so)) {
            snprintf(pp->err, sizeof pp->err, "%s: reading tensor %s: %s", pp->in->src->shards[from->shard].path, t->name,
                     errno == ENODATA ? "unexpected end of file (the shard shrank?)" : strerror(errno));
            return -1;
        }
        /* read once: drop it from the page cache rather than let 1.5 TB push everything else out */
        kos_cache_drop(fd, so, len);
    }
    pp->bytes_read += len;
    return 0;
}

int kp_fill_range(struct pipe *pp, uint32_t e, uint64_t pos, size_t len, uint8_t *buf, int *all_zero)
{
    const kp_plan *p = pp->p;
    const kpk_extent *x = &p->extents[e];
    uint64_t z = pos; /* [pos, z) is filled */
    *all_zero = 1;
    if (p->origin[e].identical) {
        /* a KPK source laid out the same: its decoded bytes, as they are */
        kpk_err er = {0};
        if (kpk_range_is_hole(pp->in->kpk, p->origin[e].extent, pos, len)) return 0;
        if (kpk_extent_read_raw(pp->in->kpk, p->origin[e].extent, buf, len, pos, &er)) {
            pp->damaged = kpk_err_is_damage(er.code);
            return read_failed(pp, "reading the source: %s%s", er.msg, "");
        }
        pp->bytes_read += len;
        *all_zero = 0;
        return 0;
    }
    /* First look: a range of nothing but holes and gaps is not filled at all. */
    for (uint64_t ti = x->first_tensor; ti < (uint64_t)x->first_tensor + x->tensor_count && *all_zero; ti++) {
        uint64_t a, b;
        int r = tensor_in_range(&p->tensors[ti], pos, len, &a, &b);
        if (r < 0) break;
        if (r > 0 && !source_is_hole(pp, &p->from[ti], a - p->tensors[ti].offset, b - a)) *all_zero = 0;
    }
    if (*all_zero) return 0;
    for (uint64_t ti = x->first_tensor; ti < (uint64_t)x->first_tensor + x->tensor_count; ti++) {
        const kpk_tensor *t = &p->tensors[ti];
        uint64_t a, b;
        int r = tensor_in_range(t, pos, len, &a, &b);
        if (r < 0) break;
        if (r == 0) continue;
        if (a > z) memset(buf + (z - pos), 0, a - z);
        if (b > z) z = b;
        if (read_tensor(pp, t, &p->from[ti], a - t->offset, b - a, buf + (a - pos))) return -1;
    }
    if (z < pos + len) memset(buf + (z - pos), 0, pos + len - z);
    return 0;
}

/* Fill chunk [pos, pos+len) of extent e; -1 on a read error. */
static int fill_chunk(struct pipe *pp, uint32_t e, uint64_t pos, size_t len, struct chunk *c)
{
    c->extent = e;
    c->n_holes = 0;
    c->pos = pos;
    c->len = len;
    return kp_fill_range(pp, e, pos, len, c->buf, &c->all_zero);
}

int kp_sources_open(struct pipe *pp, char *err, size_t errlen)
{
    const kp_input *in = pp->in;
    size_t n_shards = in->src ? in->src->n_shards : 0, n_files = in->arch ? in->arch->n_files : 0;
    pp->shard_fd = malloc(sizeof *pp->shard_fd * (n_shards + 1));
    pp->file_fd = malloc(sizeof *pp->file_fd * (n_files + 1));
    pp->shard_size = malloc(sizeof *pp->shard_size * (n_shards + 1));
    if (!pp->shard_fd || !pp->file_fd || !pp->shard_size) { snprintf(err, errlen, "out of memory"); return -1; }
    for (size_t i = 0; i < n_shards; i++) pp->shard_fd[i] = -1;
    for (size_t i = 0; i < n_files; i++) pp->file_fd[i] = -1;
    for (size_t i = 0; i < n_shards; i++) {
        struct stat sst;
        pp->shard_size[i] = in->src->shards[i].size;
        if (in->consume && kc_released(in->consume, (uint32_t)i)) continue; /* deleted: the log has what is left of it */
        pp->shard_fd[i] = open(in->src->shards[i].path, O_RDONLY | O_CLOEXEC);
        if (pp->shard_fd[i] < 0 || fstat(pp->shard_fd[i], &sst)) { snprintf(err, errlen, "%s: %s", in->src->shards[i].path, strerror(errno)); return -1; }
        pp->shard_size[i] = (uint64_t)sst.st_size;
        kos_cache_sequential(pp->shard_fd[i]);
    }
    return 0;
}

void kp_sources_close(struct pipe *pp)
{
    const kp_input *in = pp->in;
    size_t n_shards = in && in->src ? in->src->n_shards : 0, n_files = in && in->arch ? in->arch->n_files : 0;
    if (pp->shard_fd)
        for (size_t i = 0; i < n_shards; i++)
            if (pp->shard_fd[i] >= 0) close(pp->shard_fd[i]);
    if (pp->file_fd)
        for (size_t i = 0; i < n_files; i++)
            if (pp->file_fd[i] >= 0) close(pp->file_fd[i]);
    free(pp->shard_fd);
    free(pp->file_fd);
    free(pp->shard_size);
    pp->shard_fd = pp->file_fd = NULL;
    pp->shard_size = NULL;
}

/* A KPK source extent copied tensor by tensor (not laid out the same) is
 * checked whole first: its bytes are not otherwise compared with its checksum. */
static int verify_source_extents(struct pipe *pp, uint32_t e)
{
    const kp_plan *p = pp->p;
    const kpk_extent *x = &p->extents[e];
    uint32_t last = UINT32_MAX;
    void *scratch;
    if (!pp->in->kpk || p->origin[e].identical) return 0;
    if (!(scratch = malloc(VERIFY_SCRATCH))) return read_failed(pp, "out of memory%s%s", "", "");
    for (uint64_t ti = x->first_tensor; ti < (uint64_t)x->first_tensor + x->tensor_count; ti++) {
        kpk_err er = {0};
        uint32_t s = p->from[ti].extra;
        if (p->from[ti].shard != KP_FROM_KPK || s == last) continue;
        last = s;
        if (kpk_extent_verify(pp->in->kpk, s, scratch, VERIFY_SCRATCH, &er)) {
            free(scratch);
            pp->damaged = kpk_err_is_damage(er.code);
            return read_failed(pp, "the source is damaged: %s; run kpack verify on it%s", er.msg, "");
        }
    }
    free(scratch);
    return 0;
}

/* Wait for the next free ring slot; NULL if the copy was stopped. */
static struct chunk *slot(struct pipe *pp)
{
    struct chunk *c;
    pthread_mutex_lock(&pp->mu);
    while (pp->ring[pp->head % pp->nbuf].state != SLOT_FREE && !pp->stop) pthread_cond_wait(&pp->cv, &pp->mu);
    c = pp->stop ? NULL : &pp->ring[pp->head % pp->nbuf];
    pthread_mutex_unlock(&pp->mu);
    return c;
}

static void publish(struct pipe *pp, struct chunk *c)
{
    pthread_mutex_lock(&pp->mu);
    c->state = SLOT_FILLED;
    pp->head++;
    pthread_cond_broadcast(&pp->cv);
    pthread_mutex_unlock(&pp->mu);
}

static void reader_failed(struct pipe *pp)
{
    pthread_mutex_lock(&pp->mu);
    pp->failed = 1;
    pp->reader_done = 1;
    pthread_cond_broadcast(&pp->cv);
    pthread_mutex_unlock(&pp->mu);
}

/* Room in c for blocks cut0 .. cut0+n-1 (their slots and their encodings). */
static int chunk_reserve_blocks(struct pipe *pp, struct chunk *c, uint32_t cut0, uint32_t n)
{
    size_t need = 0;
    if (n > c->slot_cap) {
        size_t *s = realloc(c->slot, sizeof *s * n);
        if (!s) return -1;
        c->slot = s;
        c->slot_cap = n;
    }
    for (uint32_t k = 0; k < n; k++) {
        c->slot[k] = need;
        need += kp_slot_bound(pp, cut0 + k);
    }
    if (need > c->out_cap) {
        uint8_t *o = realloc(c->out, need);
        if (!o) return -1;
        c->out = o;
        c->out_cap = need;
    }
    c->cut0 = cut0;
    c->ncut = n;
    c->next_cut = c->cuts_done = 0;
    return 0;
}

/* Hand over extent e chunk by chunk (a codec-2 extent in chunks of whole
 * blocks); -1 if the copy was stopped or a read failed. */
static int send_extent(struct pipe *pp, uint32_t e)
{
    const kp_plan *p = pp->p;
    const kpk_extent *x = &p->extents[e];
    uint32_t nb = kp_extent_nblocks(p, e), b = 0;
    if (verify_source_extents(pp, e)) { reader_failed(pp); return -1; }
    /* an empty extent still produces one (empty) chunk so the writer sees it */
    for (uint64_t pos = 0; pos < x->raw_len || (pos == 0 && x->raw_len == 0);) {
        size_t len = x->raw_len - pos < pp->chunk_bytes ? (size_t)(x->raw_len - pos) : pp->chunk_bytes;
        uint32_t b0 = b;
        struct chunk *c = slot(pp);
        if (!c) return -1;
        if (nb) { /* whole blocks: at least one, as many as fit */
            const kp_cut *cut = p->cuts + x->first_block;
            len = cut[b].raw_len;
            for (b++; b < nb && len + cut[b].raw_len <= pp->chunk_bytes; b++) len += cut[b].raw_len;
            if (chunk_reserve_blocks(pp, c, x->first_block + b0, b - b0)) {
                read_failed(pp, "out of memory%s%s", "", "");
                reader_failed(pp);
                return -1;
            }
        } else {
            c->ncut = 0;
        }
        if (fill_chunk(pp, e, pos, len, c)) { reader_failed(pp); return -1; }
        publish(pp, c);
        pos += len;
        if (len == 0) break;
    }
    return 0;
}

/* Extent e is nothing but holes (and not coded): hand it over, with the
 * plain hole extents that follow it, as one chunk (nothing to read or
 * write).  A run ends at a shard's last extent.  Returns how many extents
 * it covers, 0 if stopped. */
static uint32_t send_holes(struct pipe *pp, uint32_t e)
{
    const kp_plan *p = pp->p;
    struct chunk *c = slot(pp);
    uint32_t n = 1;
    if (!c) return 0;
    while (n < HOLE_RUN && e + n < p->n_extents && !pp->ends_shard[e + n - 1] && p->extents[e + n].raw_len > 0 &&
           p->extents[e + n].codec == KPK_CODEC_NONE && kp_extent_is_hole(pp, e + n))
        n++;
    c->extent = e;
    c->n_holes = n;
    c->ncut = 0;
    c->pos = 0;
    c->len = p->extents[e].raw_len;
    c->all_zero = 1;
    publish(pp, c);
    return n;
}

/* --consume: extent e reads a shard's staged pieces, which come from the
 * log once the shard is released (the dispatcher releases it at its release
 * point, before it gets to e): wait for that.  0, or -1 if stopped. */
static int wait_released(struct pipe *pp, uint32_t e)
{
    uint32_t s = pp->in->consume ? kc_waits_for(pp->in->consume, e) : UINT32_MAX;
    int stopped = 0;
    if (s == UINT32_MAX) return 0;
    pthread_mutex_lock(&pp->mu);
    while (!kc_released(pp->in->consume, s) && !(stopped = pp->stop)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20000000;
        if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
        pthread_cond_timedwait(&pp->cv, &pp->mu, &ts);
    }
    pthread_mutex_unlock(&pp->mu);
    return stopped ? -1 : 0;
}

void *kp_reader_main(void *arg)
{
    struct pipe *pp = arg;
    const kp_plan *p = pp->p;
    for (uint32_t e = pp->first; e < p->n_extents; e++) {
        if (wait_released(pp, e)) return NULL;
        if (p->extents[e].raw_len > 0 && p->extents[e].codec == KPK_CODEC_NONE && kp_extent_is_hole(pp, e)) {
            uint32_t n = send_holes(pp, e);
            if (!n) return NULL;
            e += n - 1;
        } else if (send_extent(pp, e)) {
            return NULL;
        }
        /* A shard read for the last time: drop what the per-range drops left
         * behind (page cache folios that straddle a range's ends). */
        if (pp->ends_shard[e])
            for (size_t i = 0; pp->in->src && i < pp->in->src->n_shards; i++)
                if (pp->last_use[i] == e && pp->shard_fd[i] >= 0) {
                    kos_cache_drop(pp->shard_fd[i], 0, 0);
                    if (pp->in->consume && kc_file_last_use(pp->in->consume, (uint32_t)i) == e) {
                        close(pp->shard_fd[i]); /* an open file keeps its blocks when --consume deletes it */
                        pp->shard_fd[i] = -1;
                    }
                }
    }
    pthread_mutex_lock(&pp->mu);
    pp->reader_done = 1;
    pthread_cond_broadcast(&pp->cv);
    pthread_mutex_unlock(&pp->mu);
    return NULL;
}
