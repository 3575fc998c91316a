#include "journal.h"

#include "kio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define KJ_MAGIC "KPKJRNL1"
#define KJ_REC_MAGIC 0x4A45504Bu /* "KPEJ" */

static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

int kj_create(kjournal *j, const char *path, uint64_t plan_id, uint32_t n_extents, uint64_t file_size)
{
    uint8_t h[KJ_HEADER_SIZE] = {0};
    j->fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (j->fd < 0) return -1;
    j->plan_id = plan_id;
    j->n_records = 0;
    memcpy(h, KJ_MAGIC, 8);
    put64(h + 8, plan_id);
    put32(h + 16, n_extents);
    put64(h + 24, file_size);
    put64(h + 56, XXH3_64bits(h, 56));
    if (kio_pwrite_full(j->fd, h, sizeof h, 0) || fdatasync(j->fd)) { int e = errno; close(j->fd); j->fd = -1; errno = e; return -1; }
    return 0;
}

int kj_open(kjournal *j, const char *path, uint64_t plan_id, kj_record **recs, uint64_t *n)
{
    uint8_t h[KJ_HEADER_SIZE];
    int64_t size;
    uint8_t *buf = NULL;
    uint64_t cap, i;
    *recs = NULL;
    *n = 0;
    j->fd = open(path, O_RDWR | O_CLOEXEC);
    if (j->fd < 0) return errno == ENOENT ? 1 : -1;
    size = kio_file_size(j->fd);
    if (size < 0) goto ioerr;
    if (size < (int64_t)KJ_HEADER_SIZE) goto other;
    /* an I/O error is not "another plan": the caller must not start over on it */
    if (kio_pread_full(j->fd, h, sizeof h, 0)) goto ioerr;
    if (memcmp(h, KJ_MAGIC, 8) || get64(h + 56) != XXH3_64bits(h, 56) || get64(h + 8) != plan_id) goto other;
    cap = ((uint64_t)size - KJ_HEADER_SIZE) / KJ_RECORD_SIZE;
    buf = malloc(cap * KJ_RECORD_SIZE + 1);
    *recs = malloc(sizeof **recs * (cap + 1));
    if (!buf || !*recs) { free(buf); free(*recs); *recs = NULL; close(j->fd); j->fd = -1; errno = ENOMEM; return -1; }
    if (cap && kio_pread_full(j->fd, buf, cap * KJ_RECORD_SIZE, KJ_HEADER_SIZE)) goto ioerr;
    for (i = 0; i < cap; i++) {
        const uint8_t *r = buf + i * KJ_RECORD_SIZE;
        /* the valid prefix: right magic, own checksum, consecutive extent numbers */
        if (get32(r) != KJ_REC_MAGIC || get64(r + 24) != XXH3_64bits(r, 24) || get32(r + 4) != i) break;
        (*recs)[i].extent = get32(r + 4);
        (*recs)[i].stored_xxh3 = get64(r + 8);
        (*recs)[i].stored_len = get64(r + 16);
    }
    free(buf);
    j->plan_id = plan_id;
    j->n_records = *n = i;
    return 0;
other:
    free(buf);
    free(*recs);
    *recs = NULL;
    close(j->fd);
    j->fd = -1;
    return 1;
ioerr:
    {
        int e = errno;
        free(buf);
        free(*recs);
        *recs = NULL;
        close(j->fd);
        j->fd = -1;
        errno = e;
        return -1;
    }
}

int kj_truncate(kjournal *j, uint64_t n)
{
    if (ftruncate(j->fd, (off_t)(KJ_HEADER_SIZE + n * KJ_RECORD_SIZE)) || fdatasync(j->fd)) return -1;
    j->n_records = n;
    return 0;
}

int kj_append(kjournal *j, const kj_record *recs, uint64_t n)
{
    uint8_t *buf;
    if (!n) return 0;
    buf = calloc(n, KJ_RECORD_SIZE);
    if (!buf) { errno = ENOMEM; return -1; }
    for (uint64_t i = 0; i < n; i++) {
        uint8_t *r = buf + i * KJ_RECORD_SIZE;
        put32(r, KJ_REC_MAGIC);
        put32(r + 4, recs[i].extent);
        put64(r + 8, recs[i].stored_xxh3);
        put64(r + 16, recs[i].stored_len);
        put64(r + 24, XXH3_64bits(r, 24));
    }
    if (kio_pwrite_full(j->fd, buf, n * KJ_RECORD_SIZE, KJ_HEADER_SIZE + j->n_records * KJ_RECORD_SIZE) || fdatasync(j->fd)) {
        int e = errno;
        free(buf);
        errno = e;
        return -1;
    }
    free(buf);
    j->n_records += n;
    return 0;
}

void kj_close(kjournal *j)
{
    if (j->fd >= 0) close(j->fd);
    j->fd = -1;
}
