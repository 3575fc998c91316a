/* The K3 schema check of a KPK file (see k3_check.h). */
#include "k3_check.h"

#include "errbuf.h"
#include "k3_schema.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_extents(const kpk_file *f, const k3_config *c, char *err, size_t errlen)
{
    for (uint32_t i = 0; i < kpk_extent_count(f); i++) {
        const kpk_extent *x = kpk_extent_at(f, i);
        char d[64];
        kpk_extent_describe(x, d, sizeof d);
        if ((x->kind == KPK_KIND_TRUNK || x->kind == KPK_KIND_EXPERT) && x->layer >= (uint32_t)c->n_layers) {
            errbuf_set(err, errlen, "%s: %s (extent %u): the config has %d layers", kpk_path(f), d, i, c->n_layers);
            return -1;
        }
        if (x->kind == KPK_KIND_EXPERT && (!k3_layer_is_moe(c, (int)x->layer) || x->expert >= (uint32_t)c->n_experts)) {
            errbuf_set(err, errlen, "%s: %s (extent %u): the config has %s", kpk_path(f), d, i,
                       k3_layer_is_moe(c, (int)x->layer) ? "fewer routed experts" : "no routed experts in this dense layer");
            return -1;
        }
    }
    return 0;
}

/* The meta extent holds files: config.json always. */
static int check_meta(const kpk_file *f, char *err, size_t errlen)
{
    const kpk_extent *x = kpk_extent_at(f, (uint32_t)kpk_find_meta(f));
    int have_config = 0;
    for (uint64_t i = x->first_tensor; i < (uint64_t)x->first_tensor + x->tensor_count; i++) {
        kpk_tensor t;
        kpk_tensor_at(f, i, &t);
        if (t.dtype != KPK_DT_BYTES || t.ndim != 1) {
            errbuf_set(err, errlen, "%s: embedded file %s has dtype %s and %u dimensions (files are BYTES [length])",
                       kpk_path(f), t.name, kpk_dtype_name(t.dtype), t.ndim);
            return -1;
        }
        have_config |= strcmp(t.name, KPK_META_PREFIX "config.json") == 0;
    }
    if (!have_config) { errbuf_set(err, errlen, "%s: the meta extent has no config.json", kpk_path(f)); return -1; }
    return 0;
}

int k3_check_file(const kpk_file *f, const k3_config *c, char *err, size_t errlen)
{
    k3_schema sch;
    uint64_t in_model = 0, prev_index = 0;
    uint32_t prev_extent = UINT32_MAX;
    int half = 0;             /* the 16-bit float type seen first */
    char half_name[K3_NAME_MAX] = "";

    if (check_meta(f, err, errlen) || check_extents(f, c, err, errlen)) return -1;
    k3_schema_init(&sch, c);
    for (uint64_t i = 0; i < sch.count; i++) {
        k3_tensor_spec s;
        kpk_tensor t;
        const kpk_extent *x;
        int64_t idx;
        k3_schema_at(&sch, i, &s);
        idx = kpk_find_tensor(f, s.name, &t);
        if (idx < 0) { errbuf_set(err, errlen, "%s: tensor %s is missing", kpk_path(f), s.name); return -1; }
        if (!(s.dtypes & K3_DTM(t.dtype)) || t.ndim != s.ndim || memcmp(t.shape, s.shape, sizeof s.shape) != 0) {
            errbuf_set(err, errlen, "%s: tensor %s has dtype %s and a shape other than the config implies", kpk_path(f),
                       s.name, kpk_dtype_name(t.dtype));
            return -1;
        }
        x = kpk_extent_at(f, t.extent);
        if (s.kind != x->kind || (s.layer >= 0 && (uint32_t)s.layer != x->layer) || (s.expert >= 0 && (uint32_t)s.expert != x->expert)) {
            errbuf_set(err, errlen, "%s: tensor %s is stored in the wrong extent", kpk_path(f), s.name);
            return -1;
        }
        /* canonical order within an extent (the schema's order) */
        if (t.extent == prev_extent && (uint64_t)idx < prev_index) {
            errbuf_set(err, errlen, "%s: tensor %s is out of the canonical order of its extent", kpk_path(f), s.name);
            return -1;
        }
        prev_extent = t.extent;
        prev_index = (uint64_t)idx;
        if (t.dtype == KPK_DT_BF16 || t.dtype == KPK_DT_F16) {
            if (!half) { half = t.dtype; snprintf(half_name, sizeof half_name, "%s", s.name); }
            else if (t.dtype != half) {
                errbuf_set(err, errlen, "%s: tensor %s is %s but %s is %s: a checkpoint uses one 16-bit float type "
                           "(a relabelled tensor?)", kpk_path(f), s.name, kpk_dtype_name(t.dtype), half_name, kpk_dtype_name(half));
                return -1;
            }
        }
    }
    /* names are unique and every schema tensor was found in a model extent:
     * equal counts mean the model extents hold nothing else */
    for (uint32_t i = 0; i < kpk_extent_count(f); i++) {
        const kpk_extent *x = kpk_extent_at(f, i);
        if (x->kind == KPK_KIND_GLOBALS || x->kind == KPK_KIND_TRUNK || x->kind == KPK_KIND_EXPERT) in_model += x->tensor_count;
    }
    if (in_model != sch.count) {
        for (uint32_t i = 0; i < kpk_extent_count(f); i++) {
            const kpk_extent *x = kpk_extent_at(f, i);
            if (x->kind != KPK_KIND_GLOBALS && x->kind != KPK_KIND_TRUNK && x->kind != KPK_KIND_EXPERT) continue;
            for (uint64_t ti = x->first_tensor; ti < (uint64_t)x->first_tensor + x->tensor_count; ti++) {
                kpk_tensor t;
                k3_tensor_spec s;
                char why[200];
                kpk_tensor_at(f, ti, &t);
                if (k3_schema_classify(c, t.name, &s, why, sizeof why) != K3_CLASS_TENSOR) {
                    errbuf_set(err, errlen, "%s: tensor %s is not part of the model the config describes%s%s", kpk_path(f),
                               t.name, why[0] ? ": " : "", why);
                    return -1;
                }
            }
        }
        errbuf_set(err, errlen, "%s: the model extents hold %llu tensors, the config implies %llu", kpk_path(f),
                   (unsigned long long)in_model, (unsigned long long)sch.count);
        return -1;
    }
    return 0;
}

int k3_check_kpk(const kpk_file *f, k3_config *cfg, char *err, size_t errlen)
{
    char *text = NULL, cerr[800];
    size_t len;
    kpk_err e = {0};
    int rc;
    if (kpk_super(f)->incompat & KPK_INCOMPAT_DRAFTER) {
        errbuf_set(err, errlen, "%s is a drafter file (an EAGLE drafter, not a Kimi K3 model): give it to krun with --draft FILE, "
                   "next to the model", kpk_path(f));
        return -1;
    }
    if (kpk_meta_file(f, "config.json", &text, &len, &e)) { errbuf_set(err, errlen, "%s", e.msg); return -1; }
    rc = k3_config_parse(text, len, cfg, cerr, sizeof cerr);
    free(text);
    if (rc) { errbuf_set(err, errlen, "%s: embedded config.json: %s", kpk_path(f), cerr); return -1; }
    return k3_check_file(f, cfg, err, errlen);
}
