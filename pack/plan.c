/* Planning the KPK layout (docs/FORMAT.md §2, §6). */
#include "plan.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

const char *kp_order_name(int order) { return order == KPK_ORDER_TRUNK_FIRST ? "trunk-first" : "layer-major"; }

void kp_plan_free(kp_plan *p)
{
    free(p->extents);
    free(p->tensors);
    free(p->from);
    free(p->names);
    free(p->name_off);
    free(p->manifest);
    memset(p, 0, sizeof *p);
}

struct builder {
    const k3_source *src;
    kp_plan *p;
    uint64_t cap_names;
    uint64_t at;             /* next extent offset */
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
    kpk_extent *x = &b->p->extents[b->p->n_extents++];
    memset(x, 0, sizeof *x);
    x->kind = (uint8_t)kind;
    x->layer = layer;
    x->expert = expert;
    x->codec = KPK_CODEC_NONE;
    x->first_tensor = (uint32_t)b->p->n_tensors;
    return x;
}

/* Append one tensor to the current extent at the next 64-byte boundary. */
static int add_tensor(struct builder *b, kpk_extent *x, const char *name, int dtype, int ndim, const uint64_t *shape,
                      uint64_t nbytes, kp_source_ref from)
{
    kp_plan *p = b->p;
    kpk_tensor *t = &p->tensors[p->n_tensors];
    uint32_t off;
    if (add_name(b, name, &off)) return -1;
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

static void end_extent(struct builder *b, kpk_extent *x)
{
    kp_plan *p = b->p;
    x->stored_len = x->raw_len;
    x->offset = b->at;
    b->at += kpk_round_up(x->stored_len, p->opt.align);
    p->data_bytes += x->stored_len;
    if (x->stored_len > p->largest_extent) {
        p->largest_extent = x->stored_len;
        p->largest_extent_index = p->n_extents - 1;
    }
}

static int add_schema_tensor(struct builder *b, kpk_extent *x, k3_role role, int L, int e)
{
    const k3_source *src = b->src;
    k3_tensor_spec spec;
    const st_tensor *st;
    const ks_shard *sh;
    uint64_t canon;
    kp_source_ref from;
    if (k3_schema_spec(&src->cfg, role, L, e, &spec)) return -1;
    canon = k3_schema_index(&src->schema, role, L, e);
    st = ks_tensor(src, canon, &sh);
    if (!st) return -1; /* the caller checked coverage */
    from.shard = (uint32_t)(sh - src->shards);
    from.extra = 0;
    from.offset = st->begin;
    return add_tensor(b, x, spec.name, st->dtype, st->ndim, st->shape, st->end - st->begin, from);
}

static int add_trunk(struct builder *b, int L)
{
    k3_role roles[K3T_COUNT];
    int n = k3_schema_layer_roles(&b->src->cfg, L, roles);
    kpk_extent *x = begin_extent(b, KPK_KIND_TRUNK, (uint32_t)L, KPK_NONE);
    for (int i = 0; i < n; i++)
        if (add_schema_tensor(b, x, roles[i], L, -1)) return -1;
    end_extent(b, x);
    return 0;
}

static int add_experts(struct builder *b, int L)
{
    if (!k3_layer_is_moe(&b->src->cfg, L)) return 0;
    for (int e = 0; e < b->src->cfg.n_experts; e++) {
        kpk_extent *x = begin_extent(b, KPK_KIND_EXPERT, (uint32_t)L, (uint32_t)e);
        for (int r = K3T_EXP_W1_PACKED; r <= K3T_EXP_W3_SCALE; r++)
            if (add_schema_tensor(b, x, (k3_role)r, L, e)) return -1;
        end_extent(b, x);
    }
    return 0;
}

static char *build_manifest(const k3_source *src, const kp_plan *p, const char *producer)
{
    json_t *m = json_object(), *files = json_array(), *dropped = json_array(), *opts = json_object();
    json_t *d = json_object(), *srcj = json_object();
    char *text;
    if (!m || !files || !dropped || !opts || !d || !srcj) goto oom;
    json_object_set_new(m, "format", json_string("KPK 1.0"));
    json_object_set_new(m, "producer", json_string(producer));
    json_object_set_new(opts, "align", json_integer(p->opt.align));
    json_object_set_new(opts, "order", json_string(kp_order_name(p->opt.order)));
    json_object_set_new(opts, "codec", json_string("none"));
    json_object_set_new(m, "options", opts);
    for (size_t i = 0; i < src->n_shards; i++) {
        const ks_shard *s = &src->shards[i];
        json_t *f = json_object();
        if (!f) goto oom;
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
    for (size_t i = 0; i < src->n_dropped; i++) json_array_append_new(dropped, json_string(src->dropped[i]));
    json_object_set_new(d, "reason", json_string("non-text tensors (vision tower, projector) are not used by text inference"));
    json_object_set_new(d, "count", json_integer((json_int_t)src->n_dropped));
    json_object_set_new(d, "bytes", json_integer((json_int_t)src->dropped_bytes));
    json_object_set_new(d, "names", dropped);
    json_object_set_new(m, "dropped", d);
    text = json_dumps(m, JSON_INDENT(1) | JSON_SORT_KEYS);
    json_decref(m);
    return text;
oom:
    json_decref(m); json_decref(files); json_decref(dropped); json_decref(opts); json_decref(d); json_decref(srcj);
    return NULL;
}

/* The plan id covers every input of the output bytes: the layout, each
 * tensor's source file, size, mtime and offset, and the manifest. */
static uint64_t compute_plan_id(const k3_source *src, const kp_plan *p)
{
    XXH3_state_t *st = XXH3_createState();
    uint64_t id;
    if (!st) return 0;
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, &p->opt, sizeof p->opt);
    XXH3_64bits_update(st, &p->n_extents, sizeof p->n_extents);
    for (uint32_t i = 0; i < p->n_extents; i++) {
        uint8_t rec[KPK_EXTENT_RECORD_SIZE];
        kpk_extent_encode(&p->extents[i], rec);
        XXH3_64bits_update(st, rec, sizeof rec);
    }
    XXH3_64bits_update(st, p->from, sizeof *p->from * p->n_tensors);
    XXH3_64bits_update(st, p->names, p->names_len);
    for (size_t i = 0; i < src->n_shards; i++) {
        const ks_shard *s = &src->shards[i];
        XXH3_64bits_update(st, s->name, strlen(s->name) + 1);
        XXH3_64bits_update(st, &s->size, sizeof s->size);
        XXH3_64bits_update(st, &s->mtime_ns, sizeof s->mtime_ns);
    }
    for (size_t i = 0; i < src->n_extras; i++) XXH3_64bits_update(st, src->extras[i].data, src->extras[i].len);
    XXH3_64bits_update(st, p->manifest, p->manifest_len);
    id = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return id;
}

int kp_plan_build(const k3_source *src, const kp_options *opt, const char *producer, kp_plan *p, char *err, size_t errlen)
{
    const k3_config *c = &src->cfg;
    struct builder b = {.src = src, .p = p};
    uint64_t max_tensors = src->schema.count + src->n_extras;
    uint64_t max_extents = 2 + (uint64_t)c->n_layers * (1 + (uint64_t)c->n_experts);
    static const k3_role globals[] = {K3T_EMBED, K3T_LM_HEAD, K3T_FINAL_NORM, K3T_OUT_RES_NORM, K3T_OUT_RES_PROJ};

    memset(p, 0, sizeof *p);
    p->opt = *opt;
    if (!ks_ok(src)) { snprintf(err, errlen, "the source has problems; run kpack check-source"); return -1; }
    p->extents = calloc(max_extents, sizeof *p->extents);
    p->tensors = calloc(max_tensors, sizeof *p->tensors);
    p->from = calloc(max_tensors, sizeof *p->from);
    p->name_off = calloc(max_tensors, sizeof *p->name_off);
    if (!p->extents || !p->tensors || !p->from || !p->name_off) goto oom;
    b.at = opt->align; /* [0, align) holds the superblock */

    {   /* meta: the small files, verbatim */
        kpk_extent *x = begin_extent(&b, KPK_KIND_META, KPK_NONE, KPK_NONE);
        for (size_t i = 0; i < src->n_extras; i++) {
            char name[128];
            uint64_t shape[1] = {src->extras[i].len};
            kp_source_ref from = {.shard = UINT32_MAX, .extra = (uint32_t)i, .offset = 0};
            snprintf(name, sizeof name, KPK_META_PREFIX "%s", src->extras[i].name);
            if (add_tensor(&b, x, name, KPK_DT_BYTES, 1, shape, src->extras[i].len, from)) goto oom;
        }
        end_extent(&b, x);
    }
    {
        kpk_extent *x = begin_extent(&b, KPK_KIND_GLOBALS, KPK_NONE, KPK_NONE);
        for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
            if (add_schema_tensor(&b, x, globals[i], -1, -1)) goto oom;
        end_extent(&b, x);
    }
    if (opt->order == KPK_ORDER_TRUNK_FIRST) {
        for (int L = 0; L < c->n_layers; L++) if (add_trunk(&b, L)) goto oom;
        for (int L = 0; L < c->n_layers; L++) if (add_experts(&b, L)) goto oom;
    } else {
        for (int L = 0; L < c->n_layers; L++)
            if (add_trunk(&b, L) || add_experts(&b, L)) goto oom;
    }
    for (uint64_t i = 0; i < p->n_tensors; i++) p->tensors[i].name = p->names + p->name_off[i];

    p->manifest = build_manifest(src, p, producer);
    if (!p->manifest) goto oom;
    p->manifest_len = strlen(p->manifest);
    p->data_end = b.at;
    p->extent_table_off = kpk_round_up(p->data_end, KPK_SECTION_ALIGN);
    p->tensor_table_off = kpk_round_up(p->extent_table_off + (uint64_t)p->n_extents * KPK_EXTENT_RECORD_SIZE, KPK_SECTION_ALIGN);
    p->strings_off = kpk_round_up(p->tensor_table_off + p->n_tensors * KPK_TENSOR_RECORD_SIZE, KPK_SECTION_ALIGN);
    p->manifest_off = kpk_round_up(p->strings_off + p->names_len, KPK_SECTION_ALIGN);
    p->backup_off = kpk_round_up(p->manifest_off + p->manifest_len, KPK_SECTION_ALIGN);
    p->file_size = p->backup_off + KPK_SUPERBLOCK_SIZE;
    p->plan_id = compute_plan_id(src, p);
    return 0;
oom:
    snprintf(err, errlen, "out of memory while planning the layout");
    kp_plan_free(p);
    return -1;
}
