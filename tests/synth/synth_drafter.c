/* k3synth --drafter: a K3 EAGLE-3.1 drafter in the released layout (K3_EAGLE.md
 * §1.2-1.4): config.json (the exported, vLLM-format shape) and one
 * model.safetensors whose header has a __metadata__ entry, the roster of
 * format/k3_eagle.c sorted by name, BF16, no gaps.  At the release geometry
 * that is 20 tensors, a 2,128-byte header and 6,031,253,592 bytes.
 *
 * The weights are random but shaped like the target's (synth_weights.c): the
 * taps and the embedding enter through RMS norms, so a projection of gain g
 * has N(0, g / sqrt(fan_in)) entries; q and the shared rope key give scores
 * of std ~5 with half of their variance from the rope dims (RoPE, YaRN and
 * the softmax scale all change the drafts); lm_head gives logits of std ~3.
 * The embedding is the target's: drawn for the target's tensor name, so with
 * the target's seed it is byte-identical to it. */
#include "synth.h"

#include "format/errbuf.h"
#include "format/k3_eagle.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The metadata TorchSpec writes (K3_EAGLE §1.2): a short version string. */
#define DRAFTER_METADATA "{\"torchspec_version\":\"0.1.0\"}"

static json_t *config_json(const synth_drafter_geom *g)
{
    json_t *o = json_object(), *ec = json_object(), *ids = json_array(), *arch = json_array();
    for (int i = 0; i < g->n_taps; i++) json_array_append_new(ids, json_integer(g->taps[i]));
    json_array_append_new(arch, json_string("Eagle3DeepseekV2ForCausalLM"));
    json_object_set_new(o, "architectures", arch);
    json_object_set_new(o, "model_type", json_string("kimi_k2"));
    json_object_set_new(o, "hidden_size", json_integer(g->hidden));
    json_object_set_new(o, "intermediate_size", json_integer(g->inter));
    json_object_set_new(o, "num_hidden_layers", json_integer(1));
    json_object_set_new(o, "num_attention_heads", json_integer(g->heads));
    json_object_set_new(o, "num_key_value_heads", json_integer(g->heads));
    json_object_set_new(o, "q_lora_rank", json_integer(g->q_lora));
    json_object_set_new(o, "kv_lora_rank", json_integer(g->kv_lora));
    json_object_set_new(o, "qk_nope_head_dim", json_integer(g->nope));
    json_object_set_new(o, "qk_rope_head_dim", json_integer(g->rope));
    json_object_set_new(o, "v_head_dim", json_integer(g->vdim));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "rms_norm_eps", json_real(1e-5));
    json_object_set_new(o, "vocab_size", json_integer(g->vocab));
    json_object_set_new(o, "draft_vocab_size", json_integer(g->vocab));
    json_object_set_new(o, "torch_dtype", json_string("bfloat16"));
    json_object_set_new(o, "rope_theta", json_real(g->rope_theta));
    if (g->yarn_factor > 0) {
        json_t *rs = json_object();
        json_object_set_new(rs, "type", json_string("yarn"));
        json_object_set_new(rs, "factor", json_real(g->yarn_factor));
        json_object_set_new(rs, "original_max_position_embeddings", json_integer(g->yarn_orig));
        json_object_set_new(rs, "beta_fast", json_integer((json_int_t)g->beta_fast));
        json_object_set_new(rs, "beta_slow", json_integer((json_int_t)g->beta_slow));
        json_object_set_new(rs, "mscale", json_real(1.0));
        json_object_set_new(rs, "mscale_all_dim", json_real(1.0));
        json_object_set_new(o, "rope_scaling", rs);
        json_object_set_new(o, "max_position_embeddings", json_integer((json_int_t)((double)g->yarn_orig * g->yarn_factor)));
    }
    json_object_set_new(o, "mla_use_nope", json_true());
    json_object_set_new(o, "fc_norm", json_true());
    json_object_set_new(o, "norm_output", json_true());
    json_object_set_new(ec, "eagle_aux_hidden_state_layer_ids", ids);
    json_object_set_new(ec, "use_aux_hidden_state", json_true());
    json_object_set_new(ec, "use_input_layernorm_in_first_layer", json_true());
    json_object_set_new(ec, "use_last_layernorm", json_true());
    json_object_set_new(ec, "use_mtp_layernorm", json_false());
    json_object_set_new(o, "eagle_config", ec);
    json_object_set_new(o, "pad_token_id", json_integer(0));
    json_object_set_new(o, "tie_word_embeddings", json_false());
    return o;
}

static void normal(synth_given *d, double s) { d->s1 = d->s2 = s; d->period = 1; d->split = 1; }

/* How tensor (role, spec) is drawn: the geometry's widths decide the gains. */
static void draw_of(const k3_eagle_config *c, const k3e_spec *s, synth_tensor *t)
{
    const double E = c->hidden, dn = c->qk_nope, dr = c->qk_rope, dqk = dn + dr;
    const double gk = sqrt(2.0 * dqk / dn), gkr = gk * sqrt(dn / dr);
    synth_given *d = &t->given;
    t->role = SYNTH_ROLE_GIVEN;
    switch (s->role) {
    case K3E_EMBED: normal(d, 1.0); t->seed_name = "language_model.model.embed_tokens.weight"; break;
    case K3E_FC_NORM: case K3E_INPUT_LN: case K3E_HIDDEN_NORM: case K3E_QA_NORM: case K3E_KVA_NORM: case K3E_POST_LN:
    case K3E_NORM:
        d->gain = 1;
        break;
    case K3E_FC: normal(d, 1.0 / sqrt((double)s->shape[1])); break;
    case K3E_QA: normal(d, 1.0 / sqrt(2 * E)); break;
    case K3E_QB: normal(d, 2.5 / sqrt(c->q_lora)); break;
    case K3E_KVA: /* the latent rows, then the shared rope key: half the score variance */
        d->s1 = 1.0 / sqrt(2 * E); d->s2 = gkr / sqrt(2 * E);
        d->period = (uint64_t)(c->kv_lora + c->qk_rope); d->split = (uint64_t)c->kv_lora;
        break;
    case K3E_KVB: /* per head: dn key rows, then dv value rows */
        d->s1 = gk / sqrt(c->kv_lora); d->s2 = 1.0 / sqrt(c->kv_lora);
        d->period = (uint64_t)(c->qk_nope + c->v_head); d->split = (uint64_t)c->qk_nope;
        break;
    case K3E_O: normal(d, 1.0 / sqrt((double)c->heads * c->v_head)); break;
    case K3E_GATE: normal(d, 1.5 / sqrt(E)); break;
    case K3E_UP: normal(d, 1.0 / sqrt(E)); break;
    case K3E_DOWN: normal(d, 1.5 / sqrt(c->inter)); break;
    case K3E_LM_HEAD: normal(d, 3.0 / sqrt(E)); break;
    case K3E_ROLE_COUNT: break;
    }
}

int synth_drafter_write(const char *outdir, const synth_drafter_geom *g, uint64_t seed, int virt, int threads, int progress,
                        int quiet)
{
    json_t *cj = config_json(g);
    char *text = json_dumps(cj, JSON_INDENT(2)), path[4096], err[800];
    k3_eagle_config c;
    k3_config none;
    synth_tensor *t = NULL;
    synth_writer w;
    uint64_t data;
    int n, rc = -1;
    const double t0 = synth_now();
    json_decref(cj);
    if (!text) { fprintf(stderr, "k3synth: out of memory\n"); return -1; }
    /* the config we write is the config we generate from */
    if (k3e_config_parse(text, strlen(text), &c, err, sizeof err)) { fprintf(stderr, "k3synth: --drafter: %s\n", err); goto out; }
    snprintf(path, sizeof path, "%s/config.json", outdir);
    if (synth_write_file(path, text, strlen(text), err, sizeof err)) { fprintf(stderr, "k3synth: %s\n", err); goto out; }
    n = k3e_count(&c);
    if (!(t = calloc((size_t)n, sizeof *t))) { fprintf(stderr, "k3synth: out of memory\n"); goto out; }
    for (int i = 0; i < n; i++) {
        k3e_spec s;
        k3e_at(&c, i, &s);
        snprintf(t[i].name, sizeof t[i].name, "%s", s.name);
        t[i].dtype = t[i].release_dtype = K3E_DTYPE;
        t[i].ndim = s.ndim;
        t[i].nbytes = 2;
        for (int d = 0; d < s.ndim; d++) { t[i].shape[d] = s.shape[d]; t[i].nbytes *= s.shape[d]; }
        t[i].layer = t[i].expert = -1;
        draw_of(&c, &s, &t[i]);
    }
    data = synth_layout(t, (size_t)n);
    memset(&w, 0, sizeof w);
    memset(&none, 0, sizeof none);
    w.cfg = &none;
    w.seed = seed;
    w.virt = virt;
    w.threads = threads;
    w.progress = progress;
    w.metadata = DRAFTER_METADATA;
    w.grand_total = data;
    w.t_start = t0;
    snprintf(path, sizeof path, "%s/model.safetensors", outdir);
    if (synth_write_safetensors(&w, path, t, (size_t)n, data, err, sizeof err)) { fprintf(stderr, "k3synth: %s\n", err); goto out; }
    if (progress) fputc('\n', stderr);
    if (!quiet) {
        printf("k3synth: %s: an EAGLE-3.1 drafter, %d tensors, %.3f GB %s in %.2f s\n", outdir, n, (double)w.apparent_bytes / 1e9,
               virt ? "apparent (sparse)" : "written", synth_now() - t0);
        if (fflush(stdout)) { fprintf(stderr, "k3synth: stdout: write failed\n"); goto out; }
    }
    rc = 0;
out:
    free(t);
    free(text);
    return rc;
}
