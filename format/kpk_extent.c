/* Reading and checking extents through the member/stripe mapping, for every
 * codec (docs/FORMAT.md §4, §8, §11).  Codec-2 extents are read block by
 * block: no whole-extent staging copy. */
#include "kpk_internal.h"

#include "kio.h"
#include "kos.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

/* Largest stored length of the extent's blocks (0 without blocks). */
static uint64_t max_block_stored(const kpk_file *f, uint32_t i, uint64_t *max_raw)
{
    const kpk_block *b = kpk_extent_blocks(f, i);
    uint32_t n = kpk_extent_block_count(f, i);
    uint64_t m = 0, r = 0;
    for (uint32_t k = 0; k < n; k++) {
        if (b[k].stored_len > m) m = b[k].stored_len;
        if (b[k].raw_len > r) r = b[k].raw_len;
    }
    if (max_raw) *max_raw = r;
    return m;
}

int kpk_extent_check(const kpk_file *f, uint32_t i, const void *stored, kpk_err *err)
{
    const kpk_extent *x = &f->extents[i];
    if (XXH3_64bits(stored, x->stored_len) != x->stored_xxh3) return kpk_extent_fail(err, KPK_ECHECKSUM, f, i, "checksum mismatch");
    return 0;
}

/* Codec 1: one zstd frame of the whole extent. */
static int decode_frame(const kpk_file *f, uint32_t i, const void *stored, void *raw, kpk_err *err)
{
    const kpk_extent *x = &f->extents[i];
    unsigned long long c = ZSTD_getFrameContentSize(stored, x->stored_len);
    size_t fr = ZSTD_findFrameCompressedSize(stored, x->stored_len), r;
    if (c == ZSTD_CONTENTSIZE_ERROR || (c != ZSTD_CONTENTSIZE_UNKNOWN && c != x->raw_len) || ZSTD_isError(fr) ||
        fr != x->stored_len)
        return kpk_extent_fail(err, KPK_ECHECKSUM, f, i, "not one zstd frame of %llu decoded bytes", (unsigned long long)x->raw_len);
    r = ZSTD_decompress(raw, x->raw_len, stored, x->stored_len);
    if (ZSTD_isError(r)) return kpk_extent_fail(err, KPK_ECHECKSUM, f, i, "zstd: %s", ZSTD_getErrorName(r));
    if (r != x->raw_len) return kpk_extent_fail(err, KPK_ECHECKSUM, f, i, "decoded size differs from the table");
    if (XXH3_64bits(raw, x->raw_len) != x->raw_xxh3) return kpk_extent_fail(err, KPK_ECHECKSUM, f, i, "decoded checksum mismatch");
    return 0;
}

int kpk_extent_decode_into(const kpk_file *f, uint32_t i, const void *stored, void *raw, kpk_err *err)
{
    const kpk_extent *x = &f->extents[i];
    switch (x->codec) {
    case KPK_CODEC_NONE:
        if (raw != stored) memcpy(raw, stored, x->stored_len);
        return 0;
    case KPK_CODEC_ZSTD:
        return decode_frame(f, i, stored, raw, err);
    default: {
        const kpk_block *b = kpk_extent_blocks(f, i);
        uint32_t n = kpk_extent_block_count(f, i);
        for (uint32_t k = 0; k < n; k++)
            if (kpk_block_decode(f, i, k, (const uint8_t *)stored + b[k].stored_off, (uint8_t *)raw + b[k].raw_off, err)) return -1;
        return 0;
    }
    }
}

int kpk_extent_read(const kpk_file *f, uint32_t i, void *buf, int verify, kpk_err *err)
{
    const kpk_extent *x;
    if (i >= f->sb.extent_count) { kpk_err_set(err, KPK_EINVAL, "%s: no extent %u", f->path, i); return -1; }
    x = &f->extents[i];
    if (x->codec == KPK_CODEC_NONE) {
        if (kpk_extent_pread(f, i, buf, x->stored_len, 0, err)) return -1;
        return verify ? kpk_extent_check(f, i, buf, err) : 0;
    }
    if (x->codec == KPK_CODEC_ZSTD) {
        void *stored = malloc(x->stored_len ? x->stored_len : 1);
        int rc;
        if (!stored) return kpk_extent_fail(err, KPK_ENOMEM, f, i, "out of memory");
        rc = kpk_extent_pread(f, i, stored, x->stored_len, 0, err) || (verify && kpk_extent_check(f, i, stored, err)) ||
             decode_frame(f, i, stored, buf, err) ? -1 : 0;
        free(stored);
        return rc;
    }
    {   /* codec 2: block by block, straight into buf */
        const kpk_block *b = kpk_extent_blocks(f, i);
        uint32_t n = kpk_extent_block_count(f, i);
        uint8_t *stored = malloc(max_block_stored(f, i, NULL) + 1);
        XXH3_state_t *st = XXH3_createState();
        int rc = 0;
        if (!stored || !st) { free(stored); XXH3_freeState(st); return kpk_extent_fail(err, KPK_ENOMEM, f, i, "out of memory"); }
        XXH3_64bits_reset(st);
        for (uint32_t k = 0; k < n && !rc; k++) {
            rc = kpk_extent_pread(f, i, stored, b[k].stored_len, b[k].stored_off, err);
            if (!rc && verify) XXH3_64bits_update(st, stored, b[k].stored_len);
            if (!rc) rc = kpk_block_decode(f, i, k, stored, (uint8_t *)buf + b[k].raw_off, err);
        }
        if (!rc && verify && XXH3_64bits_digest(st) != x->stored_xxh3) rc = kpk_extent_fail(err, KPK_ECHECKSUM, f, i, "checksum mismatch");
        if (!rc && verify && XXH3_64bits(buf, x->raw_len) != x->raw_xxh3)
            rc = kpk_extent_fail(err, KPK_ECHECKSUM, f, i, "decoded checksum mismatch");
        free(stored);
        XXH3_freeState(st);
        return rc;
    }
}

int kpk_extent_read_raw(const kpk_file *f, uint32_t i, void *dst, uint64_t len, uint64_t pos, kpk_err *err)
{
    const kpk_extent *x;
    if (i >= f->sb.extent_count) { kpk_err_set(err, KPK_EINVAL, "%s: no extent %u", f->path, i); return -1; }
    x = &f->extents[i];
    if (!kpk_fits(pos, len, x->raw_len))
        return kpk_extent_fail(err, KPK_EINVAL, f, i, "decoded range %llu + %llu is outside its %llu bytes",
                               (unsigned long long)pos, (unsigned long long)len, (unsigned long long)x->raw_len);
    if (x->codec == KPK_CODEC_NONE) return kpk_extent_pread(f, i, dst, len, pos, err);
    if (x->codec == KPK_CODEC_ZSTD) {
        uint8_t *raw = malloc(x->raw_len + 1);
        int rc;
        if (!raw) return kpk_extent_fail(err, KPK_ENOMEM, f, i, "out of memory");
        rc = kpk_extent_read(f, i, raw, 0, err);
        if (!rc) memcpy(dst, raw + pos, len);
        free(raw);
        return rc;
    }
    {   /* codec 2: only the blocks overlapping [pos, pos+len) */
        const kpk_block *b = kpk_extent_blocks(f, i);
        uint32_t n = kpk_extent_block_count(f, i), lo = 0, hi = n;
        uint64_t max_raw, max_stored = max_block_stored(f, i, &max_raw);
        uint8_t *stored = malloc(max_stored + 1), *tmp = NULL;
        int rc = 0;
        if (!stored) return kpk_extent_fail(err, KPK_ENOMEM, f, i, "out of memory");
        while (lo < hi) { /* the first block ending after pos */
            uint32_t mid = lo + (hi - lo) / 2;
            if (b[mid].raw_off + b[mid].raw_len <= pos) lo = mid + 1; else hi = mid;
        }
        for (uint32_t k = lo; k < n && b[k].raw_off < pos + len && !rc; k++) {
            uint64_t a = b[k].raw_off > pos ? b[k].raw_off : pos;
            uint64_t e = b[k].raw_off + b[k].raw_len < pos + len ? b[k].raw_off + b[k].raw_len : pos + len;
            int whole = a == b[k].raw_off && e == b[k].raw_off + b[k].raw_len;
            if (!whole && !tmp && !(tmp = malloc(max_raw))) { rc = kpk_extent_fail(err, KPK_ENOMEM, f, i, "out of memory"); break; }
            rc = kpk_extent_pread(f, i, stored, b[k].stored_len, b[k].stored_off, err) ||
                 kpk_block_decode(f, i, k, stored, whole ? (uint8_t *)dst + (a - pos) : tmp, err) ? -1 : 0;
            if (!rc && !whole) memcpy((uint8_t *)dst + (a - pos), tmp + (a - b[k].raw_off), e - a);
        }
        free(stored);
        free(tmp);
        return rc;
    }
}

/* ---- verification -------------------------------------------------------------- */

/* XXH3 of n zero bytes, remembered per length: a sparse file (all-zero
 * extents left as holes) repeats a few lengths many thousand times. */
static pthread_mutex_t zero_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { uint64_t len, hash; } zero_memo[16];
static size_t zero_n;

static int zero_hash(uint64_t n, void *scratch, size_t scratch_len, uint64_t *out)
{
    XXH3_state_t *st;
    pthread_mutex_lock(&zero_mu);
    for (size_t k = 0; k < zero_n; k++)
        if (zero_memo[k].len == n) { *out = zero_memo[k].hash; pthread_mutex_unlock(&zero_mu); return 0; }
    pthread_mutex_unlock(&zero_mu);
    if (!(st = XXH3_createState())) return -1;
    XXH3_64bits_reset(st);
    memset(scratch, 0, scratch_len);
    for (uint64_t pos = 0; pos < n; pos += scratch_len)
        XXH3_64bits_update(st, scratch, n - pos < scratch_len ? (size_t)(n - pos) : scratch_len);
    *out = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    pthread_mutex_lock(&zero_mu);
    if (zero_n < sizeof zero_memo / sizeof zero_memo[0]) { zero_memo[zero_n].len = n; zero_memo[zero_n].hash = *out; zero_n++; }
    pthread_mutex_unlock(&zero_mu);
    return 0;
}

/* 1 if the extent's stored bytes and padding are holes in every member file
 * they lie in (they read as zeros without I/O). */
static int extent_is_hole(const kpk_file *f, uint32_t i)
{
    kpk_seg seg[64];
    uint64_t pos = 0, padded = kpk_round_up(f->extents[i].stored_len, f->sb.align);
    while (pos < padded) {
        uint64_t done;
        size_t n = kpk_extent_segments(f, i, pos, padded - pos, seg, 64, &done);
        if (!n) return 0;
        for (size_t s = 0; s < n; s++) {
            off_t d = lseek(f->member_fd[seg[s].member], (off_t)seg[s].off, SEEK_DATA);
            if (!((d < 0 && errno == ENXIO) || (d >= 0 && (uint64_t)d >= seg[s].off + seg[s].len))) return 0;
        }
        pos += done;
    }
    return 1;
}

/* Walks an extent's decoded bytes in increasing windows and checks that the
 * bytes outside its tensors are zero (§5, §11). */
struct gaps { const kpk_file *f; uint32_t i; uint64_t ti, tend; };

static void gaps_init(struct gaps *g, const kpk_file *f, uint32_t i)
{
    g->f = f;
    g->i = i;
    g->ti = f->extents[i].first_tensor;
    g->tend = g->ti + f->extents[i].tensor_count;
}

static int gaps_check(struct gaps *g, const uint8_t *buf, uint64_t a, uint64_t b, kpk_err *err)
{
    uint64_t pos = a;
    while (pos < b) {
        kpk_tensor t;
        uint64_t gap_end = b;
        while (g->ti < g->tend) {
            kpk_tensor_at(g->f, g->ti, &t);
            if (t.offset + t.nbytes > pos) break;
            g->ti++;
        }
        if (g->ti < g->tend) {
            if (t.offset <= pos) { pos = t.offset + t.nbytes < b ? t.offset + t.nbytes : b; continue; }
            if (t.offset < b) gap_end = t.offset;
        }
        if (!kio_is_zero(buf + (pos - a), gap_end - pos)) {
            uint64_t at = pos;
            while (buf[at - a] == 0) at++;
            return kpk_extent_fail(err, KPK_ECHECKSUM, g->f, g->i, "non-zero byte at decoded offset %llu, between tensors "
                                   "(the gaps between tensors are zero)", (unsigned long long)at);
        }
        pos = gap_end;
    }
    return 0;
}

/* The padding [stored_len, padded) of extent i, through the mapping. */
static int padding_check(const kpk_file *f, uint32_t i, uint8_t *scratch, size_t scratch_len, kpk_err *err)
{
    const kpk_extent *x = &f->extents[i];
    uint64_t padded = kpk_round_up(x->stored_len, f->sb.align);
    for (uint64_t pos = x->stored_len; pos < padded;) {
        size_t n = padded - pos < scratch_len ? (size_t)(padded - pos) : scratch_len;
        if (kpk_extent_pread(f, i, scratch, n, pos, err)) return -1;
        if (!kio_is_zero(scratch, n)) return kpk_extent_fail(err, KPK_ECHECKSUM, f, i, "non-zero padding after the extent");
        pos += n;
    }
    return 0;
}

/* A check reads each byte once: keep the page cache for what is used again. */
static void drop_cache(const kpk_file *f, uint32_t i, uint64_t pos, uint64_t len)
{
    kpk_seg seg[64];
    uint64_t done;
    size_t n = kpk_extent_segments(f, i, pos, len, seg, 64, &done);
    for (size_t s = 0; s < n; s++)
        kos_cache_drop(f->member_fd[seg[s].member], seg[s].off, seg[s].len);
}

void kpk_extent_drop_cache(const kpk_file *f, uint32_t i, uint64_t pos, uint64_t len)
{
    const kpk_extent *x;
    if (i >= f->sb.extent_count || !len) return;
    x = &f->extents[i];
    if (x->codec == KPK_CODEC_BLOCKS) { /* the stored range of the blocks that hold [pos, pos+len) */
        const kpk_block *b = kpk_extent_blocks(f, i);
        uint32_t n = kpk_extent_block_count(f, i), k = 0, j;
        while (k < n && b[k].raw_off + b[k].raw_len <= pos) k++;
        for (j = k; j < n && b[j].raw_off < pos + len; j++) {}
        if (k == j) return;
        pos = b[k].stored_off;
        len = b[j - 1].stored_off + b[j - 1].stored_len - pos;
    } else if (x->codec != KPK_CODEC_NONE) {
        return;
    }
    for (uint64_t done = 0; done < len;) { /* drop_cache maps at most 64 segments a call */
        kpk_seg seg[64];
        uint64_t d;
        size_t m = kpk_extent_segments(f, i, pos + done, len - done, seg, 64, &d);
        if (!m) break;
        for (size_t s = 0; s < m; s++)
            kos_cache_drop(f->member_fd[seg[s].member], seg[s].off, seg[s].len);
        done += d;
    }
}

/* Codec 0, or codec 2 shallow: stream the stored bytes. */
static int verify_stream(const kpk_file *f, uint32_t i, uint8_t *scratch, size_t scratch_len, int gaps, kpk_err *err)
{
    const kpk_extent *x = &f->extents[i];
    XXH3_state_t *st = XXH3_createState();
    struct gaps g;
    int rc = 0;
    if (!st) return kpk_extent_fail(err, KPK_ENOMEM, f, i, "out of memory");
    XXH3_64bits_reset(st);
    gaps_init(&g, f, i);
    for (uint64_t pos = 0; pos < x->stored_len && !rc;) {
        size_t n = x->stored_len - pos < scratch_len ? (size_t)(x->stored_len - pos) : scratch_len;
        rc = kpk_extent_pread(f, i, scratch, n, pos, err);
        if (rc) break;
        drop_cache(f, i, pos, n);
        XXH3_64bits_update(st, scratch, n);
        if (gaps) rc = gaps_check(&g, scratch, pos, pos + n, err);
        pos += n;
    }
    if (!rc && XXH3_64bits_digest(st) != x->stored_xxh3) rc = kpk_extent_fail(err, KPK_ECHECKSUM, f, i, "checksum mismatch");
    XXH3_freeState(st);
    return rc;
}

/* Codec 2, deep: every block read, hashed, decoded and checked. */
static int verify_blocks(const kpk_file *f, uint32_t i, kpk_err *err)
{
    const kpk_extent *x = &f->extents[i];
    const kpk_block *b = kpk_extent_blocks(f, i);
    uint32_t n = kpk_extent_block_count(f, i);
    uint64_t max_raw, max_stored = max_block_stored(f, i, &max_raw);
    uint8_t *stored = malloc(max_stored + 1), *raw = malloc(max_raw + 1);
    XXH3_state_t *ss = XXH3_createState(), *rs = XXH3_createState();
    struct gaps g;
    int rc = 0;
    if (!stored || !raw || !ss || !rs) { rc = kpk_extent_fail(err, KPK_ENOMEM, f, i, "out of memory"); goto out; }
    XXH3_64bits_reset(ss);
    XXH3_64bits_reset(rs);
    gaps_init(&g, f, i);
    for (uint32_t k = 0; k < n && !rc; k++) {
        rc = kpk_extent_pread(f, i, stored, b[k].stored_len, b[k].stored_off, err);
        if (rc) break;
        drop_cache(f, i, b[k].stored_off, b[k].stored_len);
        XXH3_64bits_update(ss, stored, b[k].stored_len);
        rc = kpk_block_decode(f, i, k, stored, raw, err) || gaps_check(&g, raw, b[k].raw_off, b[k].raw_off + b[k].raw_len, err);
        XXH3_64bits_update(rs, raw, b[k].raw_len);
    }
    if (!rc && XXH3_64bits_digest(ss) != x->stored_xxh3) rc = kpk_extent_fail(err, KPK_ECHECKSUM, f, i, "checksum mismatch");
    if (!rc && XXH3_64bits_digest(rs) != x->raw_xxh3) rc = kpk_extent_fail(err, KPK_ECHECKSUM, f, i, "decoded checksum mismatch");
out:
    free(stored);
    free(raw);
    XXH3_freeState(ss);
    XXH3_freeState(rs);
    return rc;
}

int kpk_extent_verify_ex(const kpk_file *f, uint32_t i, void *scratch, size_t scratch_len, int flags, kpk_err *err)
{
    const kpk_extent *x;
    int rc;
    if (i >= f->sb.extent_count) { kpk_err_set(err, KPK_EINVAL, "%s: no extent %u", f->path, i); return -1; }
    x = &f->extents[i];
    switch (x->codec) {
    case KPK_CODEC_NONE:
        /* an extent that is one hole (data and padding) reads as zeros: its
         * hash depends on its length only, and its gaps are zero */
        if (extent_is_hole(f, i)) {
            uint64_t h;
            if (zero_hash(x->stored_len, scratch, scratch_len, &h)) return kpk_extent_fail(err, KPK_ENOMEM, f, i, "out of memory");
            return h == x->stored_xxh3 ? 0 : kpk_extent_fail(err, KPK_ECHECKSUM, f, i, "checksum mismatch");
        }
        rc = verify_stream(f, i, scratch, scratch_len, 1, err);
        break;
    case KPK_CODEC_ZSTD: {
        uint8_t *raw = malloc(x->raw_len + 1);
        struct gaps g;
        if (!raw) return kpk_extent_fail(err, KPK_ENOMEM, f, i, "out of memory");
        gaps_init(&g, f, i);
        rc = kpk_extent_read(f, i, raw, 1, err) || gaps_check(&g, raw, 0, x->raw_len, err) ? -1 : 0;
        free(raw);
        break;
    }
    default:
        rc = flags & KPK_VERIFY_SHALLOW ? verify_stream(f, i, scratch, scratch_len, 0, err) : verify_blocks(f, i, err);
        break;
    }
    return rc ? rc : padding_check(f, i, scratch, scratch_len, err);
}

int kpk_extent_verify(const kpk_file *f, uint32_t i, void *scratch, size_t scratch_len, kpk_err *err)
{
    return kpk_extent_verify_ex(f, i, scratch, scratch_len, 0, err);
}

int kpk_meta_file(const kpk_file *f, const char *name, char **out, size_t *len, kpk_err *err)
{
    char full[256];
    kpk_tensor t;
    char *buf;
    snprintf(full, sizeof full, KPK_META_PREFIX "%s", name);
    *out = NULL;
    if (kpk_find_tensor(f, full, &t) < 0 || f->extents[t.extent].kind != KPK_KIND_META) {
        kpk_err_set(err, KPK_EINVAL, "%s: no embedded file %s", f->path, name);
        return -1;
    }
    buf = malloc(t.nbytes + 1);
    if (!buf) { kpk_err_set(err, KPK_ENOMEM, "%s: out of memory", f->path); return -1; }
    /* the meta extent is checked whole (it is small); its blocks as they decode */
    {
        const kpk_extent *x = &f->extents[t.extent];
        if (x->codec == KPK_CODEC_NONE) {
            uint8_t *raw = malloc(x->raw_len + 1);
            int rc = !raw ? (kpk_err_set(err, KPK_ENOMEM, "%s: out of memory", f->path), -1) : kpk_extent_read(f, t.extent, raw, 1, err);
            if (!rc) memcpy(buf, raw + t.offset, t.nbytes);
            free(raw);
            if (rc) { free(buf); return -1; }
        } else if (kpk_extent_read_raw(f, t.extent, buf, t.nbytes, t.offset, err)) {
            free(buf);
            return -1;
        }
    }
    buf[t.nbytes] = 0;
    *out = buf;
    *len = t.nbytes;
    return 0;
}
