/* The report of `krun MODEL.kpk` (generate.h): a line per decoding step and
 * the summary on stderr, and --json. */
#include "generate.h"

#include "format/kprogress.h"
#include "run/util/procmem.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

/* Bytes read and seconds of the decoding sweeps, per generated token after
 * the first (which comes from the prompt's logits). */
struct decode_totals { size_t sweeps, tokens; double seconds; uint64_t bytes; };

static struct decode_totals decode_totals(const gen_step *steps, size_t n_steps)
{
    struct decode_totals d = {n_steps, 0, 0, 0};
    for (size_t k = 0; k < n_steps; k++) {
        d.tokens += steps[k].tokens;
        d.seconds += steps[k].seconds;
        d.bytes += steps[k].trunk + steps[k].head + steps[k].experts + steps[k].globals;
    }
    return d;
}

void gen_step_measure(gen_step *st, const krun_stats *a, const krun_stats *b)
{
    st->trunk = b->bytes_trunk - a->bytes_trunk;
    st->head = b->bytes_head - a->bytes_head;
    for (uint16_t k = 0; k < b->n_members; k++) st->member[k] = b->member_bytes[k] - a->member_bytes[k];
    st->experts = b->bytes_experts - a->bytes_experts;
    st->globals = b->bytes_globals - a->bytes_globals;
    st->hits = b->expert_hits - a->expert_hits;
    st->misses = b->expert_misses - a->expert_misses;
    st->predicted = b->experts_predicted - a->experts_predicted;
    st->predicted_used = b->experts_predicted_used - a->experts_predicted_used;
    st->router = b->bytes_router - a->bytes_router;
    st->cancelled = b->bytes_cancelled - a->bytes_cancelled;
}

void gen_report_step(const gen_step *st, size_t n, size_t n_acc, uint16_t n_members)
{
    char t1[32], t2[32];
    kfmt_bytes(st->trunk + st->head, t1, sizeof t1);
    kfmt_bytes(st->experts, t2, sizeof t2);
    fprintf(stderr, "\nkrun: step %zu: %.3f s, read trunk %s + experts %s (%.0f MB/s), resident hits %llu/%llu, RSS %.1f MB",
            n, st->seconds, t1, t2, (double)(st->trunk + st->head + st->experts + st->globals) / st->seconds / 1e6,
            (unsigned long long)st->hits, (unsigned long long)(st->hits + st->misses), (double)st->rss / 1e6);
    if (st->predicted) fprintf(stderr, "; %llu of %llu predicted experts used", (unsigned long long)st->predicted_used,
                               (unsigned long long)st->predicted);
    if (st->drafted) fprintf(stderr, "; %zu of %zu drafts accepted", n_acc, st->drafted);
    fputc('\n', stderr);
    if (n_members > 1) {
        fprintf(stderr, "krun: step %zu per member:", n);
        for (uint16_t k = 0; k < n_members; k++) {
            kfmt_bytes(st->member[k], t1, sizeof t1);
            fprintf(stderr, " %u: %s %.0f MB/s;", k, t1, (double)st->member[k] / st->seconds / 1e6);
        }
        fputc('\n', stderr);
    }
}

void gen_report_summary(krun_model *m, const krun_session *s, const gen_record *r)
{
    krun_stats st;
    double total = 0;
    krun_model_stats(m, &st);
    for (size_t k = 0; k < r->n_steps; k++) total += r->steps[k].seconds;
    if (r->cache)
        fprintf(stderr, "krun: prefix cache: %zu of the prompt's %zu positions were kept from an earlier run, %zu run\n", r->cached,
                r->n_prompt, r->n_prompt - r->cached);
    fprintf(stderr, "krun: prompt %zu tokens in %.3f s; %zu generated, %.1f ms per decoding step; read %.3g GB; "
            "%llu extents verified; peak RSS %.1f MB; simd %s, %d threads\n",
            r->n_prompt, r->t_prefill, r->n_gen, r->n_steps ? total / (double)r->n_steps * 1e3 : 0.0, (double)st.bytes_read / 1e9,
            (unsigned long long)st.extents_verified, (double)kmem_peak_rss() / 1e6, krun_simd_name(), krun_model_threads(m));
    if (r->spec) {
        struct decode_totals d = decode_totals(r->steps, r->n_steps);
        krun_spec_stats sp;
        char b1[32];
        krun_session_spec_stats(s, &sp);
        kfmt_bytes(d.tokens ? d.bytes / d.tokens : 0, b1, sizeof b1);
        fprintf(stderr, "krun: --spec %ld: %llu drafted, %llu accepted (%.0f%%), %llu rolled back; %zu sweeps for %zu tokens "
                "(%.2f per sweep); %s and %.1f ms per generated token\n", r->spec, (unsigned long long)sp.drafted,
                (unsigned long long)sp.accepted, sp.drafted ? 100.0 * (double)sp.accepted / (double)sp.drafted : 0.0,
                (unsigned long long)sp.rollbacks, d.sweeps, d.tokens, d.sweeps ? (double)d.tokens / (double)d.sweeps : 0.0, b1,
                d.tokens ? d.seconds / (double)d.tokens * 1e3 : 0.0);
        if (krun_model_draft(m))
            fprintf(stderr, "krun: drafter %s: %llu of its %llu drafts accepted (%.0f%%) in %llu verifications\n", krun_model_draft(m),
                    (unsigned long long)sp.drafter_accepted, (unsigned long long)sp.drafter_drafted,
                    sp.drafter_drafted ? 100.0 * (double)sp.drafter_accepted / (double)sp.drafter_drafted : 0.0,
                    (unsigned long long)sp.drafter_verifications);
    }
}

/* Bytes each member file gave in a step, and at what rate. */
static json_t *members_json(krun_model *m, const uint64_t *bytes, double seconds)
{
    krun_stats st;
    json_t *a = json_array();
    krun_model_stats(m, &st);
    for (uint16_t k = 0; k < st.n_members; k++) {
        json_t *o = json_object();
        json_object_set_new(o, "member", json_integer(k));
        json_object_set_new(o, "bytes", json_integer((json_int_t)bytes[k]));
        json_object_set_new(o, "mb_per_s", seconds > 0 ? json_real((double)bytes[k] / seconds / 1e6) : json_null());
        json_array_append_new(a, o);
    }
    return a;
}

static json_t *ids_json(const int32_t *ids, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

/* One decoding sweep: its seconds, tokens, bytes (per member file too), hits. */
static json_t *step_json(krun_model *m, const gen_step *x)
{
    json_t *o = json_object();
    json_object_set_new(o, "seconds", json_real(x->seconds));
    json_object_set_new(o, "tokens", json_integer((json_int_t)x->tokens));
    json_object_set_new(o, "drafted", json_integer((json_int_t)x->drafted));
    json_object_set_new(o, "bytes_trunk", json_integer((json_int_t)x->trunk));
    json_object_set_new(o, "bytes_head", json_integer((json_int_t)x->head));
    json_object_set_new(o, "bytes_experts", json_integer((json_int_t)x->experts));
    json_object_set_new(o, "bytes_globals", json_integer((json_int_t)x->globals));
    json_object_set_new(o, "mb_per_s", json_real((double)(x->trunk + x->head + x->experts + x->globals) / x->seconds / 1e6));
    json_object_set_new(o, "members", members_json(m, x->member, x->seconds));
    json_object_set_new(o, "expert_hits", json_integer((json_int_t)x->hits));
    json_object_set_new(o, "expert_misses", json_integer((json_int_t)x->misses));
    json_object_set_new(o, "experts_predicted", json_integer((json_int_t)x->predicted));
    json_object_set_new(o, "experts_predicted_used", json_integer((json_int_t)x->predicted_used));
    json_object_set_new(o, "bytes_router", json_integer((json_int_t)x->router));
    json_object_set_new(o, "bytes_cancelled", json_integer((json_int_t)x->cancelled));
    json_object_set_new(o, "resident_hit_rate",
                        x->hits + x->misses ? json_real((double)x->hits / (double)(x->hits + x->misses)) : json_null());
    json_object_set_new(o, "rss_bytes", json_integer((json_int_t)x->rss));
    return o;
}

static json_t *decode_json(const struct decode_totals *d)
{
    json_t *o = json_object();
    json_object_set_new(o, "sweeps", json_integer((json_int_t)d->sweeps));
    json_object_set_new(o, "tokens", json_integer((json_int_t)d->tokens));
    json_object_set_new(o, "seconds", json_real(d->seconds));
    json_object_set_new(o, "bytes", json_integer((json_int_t)d->bytes));
    json_object_set_new(o, "seconds_per_token", d->tokens ? json_real(d->seconds / (double)d->tokens) : json_null());
    json_object_set_new(o, "bytes_per_token", d->tokens ? json_real((double)d->bytes / (double)d->tokens) : json_null());
    return o;
}

/* --spec: the drafts, and [drafted, accepted] of each verification; null without. */
static json_t *spec_json(const gen_record *r, krun_model *m, const krun_session *s)
{
    krun_spec_stats spec;
    json_t *o, *rounds;
    if (!r->spec) return json_null();
    krun_session_spec_stats(s, &spec);
    o = json_object();
    rounds = json_array();
    for (size_t k = 0; k < r->n_steps; k++)
        if (r->steps[k].drafted) {
            json_t *a = json_array();
            json_array_append_new(a, json_integer((json_int_t)r->steps[k].drafted));
            json_array_append_new(a, json_integer((json_int_t)(r->steps[k].tokens - 1)));
            json_array_append_new(rounds, a);
        }
    json_object_set_new(o, "max_drafts", json_integer(r->spec));
    json_object_set_new(o, "sweeps", json_integer((json_int_t)spec.sweeps));
    json_object_set_new(o, "verifications", json_integer((json_int_t)spec.verifications));
    json_object_set_new(o, "drafted", json_integer((json_int_t)spec.drafted));
    json_object_set_new(o, "accepted", json_integer((json_int_t)spec.accepted));
    json_object_set_new(o, "rollbacks", json_integer((json_int_t)spec.rollbacks));
    json_object_set_new(o, "acceptance", spec.drafted ? json_real((double)spec.accepted / (double)spec.drafted) : json_null());
    json_object_set_new(o, "rounds", rounds);
    if (krun_model_draft(m)) {
        json_t *d = json_object();
        json_object_set_new(d, "file", json_string(krun_model_draft(m)));
        json_object_set_new(d, "verifications", json_integer((json_int_t)spec.drafter_verifications));
        json_object_set_new(d, "drafted", json_integer((json_int_t)spec.drafter_drafted));
        json_object_set_new(d, "accepted", json_integer((json_int_t)spec.drafter_accepted));
        json_object_set_new(d, "acceptance", spec.drafter_drafted ? json_real((double)spec.drafter_accepted / (double)spec.drafter_drafted)
                                                                  : json_null());
        json_object_set_new(o, "drafter", d);
    } else {
        json_object_set_new(o, "drafter", json_null());
    }
    return o;
}

/* The routing's histogram: per MoE layer, the times each expert was chosen
 * ({"layer": L, "counts": [...]}), so that the bytes a prompt reads can be
 * predicted from the experts' measured loads (tests/bench/bench_prompt.sh). */
static json_t *routing_json(const krun_model *m)
{
    const k3_config *c = krun_model_config(m);
    json_t *a = json_array();
    for (int L = 0; L < c->n_layers; L++) {
        const uint64_t *n = krun_model_routing(m, L);
        json_t *o, *v;
        if (!n) continue;
        o = json_object();
        v = json_array();
        for (int e = 0; e < c->n_experts; e++) json_array_append_new(v, json_integer((json_int_t)n[e]));
        json_object_set_new(o, "layer", json_integer(L));
        json_object_set_new(o, "counts", v);
        json_array_append_new(a, o);
    }
    return a;
}

/* Several machines: what each rank did (null in one process). */
static json_t *cluster_json(krun_model *m)
{
    krun_rank_info *ri = calloc(KRUN_MAX_RANKS, sizeof *ri);
    krun_err e;
    json_t *a;
    int n = ri ? krun_model_ranks(m, ri, KRUN_MAX_RANKS, &e) : -1;
    if (n <= 0) { free(ri); return json_null(); }
    a = json_array();
    for (int r = 0; r < n; r++) {
        json_t *o = json_object(), *mb = json_array();
        for (uint16_t k = 0; k < ri[r].st.n_members; k++) json_array_append_new(mb, json_integer((json_int_t)ri[r].st.member_bytes[k]));
        json_object_set_new(o, "rank", json_integer(r));
        json_object_set_new(o, "who", json_string(ri[r].who));
        json_object_set_new(o, "layers", json_integer(ri[r].layers));
        json_object_set_new(o, "bytes_read", json_integer((json_int_t)ri[r].st.bytes_read));
        json_object_set_new(o, "bytes_trunk", json_integer((json_int_t)ri[r].st.bytes_trunk));
        json_object_set_new(o, "bytes_experts", json_integer((json_int_t)ri[r].st.bytes_experts));
        json_object_set_new(o, "bytes_resident", json_integer((json_int_t)ri[r].st.bytes_resident));
        json_object_set_new(o, "member_bytes", mb);
        json_object_set_new(o, "experts_served", json_integer((json_int_t)ri[r].experts_served));
        json_object_set_new(o, "experts_predicted", json_integer((json_int_t)ri[r].experts_predicted));
        json_object_set_new(o, "bytes_sent", json_integer((json_int_t)ri[r].bytes_sent));
        json_object_set_new(o, "bytes_received", json_integer((json_int_t)ri[r].bytes_received));
        json_array_append_new(a, o);
    }
    free(ri);
    return json_pack("{s:i, s:o}", "ranks", n, "per_rank", a);
}

/* The whole run's reads (krun_model_stats), memory, kernels and plan, into j. */
static void totals_json(json_t *j, krun_model *m, const krun_stats *st)
{
    json_object_set_new(j, "bytes_read", json_integer((json_int_t)st->bytes_read));
    json_object_set_new(j, "bytes_trunk", json_integer((json_int_t)st->bytes_trunk));
    json_object_set_new(j, "bytes_head", json_integer((json_int_t)st->bytes_head));
    json_object_set_new(j, "member_bytes", members_json(m, st->member_bytes, 0));
    json_object_set_new(j, "notice", krun_model_notice(m) ? json_string(krun_model_notice(m)) : json_null());
    json_object_set_new(j, "warning", krun_model_warning(m) ? json_string(krun_model_warning(m)) : json_null());
    json_object_set_new(j, "bytes_experts", json_integer((json_int_t)st->bytes_experts));
    json_object_set_new(j, "bytes_globals", json_integer((json_int_t)st->bytes_globals));
    json_object_set_new(j, "bytes_resident", json_integer((json_int_t)st->bytes_resident));
    json_object_set_new(j, "expert_hits", json_integer((json_int_t)st->expert_hits));
    json_object_set_new(j, "expert_misses", json_integer((json_int_t)st->expert_misses));
    json_object_set_new(j, "experts_predicted", json_integer((json_int_t)st->experts_predicted));
    json_object_set_new(j, "experts_predicted_used", json_integer((json_int_t)st->experts_predicted_used));
    json_object_set_new(j, "bytes_predicted", json_integer((json_int_t)st->bytes_predicted));
    json_object_set_new(j, "bytes_router", json_integer((json_int_t)st->bytes_router));
    json_object_set_new(j, "bytes_cancelled", json_integer((json_int_t)st->bytes_cancelled));
    json_object_set_new(j, "io_wait_seconds", json_real(st->io_wait_seconds));
    json_object_set_new(j, "phase_switches", json_integer((json_int_t)st->phase_switches));
    json_object_set_new(j, "bytes_lent_reread", json_integer((json_int_t)st->bytes_lent_reread));
    json_object_set_new(j, "bytes_discarded", json_integer((json_int_t)st->bytes_discarded));
    json_object_set_new(j, "routing", routing_json(m));
    json_object_set_new(j, "peak_rss_bytes", json_integer((json_int_t)kmem_peak_rss()));
    json_object_set_new(j, "simd", json_string(krun_simd_name()));
    json_object_set_new(j, "threads", json_integer(krun_model_threads(m)));
    if (krun_model_plan(m)) json_object_set_new(j, "plan", kmemplan_json(krun_model_plan(m)));
    json_object_set_new(j, "cluster", cluster_json(m));
}

int gen_report_json(const char *path, krun_model *m, const krun_session *s, const gen_record *r)
{
    struct decode_totals d = decode_totals(r->steps, r->n_steps);
    krun_stats st;
    json_t *j = json_object(), *sp = json_array(), *sa = json_array();
    int rc = 0;
    krun_model_stats(m, &st);
    /* the time until each generated token: the prompt pass for the first,
     * one decoding sweep for each of the others (a sweep that gave several
     * tokens, with --spec, shares its time among them) */
    if (r->n_gen) json_array_append_new(sp, json_real(r->t_prefill));
    for (size_t k = 0; k < r->n_steps; k++) {
        const gen_step *x = &r->steps[k];
        for (size_t i = 0; i < x->tokens; i++) json_array_append_new(sp, json_real(x->seconds / (double)x->tokens));
        json_array_append_new(sa, step_json(m, x));
    }
    json_object_set_new(j, "prompt_ids", ids_json(r->prompt, r->n_prompt));
    json_object_set_new(j, "generated_ids", ids_json(r->gen, r->n_gen));
    json_object_set_new(j, "seconds_per_token", sp);
    json_object_set_new(j, "steps", sa);
    json_object_set_new(j, "prefill_seconds", json_real(r->t_prefill));
    json_object_set_new(j, "decode", decode_json(&d));
    json_object_set_new(j, "spec", spec_json(r, m, s));
    if (r->cache) {
        json_t *c = json_object();
        json_object_set_new(c, "cached_positions", json_integer((json_int_t)r->cached));
        json_object_set_new(c, "prefilled_positions", json_integer((json_int_t)(r->n_prompt - r->cached)));
        json_object_set_new(j, "prefix_cache", c);
    } else {
        json_object_set_new(j, "prefix_cache", json_null());
    }
    totals_json(j, m, &st);
    /* what the cost model said the prompt would read, in the block it chose (beside bytes_read) */
    if (krun_model_plan(m) && r->n_prompt) json_object_set_new(j, "prompt_plan", kmemplan_prompt_json(krun_model_plan(m), r->n_prompt, 0));
    if (json_dump_file(j, path, JSON_INDENT(1)) != 0) {
        fprintf(stderr, "krun: cannot write %s\n", path);
        rc = -1;
    }
    json_decref(j);
    return rc;
}
