/* safetensors exactly as released (spec §1.2/§1.3): [u64 LE N][N bytes of compact
 * JSON, entry keys dtype/shape/data_offsets, no __metadata__, space-padded to a
 * multiple of 8][data: F32 tensors, then BF16, then U8, by name within a dtype,
 * no gaps].  The data is streamed: worker threads each fill a chunk of rows
 * (<= 4 MiB) and pwrite it at its final offset, so memory stays at a few chunks
 * whatever the shard size. */
#include "synth.h"
#include "format/errbuf.h"

#include "format/kio.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define UNIT_BYTES (4u << 20)

/* ---- growable text buffer ------------------------------------------------ */

typedef struct { char *p; size_t len, cap; int oom; } sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_u64(sbuf *b, uint64_t v)
{
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    sb_put(b, tmp, (size_t)n);
}
/* A JSON string as Python's json.dumps writes it (ensure_ascii). */
static void sb_jstr(sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\') {
            esc[0] = '\\'; esc[1] = (char)*p;
            sb_put(b, esc, 2);
        } else if (*p < 0x20 || *p >= 0x7F) {
            snprintf(esc, sizeof esc, "\\u%04x", *p);
            sb_put(b, esc, 6);
        } else {
            sb_put(b, (const char *)p, 1);
        }
    }
    sb_put(b, "\"", 1);
}

/* ---- layout and header --------------------------------------------------- */

static int dtype_rank(int dt)
{
    switch (dt) {
    case KPK_DT_F32: return 0;
    case KPK_DT_BF16: return 1;
    case KPK_DT_F16: return 2;
    case KPK_DT_U8: return 3;
    default: return 4;
    }
}

static int cmp_tensor(const void *a, const void *b)
{
    const synth_tensor *x = a, *y = b;
    int rx = dtype_rank(x->dtype), ry = dtype_rank(y->dtype);
    if (rx != ry) return rx - ry;
    return strcmp(x->name, y->name);
}

uint64_t synth_layout(synth_tensor *t, size_t n)
{
    uint64_t off = 0;
    qsort(t, n, sizeof *t, cmp_tensor);
    for (size_t i = 0; i < n; i++) {
        t[i].off = off;
        off += t[i].nbytes;
    }
    return off;
}

int synth_header(const synth_tensor *t, size_t n, char **json, size_t *len) { return synth_header_meta(t, n, NULL, json, len); }

int synth_header_meta(const synth_tensor *t, size_t n, const char *metadata, char **json, size_t *len)
{
    sbuf b = {0};
    sb_put(&b, "{", 1);
    if (metadata) {
        sb_str(&b, "\"__metadata__\":");
        sb_str(&b, metadata);
    }
    for (size_t i = 0; i < n; i++) {
        if (i || metadata) sb_put(&b, ",", 1);
        sb_jstr(&b, t[i].name);
        sb_str(&b, ":{\"dtype\":");
        sb_jstr(&b, kpk_dtype_name(t[i].dtype));
        sb_str(&b, ",\"shape\":[");
        for (int d = 0; d < t[i].ndim; d++) {
            if (d) sb_put(&b, ",", 1);
            sb_u64(&b, t[i].shape[d]);
        }
        sb_str(&b, "],\"data_offsets\":[");
        sb_u64(&b, t[i].off);
        sb_put(&b, ",", 1);
        sb_u64(&b, t[i].off + t[i].nbytes);
        sb_str(&b, "]}");
    }
    sb_put(&b, "}", 1);
    while (!b.oom && b.len % 8) sb_put(&b, " ", 1);
    if (b.oom) { free(b.p); errno = ENOMEM; return -1; }
    *json = b.p;
    *len = b.len;
    return 0;
}

/* ---- streaming data writer ----------------------------------------------- */

typedef struct { size_t tensor; uint64_t row0, nrows; } unit;

typedef struct {
    synth_writer *w;
    int fd;
    uint64_t base;          /* 8 + N */
    const synth_tensor *t;
    const unit *u;
    size_t nu;
    size_t buf_bytes;
    const char *path;
    atomic_size_t next;
    atomic_int failed;
    atomic_uint_fast64_t done;
    int err_no;             /* first failure, written once under failed */
    double last_progress;
} job;

static void progress(job *j, int final)
{
    synth_writer *w = j->w;
    double now = synth_now();
    if (!w->progress || (!final && now - j->last_progress < 0.25)) return;
    j->last_progress = now;
    {
        uint64_t done = w->bytes_written + atomic_load(&j->done);
        double el = now - w->t_start;
        const char *slash = strrchr(j->path, '/');
        fprintf(stderr, "\rk3synth: %-36s %8.2f / %.2f GB  %6.0f MB/s ", slash ? slash + 1 : j->path,
                (double)done / 1e9, (double)w->grand_total / 1e9, el > 0 ? (double)done / el / 1e6 : 0.0);
        fflush(stderr);
    }
}

/* Take units until none is left (or another thread failed); report progress if asked. */
static void run_units(job *j, int report)
{
    uint8_t *buf = malloc(j->buf_bytes ? j->buf_bytes : 1);
    if (!buf) {
        if (atomic_exchange(&j->failed, 1) == 0) j->err_no = ENOMEM;
        return;
    }
    for (;;) {
        size_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->nu || atomic_load(&j->failed)) break;
        const unit *u = &j->u[i];
        const synth_tensor *t = &j->t[u->tensor];
        uint64_t rb = synth_row_bytes(t), len = rb * u->nrows;
        synth_fill_rows(j->w->cfg, j->w->seed, &j->w->draw, t, u->row0, u->nrows, buf);
        if (kio_pwrite_full(j->fd, buf, (size_t)len, j->base + t->off + u->row0 * rb) != 0) {
            int e = errno;
            if (atomic_exchange(&j->failed, 1) == 0) j->err_no = e;
            break;
        }
        atomic_fetch_add(&j->done, len);
        if (report) progress(j, 0);
    }
    free(buf);
}

static void *worker(void *arg)
{
    run_units(arg, 0);
    return NULL;
}

/* Split every tensor into units of whole rows of at most UNIT_BYTES (a row is never split). */
static int make_units(const synth_tensor *t, size_t n, unit **out, size_t *nout, size_t *max_bytes)
{
    size_t cap = 0, k = 0;
    unit *u = NULL;
    *max_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t rows = synth_rows(t + i), rb = synth_row_bytes(t + i);
        uint64_t per = rb ? (UNIT_BYTES / rb ? UNIT_BYTES / rb : 1) : rows;
        if (rb * rows != t[i].nbytes) { errno = EINVAL; free(u); return -1; }
        for (uint64_t r = 0; r < rows; r += per) {
            if (k == cap) {
                size_t nc = cap ? cap * 2 : 256;
                unit *nu = realloc(u, nc * sizeof *nu);
                if (!nu) { free(u); errno = ENOMEM; return -1; }
                u = nu;
                cap = nc;
            }
            u[k].tensor = i;
            u[k].row0 = r;
            u[k].nrows = rows - r < per ? rows - r : per;
            if (u[k].nrows * rb > *max_bytes) *max_bytes = (size_t)(u[k].nrows * rb);
            k++;
        }
    }
    *out = u;
    *nout = k;
    return 0;
}

int synth_write_safetensors(synth_writer *w, const char *path, synth_tensor *t, size_t n, uint64_t data_size,
                            char *err, size_t errlen)
{
    char *hdr = NULL;
    size_t hlen = 0;
    uint8_t lenbuf[8];
    int fd = -1, rc = -1;
    unit *units = NULL;
    size_t nunits = 0, maxb = 0;
    uint64_t total;

    if (synth_header_meta(t, n, w->metadata, &hdr, &hlen) != 0) {
        errbuf_set(err, errlen, "%s: cannot build the header: %s", path, strerror(errno));
        return -1;
    }
    total = 8 + (uint64_t)hlen + data_size;
    for (int i = 0; i < 8; i++) lenbuf[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        errbuf_set(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        goto out;
    }
    if (kio_pwrite_full(fd, lenbuf, 8, 0) != 0 || kio_pwrite_full(fd, hdr, hlen, 8) != 0) {
        errbuf_set(err, errlen, "%s: write failed: %s", path, strerror(errno));
        goto out;
    }
    if (!w->virt && n) {
        job j;
        pthread_t th[64];
        int nth = w->threads < 1 ? 1 : (w->threads > 64 ? 64 : w->threads), started = 0;
        if (make_units(t, n, &units, &nunits, &maxb) != 0) {
            errbuf_set(err, errlen, "%s: cannot plan the data: %s", path, strerror(errno));
            goto out;
        }
        memset(&j, 0, sizeof j);
        j.w = w;
        j.fd = fd;
        j.base = 8 + (uint64_t)hlen;
        j.t = t;
        j.u = units;
        j.nu = nunits;
        j.buf_bytes = maxb;
        j.path = path;
        atomic_init(&j.next, 0);
        atomic_init(&j.failed, 0);
        atomic_init(&j.done, 0);
        if ((size_t)nth > nunits) nth = (int)nunits;
        for (int i = 1; i < nth; i++) {
            if (pthread_create(&th[started], NULL, worker, &j) != 0) break; /* fewer threads is fine */
            started++;
        }
        /* the calling thread works too, and reports progress between units */
        run_units(&j, w->progress);
        for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
        if (atomic_load(&j.failed)) {
            errbuf_set(err, errlen, "%s: write failed: %s", path, strerror(j.err_no));
            goto out;
        }
        progress(&j, 1);
    }
    /* exact size (and, with --virtual, the hole that stands for the data) */
    if (ftruncate(fd, (off_t)total) != 0) {
        errbuf_set(err, errlen, "%s: cannot set the size: %s", path, strerror(errno));
        goto out;
    }
    if (kio_file_size(fd) != (int64_t)total) {
        errbuf_set(err, errlen, "%s: size is not %llu bytes after writing", path, (unsigned long long)total);
        goto out;
    }
    rc = 0;
out:
    if (fd >= 0 && close(fd) != 0 && rc == 0) {
        errbuf_set(err, errlen, "%s: close failed: %s", path, strerror(errno));
        rc = -1;
    }
    if (rc == 0) {
        w->bytes_written += w->virt ? 8 + hlen : total;
        w->apparent_bytes += total;
        w->files_written++;
        w->tensors_written += n;
    }
    free(units);
    free(hdr);
    return rc;
}

/* ---- index ---------------------------------------------------------------- */

int synth_index_add(synth_index *ix, const char *name, uint16_t shard)
{
    size_t l = strlen(name) + 1;
    if (ix->arena_len + l > ix->arena_cap) {
        size_t cap = ix->arena_cap ? ix->arena_cap : 1 << 16;
        while (cap < ix->arena_len + l) cap *= 2;
        char *p = realloc(ix->arena, cap);
        if (!p) return -1;
        ix->arena = p;
        ix->arena_cap = cap;
    }
    if (ix->n == ix->cap) {
        size_t cap = ix->cap ? ix->cap * 2 : 1024;
        size_t *no = realloc(ix->name_off, cap * sizeof *no);
        if (!no) return -1;
        ix->name_off = no;
        uint16_t *sh = realloc(ix->shard, cap * sizeof *sh);
        if (!sh) return -1;
        ix->shard = sh;
        ix->cap = cap;
    }
    memcpy(ix->arena + ix->arena_len, name, l);
    ix->name_off[ix->n] = ix->arena_len;
    ix->shard[ix->n] = shard;
    ix->arena_len += l;
    ix->n++;
    return 0;
}

typedef struct { const char *name; uint16_t shard; } ix_entry;

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const ix_entry *)a)->name, ((const ix_entry *)b)->name);
}

int synth_index_write(synth_index *ix, const char *path, char *err, size_t errlen)
{
    ix_entry *e = malloc((ix->n ? ix->n : 1) * sizeof *e);
    sbuf b = {0};
    int rc;
    if (!e) {
        errbuf_set(err, errlen, "%s: out of memory", path);
        return -1;
    }
    for (size_t i = 0; i < ix->n; i++) {
        e[i].name = ix->arena + ix->name_off[i];
        e[i].shard = ix->shard[i];
    }
    qsort(e, ix->n, sizeof *e, cmp_entry);
    sb_str(&b, "{\n  \"metadata\": {\n    \"total_size\": ");
    sb_u64(&b, ix->total_size);
    sb_str(&b, "\n  },\n  \"weight_map\": {");
    for (size_t i = 0; i < ix->n; i++) {
        sb_str(&b, i ? ",\n    " : "\n    ");
        sb_jstr(&b, e[i].name);
        sb_str(&b, ": ");
        sb_jstr(&b, ix->shard_names[e[i].shard]);
    }
    sb_str(&b, ix->n ? "\n  }\n}\n" : "}\n}\n");
    free(e);
    if (b.oom) {
        free(b.p);
        errbuf_set(err, errlen, "%s: out of memory", path);
        return -1;
    }
    rc = synth_write_file(path, b.p, b.len, err, errlen);
    free(b.p);
    return rc;
}

void synth_index_free(synth_index *ix)
{
    free(ix->arena);
    free(ix->name_off);
    free(ix->shard);
    if (ix->shard_names)
        for (size_t i = 0; i < ix->n_shards; i++) free(ix->shard_names[i]);
    free(ix->shard_names);
    memset(ix, 0, sizeof *ix);
}

int synth_write_file(const char *path, const void *buf, size_t len, char *err, size_t errlen)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        errbuf_set(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        return -1;
    }
    if (kio_pwrite_full(fd, buf, len, 0) != 0) {
        errbuf_set(err, errlen, "%s: write failed: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (close(fd) != 0) {
        errbuf_set(err, errlen, "%s: close failed: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}
