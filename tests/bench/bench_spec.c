/* Verification blocks with drafts that come true: decode a prompt greedily
 * with krun_session_verify, the drafts being the model's own continuation
 * (read from a plain run's --json), so every draft is accepted -- what the
 * prompt-lookup drafter proposes on text that repeats exactly -- or with
 * every m-th draft made wrong.  Prints the same figures as krun's --json
 * "decode" and "spec" objects, and checks that the ids are the plain run's.
 *
 *   bench_spec MODEL.kpk --ref PLAIN.json --drafts K [--wrong M] [--mem SIZE [--pin N] [--expert-slots N]] [--json OUT]
 *
 * PLAIN.json: `krun MODEL.kpk --ids ... --gen N --ignore-eos --json PLAIN.json`
 * (its prompt_ids and generated_ids).  Built by tests/bench/bench_spec.sh. */
#include "format/kargs.h"
#include "run/session/session.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int32_t *ids_of(json_t *a, size_t *n)
{
    int32_t *v = malloc((json_array_size(a) + 1) * sizeof *v);
    *n = json_array_size(a);
    for (size_t i = 0; v && i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return v;
}

int main(int argc, char **argv)
{
    const char *path = NULL, *ref = NULL, *mem = NULL, *out = NULL;
    size_t K = 8, M = 0, np, ng, g = 0;
    int pin = -1, slots = -1;
    krun_model_opts o;
    krun_model *m;
    krun_session *s;
    krun_err e;
    json_error_t je;
    json_t *j;
    int32_t *prompt, *want, *got, acc[64], draft[64];
    krun_stats a, b;
    krun_spec_stats sp;
    double t0, secs;
    int32_t V;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ref") && i + 1 < argc) ref = argv[++i];
        else if (!strcmp(argv[i], "--drafts") && i + 1 < argc) K = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--wrong") && i + 1 < argc) M = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--mem") && i + 1 < argc) mem = argv[++i];
        else if (!strcmp(argv[i], "--pin") && i + 1 < argc) pin = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--expert-slots") && i + 1 < argc) slots = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) out = argv[++i];
        else if (!path) path = argv[i];
        else { fprintf(stderr, "bench_spec: unexpected %s\n", argv[i]); return 2; }
    }
    if (!path || !ref || K < 1 || K > 64) {
        fprintf(stderr, "usage: bench_spec MODEL.kpk --ref PLAIN.json --drafts K [--wrong M] [--mem SIZE [--pin N] [--expert-slots N]] [--json OUT]\n");
        return 2;
    }
    if (!(j = json_load_file(ref, 0, &je))) { fprintf(stderr, "bench_spec: %s: %s\n", ref, je.text); return 2; }
    prompt = ids_of(json_object_get(j, "prompt_ids"), &np);
    want = ids_of(json_object_get(j, "generated_ids"), &ng);
    got = calloc(ng + 1, sizeof *got);
    if (!prompt || !want || !got || !np || ng < 2) { fprintf(stderr, "bench_spec: %s: no prompt or generation\n", ref); return 2; }
    krun_model_opts_init(&o);
    o.path = path;
    o.ctx = np + ng;
    o.spec = K;
    if (mem) o.budget = (uint64_t)kargs_size(mem);
    o.pin = pin;
    o.expert_slots = slots;
    if (krun_model_open(&o, &m, &e) || krun_session_new(m, &s, &e) || krun_session_feed(s, prompt, np, NULL, &e)) {
        fprintf(stderr, "bench_spec: %s\n", e.msg);
        return e.code;
    }
    V = (int32_t)krun_model_config(m)->vocab;
    krun_model_stats(m, &a);
    t0 = now();
    for (;;) {
        size_t na = 0, k;
        got[g] = krun_session_sample(s);
        if (++g == ng) break;
        /* the drafts: what the plain run generated next (every M-th of them wrong) */
        k = K < ng - g - 1 ? K : ng - g - 1;
        for (size_t i = 0; i < k; i++) draft[i] = M && (g + i) % M == 0 ? (want[g + i] + 1) % V : want[g + i];
        if (krun_session_verify(s, got[g - 1], draft, k, acc, NULL, &na, &e)) { fprintf(stderr, "bench_spec: %s\n", e.msg); return e.code; }
        for (size_t i = 0; i < na; i++) got[g++] = acc[i];
    }
    secs = now() - t0;
    krun_model_stats(m, &b);
    krun_session_spec_stats(s, &sp);
    {
        const uint64_t bytes = b.bytes_trunk + b.bytes_experts + b.bytes_globals - a.bytes_trunk - a.bytes_experts - a.bytes_globals;
        const size_t tokens = ng - 1;
        const int same = memcmp(got, want, ng * sizeof *got) == 0;
        json_t *r = json_object(), *d = json_object(), *x = json_object();
        printf("drafts %zu%s: %llu sweeps for %zu tokens, %llu drafted, %llu accepted; %.3f GB and %.3f s per generated token; ids %s\n",
               K, M ? " (some wrong)" : "", (unsigned long long)sp.sweeps, tokens, (unsigned long long)sp.drafted,
               (unsigned long long)sp.accepted, (double)bytes / (double)tokens / 1e9, secs / (double)tokens,
               same ? "== the plain run's" : "DIFFER from the plain run's");
        json_object_set_new(d, "sweeps", json_integer((json_int_t)sp.sweeps));
        json_object_set_new(d, "tokens", json_integer((json_int_t)tokens));
        json_object_set_new(d, "seconds", json_real(secs));
        json_object_set_new(d, "bytes", json_integer((json_int_t)bytes));
        json_object_set_new(d, "seconds_per_token", json_real(secs / (double)tokens));
        json_object_set_new(d, "bytes_per_token", json_real((double)bytes / (double)tokens));
        json_object_set_new(x, "drafted", json_integer((json_int_t)sp.drafted));
        json_object_set_new(x, "accepted", json_integer((json_int_t)sp.accepted));
        json_object_set_new(r, "decode", d);
        json_object_set_new(r, "spec", x);
        json_object_set_new(r, "same_ids", json_boolean(same));
        if (out && json_dump_file(r, out, JSON_INDENT(1))) { fprintf(stderr, "bench_spec: cannot write %s\n", out); return 2; }
        json_decref(r);
        krun_session_free(s);
        krun_model_close(m);
        json_decref(j);
        free(prompt);
        free(want);
        free(got);
        return same ? 0 : 1;
    }
}
