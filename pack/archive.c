/* Listing the files of the download a conversion keeps (archive.h). */
#include "archive.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct scan {
    const k3_source *src;
    ka_archive *a;
    size_t cap_files, cap_skip;
    const char *out_dir_real;   /* OUT's directory, resolved */
    const char *out_base;       /* OUT's file name */
    char *err;
    size_t errlen;
};

static int is_shard(const k3_source *src, const char *rel)
{
    for (size_t i = 0; i < src->n_shards; i++)
        if (strcmp(src->shards[i].name, rel) == 0) return 1;
    return 0;
}

static int add_skip(struct scan *s, const char *rel, uint64_t size, const char *reason)
{
    ka_archive *a = s->a;
    if (a->n_not_kept == s->cap_skip) {
        ka_skip *g = realloc(a->not_kept, sizeof *g * (s->cap_skip = s->cap_skip ? 2 * s->cap_skip : 16));
        if (!g) return -1;
        a->not_kept = g;
    }
    a->not_kept[a->n_not_kept].name = strdup(rel);
    a->not_kept[a->n_not_kept].reason = strdup(reason);
    a->not_kept[a->n_not_kept].size = size;
    if (!a->not_kept[a->n_not_kept].name || !a->not_kept[a->n_not_kept].reason) return -1;
    a->n_not_kept++;
    return 0;
}

static int add_file(struct scan *s, const char *rel, const char *path, const struct stat *st)
{
    ka_archive *a = s->a;
    ka_file *f;
    if (a->n_files == s->cap_files) {
        ka_file *g = realloc(a->files, sizeof *g * (s->cap_files = s->cap_files ? 2 * s->cap_files : 16));
        if (!g) return -1;
        a->files = g;
    }
    f = &a->files[a->n_files];
    memset(f, 0, sizeof *f);
    f->name = strdup(rel);
    f->path = strdup(path);
    if (!f->name || !f->path) { free(f->name); free(f->path); return -1; }
    f->size = (uint64_t)st->st_size;
    f->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
    if (ks_hf_blob_sha(path, f->expect_sha)) f->sha_from = "hf-blob";
    a->kept_bytes += f->size;
    a->n_files++;
    return 0;
}

/* This conversion's own files, when OUT is written into the download directory. */
static int is_own_output(struct scan *s, const char *dir, const char *name)
{
    char *real;
    int same;
    if (strncmp(name, s->out_base, strlen(s->out_base)) != 0 || !s->out_dir_real) return 0;
    if (!(real = realpath(dir, NULL))) return 0;
    same = strcmp(real, s->out_dir_real) == 0;
    free(real);
    return same;
}

static int walk(struct scan *s, const char *dir, const char *rel)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int rc = 0;
    if (!d) { snprintf(s->err, s->errlen, "%s: %s", dir, strerror(errno)); return -1; }
    while (rc == 0 && (e = readdir(d))) {
        char *path = NULL, *name = NULL;
        struct stat lst, st;
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (asprintf(&path, "%s/%s", dir, e->d_name) < 0) path = NULL;
        if (asprintf(&name, "%s%s%s", rel, *rel ? "/" : "", e->d_name) < 0) name = NULL;
        if (!path || !name) { snprintf(s->err, s->errlen, "out of memory"); free(path); free(name); rc = -1; break; }
        if (lstat(path, &lst) != 0) {
            snprintf(s->err, s->errlen, "%s: %s", path, strerror(errno));
            rc = -1;
        } else if (S_ISDIR(lst.st_mode)) {
            rc = walk(s, path, name);
        } else if (is_shard(s->src, name) || is_own_output(s, dir, e->d_name)) {
            /* a shard: rebuilt from the model and its archive; or what this run writes */
        } else if (stat(path, &st) != 0) {
            rc = add_skip(s, name, 0, S_ISLNK(lst.st_mode) ? "a symbolic link to nothing" : strerror(errno));
        } else if (S_ISDIR(st.st_mode)) {
            rc = add_skip(s, name, 0, "a symbolic link to a directory (not followed)");
        } else if (!S_ISREG(st.st_mode)) {
            rc = add_skip(s, name, 0, "not a regular file");
        } else if ((uint64_t)st.st_size > s->a->keep_max) {
            char why[96];
            snprintf(why, sizeof why, "larger than --keep-max (%llu bytes)", (unsigned long long)s->a->keep_max);
            rc = add_skip(s, name, (uint64_t)st.st_size, why);
        } else {
            rc = add_file(s, name, path, &st);
        }
        if (rc && !s->err[0]) snprintf(s->err, s->errlen, "out of memory");
        free(path);
        free(name);
    }
    closedir(d);
    return rc;
}

static int cmp_file(const void *a, const void *b) { return strcmp(((const ka_file *)a)->name, ((const ka_file *)b)->name); }
static int cmp_skip(const void *a, const void *b) { return strcmp(((const ka_skip *)a)->name, ((const ka_skip *)b)->name); }

int ka_scan(const k3_source *src, const char *out, uint64_t keep_max, const char *sums, ka_archive *a, char *err,
            size_t errlen)
{
    struct scan s = {.src = src, .a = a, .err = err, .errlen = errlen};
    char *odir = strdup(out), *slash;
    int rc;
    memset(a, 0, sizeof *a);
    a->keep_max = keep_max;
    err[0] = 0;
    if (!odir) { snprintf(err, errlen, "out of memory"); return -1; }
    slash = strrchr(odir, '/');
    s.out_base = slash ? out + (slash - odir) + 1 : out;
    if (slash) *slash = 0;
    s.out_dir_real = realpath(slash ? (*odir ? odir : "/") : ".", NULL);
    rc = walk(&s, src->dir, "");
    free((char *)s.out_dir_real);
    free(odir);
    if (rc) return -1;
    if (a->n_files) qsort(a->files, a->n_files, sizeof *a->files, cmp_file);
    if (a->n_not_kept) qsort(a->not_kept, a->n_not_kept, sizeof *a->not_kept, cmp_skip);
    if (sums) { /* the published list is the reference, as for the shards */
        ks_sum *v;
        size_t n;
        if (ks_sums_read(sums, &v, &n, err, errlen)) return -1;
        for (size_t k = 0; k < n; k++)
            for (size_t i = 0; i < a->n_files; i++) {
                const char *base = strrchr(v[k].name, '/');
                /* the list names a file by its path in the download, or by its base name at the top */
                if (strcmp(a->files[i].name, v[k].name) != 0 && !(!strchr(a->files[i].name, '/') && base && strcmp(base + 1, a->files[i].name) == 0))
                    continue;
                memcpy(a->files[i].expect_sha, v[k].sha, 65);
                a->files[i].sha_from = "--sha256";
            }
        ks_sums_free(v, n);
    }
    return 0;
}

int ka_check_sha256(ka_archive *a, char *err, size_t errlen)
{
    for (size_t i = 0; i < a->n_files; i++) {
        ka_file *f = &a->files[i];
        char why[300];
        if (!f->expect_sha[0]) continue;
        if (ks_sha256_file(f->path, f->got_sha, NULL, &a->io_errno, why, sizeof why)) {
            snprintf(err, errlen, "%s: SHA-256 not computed: %s", f->path, why);
            return -1;
        }
        if (strcmp(f->got_sha, f->expect_sha) != 0) {
            snprintf(err, errlen, "%s: SHA-256 mismatch: got %.16s..., expected %.16s... (from %s); the download is damaged",
                     f->path, f->got_sha, f->expect_sha, f->sha_from);
            return -1;
        }
    }
    return 0;
}

void ka_free(ka_archive *a)
{
    for (size_t i = 0; i < a->n_files; i++) { free(a->files[i].name); free(a->files[i].path); }
    for (size_t i = 0; i < a->n_not_kept; i++) { free(a->not_kept[i].name); free(a->not_kept[i].reason); }
    free(a->files);
    free(a->not_kept);
    memset(a, 0, sizeof *a);
}
