/* The consume log (consume_log.h; docs/FORMAT.md §14.1). */
#include "consume_log.h"

#include "format/kio.h"
#include "format/kos.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define KC_MAGIC "KPKCONS1"
#define KC_REC_MAGIC 0x5243504Bu     /* "KPCR" */
#define KC_HEAD_FIXED 24u            /* magic, plan_id, command length, reserved */
#define KC_REC_FIXED 192u
#define KC_MAX_COMMAND (1u << 20)
#define KC_MAX_NAME 4096u
#define KC_MAX_PIECES (1u << 24)
#define KC_READ ((size_t)1 << 20)

static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

static void record_free(kc_record *r)
{
    free(r->name);
    free(r->blob);
    free(r->pieces);
    memset(r, 0, sizeof *r);
}

void kc_log_close(kc_log *log)
{
    if (log->fd >= 0) close(log->fd);
    for (size_t i = 0; i < log->n; i++) record_free(&log->recs[i]);
    free(log->recs);
    free(log->path);
    free(log->command);
    memset(log, 0, sizeof *log);
    log->fd = -1;
}

/* A fixed-size text field: the string, NUL-padded (a longer one is cut). */
static void put_text(uint8_t *p, size_t n, const char *s)
{
    size_t l = strlen(s);
    memset(p, 0, n);
    memcpy(p, s, l < n ? l : n);
}

static void get_text(char *dst, size_t dstlen, const uint8_t *p, size_t n)
{
    size_t l = 0;
    while (l < n && l + 1 < dstlen && p[l]) l++;
    memcpy(dst, p, l);
    dst[l] = 0;
}

/* XXH3 of bytes [off, off + len) of fd, read in pieces. */
static int hash_range(int fd, uint64_t off, uint64_t len, uint64_t *h)
{
    XXH3_state_t *st = XXH3_createState();
    uint8_t *buf = malloc(KC_READ);
    int rc = -1;
    if (!st || !buf) { errno = ENOMEM; goto out; }
    XXH3_64bits_reset(st);
    for (uint64_t at = 0; at < len;) {
        size_t n = len - at < KC_READ ? (size_t)(len - at) : KC_READ;
        if (kio_pread_full(fd, buf, n, off + at)) goto out;
        XXH3_64bits_update(st, buf, n);
        at += n;
    }
    *h = XXH3_64bits_digest(st);
    rc = 0;
out:
    free(buf);
    XXH3_freeState(st);
    return rc;
}

/* The record at off, if it is whole and intact: 1 (r filled), 0 (not: the
 * valid prefix ends here), -1 (I/O error). */
static int read_record(int fd, uint64_t off, uint64_t size, kc_record *r)
{
    uint8_t f[KC_REC_FIXED], sum[8], *var = NULL;
    uint64_t len, var_len, h, data;
    uint32_t np, nl, bl;
    memset(r, 0, sizeof *r);
    if (size - off < KC_REC_FIXED + 8) return 0;
    if (kio_pread_full(fd, f, sizeof f, off)) return -1;
    np = get32(f + 4);
    len = get64(f + 8);
    nl = get32(f + 184);
    bl = get32(f + 188);
    var_len = (uint64_t)nl + bl + (uint64_t)np * 16;
    if (get32(f) != KC_REC_MAGIC || np == 0 || np > KC_MAX_PIECES || nl == 0 || nl > KC_MAX_NAME || bl > KC_MAX_NAME ||
        len < KC_REC_FIXED + var_len + 8 || len > size - off)
        return 0;
    if (hash_range(fd, off, len - 8, &h) || kio_pread_full(fd, sum, 8, off + len - 8)) return -1;
    if (get64(sum) != h) return 0;
    if (!(var = malloc(var_len)) || !(r->name = malloc(nl + 1u)) || (bl && !(r->blob = malloc(bl + 1u))) ||
        !(r->pieces = calloc(np, sizeof *r->pieces))) {
        free(var);
        record_free(r);
        errno = ENOMEM;
        return -1;
    }
    if (kio_pread_full(fd, var, var_len, off + KC_REC_FIXED)) { free(var); record_free(r); return -1; }
    memcpy(r->name, var, nl);
    r->name[nl] = 0;
    if (bl) {
        memcpy(r->blob, var + nl, bl);
        r->blob[bl] = 0;
    }
    r->size = get64(f + 16);
    r->alloc_bytes = get64(f + 24);
    r->mtime_ns = (int64_t)get64(f + 32);
    get_text(r->expect_sha, sizeof r->expect_sha, f + 40, 64);
    get_text(r->got_sha, sizeof r->got_sha, f + 104, 64);
    get_text(r->sha_from, sizeof r->sha_from, f + 168, 16);
    r->n_pieces = np;
    data = off + KC_REC_FIXED + var_len;
    for (uint32_t i = 0; i < np; i++) {
        r->pieces[i].src_off = get64(var + nl + bl + 16 * i);
        r->pieces[i].len = get64(var + nl + bl + 16 * i + 8);
        r->pieces[i].at = data;
        if (r->pieces[i].len > off + len - 8 - data) { free(var); record_free(r); return 0; }
        data += r->pieces[i].len;
    }
    free(var);
    if (data != off + len - 8 || memchr(r->name, 0, nl) || (bl && memchr(r->blob, 0, bl))) { record_free(r); return 0; }
    r->end = off + len;
    return 1;
}

int kc_log_open(kc_log *log, const char *path, char *err, size_t errlen)
{
    uint8_t h[KC_HEAD_FIXED], sum[8];
    int64_t size;
    uint64_t at, hs;
    uint32_t cl;
    size_t cap = 0;
    memset(log, 0, sizeof *log);
    log->fd = open(path, O_RDWR | O_CLOEXEC);
    if (log->fd < 0 && (errno == EACCES || errno == EROFS || errno == EPERM)) log->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (log->fd < 0) {
        if (errno == ENOENT) return 1;
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    if (!(log->path = strdup(path))) goto nomem;
    if ((size = kio_file_size(log->fd)) < 0) goto ioerr;
    if ((uint64_t)size < KC_HEAD_FIXED + 8) goto torn;
    if (kio_pread_full(log->fd, h, sizeof h, 0)) goto ioerr;
    if (memcmp(h, KC_MAGIC, 8) != 0) {
        snprintf(err, errlen, "%s is not a kpack consume log (it does not begin with %s); move it away", path, KC_MAGIC);
        kc_log_close(log);
        return -1;
    }
    cl = get32(h + 16);
    if (cl > KC_MAX_COMMAND || (uint64_t)size < KC_HEAD_FIXED + (uint64_t)cl + 8) goto torn;
    if (hash_range(log->fd, 0, KC_HEAD_FIXED + cl, &hs) || kio_pread_full(log->fd, sum, 8, KC_HEAD_FIXED + cl)) goto ioerr;
    if (get64(sum) != hs) goto torn;
    if (!(log->command = malloc(cl + 1u))) goto nomem;
    if (kio_pread_full(log->fd, log->command, cl, KC_HEAD_FIXED)) goto ioerr;
    log->command[cl] = 0;
    log->plan_id = get64(h + 8);
    for (at = KC_HEAD_FIXED + cl + 8;;) {
        kc_record r;
        int got = read_record(log->fd, at, (uint64_t)size, &r);
        if (got < 0) goto ioerr;
        if (!got) break;
        if (log->n == cap) {
            kc_record *g = realloc(log->recs, sizeof *g * (cap = cap ? 2 * cap : 64));
            if (!g) { record_free(&r); goto nomem; }
            log->recs = g;
        }
        log->recs[log->n++] = r;
        at = r.end;
    }
    /* a torn last record (its shard was not deleted: the record comes
     * first) is cut off by the run that appends (kc_log_trim) */
    log->end = at;
    return 0;
torn:
    /* the header never became whole: nothing was deleted under it */
    kc_log_close(log);
    return 1;
nomem:
    errno = ENOMEM;
ioerr:
    snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
    kc_log_close(log);
    return -1;
}

int kc_log_create(kc_log *log, const char *path, uint64_t plan_id, const char *command, char *err, size_t errlen)
{
    size_t cl = strlen(command) < KC_MAX_COMMAND ? strlen(command) : KC_MAX_COMMAND;
    uint8_t *h = calloc(1, KC_HEAD_FIXED + cl + 8);
    memset(log, 0, sizeof *log);
    log->fd = -1;
    if (!h || !(log->path = strdup(path)) || !(log->command = strndup(command, cl))) {
        free(h);
        kc_log_close(log);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memcpy(h, KC_MAGIC, 8);
    put64(h + 8, plan_id);
    put32(h + 16, (uint32_t)cl);
    memcpy(h + KC_HEAD_FIXED, command, cl);
    put64(h + KC_HEAD_FIXED + cl, XXH3_64bits(h, KC_HEAD_FIXED + cl));
    log->fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log->fd < 0 || kio_pwrite_full(log->fd, h, KC_HEAD_FIXED + cl + 8, 0) || fdatasync(log->fd)) {
        snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
        free(h);
        kc_log_close(log);
        return -1;
    }
    free(h);
    log->plan_id = plan_id;
    log->end = KC_HEAD_FIXED + cl + 8;
    return 0;
}

int kc_log_append(kc_log *log, const kc_record *rec, const uint8_t *data, char *err, size_t errlen)
{
    size_t nl = strlen(rec->name), bl = rec->blob ? strlen(rec->blob) : 0;
    uint64_t var_len = nl + bl + (uint64_t)rec->n_pieces * 16, bytes = 0, len;
    uint8_t *buf = NULL;
    kc_record copy = {0};
    kc_record *g = realloc(log->recs, sizeof *g * (log->n + 1));
    int got;
    if (g) log->recs = g;
    for (uint32_t i = 0; i < rec->n_pieces; i++) bytes += rec->pieces[i].len;
    len = KC_REC_FIXED + var_len + bytes + 8;
    if (!g || !(buf = calloc(1, len))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    put32(buf, KC_REC_MAGIC);
    put32(buf + 4, rec->n_pieces);
    put64(buf + 8, len);
    put64(buf + 16, rec->size);
    put64(buf + 24, rec->alloc_bytes);
    put64(buf + 32, (uint64_t)rec->mtime_ns);
    put_text(buf + 40, 64, rec->expect_sha);
    put_text(buf + 104, 64, rec->got_sha);
    put_text(buf + 168, 16, rec->sha_from);
    put32(buf + 184, (uint32_t)nl);
    put32(buf + 188, (uint32_t)bl);
    memcpy(buf + KC_REC_FIXED, rec->name, nl);
    if (bl) memcpy(buf + KC_REC_FIXED + nl, rec->blob, bl);
    for (uint32_t i = 0; i < rec->n_pieces; i++) {
        put64(buf + KC_REC_FIXED + nl + bl + 16 * i, rec->pieces[i].src_off);
        put64(buf + KC_REC_FIXED + nl + bl + 16 * i + 8, rec->pieces[i].len);
    }
    if (bytes) memcpy(buf + KC_REC_FIXED + var_len, data, bytes);
    put64(buf + len - 8, XXH3_64bits(buf, len - 8));
    if (kio_pwrite_full(log->fd, buf, len, log->end) || fdatasync(log->fd)) {
        snprintf(err, errlen, "writing %s: %s", log->path, strerror(errno));
        free(buf);
        return -1;
    }
    free(buf);
    /* read back what the device holds, not what the page cache remembers */
    kos_cache_drop(log->fd, log->end, len);
    errno = 0;
    if ((got = read_record(log->fd, log->end, log->end + len, &copy)) != 1) {
        snprintf(err, errlen, "%s: the record of %s does not read back %s%s", log->path, rec->name,
                 got ? "" : "intact (the device returned other bytes than were written)", got ? strerror(errno) : "");
        record_free(&copy);
        return -1;
    }
    log->recs[log->n++] = copy;
    log->end += len;
    return 0;
}

int kc_log_trim(kc_log *log, char *err, size_t errlen)
{
    int64_t size = kio_file_size(log->fd);
    if (size >= 0 && (uint64_t)size == log->end) return 0;
    if (size < 0 || ftruncate(log->fd, (off_t)log->end) || fdatasync(log->fd)) {
        snprintf(err, errlen, "cannot cut the torn end off %s: %s", log->path, strerror(errno));
        return -1;
    }
    return 0;
}

const kc_record *kc_log_find(const kc_log *log, const char *name)
{
    for (size_t i = log->n; i-- > 0;)
        if (strcmp(log->recs[i].name, name) == 0) return &log->recs[i];
    return NULL;
}

int kc_log_read(const kc_log *log, const kc_piece *pc, uint64_t off, void *dst, uint64_t len)
{
    if (off > pc->len || len > pc->len - off) { errno = EINVAL; return -1; }
    return kio_pread_full(log->fd, dst, len, pc->at + off);
}
