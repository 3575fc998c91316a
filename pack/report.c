#include "report.h"

#include "format/kprogress.h"

#include <string.h>

static void print_problem_list(char *const *list, size_t n, const char *indent, FILE *out)
{
    for (size_t k = 0; k < n && k < KS_MAX_PROBLEMS; k++) fprintf(out, "%s- %s\n", indent, list[k] ? list[k] : "(message lost: out of memory)");
    if (n > KS_MAX_PROBLEMS) fprintf(out, "%s- ... and %zu more\n", indent, n - KS_MAX_PROBLEMS);
}

void kr_source_problems(const k3_source *src, FILE *out)
{
    for (size_t i = 0; i < src->n_shards; i++) {
        const ks_shard *s = &src->shards[i];
        if (ks_shard_ok(s)) continue;
        fprintf(out, "  BAD  %s\n", s->name);
        print_problem_list(s->problems, s->n_problems, "       ", out);
    }
    if (src->n_general) {
        fprintf(out, "  other problems:\n");
        print_problem_list(src->general, src->n_general, "       ", out);
    }
}

void kr_source_print(const k3_source *src, FILE *out)
{
    const k3_config *c = &src->cfg;
    char b[32];
    kfmt_bytes(src->total_bytes, b, sizeof b);
    fprintf(out, "source: %s (%s, %zu file%s, %s)\n", src->dir,
            src->single_file ? "single file" : src->hf_snapshot ? "Hugging Face snapshot" : "sharded",
            src->n_shards, src->n_shards == 1 ? "" : "s", b);
    fprintf(out, "config: %s shape; %d layers (%d MLA), hidden %d, vocab %d, %d experts top-%d, latent %d\n",
            c->nested ? "nested (released)" : "flat", c->n_layers, k3_config_mla_layer_count(c), c->hidden, c->vocab,
            c->n_experts, c->topk, c->latent);
    fprintf(out, "tensors: %llu of %llu found, %llu missing; %zu non-text tensors will be dropped\n",
            (unsigned long long)src->n_found, (unsigned long long)src->schema.count,
            (unsigned long long)src->n_missing, src->n_dropped);
    fprintf(out, "tokenizer: %s\n", src->n_extras >= 2 ? "tiktoken.model present" : "none (krun will accept token ids only)");
    for (size_t i = 0; i < src->n_shards; i++) {
        const ks_shard *s = &src->shards[i];
        const char *sha = !s->expect_sha[0] ? "sha256 not checked"
                        : !s->got_sha[0] ? "sha256 not computed"
                        : strcmp(s->got_sha, s->expect_sha) == 0 ? "sha256 ok" : "sha256 MISMATCH";
        kfmt_bytes(s->size, b, sizeof b);
        fprintf(out, "  %-4s %s  %llu tensors  %s  %s\n", ks_shard_ok(s) ? "OK" : "BAD", s->name,
                (unsigned long long)s->n_tensors, s->present ? b : "-", sha);
        print_problem_list(s->problems, s->n_problems, "       ", out);
    }
    if (src->n_general) {
        fprintf(out, "  other problems:\n");
        print_problem_list(src->general, src->n_general, "       ", out);
    }
}

static json_t *problem_array(char *const *list, size_t n)
{
    json_t *a = json_array();
    for (size_t k = 0; k < n && k < KS_MAX_PROBLEMS; k++) json_array_append_new(a, json_string(list[k] ? list[k] : "?"));
    return a;
}

json_t *kr_source_json(const k3_source *src)
{
    const k3_config *c = &src->cfg;
    json_t *j = json_object(), *shards = json_array(), *cfg = json_object(), *t = json_object();
    json_object_set_new(j, "dir", json_string(src->dir));
    json_object_set_new(j, "ok", json_boolean(ks_ok(src)));
    json_object_set_new(j, "layout", json_string(src->single_file ? "single-file" : src->hf_snapshot ? "hf-snapshot" : "sharded"));
    json_object_set_new(j, "total_bytes", json_integer((json_int_t)src->total_bytes));
    json_object_set_new(cfg, "shape", json_string(c->nested ? "nested" : "flat"));
    json_object_set_new(cfg, "layers", json_integer(c->n_layers));
    json_object_set_new(cfg, "mla_layers", json_integer(k3_config_mla_layer_count(c)));
    json_object_set_new(cfg, "hidden", json_integer(c->hidden));
    json_object_set_new(cfg, "vocab", json_integer(c->vocab));
    json_object_set_new(cfg, "experts", json_integer(c->n_experts));
    json_object_set_new(cfg, "topk", json_integer(c->topk));
    json_object_set_new(j, "config", cfg);
    json_object_set_new(t, "expected", json_integer((json_int_t)src->schema.count));
    json_object_set_new(t, "found", json_integer((json_int_t)src->n_found));
    json_object_set_new(t, "missing", json_integer((json_int_t)src->n_missing));
    json_object_set_new(t, "dropped", json_integer((json_int_t)src->n_dropped));
    json_object_set_new(j, "tensors", t);
    json_object_set_new(j, "tokenizer", json_boolean(src->n_extras >= 2));
    for (size_t i = 0; i < src->n_shards; i++) {
        const ks_shard *s = &src->shards[i];
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(s->name));
        json_object_set_new(o, "ok", json_boolean(ks_shard_ok(s)));
        json_object_set_new(o, "present", json_boolean(s->present));
        json_object_set_new(o, "size", json_integer((json_int_t)s->size));
        json_object_set_new(o, "tensors", json_integer((json_int_t)s->n_tensors));
        json_object_set_new(o, "sha256_expected", s->expect_sha[0] ? json_string(s->expect_sha) : json_null());
        json_object_set_new(o, "sha256_from", s->sha_from ? json_string(s->sha_from) : json_null());
        json_object_set_new(o, "sha256", s->got_sha[0] ? json_string(s->got_sha) : json_null());
        json_object_set_new(o, "problems", problem_array(s->problems, s->n_problems));
        json_object_set_new(o, "problem_count", json_integer((json_int_t)s->n_problems));
        json_array_append_new(shards, o);
    }
    json_object_set_new(j, "shards", shards);
    json_object_set_new(j, "problems", problem_array(src->general, src->n_general));
    json_object_set_new(j, "problem_count", json_integer((json_int_t)src->n_general));
    return j;
}
