/* The EAGLE drafter through the session API, on real .kpk files (a target and
 * its drafter):
 *
 *   probe_draft paths MODEL.kpk DRAFT.kpk [--mem SIZE] [--spec N]
 *       the drafter's state -- its committed KV rows and the pending row --
 *       is a function of the history alone, whatever path built it: a prompt
 *       in one block or in blocks of 5, token by token, verifications that
 *       accept every draft or reject one at every place of the block, a
 *       verification batched beside a plain step, a session copy, a snapshot
 *       taken and restored, a snapshot inside a block (krun_session_mark),
 *       a saved state loaded: each equals the state of the same history
 *       prefilled in one go, bit for bit; and so are the drafts and every
 *       logit a chain proposes from them
 *   probe_draft ref MODEL.kpk DRAFT.kpk --ids 3,7,.. --next N --drafts K --logits FILE --kv FILE
 *       the numbers tests/ref/eagle_ref.py computes independently: after the
 *       target ran --ids (its drafter committed rows 0 .. T-2, T-1 pending),
 *       a chain of K drafts from --next: FILE gets the logits of each step
 *       (float32 [K][V]), --kv the committed rows (float32 [T-1][Rkv + dr])
 *       then the pending row's fused g [E]; the drafts on stdout
 *
 * Prints TAP lines (paths); exit 1 on a failed check. */
#include "format/kargs.h"
#include "run/session/session.h"
#include "run/util/ablate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fails;
#define OK(cond, ...) do { int c_ = (cond); printf("%s - ", c_ ? "ok" : "not ok"); printf(__VA_ARGS__); printf("\n"); if (!c_) fails++; } while (0)

static const char *g_mem, *g_draft, *g_state_dir;
static size_t g_spec = 6;

static krun_model *open_model(const char *path, size_t chunk, size_t max_seqs)
{
    krun_model_opts o;
    krun_model *m;
    krun_err e;
    krun_model_opts_init(&o);
    o.path = path;
    o.budget = g_mem ? (uint64_t)kargs_size(g_mem) : 0;
    o.ctx = 256;
    o.chunk = chunk;
    o.max_seqs = max_seqs;
    o.spec = g_spec;
    o.draft = g_draft;
    o.state_dir = g_state_dir;
    if (krun_model_open(&o, &m, &e)) { fprintf(stderr, "probe_draft: %s\n", e.msg); exit(2); }
    if (!krun_model_draft(m)) { fprintf(stderr, "probe_draft: the model did not take the drafter\n"); exit(2); }
    return m;
}

static krun_session *new_session(krun_model *m)
{
    krun_session *s;
    krun_err e;
    if (krun_session_new(m, &s, &e)) { fprintf(stderr, "probe_draft: %s\n", e.msg); exit(2); }
    return s;
}

static void feed(krun_session *s, const int32_t *ids, size_t n)
{
    krun_err e;
    if (krun_session_feed(s, ids, n, NULL, &e)) { fprintf(stderr, "probe_draft: feed: %s\n", e.msg); exit(2); }
}

/* Two sessions' drafter states equal, bit for bit (a and b may belong to different models of the same files). */
static int same_state(const krun_session *a, const krun_session *b, const krun_model *ma, char *why, size_t n)
{
    size_t s0, n0, w, s1, n1, w1;
    const float *p0, *p1, *r0 = krun_session_draft_rows(a, &s0, &n0, &w, &p0), *r1 = krun_session_draft_rows(b, &s1, &n1, &w1, &p1);
    const size_t E = (size_t)krun_model_config(ma)->hidden;
    if (!r0 || !r1 || s0 != s1 || n0 != n1 || !p0 != !p1) {
        snprintf(why, n, "rows [%zu, %zu)%s vs [%zu, %zu)%s", s0, n0, p0 ? " + pending" : "", s1, n1, p1 ? " + pending" : "");
        return 0;
    }
    for (size_t q = s0; q < n0; q++)
        if (memcmp(r0 + q * w, r1 + q * w, w * sizeof(float))) { snprintf(why, n, "row %zu differs", q); return 0; }
    if (p0 && memcmp(p0, p1, E * sizeof(float))) { snprintf(why, n, "the pending row differs"); return 0; }
    snprintf(why, n, "rows [%zu, %zu) and the pending one", s0, n0);
    return 1;
}

/* The history: a prompt, then the model's greedy continuation. */
#define P_LEN 13
#define H_LEN 100
static int32_t hist[H_LEN];

static void make_history(krun_model *m)
{
    static const int32_t prompt[P_LEN] = {5, 77, 19, 203, 34, 2, 239, 195, 71, 163, 54, 121, 104};
    krun_session *s = new_session(m);
    const int32_t V = krun_model_config(m)->vocab;
    memcpy(hist, prompt, sizeof prompt);
    for (int i = 0; i < P_LEN; i++) hist[i] %= V;
    feed(s, hist, P_LEN);
    for (size_t i = P_LEN; i < H_LEN; i++) {
        hist[i] = krun_session_sample(s);
        feed(s, &hist[i], 1);
    }
    krun_session_free(s);
}

/* The reference: the history's first n tokens prefilled in one feed. */
static krun_session *reference(krun_model *m, size_t n)
{
    krun_session *s = new_session(m);
    feed(s, hist, n);
    return s;
}

static void check_against(krun_model *mr, const krun_session *s, const char *what)
{
    char why[160];
    krun_session *r = reference(mr, krun_session_pos(s));
    OK(same_state(s, r, mr, why, sizeof why), "%s (%zu positions) == the history prefilled in one block: %s", what, krun_session_pos(s), why);
    /* and the chains they propose: every draft and every logit bit */
    if (krun_session_pos(s) < H_LEN) {
        const size_t V = (size_t)krun_model_config(mr)->vocab, K = 3;
        int32_t d0[3], d1[3];
        float *l0 = malloc(K * V * sizeof *l0), *l1 = malloc(K * V * sizeof *l1);
        krun_err e;
        long k0 = krun_session_propose((krun_session *)s, hist[krun_session_pos(s)], K, d0, l0, &e);
        long k1 = krun_session_propose(r, hist[krun_session_pos(s)], K, d1, l1, &e);
        OK(k0 == (long)K && k1 == (long)K && !memcmp(d0, d1, sizeof d0) && !memcmp(l0, l1, K * V * sizeof *l0),
           "%s: its chain of %zu drafts == the reference's, every logit bit", what, K);
        free(l0);
        free(l1);
    }
    krun_session_free(r);
}

static void check_paths(const char *model, krun_model *m)
{
    krun_model *m5 = open_model(model, 5, 1);
    krun_session *a, *b, *c;
    krun_snapshot *snap;
    krun_err e;
    size_t acc, pos;
    int32_t out[64];
    char why[160];
    make_history(m);
    /* a prompt in blocks of 5, then token by token */
    a = new_session(m5);
    feed(a, hist, P_LEN + 3);
    check_against(m, a, "a prompt in blocks of 5");
    for (size_t i = P_LEN + 3; i < P_LEN + 6; i++) feed(a, &hist[i], 1);
    check_against(m, a, "then token by token");
    krun_session_free(a);
    /* verifications accepting every draft, widths 1 .. spec */
    b = new_session(m);
    feed(b, hist, P_LEN);
    pos = P_LEN;
    for (size_t w = 1; w <= g_spec && pos + w + 1 < H_LEN; w++) {
        if (krun_session_verify(b, hist[pos], hist + pos + 1, w, out, NULL, &acc, &e)) { fprintf(stderr, "probe_draft: %s\n", e.msg); exit(2); }
        pos += acc + 1;
        OK(acc == w, "a verification of %zu true drafts accepts them all", w);
        check_against(m, b, "after it");
    }
    /* a wrong draft at every place of a block of spec drafts */
    for (size_t j = 0; j < g_spec && pos + g_spec + 1 < H_LEN; j++) {
        int32_t d[64];
        memcpy(d, hist + pos + 1, g_spec * sizeof *d);
        d[j] = (d[j] + 1) % krun_model_config(m)->vocab;
        if (krun_session_verify(b, hist[pos], d, g_spec, out, NULL, &acc, &e)) { fprintf(stderr, "probe_draft: %s\n", e.msg); exit(2); }
        pos += acc + 1;
        OK(acc == j, "a wrong draft at place %zu of %zu: %zu accepted", j, g_spec, acc);
        check_against(m, b, "after the rollback");
    }
    /* batched: b verifies beside c's plain steps */
    c = new_session(m);
    feed(c, hist, P_LEN + 2);
    if (pos + 4 < H_LEN) {
        krun_session *both[2] = {b, c};
        const int32_t ids[2] = {hist[pos], hist[P_LEN + 2]};
        const int32_t *drafts[2] = {hist + pos + 1, NULL};
        const size_t nd[2] = {3, 0};
        size_t na[2];
        if (krun_step_batch_verify(m, both, ids, drafts, nd, 2, na, &e)) { fprintf(stderr, "probe_draft: %s\n", e.msg); exit(2); }
        check_against(m, b, "a verification batched with a plain step");
        check_against(m, c, "the plain step beside it");
    }
    /* copies and snapshots */
    if (krun_session_copy(c, b, &e)) { fprintf(stderr, "probe_draft: copy: %s\n", e.msg); exit(2); }
    OK(same_state(c, b, m, why, sizeof why), "a session copy: %s", why);
    if (krun_snapshot_new(m, 256, &snap, &e) || krun_snapshot_take(snap, b, &e)) { fprintf(stderr, "probe_draft: snapshot: %s\n", e.msg); exit(2); }
    {
        krun_session *other = reference(m, 3);      /* c becomes something else first */
        if (krun_session_copy(c, other, &e) || krun_snapshot_restore(c, snap, &e)) { fprintf(stderr, "probe_draft: snapshot: %s\n", e.msg); exit(2); }
        krun_session_free(other);
    }
    OK(same_state(c, b, m, why, sizeof why), "a snapshot restored: %s", why);
    krun_snapshot_free(snap);
    krun_session_free(c);
    /* a snapshot inside a block: into an idle slot */
    {
        krun_session *x = new_session(m), *dst = krun_model_slot(m, 2);
        for (size_t k = 0; k < krun_model_slots(m); k++)
            if (!krun_session_live(krun_model_slot(m, k))) dst = krun_model_slot(m, k);
        if (krun_session_mark(x, P_LEN - 4, dst, &e)) { fprintf(stderr, "probe_draft: mark: %s\n", e.msg); exit(2); }
        feed(x, hist, P_LEN);
        OK(krun_session_mark_status(x, NULL) == KRUN_MARK_TAKEN, "a snapshot inside a block was taken");
        krun_session_free(x);
        if (krun_session_claim(dst, &e)) { fprintf(stderr, "probe_draft: claim: %s\n", e.msg); exit(2); }
        check_against(m, dst, "a snapshot inside a block");
        krun_session_free(dst);
    }
    /* a saved state, loaded */
    {
        char path[] = "/tmp/probe_draft_XXXXXX";
        int fd = mkstemp(path);
        krun_session *y = new_session(m);
        if (fd < 0) { perror("mkstemp"); exit(2); }
        close(fd);
        unlink(path);
        if (krun_session_save(b, path, &e) || krun_session_load(y, path, &e)) { fprintf(stderr, "probe_draft: state: %s\n", e.msg); exit(2); }
        unlink(path);
        OK(same_state(y, b, m, why, sizeof why), "a saved state, loaded: %s", why);
        krun_session_free(y);
    }
    krun_session_free(b);
    krun_model_close(m5);
}

static void verify_or_die(krun_session *s, int32_t id, const int32_t *d, size_t k, size_t *acc)
{
    int32_t out[64];
    krun_err e;
    if (krun_session_verify(s, id, d, k, out, NULL, acc, &e)) { fprintf(stderr, "probe_draft: %s\n", e.msg); exit(2); }
}

/* The same with the states paged to disk (krun batch --state-dir): a verification's commit waits
 * for the next block that holds the state (journal.h), or is replayed alone when the next block
 * does not; the logits and the drafter's rows as the resident reference's (mr). */
static void check_paged(const char *model, krun_model *mr)
{
    char dir[] = "/tmp/probe_draft_pages_XXXXXX", sub[64];
    krun_model *mp;
    krun_session *a, *b, *r;
    size_t pos = P_LEN, ok1, ok2, ok3;
    int32_t d[4];
    const size_t V = (size_t)krun_model_config(mr)->vocab;
    if (!mkdtemp(dir)) { perror("mkdtemp"); exit(2); }
    snprintf(sub, sizeof sub, "%s/sd", dir);
    g_state_dir = sub;
    mp = open_model(model, 64, 2);
    g_state_dir = NULL;
    a = new_session(mp);
    b = new_session(mp);
    feed(a, hist, P_LEN);
    feed(b, hist, 5);
    verify_or_die(a, hist[pos], hist + pos + 1, 4, &ok1);           /* all four kept */
    pos += ok1 + 1;
    feed(b, &hist[5], 1);                                           /* a block without a: its commit alone */
    memcpy(d, hist + pos + 1, 3 * sizeof *d);
    d[1] = (d[1] + 1) % (int32_t)V;
    verify_or_die(a, hist[pos], d, 3, &ok2);                        /* one kept, two thrown away */
    pos += ok2 + 1;
    verify_or_die(a, hist[pos], hist + pos + 1, 3, &ok3);           /* replayed inside this block */
    pos += ok3 + 1;
    feed(a, &hist[pos], 1);
    pos++;
    feed(b, &hist[6], 2);
    r = reference(mr, pos);
    OK(ok1 == 4 && ok2 == 1 && ok3 == 3 && krun_session_pos(a) == pos && !memcmp(krun_session_logits(a), krun_session_logits(r), V * sizeof(float)),
       "states paged to disk: verifications keeping 4 of 4 (its commit replayed alone), 1 of 3, 3 of 3 (replayed in the next "
       "block), then a plain step: the logits of the history prefilled resident (%zu positions)", pos);
    check_against(mr, a, "paged: the drafter's rows");
    krun_session_free(r);
    r = reference(mr, 8);
    OK(!memcmp(krun_session_logits(b), krun_session_logits(r), V * sizeof(float)), "paged: the other sequence's logits too");
    krun_session_free(r);
    krun_session_free(a);
    krun_session_free(b);
    krun_model_close(mp);
    rmdir(dir);
}

static int parse_ids(const char *s, int32_t *out, size_t max)
{
    size_t n = 0;
    while (*s && n < max) {
        char *end;
        out[n++] = (int32_t)strtol(s, &end, 10);
        if (end == s) return -1;
        s = *end == ',' ? end + 1 : end;
    }
    return (int)n;
}

static int write_all(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    int bad = !f || fwrite(p, 1, n, f) != n;
    if (f && fclose(f)) bad = 1;
    if (bad) fprintf(stderr, "probe_draft: cannot write %s\n", path);
    return bad ? -1 : 0;
}

static int dump_ref(const char *model, int argc, char **argv)
{
    int32_t ids[4096], drafts[64];
    const char *ids_s = NULL, *logits_path = NULL, *kv_path = NULL;
    long next = -1, K = 0, k;
    int n;
    krun_model *m;
    krun_session *s;
    krun_err e;
    float *logits;
    size_t start, rows, width, V, E;
    const float *pending, *cache;
    for (int i = 4; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--ids")) ids_s = argv[i + 1];
        else if (!strcmp(argv[i], "--next")) next = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--drafts")) K = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--logits")) logits_path = argv[i + 1];
        else if (!strcmp(argv[i], "--kv")) kv_path = argv[i + 1];
        else if (strcmp(argv[i], "--mem") && strcmp(argv[i], "--spec")) { fprintf(stderr, "probe_draft: unknown option %s\n", argv[i]); return 2; }
    }
    if (!ids_s || next < 0 || K < 1 || K > 64 || !logits_path || !kv_path || (n = parse_ids(ids_s, ids, 4096)) < 2) {
        fprintf(stderr, "probe_draft ref: --ids (2 or more) --next N --drafts 1..64 --logits FILE --kv FILE\n");
        return 2;
    }
    g_spec = (size_t)K;
    m = open_model(model, 64, 1);
    V = (size_t)krun_model_config(m)->vocab;
    E = (size_t)krun_model_config(m)->hidden;
    s = new_session(m);
    feed(s, ids, (size_t)n);
    logits = malloc((size_t)K * V * sizeof *logits);
    if (!logits) return 2;
    k = krun_session_propose(s, (int32_t)next, (size_t)K, drafts, logits, &e);
    if (k != K) { fprintf(stderr, "probe_draft: propose: %s\n", k < 0 ? e.msg : "no chain"); return 2; }
    cache = krun_session_draft_rows(s, &start, &rows, &width, &pending);
    if (start != 0 || rows != (size_t)n - 1 || !pending) { fprintf(stderr, "probe_draft: rows [%zu, %zu)\n", start, rows); return 2; }
    if (write_all(logits_path, logits, (size_t)K * V * sizeof *logits)) return 2;
    {
        float *kv = malloc((rows * width + E) * sizeof *kv);
        if (!kv) return 2;
        memcpy(kv, cache, rows * width * sizeof *kv);
        memcpy(kv + rows * width, pending, E * sizeof *kv);
        if (write_all(kv_path, kv, (rows * width + E) * sizeof *kv)) return 2;
        free(kv);
    }
    for (long j = 0; j < K; j++) printf("%s%d", j ? "," : "", drafts[j]);
    printf("\n");
    free(logits);
    krun_session_free(s);
    krun_model_close(m);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: probe_draft paths|ref MODEL.kpk DRAFT.kpk [--mem SIZE] [--spec N] [ref: --ids .. --next N --drafts K "
                        "--logits FILE --kv FILE]\n");
        return 2;
    }
    if (krun_ablation_from_env()) return 2;         /* the test build's broken drafters (run/util/ablate.h) */
    g_draft = argv[3];
    for (int i = 4; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mem")) g_mem = argv[i + 1];
        else if (!strcmp(argv[i], "--spec")) g_spec = (size_t)atol(argv[i + 1]);
    }
    if (!strcmp(argv[1], "ref")) return dump_ref(argv[2], argc, argv);
    if (strcmp(argv[1], "paths")) { fprintf(stderr, "probe_draft: unknown check %s\n", argv[1]); return 2; }
    {
        krun_model *m = open_model(argv[2], 64, 3);
        check_paths(argv[2], m);
        check_paged(argv[2], m);
        krun_model_close(m);
    }
    return fails ? 1 : 0;
}
