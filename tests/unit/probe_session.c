/* krun's session API checked from the outside, on a real .kpk file:
 *
 *   probe_session memory  FILE.kpk [--mem SIZE]   planned bytes == allocated bytes
 *   probe_session allocs  FILE.kpk [--mem SIZE]   no allocation per decoding step
 *   probe_session batch   FILE.kpk [--mem SIZE]   sessions stepped together == each alone, bit for bit
 *
 * The binary replaces malloc and friends with counting wrappers around
 * glibc's own (__libc_malloc ...): every allocation of the process is seen,
 * from our code, from libc (qsort, stdio) and from the shared libraries
 * (xxHash, zstd).  Sanitizer builds keep their own allocator: the counting
 * checks skip there (the batch check still runs).  Prints TAP lines. */
#include "session.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

static int fails;
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

static int open_model(const char *path, const char *mem, size_t ctx, size_t chunk, size_t max_seqs, krun_model **m)
{
    krun_model_opts o;
    krun_err e;
    krun_model_opts_init(&o);
    o.path = path;
    o.ctx = ctx;
    o.chunk = chunk;
    o.max_seqs = max_seqs;
    o.threads = 2;
    if (mem) o.budget = (uint64_t)kmem_parse_size(mem);
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
            size_t block = chunk > seqs ? chunk : seqs;
            arena = k3_run_bytes(c, block, seqs, ctx);
            slots = (uint64_t)seqs * krun_session_bytes(c, ctx);
            if (krun_model_plan(m)) {
                const kmemplan *p = krun_model_plan(m);
                OK(p->state_bytes + p->vectors_bytes + p->scratch_bytes == planned,
                   "ctx %zu chunk %zu max_seqs %zu: the plan's state + vectors + scratch is what krun_model_memory reports", ctx, chunk, seqs);
            }
        }
        OK(planned == allocated && allocated == arena + slots,
           "ctx %zu chunk %zu max_seqs %zu: planned %llu bytes == allocated %llu", ctx, chunk, seqs, (unsigned long long)planned,
           (unsigned long long)allocated);
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
    ksampler_opts so = {0.8f, 40, 0.95f, 0.0f, 7};
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
        kstore_stats st;
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
out:
    free(ref);
    free(got);
    krun_model_close(m);
}

int main(int argc, char **argv)
{
    const char *mem = NULL;
    if (argc < 3) { fprintf(stderr, "usage: probe_session memory|allocs|batch FILE.kpk [--mem SIZE]\n"); return 2; }
    if (argc == 5 && !strcmp(argv[3], "--mem")) mem = argv[4];
    if (!strcmp(argv[1], "memory")) check_memory(argv[2], mem);
    else if (!strcmp(argv[1], "allocs")) check_allocs(argv[2], mem);
    else if (!strcmp(argv[1], "batch")) check_batch(argv[2], mem);
    else { fprintf(stderr, "probe_session: unknown check %s\n", argv[1]); return 2; }
    return fails ? 1 : 0;
}
