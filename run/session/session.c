/* krun as a library: the model (file, plan, store, threads, run state) and
 * its sessions (session.h). */
#include "session.h"

#include "ranks.h"
#include "spec.h"
#include "statefile.h"
#include "format/kio.h"
#include "format/kos.h"
#include "run/draft/draft.h"
#include "run/engine/forward.h"
#include "run/engine/predict.h"
#include "run/kernels/kernels.h"
#include "run/store/store.h"
#include "run/text/tokenizer_kpk.h"
#include "run/util/procmem.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
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
    ksampler_scratch pick;     /* the sampler's scratch: [vocab] each */
    uint64_t *allowed;         /* [(vocab + 63) / 64]: the mask of the position being picked */
    size_t reply_from;         /* tokens[reply_from..) are the reply (the sampler's penalties) */
    krun_mask_fn mask;         /* constrained decoding: fills `allowed` per position (NULL: none) */
    void *mask_ctx;
    krun_progress_fn progress;
    void *progress_ctx;
    kspec drafter;             /* speculative decoding: what and how much to draft from the text (spec.h) */
    kdraft_state eagle;        /* the EAGLE drafter's rows and pending taps, when the model has one (draft.h) */
    kdraft_width wctl;         /* its widths and acceptance, per request */
    int draft_src;             /* where the drafts of the pending verification came from: 0 the text, 1 the drafter */
    krun_spec_stats spec;
    /* a snapshot to take inside a later block (krun_session_mark): 0 none */
    size_t mark_at;
    krun_session *mark_dst;    /* into this idle slot, or (NULL) into mark_path */
    char *mark_path;
    int mark_dirfd;            /* the directory mark_path is a name in (AT_FDCWD: a path) */
    int mark_status;           /* KRUN_MARK_* */
    char mark_msg[160];        /* why it was dropped */
    k3_snap snap;              /* armed for the block that runs position mark_at - 1 (at 0: not armed) */
    float *all_logits;         /* the next batched step's logits of every position it runs, or NULL
                                  (krun_session_all_logits) */
    size_t all_rows;           /* ... rows that buffer holds */
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
    size_t taps;               /* floats per position a drafter keeps of a block (0: no drafter) */
    kdraft *draft;             /* the EAGLE drafter (krun_model_opts.draft), or NULL */
    size_t draft_cap;          /* its states' rows: ctx + spec */
    size_t draft_width;        /* krun_model_opts.draft_width */
    kdraft_cost cost;          /* what a verification pass reads (the plan's, or in place: what it touches) */
    size_t block_prefill;      /* 0: one layout */
    int phase;                 /* 1: the prefill layout (the flex region holds a large block's activations) */
    uint8_t *flex;             /* the plan's flex region (memplan.h) */
    uint64_t flex_bytes;
    uint8_t *slots;            /* max_seqs x session_bytes: each a krun_session then its buffers */
    size_t session_bytes, live;
    k3_pager *pager;           /* the sessions' states paged to disk (krun_model_opts.state_dir), or NULL */
    char identity[40];         /* set_id-config hash (krun_model_identity) */
    char cache_identity[64];   /* and -d<drafter set_id> (krun_model_cache_identity) */
    /* snapshots written to a file as their block runs (krun_model_opts.cache): one at a time */
    float *mark_buf;           /* one KDA layer's head states, then its ShortConv history */
    float **mark_S, **mark_conv;   /* [n_layers]: every entry the buffer's two parts */
    krun_session *mark_owner;  /* the session whose file mark uses them, or NULL */
    ksave mark_save;
    krun_state_writer mark_w;
    krun_ranks *ranks;         /* rank 0 of several machines (ranks.h), or NULL */
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
    o->chunk = 0;
    o->max_seqs = 1;
    o->simd = -1;
    o->predict = -1;
}

/* ---- opening -------------------------------------------------------------------- */

/* here: a rank of several machines opens the members on its own disks (kpk_open_here). */
static int model_load(const char *path, int here, krun_model **out, krun_err *err)
{
    krun_model *m = calloc(1, sizeof *m);
    kpk_err e = {0};
    *out = NULL;
    if (!m) { krun_err_set(err, KRUN_ENOMEM, "out of memory"); return -1; }
    if (kpk_open_here(path, here, &m->f, &e)) {
        /* a file that is not KPK or not readable is "cannot run"; a damaged KPK file is damaged data */
        krun_err_kpk(err, &e);
        free(m);
        return -1;
    }
    if (kpk_super(m->f)->incompat & KPK_INCOMPAT_DRAFTER) {
        krun_err_set(err, KRUN_EINPUT, "%s is a drafter file (an EAGLE drafter, not a Kimi K3 model): give it with --draft FILE, "
                     "and the model as MODEL.kpk", path);
        krun_model_close(m);
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
    /* The end of a message (K3_MODEL.md §9): the config's eos_token_id (163586 in the release),
     * <|end_of_msg|> (the same id in K3) and the tokenizer's eos_token [EOS] (163585), on which
     * serving stacks stop too; each id once. */
    int32_t cand[3] = {m->m.eos_id, -1, -1};
    if (m->tok) {
        cand[1] = ktok_find_special(m->tok, "<|end_of_msg|>");
        cand[2] = ktok_find_special(m->tok, "[EOS]");
    }
    for (size_t i = 0; i < 3; i++) {
        int dup = cand[i] < 0;
        for (size_t j = 0; j < m->n_stop && !dup; j++) dup = m->stop[j] == cand[i];
        if (!dup) m->stop[m->n_stop++] = cand[i];
    }
    *out = m;
    return 0;
}

int krun_model_load(const char *path, krun_model **out, krun_err *err) { return model_load(path, kcl_active(), out, err); }

static size_t session_carve(krun_session *s, const k3_config *c, size_t ctx, int paged, const uint8_t *away, const k3_eagle_config *dc,
                            size_t dcap, karena *a);
static void mark_arm(krun_session *s, k3_seg *seg);
static void mark_end(krun_session *s, const k3_seg *seg, size_t row0, const krun_err *failed);
static void mark_drop(krun_session *s, const char *why);
static void draft_hdr(const krun_model *m, krun_state_hdr *h);
static int eagle_drafts(krun_model *m, krun_session *const *ss, const int32_t *ids, const size_t *max, size_t n, size_t share,
                        int32_t *const *out, size_t *nd, krun_err *err);


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
    return session_carve(NULL, c, ctx, 0, NULL, NULL, 0, &a);
}

/* A slot of this model: with its state paged, the tables, the history, logits and sampler only;
 * without the layers other ranks compute (run/cluster); with a drafter d, its state too (rows
 * for dcap positions). */
static size_t slot_bytes(const krun_model *m, size_t ctx, int paged, const kdraft *d, size_t dcap)
{
    karena a = {NULL, 0};
    return session_carve(NULL, &m->m.cfg, ctx, paged, m->m.away, d ? kdraft_config(d) : NULL, dcap, &a);
}

void krun_draft_auto_path(const char *model_path, char *out, size_t n)
{
    size_t len = strlen(model_path);
    if (len > 4 && strcmp(model_path + len - 4, ".kpk") == 0) len -= 4;
    snprintf(out, n, "%.*s.draft.kpk", (int)len, model_path);
}

/* The drafter file the options name, or NULL: none asked for ("off", NULL), or
 * "auto" and no MODEL.draft.kpk beside the model. */
static const char *draft_path_of(const krun_model *m, const krun_model_opts *o, char *buf, size_t n)
{
    if (!o->draft || strcmp(o->draft, "off") == 0) return NULL;
    if (strcmp(o->draft, "auto")) return o->draft;
    krun_draft_auto_path(kpk_path(m->f), buf, n);
    return access(buf, F_OK) == 0 ? buf : NULL;
}

/* What a pass costs under a plan (draft.h): the bytes every pass reads, and the experts' union. */
static kdraft_cost plan_cost(const kmemplan *p)
{
    return (kdraft_cost){(double)(p->trunk_stream_bytes + p->head_stream_bytes), (double)p->expert_slot_bytes, p->moe_layers,
                         p->n_experts, p->topk, 1, 0};
}

/* The plan of one budget without a drafter (d NULL) or with d's memory counted: its weights and
 * scratch in the base, its rows in every session's slot, its taps in the block's scratch. */
static int plan_with(const krun_model *m, const krun_model_opts *o, const kdraft *d, kmemplan *plan, krun_err *err)
{
    const k3_config *c = &m->m.cfg;
    const size_t cap = o->ctx + o->spec;
    const uint64_t dbytes = d ? kdraft_bytes(d, o->max_seqs, cap) : 0;
    kmemplan_req q = {o->budget, o->pin, o->expert_slots, o->head, o->piece, o->ctx, o->chunk, o->max_seqs, o->spec,
                      o->io_threads, kmem_base_bytes(&m->m) + o->extra_bytes + (o->cache ? mark_buf_bytes(c) : 0) + dbytes, o->predict,
                      slot_bytes(m, o->ctx, o->state_dir != NULL, d, cap),
                      o->prompt_tokens, o->state_dir != NULL, d ? kdraft_tap_floats(d) : 0};
    double a[KDRAFT_MAX_WIDTH], tok = 1, bpt;
    kdraft_cost cost;
    if (kmemplan_make(&m->m, &q, plan, err)) return -1;
    plan->preset = o->preset;
    cost = plan_cost(plan);
    plan->bytes_per_token = (uint64_t)kdraft_pass_bytes(&cost, 1);
    if (!d) return 0;
    snprintf(plan->draft_path, sizeof plan->draft_path, "%s", kdraft_path(d));
    plan->draft_bytes = dbytes;
    plan->draft_weight_bytes = kdraft_weight_bytes(d);
    plan->draft_state_bytes = kdraft_state_bytes(kdraft_config(d), cap);
    /* predicted with the acceptance assumed (--draft-accept, else the published figures') */
    plan->draft_accept = o->draft_accept > 0 ? o->draft_accept : KDRAFT_PLAN_ACCEPT;
    for (size_t j = 0; j < KDRAFT_MAX_WIDTH; j++) a[j] = plan->draft_accept;
    plan->draft_width = o->draft_width ? o->draft_width : kdraft_cheapest(&cost, a, o->spec, &tok, &bpt);
    if (plan->draft_width > o->spec) plan->draft_width = o->spec;
    tok = kdraft_expected_tokens(a, plan->draft_width);
    plan->draft_tokens_per_pass = tok;
    plan->bytes_per_token = (uint64_t)(kdraft_pass_bytes(&cost, plan->draft_width + 1) / tok);
    return 0;
}

/* In place (no plan): a pass touches every trunk layer and lm_head once and each row's experts:
 * the cost of resident weights, in bytes of memory read. */
static kdraft_cost resident_cost(const k3_model *m)
{
    const k3_config *c = &m->cfg;
    kdraft_cost k = {(double)m->globals[K3T_LM_HEAD].nbytes, 0, 0, c->n_experts, c->topk, 1, 0};
    for (int L = 0; L < c->n_layers; L++) {
        k.c0 += (double)kpk_extent_at(m->file, m->trunk_extent[L])->raw_len;
        if (!k3_layer_is_moe(c, L)) continue;
        k.moe_layers++;
        if (k3_expert_extent(m, L, 0) >= 0) k.expert_bytes = (double)kpk_extent_at(m->file, (uint32_t)k3_expert_extent(m, L, 0))->raw_len;
    }
    return k;
}

int krun_model_make_plan(const krun_model *m, const krun_model_opts *o, kmemplan *plan, krun_err *err)
{
    char buf[4096];
    const char *path = draft_path_of(m, o, buf, sizeof buf);
    const int automatic = o->draft && strcmp(o->draft, "auto") == 0;
    kdraft *own = NULL;
    const kdraft *d = m->draft;
    kmemplan without;
    int rc;
    if (o->spec > KSPEC_MAX_DRAFT) {
        krun_err_set(err, KRUN_EINPUT, "spec %zu: at most %d drafts per verification", o->spec, KSPEC_MAX_DRAFT);
        return -1;
    }
    if (!path || (automatic && !o->spec)) {
        if (plan_with(m, o, NULL, plan, err)) return -1;
        if (automatic) plan->draft_note = path ? "--spec 0 (no verification, nothing to draft for)" : "no MODEL.draft.kpk beside the model";
        return 0;
    }
    if (!d && kdraft_open(path, &m->m, &own, err)) return -1;
    if (own) d = own;
    if (!automatic) {
        rc = plan_with(m, o, d, plan, err);
    } else {
        /* --draft auto: the drafter's memory against what it would buy the model (pinned layers,
         * expert slots), by the predicted bytes per generated token of each plan */
        krun_err e2;
        rc = plan_with(m, o, NULL, &without, err);
        if (!rc && (plan_with(m, o, d, plan, &e2) || plan->bytes_per_token >= without.bytes_per_token)) {
            const char *why = plan->draft_path[0] && plan->bytes_per_token >= without.bytes_per_token
                                  ? "its memory saves more bytes per token given to the model" : "the budget cannot hold it";
            *plan = without;
            plan->draft_note = why;
        } else if (!rc) {
            plan->bytes_per_token_nodraft = without.bytes_per_token;
        }
    }
    kdraft_close(own);
    return rc;
}

int krun_model_prepare(krun_model *m, const krun_model_opts *o, krun_err *err)
{
    krun_model_opts opt = *o;
    const k3_config *c = &m->m.cfg;
    kstore_opts so;
    if (opt.max_seqs < 1 || opt.max_seqs > K3_MAX_SEQS || opt.ctx < 1 || opt.spec > KSPEC_MAX_DRAFT) {
        krun_err_set(err, KRUN_EINPUT, "max_seqs must be 1..%d, ctx at least 1, spec at most %d", K3_MAX_SEQS, KSPEC_MAX_DRAFT);
        return -1;
    }
    /* states on disk are read and written only around a forward block's layers (statepage.h):
     * what reads or copies a state between blocks is not supported with them yet (a
     * verification's commit waits for the next block: journal.h) */
    if (opt.state_dir && opt.cache)
        return krun_err_set(err, KRUN_EINPUT, "states paged to disk (--state-dir) do not go with a prefix cache in this version");
    /* several machines: the other ranks open the file, and who computes what is settled (ranks.h).
     * A drafter reads the hidden state after its tapped layers on rank 0 (taps: forward.h), so with
     * one every trunk layer stays on rank 0 and the other ranks serve experts. */
    if (kcl_active() && kcl_rank() == 0 && !m->ranks) {
        char dbuf[4096];
        if (opt.spec && draft_path_of(m, &opt, dbuf, sizeof dbuf)) {
            if (opt.stages == 1)
                return krun_err_set(err, KRUN_EINPUT, "--stages with a drafter (--draft): the drafter reads the trunk's hidden "
                                    "state on rank 0, so every trunk layer stays there: use --stages off (or auto)");
            opt.stages = -1;
        }
        if (krun_ranks_hello(&m->ranks, m, m->f, &m->m, &opt, err)) return -1;
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
        if (m->plan.flex_bytes) {
            /* the flex region: the lent layers and slots while decoding, a prefill block's activations */
            m->flex_bytes = m->plan.flex_bytes;
            /* posix_memalign, not aligned_alloc: the plan's flex size need not be a multiple of
             * the page, which C11's aligned_alloc requires (ASan refuses it) */
            void *flex = NULL;
            m->flex = posix_memalign(&flex, 4096, m->flex_bytes) ? NULL : flex;
            if (!m->flex) {
                krun_err_set(err, KRUN_ENOMEM, "out of memory: %llu bytes for the flex region (a prefill block's activations, or "
                             "the layers and expert slots it lends)", (unsigned long long)m->flex_bytes);
                return -1;
            }
            so.flex = m->flex;
            so.flex_bytes = m->flex_bytes;
            m->block_prefill = m->plan.block_prefill;
        }
    }
    {
        /* the drafter: the plan's choice, or (in place) the one the options name */
        char buf[4096];
        const char *path = m->planned ? (m->plan.draft_path[0] ? m->plan.draft_path : NULL) : draft_path_of(m, &opt, buf, sizeof buf);
        if (path && !opt.spec && !m->planned) path = NULL;
        if (path && !m->draft && kdraft_open(path, &m->m, &m->draft, err)) return -1;
        if (m->draft) {
            m->taps = kdraft_tap_floats(m->draft);
            m->draft_cap = opt.ctx + opt.spec;
            m->draft_width = opt.draft_width;
        }
    }
    if (kstore_open(m->f, &so, &m->store, err)) return -1;
    m->pool = kpool_create(opt.threads ? opt.threads : kpool_ncpu());
    if (!m->pool) { krun_err_set(err, KRUN_ENOMEM, "cannot start %d threads", opt.threads ? opt.threads : kpool_ncpu()); return -1; }
    m->ctx = opt.ctx;
    m->chunk = opt.chunk ? opt.chunk : KMEM_DECODE_BLOCK;
    m->max_seqs = opt.max_seqs;
    m->spec = opt.spec;
    m->block = k3_block_positions(m->chunk, opt.max_seqs, opt.spec);
    if (k3_run_init(&m->run, &m->m, m->store, m->pool, m->block, m->max_seqs, m->ctx, m->spec, m->taps, err)) return -1;
    m->have_run = 1;
    if (m->planned && m->plan.predict && k3_predict_init(&m->run, m->plan.predict_buf_bytes, m->plan.predict_stage_bytes, err))
        return -1;
    if (m->draft) {
        if (kdraft_load(m->draft, m->store, m->m.globals_extent, m->pool, m->max_seqs, m->draft_cap, opt.verify != KRUN_VERIFY_OFF, err))
            return -1;
        m->run.tap = kdraft_tap;
        m->run.tap_ctx = m->draft;
    }
    m->cost = m->planned ? plan_cost(&m->plan) : resident_cost(&m->m);
    m->session_bytes = slot_bytes(m, m->ctx, opt.state_dir != NULL, m->draft, m->draft_cap);
    if (opt.state_dir && k3_pager_open(&m->pager, c, m->ctx, m->max_seqs, opt.state_dir, opt.io == KRUN_IO_DIRECT, err)) return -1;
    m->run.pager = m->pager;
    m->slots = aligned_alloc(KARENA_ALIGN, m->max_seqs * m->session_bytes);
    if (!m->slots) {
        krun_err_set(err, KRUN_ENOMEM, "out of memory: %zu bytes for the state of %zu session(s) at --ctx %zu",
                     m->max_seqs * m->session_bytes, m->max_seqs, m->ctx);
        return -1;
    }
    for (size_t k = 0; k < m->max_seqs; k++) {
        karena a = {m->slots + k * m->session_bytes, 0};
        krun_session *s = (krun_session *)(void *)a.base;
        session_carve(s, c, m->ctx, m->pager != NULL, m->m.away, m->draft ? kdraft_config(m->draft) : NULL, m->draft_cap, &a);
        s->m = m;
        s->live = 0;
        if (m->pager) k3_pager_attach(m->pager, &s->st, k);
    }
    if (opt.cache) {
        karena a = {aligned_alloc(KARENA_ALIGN, mark_buf_bytes(c)), 0};
        if (!a.base) return krun_err_set(err, KRUN_ENOMEM, "out of memory: %zu bytes for the prefix cache's layer buffer", mark_buf_bytes(c));
        mark_buf_carve(m, c, &a);
    }
    if (m->ranks) {
        /* the forward pass's seams to the other ranks, and their word that they are ready */
        k3_state *sts[K3_MAX_SEQS];
        for (size_t k = 0; k < m->max_seqs; k++) sts[k] = &krun_model_slot(m, k)->st;
        if (krun_ranks_ready(m->ranks, &m->m, &m->run, sts, m->max_seqs, m->ctx, err)) return -1;
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
    krun_ranks_free(m->ranks);     /* its seams out of the run first */
    if (m->have_run) k3_run_free(&m->run);
    kdraft_close(m->draft);
    k3_pager_close(m->pager);      /* removes the state file */
    free(m->slots);
    free(m->mark_buf);
    kpool_destroy(m->pool);
    kstore_close(m->store);
    free(m->flex);                 /* after the store, whose lent buffers it holds */
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
const char *krun_model_cache_identity(const krun_model *m)
{
    krun_model *w = (krun_model *)m;      /* filled on first use */
    if (w->cache_identity[0]) return m->cache_identity;
    if (m->draft) snprintf(w->cache_identity, sizeof w->cache_identity, "%s-d%016llx", krun_model_identity(m),
                           (unsigned long long)kdraft_set_id(m->draft));
    else snprintf(w->cache_identity, sizeof w->cache_identity, "%s", krun_model_identity(m));
    return m->cache_identity;
}

uint64_t krun_model_state_bytes(const krun_model *m, size_t pos, int logits)
{
    krun_state_hdr h;
    krun_state_hdr_for(&h, &m->m.cfg, 0, 0);
    h.pos = h.n_tokens = pos;
    h.flags = logits ? KRUN_STATE_LOGITS : 0;
    draft_hdr(m, &h);
    return KRUN_STATE_HEADER + krun_state_payload_len(&h, NULL) + KRUN_STATE_TRAILER;
}

const char *krun_model_path(const krun_model *m) { return kpk_path(m->f); }
ktok *krun_model_tokenizer(const krun_model *m) { return m->tok; }
const kmemplan *krun_model_plan(const krun_model *m) { return m->planned ? &m->plan : NULL; }
const char *krun_model_draft(const krun_model *m) { return m->draft ? kdraft_path(m->draft) : NULL; }
const char *krun_model_state_file(const krun_model *m) { return m->pager ? k3_pager_path(m->pager) : NULL; }
void krun_model_state_io(const krun_model *m, uint64_t *read, uint64_t *written, double *wait_seconds)
{
    *read = *written = 0;
    *wait_seconds = 0;
    if (m->pager) k3_pager_counters(m->pager, read, written, wait_seconds);
}
uint64_t krun_model_auto_budget(const krun_model *m) { return m->auto_budget; }
int krun_model_threads(const krun_model *m) { return kpool_threads(m->pool); }
size_t krun_model_ctx(const krun_model *m) { return m->ctx; }
size_t krun_model_chunk(const krun_model *m) { return m->chunk; }
size_t krun_model_max_seqs(const krun_model *m) { return m->max_seqs; }
size_t krun_model_block(const krun_model *m) { return m->block; }
size_t krun_model_block_max(const krun_model *m) { return m->block_prefill > m->block ? m->block_prefill : m->block; }
int krun_model_in_prefill(const krun_model *m) { return m->phase; }

size_t krun_model_prompt_block(const krun_model *m, size_t n)
{
    kprompt k;
    if (!m->block_prefill || n <= m->block) return m->block;
    kmemplan_prompt(&m->plan, n, m->phase, &k);
    return k.prefill ? m->block_prefill : m->block;
}

void krun_model_set_layer_hook(krun_model *m, krun_layer_fn fn, void *ctx)
{
    m->run.on_layer = fn;
    m->run.on_layer_ctx = ctx;
}

/* The layout a block of T positions runs in: the prefill layout when it does
 * not fit the decoding one.  Entering it, the store gives the flex region up
 * first (its lent layers stream, its lent slots empty), then the run's
 * activations move there; leaving it, the other way round. */
static int set_phase(krun_model *m, size_t T, krun_err *err)
{
    const int want = m->block_prefill && T > m->block;
    if (want == m->phase) return 0;
    if (want) {
        if (kstore_phase(m->store, 1, err)) return -1;
        k3_run_use_block(&m->run, m->flex, m->block_prefill);
    } else {
        k3_run_use_block(&m->run, NULL, 0);
        if (kstore_phase(m->store, 0, err)) return -1;
    }
    m->phase = want;
    return 0;
}
int krun_model_trace_write(krun_model *m, const char *path) { return kstore_trace_write(m->store, path); }

size_t krun_model_stop_ids(const krun_model *m, int32_t out[3])
{
    memcpy(out, m->stop, m->n_stop * sizeof *out);
    return m->n_stop;
}

void krun_model_stats(const krun_model *m, krun_stats *st) { kstore_stats_get(m->store, st); }

size_t krun_model_members(const krun_model *m) { return kpk_member_count(m->f); }

int krun_model_member(const krun_model *m, size_t k, krun_member_info *out)
{
    const kpk_member *r;
    if (k >= kpk_member_count(m->f) || !(r = kpk_member_at(m->f, (uint16_t)k))) return -1;
    *out = (krun_member_info){kpk_member_path(m->f, (uint16_t)k), kpk_role_name(r->role),
                              r->stripe_index == KPK_NO_STRIPE ? -1 : (int)r->stripe_index, r->file_size};
    return 0;
}

const uint64_t *krun_model_routing(const krun_model *m, int L)
{
    if (!m->have_run || L < 0 || L >= m->m.cfg.n_layers || !k3_layer_is_moe(&m->m.cfg, L)) return NULL;
    return m->run.routed + (size_t)L * (size_t)m->m.cfg.n_experts;
}

int krun_simd_parse(const char *name)
{
    ksimd l;
    return kern_simd_parse(name, &l) ? -1 : (int)l;
}

const char *krun_simd_name(void) { return kern_simd_name(kern_simd_get()); }
const char *krun_model_notice(const krun_model *m) { return m->store ? kstore_notice(m->store) : NULL; }
int krun_model_file_changed(const krun_model *m, krun_err *err) { return m->store ? kstore_file_changed(m->store, err) : 0; }
const char *krun_model_warning(const krun_model *m) { return kpk_warning(m->f); }

void krun_model_memory(const krun_model *m, uint64_t *planned, uint64_t *allocated)
{
    const k3_config *c = &m->m.cfg;
    if (m->planned)
        *planned = m->plan.state_bytes + m->plan.vectors_bytes + m->plan.scratch_bytes + m->plan.flex_bytes + m->plan.draft_bytes;
    else
        *planned = (uint64_t)m->max_seqs * slot_bytes(m, m->ctx, m->pager != NULL, m->draft, m->draft_cap) +
                   (m->pager ? k3_page_window_bytes(c, m->ctx, m->max_seqs) : 0) + k3_run_bytes(c, m->block, m->max_seqs, m->ctx, m->spec, m->taps) +
                   (m->draft ? kdraft_bytes(m->draft, m->max_seqs, m->draft_cap) : 0);
    *allocated = (uint64_t)m->run.arena_bytes + (m->slots ? (uint64_t)m->max_seqs * m->session_bytes : 0) + (m->flex ? m->flex_bytes : 0) +
                 (m->pager ? k3_page_window_bytes(c, m->ctx, m->max_seqs) : 0) + (m->draft ? kdraft_held(m->draft) : 0);
}

/* ---- sessions ------------------------------------------------------------------- */

/* One session's slot: the struct, its sequential state, its history, its
 * logits and its sampler's scratch.  Returns the slot's size (a multiple of
 * the arena alignment, so slots follow each other). */
static size_t session_carve(krun_session *s, const k3_config *c, size_t ctx, int paged, const uint8_t *away, const k3_eagle_config *dc,
                            size_t dcap, karena *a)
{
    const size_t V = (size_t)c->vocab;
    krun_session tmp, *x = s ? s : &tmp;
    karena_take(a, 1, sizeof *x);          /* the struct itself (s points at it) */
    memset(x, 0, sizeof *x);
    if (paged) k3_state_carve_tables(&x->st, c, ctx, a);   /* the layers live in the pager's window */
    else k3_state_carve_away(&x->st, c, ctx, away, a);
    KTAKE(a, x->tokens, ctx);
    KTAKE(a, x->logits, V);
    KTAKE(a, x->pick.order, V);
    KTAKE(a, x->pick.prob, V);
    KTAKE(a, x->pick.work, V);
    KTAKE(a, x->pick.count, V);
    KTAKE(a, x->allowed, (V + 63) / 64);
    if (dc) kdraft_state_carve(&x->eagle, dc, dcap, a);
    return karena_round(a->used);
}

int krun_session_new(krun_model *m, krun_session **out, krun_err *err)
{
    ksampler_opts greedy;
    ksampler_opts_init(&greedy);
    *out = NULL;
    for (size_t k = 0; k < m->max_seqs; k++) {
        krun_session *s = (krun_session *)(void *)(m->slots + k * m->session_bytes);
        if (s->live) continue;
        s->live = 1;
        m->live++;
        krun_session_reset(s);
        krun_session_set_sampler(s, &greedy);
        krun_session_set_mask(s, NULL, NULL);
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
    krun_ranks_reset(s->m->ranks, &s->st);
    s->n_tokens = 0;
    s->have_logits = 0;
    s->broken = 0;
    s->reply_from = 0;
    s->all_logits = NULL;
    s->all_rows = 0;
    kspec_init(&s->drafter, s->m->spec);
    memset(&s->spec, 0, sizeof s->spec);
    if (s->m->draft) kdraft_state_reset(&s->eagle);
    kdraft_width_init(&s->wctl);
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
    ksampler_init(&s->sampler, o, &s->pick, (size_t)s->m->m.cfg.vocab);
}

const ksampler_opts *krun_session_sampler(const krun_session *s) { return &s->sampler.o; }

void krun_session_set_reply_start(krun_session *s, size_t at) { s->reply_from = at; }
size_t krun_session_reply_start(const krun_session *s) { return s->reply_from; }

int krun_session_all_logits(krun_session *s, float *buf, size_t rows)
{
    s->all_logits = buf;
    s->all_rows = buf ? rows : 0;
    return 0;
}

void krun_session_set_mask(krun_session *s, krun_mask_fn fn, void *ctx)
{
    s->mask = fn;
    s->mask_ctx = ctx;
}

/* The token at position pos (after tokens[0..pos) of the history) from the
 * logits of position pos - 1: the sampler's pick, by its contract a function
 * of those alone (sampler.h), so plain decoding and a verification block
 * choose alike. */
static int32_t pick_at(krun_session *s, const float *logits, size_t pos)
{
    const size_t V = (size_t)s->m->m.cfg.vocab;
    ksampler_seq q = {s->tokens, pos, s->reply_from, NULL};
    if (s->mask) {
        int rc = s->mask(s->mask_ctx, s->tokens, pos, s->allowed);
        if (rc < 0) return -1;
        if (rc == 0) q.allowed = s->allowed;
    }
    return ksampler_pick(&s->sampler, logits, V, &q);
}


int32_t krun_session_sample(krun_session *s)
{
    return s->have_logits ? pick_at(s, s->logits, s->st.pos) : -1;
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

/* After a block: the drafter's rows of the n positions s kept of it, its rows [row0, row0 + n)
 * (s->st.pos has moved past them). */
static void draft_commit(krun_session *s, size_t row0, size_t n)
{
    kdraft_seg seg = {&s->eagle, row0, n, s->st.pos - n};
    if (s->m->draft) kdraft_commit(s->m->draft, &s->m->run, &seg, 1);
}

int krun_session_feed(krun_session *s, const int32_t *ids, size_t n, float *all_logits, krun_err *err)
{
    krun_model *m = s->m;
    const size_t V = (size_t)m->m.cfg.vocab;
    size_t start, total;
    if (push_tokens(s, ids, n, err)) return -1;
    start = s->st.pos;
    total = s->n_tokens - start;
    while (s->st.pos < s->n_tokens) {
        const size_t left = s->n_tokens - s->st.pos, want = m->block_prefill ? krun_model_prompt_block(m, left) : m->chunk;
        size_t done = s->st.pos - start, nb = left < want ? left : want;
        k3_seg seg = {&s->st, s->tokens + s->st.pos, nb, all_logits ? all_logits + done * V : s->logits, all_logits != NULL, 0, NULL};
        if (set_phase(m, nb, err)) {
            s->broken = 1;
            s->have_logits = 0;
            return -1;
        }
        if (m->block_prefill) {
            /* the block after this one: the rest of the prompt's, or (none left) a decoding step */
            const size_t rest = left - nb, nxt = rest ? krun_model_prompt_block(m, rest) : 1;
            kstore_phase_next(m->store, (rest < nxt ? rest : nxt) > m->block);
        }
        mark_arm(s, &seg);
        if (krun_ranks_forward(m->ranks, &m->run, &seg, 1, err)) {
            mark_end(s, &seg, 0, err);
            s->broken = 1;
            s->have_logits = 0;
            return -1;
        }
        draft_commit(s, 0, nb);
        mark_end(s, &seg, 0, NULL);
        if (all_logits) memcpy(s->logits, all_logits + (done + nb - 1) * V, V * sizeof *s->logits);
        s->have_logits = 1;
        if (s->progress) s->progress(s->progress_ctx, done + nb, total);
    }
    return 0;
}

/* After a block in which s verified id (pushed) and the k drafts at
 * s->tokens[n_tokens..) (journaled, from row0 of the block): keep what the
 * sampler agrees with (speculative decoding). */
static int settle(krun_session *s, size_t k, size_t row0, int32_t *accepted, float *accepted_logits, size_t *n_accepted, krun_err *err)
{
    krun_model *m = s->m;
    const size_t V = (size_t)m->m.cfg.vocab;
    const float *L = k3_journal_logits(&m->run, &s->st);
    const int32_t *draft = s->tokens + s->n_tokens;
    size_t a = 0;
    /* row i of the block's logits follows id and the first i drafts: draft i
     * stands if the sampler picks it there, at its position, from that
     * history: by the sampler's contract (sampler.h) the very token plain
     * decoding picks, at any temperature, with any filter, penalty or mask.
     * The first pick that differs is the model's own next token, sampled
     * again by the caller from the session's logits (the same pick).  Each
     * row kept is one a plain run computes, and is checked as it would be. */
    for (;; a++) {
        if (k3_check_finite(&m->run, L + a * V, 1, s->st.pos + a, err)) {
            s->broken = 1;
            s->have_logits = 0;
            return -1;
        }
        if (a == k || pick_at(s, L + a * V, s->st.pos + a + 1) != draft[a]) break;
    }
    krun_ranks_commit(m->ranks, &m->run, &s->st, a + 1);
    draft_commit(s, row0, a + 1);
    s->n_tokens += a;
    memcpy(s->logits, L + a * V, V * sizeof *s->logits);
    s->have_logits = 1;
    if (accepted) memcpy(accepted, draft, a * sizeof *accepted);
    if (accepted_logits) memcpy(accepted_logits, L, a * V * sizeof *accepted_logits);
    s->spec.verifications++;
    s->spec.drafted += k;
    s->spec.accepted += a;
    s->spec.rollbacks += a < k;
    if (s->draft_src == 1) {
        s->spec.drafter_verifications++;
        s->spec.drafter_drafted += k;
        s->spec.drafter_accepted += a;
        kdraft_width_result(&s->wctl, k, a);
    } else if (s->draft_src == 0) {
        kspec_result(&s->drafter, k, a);
    }
    s->draft_src = 0;
    *n_accepted = a;
    return 0;
}

/* id (pushed, pending) and the k drafts at s->tokens[n_tokens..) in one
 * journaled block of their own. */
static int verify(krun_session *s, size_t k, int32_t *accepted, float *accepted_logits, size_t *n_accepted, krun_err *err)
{
    k3_seg seg = {&s->st, s->tokens + s->st.pos, k + 1, NULL, 1, 1, NULL};
    mark_arm(s, &seg);                 /* a journaled block takes no snapshot: one it passes is dropped */
    s->spec.sweeps++;
    if (set_phase(s->m, k + 1, err) || krun_ranks_forward(s->m->ranks, &s->m->run, &seg, 1, err)) {
        s->broken = 1;
        s->have_logits = 0;
        return -1;
    }
    return settle(s, k, 0, accepted, accepted_logits, n_accepted, err);
}

/* The checks before a verification, then id pushed (the pending tokens before it run first). */
static int verify_begin(krun_session *s, int32_t id, size_t *room, krun_err *err)
{
    krun_model *m = s->m;
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
    if (max_draft > room) max_draft = room;
    s->draft_src = 0;
    k = kspec_draft(&s->drafter, s->tokens, s->n_tokens, max_draft, m->stop, m->n_stop, s->tokens + s->n_tokens);
    if (!k && m->draft && max_draft) {
        /* nothing in the text: the drafter's chain after id (pushed, at position st.pos) */
        int32_t *out = s->tokens + s->n_tokens;
        if (eagle_drafts(m, &s, &id, &max_draft, 1, 1, &out, &k, err)) return -1;
    }
    if (k == 0) {
        s->spec.sweeps++;
        return krun_session_feed(s, NULL, 0, NULL, err);
    }
    return verify(s, k, accepted, accepted_logits, n_accepted, err);
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
    s->draft_src = 2;                  /* the caller's: neither drafter learns from them */
    return verify(s, k, accepted, accepted_logits, n_accepted, err);
}

void krun_session_spec_stats(const krun_session *s, krun_spec_stats *st) { *st = s->spec; }

const float *krun_session_draft_rows(const krun_session *s, size_t *start, size_t *n, size_t *width, const float **pending)
{
    const kdraft *d = s->m->draft;
    if (!d) return NULL;
    *start = s->eagle.start;
    *n = s->eagle.n;
    *width = (size_t)(kdraft_config(d)->kv_lora + kdraft_config(d)->qk_rope);
    *pending = s->eagle.has_pending ? s->eagle.pending : NULL;
    return s->eagle.cache;
}

long krun_session_propose(krun_session *s, int32_t id, size_t k, int32_t *out, float *logits, krun_err *err)
{
    krun_model *m = s->m;
    kdraft_state *st = &s->eagle;
    int rc;
    if (!m->draft || s->n_tokens != s->st.pos || !kdraft_ready(st, s->st.pos)) return 0;
    if (k > s->eagle.cap - st->n) k = s->eagle.cap - st->n;
    if (id < 0 || id >= m->m.cfg.vocab) return krun_err_set(err, KRUN_EINPUT, "token id %d is outside the vocabulary", id);
    kdraft_set_dump(m->draft, logits);
    rc = kdraft_propose(m->draft, &st, &id, &k, 1, &out, err);
    kdraft_set_dump(m->draft, NULL);
    return rc ? -1 : (long)k;
}

void krun_session_spec_restart(krun_session *s)
{
    kspec_init(&s->drafter, s->m->spec);
    kdraft_width_init(&s->wctl);
    memset(&s->spec, 0, sizeof s->spec);
}

void krun_model_journal(const krun_model *m, size_t *rows, size_t *seqs)
{
    *rows = m->run.j.cap;
    *seqs = m->run.j.cap ? m->run.j.max_segs : 0;
}

static int is_stop(const krun_model *m, int32_t id)
{
    for (size_t i = 0; i < m->n_stop; i++)
        if (m->stop[i] == id) return 1;
    return 0;
}

/* The EAGLE drafter's chains, in lockstep, for the n sessions given: session k's token ids[k]
 * (sampled, at position ss[k]->st.pos) is followed by up to max[k] drafts, as many as the width
 * controller says pay (share: the sequences of the sweep), cut before a stop id.  nd[k] = 0 for a
 * session the drafter cannot draft for (no pending row: a state that began without it). */
static int eagle_drafts(krun_model *m, krun_session *const *ss, const int32_t *ids, const size_t *max, size_t n, size_t share,
                        int32_t *const *out, size_t *nd, krun_err *err)
{
    kdraft_state *st[K3_MAX_SEQS];
    int32_t first[K3_MAX_SEQS], *dst[K3_MAX_SEQS];
    size_t kk[K3_MAX_SEQS], idx[K3_MAX_SEQS], c = 0;
    kdraft_cost cost = m->cost;
    cost.share = (double)share;
    cost.rows_else = share > 1 ? (double)(share - 1) : 0;
    for (size_t k = 0; k < n; k++) {
        krun_session *s = ss[k];
        size_t w;
        nd[k] = 0;
        if (!max[k] || !kdraft_ready(&s->eagle, s->st.pos)) continue;
        if (!(w = kdraft_width_next(&s->wctl, &cost, max[k], m->draft_width))) continue;
        st[c] = &s->eagle;
        first[c] = ids[k];
        kk[c] = w;
        dst[c] = out[k];
        idx[c++] = k;
    }
    if (!c) return 0;
    if (kdraft_propose(m->draft, st, first, kk, c, dst, err)) return -1;
    for (size_t i = 0; i < c; i++) {
        size_t k = idx[i], j = 0;
        /* a stop token is only ever the model's own pick (as the text's drafts) */
        while (j < kk[i] && !is_stop(m, dst[i][j])) j++;
        nd[k] = j;
        ss[k]->draft_src = j ? 1 : 0;
    }
    return 0;
}

/* Drafts from the text: the session's own history, else the longest continuation another
 * conversation offers (krun_session_draft). */
static size_t text_draft(krun_session *s, int32_t id, size_t max, krun_session *const *others, size_t n_others, int32_t *out)
{
    krun_model *m = s->m;
    size_t n = s->n_tokens, k, best = 0;
    s->tokens[n] = id;             /* the history as it will be once id runs (the slot is id's) */
    k = kspec_draft(&s->drafter, s->tokens, n + 1, max, m->stop, m->n_stop, out);
    if (k) return k;
    /* nothing in its own history: what another conversation (live, or an entry of the prefix
     * cache: an idle slot whose history stays) says follows */
    for (size_t i = 0; i < n_others; i++) {
        int32_t tmp[KSPEC_MAX_DRAFT];
        const krun_session *o = others[i];
        if (o == s || o->m != m || !o->n_tokens) continue;
        k = kspec_draft_from(&s->drafter, s->tokens, n + 1, o->tokens, o->n_tokens, max, m->stop, m->n_stop, tmp);
        if (k > best) { best = k; memcpy(out, tmp, k * sizeof *out); }
    }
    return best;
}

int krun_sessions_draft(krun_model *m, krun_session *const *ss, const int32_t *ids, const size_t *max, size_t n,
                        krun_session *const *others, size_t n_others, int32_t *const *out, size_t *nd, krun_err *err)
{
    krun_session *need[K3_MAX_SEQS];
    int32_t nid[K3_MAX_SEQS], *nout[K3_MAX_SEQS];
    size_t nmax[K3_MAX_SEQS], ndr[K3_MAX_SEQS], at[K3_MAX_SEQS], c = 0;
    if (n > K3_MAX_SEQS) return krun_err_set(err, KRUN_EINPUT, "%zu sessions drafting at once (at most %d)", n, K3_MAX_SEQS);
    for (size_t k = 0; k < n; k++) {
        krun_session *s = ss[k];
        size_t h = s->n_tokens, lim = max[k];
        nd[k] = 0;
        s->draft_src = 0;
        if (s->m != m || s->broken || h + 1 >= s->st.ctx || ids[k] < 0 || ids[k] >= m->m.cfg.vocab) continue;
        if (lim > m->spec) lim = m->spec;
        if (lim > s->st.ctx - h - 1) lim = s->st.ctx - h - 1;
        if (!lim) continue;
        if ((nd[k] = text_draft(s, ids[k], lim, others, n_others, out[k]))) continue;
        /* nothing in any text: the drafter's turn (every pending token run: the drafts follow ids[k]) */
        if (m->draft && h == s->st.pos) {
            need[c] = s;
            nid[c] = ids[k];
            nmax[c] = lim;
            nout[c] = out[k];
            at[c++] = k;
        }
    }
    if (c && eagle_drafts(m, need, nid, nmax, c, n, nout, ndr, err)) return -1;
    for (size_t i = 0; i < c; i++) nd[at[i]] = ndr[i];
    return 0;
}

size_t krun_session_draft(krun_session *s, int32_t id, size_t max, krun_session *const *others, size_t n_others, int32_t *out)
{
    size_t nd;
    krun_err e;
    /* a drafter that cannot read an embedding row drafts nothing; the verification reads the same file */
    return krun_sessions_draft(s->m, &s, &id, &max, 1, others, n_others, &out, &nd, &e) ? 0 : nd;
}

int krun_step_batch_verify(krun_model *m, krun_session *const *ss, const int32_t *ids, const int32_t *const *drafts,
                           const size_t *nd, size_t n, size_t *n_accepted, krun_err *err)
{
    const size_t V = (size_t)m->m.cfg.vocab;
    k3_seg segs[K3_MAX_SEQS];
    size_t rows = 0, seqs = 0, T = 0;
    int rc = 0;
    if (n == 0 || n > m->max_seqs) { krun_err_set(err, KRUN_EINPUT, "%zu sessions in one step (1..%zu)", n, m->max_seqs); return -1; }
    for (size_t k = 0; k < n; k++) {
        krun_session *s = ss[k];
        if (s->m != m || !s->live) { krun_err_set(err, KRUN_EINPUT, "session %zu is not a live session of this model", k); return -1; }
        for (size_t j = 0; j < k; j++)
            if (ss[j] == s) { krun_err_set(err, KRUN_EINPUT, "session %zu appears twice in one step", k); return -1; }
        T += s->n_tokens - s->st.pos + 1 + nd[k];
        n_accepted[k] = 0;
        if (s->all_logits && (nd[k] || s->n_tokens - s->st.pos + 1 > s->all_rows)) {
            krun_err_set(err, KRUN_EINPUT, "session %zu: every position's logits asked for %zu positions%s (the buffer holds %zu)", k,
                         s->n_tokens - s->st.pos + 1, nd[k] ? " with drafts" : "", s->all_rows);
            return -1;
        }
        if (!nd[k]) continue;
        if (s->n_tokens != s->st.pos) {
            krun_err_set(err, KRUN_EINPUT, "session %zu: drafts after pending tokens (feed them first)", k);
            return -1;
        }
        if (nd[k] > m->spec || s->n_tokens + 1 + nd[k] > s->st.ctx) {
            krun_err_set(err, KRUN_EINPUT, "session %zu: %zu drafts: at most %zu (spec) and within the context", k, nd[k], m->spec);
            return -1;
        }
        for (size_t i = 0; i < nd[k]; i++)
            if (drafts[k][i] < 0 || (size_t)drafts[k][i] >= V) {
                krun_err_set(err, KRUN_EINPUT, "session %zu, draft %zu: token id %d is outside the vocabulary (0..%zu)", k, i,
                             drafts[k][i], V - 1);
                return -1;
            }
        rows += nd[k] + 1;
        seqs++;
    }
    if (T > krun_model_block_max(m) || rows > m->run.j.cap || seqs > m->run.j.max_segs) {
        krun_err_set(err, KRUN_EINPUT, "%zu positions (pending tokens included) in one step (a block holds %zu), %zu of them "
                     "verified in %zu sequences (the journal holds %zu in %zu)", T, krun_model_block_max(m), rows, seqs, m->run.j.cap,
                     m->run.j.max_segs);
        return -1;
    }
    if (set_phase(m, T, err)) return -1;
    for (size_t k = 0; k < n; k++)
        if (push_tokens(ss[k], &ids[k], 1, err)) {
            for (size_t j = 0; j < k; j++) ss[j]->n_tokens--;   /* the step did not happen */
            return -1;
        }
    for (size_t k = 0; k < n; k++) {
        krun_session *s = ss[k];
        /* the drafts go right after the history, where they belong if accepted */
        if (nd[k]) memcpy(s->tokens + s->n_tokens, drafts[k], nd[k] * sizeof *drafts[k]);
        segs[k] = (k3_seg){&s->st, s->tokens + s->st.pos, s->n_tokens - s->st.pos + nd[k], s->all_logits ? s->all_logits : s->logits,
                           nd[k] != 0 || s->all_logits, nd[k] != 0, NULL};
        mark_arm(s, &segs[k]);              /* a verification block takes no snapshot: one it passes is dropped */
        if (nd[k]) s->spec.sweeps++;
    }
    if (krun_ranks_forward(m->ranks, &m->run, segs, n, err)) {
        for (size_t k = 0; k < n; k++) {
            mark_end(ss[k], &segs[k], 0, err);
            ss[k]->broken = 1;
            ss[k]->have_logits = 0;
            ss[k]->all_logits = NULL;
        }
        return -1;
    }
    for (size_t k = 0, row0 = 0; k < n; row0 += segs[k++].n) {
        krun_session *s = ss[k];
        if (!nd[k]) draft_commit(s, row0, segs[k].n);   /* a journaled one: once settled */
        mark_end(s, &segs[k], row0, NULL);
        if (!s->all_logits) continue;
        /* every row went to the caller's buffer: the last is the session's logits; the buffer is
         * the caller's again */
        memcpy(s->logits, s->all_logits + (segs[k].n - 1) * V, V * sizeof *s->logits);
        s->all_logits = NULL;
        s->all_rows = 0;
    }
    /* every journaled segment is settled (committed), even after another failed */
    for (size_t k = 0, row0 = 0; k < n; row0 += segs[k++].n) {
        krun_err e2;
        if (!nd[k]) { ss[k]->have_logits = 1; continue; }
        if (settle(ss[k], nd[k], row0, NULL, NULL, &n_accepted[k], rc ? &e2 : err)) rc = -1;
    }
    return rc;
}

int krun_step_batch(krun_model *m, krun_session *const *ss, const int32_t *ids, size_t n, krun_err *err)
{
    static const size_t none[K3_MAX_SEQS];       /* no drafts: a plain step */
    const int32_t *const nodraft[K3_MAX_SEQS] = {NULL};
    size_t acc[K3_MAX_SEQS];
    return krun_step_batch_verify(m, ss, ids, nodraft, none, n, acc, err);
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
    ksampler_opts so;          /* the sampler: options (its seed and stream key the draw) */
    size_t reply_from;         /* where the reply begins (the penalties) */
    kspec drafter;
    kdraft_state eagle;        /* the EAGLE drafter's rows, when the model has one */
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
    size_t *reply_from;
    kspec *drafter;
    kdraft_state *eagle;       /* the EAGLE drafter's state, when the model has one */
    const k3_eagle_config *dc;
} sess_view;

static sess_view view_of_session(krun_session *s)
{
    const kdraft *d = s->m->draft;
    return (sess_view){&s->st, s->tokens, &s->n_tokens, s->logits, &s->have_logits, NULL, &s->reply_from, &s->drafter,
                       d ? &s->eagle : NULL, d ? kdraft_config(d) : NULL};
}

static sess_view view_of_snapshot(krun_snapshot *x)
{
    const kdraft *d = x->m->draft;
    return (sess_view){&x->st, x->tokens, &x->n_tokens, x->logits, &x->have_logits, &x->so, &x->reply_from, &x->drafter,
                       d ? &x->eagle : NULL, d ? kdraft_config(d) : NULL};
}

/* dst := src, everything a continuation depends on (the caller checked room). */
static void view_copy(krun_ranks *ranks, const sess_view *dst, const sess_view *src, size_t V)
{
    if (dst->eagle && src->eagle) kdraft_state_copy(dst->eagle, src->eagle, src->dc);
    krun_ranks_copy(ranks, dst->st, src->st);
    memcpy(dst->tokens, src->tokens, *src->n_tokens * sizeof *dst->tokens);
    *dst->n_tokens = *src->n_tokens;
    if (*src->have_logits) memcpy(dst->logits, src->logits, V * sizeof *dst->logits);
    *dst->have_logits = *src->have_logits;
    if (dst->so && src->so) *dst->so = *src->so;
    *dst->reply_from = *src->reply_from;
    *dst->drafter = *src->drafter;
}

/* A session becomes src: its sampler takes src's options (so) first. */
static void copy_into_session(krun_session *dst, const sess_view *src, const ksampler_opts *so)
{
    sess_view d = view_of_session(dst);
    krun_session_reset(dst);
    ksampler_init(&dst->sampler, so, &dst->pick, (size_t)dst->m->m.cfg.vocab);
    view_copy(dst->m->ranks, &d, src, (size_t)dst->m->m.cfg.vocab);
}

/* A paged state is on disk between blocks: copies, snapshots and saved states of it are refused. */
static int paged_refused(const krun_session *s, const char *what, krun_err *err)
{
    if (!s->st.pager) return 0;
    return krun_err_set(err, KRUN_EINPUT, "%s: the session's state is paged to disk (--state-dir), which does not support it in this "
                        "version", what);
}

static int copy_check(const krun_session *src, const krun_model *m, size_t room, const char *what, krun_err *err)
{
    if (paged_refused(src, "copying a session", err)) return -1;
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
    if (paged_refused(dst, "copying a session", err)) return -1;
    if (copy_check(src, dst->m, dst->st.ctx, "the target session's context", err)) return -1;
    copy_into_session(dst, &v, &src->sampler.o);
    return 0;
}

static size_t snapshot_carve(krun_snapshot *x, const k3_model *m, const k3_eagle_config *dc, size_t cap, karena *a)
{
    const k3_config *c = &m->cfg;
    krun_snapshot tmp, *s = x ? x : &tmp;
    karena_take(a, 1, sizeof *s);
    memset(s, 0, sizeof *s);
    k3_state_carve_away(&s->st, c, cap, m->away, a);
    KTAKE(a, s->tokens, cap);
    KTAKE(a, s->logits, (size_t)c->vocab);
    if (dc) kdraft_state_carve(&s->eagle, dc, cap, a);
    return karena_round(a->used);
}

size_t krun_snapshot_bytes(const krun_model *m, size_t cap)
{
    karena a = {NULL, 0};
    return snapshot_carve(NULL, &m->m, m->draft ? kdraft_config(m->draft) : NULL, cap, &a);
}

int krun_snapshot_new(krun_model *m, size_t cap, krun_snapshot **out, krun_err *err)
{
    size_t n = krun_snapshot_bytes(m, cap);
    karena a = {aligned_alloc(KARENA_ALIGN, n), 0};
    *out = NULL;
    if (!a.base) return krun_err_set(err, KRUN_ENOMEM, "out of memory: %zu bytes for a snapshot of %zu positions", n, cap);
    snapshot_carve((krun_snapshot *)(void *)a.base, &m->m, m->draft ? kdraft_config(m->draft) : NULL, cap, &a);
    *out = (krun_snapshot *)(void *)a.base;
    (*out)->m = m;
    (*out)->cap = cap;
    /* its layers on other ranks get a place there too */
    if (krun_ranks_state_new(m->ranks, &(*out)->st, cap, err)) {
        free(*out);
        *out = NULL;
        return -1;
    }
    return 0;
}

void krun_snapshot_free(krun_snapshot *snap)
{
    if (snap) krun_ranks_state_free(snap->m->ranks, &snap->st);
    free(snap);
}

int krun_snapshot_take(krun_snapshot *snap, const krun_session *s, krun_err *err)
{
    sess_view d = view_of_snapshot(snap), v = view_of_session((krun_session *)s);   /* s: read only */
    if (copy_check(s, snap->m, snap->cap, "the snapshot", err)) return -1;
    snap->so = s->sampler.o;
    view_copy(snap->m->ranks, &d, &v, (size_t)snap->m->m.cfg.vocab);
    snap->taken = 1;
    return 0;
}

int krun_snapshot_restore(krun_session *s, const krun_snapshot *snap, krun_err *err)
{
    sess_view v = view_of_snapshot((krun_snapshot *)snap);   /* read only */
    if (s->m != snap->m || !s->live) return krun_err_set(err, KRUN_EINPUT, "restoring a snapshot: not a live session of its model");
    if (!snap->taken) return krun_err_set(err, KRUN_EINPUT, "restoring a snapshot: nothing was taken into it");
    if (paged_refused(s, "restoring a snapshot", err)) return -1;
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
    if (paged_refused(s, path, err)) return -1;
    if (s->broken) { krun_err_set(err, KRUN_EINPUT, "%s: the session's last feed failed; nothing consistent to save", path); return -1; }
    krun_state_hdr_for(h, &m->m.cfg, kpk_super(m->f)->set_id, config_hash(m));
    h->pos = s->st.pos;
    h->n_tokens = s->n_tokens;
    h->flags = s->have_logits ? KRUN_STATE_LOGITS : 0;
    h->seed = s->sampler.o.seed;
    h->stream = s->sampler.o.stream;
    h->reply_from = s->reply_from;
    draft_hdr(m, h);
    return 0;
}

/* With a drafter, a state carries its section (STATE.md 1.2), named by the drafter file's identity. */
static void draft_hdr(const krun_model *m, krun_state_hdr *h)
{
    const k3_eagle_config *dc;
    if (!m->draft) return;
    dc = kdraft_config(m->draft);
    h->minor = 2;
    h->flags |= KRUN_STATE_DRAFTER;
    h->draft_width = (uint32_t)(dc->kv_lora + dc->qk_rope);
    h->draft_hidden = (uint32_t)dc->hidden;
    h->draft_set_id = kdraft_set_id(m->draft);
    h->draft_config_xxh3 = kdraft_config_xxh3(m->draft);
}

/* The session's drafter section to write, or to read into (NULL: none, or another drafter's). */
static krun_state_draft *draft_section(const krun_session *s, const krun_state_hdr *h, krun_state_draft *d)
{
    krun_state_hdr mine;
    if (!s->m->draft) return NULL;
    memset(&mine, 0, sizeof mine);
    draft_hdr(s->m, &mine);
    if (h && (!(h->flags & KRUN_STATE_DRAFTER) || h->draft_set_id != mine.draft_set_id || h->draft_config_xxh3 != mine.draft_config_xxh3 ||
              h->draft_width != mine.draft_width || h->draft_hidden != mine.draft_hidden))
        return NULL;
    *d = (krun_state_draft){s->eagle.cache, s->eagle.pending, s->eagle.cap, s->eagle.start, s->eagle.has_pending};
    return d;
}

/* What a load read of the drafter (d, or none: its context starts at the state's position). */
static void draft_adopt(krun_session *s, const krun_state_draft *d, size_t pos)
{
    if (!s->m->draft) return;
    s->eagle.start = d ? (size_t)d->start : pos;
    s->eagle.has_pending = d && d->has_pending;
    s->eagle.n = s->eagle.has_pending ? pos - 1 : s->eagle.start;
}

int krun_session_save(const krun_session *s, const char *path, krun_err *err)
{
    krun_state_hdr h;
    krun_state_far far;
    const krun_state_far *use;
    krun_state_draft d;
    int rc;
    if (session_hdr(s, path, &h, err) || krun_ranks_far_begin(s->m->ranks, &s->m->m.cfg, s->st.ctx, &far, &use, err)) return -1;
    rc = krun_state_write_far(path, &h, &s->m->m.cfg, s->tokens, &s->st, s->logits, draft_section(s, NULL, &d), use, err);   /* other ranks' layers: far */
    krun_ranks_far_end(s->m->ranks, &far);
    return rc;
}

int krun_session_save_at(const krun_session *s, int dirfd, const char *name, krun_err *err)
{
    ksave w;
    if (ksave_begin_at(&w, dirfd, name, err)) return -1;
    if (krun_session_save_to(s, &w, err)) { ksave_abort(&w); return -1; }
    return ksave_commit(&w, err);
}

int krun_session_save_to(const krun_session *s, ksave *out, krun_err *err)
{
    krun_state_hdr h;
    krun_state_far far;
    const krun_state_far *use;
    krun_state_draft d;
    int rc;
    if (session_hdr(s, out->path, &h, err) || krun_ranks_far_begin(s->m->ranks, &s->m->m.cfg, s->st.ctx, &far, &use, err)) return -1;
    rc = krun_state_write_to_far(out, &h, &s->m->m.cfg, s->tokens, &s->st, s->logits, draft_section(s, NULL, &d), use, err);
    krun_ranks_far_end(s->m->ranks, &far);
    return rc;
}

/* The largest state file this model can have at the session's context. */
static uint64_t state_most(const krun_session *s)
{
    const krun_model *m = s->m;
    krun_state_hdr want;
    krun_state_hdr_for(&want, &m->m.cfg, kpk_super(m->f)->set_id, config_hash(m));
    want.pos = want.n_tokens = s->st.ctx;
    want.flags = KRUN_STATE_LOGITS;
    /* and a drafter section (STATE.md 1.2), its rows as wide as a latent row of the model, or its own drafter's */
    want.minor = 2;
    want.flags |= KRUN_STATE_DRAFTER;
    want.draft_width = (uint32_t)k3_mla_row(&m->m.cfg);
    want.draft_hidden = (uint32_t)m->m.cfg.hidden;
    if (m->draft) {
        const k3_eagle_config *dc = kdraft_config(m->draft);
        if ((uint32_t)(dc->kv_lora + dc->qk_rope) > want.draft_width) want.draft_width = (uint32_t)(dc->kv_lora + dc->qk_rope);
    }
    return KRUN_STATE_HEADER + krun_state_payload_len(&want, NULL) + KRUN_STATE_TRAILER;
}

/* A parsed header against the open model and the session's context: -1 with
 * err (naming name) if the state is not one this session can hold. */
static int state_fits(const krun_session *s, const krun_state_hdr *h, const uint8_t *types, const char *name, krun_err *err)
{
    const krun_model *m = s->m;
    const k3_config *c = &m->m.cfg;
    krun_state_hdr want;
    krun_state_hdr_for(&want, c, kpk_super(m->f)->set_id, config_hash(m));
    if (h->set_id != want.set_id || h->config_xxh3 != want.config_xxh3)
        return krun_err_set(err, KRUN_EINPUT, "%s was saved with another model file (set_id %016llx, config %016llx; %s has %016llx, %016llx)",
                            name, (unsigned long long)h->set_id, (unsigned long long)h->config_xxh3, kpk_path(m->f),
                            (unsigned long long)want.set_id, (unsigned long long)want.config_xxh3);
    if (h->n_layers != want.n_layers || h->hidden != want.hidden || h->vocab != want.vocab || h->kda_heads != want.kda_heads ||
        h->kda_head_dim != want.kda_head_dim || h->conv_width != want.conv_width || h->kv_lora != want.kv_lora ||
        h->qk_rope != want.qk_rope || h->n_mla != want.n_mla)
        return krun_err_set(err, KRUN_EINPUT, "%s: its geometry differs from this model's", name);
    for (int L = 0; L < c->n_layers; L++)
        if (types[L] != (c->layer_is_mla[L] ? 1 : 0))
            return krun_err_set(err, KRUN_EINPUT, "%s: its layer map differs from this model's (layer %d)", name, L);
    if (h->n_tokens > s->st.ctx)
        return krun_err_set(err, KRUN_EINPUT, "%s holds %llu tokens (%llu run, %llu pending): more than --ctx %zu; give --ctx %llu or more",
                            name, (unsigned long long)h->n_tokens, (unsigned long long)h->pos,
                            (unsigned long long)(h->n_tokens - h->pos), s->st.ctx, (unsigned long long)h->n_tokens);
    return 0;
}

/* The header's sampler and history into the session, once its state is in place. */
static void state_adopt(krun_session *s, const krun_state_hdr *h)
{
    s->n_tokens = (size_t)h->n_tokens;
    s->have_logits = (h->flags & KRUN_STATE_LOGITS) != 0;
    s->sampler.o.seed = h->seed;
    s->sampler.o.stream = h->stream;
    s->reply_from = (size_t)h->reply_from;
}

int krun_session_load(krun_session *s, const char *path, krun_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC), rc;
    if (fd < 0) return krun_err_set(err, KRUN_EINPUT, "cannot read %s: %s", path, strerror(errno));
    rc = krun_session_load_fd(s, fd, path, err);
    close(fd);
    return rc;
}

int krun_session_load_fd(krun_session *s, int fd, const char *name, krun_err *err)
{
    krun_state_reader r;
    const uint64_t most = state_most(s);
    const int64_t size = kio_file_size(fd);
    int rc;
    if (paged_refused(s, name, err)) return -1;
    /* refuse anything larger than the largest state before reading it */
    if (size < 0) return krun_err_set(err, KRUN_EINPUT, "cannot read %s: %s", name, strerror(errno));
    if ((uint64_t)size > most)
        return krun_err_set(err, KRUN_EINPUT, "%s: %lld bytes, more than any state of this model at --ctx %zu (%llu): another model, "
                            "a larger context (give --ctx), or not a state file", name, (long long)size, s->st.ctx,
                            (unsigned long long)most);
    /* straight into the session's own buffers, which the plan counts: a copy of the
     * file would be a state's size (465 MB at full scale) above the budget */
    if (krun_state_read_begin(&r, fd, name, err) || state_fits(s, &r.h, r.types, name, err)) {
        krun_state_read_end(&r);
        return -1;
    }
    krun_session_reset(s);
    {
        krun_state_far far;
        const krun_state_far *use;
        krun_state_draft dd, *d = draft_section(s, &r.h, &dd);
        rc = krun_ranks_far_begin(s->m->ranks, &s->m->m.cfg, s->st.ctx, &far, &use, err);
        if (!rc) rc = krun_state_read_payload_far(&r, &s->m->m.cfg, s->tokens, &s->st, s->logits, d, use, err);   /* other ranks' layers: far */
        krun_ranks_far_end(s->m->ranks, &far);
        if (!rc) draft_adopt(s, d, (size_t)r.h.pos);
    }
    krun_state_read_end(&r);
    /* the state now lives in the session: a second copy in the page cache is memory
     * the plan does not count (as krun's other reads, RUNTIME.md §4) */
    kos_cache_drop(fd, 0, (uint64_t)size);
    if (rc) {
        krun_session_reset(s);         /* what was read is not a checked state: never used */
        return -1;
    }
    state_adopt(s, &r.h);
    return 0;
}

int krun_session_load_mem(krun_session *s, const void *buf, size_t len, const char *name, krun_err *err)
{
    const uint8_t *b = buf;
    krun_state_hdr h;
    if (paged_refused(s, name, err)) return -1;
    if (krun_state_parse(buf, len, &h, err)) return krun_err_prefix(err, "%s: ", name);
    if (state_fits(s, &h, b + h.layer_types_at, name, err)) return -1;
    krun_session_reset(s);
    {
        krun_state_far far;
        const krun_state_far *use;
        krun_state_draft dd, *d = draft_section(s, &h, &dd);
        int rc = krun_ranks_far_begin(s->m->ranks, &s->m->m.cfg, s->st.ctx, &far, &use, err);
        if (!rc) rc = krun_state_restore_far(buf, &h, &s->m->m.cfg, s->tokens, &s->st, s->logits, d, use, err);
        krun_ranks_far_end(s->m->ranks, &far);
        if (rc) { krun_session_reset(s); return -1; }
        draft_adopt(s, d, (size_t)h.pos);
    }
    state_adopt(s, &h);
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
    krun_session_set_mask(s, NULL, NULL);
    s->mark_at = 0;
    memset(&s->spec, 0, sizeof s->spec);
    kdraft_width_init(&s->wctl);
    return 0;
}

void krun_session_drop_pending(krun_session *s) { s->n_tokens = s->st.pos; }

static int mark_check(krun_session *s, size_t at, krun_err *err)
{
    if (paged_refused(s, "a snapshot", err)) return -1;
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
    return krun_session_mark_save_at(s, at, AT_FDCWD, path, err);
}

int krun_session_mark_save_at(krun_session *s, size_t at, int dirfd, const char *path, krun_err *err)
{
    krun_model *m = s->m;
    if (mark_check(s, at, err)) return -1;
    if (!m->mark_buf) return krun_err_set(err, KRUN_EINPUT, "snapshots to a file need a model prepared for them (krun_model_opts.cache)");
    if (krun_ranks_staged(m->ranks))
        return krun_err_set(err, KRUN_EINPUT, "snapshots to a file inside a block: not with trunk layers on other ranks in this version");
    if (m->mark_owner) return krun_err_set(err, KRUN_EINPUT, "another session's snapshot to a file is due (one at a time)");
    if (!(s->mark_path = strdup(path))) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
    s->mark_dirfd = dirfd;
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
        draft_hdr(m, &h);
        if (ksave_begin_at(&m->mark_save, s->mark_dirfd, s->mark_path, &e)) { mark_drop(s, e.msg); return; }
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
/* The drafter's state at the snapshot's position q + 1: its rows before q, and row q pending
 * (its g fused again from the block's taps: row `row` of the block). */
static void mark_draft(krun_session *s, krun_session *d, size_t q, size_t row)
{
    krun_model *m = s->m;
    const kdraft_state *se = &s->eagle;
    kdraft_state *de = &d->eagle;
    kdraft_state_copy(de, se, kdraft_config(m->draft));
    /* rows [start, q): committed by now (q is in the block, before or at its last row) */
    if (de->start > q) de->start = q;
    de->n = q;
    kdraft_fuse_row(m->draft, &m->run, row, de->pending);
    de->has_pending = 1;
}

static void mark_end(krun_session *s, const k3_seg *seg, size_t row0, const krun_err *failed)
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
            if (c->layer_is_mla[L] && s->st.mla_cache[L])   /* (another rank's layers: copied there, run/cluster) */
                memcpy(d->st.mla_cache[L], s->st.mla_cache[L], s->mark_at * k3_mla_row(c) * sizeof(float));
        memcpy(d->tokens, s->tokens, s->mark_at * sizeof *d->tokens);
        d->n_tokens = d->st.pos = s->mark_at;
        d->have_logits = logits != NULL;
        if (logits) memcpy(d->logits, logits, V * sizeof *d->logits);
        d->broken = 0;
        d->reply_from = 0;             /* as in a file's header: the one who claims it says where its reply begins */
        kspec_init(&d->drafter, m->spec);
        if (m->draft) mark_draft(s, d, s->mark_at - 1, row0 + at - 1);
    } else {
        krun_state_draft dd, *dp = NULL;
        if (m->draft) {
            /* the drafter's rows before the position, and its row fused again from the block's taps */
            float *g = kdraft_spare_row(m->draft);
            kdraft_fuse_row(m->draft, &m->run, row0 + at - 1, g);
            dd = (krun_state_draft){s->eagle.cache, g, s->eagle.cap, s->eagle.start < s->mark_at - 1 ? s->eagle.start : s->mark_at - 1, 1};
            dp = &dd;
        }
        krun_state_write_end(&m->mark_w, logits, dp);
        if (ksave_commit(&m->mark_save, &e)) { s->snap.at = 0; mark_drop(s, e.msg); return; }
    }
    s->mark_status = KRUN_MARK_TAKEN;
    mark_clear(s);
}

/* ---- several machines (ranks.h) --------------------------------------------------- */

static void cluster_exit(int status, void *arg)
{
    (void)arg;
    kcl_node_leave(status);
}

int krun_cluster_start(int *argc, char ***argv, krun_err *err)
{
    if (!kcl_launched()) return 0;
    if (kcl_start(argc, argv, err)) return -1;
    on_exit(cluster_exit, NULL);      /* (glibc's: the handler gets the exit status, kcl_finish may need it) */
    return kcl_rank();
}

int krun_cluster_rank(void) { return kcl_rank(); }
void krun_cluster_linger(void) { kcl_linger(); }
int krun_cluster_size(void) { return kcl_size(); }

int krun_cluster_follow(const krun_model_opts *own, krun_err *err)
{
    krun_follower fw;
    krun_model *m = NULL;
    krun_err e = {0, {0}};
    int rc = krun_ranks_await(&fw, own, err);
    if (rc) return rc < 0 ? -1 : 0;
    if (model_load(fw.path, 1, &m, &e)) {
        fw.code = e.code;
        snprintf(fw.msg, sizeof fw.msg, "%s", e.msg);
    }
    rc = krun_ranks_report(&fw, m ? m->f : NULL, m ? &m->m.cfg : NULL, err);
    if (rc == 0 && !fw.code) {
        /* this rank's part: the layers others compute are away, and so are the globals (rank 0's) */
        uint8_t away[K3_MAX_LAYERS];
        for (int L = 0; L < m->m.cfg.n_layers; L++) away[L] = fw.owner[L] != kcl_rank();
        if (k3_model_set_away(&m->m, away, 1, &e) || krun_model_prepare(m, &fw.o, &e)) {
            fw.code = e.code;
            snprintf(fw.msg, sizeof fw.msg, "%s", e.msg);
        }
        if (!fw.code) {
            kcl_node *node = NULL;
            k3_state *sts[K3_MAX_SEQS];
            for (size_t k = 0; k < m->max_seqs; k++) sts[k] = &krun_model_slot(m, k)->st;
            if (kcl_node_new(&m->m, &m->run, fw.have, fw.owner, sts, m->max_seqs, m->ctx, &node, &e)) {
                fw.code = e.code;
                snprintf(fw.msg, sizeof fw.msg, "%s", e.msg);
            }
            if (krun_ranks_say_ready(&fw, m->planned ? &m->plan : NULL, err)) rc = -1;
            else if (!fw.code) {
                kcl_node_attach(node);
                rc = kcl_node_follow(node, err);
            }
            kcl_node_free(node);
        } else if (krun_ranks_say_ready(&fw, NULL, err)) {
            rc = -1;
        }
    }
    /* a failure here was told to rank 0, which says it and stops us */
    if (rc == 0 && fw.code) krun_ranks_await_stop();
    krun_follower_free(&fw);
    krun_model_close(m);
    return rc < 0 ? -1 : 0;
}

int krun_model_ranks(krun_model *m, krun_rank_info *out, int max, krun_err *err)
{
    kcl_rank_stats *all;
    int n = kcl_size();
    if (!m->ranks) return 0;
    if (!(all = calloc((size_t)n, sizeof *all))) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
    if (kcl_node_stats(krun_ranks_node(m->ranks), all, err)) { free(all); return -1; }
    if (n > max) n = max;
    for (int r = 0; r < n; r++) {
        snprintf(out[r].who, sizeof out[r].who, "%s", kcl_who(r));
        out[r].layers = all[r].layers;
        out[r].st = all[r].st;
        out[r].experts_served = all[r].experts_served;
        out[r].experts_predicted = all[r].experts_predicted;
        out[r].bytes_sent = all[r].bytes_sent;
        out[r].bytes_received = all[r].bytes_received;
    }
    free(all);
    return n;
}

int krun_model_cluster_plan(krun_model *m, const krun_model_opts *o, int hypothetical, double disk_mbps, double net_mbps,
                            krun_cluster_plan *out, krun_err *err)
{
    krun_model_opts q = *o;
    krun_layout lay;
    int rc;
    if (!hypothetical && !kcl_active()) hypothetical = 1;
    if (krun_ranks_layout(m, m->f, &m->m, &q, hypothetical, &lay, err)) return -1;
    rc = krun_ranks_cost(m, &m->m, &q, &lay, hypothetical != 0, disk_mbps, net_mbps, out, err);
    k3_model_set_away(&m->m, NULL, 0, err);
    return rc;
}

int krun_model_cluster_lost(const krun_model *m, krun_err *why)
{
    return m->ranks && krun_ranks_node(m->ranks) ? kcl_node_lost(krun_ranks_node(m->ranks), why) : 0;
}
