/* The sampler (run/session/sampler.c) against its contract (sampler.h):
 *  - the draw: Philox4x64-10 against known-answer vectors (Random123's, and numpy's Philox,
 *    an independent implementation: its counter is incremented before use, so the vectors
 *    below were made with counter - 1), and uniform (chi-square);
 *  - the pick against a plain reference that follows the contract literally (a full sort in
 *    the canonical order, every filter by its definition) on 20,000 random cases: tiny to
 *    300-token vocabularies with many tied logits, every option, penalties, masks, and a few
 *    at the real vocabulary's 163,840 tokens;
 *  - its distribution: over 200,000 positions the picks follow the kept probabilities
 *    (chi-square), so the draw and the walk really sample;
 *  - it depends on (seed, stream, position) only: not on what was drawn before;
 *  - the penalties by hand (vLLM's repetition rule on positive and negative logits, OpenAI's
 *    frequency and presence over the reply only), exact values;
 *  - the mask: a masked token is never picked, top-k ranks among the allowed, none -> -1;
 *  - the log-probabilities against a long double reference, and their top-n order. */
#include "check.h"
#include "testrand.h"
#include "run/session/sampler.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define BIGV 163840

static ksampler_scratch scratch_new(size_t cap)
{
    ksampler_scratch x;
    x.order = xmalloc(cap * sizeof *x.order);
    x.prob = xmalloc(cap * sizeof *x.prob);
    x.work = xmalloc(cap * sizeof *x.work);
    x.count = xmalloc(cap * sizeof *x.count);
    return x;
}

static void scratch_free(ksampler_scratch *x) { free(x->order); free(x->prob); free(x->work); free(x->count); }

/* ---- the draw ----------------------------------------------------------------------------------- */

static void check_philox(void)
{
    /* counter, key -> output: the first three are Random123's kat_vectors for philox4x64_10
     * (zeros, all ones, the digits of pi); all six agree with numpy 1.24's Philox */
    static const uint64_t kat[][10] = {
        {0, 0, 0, 0, 0, 0, 0x16554d9eca36314cULL, 0xdb20fe9d672d0fdcULL, 0xd7e772cee186176bULL, 0x7e68b68aec7ba23bULL},
        {~0ULL, ~0ULL, ~0ULL, ~0ULL, ~0ULL, ~0ULL, 0x87b092c3013fe90bULL, 0x438c3c67be8d0224ULL, 0x9cc7d7c69cd777b6ULL,
         0xa09caebf594f0ba0ULL},
        {0x243f6a8885a308d3ULL, 0x13198a2e03707344ULL, 0xa4093822299f31d0ULL, 0x082efa98ec4e6c89ULL, 0x452821e638d01377ULL,
         0xbe5466cf34e90c6cULL, 0xa528f45403e61d95ULL, 0x38c72dbd566e9788ULL, 0xa5a1610e72fd18b5ULL, 0x57bd43b5e52b7fe6ULL},
        {7, 0, 0, 0, 12345, 0, 0x23e1de1e61688efeULL, 0x19fd3add7edfae2fULL, 0x1a650e384c450e5bULL, 0xbba64ec46f0b0c98ULL},
        {0x0000010000000005ULL, 0, 0, 0, ~0ULL, 3, 0x54f4fadadf4c43dcULL, 0x354c809d3a9a62a0ULL, 0x4d7df2a8f46dd664ULL,
         0x772ec504468685c8ULL},
        {262143, 0, 0, 0, 1, 1, 0xf522fd17556ea747ULL, 0xac36c421830f3928ULL, 0x7d349f0e12f0d3d0ULL, 0x6a62a4a7f0039b3aULL},
    };
    int ok = 1;
    for (size_t v = 0; v < sizeof kat / sizeof kat[0]; v++) {
        uint64_t out[4];
        ksampler_philox(kat[v], kat[v] + 4, out);
        ok &= !memcmp(out, kat[v] + 6, sizeof out);
    }
    CHECK(ok, "Philox4x64-10: 6 known-answer vectors (Random123, numpy)");
    /* the draw is the first word's top 53 bits of (pos, 0, 0, 0) under (seed, stream) */
    CHECK(ksampler_draw(12345, 0, 7) == (double)(0x23e1de1e61688efeULL >> 11) * 0x1.0p-53 &&
              ksampler_draw(1, 1, 262143) == (double)(0xf522fd17556ea747ULL >> 11) * 0x1.0p-53,
          "ksampler_draw(seed, stream, pos) = Philox(counter (pos,0,0,0), key (seed,stream)) word 0 >> 11, times 2^-53");
}

/* Chi-square of counts against equal expectations; the critical value at p = 1e-6 for df
 * 63 is about 125 (and the statistic's mean is 63). */
static double chi2_uniform(const unsigned *c, size_t bins, double total)
{
    double e = total / (double)bins, x = 0;
    for (size_t i = 0; i < bins; i++) x += ((double)c[i] - e) * ((double)c[i] - e) / e;
    return x;
}

static void check_draw_uniform(void)
{
    unsigned by_pos[64] = {0}, by_seed[64] = {0}, low[64] = {0};
    double lo = 1, hi = 0, x1, x2, x3;
    for (uint64_t p = 0; p < 65536; p++) {
        double u = ksampler_draw(1, 0, p), v = ksampler_draw(p, 0, 5);
        by_pos[(size_t)(u * 64)]++;
        by_seed[(size_t)(v * 64)]++;
        /* the low bits too: a draw's 53 bits, bins of its bits 47..52 from the bottom */
        low[(uint64_t)(u * 0x1.0p53) & 63]++;
        if (u < lo) lo = u;
        if (u > hi) hi = u;
    }
    x1 = chi2_uniform(by_pos, 64, 65536);
    x2 = chi2_uniform(by_seed, 64, 65536);
    x3 = chi2_uniform(low, 64, 65536);
    CHECK(x1 < 125 && x2 < 125 && x3 < 125 && lo >= 0 && hi < 1,
          "draws uniform in [0,1): chi-square (63 df, 1e-6 level 125) over positions %.1f, over seeds %.1f, low bits %.1f", x1, x2,
          x3);
    /* seeds that differ in one bit are not the same stream shifted (as splitmix64(seed ^ pos) would be) */
    CHECK(ksampler_draw(2, 0, 3) != ksampler_draw(3, 0, 2) && ksampler_draw(0, 0, 1) != ksampler_draw(1, 0, 0) &&
              ksampler_draw(5, 1, 9) != ksampler_draw(5, 0, 9),
          "(seed, pos) and (pos, seed) draw differently; streams differ");
}

/* ---- the reference pick: the contract of sampler.h, literally --------------------------------- */

static const float *g_w;
static int cmp_canonical(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    if (g_w[x] != g_w[y]) return g_w[x] > g_w[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int32_t ref_pick(const ksampler_opts *o, const float *l, size_t n, const ksampler_seq *q, float *w, uint32_t *sorted,
                        double *x, unsigned char *keep)
{
    const float r = o->repetition_penalty > 0 ? o->repetition_penalty : 1.0f;
    size_t m = 0, from = q->reply_from < q->pos ? q->reply_from : q->pos, kept = 0;
    double z = 0, t, acc = 0, run = 0;
    int32_t last = -1;
    memcpy(w, l, n * sizeof *w);
    /* 1. penalties, token by token */
    for (size_t tok = 0; tok < n; tok++) {
        int any = 0;
        uint32_t c = 0;
        for (size_t i = 0; i < q->pos; i++) {
            any |= q->tokens[i] == (int32_t)tok;
            c += i >= from && q->tokens[i] == (int32_t)tok;
        }
        if (any && r != 1.0f) w[tok] = w[tok] > 0 ? w[tok] / r : w[tok] * r;
        if (c && o->frequency_penalty != 0) w[tok] = w[tok] - (float)c * o->frequency_penalty;
        if (c && o->presence_penalty != 0) w[tok] = w[tok] - o->presence_penalty;
        if (!isfinite(w[tok])) w[tok] = w[tok] > 0 ? FLT_MAX : -FLT_MAX;
    }
    /* 2. the candidates, in the canonical order */
    for (size_t i = 0; i < n; i++)
        if (!q->allowed || (q->allowed[i / 64] >> (i % 64) & 1)) sorted[m++] = (uint32_t)i;
    if (!m) return -1;
    g_w = w;
    qsort(sorted, m, sizeof *sorted, cmp_canonical);
    /* 3. greedy */
    if (o->temp <= 0) return (int32_t)sorted[0];
    /* 4. x, then the filters in order */
    memset(keep, 0, n);
    for (size_t j = 0; j < m; j++) {
        x[sorted[j]] = exp(((double)w[sorted[j]] - (double)w[sorted[0]]) / (double)o->temp);
        keep[sorted[j]] = !(o->top_k > 0 && j >= (size_t)o->top_k);
    }
    for (size_t j = 1; j < m; j++)
        if (o->min_p > 0 && x[sorted[j]] < (double)o->min_p) keep[sorted[j]] = 0;
    if (o->top_p < 1) {
        for (size_t i = 0; i < n; i++) if (keep[i]) z += x[i];
        for (size_t j = 0; j < m; j++) {
            if (!keep[sorted[j]]) continue;
            if (kept && run >= (double)o->top_p * z) keep[sorted[j]] = 0;
            else { run += x[sorted[j]]; kept++; }
        }
        z = 0;
    }
    /* 5. the draw over the kept tokens in id order */
    for (size_t i = 0; i < n; i++) if (keep[i]) z += x[i];
    t = ksampler_draw(o->seed, o->stream, q->pos) * z;
    for (size_t i = 0; i < n; i++) {
        if (!keep[i]) continue;
        acc += x[i];
        last = (int32_t)i;
        if (t < acc) return last;
    }
    return last;
}

static float pick_value(void)
{
    static const float ties[] = {-3.0f, -1.0f, 0.0f, 0.5f, 1.0f, 2.0f, 2.0f};
    return rnd() % 3 ? ties[rnd() % 7] : unif(-6.0f, 6.0f);
}

static void random_opts(ksampler_opts *o, size_t n)
{
    static const float temps[] = {0, 0.05f, 0.7f, 1.0f, 2.5f}, tops[] = {1, 0.9f, 0.5f, 0, 0.999f}, minps[] = {0, 0.05f, 0.5f, 1};
    static const float reps[] = {0, 1, 1.3f, 0.7f, 1e-30f}, freqs[] = {0, 0.5f, -0.7f}, pres[] = {0, 1.0f, -0.5f};
    ksampler_opts_init(o);
    o->temp = temps[rnd() % 5];
    switch (rnd() % 5) {
    case 0: o->top_k = 0; break;
    case 1: o->top_k = 1; break;
    case 2: o->top_k = 3; break;
    case 3: o->top_k = (int)(n / 2); break;
    default: o->top_k = (int)n + 5;
    }
    o->top_p = tops[rnd() % 5];
    o->min_p = minps[rnd() % 4];
    if (rnd() % 2) {
        o->repetition_penalty = reps[rnd() % 5];
        o->frequency_penalty = freqs[rnd() % 3];
        o->presence_penalty = pres[rnd() % 3];
    }
    o->seed = rnd();
    o->stream = rnd() % 3;
}

static void check_against_reference(void)
{
    const size_t NMAX = 300;
    ksampler_scratch sx = scratch_new(BIGV);
    float *l = xmalloc(BIGV * sizeof *l), *w = xmalloc(BIGV * sizeof *w);
    uint32_t *sorted = xmalloc(BIGV * sizeof *sorted);
    double *x = xmalloc(BIGV * sizeof *x);
    unsigned char *keep = xmalloc(BIGV);
    int32_t tokens[64];
    uint64_t allowed[(BIGV + 63) / 64];
    size_t cases = 0, differ = 0, masked = 0, none = 0, penalized = 0;
    rs = 0x5A3D1E;
    for (int c = 0; c < 20000; c++) {
        const size_t n = 1 + rnd() % NMAX;
        ksampler_opts o;
        ksampler s;
        ksampler_seq q = {tokens, rnd() % 64, 0, NULL};
        int32_t a, b;
        for (size_t i = 0; i < n; i++) l[i] = pick_value();
        for (size_t i = 0; i < q.pos; i++) tokens[i] = (int32_t)(rnd() % (n < 12 ? n : 12));   /* repeats */
        q.reply_from = rnd() % 70;
        if (rnd() % 3 == 0) {
            memset(allowed, 0, sizeof allowed);
            for (size_t i = 0; i < n; i++) if (rnd() % 4 == 0) allowed[i / 64] |= 1ULL << (i % 64);
            q.allowed = allowed;
            masked++;
        }
        random_opts(&o, n);
        ksampler_init(&s, &o, &sx, BIGV);
        a = ksampler_pick(&s, l, n, &q);
        b = ref_pick(&o, l, n, &q, w, sorted, x, keep);
        differ += a != b;
        none += a < 0;
        penalized += ksampler_uses_history(&o) && q.pos;
        cases++;
    }
    CHECK(differ == 0, "%zu random cases (vocabularies 1..%zu, tied logits, %zu masked, %zu penalized, %zu with no allowed "
          "token): the pick equals the contract's reference in %zu", cases, NMAX, masked, penalized, none, cases - differ);
    /* the real vocabulary's size: heaps deep enough to matter */
    differ = 0;
    for (int c = 0; c < 24; c++) {
        ksampler_opts o;
        ksampler s;
        ksampler_seq q = {tokens, 40, 10, NULL};
        for (size_t i = 0; i < BIGV; i++) l[i] = c % 2 ? pick_value() : unif(-4, 4);
        for (size_t i = 0; i < q.pos; i++) tokens[i] = (int32_t)(rnd() % BIGV);
        random_opts(&o, BIGV);
        if (o.temp == 0) o.temp = 0.8f;
        if (c % 3 == 0) o.top_k = 0, o.top_p = 0.95f;
        ksampler_init(&s, &o, &sx, BIGV);
        differ += ksampler_pick(&s, l, BIGV, &q) != ref_pick(&o, l, BIGV, &q, w, sorted, x, keep);
    }
    CHECK(differ == 0, "24 picks over %d tokens equal the reference", BIGV);
    /* what a pick costs at full vocabulary (informative) */
    {
        static const struct { float temp, top_p; int top_k; float min_p; } st[] = {
            {0, 1, 0, 0}, {1, 1, 0, 0}, {0.7f, 0.9f, 0, 0}, {0.7f, 1, 40, 0}, {0.7f, 1, 0, 0.05f}};
        for (size_t k = 0; k < sizeof st / sizeof st[0]; k++) {
            ksampler_opts o;
            ksampler s;
            struct timespec t0, t1;
            ksampler_opts_init(&o);
            o.temp = st[k].temp; o.top_p = st[k].top_p; o.top_k = st[k].top_k; o.min_p = st[k].min_p;
            for (size_t i = 0; i < BIGV; i++) l[i] = unif(-4, 4);
            ksampler_init(&s, &o, &sx, BIGV);
            clock_gettime(CLOCK_MONOTONIC, &t0);
            for (int r = 0; r < 5; r++) { ksampler_seq q = {tokens, (size_t)r, 0, NULL}; (void)ksampler_pick(&s, l, BIGV, &q); }
            clock_gettime(CLOCK_MONOTONIC, &t1);
            printf("# a pick over %d tokens at temp %g top_p %g top_k %d min_p %g: %.2f ms\n", BIGV, (double)o.temp,
                   (double)o.top_p, o.top_k, (double)o.min_p,
                   ((double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6) / 5);
        }
    }
    scratch_free(&sx);
    free(l); free(w); free(sorted); free(x); free(keep);
}

/* ---- the distribution ---------------------------------------------------------------------------- */

static void check_distribution(void)
{
    /* at temp 0.8 the logits 2, 1.5, 1, 0.5, -1, -3 give x = 1, .535, .287, .153, .024, .002
     * (Z = 2.001); top_p 0.9 keeps the shortest prefix reaching 1.801: 1 + .535 + .287 = 1.822,
     * the first three.  Their picks over 200,000 positions must follow 1 : .535 : .287. */
    const float l[6] = {1.0f, 2.0f, -1.0f, 1.5f, -3.0f, 0.5f};   /* the same values, shuffled over the ids */
    ksampler_scratch sx = scratch_new(6);
    ksampler_opts o;
    ksampler s;
    unsigned c[6] = {0};
    double e[6] = {0}, z = 0, chi = 0;
    const size_t N = 200000;
    ksampler_opts_init(&o);
    o.temp = 0.8f;
    o.top_p = 0.9f;
    o.seed = 42;
    ksampler_init(&s, &o, &sx, 6);
    for (size_t p = 0; p < N; p++) {
        ksampler_seq q = {NULL, p, 0, NULL};
        int32_t t = ksampler_pick(&s, l, 6, &q);
        if (t >= 0) c[t]++;
    }
    for (int i = 0; i < 6; i++) if (i == 0 || i == 1 || i == 3) z += exp(((double)l[i] - 2.0) / 0.8);
    for (int i = 0; i < 6; i++) if (i == 0 || i == 1 || i == 3) e[i] = exp(((double)l[i] - 2.0) / 0.8) / z * (double)N;
    for (int i = 0; i < 6; i++) if (e[i] > 0) chi += ((double)c[i] - e[i]) * ((double)c[i] - e[i]) / e[i];
    /* df 2: the 1e-6 critical value is 27.6 */
    CHECK(c[2] == 0 && c[4] == 0 && c[5] == 0 && chi < 27.6,
          "200,000 picks at temp 0.8, top_p 0.9 follow the kept probabilities: %u %u %u (expected %.0f %.0f %.0f), chi-square %.2f "
          "(2 df), the filtered tokens never", c[1], c[3], c[0], e[1], e[3], e[0], chi);
    /* the same positions in reverse, and twice: the same tokens (no state between draws) */
    {
        int same = 1;
        for (size_t p = 1000; p-- > 0;) {
            ksampler_seq q = {NULL, p, 0, NULL};
            int32_t a = ksampler_pick(&s, l, 6, &q), b;
            ksampler s2;
            ksampler_init(&s2, &o, &sx, 6);
            b = ksampler_pick(&s2, l, 6, &q);
            same &= a == b && a == ksampler_pick(&s, l, 6, &q);
        }
        CHECK(same, "a pick depends on (seed, stream, position) only: positions in reverse, twice, or by a fresh sampler give "
              "the same tokens");
    }
    scratch_free(&sx);
}

/* ---- penalties and the mask, by hand --------------------------------------------------------------- */

static int32_t greedy_with(const float *l, size_t n, const int32_t *tok, size_t pos, size_t reply_from, float r, float f, float p,
                           ksampler_scratch *sx)
{
    ksampler_opts o;
    ksampler s;
    ksampler_seq q = {tok, pos, reply_from, NULL};
    ksampler_opts_init(&o);
    o.repetition_penalty = r;
    o.frequency_penalty = f;
    o.presence_penalty = p;
    ksampler_init(&s, &o, sx, n);
    return ksampler_pick(&s, l, n, &q);
}

static void check_penalties(void)
{
    ksampler_scratch sx = scratch_new(8);
    {
        /* prompt [0], reply [1, 1, 2]: r = 2, f = 0.5, p = 0.25 */
        const float l[4] = {2.0f, -2.0f, 1.0f, 0.5f};
        const int32_t tok[4] = {0, 1, 1, 2};
        const float want[4] = {1.0f, -5.25f, -0.25f, 0.5f};
        int32_t t = greedy_with(l, 4, tok, 4, 1, 2.0f, 0.5f, 0.25f, &sx);
        CHECK(t == 0 && !memcmp(sx.work, want, sizeof want),
              "penalized logits exact: 2 -> 2/2 = 1 (prompt: repetition only); -2 -> -2*2 - 2*0.5 - 0.25 = -5.25; 1 -> 1/2 - 0.5 - "
              "0.25 = -0.25; 0.5 untouched (got %g %g %g %g)", (double)sx.work[0], (double)sx.work[1], (double)sx.work[2],
              (double)sx.work[3]);
    }
    {
        const float a[2] = {1.0f, 0.9f}, b[2] = {-1.0f, -1.5f}, c[2] = {1.0f, 0.0f};
        const int32_t zero[4] = {0, 0, 0, 0};
        CHECK(greedy_with(a, 2, zero, 1, 1, 2.0f, 0, 0, &sx) == 1, "repetition penalty counts the prompt: 1 / 2 < 0.9");
        CHECK(greedy_with(b, 2, zero, 1, 1, 2.0f, 0, 0, &sx) == 1,
              "repetition penalty multiplies a negative logit: -1 * 2 < -1.5 (dividing would keep token 0)");
        CHECK(greedy_with(a, 2, zero, 1, 1, 1.0f, 0, 0.5f, &sx) == 0 && greedy_with(a, 2, zero, 1, 0, 1.0f, 0, 0.5f, &sx) == 1,
              "presence penalty counts the reply only: the token in the prompt keeps 1, in the reply 0.5 < 0.9");
        CHECK(greedy_with(c, 2, zero, 3, 0, 1.0f, 0.3f, 0, &sx) == 0 && greedy_with(c, 2, zero, 4, 0, 1.0f, 0.3f, 0, &sx) == 1,
              "frequency penalty scales with the count: 1 - 3 * 0.3 > 0, 1 - 4 * 0.3 < 0");
        const float big[2] = {10.0f, 0.9f};
        CHECK(greedy_with(a, 2, zero, 1, 0, 0.0f, 0, 0, &sx) == 0 && greedy_with(big, 2, zero, 1, 0, 1e-38f, 0, 0, &sx) == 0 &&
              sx.work[0] == FLT_MAX,
              "repetition_penalty 0 is off; a penalized logit that overflows becomes FLT_MAX");
    }
    scratch_free(&sx);
}

static void check_mask(void)
{
    ksampler_scratch sx = scratch_new(130);
    float l[130];
    uint64_t allowed[3] = {0, 0, 0};
    ksampler_opts o;
    ksampler s;
    int never = 1;
    for (int i = 0; i < 130; i++) l[i] = (float)i / 10.0f;    /* 129 is the best */
    allowed[0] = 1ULL << 3 | 1ULL << 60;
    allowed[2] = 1ULL << 1;                                 /* token 129 */
    ksampler_opts_init(&o);
    ksampler_init(&s, &o, &sx, 130);
    {
        ksampler_seq q = {NULL, 0, 0, allowed};
        CHECK(ksampler_pick(&s, l, 130, &q) == 129, "greedy with a mask: the best allowed token");
        allowed[2] = 0;
        CHECK(ksampler_pick(&s, l, 130, &q) == 60, "the best token masked: the best of the allowed (60)");
    }
    o.temp = 5.0f;
    o.top_k = 1;
    ksampler_init(&s, &o, &sx, 130);
    for (size_t p = 0; p < 2000; p++) {
        ksampler_seq q = {NULL, p, 0, allowed};
        never &= ksampler_pick(&s, l, 130, &q) == 60;
    }
    CHECK(never, "top_k 1 ranks among the allowed: 2,000 picks at temp 5 all 60");
    o.top_k = 0;
    ksampler_init(&s, &o, &sx, 130);
    never = 1;
    {
        unsigned c3 = 0;
        for (size_t p = 0; p < 2000; p++) {
            ksampler_seq q = {NULL, p, 0, allowed};
            int32_t t = ksampler_pick(&s, l, 130, &q);
            never &= t == 3 || t == 60;
            c3 += t == 3;
        }
        CHECK(never && c3 > 0, "at temp 5, 2,000 picks only among the two allowed tokens (%u of token 3)", c3);
    }
    memset(allowed, 0, sizeof allowed);
    {
        ksampler_seq q = {NULL, 0, 0, allowed};
        CHECK(ksampler_pick(&s, l, 130, &q) == -1, "nothing allowed: -1");
    }
    scratch_free(&sx);
}

/* ---- log-probabilities ----------------------------------------------------------------------------- */

static void check_logprobs(void)
{
    float *l = xmalloc(BIGV * sizeof *l);
    int32_t top[20];
    double lp[20], worst = 0, mass_err = 0;
    int order_ok = 1;
    rs = 0xC0FFEE;
    for (int c = 0; c < 40; c++) {
        const size_t n = c < 30 ? 1 + rnd() % 500 : BIGV, tn = rnd() % 21;
        long double z = 0, mass = 0;
        float mx;
        size_t mi = 0;
        int32_t id = (int32_t)(rnd() % n);
        double got;
        for (size_t i = 0; i < n; i++) l[i] = c % 2 ? pick_value() : unif(-30, 30);
        for (size_t i = 1; i < n; i++) if (l[i] > l[mi]) mi = i;
        mx = l[mi];
        for (size_t i = 0; i < n; i++) z += expl((long double)l[i] - mx);
        got = ksampler_logprobs(l, n, id, tn, top, lp);
        {
            double want = (double)(((long double)l[id] - mx) - logl(z));
            double err = fabs(got - want) / (fabs(want) > 1 ? fabs(want) : 1);
            if (err > worst) worst = err;
        }
        if (n <= 500) {   /* a call per token: quadratic, so on the small vocabularies */
            for (size_t i = 0; i < n; i++) mass += expl((long double)ksampler_logprobs(l, n, (int32_t)i, 0, NULL, NULL));
            if (fabsl(mass - 1) > mass_err) mass_err = (double)fabsl(mass - 1);
        }
        /* the top: the first tn in the canonical order (larger first, ties to the lower id) */
        {
            size_t want_n = tn < n ? tn : n;
            for (size_t j = 0; j < want_n; j++) {
                size_t better = 0;
                for (size_t i = 0; i < n; i++)
                    better += l[i] > l[top[j]] || (l[i] == l[top[j]] && (int32_t)i < top[j]);
                order_ok &= better == j && lp[j] == ksampler_logprobs(l, n, top[j], 0, NULL, NULL);
            }
        }
    }
    CHECK(worst < 1e-13 && mass_err < 1e-12,
          "log-probabilities against a long double reference: relative error %.2g; exp sums to 1 within %.2g", worst, mass_err);
    CHECK(order_ok, "the top-n: the most likely first, ties to the lower id, each with its own log-probability");
    free(l);
}

int main(void)
{
    check_philox();
    check_draw_uniform();
    check_against_reference();
    check_distribution();
    check_penalties();
    check_mask();
    check_logprobs();
    return check_exit();
}
