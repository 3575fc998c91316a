#include "journal.h"

#include "format/kio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define KJ_MAGIC "KPKJRNL2"
#define KJ_REC_MAGIC 0x4A45504Bu /* "KPEJ" */

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

static uint64_t record_size(uint32_t n_blocks) { return KJ_RECORD_FIXED + (uint64_t)n_blocks * KPK_BLOCK_RECORD_SIZE + 8; }

int kj_create(kjournal *j, const char *path, uint64_t plan_id, uint32_t n_extents, uint16_t n_members)
{
    uint8_t h[KJ_HEADER_SIZE] = {0};
    j->fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (j->fd < 0) return -1;
    j->plan_id = plan_id;
    j->n_records = 0;
    j->end = KJ_HEADER_SIZE;
    memcpy(h, KJ_MAGIC, 8);
    put64(h + 8, plan_id);
    put32(h + 16, n_extents);
    put16(h + 20, n_members);
    put64(h + 56, XXH3_64bits(h, 56));
    if (kio_pwrite_full(j->fd, h, sizeof h, 0) || fdatasync(j->fd)) { int e = errno; close(j->fd); j->fd = -1; errno = e; return -1; }
    return 0;
}

void kj_free_records(kj_record *recs, uint64_t n)
{
    if (!recs) return;
    for (uint64_t i = 0; i < n; i++) free(recs[i].blocks);
    free(recs);
}

int kj_open(kjournal *j, const char *path, uint64_t plan_id, kj_record **recs, uint64_t *n)
{
    uint8_t h[KJ_HEADER_SIZE], *buf = NULL;
    int64_t size;
    uint64_t at, cap = 0;
    *recs = NULL;
    *n = 0;
    j->fd = open(path, O_RDWR | O_CLOEXEC);
    if (j->fd < 0) return errno == ENOENT ? 1 : -1;
    size = kio_file_size(j->fd);
    if (size < 0) goto ioerr;
    if (size < (int64_t)KJ_HEADER_SIZE) goto other;
    if (kio_pread_full(j->fd, h, sizeof h, 0)) goto ioerr;
    if (memcmp(h, KJ_MAGIC, 8) || get64(h + 56) != XXH3_64bits(h, 56) || get64(h + 8) != plan_id) goto other;
    buf = malloc((size_t)size - KJ_HEADER_SIZE + 1);
    if (!buf) { errno = ENOMEM; goto ioerr; }
    if (size > (int64_t)KJ_HEADER_SIZE && kio_pread_full(j->fd, buf, (size_t)size - KJ_HEADER_SIZE, KJ_HEADER_SIZE)) goto ioerr;
    /* the valid prefix: right magic, own checksum, consecutive extent numbers */
    for (at = 0;;) {
        const uint8_t *r = buf + at;
        uint64_t left = (uint64_t)size - KJ_HEADER_SIZE - at, len;
        kj_record *rec;
        if (left < record_size(0) || get32(r) != KJ_REC_MAGIC || get32(r + 4) != *n) break;
        len = record_size(get32(r + 12));
        if (get32(r + 12) > KPK_MAX_BLOCKS || len > left || get64(r + len - 8) != XXH3_64bits(r, len - 8)) break;
        if (*n == cap) {
            kj_record *g = realloc(*recs, sizeof *g * (cap = cap ? cap * 2 : 256));
            if (!g) { errno = ENOMEM; goto ioerr; }
            *recs = g;
        }
        rec = &(*recs)[*n];
        rec->extent = get32(r + 4);
        rec->member = get16(r + 8);
        rec->n_blocks = get32(r + 12);
        rec->offset = get64(r + 16);
        rec->stored_len = get64(r + 24);
        rec->stored_xxh3 = get64(r + 32);
        rec->raw_xxh3 = get64(r + 40);
        rec->blocks = NULL;
        (*n)++;
        if (rec->n_blocks) {
            rec->blocks = malloc(sizeof *rec->blocks * rec->n_blocks);
            if (!rec->blocks) { errno = ENOMEM; goto ioerr; }
            for (uint32_t b = 0; b < rec->n_blocks; b++)
                kpk_block_decode_record(r + KJ_RECORD_FIXED + (uint64_t)b * KPK_BLOCK_RECORD_SIZE, &rec->blocks[b]);
        }
        at += len;
    }
    free(buf);
    j->plan_id = plan_id;
    j->n_records = *n;
    j->end = KJ_HEADER_SIZE + at;
    return 0;
ioerr: {
        int e = errno;
        free(buf);
        kj_free_records(*recs, *n);
        *recs = NULL;
        *n = 0;
        close(j->fd);
        j->fd = -1;
        errno = e;
        return -1;
    }
other:
    close(j->fd);
    j->fd = -1;
    return 1;
}

int kj_truncate(kjournal *j, const kj_record *recs, uint64_t n)
{
    uint64_t end = KJ_HEADER_SIZE;
    for (uint64_t i = 0; i < n; i++) end += record_size(recs[i].n_blocks);
    if (ftruncate(j->fd, (off_t)end) || fdatasync(j->fd)) return -1;
    j->n_records = n;
    j->end = end;
    return 0;
}

int kj_append(kjournal *j, const kj_record *recs, uint64_t n)
{
    uint64_t len = 0, at = 0;
    uint8_t *buf;
    if (!n) return 0;
    for (uint64_t i = 0; i < n; i++) len += record_size(recs[i].n_blocks);
    buf = calloc(1, len);
    if (!buf) { errno = ENOMEM; return -1; }
    for (uint64_t i = 0; i < n; i++) {
        uint8_t *r = buf + at;
        uint64_t rl = record_size(recs[i].n_blocks);
        put32(r, KJ_REC_MAGIC);
        put32(r + 4, recs[i].extent);
        put16(r + 8, recs[i].member);
        put32(r + 12, recs[i].n_blocks);
        put64(r + 16, recs[i].offset);
        put64(r + 24, recs[i].stored_len);
        put64(r + 32, recs[i].stored_xxh3);
        put64(r + 40, recs[i].raw_xxh3);
        for (uint32_t b = 0; b < recs[i].n_blocks; b++)
            kpk_block_encode(&recs[i].blocks[b], r + KJ_RECORD_FIXED + (uint64_t)b * KPK_BLOCK_RECORD_SIZE);
        put64(r + rl - 8, XXH3_64bits(r, rl - 8));
        at += rl;
    }
    if (kio_pwrite_full(j->fd, buf, len, j->end) || fdatasync(j->fd)) {
        int e = errno;
        free(buf);
        errno = e;
        return -1;
    }
    free(buf);
    j->n_records += n;
    j->end += len;
    return 0;
}

void kj_close(kjournal *j)
{
    if (j->fd >= 0) close(j->fd);
    j->fd = -1;
}
