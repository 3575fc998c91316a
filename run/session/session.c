/* krun as a library: the model (file, plan, store, threads, run state) and
 * its sessions (session.h). */
#include "session.h"

#include "spec.h"
#include "statefile.h"
#include "format/kio.h"
#include "run/engine/forward.h"
#include "run/engine/predict.h"
#include "run/kernels/kernels.h"
#include "run/store/store.h"
#include "run/text/tokenizer_kpk.h"
#include "run/util/procmem.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

/* session.h's values are the layers' below (it does not include them). */
_Static_assert(KRUN_MAX_SEQS == K3_MAX_SEQS, "KRUN_MAX_SEQS");
#define SAME(a, b) ((int)(a) == (int)(b))
_Static_assert(SAME(KRUN_VERIFY_OFF, KSTORE_VERIFY_OFF) && SAME(KRUN_VERIFY_FIRST, KSTORE_VERIFY_FIRST) &&
               SAME(KRUN_VERIFY_ALWAYS, KSTORE_VERIFY_ALWAYS), "enum krun_verify");
_Static_assert(SAME(KRUN_IO_MMAP, KSTORE_IO_MMAP) && SAME(KRUN_IO_PREAD, KSTORE_IO_PREAD) && SAME(KRUN_IO_DIRECT, KSTORE_IO_DIRECT),
               "enum krun_io");
_Static_assert(SAME(KRUN_CACHE_LFU, KSTORE_LFU) && SAME(KRUN_CACHE_LRU, KSTORE_LRU), "enum krun_cache");
#undef SAME

struct krun_session {
    krun_model *m;
    int live;
    int broken;                /* a feed failed: the state is unusable until reset */
    k3_state st;
    int32_t *tokens;           /* [ctx]: tokens[0, st.pos) run, [st.pos, n_tokens) pending */
    size_t n_tokens;
    float *logits;             /* [vocab] of position st.pos - 1 */
    int have_logits;
    ksampler sampler;
    uint32_t *order;           /* [vocab] sampler scratch */
    double *prob;              /* [vocab] */
    krun_progress_fn progress;
    void *progress_ctx;
    kspec drafter;             /* speculative decoding: what and how much to draft (spec.h) */
    krun_spec_stats spec;
    /* a snapshot to take inside a later block (krun_session_mark): 0 none */
    size_t mark_at;
    krun_session *mark_dst;    /* into this idle slot, or (NULL) into mark_path */
    char *mark_path;
    int mark_status;           /* KRUN_MARK_* */
    char mark_msg[160];        /* why it was dropped */
    k3_snap snap;              /* armed for the block that runs position mark_at - 1 (at 0: not armed) */
};

struct krun_model {
    kpk_file *f;
    k3_model m;
    int have_m;
    ktok *tok;
    int32_t stop[3];
    size_t n_stop;
    kmemplan plan;
    kstore_layout layout;      /* the plan's part the store is handed */
    int planned;
    uint64_t auto_budget;
    kstore *store;
    kpool *pool;
    k3_run run;
    int have_run;
    size_t ctx, chunk, max_seqs, block, spec;
    uint8_t *slots;            /* max_seqs x session_bytes: each a krun_session then its buffers */
    size_t session_bytes, live;
    char identity[40];         /* set_id-config hash (krun_model_identity) */
    /* snapshots written to a file as their block runs (krun_model_opts.cache): one at a time */
    float *mark_buf;           /* one KDA layer's head states, then its ShortConv history */
    float **mark_S, **mark_conv;   /* [n_layers]: every entry the buffer's two parts */
    krun_session *mark_owner;  /* the session whose file mark uses them, or NULL */
    ksave mark_save;
    krun_state_writer mark_w;
};

void krun_model_opts_init(krun_model_opts *o)
{
    memset(o, 0, sizeof *o);
    o->pin = -1;
    o->expert_slots = -1;
    o->head = -1;
    o->io = KRUN_IO_DIRECT;
    o->cache_policy = KRUN_CACHE_LFU;
    o->verify = KRUN_VERIFY_FIRST;
    o->ctx = 4096;
    o->chunk = 64;
    o->max_seqs = 1;
    o->simd = -1;
    o->predict = -1;
}

/* ---- opening -------------------------------------------------------------------- */

int krun_model_load(const char *path, krun_model **out, krun_err *err)
{
    krun_model *m = calloc(1, sizeof *m);
    kpk_err e = {0};
    *out = NULL;
    if (!m) { krun_err_set(err, KRUN_ENOMEM, "out of memory"); return -1; }
    if (kpk_open(path, &m->f, &e)) {
        /* a file that is not KPK or not readable is "cannot run"; a damaged KPK file is damaged data */
        krun_err_kpk(err, &e);
        free(m);
        return -1;
    }
    if (k3_model_open(m->f, &m->m, err)) {
        krun_model_close(m);
        return -1;
    }
    m->have_m = 1;
    {
        int st;
        m->tok = ktok_load_kpk(m->f, &st, err);
        if (!m->tok && st != KTOK_KPK_ABSENT) {   /* absent: the file takes token ids only */
            krun_model_close(m);
            return -1;
        }
    }
    if (m->m.eos_id >= 0) m->stop[m->n_stop++] = m->m.eos_id;
    if (m->tok) {
        int32_t a = ktok_find_special(m->tok, "<|end_of_msg|>"), b = ktok_find_special(m->tok, "[EOS]");
        if (a >= 0) m->stop[m->n_stop++] = a;
        if (b >= 0) m->stop[m->n_stop++] = b;
    }
    *out = m;
    return 0;
}

static size_t session_carve(krun_session *s, const k3_config *c, size_t ctx, karena *a);
static void mark_arm(krun_session *s, k3_seg *seg);
static void mark_end(krun_session *s, const k3_seg *seg, const krun_err *failed);
static void mark_drop(krun_session *s, const char *why);


/* The buffer snapshots written to a file go through (krun_session_mark_save):
 * one KDA layer's head states and ShortConv history, and the two per-layer
 * tables that point every layer at them. */
static size_t mark_buf_carve(krun_model *m, const k3_config *c, karena *a)
{
    float *S, *conv, **tS, **tc;
    KTAKE(a, S, k3_kda_S_floats(c));
    KTAKE(a, conv, k3_kda_conv_floats(c));
    KTAKE(a, tS, (size_t)c->n_layers);
    KTAKE(a, tc, (size_t)c->n_layers);
    if (a->base) {
        for (int L = 0; L < c->n_layers; L++) { tS[L] = S; tc[L] = conv; }
        m->mark_buf = S;
        m->mark_S = tS;
        m->mark_conv = tc;
    }
    return karena_round(a->used);
}

static size_t mark_buf_bytes(const k3_config *c)
{
    karena a = {NULL, 0};
    return mark_buf_carve(NULL, c, &a);
}

size_t krun_session_bytes(const k3_config *c, size_t ctx)
{
    karena a = {NULL, 0};
    return session_carve(NULL, c, ctx, &a);
}

int krun_model_make_plan(const krun_model *m, const krun_model_opts *o, kmemplan *plan, krun_err *err)
{
    kmemplan_req q = {o->budget, o->pin, o->expert_slots, o->head, o->piece, o->ctx, o->chunk, o->max_seqs, o->spec,
                      o->io_threads, kmem_base_bytes(&m->m) + o->extra_bytes + (o->cache ? mark_buf_bytes(&m->m.cfg) : 0), o->predict,
                      krun_session_bytes(&m->m.cfg, o->ctx)};
    if (o->spec > KSPEC_MAX_DRAFT) {
        krun_err_set(err, KRUN_EINPUT, "spec %zu: at most %d drafts per verification", o->spec, KSPEC_MAX_DRAFT);
        return -1;
    }
    if (kmemplan_make(&m->m, &q, plan, err)) return -1;
    plan->preset = o->preset;
    return 0;
}

int krun_model_prepare(krun_model *m, const krun_model_opts *o, krun_err *err)
{
    krun_model_opts opt = *o;
    const k3_config *c = &m->m.cfg;
    kstore_opts so;
    if (opt.max_seqs < 1 || opt.max_seqs > K3_MAX_SEQS || opt.ctx < 1 || opt.chunk < 1 || opt.spec > KSPEC_MAX_DRAFT) {
        krun_err_set(err, KRUN_EINPUT, "max_seqs must be 1..%d, ctx and chunk at least 1, spec at most %d", K3_MAX_SEQS,
                     KSPEC_MAX_DRAFT);
        return -1;
    }
    /* A file that does not fit comfortably gets 80% of the available memory
     * as its budget rather than a mapping that pushes everything else out. */
    if (!opt.budget && kmem_available() && kpk_total_size(m->f) > kmem_available() / 10 * 8) {
        opt.budget = m->auto_budget = kmem_available() / 10 * 8;
    }
    if (opt.simd >= 0) kern_simd_set((ksimd)opt.simd);
    memset(&so, 0, sizeof so);
    so.verify = opt.verify;
    so.model = &m->m;
    if (opt.budget) {
        if (krun_model_make_plan(m, &opt, &m->plan, err)) return -1;
        m->planned = 1;
        kmemplan_layout(&m->plan, &m->layout);
        so.layout = &m->layout;
        so.io = opt.io;
        so.policy = opt.cache_policy;
        so.io_threads = opt.io_threads;
        so.trace = opt.trace;
    }
    if (kstore_open(m->f, &so, &m->store, err)) return -1;
    m->pool = kpool_create(opt.threads ? opt.threads : kpool_ncpu());
    if (!m->pool) { krun_err_set(err, KRUN_ENOMEM, "cannot start %d threads", opt.threads ? opt.threads : kpool_ncpu()); return -1; }
    m->ctx = opt.ctx;
    m->chunk = opt.chunk;
    m->max_seqs = opt.max_seqs;
    m->spec = opt.spec;
    m->block = k3_block_positions(opt.chunk, opt.max_seqs, opt.spec);
    if (k3_run_init(&m->run, &m->m, m->store, m->pool, m->block, m->max_seqs, m->ctx, m->spec, err)) return -1;
    m->have_run = 1;
    if (m->planned && m->plan.predict && k3_predict_init(&m->run, m->plan.predict_buf_bytes, m->plan.predict_stage_bytes, err))
        return -1;
    m->session_bytes = krun_session_bytes(c, m->ctx);
    m->slots = aligned_alloc(KARENA_ALIGN, m->max_seqs * m->session_bytes);
    if (!m->slots) {
        krun_err_set(err, KRUN_ENOMEM, "out of memory: %zu bytes for the state of %zu session(s) at --ctx %zu",
                     m->max_seqs * m->session_bytes, m->max_seqs, m->ctx);
        return -1;
    }
    for (size_t k = 0; k < m->max_seqs; k++) {
        karena a = {m->slots + k * m->session_bytes, 0};
        krun_session *s = (krun_session *)(void *)a.base;
        session_carve(s, c, m->ctx, &a);
        s->m = m;
        s->live = 0;
    }
    if (opt.cache) {
        karena a = {aligned_alloc(KARENA_ALIGN, mark_buf_bytes(c)), 0};
        if (!a.base) return krun_err_set(err, KRUN_ENOMEM, "out of memory: %zu bytes for the prefix cache's layer buffer", mark_buf_bytes(c));
        mark_buf_carve(m, c, &a);
    }
    return 0;
}

int krun_model_open(const krun_model_opts *o, krun_model **out, krun_err *err)
{
    if (krun_model_load(o->path, out, err)) return -1;
    if (krun_model_prepare(*out, o, err)) {
        krun_model_close(*out);
        *out = NULL;
        return -1;
    }
    return 0;
}

void krun_model_close(krun_model *m)
{
    if (!m) return;
    if (m->have_run) k3_run_free(&m->run);
    free(m->slots);
    free(m->mark_buf);
    kpool_destroy(m->pool);
    kstore_close(m->store);
    if (m->have_m) k3_model_close(&m->m);
    ktok_free(m->tok);
    kpk_close(m->f);
    free(m);
}

const k3_config *krun_model_config(const krun_model *m) { return &m->m.cfg; }

static uint64_t config_hash(const krun_model *m);
const char *krun_model_identity(const krun_model *m)
{
    krun_model *w = (krun_model *)m;      /* filled on first use */
    if (!w->identity[0])
        snprintf(w->identity, sizeof w->identity, "%016llx-%016llx", (unsigned long long)kpk_super(m->f)->set_id,
                 (unsigned long long)config_hash(m));
    return m->identity;
}
const char *krun_model_path(const krun_model *m) { return kpk_path(m->f); }
ktok *krun_model_tokenizer(const krun_model *m) { return m->tok; }
const kmemplan *krun_model_plan(const krun_model *m) { return m->planned ? &m->plan : NULL; }
uint64_t krun_model_auto_budget(const krun_model *m) { return m->auto_budget; }
int krun_model_threads(const krun_model *m) { return kpool_threads(m->pool); }
size_t krun_model_ctx(const krun_model *m) { return m->ctx; }
size_t krun_model_chunk(const krun_model *m) { return m->chunk; }
size_t krun_model_max_seqs(const krun_model *m) { return m->max_seqs; }
size_t krun_model_block(const krun_model *m) { return m->block; }
int krun_model_trace_write(krun_model *m, const char *path) { return kstore_trace_write(m->store, path); }

size_t krun_model_stop_ids(const krun_model *m, int32_t out[3])
{
    memcpy(out, m->stop, m->n_stop * sizeof *out);
    return m->n_stop;
}

void krun_model_stats(const krun_model *m, krun_stats *st) { kstore_stats_get(m->store, st); }

int krun_simd_parse(const char *name)
{
    ksimd l;
    return kern_simd_parse(name, &l) ? -1 : (int)l;
}

const char *krun_simd_name(void) { return kern_simd_name(kern_simd_get()); }
const char *krun_model_notice(const krun_model *m) { return m->store ? kstore_notice(m->store) : NULL; }

void krun_model_memory(const krun_model *m, uint64_t *planned, uint64_t *allocated)
{
    const k3_config *c = &m->m.cfg;
    if (m->planned)
        *planned = m->plan.state_bytes + m->plan.vectors_bytes + m->plan.scratch_bytes;
    else
        *planned = (uint64_t)m->max_seqs * krun_session_bytes(c, m->ctx) + k3_run_bytes(c, m->block, m->max_seqs, m->ctx, m->spec);
    *allocated = (uint64_t)m->run.arena_bytes + (m->slots ? (uint64_t)m->max_seqs * m->session_bytes : 0);
}

/* ---- sessions ------------------------------------------------------------------- */

/* One session's slot: the struct, its sequential state, its history, its
 * logits and its sampler's scratch.  Returns the slot's size (a multiple of
 * the arena alignment, so slots follow each other). */
static size_t session_carve(krun_session *s, const k3_config *c, size_t ctx, karena *a)
{
    const size_t V = (size_t)c->vocab;
    krun_session tmp, *x = s ? s : &tmp;
    karena_take(a, 1, sizeof *x);          /* the struct itself (s points at it) */
    memset(x, 0, sizeof *x);
    k3_state_carve(&x->st, c, ctx, a);
    KTAKE(a, x->tokens, ctx);
    KTAKE(a, x->logits, V);
    KTAKE(a, x->order, V);
    KTAKE(a, x->prob, V);
    return karena_round(a->used);
}

int krun_session_new(krun_model *m, krun_session **out, krun_err *err)
{
    static const ksampler_opts greedy = {0, 0, 1.0f, 0, 0};
    *out = NULL;
    for (size_t k = 0; k < m->max_seqs; k++) {
        krun_session *s = (krun_session *)(void *)(m->slots + k * m->session_bytes);
        if (s->live) continue;
        s->live = 1;
        m->live++;
        krun_session_reset(s);
        krun_session_set_sampler(s, &greedy);
        s->progress = NULL;
        *out = s;
        return 0;
    }
    krun_err_set(err, KRUN_EINPUT, "%zu sessions are live: the model was prepared for at most %zu (max_seqs)", m->live, m->max_seqs);
    return -1;
}

void krun_session_free(krun_session *s)
{
    if (!s || !s->live) return;
    if (s->mark_at) mark_drop(s, "the session was freed");
    s->live = 0;
    s->m->live--;
}

void krun_session_reset(krun_session *s)
{
    if (s->mark_at) mark_drop(s, "the session was reset");
    k3_state_reset(&s->st);
    s->n_tokens = 0;
    s->have_logits = 0;
    s->broken = 0;
    kspec_init(&s->drafter, s->m->spec);
    memset(&s->spec, 0, sizeof s->spec);
}

const float *krun_session_logits(const krun_session *s) { return s->have_logits ? s->logits : NULL; }
size_t krun_session_pos(const krun_session *s) { return s->st.pos; }
size_t krun_session_ctx_of(const krun_session *s) { return s->st.ctx; }
size_t krun_session_pending(const krun_session *s) { return s->n_tokens - s->st.pos; }

const int32_t *krun_session_tokens(const krun_session *s, size_t *n)
{
    *n = s->n_tokens;
    return s->tokens;
}

void krun_session_set_sampler(krun_session *s, const ksampler_opts *o)
{
    ksampler_init(&s->sampler, o, s->order, s->prob, (size_t)s->m->m.cfg.vocab);
}

void krun_session_get_rng(const krun_session *s, uint64_t rng[4]) { memcpy(rng, s->sampler.s, sizeof s->sampler.s); }
void krun_session_set_rng(krun_session *s, const uint64_t rng[4]) { memcpy(s->sampler.s, rng, sizeof s->sampler.s); }

int32_t krun_session_sample(krun_session *s)
{
    return s->have_logits ? ksampler_pick(&s->sampler, s->logits, (size_t)s->m->m.cfg.vocab) : -1;
}

void krun_session_set_progress(krun_session *s, krun_progress_fn fn, void *ctx)
{
    s->progress = fn;
    s->progress_ctx = ctx;
}

/* ids join the history as pending tokens, if they are valid and fit. */
static int push_tokens(krun_session *s, const int32_t *ids, size_t n, krun_err *err)
{
    const size_t V = (size_t)s->m->m.cfg.vocab;
    if (s->broken) {
        krun_err_set(err, KRUN_EINPUT, "the session's last feed failed: reset it before use");
        return -1;
    }
    if (n > s->st.ctx - s->n_tokens) {
        krun_err_set(err, KRUN_EINPUT, "context full: %zu positions reserved, %zu needed (give a larger --ctx)", s->st.ctx,
                     s->n_tokens + n);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= V) {
            krun_err_set(err, KRUN_EINPUT, "token id %d at position %zu is outside the vocabulary (0..%zu)", ids[i],
                         s->n_tokens + i, V - 1);
            return -1;
        }
    if (n) memcpy(s->tokens + s->n_tokens, ids, n * sizeof *ids);
    s->n_tokens += n;
    return 0;
}

int krun_session_append(krun_session *s, const int32_t *ids, size_t n, krun_err *err) { return push_tokens(s, ids, n, err); }

int krun_session_feed(krun_session *s, const int32_t *ids, size_t n, float *all_logits, krun_err *err)
{
    krun_model *m = s->m;
    const size_t V = (size_t)m->m.cfg.vocab;
    size_t start, total;
    if (push_tokens(s, ids, n, err)) return -1;
    start = s->st.pos;
    total = s->n_tokens - start;
    while (s->st.pos < s->n_tokens) {
        size_t done = s->st.pos - start, nb = s->n_tokens - s->st.pos < m->chunk ? s->n_tokens - s->st.pos : m->chunk;
        k3_seg seg = {&s->st, s->tokens + s->st.pos, nb, all_logits ? all_logits + done * V : s->logits, all_logits != NULL, 0, NULL};
        mark_arm(s, &seg);
        if (k3_forward(&m->run, &seg, 1, err)) {
            mark_end(s, &seg, err);
            s->broken = 1;
            s->have_logits = 0;
            return -1;
        }
        mark_end(s, &seg, NULL);
        if (all_logits) memcpy(s->logits, all_logits + (done + nb - 1) * V, V * sizeof *s->logits);
        s->have_logits = 1;
        if (s->progress) s->progress(s->progress_ctx, done + nb, total);
    }
    return 0;
}

/* id (pushed, pending) and the k drafts at s->tokens[n_tokens..) in one
 * journaled block; keep what the sampler agrees with (speculative decoding). */
static int verify(krun_session *s, size_t k, int32_t *accepted, float *accepted_logits, size_t *n_accepted, krun_err *err)
{
    krun_model *m = s->m;
    const size_t V = (size_t)m->m.cfg.vocab;
    const float *L = m->run.j.logits;
    const int32_t *draft = s->tokens + s->n_tokens;
    size_t a = 0;
    k3_seg seg = {&s->st, s->tokens + s->st.pos, k + 1, m->run.j.logits, 1, 1, NULL};
    mark_arm(s, &seg);                 /* a journaled block takes no snapshot: one it passes is dropped */
    s->spec.sweeps++;
    if (k3_forward(&m->run, &seg, 1, err)) {
        s->broken = 1;
        s->have_logits = 0;
        return -1;
    }
    /* row i of the block's logits follows id and the first i drafts: draft i
     * stands if the sampler (greedy) picks it there.  Each row kept is one a
     * plain run computes, and is checked as it would be. */
    for (;; a++) {
        if (k3_check_finite(&m->run, L + a * V, 1, s->st.pos + a, err)) {
            s->broken = 1;
            s->have_logits = 0;
            return -1;
        }
        if (a == k || ksampler_pick(&s->sampler, L + a * V, V) != draft[a]) break;
    }
    k3_commit(&m->run, &s->st, a + 1);
    s->n_tokens += a;
    memcpy(s->logits, L + a * V, V * sizeof *s->logits);
    s->have_logits = 1;
    if (accepted) memcpy(accepted, draft, a * sizeof *accepted);
    if (accepted_logits) memcpy(accepted_logits, L, a * V * sizeof *accepted_logits);
    s->spec.verifications++;
    s->spec.drafted += k;
    s->spec.accepted += a;
    s->spec.rollbacks += a < k;
    *n_accepted = a;
    return 0;
}

/* The checks before a verification, then id pushed (the pending tokens before it run first). */
static int verify_begin(krun_session *s, int32_t id, size_t *room, krun_err *err)
{
    krun_model *m = s->m;
    if (m->spec && s->sampler.o.temp > 0) {
        krun_err_set(err, KRUN_EINPUT, "speculative decoding is exact for greedy decoding only (the sampler's temperature is %g)",
                     (double)s->sampler.o.temp);
        return -1;
    }
    if (s->n_tokens > s->st.pos && krun_session_feed(s, NULL, 0, NULL, err)) return -1;
    if (push_tokens(s, &id, 1, err)) return -1;
    /* drafts go right after the history, where they belong if accepted */
    *room = s->st.ctx - s->n_tokens < m->spec ? s->st.ctx - s->n_tokens : m->spec;
    return 0;
}

int krun_session_feed_spec(krun_session *s, int32_t id, size_t max_draft, int32_t *accepted, float *accepted_logits,
                           size_t *n_accepted, krun_err *err)
{
    krun_model *m = s->m;
    size_t room, k;
    *n_accepted = 0;
    if (verify_begin(s, id, &room, err)) return -1;
    k = kspec_draft(&s->drafter, s->tokens, s->n_tokens, max_draft < room ? max_draft : room, m->stop, m->n_stop,
                    s->tokens + s->n_tokens);
    if (k == 0) {
        s->spec.sweeps++;
        return krun_session_feed(s, NULL, 0, NULL, err);
    }
    if (verify(s, k, accepted, accepted_logits, n_accepted, err)) return -1;
    kspec_result(&s->drafter, k, *n_accepted);
    return 0;
}

int krun_session_verify(krun_session *s, int32_t id, const int32_t *draft, size_t k, int32_t *accepted, float *accepted_logits,
                        size_t *n_accepted, krun_err *err)
{
    const size_t V = (size_t)s->m->m.cfg.vocab;
    size_t room;
    *n_accepted = 0;
    for (size_t i = 0; i < k; i++)
        if (draft[i] < 0 || (size_t)draft[i] >= V) {
            krun_err_set(err, KRUN_EINPUT, "draft %zu: token id %d is outside the vocabulary (0..%zu)", i, draft[i], V - 1);
            return -1;
        }
    if (k > s->m->spec) {
        krun_err_set(err, KRUN_EINPUT, "%zu drafts: the model was prepared for at most %zu (spec)", k, s->m->spec);
        return -1;
    }
    if (s->n_tokens >= s->st.ctx || k > s->st.ctx - s->n_tokens - 1) {
        krun_err_set(err, KRUN_EINPUT, "context full: %zu positions reserved, %zu needed (give a larger --ctx)", s->st.ctx,
                     s->n_tokens + 1 + k);
        return -1;
    }
    if (verify_begin(s, id, &room, err)) return -1;
    if (k == 0) {
        s->spec.sweeps++;
        return krun_session_feed(s, NULL, 0, NULL, err);
    }
    memcpy(s->tokens + s->n_tokens, draft, k * sizeof *draft);
    return verify(s, k, accepted, accepted_logits, n_accepted, err);
}

void krun_session_spec_stats(const krun_session *s, krun_spec_stats *st) { *st = s->spec; }

int krun_step_batch(krun_model *m, krun_session *const *ss, const int32_t *ids, size_t n, krun_err *err)
{
    k3_seg segs[K3_MAX_SEQS];
    if (n == 0 || n > m->max_seqs) { krun_err_set(err, KRUN_EINPUT, "%zu sessions in one step (1..%zu)", n, m->max_seqs); return -1; }
    for (size_t k = 0; k < n; k++) {
        krun_session *s = ss[k];
        if (s->m != m || !s->live) { krun_err_set(err, KRUN_EINPUT, "session %zu is not a live session of this model", k); return -1; }
        for (size_t j = 0; j < k; j++)
            if (ss[j] == s) { krun_err_set(err, KRUN_EINPUT, "session %zu appears twice in one step", k); return -1; }
    }
    {
        size_t T = 0;
        for (size_t k = 0; k < n; k++) T += ss[k]->n_tokens - ss[k]->st.pos + 1;
        if (T > m->block) {
            krun_err_set(err, KRUN_EINPUT, "%zu positions (pending tokens included) in one step; a block holds %zu", T, m->block);
            return -1;
        }
    }
    for (size_t k = 0; k < n; k++)
        if (push_tokens(ss[k], &ids[k], 1, err)) {
            for (size_t j = 0; j < k; j++) ss[j]->n_tokens--;   /* the step did not happen */
            return -1;
        }
    for (size_t k = 0; k < n; k++) {
        krun_session *s = ss[k];
        segs[k] = (k3_seg){&s->st, s->tokens + s->st.pos, s->n_tokens - s->st.pos, s->logits, 0, 0, NULL};
        mark_arm(s, &segs[k]);
    }
    if (k3_forward(&m->run, segs, n, err)) {
        for (size_t k = 0; k < n; k++) { mark_end(ss[k], &segs[k], err); ss[k]->broken = 1; ss[k]->have_logits = 0; }
        return -1;
    }
    for (size_t k = 0; k < n; k++) mark_end(ss[k], &segs[k], NULL);
    for (size_t k = 0; k < n; k++) ss[k]->have_logits = 1;
    return 0;
}

/* ---- copies and snapshots ------------------------------------------------------ */

struct krun_snapshot {
    krun_model *m;
    size_t cap;                /* history tokens it has room for (its state's MLA rows too) */
    int taken;
    k3_state st;
    int32_t *tokens;           /* [cap] */
    size_t n_tokens;
    float *logits;             /* [vocab] */
    int have_logits;
    ksampler_opts so;          /* the sampler: options and PRNG state */
    uint64_t rng[4];
    kspec drafter;
};

/* What a session is, in one place: its state, history, logits, sampler and
 * drafter.  Each copy below is one of these assignments. */
typedef struct sess_view {
    k3_state *st;
    int32_t *tokens;
    size_t *n_tokens;
    float *logits;
    int *have_logits;
    ksampler_opts *so;         /* NULL for a session: its sampler is re-initialised */
    uint64_t *rng;
    kspec *drafter;
} sess_view;

static sess_view view_of_session(krun_session *s)
{
    return (sess_view){&s->st, s->tokens, &s->n_tokens, s->logits, &s->have_logits, NULL, s->sampler.s, &s->drafter};
}

static sess_view view_of_snapshot(krun_snapshot *x)
{
    return (sess_view){&x->st, x->tokens, &x->n_tokens, x->logits, &x->have_logits, &x->so, x->rng, &x->drafter};
}

/* dst := src, everything a continuation depends on (the caller checked room). */
static void view_copy(const sess_view *dst, const sess_view *src, size_t V)
{
    k3_state_copy(dst->st, src->st);
    memcpy(dst->tokens, src->tokens, *src->n_tokens * sizeof *dst->tokens);
    *dst->n_tokens = *src->n_tokens;
    if (*src->have_logits) memcpy(dst->logits, src->logits, V * sizeof *dst->logits);
    *dst->have_logits = *src->have_logits;
    if (dst->so && src->so) *dst->so = *src->so;
    memcpy(dst->rng, src->rng, 4 * sizeof *dst->rng);
    *dst->drafter = *src->drafter;
}

/* A session becomes src: its sampler takes src's options (so) first. */
static void copy_into_session(krun_session *dst, const sess_view *src, const ksampler_opts *so)
{
    sess_view d = view_of_session(dst);
    krun_session_reset(dst);
    ksampler_init(&dst->sampler, so, dst->order, dst->prob, (size_t)dst->m->m.cfg.vocab);
    view_copy(&d, src, (size_t)dst->m->m.cfg.vocab);
}

static int copy_check(const krun_session *src, const krun_model *m, size_t room, const char *what, krun_err *err)
{
    if (src->m != m) return krun_err_set(err, KRUN_EINPUT, "copying a session: not a session of this model");
    if (src->broken) return krun_err_set(err, KRUN_EINPUT, "copying a session: its last feed failed, nothing consistent to copy");
    if (src->n_tokens > room)
        return krun_err_set(err, KRUN_EINPUT, "copying a session of %zu tokens: %s holds %zu", src->n_tokens, what, room);
    return 0;
}

int krun_session_copy(krun_session *dst, const krun_session *src, krun_err *err)
{
    sess_view v = view_of_session((krun_session *)src);   /* read only */
    if (dst == src || !dst->live) return krun_err_set(err, KRUN_EINPUT, "copying a session: the target must be another live session");
    if (copy_check(src, dst->m, dst->st.ctx, "the target session's context", err)) return -1;
    copy_into_session(dst, &v, &src->sampler.o);
    return 0;
}

static size_t snapshot_carve(krun_snapshot *x, const k3_config *c, size_t cap, karena *a)
{
    krun_snapshot tmp, *s = x ? x : &tmp;
    karena_take(a, 1, sizeof *s);
    memset(s, 0, sizeof *s);
    k3_state_carve(&s->st, c, cap, a);
    KTAKE(a, s->tokens, cap);
    KTAKE(a, s->logits, (size_t)c->vocab);
    return karena_round(a->used);
}

size_t krun_snapshot_bytes(const krun_model *m, size_t cap)
{
    karena a = {NULL, 0};
    return snapshot_carve(NULL, &m->m.cfg, cap, &a);
}

int krun_snapshot_new(krun_model *m, size_t cap, krun_snapshot **out, krun_err *err)
{
    size_t n = krun_snapshot_bytes(m, cap);
    karena a = {aligned_alloc(KARENA_ALIGN, n), 0};
    *out = NULL;
    if (!a.base) return krun_err_set(err, KRUN_ENOMEM, "out of memory: %zu bytes for a snapshot of %zu positions", n, cap);
    snapshot_carve((krun_snapshot *)(void *)a.base, &m->m.cfg, cap, &a);
    *out = (krun_snapshot *)(void *)a.base;
    (*out)->m = m;
    (*out)->cap = cap;
    return 0;
}

void krun_snapshot_free(krun_snapshot *snap) { free(snap); }

int krun_snapshot_take(krun_snapshot *snap, const krun_session *s, krun_err *err)
{
    sess_view d = view_of_snapshot(snap), v = view_of_session((krun_session *)s);   /* s: read only */
    if (copy_check(s, snap->m, snap->cap, "the snapshot", err)) return -1;
    snap->so = s->sampler.o;
    view_copy(&d, &v, (size_t)snap->m->m.cfg.vocab);
    snap->taken = 1;
    return 0;
}

int krun_snapshot_restore(krun_session *s, const krun_snapshot *snap, krun_err *err)
{
    sess_view v = view_of_snapshot((krun_snapshot *)snap);   /* read only */
    if (s->m != snap->m || !s->live) return krun_err_set(err, KRUN_EINPUT, "restoring a snapshot: not a live session of its model");
    if (!snap->taken) return krun_err_set(err, KRUN_EINPUT, "restoring a snapshot: nothing was taken into it");
    if (snap->n_tokens > s->st.ctx)
        return krun_err_set(err, KRUN_EINPUT, "restoring a snapshot of %zu tokens into a session whose context holds %zu", snap->n_tokens,
                            s->st.ctx);
    copy_into_session(s, &v, &snap->so);
    return 0;
}

const int32_t *krun_snapshot_tokens(const krun_snapshot *snap, size_t *n, size_t *pos)
{
    *n = snap->taken ? snap->n_tokens : 0;
    *pos = snap->taken ? snap->st.pos : 0;
    return snap->taken ? snap->tokens : NULL;
}

/* ---- saved conversations -------------------------------------------------------- */

static uint64_t config_hash(const krun_model *m) { return XXH3_64bits(m->m.config_text, m->m.config_len); }

/* The state header of the session; -1 if it has nothing consistent to save. */
static int session_hdr(const krun_session *s, const char *path, krun_state_hdr *h, krun_err *err)
{
    const krun_model *m = s->m;
    if (s->broken) { krun_err_set(err, KRUN_EINPUT, "%s: the session's last feed failed; nothing consistent to save", path); return -1; }
    krun_state_hdr_for(h, &m->m.cfg, kpk_super(m->f)->set_id, config_hash(m));
    h->pos = s->st.pos;
    h->n_tokens = s->n_tokens;
    h->flags = s->have_logits ? KRUN_STATE_LOGITS : 0;
    memcpy(h->rng, s->sampler.s, sizeof h->rng);
    return 0;
}

int krun_session_save(const krun_session *s, const char *path, krun_err *err)
{
    krun_state_hdr h;
    if (session_hdr(s, path, &h, err)) return -1;
    return krun_state_write(path, &h, &s->m->m.cfg, s->tokens, &s->st, s->logits, err);
}

int krun_session_save_to(const krun_session *s, ksave *out, krun_err *err)
{
    krun_state_hdr h;
    if (session_hdr(s, out->path, &h, err)) return -1;
    return krun_state_write_to(out, &h, &s->m->m.cfg, s->tokens, &s->st, s->logits, err);
}

/* The largest state file this model can have at the session's context. */
static uint64_t state_most(const krun_session *s)
{
    const krun_model *m = s->m;
    krun_state_hdr want;
    krun_state_hdr_for(&want, &m->m.cfg, kpk_super(m->f)->set_id, config_hash(m));
    want.pos = want.n_tokens = s->st.ctx;
    want.flags = KRUN_STATE_LOGITS;
    return KRUN_STATE_HEADER + krun_state_payload_len(&want, NULL) + KRUN_STATE_TRAILER;
}

int krun_session_load(krun_session *s, const char *path, krun_err *err)
{
    struct stat sb;
    uint64_t most = state_most(s);
    char *buf = NULL;
    size_t len = 0;
    int rc;
    /* refuse anything larger than the largest state before reading it */
    if (stat(path, &sb)) { krun_err_set(err, KRUN_EINPUT, "cannot read %s: %s", path, strerror(errno)); return -1; }
    if ((uint64_t)sb.st_size > most) {
        krun_err_set(err, KRUN_EINPUT, "%s: %lld bytes, more than any state of this model at --ctx %zu (%llu): another model, "
                     "a larger context (give --ctx), or not a state file", path, (long long)sb.st_size, s->st.ctx,
                     (unsigned long long)most);
        return -1;
    }
    if (kio_read_file(path, (size_t)most, &buf, &len)) {
        krun_err_set(err, errno == ENOMEM ? KRUN_ENOMEM : KRUN_EINPUT, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    rc = krun_session_load_mem(s, buf, len, path, err);
    free(buf);
    return rc;
}

int krun_session_load_mem(krun_session *s, const void *buf, size_t len, const char *name, krun_err *err)
{
    const krun_model *m = s->m;
    const k3_config *c = &m->m.cfg;
    const uint8_t *b = buf;
    krun_state_hdr want, h;
    krun_state_hdr_for(&want, c, kpk_super(m->f)->set_id, config_hash(m));
    if (krun_state_parse(buf, len, &h, err)) return krun_err_prefix(err, "%s: ", name);
    if (h.set_id != want.set_id || h.config_xxh3 != want.config_xxh3)
        return krun_err_set(err, KRUN_EINPUT, "%s was saved with another model file (set_id %016llx, config %016llx; %s has %016llx, %016llx)",
                            name, (unsigned long long)h.set_id, (unsigned long long)h.config_xxh3, kpk_path(m->f),
                            (unsigned long long)want.set_id, (unsigned long long)want.config_xxh3);
    if (h.n_layers != want.n_layers || h.hidden != want.hidden || h.vocab != want.vocab || h.kda_heads != want.kda_heads ||
        h.kda_head_dim != want.kda_head_dim || h.conv_width != want.conv_width || h.kv_lora != want.kv_lora ||
        h.qk_rope != want.qk_rope || h.n_mla != want.n_mla)
        return krun_err_set(err, KRUN_EINPUT, "%s: its geometry differs from this model's", name);
    for (int L = 0; L < c->n_layers; L++)
        if (b[h.layer_types_at + (size_t)L] != (c->layer_is_mla[L] ? 1 : 0))
            return krun_err_set(err, KRUN_EINPUT, "%s: its layer map differs from this model's (layer %d)", name, L);
    if (h.n_tokens > s->st.ctx)
        return krun_err_set(err, KRUN_EINPUT, "%s holds %llu tokens (%llu run, %llu pending): more than --ctx %zu; give --ctx %llu or more",
                            name, (unsigned long long)h.n_tokens, (unsigned long long)h.pos,
                            (unsigned long long)(h.n_tokens - h.pos), s->st.ctx, (unsigned long long)h.n_tokens);
    krun_session_reset(s);
    krun_state_restore(buf, &h, c, s->tokens, &s->st, s->logits);
    s->n_tokens = (size_t)h.n_tokens;
    s->have_logits = (h.flags & KRUN_STATE_LOGITS) != 0;
    memcpy(s->sampler.s, h.rng, sizeof h.rng);
    return 0;
}

/* ---- snapshots inside a block (the prefix cache) -------------------------------- */

size_t krun_model_slots(const krun_model *m) { return m->max_seqs; }

krun_session *krun_model_slot(krun_model *m, size_t k)
{
    return k < m->max_seqs ? (krun_session *)(void *)(m->slots + k * m->session_bytes) : NULL;
}

int krun_session_live(const krun_session *s) { return s->live; }

int krun_session_claim(krun_session *s, krun_err *err)
{
    krun_model *m = s->m;
    if (s->live) return krun_err_set(err, KRUN_EINPUT, "claiming a session slot: it is live");
    if (m->live >= m->max_seqs)
        return krun_err_set(err, KRUN_EINPUT, "%zu sessions are live: the model was prepared for at most %zu (max_seqs)", m->live,
                            m->max_seqs);
    for (size_t k = 0; k < m->max_seqs; k++) {
        const krun_session *o = krun_model_slot(m, k);
        if (o->live && o->mark_dst == s) return krun_err_set(err, KRUN_EINPUT, "claiming a session slot: a snapshot is due in it");
    }
    s->live = 1;
    m->live++;
    s->progress = NULL;
    s->mark_at = 0;
    memset(&s->spec, 0, sizeof s->spec);
    return 0;
}

void krun_session_drop_pending(krun_session *s) { s->n_tokens = s->st.pos; }

static int mark_check(krun_session *s, size_t at, krun_err *err)
{
    if (!s->live) return krun_err_set(err, KRUN_EINPUT, "a snapshot of a session that is not live");
    if (s->mark_at) return krun_err_set(err, KRUN_EINPUT, "the session has a snapshot due already");
    if (at <= s->st.pos || at > s->st.ctx)
        return krun_err_set(err, KRUN_EINPUT, "a snapshot after %zu positions: the session has run %zu, its context holds %zu", at,
                            s->st.pos, s->st.ctx);
    return 0;
}

int krun_session_mark(krun_session *s, size_t at, krun_session *dst, krun_err *err)
{
    if (mark_check(s, at, err)) return -1;
    if (!dst || dst == s || dst->m != s->m || dst->live)
        return krun_err_set(err, KRUN_EINPUT, "a snapshot goes into another, idle session slot of the model");
    if (at > dst->st.ctx) return krun_err_set(err, KRUN_EINPUT, "a snapshot of %zu positions: its slot holds %zu", at, dst->st.ctx);
    s->mark_at = at;
    s->mark_dst = dst;
    s->mark_status = KRUN_MARK_PENDING;
    s->mark_msg[0] = 0;
    return 0;
}

int krun_session_mark_save(krun_session *s, size_t at, const char *path, krun_err *err)
{
    krun_model *m = s->m;
    if (mark_check(s, at, err)) return -1;
    if (!m->mark_buf) return krun_err_set(err, KRUN_EINPUT, "snapshots to a file need a model prepared for them (krun_model_opts.cache)");
    if (m->mark_owner) return krun_err_set(err, KRUN_EINPUT, "another session's snapshot to a file is due (one at a time)");
    if (!(s->mark_path = strdup(path))) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
    m->mark_owner = s;
    s->mark_at = at;
    s->mark_dst = NULL;
    s->mark_status = KRUN_MARK_PENDING;
    s->mark_msg[0] = 0;
    return 0;
}

int krun_session_mark_status(const krun_session *s, const char **why)
{
    if (why) *why = s->mark_msg;
    return s->mark_status;
}

static void mark_clear(krun_session *s)
{
    if (!s->mark_dst && s->m->mark_owner == s) s->m->mark_owner = NULL;
    free(s->mark_path);
    s->mark_path = NULL;
    s->mark_at = 0;
    s->mark_dst = NULL;
    s->snap.at = 0;
}

static void mark_drop(krun_session *s, const char *why)
{
    krun_model *m = s->m;
    if (s->snap.at && !s->mark_dst && m->mark_owner == s) {     /* a file was begun */
        krun_state_write_drop(&m->mark_w);
        ksave_abort(&m->mark_save);
    }
    s->mark_status = KRUN_MARK_DROPPED;
    snprintf(s->mark_msg, sizeof s->mark_msg, "%s", why);
    mark_clear(s);
}

void krun_session_unmark(krun_session *s)
{
    if (s->mark_at) mark_drop(s, "taken back");
}

/* A file snapshot: each layer written as soon as the forward pass is done with it. */
static void mark_layer_to_file(void *ctx, int L)
{
    krun_session *s = ctx;
    krun_model *m = s->m;
    krun_state_write_layer(&m->mark_w, &m->m.cfg, L, m->mark_S[L], m->mark_conv[L], s->st.mla_cache[L]);
}

/* Before a block: arm its segment when the mark's position falls in it. */
static void mark_arm(krun_session *s, k3_seg *seg)
{
    krun_model *m = s->m;
    size_t at;
    krun_err e;
    if (!s->mark_at) return;
    if (s->mark_at <= s->st.pos) { mark_drop(s, "a block passed the position"); return; }
    if (s->mark_at > s->st.pos + seg->n) return;                 /* a later block */
    if (seg->journal) { mark_drop(s, "a verification block passed the position"); return; }
    at = s->mark_at - s->st.pos;
    if (s->mark_dst) {
        s->snap = (k3_snap){at, s->mark_dst->st.kda_S, s->mark_dst->st.kda_conv, NULL, s};
    } else {
        /* the file is begun now (header, layer map, history), its layers follow as the block runs */
        krun_state_hdr h;
        krun_state_hdr_for(&h, &m->m.cfg, kpk_super(m->f)->set_id, config_hash(m));
        h.pos = h.n_tokens = s->mark_at;
        h.flags = 0;                   /* the file is named before the blocks are known: never logits */
        if (ksave_begin(&m->mark_save, s->mark_path, &e)) { mark_drop(s, e.msg); return; }
        if (krun_state_write_begin(&m->mark_w, &m->mark_save, &h, &m->m.cfg, s->tokens, &e)) {
            ksave_abort(&m->mark_save);
            mark_drop(s, e.msg);
            return;
        }
        s->snap = (k3_snap){at, m->mark_S, m->mark_conv, mark_layer_to_file, s};
    }
    seg->snap = &s->snap;
}

/* After the block: the snapshot completed (the MLA rows, history and logits
 * added, or the file finished and renamed into place), or dropped. */
static void mark_end(krun_session *s, const k3_seg *seg, const krun_err *failed)
{
    krun_model *m = s->m;
    const k3_config *c = &m->m.cfg;
    const size_t V = (size_t)c->vocab, at = s->snap.at;
    const float *logits;
    krun_err e;
    if (!seg->snap) return;
    if (failed) { mark_drop(s, failed->msg); return; }
    logits = seg->all_positions ? seg->logits + (at - 1) * V : at == seg->n ? seg->logits : NULL;
    if (s->mark_dst) {
        krun_session *d = s->mark_dst;
        for (int L = 0; L < c->n_layers; L++)
            if (c->layer_is_mla[L]) memcpy(d->st.mla_cache[L], s->st.mla_cache[L], s->mark_at * k3_mla_row(c) * sizeof(float));
        memcpy(d->tokens, s->tokens, s->mark_at * sizeof *d->tokens);
        d->n_tokens = d->st.pos = s->mark_at;
        d->have_logits = logits != NULL;
        if (logits) memcpy(d->logits, logits, V * sizeof *d->logits);
        d->broken = 0;
        kspec_init(&d->drafter, m->spec);
    } else {
        krun_state_write_end(&m->mark_w, logits);
        if (ksave_commit(&m->mark_save, &e)) { s->snap.at = 0; mark_drop(s, e.msg); return; }
    }
    s->mark_status = KRUN_MARK_TAKEN;
    mark_clear(s);
}
