/* Repairing damaged extents from the original download (repair.h). */
#include "repair.h"

#include "archive.h"
#include "copy_pipe.h"
#include "plan.h"
#include "rebuild.h"
#include "format/kio.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#define CHUNK ((size_t)16 << 20)

struct repair {
    kpk_file *f;
    json_t *man;
    k3_source src;
    int have_src;
    ka_archive arch;
    kp_input in;
    kp_plan plan;
    int have_plan;
    char *err;
    size_t errlen;
    int damage;
};

static int fail(struct repair *r, int damage, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct repair *r, int damage, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, r->errlen, fmt, ap);
    va_end(ap);
    r->damage = damage;
    return -1;
}

/* ---- 1. the source is the download the file was converted from ----------------- */

/* The file's options, as its manifest records them. */
static int options_of(struct repair *r, kp_options *o)
{
    json_t *opt = json_object_get(r->man, "options"), *c = json_object_get(opt, "codec");
    const char *order = json_string_value(json_object_get(opt, "order"));
    const char *compress = json_string_value(json_object_get(opt, "compress"));
    memset(o, 0, sizeof *o);
    o->align = 4096;
    o->order = order && strcmp(order, "trunk-first") == 0 ? KPK_ORDER_TRUNK_FIRST : KPK_ORDER_LAYER_MAJOR;
    kp_codec_defaults(&o->codec);
    o->codec.compress = compress ? kp_compress_parse(compress) : KP_COMPRESS_NONE;
    if (o->codec.compress < 0) return fail(r, 0, "the file's manifest names an unknown --compress %s", compress);
    if (c) {
        char here[32];
        const char *z = json_string_value(json_object_get(c, "zstd"));
        o->codec.block_size = (uint32_t)json_integer_value(json_object_get(c, "block_size"));
        o->codec.level = (int)json_integer_value(json_object_get(c, "level"));
        o->codec.literal_level = (int)json_integer_value(json_object_get(c, "literal_level"));
        o->codec.min_saving = (double)json_integer_value(json_object_get(c, "min_saving_percent")) / 100.0;
        snprintf(here, sizeof here, "%u.%u.%u", ZSTD_versionNumber() / 10000, ZSTD_versionNumber() / 100 % 100,
                 ZSTD_versionNumber() % 100);
        if (z && strcmp(z, here) != 0)
            fprintf(stderr, "kpack: note: the file's blocks were coded by zstd %s, this kpack uses %s: a compressed extent "
                    "may not come out byte for byte the same (it is checked before anything is written)\n", z, here);
    }
    return 0;
}

/* Every shard the manifest lists is in the source, with its size. */
static int check_shards(struct repair *r)
{
    json_t *files = json_object_get(json_object_get(r->man, "source"), "files"), *it;
    size_t i;
    if (!json_is_array(files) || !json_array_size(files))
        return fail(r, 0, "the file's manifest lists no source files (re-laid out from a file without provenance): "
                    "there is nothing to check a source against");
    json_array_foreach(files, i, it) {
        const char *name = json_string_value(json_object_get(it, "name"));
        const char *sha = json_string_value(json_object_get(it, "sha256"));
        uint64_t size = (uint64_t)json_integer_value(json_object_get(it, "size"));
        ks_shard *s = NULL;
        for (size_t k = 0; name && k < r->src.n_shards; k++)
            if (strcmp(r->src.shards[k].name, name) == 0) s = &r->src.shards[k];
        if (!s) return fail(r, 1, "%s has no %s, which the file was converted from", r->src.dir, name ? name : "?");
        if (s->size != size)
            return fail(r, 1, "%s has %llu bytes, the file was converted from %llu: it is not the same shard", s->path,
                        (unsigned long long)s->size, (unsigned long long)size);
        if (sha && strlen(sha) == 64) { /* hashed later, if a damaged extent reads from it */
            memcpy(s->expect_sha, sha, 65);
            s->sha_from = "the file's manifest";
        }
    }
    if (r->src.n_shards != json_array_size(files))
        return fail(r, 1, "%s has %zu shards, the file was converted from %zu", r->src.dir, r->src.n_shards, json_array_size(files));
    return 0;
}

/* The archive's kept files, as the recipe lists them (not a new scan: the
 * directory may hold more now). */
static int archive_of(struct repair *r, const kr_recipe *rc)
{
    size_t n = 0;
    memset(&r->arch, 0, sizeof r->arch);
    if (!(r->arch.files = calloc(rc->n + 1, sizeof *r->arch.files))) return fail(r, 0, "out of memory");
    for (size_t i = 0; i < rc->n; i++) {
        ka_file *k = &r->arch.files[n];
        struct stat st;
        if (rc->files[i].safetensors) continue;
        if (!(k->name = strdup(rc->files[i].name)) || asprintf(&k->path, "%s/%s", r->src.dir, k->name) < 0) {
            k->path = NULL;
            r->arch.n_files = n + 1;
            return fail(r, 0, "out of memory");
        }
        r->arch.n_files = ++n;
        if (stat(k->path, &st) != 0) return fail(r, 1, "%s: %s (the file's archive keeps it)", k->path, strerror(errno));
        if ((uint64_t)st.st_size != rc->files[i].size)
            return fail(r, 1, "%s has %llu bytes, the file's archive keeps %llu: it is not the same file", k->path,
                        (unsigned long long)st.st_size, (unsigned long long)rc->files[i].size);
        k->size = rc->files[i].size;
        if (rc->files[i].sha256) memcpy(k->expect_sha, rc->files[i].sha256, 65);
    }
    return 0;
}

/* ---- 2. planned again, the source has the file's layout --------------------------- */

static int same_layout(struct repair *r)
{
    const kp_plan *p = &r->plan;
    kpk_file *f = r->f;
    if (p->n_extents != kpk_extent_count(f) || p->n_tensors != kpk_tensor_count(f))
        return fail(r, 1, "planned from %s with the file's options, the model has %u extents and %llu tensors, the file "
                    "%u and %llu: it is not the source of this file", r->src.dir, p->n_extents, (unsigned long long)p->n_tensors,
                    kpk_extent_count(f), (unsigned long long)kpk_tensor_count(f));
    for (uint32_t i = 0; i < p->n_extents; i++) {
        const kpk_extent *a = &p->extents[i], *b = kpk_extent_at(f, i);
        char d[64];
        kpk_extent_describe(b, d, sizeof d);
        if (a->kind != b->kind || a->layer != b->layer || a->expert != b->expert || a->raw_len != b->raw_len ||
            a->tensor_count != b->tensor_count || a->codec != b->codec)
            return fail(r, 1, "%s (extent %u) is laid out otherwise in the file than from %s with the file's options", d, i,
                        r->src.dir);
        for (uint32_t k = 0; k < a->tensor_count; k++) {
            kpk_tensor t;
            const kpk_tensor *u = &p->tensors[a->first_tensor + k];
            kpk_tensor_at(f, b->first_tensor + k, &t);
            if (strcmp(t.name, u->name) != 0 || t.offset != u->offset || t.nbytes != u->nbytes)
                return fail(r, 1, "%s: tensor %s is not laid out as %s gives it", d, t.name, r->src.dir);
        }
        if (b->codec == KPK_CODEC_BLOCKS) {
            const kpk_block *kb = kpk_extent_blocks(f, i);
            uint32_t n = kpk_extent_block_count(f, i);
            if (n != kp_extent_nblocks(p, i)) return fail(r, 1, "%s: %u blocks in the file, %u planned", d, n, kp_extent_nblocks(p, i));
            for (uint32_t k = 0; k < n; k++)
                if (kb[k].raw_off != p->cuts[a->first_block + k].raw_off || kb[k].raw_len != p->cuts[a->first_block + k].raw_len)
                    return fail(r, 1, "%s: block %u is cut otherwise than planned (another --block-size?)", d, k);
        }
    }
    return 0;
}

/* The SHA-256 of every shard and kept file a damaged extent reads, where one was recorded. */
static int check_hashes(struct repair *r, const uint32_t *bad, size_t n, int threads, int quiet)
{
    const kp_plan *p = &r->plan;
    uint8_t *need = calloc(r->src.n_shards + 1, 1), *needf = calloc(r->arch.n_files + 1, 1);
    if (!need || !needf) { free(need); free(needf); return fail(r, 0, "out of memory"); }
    for (size_t k = 0; k < n; k++) {
        const kpk_extent *x = &p->extents[bad[k]];
        for (uint64_t t = x->first_tensor; t < (uint64_t)x->first_tensor + x->tensor_count; t++) {
            if (p->from[t].shard < r->src.n_shards) need[p->from[t].shard] = 1;
            if (p->from[t].shard == KP_FROM_FILE) needf[p->from[t].extra] = 1;
        }
    }
    for (size_t i = 0; i < r->src.n_shards; i++)
        if (!need[i]) r->src.shards[i].expect_sha[0] = 0;
    for (size_t i = 0; i < r->arch.n_files; i++)
        if (!needf[i]) r->arch.files[i].expect_sha[0] = 0;
    free(need);
    free(needf);
    ks_check_sha256(&r->src, threads, !quiet);
    for (size_t i = 0; i < r->src.n_shards; i++)
        if (!ks_shard_ok(&r->src.shards[i]))  /* unreadable is an I/O error (exit 2), not a mismatch */
            return fail(r, !r->src.shards[i].io_errno, "%s: %s", r->src.shards[i].path,
                        r->src.shards[i].problems[0] ? r->src.shards[i].problems[0] : "bad");
    if (ka_check_sha256(&r->arch, r->err, r->errlen)) { r->damage = !r->arch.io_errno; return -1; }
    return 0;
}

/* ---- 3. each damaged extent made again, checked, then written ------------------------ */

/* The source shards (or files) extent i reads, for messages. */
static void sources_of(const struct repair *r, uint32_t i, char *buf, size_t len)
{
    const kp_plan *p = &r->plan;
    const kpk_extent *x = &p->extents[i];
    size_t at = 0;
    uint32_t last = UINT32_MAX;
    buf[0] = 0;
    for (uint64_t t = x->first_tensor; t < (uint64_t)x->first_tensor + x->tensor_count && at + 80 < len; t++) {
        const kp_source_ref *s = &p->from[t];
        const char *name = s->shard < r->src.n_shards ? r->src.shards[s->shard].name
                         : s->shard == KP_FROM_FILE ? r->arch.files[s->extra].name : NULL;
        if (!name || s->shard == last) continue;
        last = s->shard;
        at += (size_t)snprintf(buf + at, len - at, "%s%s", at ? ", " : "", name);
    }
}

/* The tensor holding decoded offset pos of extent i. */
static const char *tensor_at(const kp_plan *p, uint32_t i, uint64_t pos)
{
    const kpk_extent *x = &p->extents[i];
    const char *name = "?";
    for (uint64_t t = x->first_tensor; t < (uint64_t)x->first_tensor + x->tensor_count; t++)
        if (p->tensors[t].offset <= pos) name = p->tensors[t].name;
    return name;
}

/* Write len bytes at stored position pos of extent i through the member files (fds opened for writing). */
static int write_stored(kpk_file *f, const int *fds, uint32_t i, uint64_t pos, const uint8_t *buf, uint64_t len)
{
    while (len) {
        kpk_seg seg[64];
        uint64_t done;
        size_t m = kpk_extent_segments(f, i, pos, len, seg, 64, &done);
        if (!m) { errno = EINVAL; return -1; }
        for (size_t s = 0; s < m; s++) {
            if (kio_pwrite_full(fds[seg[s].member], buf, seg[s].len, seg[s].off)) return -1;
            buf += seg[s].len;
        }
        pos += done;
        len -= done;
    }
    return 0;
}

/* Make extent i again from the source; compare everything with the table;
 * with fds, also write it (stored bytes, then zero padding). */
static int remake(struct repair *r, struct pipe *pp, uint32_t i, kpk_encoder *enc, uint8_t *raw, uint8_t *out, const int *fds)
{
    kpk_file *f = r->f;
    const kp_plan *p = &r->plan;
    const kpk_extent *x = kpk_extent_at(f, i);
    XXH3_state_t *rs = XXH3_createState(), *ss = XXH3_createState();
    char d[64], from[400];
    uint64_t stored = 0;
    int rc = -1, zero;
    kpk_extent_describe(x, d, sizeof d);
    sources_of(r, i, from, sizeof from);
    if (!rs || !ss) { fail(r, 0, "out of memory"); goto out; }
    XXH3_64bits_reset(rs);
    XXH3_64bits_reset(ss);
    if (x->codec == KPK_CODEC_BLOCKS) {
        const kpk_block *kb = kpk_extent_blocks(f, i);
        for (uint32_t k = 0; k < kpk_extent_block_count(f, i); k++) {
            kpk_block b;
            if (kp_fill_range(pp, i, kb[k].raw_off, kb[k].raw_len, raw, &zero)) { fail(r, 0, "%s", pp->err); goto out; }
            if (zero) memset(raw, 0, kb[k].raw_len);
            if (XXH3_64bits(raw, kb[k].raw_len) != kb[k].raw_xxh3) {
                fail(r, 1, "%s, block %u (tensor %s): the bytes read from %s are not the ones this file holds", d, k,
                     tensor_at(p, i, kb[k].raw_off), from);
                goto out;
            }
            if (kpk_encode_block(enc, kp_class_recipe(p->cuts[x->first_block + k].cls), raw, kb[k].raw_len, out,
                                 kpk_encode_bound(kb[k].raw_len), &b)) {
                fail(r, 0, "encoding failed (zstd)");
                goto out;
            }
            if (b.stored_len != kb[k].stored_len || b.method != kb[k].method || b.planes != kb[k].planes ||
                b.plane0_len != kb[k].plane0_len) {
                fail(r, 1, "%s, block %u: the source's bytes are right, but coded here they come out otherwise than the "
                     "file stores them (another zstd version or settings?): it cannot be repaired byte for byte", d, k);
                goto out;
            }
            XXH3_64bits_update(rs, raw, kb[k].raw_len);
            XXH3_64bits_update(ss, out, b.stored_len);
            if (fds && write_stored(f, fds, i, stored, out, b.stored_len)) { fail(r, 0, "writing %s: %s", d, strerror(errno)); goto out; }
            stored += b.stored_len;
        }
    } else {
        for (uint64_t pos = 0; pos < x->raw_len; pos += CHUNK) {
            size_t len = x->raw_len - pos < CHUNK ? (size_t)(x->raw_len - pos) : CHUNK;
            if (kp_fill_range(pp, i, pos, len, raw, &zero)) { fail(r, 0, "%s", pp->err); goto out; }
            if (zero) memset(raw, 0, len);
            XXH3_64bits_update(rs, raw, len);
            XXH3_64bits_update(ss, raw, len);
            if (fds && write_stored(f, fds, i, pos, raw, len)) { fail(r, 0, "writing %s: %s", d, strerror(errno)); goto out; }
        }
        stored = x->raw_len;
    }
    if (XXH3_64bits_digest(rs) != x->raw_xxh3) {
        fail(r, 1, "%s: the bytes read from %s do not reproduce its checksum: they are not the ones this file was made of", d, from);
        goto out;
    }
    if (stored != x->stored_len || XXH3_64bits_digest(ss) != x->stored_xxh3) {
        fail(r, 1, "%s: made again from %s, its stored bytes differ from the table's (another zstd version or settings?)", d, from);
        goto out;
    }
    if (fds) { /* its zero padding too (a byte there is damage as well) */
        uint64_t pad = kpk_extent_padded_len(f, x) - x->stored_len;
        memset(out, 0, pad < CHUNK ? pad : CHUNK);
        for (uint64_t at = 0; at < pad; at += CHUNK) {
            uint64_t len = pad - at < CHUNK ? pad - at : CHUNK;
            if (write_stored(f, fds, i, x->stored_len + at, out, len)) { fail(r, 0, "writing %s: %s", d, strerror(errno)); goto out; }
        }
    }
    rc = 0;
out:
    XXH3_freeState(rs);
    XXH3_freeState(ss);
    return rc;
}

int kp_repair(kpk_file *f, const char *src_dir, const uint32_t *bad, size_t n, int threads, int quiet, int *damage,
              char *err, size_t errlen)
{
    struct repair r;
    kr_recipe rc = {0};
    kp_options opt;
    struct pipe pp;
    kpk_encoder *enc = NULL;
    uint8_t *raw = NULL, *out = NULL;
    int *fds = NULL, rcode = -1, recipe_damaged = 0;
    size_t mlen;
    const char *m = kpk_manifest(f, &mlen);

    memset(&r, 0, sizeof r);
    memset(&pp, 0, sizeof pp);
    r.f = f;
    r.err = err;
    r.errlen = errlen;
    r.man = json_loadb(m, mlen, 0, NULL);
    if (!json_is_object(r.man)) { fail(&r, 1, "the file's manifest is not JSON: its provenance is unknown"); goto out; }
    if (options_of(&r, &opt)) goto out;
    if (ks_open(src_dir, NULL, &r.src, err, errlen)) { r.damage = 0; ks_free(&r.src); goto out; }
    r.have_src = 1;
    if (check_shards(&r)) goto out;
    if (!ks_ok(&r.src)) {
        const char *what = r.src.n_general && r.src.general[0] ? r.src.general[0] : "";
        for (size_t k = 0; !*what && k < r.src.n_shards; k++)
            if (r.src.shards[k].n_problems && r.src.shards[k].problems[0]) what = r.src.shards[k].problems[0];
        if (ks_io_errno(&r.src)) /* unreadable: an I/O error (exit 2), not a verdict on the download */
            fail(&r, 0, "%s could not be read (%s); fix the cause and rerun", src_dir, what);
        else fail(&r, 1, "%s is not a complete, intact Kimi K3 checkpoint (%s; run kpack check-source on it)", src_dir, what);
        goto out;
    }
    r.in.src = &r.src;
    r.in.cfg = &r.src.cfg;
    r.in.schema = &r.src.schema;
    r.in.threads = threads;
    if (kr_recipe_load(f, &rc, &recipe_damaged, err, errlen) == 0) {
        if (archive_of(&r, &rc)) goto out;
        r.in.arch = &r.arch;
    } else if (recipe_damaged) {
        r.damage = 1;
        goto out;
    }
    if (kp_plan_build(&r.in, &opt, kpk_path(f), "kpack " , &r.plan, err, errlen)) goto out;
    r.have_plan = 1;
    if (same_layout(&r) || check_hashes(&r, bad, n, threads, quiet)) goto out;

    pp.in = &r.in;
    pp.p = &r.plan;
    raw = malloc(CHUNK > r.plan.max_cut ? CHUNK : r.plan.max_cut);
    out = malloc(kpk_encode_bound(CHUNK > r.plan.max_cut ? CHUNK : r.plan.max_cut));
    enc = kp_encoder_new(&opt.codec);
    fds = malloc(sizeof *fds * kpk_member_count(f));
    if (!raw || !out || !enc || !fds) { fail(&r, 0, "out of memory"); goto out; }
    for (uint16_t k = 0; k < kpk_member_count(f); k++) fds[k] = -1;
    if (kp_sources_open(&pp, err, errlen)) goto out;
    /* every damaged extent made again and checked, in memory: nothing is written unless all pass */
    for (size_t k = 0; k < n; k++)
        if (remake(&r, &pp, bad[k], enc, raw, out, NULL)) goto out;
    for (uint16_t k = 0; k < kpk_member_count(f); k++)
        if ((fds[k] = open(kpk_member_path(f, k), O_RDWR | O_CLOEXEC)) < 0) {
            fail(&r, 0, "cannot open %s for writing: %s", kpk_member_path(f, k), strerror(errno));
            goto out;
        }
    for (size_t k = 0; k < n; k++)
        if (remake(&r, &pp, bad[k], enc, raw, out, fds)) goto out;
    for (uint16_t k = 0; k < kpk_member_count(f); k++)
        if (fsync(fds[k])) { fail(&r, 0, "fsync %s: %s", kpk_member_path(f, k), strerror(errno)); goto out; }
    rcode = 0;
out:
    *damage = r.damage;
    kp_sources_close(&pp);
    for (uint16_t k = 0; fds && k < kpk_member_count(f); k++)
        if (fds[k] >= 0) close(fds[k]);
    free(fds);
    free(raw);
    free(out);
    kpk_encoder_free(enc);
    if (r.have_plan) kp_plan_free(&r.plan);
    ka_free(&r.arch);
    kr_recipe_free(&rc);
    if (r.have_src) ks_free(&r.src);
    json_decref(r.man);
    return rcode;
}
