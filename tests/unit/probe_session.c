/* krun's session API checked from the outside, on a real .kpk file:
 *
 *   probe_session memory  FILE.kpk [--mem SIZE]   planned bytes == allocated bytes
 *   probe_session allocs  FILE.kpk [--mem SIZE]   no allocation per decoding step
 *   probe_session batch   FILE.kpk [--mem SIZE]   sessions stepped together == each alone, bit for bit
 *   probe_session copy    FILE.kpk [--mem SIZE]   a session copied (krun_session_copy) or snapshotted and
 *                                                 restored (krun_snapshot_*) continues bit for bit as the
 *                                                 original: ids, logits, the sampler's options and reply start, pending tokens
 *   probe_session mark    FILE.kpk [--mem SIZE]   a snapshot taken inside a block (krun_session_mark, into an
 *                                                 idle slot or a file; alone and in a batch) == the state of
 *                                                 a run that stopped there, bit for bit
 *   probe_session pcache  FILE.kpk [--mem SIZE]   requests through the prefix cache (krun_pcache, in RAM
 *                                                 and on disk, reopened) == each run alone, bit for bit:
 *                                                 every logit and id; each starts where it should
 *   probe_session sampler FILE.kpk [--mem SIZE]   the sampler through the session: the mask hook, the reply start
 *   probe_session spec    FILE.kpk [--mem SIZE]   speculative verification == plain decoding, bit for bit
 *                                                 (ids, logits, the saved state), a rollback at every
 *                                                 place of a block (--quick: in the middle of it, and
 *                                                 none); nothing allocated per round
 *   probe_session phases  FILE.kpk --mem SIZE [--ctx N]   --chunk auto with a prefill layout: planned ==
 *                                                 allocated for both layouts (the flex region holds
 *                                                 either), prompts crossing the phases (decoding ->
 *                                                 prefill -> decoding, twice, and a long prompt fed
 *                                                 while another session decodes, batched) == in
 *                                                 place in blocks of 64, every logit bit; nothing
 *                                                 allocated by a phase switch
 * Each takes --spec N: the model is prepared for verification blocks of N
 * drafts (the journal is planned and allocated; batching must not care).
 *
 * The binary replaces malloc and friends with counting wrappers around
 * glibc's own (__libc_malloc ...): every allocation of the process is seen,
 * from our code, from libc (qsort, stdio) and from the shared libraries
 * (xxHash, zstd).  Sanitizer builds keep their own allocator: the counting
 * checks skip there (the batch check still runs).  Prints TAP lines. */
#include "sanitized.h"
#include "format/kargs.h"
#include "run/engine/forward.h"
#include "run/session/pcache.h"
#include "run/session/session.h"
#include "run/session/statefile.h"
#include "run/util/procmem.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


static int fails;
static size_t g_spec;              /* --spec N: drafts the model is prepared for */
static ksampler_opts g_so;         /* spec: the sampler (--temp, --top-k, --top-p, --min-p, --seed, --penalties) */
static int g_mask;                 /* spec --mask: a mask that depends on the token before */
static char g_label[160];          /* what the sampler is, for the messages */
static size_t g_ctx = 1024;        /* --ctx N (phases) */
static int g_quick;                /* --quick: fewer variants (full-width models) */
#define OK(cond, ...) do { int c_ = (cond); printf("%s - ", c_ ? "ok" : "not ok"); printf(__VA_ARGS__); printf("\n"); if (!c_) fails++; } while (0)

/* ---- counting allocator ------------------------------------------------------- */

static _Atomic int counting;
static _Atomic unsigned long n_allocs;
#define MAX_SEEN 4096
static size_t seen[MAX_SEEN];          /* sizes of the allocations while counting */
static _Atomic unsigned long n_seen;

static __attribute__((unused)) void note(size_t n)
{
    if (!atomic_load(&counting)) return;
    atomic_fetch_add(&n_allocs, 1);
    {
        unsigned long k = atomic_fetch_add(&n_seen, 1);
        if (k < MAX_SEEN) seen[k] = n;
    }
}

static void count_start(void)
{
    atomic_store(&n_allocs, 0);
    atomic_store(&n_seen, 0);
    atomic_store(&counting, 1);
}

static unsigned long count_stop(void)
{
    atomic_store(&counting, 0);
    return atomic_load(&n_allocs);
}

#if !SANITIZED
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

void *malloc(size_t n) { note(n); return __libc_malloc(n); }
void *calloc(size_t a, size_t b) { note(a * b); return __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { note(n); return __libc_realloc(p, n); }
void free(void *p) { __libc_free(p); }
void *aligned_alloc(size_t al, size_t n) { note(n); return __libc_memalign(al, n); }
void *memalign(size_t al, size_t n) { note(n); return __libc_memalign(al, n); }
int posix_memalign(void **out, size_t al, size_t n)
{
    void *p;
    note(n);
    p = __libc_memalign(al, n);
    if (!p) return 12; /* ENOMEM */
    *out = p;
    return 0;
}
#endif

/* ---- helpers ------------------------------------------------------------------ */

static int g_cache;                /* the model is prepared for a prefix cache (o.cache) */

static int open_model(const char *path, const char *mem, size_t ctx, size_t chunk, size_t max_seqs, krun_model **m)
{
    krun_model_opts o;
    krun_err e;
    krun_model_opts_init(&o);
    o.cache = g_cache;
    o.path = path;
    o.ctx = ctx;
    o.chunk = chunk;
    o.max_seqs = max_seqs;
    o.spec = g_spec;
    o.threads = 2;
    if (mem) o.budget = (uint64_t)kargs_size(mem);
    if (krun_model_load(path, m, &e)) { printf("not ok - open %s: %s\n", path, e.msg); fails++; return -1; }
    count_start();
    if (krun_model_prepare(*m, &o, &e)) {
        count_stop();
        printf("not ok - prepare %s: %s\n", path, e.msg);
        fails++;
        krun_model_close(*m);
        return -1;
    }
    count_stop();
    return 0;
}

static int seen_size(uint64_t n)
{
    unsigned long k = atomic_load(&n_seen);
    for (unsigned long i = 0; i < k && i < MAX_SEEN; i++) if (seen[i] == n) return 1;
    return 0;
}

/* ---- memory: planned == allocated ---------------------------------------------- */

static void check_memory(const char *path, const char *mem)
{
    static const size_t shapes[][3] = {{16, 64, 1}, {100, 7, 1}, {64, 16, 3}, {4096, 64, 1}, {33, 1, 8}, {512, 8, 8}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        size_t ctx = shapes[k][0], chunk = shapes[k][1], seqs = shapes[k][2];
        krun_model *m;
        uint64_t planned, allocated, arena, slots;
        if (open_model(path, mem, ctx, chunk, seqs, &m)) return;
        krun_model_memory(m, &planned, &allocated);
        {
            const k3_config *c = krun_model_config(m);
            size_t block = k3_block_positions(chunk, seqs, g_spec);
            arena = k3_run_bytes(c, block, seqs, ctx, g_spec, 0);
            slots = (uint64_t)seqs * krun_session_bytes(c, ctx);
            if (krun_model_plan(m)) {
                const kmemplan *p = krun_model_plan(m);
                OK(p->state_bytes + p->vectors_bytes + p->scratch_bytes == planned,
                   "ctx %zu chunk %zu max_seqs %zu: the plan's state + vectors + scratch is what krun_model_memory reports", ctx, chunk, seqs);
            }
        }
        OK(planned == allocated && allocated == arena + slots,
           "ctx %zu chunk %zu max_seqs %zu spec %zu: planned %llu bytes == allocated %llu", ctx, chunk, seqs, g_spec,
           (unsigned long long)planned, (unsigned long long)allocated);
        if (g_spec && krun_model_plan(m)) {
            const kmemplan *p = krun_model_plan(m);
            OK(p->spec == g_spec && p->spec_bytes == k3_journal_bytes(krun_model_config(m), g_spec) && p->spec_bytes > 0 &&
               p->scratch_bytes >= p->spec_bytes && p->block >= g_spec + 1,
               "ctx %zu chunk %zu max_seqs %zu: the plan counts the --spec %zu journal (%llu bytes) in its scratch", ctx, chunk, seqs,
               g_spec, (unsigned long long)p->spec_bytes);
        }
        if (SANITIZED) printf("skip - ctx %zu chunk %zu max_seqs %zu: allocations seen by the hook (sanitizer build)\n", ctx, chunk, seqs);
        else
            OK(seen_size(arena) && seen_size(slots),
               "ctx %zu chunk %zu max_seqs %zu: the allocator was asked for exactly the run state (%llu) and the session slots (%llu)",
               ctx, chunk, seqs, (unsigned long long)arena, (unsigned long long)slots);
        krun_model_close(m);
    }
}

/* ---- allocs: nothing allocated per decoding step ------------------------------- */

static void check_allocs(const char *path, const char *mem)
{
    const int32_t prompt[] = {3, 7, 11, 5, 9, 100, 200, 30};
    const size_t steps = 16;
    krun_model *m;
    krun_session *s;
    krun_err e;
    ksampler_opts so;
    ksampler_opts_init(&so);
    so.temp = 0.8f; so.top_k = 40; so.top_p = 0.95f; so.seed = 7;
    unsigned long n;
    int ok = 1;
    if (SANITIZED) { printf("skip - allocations per decoding step (%s): sanitizer build\n", mem ? mem : "in place"); return; }
    if (open_model(path, mem, 64, 4, 1, &m)) return;
    if (krun_session_new(m, &s, &e)) { printf("not ok - session: %s\n", e.msg); fails++; krun_model_close(m); return; }
    krun_session_set_sampler(s, &so);
    /* warm-up: the prompt and two steps (first uses verify extents, bind vectors) */
    if (krun_session_feed(s, prompt, 8, NULL, &e)) ok = 0;
    for (int k = 0; k < 2 && ok; k++) {
        int32_t id = krun_session_sample(s);
        ok = id >= 0 && !krun_session_feed(s, &id, 1, NULL, &e);
    }
    count_start();
    for (size_t k = 0; k < steps && ok; k++) {
        int32_t id = krun_session_sample(s);
        krun_stats st;
        ok = id >= 0 && !krun_session_feed(s, &id, 1, NULL, &e);
        krun_model_stats(m, &st);
        (void)kmem_rss();
    }
    n = count_stop();
    if (!ok) { printf("not ok - decoding failed: %s\n", e.msg); fails++; }
    else OK(n == 0, "%s: %lu allocations in %zu decoding steps (sample + feed + statistics) after warm-up", mem ? mem : "in place", n, steps);
    krun_session_free(s);
    krun_model_close(m);
}

/* ---- batch: stepping together == stepping alone --------------------------------- */

#define NS 3
#define GEN 6

static int run_alone(const char *path, const char *mem, const int32_t *prompt, size_t n, float *logits, int32_t *ids)
{
    krun_model *m;
    krun_session *s;
    krun_err e;
    if (open_model(path, mem, 64, 4, 1, &m)) return -1;
    if (krun_session_new(m, &s, &e) || krun_session_feed(s, prompt, n, NULL, &e)) {
        printf("not ok - alone: %s\n", e.msg); fails++; krun_model_close(m); return -1;
    }
    {
        const size_t Vc = (size_t)krun_model_config(m)->vocab;
        for (int g = 0; g < GEN; g++) {
            memcpy(logits + (size_t)g * Vc, krun_session_logits(s), Vc * sizeof *logits);
            ids[g] = krun_session_sample(s);
            if (krun_session_feed(s, &ids[g], 1, NULL, &e)) { printf("not ok - alone: %s\n", e.msg); fails++; krun_model_close(m); return -1; }
        }
    }
    krun_model_close(m);
    return 0;
}

static void check_batch(const char *path, const char *mem)
{
    static const int32_t p0[] = {3, 7, 11, 5, 9, 100, 200, 30}, p1[] = {17, 17, 17}, p2[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
    const int32_t *prompts[NS] = {p0, p1, p2};
    const size_t lens[NS] = {8, 3, 13};
    krun_model *m;
    krun_session *s[NS];
    krun_err e;
    float *ref, *got;
    int32_t ref_ids[NS][GEN], ids[NS][GEN];
    size_t V;
    int same_bits = 1, same_ids = 1;
    if (open_model(path, mem, 64, 4, NS, &m)) return;
    V = (size_t)krun_model_config(m)->vocab;
    ref = malloc((size_t)NS * GEN * V * sizeof *ref);
    got = malloc((size_t)NS * GEN * V * sizeof *got);
    if (!ref || !got) { printf("not ok - out of memory\n"); fails++; krun_model_close(m); free(ref); free(got); return; }
    for (int k = 0; k < NS; k++)
        if (run_alone(path, mem, prompts[k], lens[k], ref + (size_t)k * GEN * V, ref_ids[k])) goto out;
    for (int k = 0; k < NS; k++)
        if (krun_session_new(m, &s[k], &e)) { printf("not ok - session %d: %s\n", k, e.msg); fails++; goto out; }
    {
        krun_session *extra;
        OK(krun_session_new(m, &extra, &e) == -1 && e.code == KRUN_EINPUT, "a session beyond max_seqs (%d) is refused: %s", NS, e.msg);
    }
    /* every round, each session with work left takes one token in the same
     * block: its next prompt token, or (prompt done) the one it samples; so
     * blocks mix prompts and generation at different positions, and sessions
     * drop out as they finish */
    {
        size_t round = 0, sampled[NS] = {0};
        for (;;) {
            krun_session *ss[NS];
            int32_t in[NS];
            size_t n = 0;
            for (int k = 0; k < NS; k++) {
                if (round < lens[k]) { ss[n] = s[k]; in[n++] = prompts[k][round]; continue; }
                if (sampled[k] == GEN) continue;
                memcpy(got + ((size_t)k * GEN + sampled[k]) * V, krun_session_logits(s[k]), V * sizeof *got);
                ids[k][sampled[k]] = krun_session_sample(s[k]);
                ss[n] = s[k];
                in[n++] = ids[k][sampled[k]++];
            }
            if (!n) break;
            if (krun_step_batch(m, ss, in, n, &e)) { printf("not ok - batch round %zu: %s\n", round, e.msg); fails++; goto out; }
            round++;
        }
    }
    for (int k = 0; k < NS; k++) {
        same_bits &= memcmp(ref + (size_t)k * GEN * V, got + (size_t)k * GEN * V, GEN * V * sizeof *got) == 0;
        same_ids &= memcmp(ref_ids[k], ids[k], sizeof ids[k]) == 0;
    }
    OK(same_bits, "%s: %d sessions (prompts of 8, 3, 13 tokens) fed and stepped together, %d tokens each: every logit bit equals each run alone",
       mem ? mem : "in place", NS, GEN);
    OK(same_ids, "%s: and the same greedy ids", mem ? mem : "in place");
    {
        /* one session twice in a step is refused */
        krun_session *dup[2] = {s[0], s[0]};
        int32_t in[2] = {1, 1};
        OK(krun_step_batch(m, dup, in, 2, &e) == -1 && e.code == KRUN_EINPUT, "a session twice in one step is refused: %s", e.msg);
    }
    {
        /* krun_session_all_logits (krun serve's echo): every position's logits of a prompt block run
         * in a batched step, beside another session's, == krun_session_feed's all_logits alone */
        float *want = malloc(13 * V * sizeof *want), *rows = malloc(13 * V * sizeof *rows);
        krun_session *a, *b, *c;
        int32_t in[2];
        krun_session *ss[2];
        for (int k = 0; k < NS; k++) krun_session_free(s[k]);
        if (!want || !rows || krun_session_new(m, &a, &e) || krun_session_new(m, &b, &e) || krun_session_new(m, &c, &e)) {
            printf("not ok - all_logits: setup: %s\n", want && rows ? e.msg : "out of memory");
            fails++;
            free(want);
            free(rows);
            goto out;
        }
        if (krun_session_feed(a, p2, 13, want, &e) || krun_session_feed(c, p0, 8, NULL, &e) || krun_session_append(b, p2, 2, &e)) {
            printf("not ok - all_logits: %s\n", e.msg);
            fails++;
        } else {
            /* the block holds 4 positions (chunk 4, 3 sessions): b's prompt in blocks of 3 (2 pending + its
             * id) beside c's decoding step, then one of 1 */
            int same = 1, refused;
            krun_session_all_logits(b, rows, 2);
            ss[0] = c; ss[1] = b; in[0] = 5; in[1] = p2[2];
            refused = krun_step_batch(m, ss, in, 2, &e) == -1 && e.code == KRUN_EINPUT;
            OK(refused, "all_logits: a buffer of 2 rows for 3 positions is refused: %s", e.msg);
            for (size_t at = 0; at < 13 && same; ) {
                size_t nb = 13 - at >= 3 ? 3 : 1;
                if (at && nb > 1 && krun_session_append(b, p2 + at, nb - 1, &e)) { same = 0; break; }
                krun_session_all_logits(b, rows + at * V, nb);
                in[0] = 5; in[1] = p2[at + nb - 1];
                if (krun_step_batch(m, ss, in, 2, &e)) { printf("# all_logits step at %zu: %s\n", at, e.msg); same = 0; break; }
                same &= !memcmp(krun_session_logits(b), want + (at + nb - 1) * V, V * sizeof *rows);
                at += nb;
            }
            OK(same && !memcmp(rows, want, 13 * V * sizeof *rows),
               "all_logits: a 13-position prompt in blocks of 3 and 1 stepped beside another session: every row's bits == krun_session_feed's all_logits; each block's last is the session's logits");
            ss[0] = b; in[0] = 9;
            memset(rows, 0, V * sizeof *rows);
            OK(!krun_step_batch(m, ss, in, 1, &e) && rows[0] == 0 && rows[V - 1] == 0, "all_logits: one step only (the next writes the session's own logits)");
        }
        krun_session_free(a);
        krun_session_free(b);
        krun_session_free(c);
        for (int k = 0; k < NS; k++) s[k] = NULL;
        free(want);
        free(rows);
    }
out:
    free(ref);
    free(got);
    krun_model_close(m);
}

/* ---- copy: a copied session continues as the original -------------------------- */

#define CP_GEN 10          /* tokens generated after the prompt */
#define CP_AT 4            /* copied after this many: CP_AT - 1 run, the last pending */

/* Sample and feed from where s is (g tokens generated so far; with a pending
 * token when pend) to CP_GEN, recording ids and the logits each came from;
 * the sessions in ss[0..n) advance together, one block per token. */
static int cp_continue(krun_model *m, krun_session **ss, size_t n, size_t g, int32_t ids[][CP_GEN], float *logits, krun_err *e)
{
    const size_t V = (size_t)krun_model_config(m)->vocab;
    for (; g < CP_GEN; g++) {
        int32_t in[NS];
        for (size_t k = 0; k < n; k++) {
            if (krun_session_pending(ss[k])) {            /* the pending token first (a copy taken there) */
                if (krun_session_feed(ss[k], NULL, 0, NULL, e)) return -1;
            }
            memcpy(logits + (k * CP_GEN + g) * V, krun_session_logits(ss[k]), V * sizeof *logits);
            in[k] = ids[k][g] = krun_session_sample(ss[k]);
        }
        if (g + 1 < CP_GEN && krun_step_batch(m, ss, in, n, e)) return -1;
    }
    return 0;
}

static void check_copy(const char *path, const char *mem)
{
    static const int32_t prompt[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
    /* at a temperature, with penalties counted from the reply start: the sampler's options and
     * reply start must come with the copy */
    const ksampler_opts so = {.temp = 0.8f, .top_p = 1.0f, .seed = 5, .presence_penalty = 0.4f, .frequency_penalty = 0.3f,
                              .repetition_penalty = 1.2f};
    krun_model *m;
    krun_session *a, *b, *c;
    krun_snapshot *snap = NULL, *small = NULL;
    krun_err e;
    float *ref, *got;
    int32_t ref_ids[1][CP_GEN], ids[NS][CP_GEN];
    size_t V, n, pos;
    int ok = 1;
    if (open_model(path, mem, 64, 4, NS, &m)) return;
    V = (size_t)krun_model_config(m)->vocab;
    ref = malloc((size_t)CP_GEN * V * sizeof *ref);
    got = malloc((size_t)NS * CP_GEN * V * sizeof *got);
    if (!ref || !got || krun_session_new(m, &a, &e) || krun_session_new(m, &b, &e) || krun_session_new(m, &c, &e)) {
        printf("not ok - copy: setup\n"); fails++; goto out;
    }
    /* the reference: one session, the whole way */
    krun_session_set_sampler(a, &so);
    krun_session_set_reply_start(a, 13);
    if (krun_session_feed(a, prompt, 13, NULL, &e) || cp_continue(m, &a, 1, 0, ref_ids, ref, &e)) goto bad;
    /* again to CP_AT tokens, the last appended (sampled, not run); copy and snapshot there */
    krun_session_reset(a);
    krun_session_set_sampler(a, &so);
    krun_session_set_reply_start(a, 13);
    if (krun_session_feed(a, prompt, 13, NULL, &e)) goto bad;
    for (size_t g = 0; g < CP_AT; g++) {
        ids[0][g] = krun_session_sample(a);
        if (g + 1 < CP_AT ? krun_session_feed(a, &ids[0][g], 1, NULL, &e) : krun_session_append(a, &ids[0][g], 1, &e)) goto bad;
    }
    OK(krun_session_copy(a, a, &e) == -1 && e.code == KRUN_EINPUT, "copy: a session onto itself is refused: %s", e.msg);
    if (krun_session_copy(b, a, &e) || krun_snapshot_new(m, 64, &snap, &e) || krun_snapshot_take(snap, a, &e)) goto bad;
    {
        const int32_t *h = krun_snapshot_tokens(snap, &n, &pos);
        OK(h && n == 13 + CP_AT && pos == 13 + CP_AT - 1 && krun_session_pending(b) == 1 && krun_session_pos(b) == pos,
           "copy: the copy and the snapshot hold the history with its pending token (%zu tokens, %zu run)", n, pos);
        OK(krun_session_reply_start(b) == 13 && krun_session_sampler(b)->seed == so.seed &&
               krun_session_sampler(b)->presence_penalty == so.presence_penalty,
           "copy: the copy has the original's reply start (%zu) and sampler options", krun_session_reply_start(b));
    }
    if (krun_snapshot_new(m, 8, &small, &e)) goto bad;
    OK(krun_snapshot_take(small, a, &e) == -1 && e.code == KRUN_EINPUT, "copy: a snapshot too small for the history is refused: %s", e.msg);
    /* a and its copy b step together: both must continue as the reference did */
    {
        krun_session *ab[2] = {a, b};
        for (size_t g = 0; g < CP_AT; g++) ids[1][g] = ids[0][g];
        if (cp_continue(m, ab, 2, CP_AT, ids, got, &e)) goto bad;
        for (size_t k = 0; k < 2; k++) {
            ok &= memcmp(ids[k], ref_ids[0], sizeof ref_ids[0]) == 0;
            ok &= memcmp(got + (k * CP_GEN + CP_AT) * V, ref + CP_AT * V, (CP_GEN - CP_AT) * V * sizeof *got) == 0;
        }
        OK(ok, "%s: a session and its copy (taken with a pending token, sampling at temperature 0.8 with penalties) stepped together: "
               "ids and every logit bit of the %d tokens after == the original run alone", mem ? mem : "in place", CP_GEN - CP_AT);
    }
    /* the snapshot restored, twice: into a fresh session and into a that has moved on */
    ok = 1;
    krun_session_set_reply_start(c, 0);
    if (krun_snapshot_restore(c, snap, &e) || krun_snapshot_restore(a, snap, &e)) goto bad;
    OK(krun_session_reply_start(c) == 13 && krun_session_sampler(c)->seed == so.seed,
       "copy: the snapshot restored brings the reply start (%zu) and the sampler options", krun_session_reply_start(c));
    {
        krun_session *ca[2] = {c, a};
        if (cp_continue(m, ca, 2, CP_AT, ids, got, &e)) goto bad;
        for (size_t k = 0; k < 2; k++)
            ok &= memcmp(ids[k] + CP_AT, ref_ids[0] + CP_AT, (CP_GEN - CP_AT) * sizeof **ids) == 0 &&
                  memcmp(got + (k * CP_GEN + CP_AT) * V, ref + CP_AT * V, (CP_GEN - CP_AT) * V * sizeof *got) == 0;
        OK(ok, "%s: a snapshot restored twice (a fresh session; the original after it ran on) continues bit for bit as the original",
           mem ? mem : "in place");
    }
    {
        krun_model *m2;
        krun_session *d;
        if (open_model(path, mem, 8, 4, 1, &m2) == 0) {
            if (krun_session_new(m2, &d, &e) == 0) {
                OK(krun_session_copy(d, a, &e) == -1 && e.code == KRUN_EINPUT, "copy: into a session of another model is refused: %s", e.msg);
                OK(krun_snapshot_restore(d, snap, &e) == -1 && e.code == KRUN_EINPUT, "copy: a snapshot restored into another model is refused: %s",
                   e.msg);
            }
            krun_model_close(m2);
        }
    }
    goto out;
bad:
    printf("not ok - copy: %s\n", e.msg);
    fails++;
out:
    krun_snapshot_free(snap);
    krun_snapshot_free(small);
    free(ref);
    free(got);
    krun_model_close(m);
}

/* ---- mark: a snapshot inside a block == a run that stopped there ---------------- */

/* The state file at path, read whole (NULL on failure; *len its size). */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *b = NULL;
    long n;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 && (b = malloc((size_t)n)) &&
        fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b) *len = (size_t)n;
    fclose(f);
    return b;
}

/* Do two state files hold the same history and layers (and, with logits,
 * the same logits), whatever their headers' flags? */
static int same_state(const char *a, const char *b, int logits)
{
    size_t na = 0, nb = 0;
    char *x = slurp(a, &na), *y = slurp(b, &nb);
    krun_state_hdr ha, hb;
    krun_err e;
    int same = x && y && !krun_state_parse(x, na, &ha, &e) && !krun_state_parse(y, nb, &hb, &e) && ha.pos == hb.pos &&
               ha.n_tokens == hb.n_tokens && ha.layers_at == hb.layers_at;
    if (same) {
        size_t end_a = KRUN_STATE_HEADER + ha.payload_len - ((ha.flags & KRUN_STATE_LOGITS) ? 4u * ha.vocab : 0);
        size_t end_b = KRUN_STATE_HEADER + hb.payload_len - ((hb.flags & KRUN_STATE_LOGITS) ? 4u * hb.vocab : 0);
        same = end_a == end_b && memcmp(x + ha.tokens_at, y + hb.tokens_at, end_a - ha.tokens_at) == 0;
        if (same && logits)
            same = (ha.flags & hb.flags & KRUN_STATE_LOGITS) && memcmp(x + ha.logits_at, y + hb.logits_at, 4u * ha.vocab) == 0;
    }
    free(x);
    free(y);
    return same;
}

/* The reference: a session that ran prompt[0..at) and stopped, saved. */
static int mark_reference(krun_model *m, const int32_t *prompt, size_t at, const char *path)
{
    krun_session *r;
    krun_err e;
    if (krun_session_new(m, &r, &e) || krun_session_feed(r, prompt, at, NULL, &e) || krun_session_save(r, path, &e)) {
        printf("not ok - mark reference: %s\n", e.msg);
        fails++;
        return -1;
    }
    krun_session_free(r);
    return 0;
}

/* An idle slot other than s (the model has max_seqs >= 2). */
static krun_session *idle_slot(krun_model *m)
{
    for (size_t k = 0; k < krun_model_slots(m); k++)
        if (!krun_session_live(krun_model_slot(m, k))) return krun_model_slot(m, k);
    return NULL;
}

static void check_mark(const char *path, const char *mem)
{
    static const int32_t prompt[] = {3, 7, 11, 5, 9, 100, 200, 30, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    const size_t n = sizeof prompt / sizeof *prompt;
    /* chunk 4: 7 is inside a block, 8 ends one, 1 is before the ShortConv history fills */
    static const size_t ats[] = {7, 8, 1, 19};
    char dir[] = "/tmp/probe_mark.XXXXXX", ref[64], got[64], file[64];
    const char *label = mem ? mem : "in place";
    krun_model *m;
    krun_session *s, *d, *x;
    krun_err e;
    if (!mkdtemp(dir)) { printf("not ok - mark: mkdtemp\n"); fails++; return; }
    snprintf(ref, sizeof ref, "%s/ref", dir);
    snprintf(got, sizeof got, "%s/got", dir);
    snprintf(file, sizeof file, "%s/file", dir);
    g_cache = 1;
    if (open_model(path, mem, 64, 4, 3, &m)) goto rm;
    g_cache = 0;
    for (size_t i = 0; i < sizeof ats / sizeof *ats; i++) {
        const size_t at = ats[i];
        const int logits = at % 4 == 0;        /* the position ends its block */
        if (mark_reference(m, prompt, at, ref)) break;
        /* into an idle slot, the session fed the whole prompt in blocks of 4 */
        if (krun_session_new(m, &s, &e) || !(d = idle_slot(m)) || krun_session_mark(s, at, d, &e) ||
            krun_session_feed(s, prompt, n, NULL, &e))
            goto bad;
        OK(krun_session_mark_status(s, NULL) == KRUN_MARK_TAKEN, "mark: the snapshot after %zu positions is taken", at);
        OK(krun_session_claim(d, &e) == 0 && krun_session_pos(d) == at && (krun_session_logits(d) != NULL) == logits,
           "mark: its slot claimed holds %zu positions run, %s", at, logits ? "with the logits (the position ended its block)" : "no logits");
        krun_session_set_sampler(d, &(ksampler_opts){.top_p = 1.0f});
        if (krun_session_save(d, got, &e)) goto bad;
        OK(same_state(ref, got, logits), "%s: a snapshot after %zu of %zu positions (blocks of 4), into an idle slot == a run of %zu positions: "
           "history, every KDA / ShortConv / MLA float%s", label, at, n, at, logits ? ", the logits" : "");
        krun_session_free(d);
        /* the same into a file, the layers written as the block runs */
        krun_session_reset(s);
        if (krun_session_mark_save(s, at, file, &e) || krun_session_feed(s, prompt, n, NULL, &e)) goto bad;
        OK(krun_session_mark_status(s, NULL) == KRUN_MARK_TAKEN && same_state(ref, file, 0) && !same_state(ref, file, 1),
           "%s: the snapshot after %zu positions written to a file while its block ran == a run of %zu positions (no logits in a file)",
           label, at, at);
        unlink(file);
        krun_session_free(s);
    }
    /* in a batch: the marked sequence's rows start after another sequence's */
    {
        const size_t at = 4;
        int32_t ids[2];
        krun_session *ss[2];
        if (mark_reference(m, prompt, at, ref)) goto out;
        if (krun_session_new(m, &x, &e) || krun_session_new(m, &s, &e) || !(d = idle_slot(m))) goto bad;
        if (krun_session_feed(x, prompt + 4, 3, NULL, &e) || krun_session_feed(s, prompt, 2, NULL, &e) ||
            krun_session_mark(s, at, d, &e) || krun_session_append(s, prompt + 2, 2, &e))
            goto bad;
        ss[0] = x; ss[1] = s;
        ids[0] = krun_session_sample(x);
        ids[1] = prompt[4];
        if (krun_step_batch(m, ss, ids, 2, &e) || krun_session_claim(d, &e)) goto bad;
        krun_session_set_sampler(d, &(ksampler_opts){.top_p = 1.0f});
        if (krun_session_save(d, got, &e)) goto bad;
        OK(krun_session_mark_status(s, NULL) == KRUN_MARK_TAKEN && same_state(ref, got, 0),
           "%s: a snapshot in a batched block (rows 1..3, after another sequence's; taken after row 2) == a run of %zu positions", label, at);
        krun_session_free(d);
        /* a mark is dropped by a reset, and its slot is free again */
        if (krun_session_mark(s, 9, idle_slot(m), &e)) goto bad;
        OK(krun_session_claim(idle_slot(m), &e) == -1, "mark: the slot of a pending snapshot cannot be claimed: %s", e.msg);
        krun_session_reset(s);
        OK(krun_session_mark_status(s, NULL) == KRUN_MARK_DROPPED && krun_session_claim(idle_slot(m), &e) == 0,
           "mark: a reset drops the snapshot and frees its slot");
    }
    goto out;
bad:
    printf("not ok - mark: %s\n", e.msg);
    fails++;
out:
    krun_model_close(m);
rm:
    unlink(ref);
    unlink(got);
    unlink(file);
    rmdir(dir);
}

/* ---- pcache: a request continued from the prefix cache == the same request alone ---- */

#define PC_GEN 4
#define PC_MAX 40

/* One request: prompt p[0..n) (its preamble ending at pre), then PC_GEN
 * tokens sampled (the last not run), through cache c, or alone on model r.
 * lg: the logits each token was sampled from; *reused: where it started. */
static int pc_request(krun_pcache *c, krun_model *r, const int32_t *p, size_t n, size_t pre, const ksampler_opts *so,
                      int32_t *ids, float *lg, size_t *reused)
{
    krun_session *s;
    krun_err e;
    const size_t V = (size_t)krun_model_config(r)->vocab;
    *reused = 0;
    if (c ? krun_pcache_begin(c, p, n, pre, &s, reused, &e) : krun_session_new(r, &s, &e)) goto bad;
    krun_session_set_sampler(s, so);
    if (*reused < n && krun_session_feed(s, p + *reused, n - *reused, NULL, &e)) goto bad;
    if (c) krun_pcache_keep(c, s);
    for (int g = 0; g < PC_GEN; g++) {
        memcpy(lg + (size_t)g * V, krun_session_logits(s), V * sizeof *lg);
        ids[g] = krun_session_sample(s);
        if (g + 1 < PC_GEN && krun_session_feed(s, &ids[g], 1, NULL, &e)) goto bad;
    }
    if (c) krun_pcache_end(c, s);
    else krun_session_free(s);
    return 0;
bad:
    printf("not ok - pcache request: %s\n", e.msg);
    fails++;
    return -1;
}

static void check_pcache(const char *path, const char *mem)
{
    /* chunk 4; the preamble (7 positions) ends inside a block */
    static const int32_t sys[] = {3, 7, 11, 5, 9, 100, 200};
    const size_t pre = sizeof sys / sizeof *sys;
    char dir[] = "/tmp/probe_pcache.XXXXXX";
    const char *label = mem ? mem : "in place";
    krun_model *m = NULL, *r = NULL;
    krun_pcache *c = NULL;
    krun_pcache_stats st;
    krun_err e;
    float *lg = NULL, *lr = NULL;
    int32_t ids[PC_GEN], rid[PC_GEN], p[PC_MAX], q[PC_MAX];
    size_t n1, n2, used, ru;
    ksampler_opts greedy = {.top_p = 1.0f}, warm = {.temp = 0.8f, .top_p = 1.0f, .seed = 5};
    if (!mkdtemp(dir)) { printf("not ok - pcache: mkdtemp\n"); fails++; return; }
    g_cache = 1;
    if (open_model(path, mem, 64, 4, 3, &m)) { g_cache = 0; goto rm; }
    g_cache = 0;
    if (open_model(path, mem, 64, 4, 1, &r)) goto out;
    {
        const size_t V = (size_t)krun_model_config(r)->vocab;
        krun_pcache_opts o = {dir, 0, 1, stderr, "probe_session"};
        lg = malloc(PC_GEN * V * sizeof *lg);
        lr = malloc(PC_GEN * V * sizeof *lr);
        if (!lg || !lr || krun_pcache_open(m, &o, &c, &e)) { printf("not ok - pcache open: %s\n", lg && lr ? e.msg : "memory"); fails++; goto out; }
#define SAME(what, ...) OK(!memcmp(ids, rid, sizeof ids) && !memcmp(lg, lr, PC_GEN * V * sizeof *lg), "%s: " what \
                           ": every logit and id == the request alone", label, __VA_ARGS__)
        /* 1: the preamble, a question: nothing kept yet */
        memcpy(p, sys, sizeof sys);
        for (size_t i = 0; i < 6; i++) p[pre + i] = (int32_t)(40 + 3 * i);
        n1 = pre + 6;
        if (pc_request(c, r, p, n1, pre, &greedy, ids, lg, &used) || pc_request(NULL, r, p, n1, 0, &greedy, rid, lr, &ru)) goto out;
        SAME("request 1 (%zu positions, nothing kept: started at %zu)", n1, used);
        OK(used == 0, "pcache: the first request starts at 0 (%zu)", used);
        /* 2: request 1 continued as a client sends it back: its prompt, its reply but the sampled
         * last token... (entry b: the reply's end), at temperature 0.8 */
        memcpy(q, p, n1 * sizeof *p);
        memcpy(q + n1, ids, PC_GEN * sizeof *ids);
        n2 = n1 + PC_GEN;
        q[n2++] = 17; q[n2++] = 18; q[n2++] = 19;
        if (pc_request(c, r, q, n2, pre, &warm, ids, lg, &used) || pc_request(NULL, r, q, n2, 0, &warm, rid, lr, &ru)) goto out;
        SAME("request 2 continues request 1's reply, temperature 0.8 (started at %zu of %zu)", used, n2);
        OK(used == n1 + PC_GEN - 1, "pcache: request 2 starts at the end of request 1's reply (%zu == %zu)", used, n1 + PC_GEN - 1);
        /* 3: the same preamble, another question: entry c, a snapshot inside a block */
        p[pre] = 77;
        if (pc_request(c, r, p, n1, pre, &greedy, ids, lg, &used) || pc_request(NULL, r, p, n1, 0, &greedy, rid, lr, &ru)) goto out;
        SAME("request 3 shares request 1's preamble (started at %zu)", used);
        OK(used == pre, "pcache: request 3 starts at the end of the preamble (%zu == %zu, inside a block of 4)", used, pre);
        /* 4: request 3's prompt again: entry a, with its logits: nothing run */
        if (pc_request(c, r, p, n1, pre, &greedy, ids, lg, &used) || pc_request(NULL, r, p, n1, 0, &greedy, rid, lr, &ru)) goto out;
        SAME("request 4 == request 3's prompt (started at %zu of %zu)", used, n1);
        OK(used == n1, "pcache: request 4 runs none of its prompt (the kept logits)");
        /* 5: a new cache over the same directory (RAM forgotten): request 2 again, from its file */
        krun_pcache_close(c);
        c = NULL;
        if (krun_pcache_open(m, &o, &c, &e)) { printf("not ok - pcache reopen: %s\n", e.msg); fails++; goto out; }
        for (size_t k = 0; k < krun_model_slots(m); k++) krun_session_reset(krun_model_slot(m, k));
        if (pc_request(c, r, q, n2, pre, &warm, ids, lg, &used) || pc_request(NULL, r, q, n2, 0, &warm, rid, lr, &ru)) goto out;
        krun_pcache_get_stats(c, &st);
        SAME("request 2 again after a reopen, from the disk (started at %zu)", used);
        OK(used == n2 && st.hits_disk == 1 && st.damaged == 0, "pcache: after a reopen request 2's prompt comes from its file (%zu of %zu, %llu from disk)",
           used, n2, (unsigned long long)st.hits_disk);
#undef SAME
    }
out:
    krun_pcache_close(c);
    if (r) krun_model_close(r);
    if (m) krun_model_close(m);
    free(lg);
    free(lr);
rm:
    {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0) printf("# could not remove %s\n", dir);
    }
}

/* ---- spec: verification blocks == plain decoding ---------------------------------- */

#define SPEC_GEN_MAX 14
static size_t SPEC_GEN = SPEC_GEN_MAX;     /* tokens generated (--quick: 8) */

/* A mask that depends on the history (the token before): ids i with (i + prev) % 3 != 0.
 * In a verification the token before is a draft, so a verification that asked the mask
 * with the wrong history would pick otherwise than plain decoding. */
static size_t g_vocab;
static int mask_prev(void *ctx, const int32_t *tokens, size_t pos, uint64_t *allowed)
{
    const size_t prev = pos ? (size_t)tokens[pos - 1] : 0;
    (void)ctx;
    memset(allowed, 0, (g_vocab + 63) / 64 * sizeof *allowed);
    for (size_t i = 0; i < g_vocab; i++)
        if ((i + prev) % 3 != 0) allowed[i / 64] |= 1ULL << (i % 64);
    return 0;
}

/* The spec check's sampler (and mask) on a new session after its prompt of n. */
static void spec_sampling(krun_model *m, krun_session *s, size_t n)
{
    g_vocab = (size_t)krun_model_config(m)->vocab;
    krun_session_set_sampler(s, &g_so);
    krun_session_set_reply_start(s, n);
    if (g_mask) krun_session_set_mask(s, mask_prev, NULL);
}

/* Plain greedy decoding of `prompt`: the ids, the logits each was chosen
 * from, and the state saved at the end (the last id pending, as krun does). */
static int spec_reference(krun_model *m, const int32_t *prompt, size_t n, int32_t *ids, float *logits, const char *state)
{
    const size_t V = (size_t)krun_model_config(m)->vocab;
    krun_session *s;
    krun_err e;
    if (krun_session_new(m, &s, &e) || krun_session_feed(s, prompt, n, NULL, &e)) goto bad;
    spec_sampling(m, s, n);
    for (size_t g = 0; g < SPEC_GEN; g++) {
        memcpy(logits + g * V, krun_session_logits(s), V * sizeof *logits);
        ids[g] = krun_session_sample(s);
        if (g + 1 < SPEC_GEN ? krun_session_feed(s, &ids[g], 1, NULL, &e) : krun_session_append(s, &ids[g], 1, &e)) goto bad;
    }
    if (krun_session_save(s, state, &e)) goto bad;
    krun_session_free(s);
    return 0;
bad:
    printf("not ok - reference decoding: %s\n", e.msg);
    fails++;
    return -1;
}

static int same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb, ca, cb;
    while (same) {
        ca = fgetc(fa);
        cb = fgetc(fb);
        if (ca != cb) same = 0;
        if (ca == EOF || cb == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* Decode with krun_session_verify, the drafts being the reference's own
 * continuation with the token at draft index `wrong` replaced (none when
 * wrong >= k): every verification of k drafts must accept exactly
 * min(wrong, k, what is left) and keep everything bit-identical. */
static void spec_run(krun_model *m, const int32_t *prompt, size_t n, const int32_t *ref_ids, const float *ref_logits,
                     const char *ref_state, const char *state, size_t k, size_t wrong, const char *mem)
{
    const size_t V = (size_t)krun_model_config(m)->vocab;
    krun_session *s;
    krun_err e;
    int32_t ids[SPEC_GEN_MAX], acc[64], draft[64];
    float *logits = malloc((size_t)SPEC_GEN * V * sizeof *logits);
    size_t g = 0, rounds = 0, expect_ok = 1, rolled = 0;
    int same_ids, same_logits;
    if (!logits || krun_session_new(m, &s, &e) || krun_session_feed(s, prompt, n, NULL, &e)) {
        printf("not ok - spec k %zu wrong %zu: %s\n", k, wrong, logits ? e.msg : "out of memory");
        fails++;
        free(logits);
        return;
    }
    spec_sampling(m, s, n);
    for (;;) {
        size_t na = 0, kk;
        memcpy(logits + g * V, krun_session_logits(s), V * sizeof *logits);
        ids[g] = krun_session_sample(s);
        if (++g == SPEC_GEN) { krun_session_append(s, &ids[g - 1], 1, &e); break; }
        kk = k < SPEC_GEN - g - 1 ? k : SPEC_GEN - g - 1;   /* the last token is always the model's own */
        for (size_t i = 0; i < kk; i++) draft[i] = i == wrong ? (ref_ids[g + i] + 1) % (int32_t)V : ref_ids[g + i];
        if (krun_session_verify(s, ids[g - 1], draft, kk, acc, logits + g * V, &na, &e)) {
            printf("not ok - spec k %zu wrong %zu: verify: %s\n", k, wrong, e.msg);
            fails++;
            break;
        }
        expect_ok &= na == (wrong < kk ? wrong : kk);
        rolled += na < kk;
        rounds++;
        for (size_t i = 0; i < na; i++) ids[g++] = acc[i];
    }
    same_ids = memcmp(ids, ref_ids, SPEC_GEN * sizeof *ids) == 0;
    same_logits = memcmp(logits, ref_logits, (size_t)SPEC_GEN * V * sizeof *logits) == 0;
    if (krun_session_save(s, state, &e)) { printf("not ok - save: %s\n", e.msg); fails++; }
    OK(same_ids && same_logits && same_file(state, ref_state) && expect_ok,
       "%s%s: %zu drafts per block, draft %zu wrong: %zu blocks (%zu rolled back) == plain decoding: ids, every logit bit, the "
       "saved state", mem ? mem : "in place", g_label, k, wrong, rounds, rolled);
    krun_session_free(s);
    free(logits);
}

/* Verifications inside a batched step (krun_step_batch_verify, krun serve's sweeps): two
 * sessions verify drafts wrong at places wa and wb in one block, sharing the journal's k + 1
 * rows, beside a third that reads its prompt and then steps plainly; each must decode exactly
 * as the reference (ids, and the saved state: every token, the state, the last logits).  Then a step asking for more rows
 * than the journal has is refused with nothing run. */
static void spec_batch(const char *path, const char *mem, const int32_t *prompt, size_t n, const int32_t *ref_ids,
                       const char *ref_state, const char *state, size_t k, size_t wa, size_t wb)
{
    krun_model *m;
    krun_session *ss[NS], *step[NS];
    krun_err e;
    size_t V, g[NS] = {0}, nd[NS], na[NS], wrong[NS] = {wa, wb, 64}, share[NS] = {(k - 1) / 2, k - 1 - (k - 1) / 2, 0};
    size_t blocks = 0, shared = 0, acc = 0, rows, seqs;
    int32_t ids[NS][SPEC_GEN_MAX], draft[NS][64], next[NS];
    const int32_t *dp[NS];
    int ok = 1;
    if (open_model(path, mem, 64, 32, NS, &m)) return;   /* a block holds the prompt beside the verifications */
    V = (size_t)krun_model_config(m)->vocab;
    krun_model_journal(m, &rows, &seqs);
    for (size_t i = 0; i < NS; i++) ss[i] = NULL;
    for (size_t i = 0; i < NS; i++) {
        if (krun_session_new(m, &ss[i], &e) || (i < 2 && krun_session_feed(ss[i], prompt, n, NULL, &e)) ||
            (i == 2 && krun_session_append(ss[i], prompt, n - 1, &e))) { ok = 0; break; }
        spec_sampling(m, ss[i], n);
        next[i] = i < 2 ? krun_session_sample(ss[i]) : prompt[n - 1];
        if (i < 2) ids[i][g[i]++] = next[i];
    }
    while (ok) {
        size_t ns = 0, verifying = 0;
        for (size_t i = 0; i < NS; i++) {
            size_t left = g[i] < SPEC_GEN ? SPEC_GEN - g[i] - (i == 2 && !g[i] ? 0 : 1) : 0;
            if (g[i] >= SPEC_GEN) continue;
            nd[ns] = i < 2 && krun_session_pending(ss[i]) == 0 ? (share[i] < left ? share[i] : left) : 0;
            for (size_t d = 0; d < nd[ns]; d++) draft[ns][d] = d == wrong[i] ? (ref_ids[g[i] + d] + 1) % (int32_t)V : ref_ids[g[i] + d];
            dp[ns] = draft[ns];
            verifying += nd[ns] > 0;
            step[ns] = ss[i];
            na[ns] = i;           /* which session, until the step overwrites it */
            ns++;
        }
        if (!ns) break;
        {
            size_t who[NS];
            int32_t sid[NS];
            for (size_t j = 0; j < ns; j++) { who[j] = na[j]; sid[j] = next[who[j]]; }
            if (krun_step_batch_verify(m, step, sid, dp, nd, ns, na, &e)) { ok = 0; break; }
            blocks++;
            shared += verifying > 1;
            for (size_t j = 0; j < ns; j++) {
                size_t i = who[j], nt;
                const int32_t *h = krun_session_tokens(ss[i], &nt);
                if (nd[j]) ok &= na[j] == (wrong[i] < nd[j] ? wrong[i] : nd[j]);
                acc += na[j];
                for (size_t a = 0; a < na[j]; a++) ids[i][g[i]++] = h[nt - na[j] + a];
                if (g[i] >= SPEC_GEN) continue;
                next[i] = krun_session_sample(ss[i]);
                ids[i][g[i]++] = next[i];
                if (g[i] == SPEC_GEN) ok &= !krun_session_append(ss[i], &next[i], 1, &e);
            }
        }
    }
    if (!ok && e.msg[0]) printf("# %s\n", e.msg);
    for (size_t i = 0; i < NS && ok; i++) {
        ok &= memcmp(ids[i], ref_ids, SPEC_GEN * sizeof *ref_ids) == 0;
        ok &= !krun_session_save(ss[i], state, &e) && same_file(state, ref_state);
    }
    OK(ok && shared > 0, "%s%s: two sessions verifying in one block (drafts wrong at %zu and %zu, %zu + %zu of the journal's %zu rows) "
       "beside one reading its prompt and stepping: %zu blocks (%zu with both verifying), %zu drafts accepted; each == plain decoding "
       "(ids, the saved state)", mem ? mem : "in place", g_label, wa, wb, share[0] + 1, share[1] + 1, rows, blocks, shared, acc);
    /* more verified positions than the journal holds: refused, nothing run */
    if (ss[0] && ss[1] && !krun_session_feed(ss[0], NULL, 0, NULL, &e) && !krun_session_feed(ss[1], NULL, 0, NULL, &e)) {
        size_t pos0 = krun_session_pos(ss[0]), nt0, nt1;
        size_t big[2] = {k, 1};
        int32_t zero[64] = {0};
        const int32_t *zz[2] = {zero, zero};
        int32_t two[2] = {1, 1};
        krun_session_tokens(ss[0], &nt0);
        krun_session_tokens(ss[1], &nt1);
        OK(krun_step_batch_verify(m, ss, two, zz, big, 2, na, &e) == -1 && e.code == KRUN_EINPUT && krun_session_pos(ss[0]) == pos0 &&
           krun_session_pending(ss[0]) == nt0 - pos0, "%zu + 2 verified positions (the journal holds %zu) are refused, nothing run: %s",
           k + 1, rows, e.msg);
    }
    for (size_t i = 0; i < NS; i++) krun_session_free(ss[i]);
    krun_model_close(m);
}

static void check_spec(const char *path, const char *mem)
{
    static const int32_t prompt[] = {3, 7, 11, 5, 9, 100, 200, 30, 1, 2};
    const size_t n = sizeof prompt / sizeof prompt[0], k = g_spec ? g_spec : 5;
    char ref_state[64], state[64];
    krun_model *m;
    krun_session *s;
    krun_err e;
    int32_t ref_ids[SPEC_GEN_MAX];
    float *ref_logits;
    size_t V;
    g_spec = k;
    if (g_quick) SPEC_GEN = 8;
    snprintf(ref_state, sizeof ref_state, "/tmp/probe_spec_ref.%d", (int)getpid());
    snprintf(state, sizeof state, "/tmp/probe_spec.%d", (int)getpid());
    /* chunk 3: a verification block (k + 1 positions) is larger than a prefill chunk */
    if (open_model(path, mem, 64, 3, 1, &m)) return;
    V = (size_t)krun_model_config(m)->vocab;
    ref_logits = malloc((size_t)SPEC_GEN * V * sizeof *ref_logits);
    if (!ref_logits || spec_reference(m, prompt, n, ref_ids, ref_logits, ref_state)) { free(ref_logits); krun_model_close(m); return; }
    /* a wrong draft at every place of a block, and none (--quick: in the middle, and none) */
    for (size_t w = 0; w <= k; w++)
        if (!g_quick || w == k / 2 || w == k) spec_run(m, prompt, n, ref_ids, ref_logits, ref_state, state, k, w, mem);
    if (!g_quick) {
        spec_run(m, prompt, n, ref_ids, ref_logits, ref_state, state, 1, 0, mem);
        spec_run(m, prompt, n, ref_ids, ref_logits, ref_state, state, 2, 1, mem);
    }
    /* in place only (three sessions at a budget made for one would not fit), and not at full
     * width (--quick: its time; test_krun_serve_spec covers streaming budgets) */
    if (k >= 3 && !mem && !(g_quick && krun_model_config(m)->hidden > 1024)) {
        spec_batch(path, mem, prompt, n, ref_ids, ref_state, state, k, 0, 1);
        if (!g_quick) spec_batch(path, mem, prompt, n, ref_ids, ref_state, state, k, 64, 1);
    }
    /* what is refused, and leaves the session as it was */
    if (!krun_session_new(m, &s, &e) && !krun_session_feed(s, prompt, n, NULL, &e)) {
        ksampler_opts hot;
        ksampler_opts_init(&hot);
        hot.temp = 0.7f; hot.seed = 3;
        int32_t d[64] = {0}, acc[64];
        size_t na, pos = krun_session_pos(s), nt;
        d[1] = (int32_t)V;
        OK(krun_session_verify(s, 1, d, 2, acc, NULL, &na, &e) == -1 && e.code == KRUN_EINPUT && krun_session_pos(s) == pos,
           "a draft outside the vocabulary is refused, nothing run: %s", e.msg);
        d[1] = 0;
        OK(krun_session_verify(s, 1, d, k + 1, acc, NULL, &na, &e) == -1 && e.code == KRUN_EINPUT && krun_session_pos(s) == pos,
           "more drafts than the model was prepared for are refused: %s", e.msg);
        krun_session_set_sampler(s, &hot);
        OK(krun_session_verify(s, 1, d, 1, acc, NULL, &na, &e) == 0 && krun_session_pos(s) == pos + 1 + na,
           "verification at a sampling temperature runs (%zu of 1 accepted)", na);
        krun_session_tokens(s, &nt);
        nt -= 1 + na;
        OK(nt == n, "the refusals left the history as it was (%zu tokens)", nt);
        krun_session_free(s);
    } else {
        printf("not ok - session: %s\n", e.msg);
        fails++;
    }
    /* no allocation in a verification round (after a warm-up round) */
    if (SANITIZED) printf("skip - allocations per verification (%s): sanitizer build\n", mem ? mem : "in place");
    else if (!krun_session_new(m, &s, &e) && !krun_session_feed(s, prompt, n, NULL, &e)) {
        int32_t acc[64];
        size_t na, g = 0;
        spec_sampling(m, s, n);
        unsigned long count;
        int ok = 1;
        for (int r = 0; r < 6 && ok; r++) {
            int32_t id = krun_session_sample(s);
            if (r == 1) count_start();
            ok = !krun_session_verify(s, id, ref_ids + g + 1, 2, acc, NULL, &na, &e);
            g += 1 + na;
            if (g + 3 >= SPEC_GEN) break;
        }
        count = count_stop();
        OK(ok && count == 0, "%s: %lu allocations in verification rounds after warm-up", mem ? mem : "in place", count);
        krun_session_free(s);
    }
    remove(ref_state);
    remove(state);
    free(ref_logits);
    krun_model_close(m);
}

/* ---- phases: the prefill layout and back, bit for bit -------------------------------- */

#define PH_GEN 4

/* Feed p1, generate PH_GEN, feed p2, generate PH_GEN in session s; the logits of every
 * position run (both prompts, all positions) and of each generated token into L, ids. */
static int phase_run(krun_model *m, krun_session *s, const int32_t *p1, size_t n1, const int32_t *p2, size_t n2, float *L, int32_t *ids,
                     krun_err *e)
{
    const size_t V = (size_t)krun_model_config(m)->vocab;
    float *at = L;
    size_t g = 0;
    for (int turn = 0; turn < 2; turn++) {
        const int32_t *p = turn ? p2 : p1;
        size_t n = turn ? n2 : n1;
        if (krun_session_feed(s, p, n, at, e)) return -1;
        at += n * V;
        for (int k = 0; k < PH_GEN; k++) {
            memcpy(at, krun_session_logits(s), V * sizeof *at);
            at += V;
            ids[g] = krun_session_sample(s);
            if (krun_session_feed(s, &ids[g++], 1, NULL, e)) return -1;
        }
        /* the generated token's logits, then the next prompt follows it */
    }
    return 0;
}

static void check_phases(const char *path, const char *mem)
{
    krun_model *ref = NULL, *m = NULL;
    krun_session *s = NULL, *a = NULL, *b = NULL;
    krun_err e;
    const kmemplan *p;
    size_t V, n1, n2, B, Bd, total;
    int32_t *p1 = NULL, *p2 = NULL, ids_ref[2 * PH_GEN], ids[2 * PH_GEN];
    float *Lref = NULL, *L = NULL;
    krun_stats st;
    uint64_t planned, allocated;
    if (!mem) { printf("not ok - phases needs --mem\n"); fails++; return; }
    if (open_model(path, mem, g_ctx, 0, 2, &m)) return;
    p = krun_model_plan(m);
    if (!p || !p->block_prefill) {
        printf("not ok - --mem %s --ctx %zu: the plan has no prefill layout (block %zu)\n", mem, g_ctx, p ? p->block : 0);
        fails++;
        krun_model_close(m);
        return;
    }
    B = p->block_prefill;
    Bd = p->block;
    V = (size_t)krun_model_config(m)->vocab;
    /* the plan: both layouts in one budget */
    krun_model_memory(m, &planned, &allocated);
    OK(planned == allocated && p->flex_bytes > 0, "--mem %s: planned %llu bytes == allocated %llu, a flex region of %llu included",
       mem, (unsigned long long)planned, (unsigned long long)allocated, (unsigned long long)p->flex_bytes);
    OK(p->scratch_prefill_bytes == k3_run_scratch_bytes(krun_model_config(m), B, 2, g_ctx, 0) && p->scratch_prefill_bytes <= p->flex_bytes &&
       p->lent_bytes <= p->flex_bytes && (p->flex_bytes == p->lent_bytes || p->flex_bytes == p->scratch_prefill_bytes) && p->total <= p->budget,
       "--mem %s: the flex region (%llu) holds the decoding layout's lent layers %d..%d and %d expert slots (%llu) or a %zu-position "
       "block's activations (%llu); total %llu <= budget", mem, (unsigned long long)p->flex_bytes, p->pin_prefill, p->pin - 1,
       p->expert_slots - p->expert_slots_prefill, (unsigned long long)p->lent_bytes, B, (unsigned long long)p->scratch_prefill_bytes,
       (unsigned long long)p->total);
    if (SANITIZED) printf("skip - the flex region seen by the allocator (sanitizer build)\n");
    else OK(seen_size(p->flex_bytes), "the allocator was asked for exactly the flex region (%llu)", (unsigned long long)p->flex_bytes);
    /* prompts of several prefill blocks and a tail that fits the decoding block */
    n1 = 2 * B + 5;
    n2 = B + 3;
    if (n1 + n2 + 2 * PH_GEN > g_ctx) { printf("not ok - --ctx %zu is too small for prompts of %zu and %zu\n", g_ctx, n1, n2); fails++; goto out; }
    total = n1 + n2 + 2 * PH_GEN;
    p1 = malloc(n1 * sizeof *p1);
    p2 = malloc(n2 * sizeof *p2);
    Lref = malloc(total * V * sizeof *Lref);
    L = malloc(total * V * sizeof *L);
    if (!p1 || !p2 || !Lref || !L) { printf("not ok - out of memory\n"); fails++; goto out; }
    for (size_t i = 0; i < n1; i++) p1[i] = (int32_t)((i * 7919 + 13) % V);
    for (size_t i = 0; i < n2; i++) p2[i] = (int32_t)((i * 104729 + 5) % V);
    if (open_model(path, NULL, g_ctx, 64, 1, &ref)) goto out;
    if (krun_session_new(ref, &s, &e) || phase_run(ref, s, p1, n1, p2, n2, Lref, ids_ref, &e)) {
        printf("not ok - in place: %s\n", e.msg); fails++; goto out;
    }
    krun_session_new(m, &a, &e);
    count_start();
    if (!a || phase_run(m, a, p1, n1, p2, n2, L, ids, &e)) { count_stop(); printf("not ok - phases: %s\n", e.msg); fails++; goto out; }
    {
        unsigned long n_alloc = count_stop();
        krun_model_stats(m, &st);
        OK(memcmp(L, Lref, total * V * sizeof *L) == 0 && memcmp(ids, ids_ref, sizeof ids) == 0,
           "--mem %s: prompts of %zu and %zu positions (blocks of %zu and %zu) and %d tokens after each == in place in blocks of "
           "64: every logit bit of every position, the ids", mem, n1, n2, B, Bd, PH_GEN);
        OK(st.phase_switches == 2 && !krun_model_in_prefill(m) && (p->pin_prefill == p->pin || st.bytes_lent_reread > 0),
           "two switches into the prefill layout and back (%llu), the lent layers read again (%llu bytes)",
           (unsigned long long)st.phase_switches, (unsigned long long)st.bytes_lent_reread);
        if (SANITIZED) printf("skip - allocations across phase switches (sanitizer build)\n");
        else OK(n_alloc == 0, "%lu allocations while feeding and decoding across 4 phase switches", n_alloc);
    }
    krun_session_free(a);
    a = NULL;
    /* a long prompt fed in the server's way (pending tokens + one step) while another session decodes */
    if (krun_session_new(m, &a, &e) || krun_session_new(m, &b, &e) || krun_session_feed(a, p2, 5, NULL, &e)) {
        printf("not ok - sessions: %s\n", e.msg); fails++; goto out;
    }
    {
        size_t fed = 0, g = 0, ga = 0;
        int32_t ida[64], ref_a[64];
        int same = 1;
        krun_session *r;
        /* a alone in place: the reference for its tokens */
        krun_session_free(s);
        if (krun_session_new(ref, &r, &e) || krun_session_feed(r, p2, 5, NULL, &e)) { printf("not ok - %s\n", e.msg); fails++; goto out; }
        for (size_t k = 0; k < 64; k++) {
            ref_a[k] = krun_session_sample(r);
            if (krun_session_feed(r, &ref_a[k], 1, NULL, &e)) { printf("not ok - %s\n", e.msg); fails++; goto out; }
        }
        while (fed < n1 && ga < 64) {
            size_t take = krun_model_prompt_block(m, n1 - fed + 1) - 1;
            krun_session *ss[2] = {a, b};
            int32_t in[2];
            if (take > n1 - fed) take = n1 - fed;
            if (take > 1 && krun_session_append(b, p1 + fed, take - 1, &e)) { printf("not ok - %s\n", e.msg); fails++; goto out; }
            in[1] = p1[fed + take - 1];
            ida[ga] = in[0] = krun_session_sample(a);
            if (krun_step_batch(m, ss, in, 2, &e)) { printf("not ok - batch: %s\n", e.msg); fails++; goto out; }
            ga++;
            fed += take;
            g++;
        }
        for (size_t k = 0; k < ga; k++) same &= ida[k] == ref_a[k];
        same &= memcmp(krun_session_logits(b), Lref + (n1 - 1) * V, V * sizeof(float)) == 0;
        krun_model_stats(m, &st);
        OK(same && g >= 2 && st.phase_switches >= 3,
           "a %zu-token prompt fed in %zu batched steps of up to %zu positions while another session decodes: its last logits "
           "and the other's %zu tokens == each alone", n1, g, B, ga);
    }
out:
    free(p1); free(p2); free(Lref); free(L);
    if (m) krun_model_close(m);
    if (ref) krun_model_close(ref);
}

/* ---- sampler: the session's mask hook and reply start ---------------------------------- */

struct mask_probe {
    const krun_session *s;
    size_t calls, bad;          /* calls whose pos or history was not the session's */
    int32_t modulus;            /* allowed: id % modulus == 0 */
    size_t V;
};

static int mask_every(void *ctx, const int32_t *tokens, size_t pos, uint64_t *allowed)
{
    struct mask_probe *mp = ctx;
    size_t n;
    const int32_t *h = krun_session_tokens(mp->s, &n);
    const size_t V = mp->V;
    mp->calls++;
    mp->bad += tokens != h || pos != krun_session_pos(mp->s) || pos > n;
    memset(allowed, 0, (V + 63) / 64 * sizeof *allowed);
    for (size_t i = 0; i < V; i += (size_t)mp->modulus) allowed[i / 64] |= 1ULL << (i % 64);
    return 0;
}

static void check_sampler(const char *path, const char *mem)
{
    static const int32_t prompt[] = {3, 7, 11, 5, 9, 100, 200, 30};
    krun_model *m;
    krun_session *s;
    krun_err e;
    ksampler_opts so;
    struct mask_probe mp = {NULL, 0, 0, 7, 0};
    int in_mask = 1, same = 1;
    if (open_model(path, mem, 64, 8, 1, &m)) return;
    if (krun_session_new(m, &s, &e) || krun_session_feed(s, prompt, 8, NULL, &e)) {
        printf("not ok - sampler: %s\n", e.msg);
        fails++;
        krun_model_close(m);
        return;
    }
    mp.s = s;
    mp.V = (size_t)krun_model_config(m)->vocab;
    ksampler_opts_init(&so);
    so.temp = 1.5f; so.seed = 11; so.presence_penalty = 1.0f;
    krun_session_set_sampler(s, &so);
    krun_session_set_reply_start(s, 8);
    krun_session_set_mask(s, mask_every, &mp);
    for (int g = 0; g < 12; g++) {
        int32_t id = krun_session_sample(s), again = krun_session_sample(s);
        in_mask &= id >= 0 && id % 7 == 0;
        same &= id == again;
        if (krun_session_feed(s, &id, 1, NULL, &e)) { printf("not ok - sampler feed: %s\n", e.msg); fails++; break; }
    }
    OK(in_mask && mp.calls == 24 && mp.bad == 0 && same && krun_session_reply_start(s) == 8,
       "the mask hook: called per pick with the session's history and position (%zu calls, %zu wrong), every token sampled at "
       "temp 1.5 allowed by it; sampling a position twice gives the same token", mp.calls, mp.bad);
    krun_session_set_mask(s, NULL, NULL);
    krun_session_reset(s);
    OK(krun_session_reply_start(s) == 0 && krun_session_sampler(s)->seed == 11, "reset: the reply start back to 0, the sampler kept");
    krun_session_free(s);
    krun_model_close(m);
}

int main(int argc, char **argv)
{
    const char *mem = NULL;
    if (argc < 3) { fprintf(stderr, "usage: probe_session memory|allocs|batch|copy|mark|pcache|spec|phases|sampler FILE.kpk [--mem SIZE] [--spec N] [--ctx N] [--quick] "
                        "[--temp T --top-k K --top-p P --min-p P --seed S --penalties --mask]\n"); return 2; }
    ksampler_opts_init(&g_so);
    for (int i = 3; i < argc; i += 2) {
        if (!strcmp(argv[i], "--quick")) { g_quick = 1; i--; continue; }
        if (!strcmp(argv[i], "--mask")) { g_mask = 1; i--; continue; }
        if (!strcmp(argv[i], "--penalties")) {
            g_so.repetition_penalty = 1.2f; g_so.presence_penalty = 0.4f; g_so.frequency_penalty = 0.3f;
            i--;
            continue;
        }
        if (i + 1 >= argc) { fprintf(stderr, "probe_session: %s needs a value\n", argv[i]); return 2; }
        if (!strcmp(argv[i], "--mem")) mem = argv[i + 1];
        else if (!strcmp(argv[i], "--spec")) g_spec = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--temp")) g_so.temp = (float)atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--top-k")) g_so.top_k = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--top-p")) g_so.top_p = (float)atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--min-p")) g_so.min_p = (float)atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed")) g_so.seed = (uint64_t)atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--ctx")) g_ctx = (size_t)atol(argv[i + 1]);
        else { fprintf(stderr, "probe_session: unknown option %s\n", argv[i]); return 2; }
    }
    if (g_so.temp > 0 || g_mask || ksampler_uses_history(&g_so))
        snprintf(g_label, sizeof g_label, ", temp %g top-k %d top-p %g min-p %g seed %llu%s%s", (double)g_so.temp, g_so.top_k,
                 (double)g_so.top_p, (double)g_so.min_p, (unsigned long long)g_so.seed,
                 ksampler_uses_history(&g_so) ? ", penalties" : "", g_mask ? ", a mask" : "");
    if (!strcmp(argv[1], "memory")) check_memory(argv[2], mem);
    else if (!strcmp(argv[1], "allocs")) check_allocs(argv[2], mem);
    else if (!strcmp(argv[1], "batch")) check_batch(argv[2], mem);
    else if (!strcmp(argv[1], "spec")) check_spec(argv[2], mem);
    else if (!strcmp(argv[1], "copy")) check_copy(argv[2], mem);
    else if (!strcmp(argv[1], "mark")) check_mark(argv[2], mem);
    else if (!strcmp(argv[1], "pcache")) check_pcache(argv[2], mem);
    else if (!strcmp(argv[1], "phases")) check_phases(argv[2], mem);
    else if (!strcmp(argv[1], "sampler")) check_sampler(argv[2], mem);
    else { fprintf(stderr, "probe_session: unknown check %s\n", argv[1]); return 2; }
    return fails ? 1 : 0;
}
