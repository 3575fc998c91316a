/* Indexing and checking a checkpoint directory (kpack check-source). */
#include "source.h"

#include "format/kio.h"
#include "format/kos.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SMALL_FILE_MAX ((size_t)64 << 20)
/* The released index is ~60 MB of JSON (497,220 names); it is parsed as a
 * stream, so only the parsed tree is in memory, and freed before the headers
 * are read. */
#define INDEX_MAX ((int64_t)1 << 30)
#define INDEX_READ ((size_t)1 << 20)
#define HEADER_THREADS 8

/* What the index says, kept compactly once its JSON tree is freed. */
struct index_map {
    uint32_t *canon_shard;   /* per canonical tensor: 1 + the shard the index names, 0 if unlisted */
    struct other_name { char *name; uint32_t shard; } *other; /* other names, sorted */
    size_t n_other;
    char **unknown;          /* "the index lists ..." problems, in index order (the first KS_MAX_PROBLEMS) */
    size_t n_unknown;
};

static void index_map_free(struct index_map *m)
{
    if (!m) return;
    free(m->canon_shard);
    for (size_t i = 0; i < m->n_other; i++) free(m->other[i].name);
    free(m->other);
    for (size_t i = 0; i < m->n_unknown && i < KS_MAX_PROBLEMS; i++) free(m->unknown[i]);
    free(m->unknown);
    free(m);
}

static char *path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static void add_problem(char **list, size_t *n, const char *fmt, va_list ap)
{
    if (*n < KS_MAX_PROBLEMS) {
        char buf[600];
        vsnprintf(buf, sizeof buf, fmt, ap);
        list[*n] = strdup(buf); /* a lost message under OOM is tolerable; the count stays right */
    }
    (*n)++;
}

static void shard_problem(ks_shard *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void shard_problem(ks_shard *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    add_problem(s->problems, &s->n_problems, fmt, ap);
    va_end(ap);
}

static void general_problem(k3_source *src, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void general_problem(k3_source *src, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    add_problem(src->general, &src->n_general, fmt, ap);
    va_end(ap);
}

int ks_shard_ok(const ks_shard *s) { return s->n_problems == 0; }

int ks_is_io_errno(int e) { return e != 0 && e != ENOENT && e != ENODATA && e != EFBIG && e != ENOMEM; }

int ks_io_errno(const k3_source *src)
{
    if (src->io_errno) return src->io_errno;
    for (size_t i = 0; i < src->n_shards; i++)
        if (src->shards[i].io_errno) return src->shards[i].io_errno;
    return 0;
}

int ks_ok(const k3_source *src)
{
    if (!src->have_cfg || src->n_general) return 0;
    for (size_t i = 0; i < src->n_shards; i++)
        if (!ks_shard_ok(&src->shards[i])) return 0;
    return 1;
}

static int is_hex64(const char *s)
{
    if (strlen(s) != 64) return 0;
    for (int i = 0; i < 64; i++)
        if (!isxdigit((unsigned char)s[i])) return 0;
    return 1;
}

int ks_hf_blob_sha(const char *path, char sha[65])
{
    char target[4096], *base, *parent;
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n <= 0) return 0;
    target[n] = 0;
    base = strrchr(target, '/');
    if (!base) return 0;
    *base++ = 0;
    parent = strrchr(target, '/');
    parent = parent ? parent + 1 : target;
    if (strcmp(parent, "blobs") != 0 || !is_hex64(base)) return 0;
    for (int i = 0; i < 64; i++) sha[i] = (char)tolower((unsigned char)base[i]);
    sha[64] = 0;
    return 1;
}

/* A Hugging Face cache snapshot stores files as symlinks to blobs/<sha256>:
 * the blob's name is the expected SHA-256.  A published --sha256 list, when
 * given, stays the reference; a blob name that disagrees with it is a problem
 * (the cache holds something else than what was published). */
static void hf_blob_sha(ks_shard *s)
{
    char base[65];
    if (!ks_hf_blob_sha(s->path, base)) return;
    s->hf_blob = 1;
    if (s->expect_sha[0]) {
        if (strcmp(s->expect_sha, base) != 0)
            shard_problem(s, "its Hugging Face blob name says SHA-256 %.16s..., --sha256 says %.16s...", base, s->expect_sha);
        return;
    }
    memcpy(s->expect_sha, base, 65);
    s->sha_from = "hf-blob";
}

int ks_sums_read(const char *sums_path, ks_sum **out, size_t *n_out, char *err, size_t errlen)
{
    char *text, *line, *save = NULL;
    size_t len, lineno = 0, n = 0, cap = 0;
    ks_sum *v = NULL;
    *out = NULL;
    *n_out = 0;
    if (kio_read_file(sums_path, SMALL_FILE_MAX, &text, &len)) {
        snprintf(err, errlen, "%s: %s", sums_path, strerror(errno));
        return -1;
    }
    for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *name;
        lineno++;
        if (line[0] == '#' || line[0] == 0) continue;
        if (strlen(line) < 67 || line[64] != ' ' || (line[65] != ' ' && line[65] != '*')) {
            snprintf(err, errlen, "%s line %zu: not in sha256sum format", sums_path, lineno);
            goto bad;
        }
        line[64] = 0;
        name = line + 66;
        if (!is_hex64(line)) {
            snprintf(err, errlen, "%s line %zu: not a SHA-256", sums_path, lineno);
            goto bad;
        }
        if (strncmp(name, "./", 2) == 0) name += 2;
        if (n == cap) {
            ks_sum *g = realloc(v, sizeof *v * (cap = cap ? 2 * cap : 64));
            if (!g) { snprintf(err, errlen, "out of memory"); goto bad; }
            v = g;
        }
        if (!(v[n].name = strdup(name))) { snprintf(err, errlen, "out of memory"); goto bad; }
        for (int k = 0; k < 64; k++) v[n].sha[k] = (char)tolower((unsigned char)line[k]);
        v[n].sha[64] = 0;
        n++;
    }
    free(text);
    *out = v;
    *n_out = n;
    return 0;
bad:
    free(text);
    ks_sums_free(v, n);
    return -1;
}

void ks_sums_free(ks_sum *v, size_t n)
{
    for (size_t i = 0; i < n; i++) free(v[i].name);
    free(v);
}

/* A shard's expected hash: the line that names it (by its base name). */
static int load_sums(k3_source *src, const char *sums_path, char *err, size_t errlen)
{
    ks_sum *v;
    size_t n;
    if (ks_sums_read(sums_path, &v, &n, err, errlen)) return -1;
    for (size_t k = 0; k < n; k++) {
        const char *base = strrchr(v[k].name, '/');
        base = base ? base + 1 : v[k].name;
        for (size_t i = 0; i < src->n_shards; i++) {
            ks_shard *s = &src->shards[i];
            if (strcmp(s->name, base) != 0) continue;
            memcpy(s->expect_sha, v[k].sha, 65);
            s->sha_from = "--sha256";
        }
    }
    ks_sums_free(v, n);
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
static int cmp_other(const void *a, const void *b)
{
    return strcmp(((const struct other_name *)a)->name, ((const struct other_name *)b)->name);
}

/* The index file as a stream for json_load_callback. */
struct index_reader { int fd; int err; size_t at, len; char *buf; };

static size_t index_read(void *out, size_t n, void *data)
{
    struct index_reader *r = data;
    if (r->at == r->len) {
        ssize_t got;
        do got = read(r->fd, r->buf, INDEX_READ);
        while (got < 0 && errno == EINTR);
        if (got < 0) { r->err = errno; return (size_t)-1; }
        r->at = 0;
        r->len = (size_t)got;
        if (got == 0) return 0;
    }
    if (n > r->len - r->at) n = r->len - r->at;
    memcpy(out, r->buf + r->at, n);
    r->at += n;
    return n;
}

static json_t *load_index(const char *path, char *err, size_t errlen, int *absent, int *io_errno)
{
    struct index_reader r = {.fd = -1};
    json_error_t je;
    json_t *root = NULL;
    struct stat st = {0};
    *absent = 0;
    r.fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r.fd < 0) {
        if (errno == ENOENT) *absent = 1;
        else {
            if (ks_is_io_errno(errno)) *io_errno = errno;
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
        }
        return NULL;
    }
    if (fstat(r.fd, &st) != 0 || st.st_size > INDEX_MAX) {
        int e = st.st_size > INDEX_MAX ? EFBIG : errno;
        snprintf(err, errlen, "%s: %s", path, strerror(e));
        close(r.fd);
        return NULL;
    }
    kos_cache_sequential(r.fd);
    r.buf = malloc(INDEX_READ);
    if (!r.buf) { snprintf(err, errlen, "out of memory"); close(r.fd); return NULL; }
    root = json_load_callback(index_read, &r, 0, &je);
    if (r.err) {
        *io_errno = r.err;
        snprintf(err, errlen, "%s: %s", path, strerror(r.err));
        json_decref(root);
        root = NULL;
    } else if (!root || !json_is_object(root) || !json_is_object(json_object_get(root, "weight_map"))) {
        snprintf(err, errlen, "%s: not a safetensors index (needs an object \"weight_map\")%s%s", path,
                 root ? "" : ": ", root ? "" : je.text);
        json_decref(root);
        root = NULL;
    }
    free(r.buf);
    close(r.fd);
    return root;
}

static uint32_t shard_by_name(const k3_source *src, const char *name)
{
    size_t lo = 0, hi = src->n_shards;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(src->shards[mid].name, name);
        if (c == 0) return (uint32_t)mid;
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return UINT32_MAX;
}

/* The weight_map as: per canonical tensor the shard it names, the other
 * (dropped or unknown) names sorted, and the problems of unknown names. */
static struct index_map *index_map_build(k3_source *src, json_t *wm, char *err, size_t errlen)
{
    struct index_map *m = calloc(1, sizeof *m);
    uint64_t count = src->schema.count;
    size_t cap_other = 0;
    const char *key;
    json_t *v;
    if (!m || !(m->canon_shard = calloc(count ? count : 1, sizeof *m->canon_shard)) ||
        !(m->unknown = calloc(KS_MAX_PROBLEMS, sizeof *m->unknown)))
        goto oom;
    json_object_foreach(wm, key, v) {
        k3_tensor_spec spec;
        char why[200];
        uint32_t shard = shard_by_name(src, json_string_value(v));
        int cls = k3_schema_classify(&src->cfg, key, &spec, why, sizeof why);
        if (cls == K3_CLASS_UNKNOWN) {
            if (m->n_unknown < KS_MAX_PROBLEMS) {
                char buf[600];
                snprintf(buf, sizeof buf, "the index lists %s, which is not a tensor of this model (%s)", key, why);
                m->unknown[m->n_unknown] = strdup(buf);
            }
            m->n_unknown++;
        }
        if (cls == K3_CLASS_TENSOR && strcmp(key, spec.name) == 0) {
            m->canon_shard[k3_schema_index(&src->schema, spec.role, spec.layer, spec.expert)] = shard + 1;
            continue;
        }
        if (m->n_other == cap_other) {
            size_t ncap = cap_other ? cap_other * 2 : 256;
            struct other_name *q = realloc(m->other, ncap * sizeof *q);
            if (!q) goto oom;
            m->other = q;
            cap_other = ncap;
        }
        if (!(m->other[m->n_other].name = strdup(key))) goto oom;
        m->other[m->n_other++].shard = shard;
    }
    if (m->n_other) qsort(m->other, m->n_other, sizeof *m->other, cmp_other);
    return m;
oom:
    snprintf(err, errlen, "out of memory");
    index_map_free(m);
    return NULL;
}

/* The shard the index names for a tensor (UINT32_MAX: not in the index). */
static uint32_t index_lookup(const k3_source *src, const struct index_map *m, const char *name, int cls,
                             const k3_tensor_spec *spec)
{
    if (cls == K3_CLASS_TENSOR && strcmp(name, spec->name) == 0)
        return m->canon_shard[k3_schema_index(&src->schema, spec->role, spec->layer, spec->expert)] - 1;
    {
        size_t lo = 0, hi = m->n_other;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            int c = strcmp(m->other[mid].name, name);
            if (c == 0) return m->other[mid].shard;
            if (c < 0) lo = mid + 1; else hi = mid;
        }
    }
    return UINT32_MAX;
}

/* The shard list comes from the index's weight_map, or is the single file. */
static int list_shards(k3_source *src, struct index_map **map_out, char *err, size_t errlen)
{
    char *idx_path = path_join(src->dir, "model.safetensors.index.json");
    char **names = NULL;
    size_t n = 0;
    int rc = -1, absent = 0;
    json_t *root = NULL;
    *map_out = NULL;
    if (!idx_path) { snprintf(err, errlen, "out of memory"); return -1; }
    root = load_index(idx_path, err, errlen, &absent, &src->io_errno);
    if (root) {
        json_t *wm = json_object_get(root, "weight_map"), *v;
        const char *key;
        names = malloc(sizeof *names * (json_object_size(wm) + 1));
        if (!names) { snprintf(err, errlen, "out of memory"); goto out; }
        json_object_foreach(wm, key, v) {
            const char *fn = json_string_value(v);
            if (!fn || !*fn || strchr(fn, '/')) {
                snprintf(err, errlen, "%s: weight_map entry %s does not name a file in the directory", idx_path, key);
                goto out;
            }
            names[n++] = (char *)fn;
        }
        qsort(names, n, sizeof *names, cmp_str);
        src->shards = calloc(n + 1, sizeof *src->shards);
        if (!src->shards) { snprintf(err, errlen, "out of memory"); goto out; }
        for (size_t i = 0; i < n; i++) {
            if (i && strcmp(names[i], names[i - 1]) == 0) continue;
            src->shards[src->n_shards++].name = strdup(names[i]);
        }
        for (size_t i = 0; i < src->n_shards; i++)
            if (!src->shards[i].name) { snprintf(err, errlen, "out of memory"); goto out; }
        if (!(*map_out = index_map_build(src, wm, err, errlen))) goto out;
    } else if (absent) {
        char *single = path_join(src->dir, "model.safetensors");
        struct stat st;
        int exists = single && stat(single, &st) == 0;
        free(single);
        if (!exists) {
            snprintf(err, errlen, "%s: neither model.safetensors.index.json nor model.safetensors is present", src->dir);
            goto out;
        }
        src->single_file = 1;
        src->shards = calloc(1, sizeof *src->shards);
        if (!src->shards) { snprintf(err, errlen, "out of memory"); goto out; }
        src->shards[0].name = strdup("model.safetensors");
        src->n_shards = 1;
    } else {
        goto out; /* load_index said why */
    }
    for (size_t i = 0; i < src->n_shards; i++) {
        ks_shard *s = &src->shards[i];
        if (!s->name || !(s->path = path_join(src->dir, s->name))) { snprintf(err, errlen, "out of memory"); goto out; }
    }
    rc = 0;
out:
    json_decref(root);
    free(names);
    free(idx_path);
    return rc;
}

static void parse_header(ks_shard *s)
{
    char err[600];
    if (st_open(s->path, &s->st, err, sizeof err)) {
        /* st_open names the file; the verdict line does too, so drop the prefix */
        const char *m = strncmp(err, s->path, strlen(s->path)) == 0 ? err + strlen(s->path) + 2 : err;
        if (ks_is_io_errno(s->st.io_errno)) s->io_errno = s->st.io_errno;
        shard_problem(s, "%s", m);
        return;
    }
    s->parsed = 1;
}

/* A consumed shard that is absent: its record's identity and header. */
static void gone_shard(ks_shard *s, const ks_gone *g)
{
    uint8_t *head = NULL;
    uint64_t len = 0;
    char err[600];
    if (s->expect_sha[0] && g->got_sha[0] && strcmp(s->expect_sha, g->got_sha) != 0) {
        shard_problem(s, "kpack convert --consume deleted this shard after checking its SHA-256 %.16s...; --sha256 says %.16s...",
                      g->got_sha, s->expect_sha);
        return;
    }
    s->present = s->gone = 1;
    s->size = g->size;
    s->alloc_bytes = g->alloc_bytes;
    s->mtime_ns = g->mtime_ns;
    snprintf(s->expect_sha, sizeof s->expect_sha, "%s", g->expect_sha);
    snprintf(s->got_sha, sizeof s->got_sha, "%s", g->got_sha);
    s->sha_from = !g->sha_from[0] ? NULL : strcmp(g->sha_from, "hf-blob") == 0 ? "hf-blob" : "--sha256";
    s->hf_blob = s->sha_from && strcmp(s->sha_from, "hf-blob") == 0;
    if (g->read_header(g->ctx, &head, &len)) {
        if (ks_is_io_errno(errno)) s->io_errno = errno;
        shard_problem(s, "consumed: its header cannot be read from the consume log: %s", strerror(errno));
        return;
    }
    if (st_parse(s->path, head, len, s->size, &s->st, err, sizeof err)) shard_problem(s, "consumed: %s", err);
    else s->parsed = 1;
    free(head);
}

static const ks_gone *find_gone(const k3_source *src, const char *name)
{
    for (size_t i = 0; i < src->n_gone; i++)
        if (strcmp(src->gone[i].name, name) == 0) return &src->gone[i];
    return NULL;
}

static void read_one_header(const k3_source *src, ks_shard *s)
{
    struct stat st, lst;
    const ks_gone *g = find_gone(src, s->name);
    if (stat(s->path, &st) != 0) {
        if (errno == ENOENT && g) { gone_shard(s, g); return; }
        if (ks_is_io_errno(errno)) s->io_errno = errno;
        shard_problem(s, "%s", errno == ENOENT ? "missing: the index names this shard but the file is absent" : strerror(errno));
        return;
    }
    s->present = 1;
    s->size = (uint64_t)st.st_size;
    s->alloc_bytes = (uint64_t)st.st_blocks * 512;
    s->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    if (lstat(s->path, &lst) == 0 && S_ISLNK(lst.st_mode)) hf_blob_sha(s);
    if (g) {
        /* deleted by --consume and here again (put back, or the kill came
         * before the deletion): the same file, planned as it was recorded */
        if (g->size != s->size) {
            shard_problem(s, "kpack convert --consume deleted this shard (%llu bytes) and the file here now has %llu: "
                          "put the original back, or remove it", (unsigned long long)g->size, (unsigned long long)s->size);
            return;
        }
        s->recorded = 1;
        s->mtime_ns = g->mtime_ns;
        if (!s->expect_sha[0] && g->expect_sha[0]) {
            snprintf(s->expect_sha, sizeof s->expect_sha, "%s", g->expect_sha);
            s->sha_from = strcmp(g->sha_from, "hf-blob") == 0 ? "hf-blob" : "--sha256";
        }
    }
    parse_header(s);
    if (!s->parsed) return;
    if (s->st.expected_size > s->size) {
        const char *first_cut = "?";
        for (size_t k = 0; k < s->st.n; k++)
            if (s->st.t[k].end > s->size) { first_cut = s->st.t[k].name; break; }
        shard_problem(s, "truncated: %llu bytes on disk, the header describes %llu (%llu missing; partial download?); "
                      "tensor %s and any after it are cut off",
                      (unsigned long long)s->size, (unsigned long long)s->st.expected_size,
                      (unsigned long long)(s->st.expected_size - s->size), first_cut);
    }
    /* bytes after the last tensor are not a problem: the archive keeps them
     * (a gap, FORMAT.md §9.1) and export gives them back */
}

struct header_job { k3_source *src; _Atomic size_t next; };

static void *header_worker(void *arg)
{
    struct header_job *job = arg;
    for (;;) {
        size_t i = atomic_fetch_add(&job->next, 1);
        if (i >= job->src->n_shards) return NULL;
        read_one_header(job->src, &job->src->shards[i]); /* touches shard i only */
    }
}

/* Parsing a header is CPU work (~30 ms for a 0.8 MB K3 header): a few
 * threads, each shard's verdict written by the one worker that took it. */
static void read_shard_headers(k3_source *src)
{
    struct header_job job = {.src = src};
    pthread_t tid[HEADER_THREADS];
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int want = ncpu < 1 ? 1 : ncpu > HEADER_THREADS ? HEADER_THREADS : (int)ncpu, started = 0;
    if ((size_t)want > src->n_shards) want = src->n_shards ? (int)src->n_shards : 1;
    json_object_seed(0); /* before any thread creates a JSON object */
    for (int i = 1; i < want; i++)
        if (pthread_create(&tid[started], NULL, header_worker, &job) == 0) started++;
        else break;
    header_worker(&job);
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
    for (size_t i = 0; i < src->n_shards; i++) {
        if (!src->shards[i].present) continue;
        src->total_bytes += src->shards[i].size;
        if (src->shards[i].hf_blob) src->hf_snapshot = 1;
    }
}

static const char *dtype_list(unsigned mask, char *buf, size_t n)
{
    buf[0] = 0;
    for (int dt = 1; dt <= KPK_DT_BYTES; dt++)
        if (mask & K3_DTM(dt)) {
            size_t u = strlen(buf);
            snprintf(buf + u, n - u, "%s%s", u ? "/" : "", kpk_dtype_name(dt));
        }
    return buf;
}

static void shape_str(int ndim, const uint64_t *shape, char *buf, size_t n)
{
    size_t u = 0;
    u += (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && u < n; d++) u += (size_t)snprintf(buf + u, n - u, "%s%llu", d ? "," : "", (unsigned long long)shape[d]);
    if (u < n) snprintf(buf + u, n - u, "]");
}

static void check_coverage(k3_source *src, const struct index_map *index)
{
    const k3_config *c = &src->cfg;
    uint64_t count = src->schema.count;
    size_t cap_dropped = 0;
    src->loc_shard = malloc(sizeof *src->loc_shard * (count ? count : 1));
    src->loc_tensor = malloc(sizeof *src->loc_tensor * (count ? count : 1));
    if (!src->loc_shard || !src->loc_tensor) { general_problem(src, "out of memory"); return; }
    for (uint64_t i = 0; i < count; i++) src->loc_shard[i] = UINT32_MAX;

    for (size_t si = 0; si < src->n_shards; si++) {
        ks_shard *s = &src->shards[si];
        if (!s->parsed) continue;
        for (size_t ti = 0; ti < s->st.n; ti++) {
            const st_tensor *t = &s->st.t[ti];
            k3_tensor_spec spec;
            char why[200], a[64], b[64];
            int cls = k3_schema_classify(c, t->name, &spec, why, sizeof why);
            if (index) {
                uint32_t at = index_lookup(src, index, t->name, cls, &spec);
                if (at == UINT32_MAX) shard_problem(s, "tensor %s is in this shard but not in the index", t->name);
                else if (at != si) shard_problem(s, "tensor %s is in this shard but the index says %s", t->name, src->shards[at].name);
            }
            if (cls == K3_CLASS_DROPPED) {
                if (src->n_dropped == cap_dropped) {
                    size_t ncap = cap_dropped ? cap_dropped * 2 : 256;
                    const char **p = realloc(src->dropped, ncap * sizeof *p);
                    if (!p) { general_problem(src, "out of memory"); return; }
                    src->dropped = p;
                    cap_dropped = ncap;
                }
                src->dropped[src->n_dropped++] = t->name;
                src->dropped_bytes += t->end - t->begin;
                continue;
            }
            if (cls == K3_CLASS_UNKNOWN) {
                shard_problem(s, "extra unknown tensor %s: %s", t->name, why);
                continue;
            }
            {
                uint64_t canon = k3_schema_index(&src->schema, spec.role, spec.layer, spec.expert);
                int shape_ok = t->ndim == spec.ndim;
                for (int d = 0; shape_ok && d < spec.ndim; d++) shape_ok = t->shape[d] == spec.shape[d];
                if (!(spec.dtypes & K3_DTM(t->dtype))) {
                    shard_problem(s, "tensor %s: dtype %s, expected %s", t->name, t->st_dtype, dtype_list(spec.dtypes, a, sizeof a));
                    continue;
                }
                if (!shape_ok) {
                    shape_str(t->ndim, t->shape, a, sizeof a);
                    shape_str(spec.ndim, spec.shape, b, sizeof b);
                    shard_problem(s, "tensor %s: shape %s, expected %s", t->name, a, b);
                    continue;
                }
                if (src->loc_shard[canon] != UINT32_MAX) {
                    shard_problem(s, "tensor %s also appears in %s", t->name, src->shards[src->loc_shard[canon]].name);
                    continue;
                }
                src->loc_shard[canon] = (uint32_t)si;
                src->loc_tensor[canon] = (uint32_t)ti;
                s->n_tensors++;
                src->n_found++;
            }
        }
    }
    /* Missing tensors: charge each to the shard the index names, if any. */
    for (uint64_t i = 0; i < count; i++) {
        k3_tensor_spec spec;
        ks_shard *owner = NULL;
        if (src->loc_shard[i] != UINT32_MAX) continue;
        src->n_missing++;
        k3_schema_at(&src->schema, i, &spec);
        if (index && index->canon_shard[i]) owner = &src->shards[index->canon_shard[i] - 1];
        if (owner && !owner->parsed) continue; /* already reported: missing or unreadable shard */
        if (owner) shard_problem(owner, "missing tensor %s (the index lists it here)", spec.name);
        else general_problem(src, "missing tensor %s (no shard holds it)", spec.name);
    }
    /* Index entries naming tensors that are not part of this model. */
    if (index) {
        for (size_t k = 0; k < index->n_unknown; k++) {
            if (k < KS_MAX_PROBLEMS && index->unknown[k]) general_problem(src, "%s", index->unknown[k]);
            else src->n_general++; /* counted, not listed, as general_problem would */
        }
    }
}

static int load_extras(k3_source *src, char *err, size_t errlen)
{
    static const char *const names[] = {"config.json", "tiktoken.model", "tokenizer_config.json"};
    for (size_t i = 0; i < 3; i++) {
        char *p = path_join(src->dir, names[i]);
        ks_extra *x = &src->extras[src->n_extras];
        if (!p) { snprintf(err, errlen, "out of memory"); return -1; }
        if (kio_read_file(p, SMALL_FILE_MAX, &x->data, &x->len) == 0) {
            x->name = names[i];
            src->n_extras++;
        } else if (errno != ENOENT || i == 0) {
            if (ks_is_io_errno(errno)) src->io_errno = errno;
            snprintf(err, errlen, "%s: %s", p, strerror(errno));
            free(p);
            return -1;
        }
        free(p);
    }
    return 0;
}

int ks_open(const char *dir, const char *sums_path, k3_source *src, char *err, size_t errlen)
{
    return ks_open_gone(dir, sums_path, NULL, 0, src, err, errlen);
}

int ks_open_gone(const char *dir, const char *sums_path, const ks_gone *gone, size_t n_gone, k3_source *src, char *err,
                 size_t errlen)
{
    struct index_map *index = NULL;
    char cerr[1200];
    memset(src, 0, sizeof *src);
    src->dir = strdup(dir);
    if (!src->dir) { snprintf(err, errlen, "out of memory"); return -1; }
    if (load_extras(src, err, errlen)) return -1;
    if (k3_config_parse(src->extras[0].data, src->extras[0].len, &src->cfg, cerr, sizeof cerr)) {
        snprintf(err, errlen, "%s/config.json: %s", dir, cerr);
        return -1;
    }
    src->have_cfg = 1;
    k3_schema_init(&src->schema, &src->cfg);
    if (list_shards(src, &index, err, errlen)) return -1;
#ifdef __GLIBC__
    malloc_trim(0); /* give back the index's JSON tree before the headers are parsed on other threads */
#endif
    if (sums_path && load_sums(src, sums_path, err, errlen)) { index_map_free(index); return -1; }
    src->gone = gone;
    src->n_gone = n_gone;
    read_shard_headers(src);
    src->gone = NULL;
    src->n_gone = 0;
    check_coverage(src, index);
    index_map_free(index);
    return 0;
}

void ks_free(k3_source *src)
{
    for (size_t i = 0; i < src->n_shards; i++) {
        ks_shard *s = &src->shards[i];
        free(s->name);
        free(s->path);
        st_free(&s->st);
        for (size_t k = 0; k < s->n_problems && k < KS_MAX_PROBLEMS; k++) free(s->problems[k]);
    }
    for (size_t k = 0; k < src->n_general && k < KS_MAX_PROBLEMS; k++) free(src->general[k]);
    for (size_t i = 0; i < src->n_extras; i++) free(src->extras[i].data);
    free(src->shards);
    free(src->loc_shard);
    free(src->loc_tensor);
    free(src->dropped);
    free(src->dir);
    memset(src, 0, sizeof *src);
}

const st_tensor *ks_tensor(const k3_source *src, uint64_t canon, const ks_shard **shard)
{
    uint32_t si;
    if (canon >= src->schema.count || (si = src->loc_shard[canon]) == UINT32_MAX) return NULL;
    if (shard) *shard = &src->shards[si];
    return &src->shards[si].st.t[src->loc_tensor[canon]];
}

uint64_t ks_sha_bytes(const k3_source *src)
{
    uint64_t n = 0;
    for (size_t i = 0; i < src->n_shards; i++)
        if (src->shards[i].expect_sha[0] && src->shards[i].present && !src->shards[i].gone) n += src->shards[i].size;
    return n;
}
