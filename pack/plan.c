/* Planning the KPK file or set (docs/FORMAT.md §2, §6, §7). */
#include "plan.h"

#include "archive.h"
#include "drafter.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>
#include <zstd.h>

const char *kp_order_name(int order) { return order == KPK_ORDER_TRUNK_FIRST ? "trunk-first" : "layer-major"; }

void kp_plan_free(kp_plan *p)
{
    for (uint32_t m = 0; p->members && m < p->n_members; m++) {
        free(p->members[m].path);
        free(p->members[m].partial);
        free(p->members[m].rel);
        free(p->members[m].dir);
    }
    free(p->members);
    free(p->extents);
    free(p->origin);
    free(p->tensors);
    free(p->from);
    free(p->names);
    free(p->name_off);
    free(p->manifest);
    free(p->cuts);
    free(p->blocks);
    memset(p, 0, sizeof *p);
}

/* ---- output files ------------------------------------------------------------ */

/* The directory part of a path ("." for a bare name). */
static char *dir_of(const char *path)
{
    const char *s = strrchr(path, '/');
    if (!s) return strdup(".");
    if (s == path) return strdup("/");
    return strndup(path, (size_t)(s - path));
}

/* The components of an absolute path ("/a/b/c" -> a, b, c), in place. */
static size_t components(char *path, char **out, size_t max)
{
    size_t n = 0;
    char *save = NULL;
    for (char *c = strtok_r(path, "/", &save); c && n < max; c = strtok_r(NULL, "/", &save)) out[n++] = c;
    return n;
}

/* target relative to the directory base (both absolute and canonical):
 * "../" for each component of base after the common ones, then the rest of
 * target ("/a/b", "/a/c/f" -> "../c/f"). */
static char *relpath(const char *base, const char *target)
{
    char *b = strdup(base), *t = strdup(target), *bc[512], *tc[512], *out = NULL;
    size_t nb, nt, common = 0, len = 1;
    if (!b || !t) goto done;
    nb = components(b, bc, 512);
    nt = components(t, tc, 512);
    while (common < nb && common < nt && strcmp(bc[common], tc[common]) == 0) common++;
    for (size_t i = common; i < nt; i++) len += strlen(tc[i]) + 1;
    len += 3 * (nb - common);
    if (!(out = malloc(len))) goto done;
    out[0] = 0;
    for (size_t i = common; i < nb; i++) strcat(out, "../");
    for (size_t i = common; i < nt; i++) {
        strcat(out, tc[i]);
        if (i + 1 < nt) strcat(out, "/");
    }
done:
    free(b);
    free(t);
    return out;
}

/* Member k's files: DIR/NAME, DIR/NAME.partial, the path relative to the
 * entry's directory. */
static int set_member(kp_member *m, const char *dir, const char *name, const char *entry_real_dir, char *err, size_t errlen)
{
    char *real = realpath(dir, NULL), *abs = NULL;
    if (!real) { snprintf(err, errlen, "%s: %s", dir, strerror(errno)); return -1; }
    if (asprintf(&m->path, "%s/%s", dir, name) < 0) m->path = NULL;
    if (asprintf(&m->partial, "%s/%s.partial", dir, name) < 0) m->partial = NULL;
    if (asprintf(&abs, "%s/%s", real, name) < 0) abs = NULL;
    m->dir = strdup(dir);
    m->rel = abs && entry_real_dir ? relpath(entry_real_dir, abs) : strdup("");
    free(real);
    free(abs);
    if (!m->path || !m->partial || !m->dir || !m->rel) { snprintf(err, errlen, "out of memory"); return -1; }
    if (strlen(m->rel) > KPK_MAX_PATH) { snprintf(err, errlen, "%s: path longer than %u bytes", m->path, KPK_MAX_PATH); return -1; }
    return 0;
}

static int plan_members(kp_plan *p, const char *out, char *err, size_t errlen)
{
    const kp_options *o = &p->opt;
    char *odir = dir_of(out), *real = odir ? realpath(odir, NULL) : NULL, *name;
    const char *base = strrchr(out, '/') ? strrchr(out, '/') + 1 : out;
    uint16_t m = 0;
    int rc = -1;
    p->n_members = (uint16_t)(1 + (o->trunk_dir != NULL) + o->n_stripe);
    p->n_stripe = o->machines ? 0 : o->n_stripe;
    p->members = calloc(p->n_members, sizeof *p->members);
    if (!odir || !p->members) { snprintf(err, errlen, "out of memory"); goto out; }
    if (!real) { snprintf(err, errlen, "%s: %s", odir, strerror(errno)); goto out; }
    /* the entry: OUT itself */
    p->members[0].role = KPK_ROLE_ENTRY;
    p->members[0].stripe_index = KPK_NO_STRIPE;
    if (set_member(&p->members[0], odir, base, NULL, err, errlen)) goto out;
    m = 1;
    if (o->trunk_dir) {
        if (asprintf(&name, "%s.trunk", base) < 0) { snprintf(err, errlen, "out of memory"); goto out; }
        p->members[m].role = KPK_ROLE_PLAIN;
        p->members[m].stripe_index = KPK_NO_STRIPE;
        rc = set_member(&p->members[m++], o->trunk_dir, name, real, err, errlen);
        free(name);
        if (rc) goto out;
        rc = -1;
    }
    for (uint16_t k = 0; k < o->n_stripe; k++) {
        /* --machines: NAME.m<machine>.<disk>, whole extents in each (plain members) */
        int rn = o->machines ? asprintf(&name, "%s.m%u.%u", base, k / (o->n_stripe / o->machines), k % (o->n_stripe / o->machines))
                             : asprintf(&name, "%s.s%u", base, k);
        if (rn < 0) { snprintf(err, errlen, "out of memory"); goto out; }
        p->members[m].role = o->machines ? KPK_ROLE_PLAIN : KPK_ROLE_STRIPE;
        p->members[m].stripe_index = o->machines ? KPK_NO_STRIPE : k;
        rc = set_member(&p->members[m++], o->stripe_dirs[k], name, real, err, errlen);
        free(name);
        if (rc) goto out;
        rc = -1;
    }
    if (p->n_stripe) {
        p->stripe_unit = o->stripe_unit ? o->stripe_unit : KP_DEFAULT_STRIPE_UNIT;
        if (p->stripe_unit < o->align) p->stripe_unit = o->align;
    }
    rc = 0;
out:
    free(odir);
    free(real);
    return rc;
}

/* Which file an extent of this kind goes to (how kpack uses the roles, §7.1):
 * globals and trunks to the trunk member, else with the experts to the stripe
 * space, else the entry; meta and archive stay in the entry. */
static uint16_t target_of(const kp_plan *p, int kind, uint32_t layer, uint32_t expert, uint32_t n_layers)
{
    int trunkish = kind == KPK_KIND_GLOBALS || kind == KPK_KIND_TRUNK;
    if (trunkish && p->opt.trunk_dir) return 1;
    if (p->opt.machines && (trunkish || kind == KPK_KIND_EXPERT)) {
        /* laid out for N machines: members first .. first + K - 1, machine m's disks m K/N .. */
        const uint32_t K = p->opt.n_stripe, per = K / p->opt.machines, first = 1 + (p->opt.trunk_dir != NULL);
        if (kind == KPK_KIND_EXPERT) return (uint16_t)(first + (expert + layer) % K);
        if (kind == KPK_KIND_GLOBALS) return (uint16_t)first;
        return (uint16_t)(first + (layer * p->opt.machines / n_layers) * per + layer % per);
    }
    if ((trunkish || kind == KPK_KIND_EXPERT) && p->n_stripe) return KPK_STRIPED;
    return 0;
}

/* ---- extents and tensors ----------------------------------------------------- */

struct builder {
    const kp_input *in;
    kp_plan *p;
    uint64_t cap_names, cap_tensors;
    uint32_t cap_extents;
};

static int add_name(struct builder *b, const char *name, uint32_t *off)
{
    size_t n = strlen(name);
    kp_plan *p = b->p;
    if (p->names_len + n + 1 > b->cap_names) {
        uint64_t cap = b->cap_names ? b->cap_names * 2 : 1 << 20;
        char *q;
        while (cap < p->names_len + n + 1) cap *= 2;
        q = realloc(p->names, cap);
        if (!q) return -1;
        p->names = q;
        b->cap_names = cap;
    }
    if (p->names_len > UINT32_MAX - n - 1) return -1;
    *off = (uint32_t)p->names_len;
    memcpy(p->names + p->names_len, name, n + 1);
    p->names_len += n + 1;
    return 0;
}

static kpk_extent *begin_extent(struct builder *b, int kind, uint32_t layer, uint32_t expert)
{
    kp_plan *p = b->p;
    kpk_extent *x;
    if (p->n_extents == b->cap_extents) {
        uint32_t cap = b->cap_extents ? b->cap_extents * 2 : 1024;
        kpk_extent *e = realloc(p->extents, sizeof *e * cap);
        kp_origin *o = realloc(p->origin, sizeof *o * cap);
        if (e) p->extents = e;
        if (o) p->origin = o;
        if (!e || !o) return NULL;
        b->cap_extents = cap;
    }
    x = &p->extents[p->n_extents];
    memset(x, 0, sizeof *x);
    p->origin[p->n_extents].extent = UINT32_MAX;
    p->origin[p->n_extents].identical = 0;
    p->origin[p->n_extents].expect_xxh3 = 0;
    p->n_extents++;
    x->kind = (uint8_t)kind;
    x->layer = layer;
    x->expert = expert;
    x->codec = KPK_CODEC_NONE;
    /* a drafter (no model config) has no trunk or experts: its extents stay in the entry file */
    x->member = target_of(p, kind, layer, expert, b->in->cfg ? (uint32_t)b->in->cfg->n_layers : 1);
    x->first_tensor = (uint32_t)p->n_tensors;
    return x;
}

/* Append one tensor to the current extent at the next 64-byte boundary. */
static int add_tensor(struct builder *b, kpk_extent *x, const char *name, int dtype, int ndim, const uint64_t *shape,
                      uint64_t nbytes, kp_source_ref from)
{
    kp_plan *p = b->p;
    kpk_tensor *t;
    uint32_t off;
    if (p->n_tensors == b->cap_tensors) {
        uint64_t cap = b->cap_tensors ? b->cap_tensors * 2 : 4096;
        kpk_tensor *nt = realloc(p->tensors, sizeof *nt * cap);
        kp_source_ref *nf = realloc(p->from, sizeof *nf * cap);
        uint32_t *no = realloc(p->name_off, sizeof *no * cap);
        if (nt) p->tensors = nt;
        if (nf) p->from = nf;
        if (no) p->name_off = no;
        if (!nt || !nf || !no) return -1;
        b->cap_tensors = cap;
    }
    if (add_name(b, name, &off)) return -1;
    t = &p->tensors[p->n_tensors];
    memset(t, 0, sizeof *t);
    t->name_len = (uint32_t)strlen(name);
    t->dtype = (uint8_t)dtype;
    t->ndim = (uint8_t)ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
    t->extent = p->n_extents - 1;
    t->offset = kpk_round_up(x->raw_len, KPK_TENSOR_ALIGN);
    t->nbytes = nbytes;
    x->raw_len = t->offset + nbytes;
    p->name_off[p->n_tensors] = off;
    p->from[p->n_tensors] = from;
    p->n_tensors++;
    x->tensor_count++;
    return 0;
}

/* A tensor of the source KPK file, by name: its record and its extent. */
static int add_kpk_tensor(struct builder *b, kpk_extent *x, const kpk_tensor *t, uint32_t src_extent)
{
    kp_source_ref from = {.shard = KP_FROM_KPK, .extra = src_extent, .offset = t->offset};
    return add_tensor(b, x, t->name, t->dtype, t->ndim, t->shape, t->nbytes, from);
}

/* After a KPK source's extent is rebuilt: is it laid out like the source
 * extent (same tensors at the same offsets, same length)?  Then its bytes are
 * the source's decoded bytes, copied whole and checked against raw_xxh3. */
static void end_extent(struct builder *b, kpk_extent *x)
{
    kp_plan *p = b->p;
    kp_origin *o = &p->origin[p->n_extents - 1];
    p->data_bytes += x->raw_len;
    if (x->raw_len > p->largest_extent || p->n_extents == 1) {
        p->largest_extent = x->raw_len;
        p->largest_extent_index = p->n_extents - 1;
    }
    if (b->in->kpk && x->tensor_count) {
        const kpk_extent *s;
        o->extent = p->from[x->first_tensor].extra;
        s = kpk_extent_at(b->in->kpk, o->extent);
        o->identical = s->raw_len == x->raw_len && s->tensor_count == x->tensor_count;
        for (uint64_t i = 0; o->identical && i < x->tensor_count; i++) {
            const kpk_tensor *t = &p->tensors[x->first_tensor + i];
            const kp_source_ref *f = &p->from[x->first_tensor + i];
            o->identical = f->extra == o->extent && f->offset == t->offset;
        }
        o->expect_xxh3 = s->raw_xxh3;
    }
}

/* One tensor of the model: from the shards, or from the source KPK file by name. */
static int add_schema_tensor(struct builder *b, kpk_extent *x, k3_role role, int L, int e)
{
    const kp_input *in = b->in;
    k3_tensor_spec spec;
    if (k3_schema_spec(in->cfg, role, L, e, &spec)) return -1;
    if (in->kpk) {
        kpk_tensor t;
        if (kpk_find_tensor(in->kpk, spec.name, &t) < 0) return -1; /* the caller checked the file whole */
        return add_kpk_tensor(b, x, &t, t.extent);
    }
    {
        const st_tensor *st;
        const ks_shard *sh;
        kp_source_ref from;
        st = ks_tensor(in->src, k3_schema_index(in->schema, role, L, e), &sh);
        if (!st) return -1; /* the caller checked coverage */
        from.shard = (uint32_t)(sh - in->src->shards);
        from.extra = 0;
        from.offset = st->begin;
        return add_tensor(b, x, spec.name, st->dtype, st->ndim, st->shape, st->end - st->begin, from);
    }
}

static int add_trunk(struct builder *b, int L)
{
    k3_role roles[K3T_COUNT];
    int n = k3_schema_layer_roles(b->in->cfg, L, roles);
    kpk_extent *x = begin_extent(b, KPK_KIND_TRUNK, (uint32_t)L, KPK_NONE);
    if (!x) return -1;
    for (int i = 0; i < n; i++)
        if (add_schema_tensor(b, x, roles[i], L, -1)) return -1;
    end_extent(b, x);
    return 0;
}

static int add_experts(struct builder *b, int L)
{
    if (!k3_layer_is_moe(b->in->cfg, L)) return 0;
    for (int e = 0; e < b->in->cfg->n_experts; e++) {
        kpk_extent *x = begin_extent(b, KPK_KIND_EXPERT, (uint32_t)L, (uint32_t)e);
        if (!x) return -1;
        for (int r = K3T_EXP_W1_PACKED; r <= K3T_EXP_W3_SCALE; r++)
            if (add_schema_tensor(b, x, (k3_role)r, L, e)) return -1;
        end_extent(b, x);
    }
    return 0;
}

/* A drafter (FORMAT.md §15): its weights, then its embedding, each in roster order. */
static int add_drafter(struct builder *b)
{
    const kd_source *d = b->in->drafter;
    const st_file *st = &d->src.shards[0].st;
    for (uint32_t part = 0; part < 2; part++) {
        kpk_extent *x = begin_extent(b, KPK_KIND_DRAFTER, part, KPK_NONE);
        if (!x) return -1;
        for (int i = 0; i < k3e_count(&d->cfg); i++) {
            const st_tensor *t = &st->t[d->loc[i]];
            k3e_spec s;
            k3e_at(&d->cfg, i, &s);
            if (s.part != (int)part) continue;
            if (add_tensor(b, x, s.name, t->dtype, t->ndim, t->shape, t->end - t->begin, (kp_source_ref){0, 0, t->begin})) return -1;
        }
        end_extent(b, x);
    }
    return 0;
}

/* The meta extent: the small files, verbatim (a KPK source: its meta extent's). */
static int add_meta(struct builder *b)
{
    const kp_input *in = b->in;
    kpk_extent *x = begin_extent(b, KPK_KIND_META, KPK_NONE, KPK_NONE);
    if (!x) return -1;
    if (in->kpk) {
        const kpk_extent *s = kpk_extent_at(in->kpk, (uint32_t)kpk_find_meta(in->kpk));
        for (uint64_t i = s->first_tensor; i < (uint64_t)s->first_tensor + s->tensor_count; i++) {
            kpk_tensor t;
            kpk_tensor_at(in->kpk, i, &t);
            if (add_kpk_tensor(b, x, &t, (uint32_t)kpk_find_meta(in->kpk))) return -1;
        }
    } else {
        for (size_t i = 0; i < in->src->n_extras; i++) {
            char name[128];
            uint64_t shape[1] = {in->src->extras[i].len};
            kp_source_ref from = {.shard = KP_FROM_EXTRA, .extra = (uint32_t)i, .offset = 0};
            snprintf(name, sizeof name, KPK_META_PREFIX "%s", in->src->extras[i].name);
            if (add_tensor(b, x, name, KPK_DT_BYTES, 1, shape, in->src->extras[i].len, from)) return -1;
        }
    }
    end_extent(b, x);
    return 0;
}

/* A KPK source's archive extents, kept as they are (issue 13: re-layout keeps the archive). */
static int add_kpk_archive(struct builder *b)
{
    kpk_file *f = b->in->kpk;
    for (uint32_t i = 0; i < kpk_extent_count(f); i++) {
        const kpk_extent *s = kpk_extent_at(f, i);
        kpk_extent *x;
        if (s->kind != KPK_KIND_ARCHIVE) continue;
        if (!(x = begin_extent(b, KPK_KIND_ARCHIVE, KPK_NONE, KPK_NONE))) return -1;
        for (uint64_t k = s->first_tensor; k < (uint64_t)s->first_tensor + s->tensor_count; k++) {
            kpk_tensor t;
            kpk_tensor_at(f, k, &t);
            if (add_kpk_tensor(b, x, &t, i)) return -1;
        }
        end_extent(b, x);
    }
    return 0;
}

static const st_tensor *by_begin_base;
static int cmp_begin(const void *a, const void *b)
{
    const st_tensor *x = &by_begin_base[*(const size_t *)a], *y = &by_begin_base[*(const size_t *)b];
    return (x->begin > y->begin) - (x->begin < y->begin);
}

/* Shard F's archive extent (§9.1): its header, then, in file order, the
 * byte ranges no tensor covers (gaps) and its non-text tensors. */
static int add_shard_archive(struct builder *b, uint32_t si)
{
    const ks_shard *sh = &b->in->src->shards[si];
    const st_file *st = &sh->st;
    kpk_extent *x = begin_extent(b, KPK_KIND_ARCHIVE, KPK_NONE, KPK_NONE);
    size_t *order = malloc(sizeof *order * (st->n + 1));
    uint64_t covered = st->data_start; /* the data region is [data_start, size) */
    char name[KPK_MAX_NAME + 1];
    int rc = -1;
    if (!x || !order) goto out;
    {
        uint64_t shape[1] = {st->data_start};
        kp_source_ref from = {.shard = si, .extra = 0, .offset = 0};
        snprintf(name, sizeof name, "archive/shards/%s/header", sh->name);
        if (add_tensor(b, x, name, KPK_DT_BYTES, 1, shape, st->data_start, from)) goto out;
    }
    for (size_t i = 0; i < st->n; i++) order[i] = i;
    /* one thread plans: the comparator's base is not shared */
    by_begin_base = st->t;
    qsort(order, st->n, sizeof *order, cmp_begin);
    for (size_t k = 0; k <= st->n; k++) {
        const st_tensor *t = k < st->n ? &st->t[order[k]] : NULL;
        uint64_t next = t ? t->begin : sh->size;
        if (next > covered) { /* a gap */
            uint64_t shape[1] = {next - covered};
            kp_source_ref from = {.shard = si, .extra = 0, .offset = covered};
            snprintf(name, sizeof name, "archive/shards/%s/gap/%llu", sh->name, (unsigned long long)covered);
            if (add_tensor(b, x, name, KPK_DT_BYTES, 1, shape, next - covered, from)) goto out;
        }
        if (!t) break;
        if (t->end > covered) covered = t->end;
        /* a drafter's every tensor is in its roster (drafter.c checked it): nothing else to keep */
        if (!b->in->drafter && k3_schema_classify(b->in->cfg, t->name, &(k3_tensor_spec){0}, NULL, 0) == K3_CLASS_DROPPED) {
            kp_source_ref from = {.shard = si, .extra = 0, .offset = t->begin};
            uint64_t nbytes = t->end - t->begin, flat[1] = {nbytes};
            /* its dtype and shape when a KPK tensor can say them (F32, BF16, F16, U8 in 1 to 4
             * dimensions), else its bytes: BYTES [nbytes] (FORMAT.md §9.1) */
            int keep_shape = t->dtype != 0 && t->ndim >= 1 && t->ndim <= 4;
            if (add_tensor(b, x, t->name, keep_shape ? t->dtype : KPK_DT_BYTES, keep_shape ? t->ndim : 1,
                           keep_shape ? t->shape : flat, nbytes, from))
                goto out;
        }
    }
    end_extent(b, x);
    rc = 0;
out:
    free(order);
    return rc;
}

/* The archive (§9): a KPK source's, or from the download: one extent of the
 * kept small files, then one per shard. */
static int add_archive(struct builder *b)
{
    const ka_archive *a = b->in->arch;
    if (b->in->kpk) return add_kpk_archive(b);
    if (!a) return 0;
    if (a->n_files) {
        kpk_extent *x = begin_extent(b, KPK_KIND_ARCHIVE, KPK_NONE, KPK_NONE);
        char name[KPK_MAX_NAME + 64];
        if (!x) return -1;
        for (size_t i = 0; i < a->n_files; i++) {
            uint64_t shape[1] = {a->files[i].size};
            kp_source_ref from = {.shard = KP_FROM_FILE, .extra = (uint32_t)i, .offset = 0};
            snprintf(name, sizeof name, "archive/files/%s", a->files[i].name);
            if (add_tensor(b, x, name, KPK_DT_BYTES, 1, shape, a->files[i].size, from)) return -1;
        }
        end_extent(b, x);
    }
    for (uint32_t si = 0; si < b->in->src->n_shards; si++)
        if (add_shard_archive(b, si)) return -1;
    return 0;
}

/* The recipe's list (§9.2): every file kept, sorted by name, and what is not. */
static json_t *archive_json(const kp_input *in)
{
    const k3_source *src = in->src;
    const ka_archive *a = in->arch;
    json_t *o = json_object(), *files = json_array(), *nk = json_array();
    size_t i = 0, k = 0;
    /* merge the two sorted lists: small files and shards */
    while (i < a->n_files || k < src->n_shards) {
        int file = k == src->n_shards || (i < a->n_files && strcmp(a->files[i].name, src->shards[k].name) < 0);
        json_t *f = json_object();
        const char *got = file ? a->files[i].got_sha : src->shards[k].got_sha;
        const char *want = file ? a->files[i].expect_sha : src->shards[k].expect_sha;
        const char *from = file ? a->files[i].sha_from : src->shards[k].sha_from;
        int verified = got[0] && strcmp(got, want) == 0;
        json_object_set_new(f, "name", json_string(file ? a->files[i].name : src->shards[k].name));
        json_object_set_new(f, "kind", json_string(file ? "file" : "safetensors"));
        json_object_set_new(f, "size", json_integer((json_int_t)(file ? a->files[i].size : src->shards[k].size)));
        json_object_set_new(f, "sha256", verified ? json_string(got) : json_null());
        json_object_set_new(f, "sha256_from", verified && from ? json_string(from) : json_null());
        json_array_append_new(files, f);
        if (file) i++;
        else k++;
    }
    for (size_t j = 0; j < a->n_not_kept; j++) {
        json_t *f = json_object();
        json_object_set_new(f, "name", json_string(a->not_kept[j].name));
        json_object_set_new(f, "size", json_integer((json_int_t)a->not_kept[j].size));
        json_object_set_new(f, "reason", json_string(a->not_kept[j].reason));
        json_array_append_new(nk, f);
    }
    json_object_set_new(o, "files", files);
    json_object_set_new(o, "not_kept", nk);
    return o;
}

/* ---- the manifest (§10) -------------------------------------------------------- */

static json_t *options_json(const kp_plan *p)
{
    json_t *o = json_object();
    json_object_set_new(o, "align", json_integer(p->opt.align));
    json_object_set_new(o, "compress", json_string(kp_compress_name(p->opt.codec.compress)));
    if (p->opt.codec.compress != KP_COMPRESS_NONE) {
        /* what decides the stored bytes (a later zstd may code differently) */
        json_t *c = json_object();
        char v[32];
        snprintf(v, sizeof v, "%u.%u.%u", ZSTD_versionNumber() / 10000, ZSTD_versionNumber() / 100 % 100,
                 ZSTD_versionNumber() % 100);
        json_object_set_new(c, "block_size", json_integer(p->opt.codec.block_size));
        json_object_set_new(c, "level", json_integer(p->opt.codec.level));
        json_object_set_new(c, "literal_level", json_integer(p->opt.codec.literal_level));
        json_object_set_new(c, "min_saving_percent", json_integer((json_int_t)(p->opt.codec.min_saving * 100 + 0.5)));
        json_object_set_new(c, "zstd", json_string(v));
        json_object_set_new(o, "codec", c);
    }
    json_object_set_new(o, "order", json_string(kp_order_name(p->opt.order)));
    if (p->n_stripe) {
        json_t *s = json_object();
        json_object_set_new(s, "members", json_integer(p->n_stripe));
        json_object_set_new(s, "unit", json_integer(p->stripe_unit));
        json_object_set_new(o, "stripe", s);
    } else {
        json_object_set_new(o, "stripe", json_null());
    }
    json_object_set_new(o, "trunk_member", p->opt.trunk_dir ? json_integer(1) : json_null());
    return o;
}

/* From shards: the source files and what was dropped.  From a KPK file: its
 * manifest, keeping "source", "dropped" and "archive" (the provenance is the
 * original download's), with this conversion's format, producer and options. */
static char *build_manifest(const kp_input *in, const kp_plan *p, const char *producer)
{
    json_t *m;
    char *text;
    if (in->kpk) {
        size_t len;
        const char *old = kpk_manifest(in->kpk, &len);
        m = json_loadb(old, len, 0, NULL);
        if (!m || !json_is_object(m)) { json_decref(m); m = json_object(); }
        if (!json_object_get(m, "source")) {
            json_t *s = json_object();
            json_object_set_new(s, "layout", json_string("kpk"));
            json_object_set_new(s, "files", json_array());
            json_object_set_new(m, "source", s);
        }
    } else {
        const k3_source *src = in->src;
        json_t *files = json_array(), *dropped = json_array(), *d = json_object(), *srcj = json_object();
        m = json_object();
        for (size_t i = 0; i < src->n_shards; i++) {
            const ks_shard *s = &src->shards[i];
            json_t *f = json_object();
            json_object_set_new(f, "name", json_string(s->name));
            json_object_set_new(f, "size", json_integer((json_int_t)s->size));
            json_object_set_new(f, "tensors", json_integer((json_int_t)s->n_tensors));
            /* Only a hash we computed and checked is recorded. */
            json_object_set_new(f, "sha256", s->got_sha[0] && strcmp(s->got_sha, s->expect_sha) == 0
                                                 ? json_string(s->got_sha) : json_null());
            json_array_append_new(files, f);
        }
        json_object_set_new(srcj, "layout", json_string(src->single_file ? "single-file" : src->hf_snapshot ? "hf-snapshot" : "sharded"));
        json_object_set_new(srcj, "files", files);
        json_object_set_new(m, "source", srcj);
        if (in->arch) {
            json_object_set_new(m, "archive", archive_json(in));
            json_decref(dropped);
            json_decref(d);
        } else {
            for (size_t i = 0; i < src->n_dropped; i++) json_array_append_new(dropped, json_string(src->dropped[i]));
            json_object_set_new(d, "reason", json_string("non-text tensors (vision tower, projector) are not used by text inference"));
            json_object_set_new(d, "count", json_integer((json_int_t)src->n_dropped));
            json_object_set_new(d, "bytes", json_integer((json_int_t)src->dropped_bytes));
            json_object_set_new(d, "names", dropped);
            json_object_set_new(m, "dropped", d);
        }
    }
    if (in->drafter) json_object_set_new(m, "drafter", kd_manifest_json(in->drafter));
    json_object_set_new(m, "format", json_string(in->drafter ? "KPK 1.2" : "KPK 1.1"));
    json_object_set_new(m, "producer", json_string(producer));
    json_object_set_new(m, "options", options_json(p));
    text = json_dumps(m, JSON_INDENT(1) | JSON_SORT_KEYS);
    json_decref(m);
    return text;
}

/* ---- the plan id --------------------------------------------------------------- */

static void hash_u64(XXH3_state_t *st, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    XXH3_64bits_update(st, b, 8);
}

static void hash_str(XXH3_state_t *st, const char *s) { XXH3_64bits_update(st, s, strlen(s) + 1); }

/* Everything the output bytes depend on: options, members, extents and
 * targets, tensors and where each comes from, the source files' identity
 * (name, size, mtime), the embedded files and the manifest. */
static uint64_t compute_plan_id(const kp_input *in, const kp_plan *p)
{
    XXH3_state_t *st = XXH3_createState();
    uint64_t id;
    if (!st) return 0;
    XXH3_64bits_reset(st);
    hash_str(st, "kpack plan 2");
    hash_u64(st, p->opt.align);
    hash_u64(st, (uint64_t)p->opt.order);
    hash_u64(st, p->stripe_unit);
    hash_u64(st, (uint64_t)p->opt.codec.compress);
    hash_u64(st, p->opt.codec.block_size);
    hash_u64(st, (uint64_t)(int64_t)p->opt.codec.level);
    hash_u64(st, (uint64_t)(int64_t)p->opt.codec.literal_level);
    hash_u64(st, (uint64_t)(p->opt.codec.min_saving * 1e6));
    hash_u64(st, p->opt.codec.compress ? ZSTD_versionNumber() : 0); /* another zstd may code other bytes */
    for (uint64_t b = 0; b < p->n_blocks; b++) {
        hash_u64(st, p->cuts[b].raw_off);
        hash_u64(st, p->cuts[b].raw_len);
        hash_u64(st, p->cuts[b].cls);
    }
    for (uint32_t m = 0; m < p->n_members; m++) {
        hash_u64(st, p->members[m].role);
        hash_u64(st, p->members[m].stripe_index);
        hash_str(st, p->members[m].rel);
    }
    hash_u64(st, p->n_extents);
    for (uint32_t i = 0; i < p->n_extents; i++) {
        uint8_t rec[KPK_EXTENT_RECORD_SIZE];
        kpk_extent_encode(&p->extents[i], rec);
        XXH3_64bits_update(st, rec, sizeof rec);
        hash_u64(st, p->origin[i].extent);
        hash_u64(st, p->origin[i].expect_xxh3);
    }
    for (uint64_t t = 0; t < p->n_tensors; t++) {
        uint8_t rec[KPK_TENSOR_RECORD_SIZE];
        kpk_tensor_encode(&p->tensors[t], p->name_off[t], rec);
        XXH3_64bits_update(st, rec, sizeof rec);
        hash_u64(st, p->from[t].shard);
        hash_u64(st, p->from[t].extra);
        hash_u64(st, p->from[t].offset);
    }
    XXH3_64bits_update(st, p->names, p->names_len);
    if (in->src) {
        for (size_t i = 0; i < in->src->n_shards; i++) {
            const ks_shard *s = &in->src->shards[i];
            hash_str(st, s->name);
            hash_u64(st, s->size);
            hash_u64(st, (uint64_t)s->mtime_ns);
        }
        for (size_t i = 0; i < in->src->n_extras; i++) XXH3_64bits_update(st, in->src->extras[i].data, in->src->extras[i].len);
        for (size_t i = 0; in->arch && i < in->arch->n_files; i++) {
            hash_str(st, in->arch->files[i].name);
            hash_u64(st, in->arch->files[i].size);
            hash_u64(st, (uint64_t)in->arch->files[i].mtime_ns);
        }
    } else {
        hash_u64(st, kpk_super(in->kpk)->set_id);
        for (uint16_t m = 0; m < kpk_member_count(in->kpk); m++) {
            struct stat s;
            hash_str(st, kpk_member_path(in->kpk, m));
            if (fstat(kpk_member_fd(in->kpk, m), &s) == 0) {
                hash_u64(st, (uint64_t)s.st_size);
                hash_u64(st, (uint64_t)s.st_mtim.tv_sec * 1000000000u + (uint64_t)s.st_mtim.tv_nsec);
            }
        }
    }
    XXH3_64bits_update(st, p->manifest, p->manifest_len);
    id = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return id;
}

/* ---- codec-2 blocks ---------------------------------------------------------- */

/* Extents of the kinds --compress names are stored as blocks, cut here:
 * first_block of every extent, the cuts, room for the block records. */
static int plan_blocks(kp_plan *p, char *err, size_t errlen)
{
    uint64_t cap = 0;
    for (int c = 0; c < KP_BC_COUNT; c++) p->est_ratio[c] = 1.0;
    for (uint32_t i = 0; i < p->n_extents; i++) {
        kpk_extent *x = &p->extents[i];
        kp_cut *c;
        uint32_t n;
        x->first_block = (uint32_t)p->n_blocks;
        if (!kp_kind_compressed(&p->opt.codec, x->kind) || x->raw_len == 0) continue;
        if (kp_cut_blocks(&p->opt.codec, p->tensors + x->first_tensor, x->tensor_count, x->raw_len, &c, &n, err, errlen)) return -1;
        if (p->n_blocks + n > KPK_MAX_BLOCKS) { free(c); snprintf(err, errlen, "more than %u blocks: use a larger --block-size", KPK_MAX_BLOCKS); return -1; }
        if (p->n_blocks + n > cap) {
            kp_cut *g;
            cap = (p->n_blocks + n) * 2;
            if (!(g = realloc(p->cuts, sizeof *g * cap))) { free(c); snprintf(err, errlen, "out of memory"); return -1; }
            p->cuts = g;
        }
        for (uint32_t k = 0; k < n; k++)
            if (c[k].raw_len > p->max_cut) p->max_cut = c[k].raw_len;
        memcpy(p->cuts + p->n_blocks, c, sizeof *c * n);
        free(c);
        x->codec = KPK_CODEC_BLOCKS;
        p->n_blocks += n;
    }
    if (p->n_blocks && !(p->blocks = calloc(p->n_blocks, sizeof *p->blocks))) { snprintf(err, errlen, "out of memory"); return -1; }
    return 0;
}

/* ---- building ------------------------------------------------------------------ */

/* The model's extents: the globals, then the layers in the order asked for (§6). */
static int add_model(struct builder *b)
{
    const k3_config *c = b->in->cfg;
    static const k3_role globals[] = {K3T_EMBED, K3T_LM_HEAD, K3T_FINAL_NORM, K3T_OUT_RES_NORM, K3T_OUT_RES_PROJ};
    kpk_extent *x = begin_extent(b, KPK_KIND_GLOBALS, KPK_NONE, KPK_NONE);
    if (!x) return -1;
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        if (add_schema_tensor(b, x, globals[i], -1, -1)) return -1;
    end_extent(b, x);
    if (b->p->opt.order == KPK_ORDER_TRUNK_FIRST) {
        for (int L = 0; L < c->n_layers; L++) if (add_trunk(b, L)) return -1;
        for (int L = 0; L < c->n_layers; L++) if (add_experts(b, L)) return -1;
    } else {
        for (int L = 0; L < c->n_layers; L++)
            if (add_trunk(b, L) || add_experts(b, L)) return -1;
    }
    return 0;
}

int kp_plan_build(const kp_input *in, const kp_options *opt, const char *out, const char *producer, kp_plan *p,
                  char *err, size_t errlen)
{
    struct builder b = {.in = in, .p = p};

    memset(p, 0, sizeof *p);
    p->opt = *opt;
    if (in->src && !ks_ok(in->src)) { snprintf(err, errlen, "the source has problems; run kpack check-source"); return -1; }
    if (plan_members(p, out, err, errlen)) { kp_plan_free(p); return -1; }
    if (add_meta(&b)) goto oom;
    if (in->drafter ? add_drafter(&b) : add_model(&b)) goto oom;
    if (add_archive(&b)) goto oom;
    for (uint64_t i = 0; i < p->n_tensors; i++) p->tensors[i].name = p->names + p->name_off[i];
    if (plan_blocks(p, err, errlen)) { kp_plan_free(p); return -1; }

    p->manifest = build_manifest(in, p, producer);
    if (!p->manifest) goto oom;
    p->manifest_len = strlen(p->manifest);
    p->plan_id = compute_plan_id(in, p);
    return 0;
oom:
    snprintf(err, errlen, "out of memory while planning the layout");
    kp_plan_free(p);
    return -1;
}

/* ---- placement and the finished layout ------------------------------------------ */

void kp_cursors_init(const kp_plan *p, uint64_t *cursor)
{
    for (uint32_t t = 0; t < p->n_members; t++) cursor[t] = p->opt.align;
    cursor[p->n_members] = 0;
}

void kp_place(kp_plan *p, uint64_t *cursor, uint32_t i)
{
    kpk_extent *x = &p->extents[i];
    uint32_t t = kp_target(p, x->member);
    x->offset = cursor[t];
    cursor[t] += kpk_round_up(x->stored_len, p->opt.align);
}

void kp_stripe_locate(const kp_plan *p, uint64_t pos, uint16_t *member, uint64_t *off, uint64_t *left)
{
    uint32_t k;
    kpk_stripe_locate(p->stripe_unit, p->n_stripe, p->opt.align, pos, &k, off, left);
    *member = (uint16_t)(p->n_members - p->n_stripe + k); /* stripe members come last, in stripe order */
}

uint64_t kp_member_end(const kp_plan *p, const uint64_t *cursor, uint16_t m)
{
    const kp_member *mb = &p->members[m];
    uint64_t row, c, full, rem, mine;
    if (mb->role != KPK_ROLE_STRIPE) return cursor[m];
    row = (uint64_t)p->stripe_unit * p->n_stripe;
    c = cursor[p->n_members];
    full = c / row;
    rem = c % row;
    mine = rem > (uint64_t)mb->stripe_index * p->stripe_unit ? rem - (uint64_t)mb->stripe_index * p->stripe_unit : 0;
    if (mine > p->stripe_unit) mine = p->stripe_unit;
    return p->opt.align + full * p->stripe_unit + mine;
}

int kp_layout_finish(const kp_plan *p, const uint64_t *cursor, kp_layout *l)
{
    uint64_t at, paths = 0, n_blocks = p->n_blocks;
    memset(l, 0, sizeof *l);
    l->member_size = calloc(p->n_members, sizeof *l->member_size);
    if (!l->member_size) return -1;
    for (uint32_t m = 1; m < p->n_members; m++) paths += strlen(p->members[m].rel) + 1;
    l->strings_len = p->names_len + paths;
    if (p->n_stripe) {
        uint64_t row = (uint64_t)p->stripe_unit * p->n_stripe;
        l->stripe_len = kpk_round_up(cursor[p->n_members], row);
    }
    /* the entry: its extents, then the directory (§2) */
    l->extent_table_off = kpk_round_up(cursor[0], KPK_SECTION_ALIGN);
    l->tensor_table_off = kpk_round_up(l->extent_table_off + (uint64_t)p->n_extents * KPK_EXTENT_RECORD_SIZE, KPK_SECTION_ALIGN);
    l->strings_off = kpk_round_up(l->tensor_table_off + p->n_tensors * KPK_TENSOR_RECORD_SIZE, KPK_SECTION_ALIGN);
    l->manifest_off = kpk_round_up(l->strings_off + l->strings_len, KPK_SECTION_ALIGN);
    at = kpk_round_up(l->manifest_off + p->manifest_len, KPK_SECTION_ALIGN);
    if (p->n_members > 1) {
        l->member_table_off = at;
        at = kpk_round_up(at + (uint64_t)p->n_members * KPK_MEMBER_RECORD_SIZE, KPK_SECTION_ALIGN);
    }
    if (n_blocks) {
        l->block_table_off = at;
        at = kpk_round_up(at + n_blocks * KPK_BLOCK_RECORD_SIZE, KPK_SECTION_ALIGN);
    }
    l->backup_off = at;
    l->member_size[0] = at + KPK_SUPERBLOCK_SIZE;
    for (uint32_t m = 1; m < p->n_members; m++)
        l->member_size[m] = p->members[m].role == KPK_ROLE_STRIPE
                                ? p->opt.align + l->stripe_len / p->n_stripe + KPK_SUPERBLOCK_SIZE
                                : cursor[m] + KPK_SUPERBLOCK_SIZE;
    return 0;
}

void kp_layout_free(kp_layout *l)
{
    free(l->member_size);
    l->member_size = NULL;
}

uint64_t kp_extent_estimate(const kp_plan *p, uint32_t i, double margin)
{
    const kpk_extent *x = &p->extents[i];
    double s = 0;
    if (x->codec != KPK_CODEC_BLOCKS) return x->raw_len;
    for (uint64_t b = x->first_block; b < x->first_block + kp_extent_nblocks(p, i); b++)
        s += (double)p->cuts[b].raw_len * p->est_ratio[p->cuts[b].cls] * (1.0 + margin);
    return (uint64_t)s < x->raw_len ? (uint64_t)s : x->raw_len;
}

int kp_plan_estimate(const kp_plan *p, double margin, kp_layout *l)
{
    uint64_t *cursor = malloc(sizeof *cursor * ((size_t)p->n_members + 1));
    int rc;
    if (!cursor) return -1;
    kp_cursors_init(p, cursor);
    for (uint32_t i = 0; i < p->n_extents; i++)
        cursor[kp_target(p, p->extents[i].member)] += kpk_round_up(kp_extent_estimate(p, i, margin), p->opt.align);
    rc = kp_layout_finish(p, cursor, l);
    free(cursor);
    return rc;
}
