/* Rebuilding the download's files from the archive recipe (rebuild.h). */
#include "rebuild.h"

#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kr_name_ok(const char *s)
{
    if (!*s || *s == '/') return 0;
    for (const char *c = s;;) {
        const char *e = strchr(c, '/');
        size_t n = e ? (size_t)(e - c) : strlen(c);
        if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.')) return 0;
        if (!e) return 1;
        c = e + 1;
    }
}

/* 64 lowercase hexadecimal digits. */
static int sha_ok(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++)
        if (!((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f'))) return 0;
    return n == 64;
}

int kr_recipe_load(kpk_file *f, kr_recipe *r, int *damaged, char *err, size_t errlen)
{
    size_t len, i = 0;
    const char *m = kpk_manifest(f, &len), *why = NULL;
    json_t *ar, *files, *it;
    int has_bit = (kpk_super(f)->incompat & KPK_INCOMPAT_ARCHIVE) != 0;
    memset(r, 0, sizeof *r);
    *damaged = 0;
    r->root = json_loadb(m, len, 0, NULL);
    ar = json_object_get(r->root, "archive");
    if (!has_bit || !ar) {
        const char *producer = json_string_value(json_object_get(r->root, "producer"));
        if (has_bit || ar) { /* the bit and the recipe go together (§9.2) */
            snprintf(err, errlen, "%s: %s (FORMAT.md §9.2): the file is damaged", kpk_path(f),
                     has_bit ? "it has archive extents but its manifest has no archive recipe"
                             : "its manifest has an archive recipe but no extent is an archive extent");
            *damaged = 1;
        } else {
            snprintf(err, errlen, "%s has no archive (it was written by %s, without one): it holds the model only - the "
                     "shards' headers and non-text tensors were not kept - so the original files cannot be rebuilt from "
                     "it. Keep the download, or convert it again with kpack " KPACK_VERSION " (without --no-archive) to be "
                     "able to delete it", kpk_path(f), producer ? producer : "an unknown producer");
        }
        kr_recipe_free(r);
        return -1;
    }
    files = json_object_get(ar, "files");
    r->not_kept = json_object_get(ar, "not_kept");
    if (!json_is_object(ar) || !json_is_array(files) || (r->not_kept && !json_is_array(r->not_kept))) {
        why = "\"archive\" is not an object with a \"files\" array (and, if present, a \"not_kept\" array)";
        goto bad;
    }
    r->n = json_array_size(files);
    if (!(r->files = calloc(r->n + 1, sizeof *r->files))) { snprintf(err, errlen, "out of memory"); kr_recipe_free(r); return -1; }
    json_array_foreach(files, i, it) {
        kr_file *k = &r->files[i];
        json_t *sz = json_object_get(it, "size"), *sha = json_object_get(it, "sha256");
        const char *kind = json_string_value(json_object_get(it, "kind"));
        k->name = json_string_value(json_object_get(it, "name"));
        k->sha256 = json_string_value(sha);
        k->sha_from = json_string_value(json_object_get(it, "sha256_from"));
        if (!k->name) { why = "a file without a name"; goto bad; }
        if (!kr_name_ok(k->name)) { why = "a file name that is not a relative path inside the directory"; goto bad; }
        if (!kind || (strcmp(kind, "safetensors") && strcmp(kind, "file"))) { why = "a kind other than \"file\" and \"safetensors\""; goto bad; }
        k->safetensors = strcmp(kind, "safetensors") == 0;
        if (!json_is_integer(sz) || json_integer_value(sz) < 0) { why = "a size that is not a non-negative integer"; goto bad; }
        if (sha && !json_is_null(sha) && !(k->sha256 && sha_ok(k->sha256))) { why = "a sha256 that is not null or 64 lowercase hex digits"; goto bad; }
        k->size = (uint64_t)json_integer_value(sz);
        if (i && strcmp(r->files[i - 1].name, k->name) >= 0) { why = "names not sorted, or one twice"; goto bad; }
    }
    return 0;
bad:
    if (r->files && i < r->n && r->files[i].name)
        snprintf(err, errlen, "%s: the manifest's archive recipe is malformed (FORMAT.md §9.2): files[%zu] \"%s\": %s",
                 kpk_path(f), i, r->files[i].name, why);
    else
        snprintf(err, errlen, "%s: the manifest's archive recipe is malformed (FORMAT.md §9.2): %s", kpk_path(f), why);
    *damaged = 1;
    kr_recipe_free(r);
    return -1;
}

int kr_check(kpk_file *f, int *damaged, char *err, size_t errlen)
{
    kr_recipe r;
    int rc = 0;
    if (kr_recipe_load(f, &r, damaged, err, errlen)) return *damaged ? -1 : 0; /* no archive: nothing to check */
    for (size_t i = 0; i < r.n && !rc; i++) {
        kr_piece *p = NULL;
        size_t n = 0;
        kpk_err e = {0};
        if (kr_pieces(f, &r.files[i], &p, &n, &e)) {
            snprintf(err, errlen, "%s", e.msg);
            *damaged = kpk_err_is_damage(e.code);
            rc = -1;
        }
        free(p);
    }
    kr_recipe_free(&r);
    return rc;
}

void kr_recipe_free(kr_recipe *r)
{
    free(r->files);
    json_decref(r->root);
    memset(r, 0, sizeof *r);
}

const kr_file *kr_find(const kr_recipe *r, const char *name)
{
    for (size_t i = 0; i < r->n; i++)
        if (strcmp(r->files[i].name, name) == 0) return &r->files[i];
    return NULL;
}

/* ---- pieces -------------------------------------------------------------------- */

struct plist { kr_piece *p; size_t n, cap; };

static int add_piece(struct plist *l, uint64_t off, const kpk_tensor *t)
{
    if (!t->nbytes) return 0;
    if (l->n == l->cap) {
        kr_piece *g = realloc(l->p, sizeof *g * (l->cap = l->cap ? 2 * l->cap : 64));
        if (!g) return -1;
        l->p = g;
    }
    l->p[l->n].off = off;
    l->p[l->n].len = t->nbytes;
    l->p[l->n].pos = t->offset;
    l->p[l->n].extent = t->extent;
    l->n++;
    return 0;
}

static int cmp_piece(const void *a, const void *b)
{
    const kr_piece *x = a, *y = b;
    return (x->off > y->off) - (x->off < y->off);
}

/* The safetensors file's pieces: its header, each tensor its header lists,
 * and its gap ranges. */
static int safetensors_pieces(kpk_file *f, const kr_file *rf, struct plist *l, kpk_err *err)
{
    char name[KPK_MAX_NAME + 64], prefix[KPK_MAX_NAME + 64];
    kpk_tensor h, t;
    uint8_t *hdr = NULL;
    uint64_t n;
    json_t *j = NULL, *v;
    const char *key;
    size_t plen;
    int rc = -1;
    snprintf(name, sizeof name, "archive/shards/%s/header", rf->name);
    if (kpk_find_tensor(f, name, &h) < 0 || h.nbytes < 8) {
        kpk_err_set(err, KPK_EFORMAT, "%s: %s: no tensor %s in the archive", kpk_path(f), rf->name, name);
        return -1;
    }
    if (!(hdr = malloc(h.nbytes + 1))) { kpk_err_set(err, KPK_ENOMEM, "out of memory"); return -1; }
    if (kpk_extent_read_raw(f, h.extent, hdr, h.nbytes, h.offset, err)) goto out;
    n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | hdr[i];
    if (n != h.nbytes - 8) {
        kpk_err_set(err, KPK_EFORMAT, "%s: %s: its header says %llu bytes of JSON, the archive keeps %llu", kpk_path(f),
                    rf->name, (unsigned long long)n, (unsigned long long)(h.nbytes - 8));
        goto out;
    }
    if (add_piece(l, 0, &h)) goto oom;
    j = json_loadb((const char *)hdr + 8, n, JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, NULL);
    if (!json_is_object(j)) {
        kpk_err_set(err, KPK_EFORMAT, "%s: %s: its archived header is not a JSON object", kpk_path(f), rf->name);
        goto out;
    }
    json_object_foreach(j, key, v) {
        json_t *d = json_object_get(v, "data_offsets");
        uint64_t b, e;
        if (strcmp(key, "__metadata__") == 0) continue;
        if (!json_is_array(d) || json_array_size(d) != 2 || !json_is_integer(json_array_get(d, 0)) ||
            !json_is_integer(json_array_get(d, 1)) || json_integer_value(json_array_get(d, 0)) < 0 ||
            json_integer_value(json_array_get(d, 1)) < json_integer_value(json_array_get(d, 0))) {
            kpk_err_set(err, KPK_EFORMAT, "%s: %s: tensor %s has no valid data_offsets in its archived header", kpk_path(f),
                        rf->name, key);
            goto out;
        }
        b = (uint64_t)json_integer_value(json_array_get(d, 0));
        e = (uint64_t)json_integer_value(json_array_get(d, 1));
        if (kpk_find_tensor(f, key, &t) < 0) {
            kpk_err_set(err, KPK_EFORMAT, "%s: %s: tensor %s is not in the file", kpk_path(f), rf->name, key);
            goto out;
        }
        if (t.nbytes != e - b) {
            kpk_err_set(err, KPK_EFORMAT, "%s: %s: tensor %s has %llu bytes, its header says %llu", kpk_path(f), rf->name, key,
                        (unsigned long long)t.nbytes, (unsigned long long)(e - b));
            goto out;
        }
        if (add_piece(l, h.nbytes + b, &t)) goto oom;
    }
    /* the gaps: archive tensors named archive/shards/F/gap/P */
    plen = (size_t)snprintf(prefix, sizeof prefix, "archive/shards/%s/gap/", rf->name);
    for (uint32_t i = 0; i < kpk_extent_count(f); i++) {
        const kpk_extent *x = kpk_extent_at(f, i);
        if (x->kind != KPK_KIND_ARCHIVE) continue;
        for (uint64_t k = x->first_tensor; k < (uint64_t)x->first_tensor + x->tensor_count; k++) {
            char *end;
            unsigned long long p;
            kpk_tensor_at(f, k, &t);
            if (strncmp(t.name, prefix, plen) != 0) continue;
            p = strtoull(t.name + plen, &end, 10);
            /* decimal digits, no sign, no leading zero (strtoull alone takes " +012") */
            if (*end || end == t.name + plen || strspn(t.name + plen, "0123456789") != strlen(t.name + plen) ||
                (t.name[plen] == '0' && t.name[plen + 1])) {
                kpk_err_set(err, KPK_EFORMAT, "%s: %s: archive tensor %s: not a gap position", kpk_path(f), rf->name, t.name);
                goto out;
            }
            if (add_piece(l, p, &t)) goto oom;
        }
    }
    rc = 0;
    goto out;
oom:
    kpk_err_set(err, KPK_ENOMEM, "out of memory");
out:
    json_decref(j);
    free(hdr);
    return rc;
}

int kr_pieces(kpk_file *f, const kr_file *rf, kr_piece **out, size_t *n, kpk_err *err)
{
    struct plist l = {0};
    uint64_t at = 0;
    *out = NULL;
    *n = 0;
    if (rf->safetensors) {
        if (safetensors_pieces(f, rf, &l, err)) { free(l.p); return -1; }
    } else {
        char name[KPK_MAX_NAME + 64];
        kpk_tensor t;
        snprintf(name, sizeof name, "archive/files/%s", rf->name);
        if (kpk_find_tensor(f, name, &t) < 0) {
            kpk_err_set(err, KPK_EFORMAT, "%s: %s: no tensor %s in the archive", kpk_path(f), rf->name, name);
            return -1;
        }
        if (add_piece(&l, 0, &t)) { kpk_err_set(err, KPK_ENOMEM, "out of memory"); return -1; }
    }
    if (l.n) qsort(l.p, l.n, sizeof *l.p, cmp_piece);
    /* each byte written once: the pieces tile [0, size) */
    for (size_t i = 0; i < l.n; i++) {
        if (l.p[i].off != at) {
            kpk_err_set(err, KPK_EFORMAT, "%s: %s: bytes %llu..%llu are %s", kpk_path(f), rf->name,
                        (unsigned long long)(l.p[i].off < at ? l.p[i].off : at),
                        (unsigned long long)(l.p[i].off < at ? at : l.p[i].off),
                        l.p[i].off < at ? "written twice (overlapping pieces)" : "in no piece of the archive");
            free(l.p);
            return -1;
        }
        at += l.p[i].len;
    }
    if (at != rf->size) {
        kpk_err_set(err, KPK_EFORMAT, "%s: %s: its pieces add up to %llu bytes, the recipe says %llu", kpk_path(f), rf->name,
                    (unsigned long long)at, (unsigned long long)rf->size);
        free(l.p);
        return -1;
    }
    *out = l.p;
    *n = l.n;
    return 0;
}

int kr_stream(kpk_file *f, const kr_piece *p, size_t n, uint8_t *buf, size_t buflen, kr_sink sink, void *ctx,
              kprogress *prog, kpk_err *err)
{
    for (size_t i = 0; i < n; i++)
        for (uint64_t done = 0; done < p[i].len;) {
            size_t len = p[i].len - done < buflen ? (size_t)(p[i].len - done) : buflen;
            if (kpk_extent_read_raw(f, p[i].extent, buf, len, p[i].pos + done, err)) return -1;
            kpk_extent_drop_cache(f, p[i].extent, p[i].pos + done, len);
            if (sink(ctx, buf, len, p[i].off + done)) return -1;
            kprogress_add(prog, len);
            done += len;
        }
    return 0;
}

int kr_verify_extents(kpk_file *f, const kr_piece *p, size_t n, kpk_err *err)
{
    const size_t scratch_len = (size_t)8 << 20;
    uint8_t *seen = calloc(kpk_extent_count(f) + 1, 1);
    void *scratch = malloc(scratch_len);
    int rc = 0;
    if (!seen || !scratch) { free(seen); free(scratch); kpk_err_set(err, KPK_ENOMEM, "out of memory"); return -1; }
    for (size_t i = 0; i < n && !rc; i++) {
        if (seen[p[i].extent]) continue;
        seen[p[i].extent] = 1;
        rc = kpk_extent_verify(f, p[i].extent, scratch, scratch_len, err);
    }
    free(seen);
    free(scratch);
    return rc;
}
