/* krun serve's engine: one thread owns the model and runs one forward sweep
 * after another over every live sequence (serve.h; docs/SERVE.md).
 *
 * A sweep is one krun_step_batch block: every decoding sequence advances by
 * the token it sampled last, and the rest of the block goes to the prompts
 * still being read, in the order they were admitted; a prompt runs in as many
 * sweeps as it needs.  The block is the decoding one, or -- when the prompt
 * positions waiting are many and the cost model says so
 * (krun_model_prompt_block) -- the prefill layout's large block, which the
 * decoding sequences ride along in.  Between sweeps the
 * engine takes the lock, hands out what each request produced, frees the
 * sequences of finished or abandoned requests and admits queued ones.
 *
 * Speculation (docs/SERVE.md): a decoding sequence whose request allows it
 * (srv_engine_opts.spec, the request's "speculative") may follow its token
 * with drafts, from its own history or another live sequence's
 * (krun_session_draft); its verification positions join the sweep like
 * prompt positions (krun_step_batch_verify), after the decoders' tokens and
 * before the prompts, in admission order, while the journal has rows
 * (spec + 1 positions, rows / 2 sequences, shared by the sweep).  A draft
 * stands only where the sequence's own sampler picks it, so the output is
 * the same with or without.
 *
 * Each sequence has its own state, history and sampler, and a position's
 * result does not depend on what else is in its block (docs/NUMERICS.md §5),
 * so a request's output is bit-identical alone or batched. */
#include "serve.h"

#include "format/kprogress.h"
#include "run/session/memplan.h"
#include "run/grammar/kgram.h"
#include "run/grammar/tokmask.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

struct srv_engine {
    krun_model *m;
    krun_pcache *cache;        /* NULL: sessions straight from the model */
    char model_name[256];
    size_t max_seqs, max_queue, block, ctx, vocab;
    size_t spec, jrows, jseqs;  /* drafts per verification at most; the journal's rows and sequences per sweep */
    int32_t *drafts;            /* [max_seqs][spec]: the sweep's drafts (the engine thread's) */
    float *echo_logits;         /* [SRV_ECHO_ROWS][vocab]: an echo request's prompt logits, made on first use
                                   (counted by the plan: srv_echo_bytes) */
    double progress_every;     /* seconds of silence before a progress comment (0: none) */
    int n_layers;
    _Atomic int sweep_layer;   /* layers of the running sweep done (the model's layer hook) */
    pthread_mutex_t mu;
    pthread_cond_t wake;       /* the engine waits for work */
    pthread_cond_t idle;       /* drain waits for the engine to run dry */
    pthread_t thread;
    int have_thread;
    /* under mu */
    sreq *qhead, *qtail;       /* waiting for a sequence */
    size_t n_queued;
    sreq **active;             /* [max_seqs], in the order they were admitted */
    size_t n_active;
    size_t n_open;             /* requests submitted and not yet freed: their output may still be on its way */
    int draining, cancel_all, quit, damaged, quiet;   /* damaged 2: the cluster was lost (lost_locked) */
    size_t sweep_T;            /* positions of the running sweep (0: none) */
    int sweep_prefill;         /* ... in the prefill layout */
    int held;                  /* srv_engine_opts.held, until srv_engine_release: no sweep starts */
    const char *command;       /* srv_engine_opts.command */
    int ctx_lenient;           /* srv_engine_opts.ctx_lenient */
    int default_effort, default_effort_set;   /* srv_engine_opts' */
    char damage[900];
    struct {
        uint64_t requests, completed, failed, cancelled, prompt_tokens, cached_tokens, generated, sweeps, positions, bytes_read, phase_switches;
        uint64_t verifications, drafted, accepted;   /* speculation: blocks with drafts, drafts, drafts kept */
        uint64_t dr_verifications, dr_drafted, dr_accepted;   /* of them, the EAGLE drafter's (--draft) */
        uint64_t copied_tokens;    /* n > 1: prompt positions copied from choice 0's state instead of run */
        double sweep_seconds, request_seconds;
        double prefill_seconds;    /* of sweep_seconds: sweeps that ran prompt positions */
        /* of sweeps, bytes_read and generated: those of the sweeps that ran prompt positions (the rest
         * only decoded: what a generated token costs is theirs alone) */
        uint64_t prefill_sweeps, prefill_bytes_read, prefill_generated;
    } st;
    double t0;
    uint64_t seeds;            /* seeds handed to requests without one */
    /* constrained decoding's token index, built on first use under mask_mu */
    pthread_mutex_t mask_mu;
    kmask_index *mask_index;
    /* /metrics: responses by endpoint and status class (1xx..5xx), under mu */
    uint64_t responses[SRV_N_EP][6];
};

/* ---- requests ------------------------------------------------------------------------------- */

sreq *sreq_new(void)
{
    sreq *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    if (pthread_cond_init(&r->cv, NULL)) { free(r); return NULL; }
    r->refs = 1;
    r->client_fd = -1;
    return r;
}

static void release_locked(srv_engine *e, sreq *r)
{
    if (--r->refs > 0) return;
    if (r->state != SREQ_NEW) e->n_open--;
    if (r->leader_ref) release_locked(e, r->leader);
    sgen_free(r->gen);
    kmask_free(r->mask);
    kgram_free(r->gram);
    free(r->prompt);
    kbuf_free(&r->out);
    pthread_cond_destroy(&r->cv);
    free(r);
}

void srv_retain(srv_engine *e, sreq *r)
{
    pthread_mutex_lock(&e->mu);
    r->refs++;
    pthread_mutex_unlock(&e->mu);
}

void srv_release(srv_engine *e, sreq *r)
{
    if (!r) return;
    pthread_mutex_lock(&e->mu);
    release_locked(e, r);
    pthread_mutex_unlock(&e->mu);
}

/* What the request produced so far, to its connection. */
static void publish_locked(sreq *r)
{
    sgen_take(r->gen, &r->out);
    if (!r->started && (sgen_started(r->gen) || sgen_done(r->gen))) {
        r->started = 1;
        r->status = sgen_status(r->gen);
    }
    pthread_cond_broadcast(&r->cv);
    if (r->leader_ref) pthread_cond_broadcast(&r->leader->cv);   /* n > 1 streamed: the stream waits on choice 0 */
}

/* The request is over: its output is complete, its sequence is free. */
static void finish_locked(srv_engine *e, sreq *r)
{
    if (r->s) {
        if (e->cache) krun_pcache_end(e->cache, r->s);   /* its state stays as an entry */
        else krun_session_free(r->s);
        r->s = NULL;
    }
    if (r->gen) publish_locked(r);
    r->started = 1;
    r->state = SREQ_DONE;
    pthread_cond_broadcast(&r->cv);
    if (r->leader_ref) pthread_cond_broadcast(&r->leader->cv);
    release_locked(e, r);         /* the engine's reference */
}

/* One line per request on stderr: how it ended. */
static void log_end(const srv_engine *e, const sreq *r, const char *how, const char *detail)
{
    if (e->quiet) return;
    char spec[96] = "";
    if (r->drafted)
        snprintf(spec, sizeof spec, ", speculation %llu of %llu drafts accepted in %llu verifications",
                 (unsigned long long)r->accepted, (unsigned long long)r->drafted, (unsigned long long)r->verifications);
    fprintf(stderr, "krun serve: %s: %zu prompt (%zu cached) + %zu generated tokens%s, %s%s%s, %.2f s\n", r->id, r->n_prompt,
            r->cached, r->gen ? sgen_n_tokens(r->gen) : 0, spec, how, detail ? ": " : "", detail ? detail : "", know() - r->t_submit);
}

static void fail_locked(srv_engine *e, sreq *r, const oai_error *err)
{
    char how[32];
    if (r->early_stream) sgen_stream_opened(r->gen);    /* the 200 is sent: the error goes in the stream */
    snprintf(how, sizeof how, "failed with %d", err->status);
    log_end(e, r, how, err->message);
    sgen_fail(r->gen, err);
    e->st.failed++;
    finish_locked(e, r);
}

static void remove_active(srv_engine *e, size_t k)
{
    memmove(e->active + k, e->active + k + 1, (e->n_active - k - 1) * sizeof *e->active);
    e->n_active--;
}

/* ---- the engine thread ---------------------------------------------------------------------- */

/* Requests whose client went away, or every request when the server stops. */
static void drop_cancelled_locked(srv_engine *e)
{
    oai_error stopping;
    oai_error_set(&stopping, 503, NULL, "server_shutting_down", "the server is shutting down; the request was not completed");
    for (size_t k = e->n_active; k-- > 0;) {
        sreq *r = e->active[k];
        if (!r->cancelled && !e->cancel_all) continue;
        remove_active(e, k);
        if (r->cancelled) { e->st.cancelled++; log_end(e, r, "cancelled", "the client went away"); finish_locked(e, r); }
        else fail_locked(e, r, &stopping);
    }
    while (e->qhead && e->cancel_all) {
        sreq *r = e->qhead;
        e->qhead = r->next_in_queue;
        e->n_queued--;
        fail_locked(e, r, &stopping);
    }
    if (!e->qhead) e->qtail = NULL;
}

/* Constrained decoding (krun_mask_fn): the grammar's state is that of the reply tokens before
 * pos, tokens[n_prompt..pos).  The session asks for consecutive positions; should it ever name an
 * earlier one (a speculative verification after a rejected draft), the state is rebuilt from the
 * start, so the mask depends on the tokens only. */
static int reply_mask(void *ctx, const int32_t *tokens, size_t pos, uint64_t *allowed)
{
    sreq *r = ctx;
    size_t at;
    if (pos < r->n_prompt) return 1;
    at = pos - r->n_prompt;
    if (at < r->mask_at) {
        kmask *fresh = kmask_new(r->mask_index, r->gram);
        if (!fresh) return -1;
        kmask_free(r->mask);
        r->mask = fresh;
        r->mask_at = 0;
    }
    for (; r->mask_at < at; r->mask_at++)
        if (kmask_take(r->mask, tokens[r->n_prompt + r->mask_at])) return -1;
    return kmask_allowed(r->mask, allowed) > 0 ? 0 : -1;
}

static int next_token(srv_engine *e, sreq *r);
static void conclude_locked(srv_engine *e, sreq *r, int done);

/* Is choice 0 (leader) of an n > 1 request still before the end of its prompt?  Its other
 * choices wait for it in the queue, to start from a copy of its state. */
static int leader_busy(const sreq *l)
{
    return l->state == SREQ_NEW || l->state == SREQ_QUEUED || (l->state == SREQ_ACTIVE && l->fed < l->n_prompt);
}

/* r (choice i > 0) may start from its leader's state: the leader has run the prompt and nothing
 * more (its first token is sampled, not run), and, with echo's logprobs, has them all. */
static int leader_state_ready(const sreq *r)
{
    const sreq *l = r->leader;
    return l && l->state == SREQ_ACTIVE && l->s && l->fed == l->n_prompt && krun_session_pos(l->s) == r->n_prompt &&
           !krun_session_pending(l->s) && krun_session_logits(l->s) && l->n_prompt == r->n_prompt &&
           !memcmp(l->prompt, r->prompt, r->n_prompt * sizeof *r->prompt);
}

/* A session for r: with the prefix cache, the longest kept state its prompt begins with -- but
 * none for a request that needs the logits of every prompt position (echo with logprobs: the
 * cached positions have none) or that copies its leader's state (nothing to look for); then
 * the copy.  The lock is let go meanwhile (a cache entry may be read from a file). */
static int session_for_locked(srv_engine *e, sreq *r, size_t *reused, krun_err *err)
{
    int lookup = !(r->echo && r->logprobs) && !leader_state_ready(r), rc;
    *reused = 0;
    if (e->cache) {
        pthread_mutex_unlock(&e->mu);
        rc = krun_pcache_begin(e->cache, r->prompt, lookup ? r->n_prompt : 0, lookup ? r->n_preamble : 0, &r->s, reused, err);
        pthread_mutex_lock(&e->mu);
    } else {
        rc = krun_session_new(e->m, &r->s, err);
    }
    if (rc || lookup || !leader_state_ready(r)) return rc;
    /* n > 1: the prompt ran once, in choice 0's sequence; its state copied (a memcpy, no model read) */
    if (krun_session_copy(r->s, r->leader->s, err) || (r->echo && r->logprobs && sgen_copy_logprobs(r->gen, r->leader->gen, r->n_prompt))) {
        krun_session_reset(r->s);             /* it runs its prompt itself: the same result, later */
        return 0;
    }
    krun_session_spec_restart(r->s);
    r->copied = *reused = r->n_prompt;
    e->st.copied_tokens += r->n_prompt;
    return 0;
}

/* Queued requests take free sequences, in order; choice i > 0 of an n > 1 request waits while its
 * choice 0 has not run its prompt.  With the prefix cache, a sequence starts from the longest kept
 * state whose history is a prefix of the prompt (pcache.h); choice i > 0 from a copy of choice
 * 0's state.  The lock may be let go meanwhile (a request cancelled then is dropped at the next
 * sweep), so the queue is looked at from its head after each admission. */
static void admit_locked(srv_engine *e)
{
    for (;;) {
        sreq **p = &e->qhead, *prev = NULL, *r;
        krun_err err;
        size_t reused = 0;
        if (e->n_active >= e->max_seqs) return;
        while (*p && (*p)->leader && leader_busy((*p)->leader)) { prev = *p; p = &(*p)->next_in_queue; }
        if (!(r = *p)) return;
        *p = r->next_in_queue;
        if (e->qtail == r) e->qtail = prev;
        e->n_queued--;
        r->state = SREQ_ACTIVE;
        if (session_for_locked(e, r, &reused, &err)) {          /* cannot happen: n_active < max_seqs */
            oai_error oe;
            oai_error_set(&oe, 500, NULL, NULL, "%s", err.msg);
            fail_locked(e, r, &oe);
            continue;
        }
        krun_session_set_sampler(r->s, &r->sampling);
        krun_session_set_reply_start(r->s, r->n_prompt);
        krun_session_spec_stats(r->s, &r->seen);   /* a kept state's counters are not this request's */
        if (r->gram) {
            if (!(r->mask = kmask_new(r->mask_index, r->gram))) {
                oai_error oe;
                oai_error_set(&oe, 500, NULL, NULL, "out of memory");
                fail_locked(e, r, &oe);
                continue;
            }
            r->mask_at = 0;
            krun_session_set_mask(r->s, reply_mask, r);
        }
        r->state = SREQ_ACTIVE;
        r->fed = r->prefilled = reused;
        r->cached = r->copied ? 0 : reused;
        sgen_set_cached(r->gen, r->cached);
        e->st.cached_tokens += r->cached;
        e->active[e->n_active++] = r;
        /* the whole prompt was there, with its logits: the first token now */
        if (r->fed == r->n_prompt) {
            int done;
            r->emitted = 0;
            done = next_token(e, r);
            e->st.generated += r->emitted;
            r->generated = sgen_n_tokens(r->gen);
            conclude_locked(e, r, done);      /* (done: r may be freed) */
        }
    }
}

/* How many drafts the decoding sequence r may verify in this sweep: at most its request's
 * limit, the journal rows left and the block positions left, and no further than max_tokens
 * (a draft past it would be thrown away).  None for a request with logprobs: a draft kept is
 * emitted without a sampling step, so its log-probability (from its own row of the block's
 * logits) is not at hand here; such a request decodes one token a sweep.  A constrained request
 * drafts: the session checks each draft with the pick plain decoding makes, mask included, and
 * reply_mask is a function of the history tokens[n_prompt..pos) only. */
static size_t draft_limit(const sreq *r, size_t rows, size_t budget)
{
    size_t max = r->spec, left = (size_t)r->max_tokens - sgen_n_tokens(r->gen);
    if (r->logprobs) return 0;
    if (!max || rows < 2 || !budget || (size_t)r->max_tokens <= sgen_n_tokens(r->gen)) return 0;
    if (max > rows - 1) max = rows - 1;
    if (max > budget) max = budget;
    if (max > left) max = left;
    return max;
}

/* The drafts of the sweep's n decoding sequences sw[0..n), each within max[k], into nd[k]: from
 * their text or another's (the live requests', and the conversations the prefix cache keeps in
 * RAM: idle slots, active + idle <= max_seqs), else the EAGLE drafter's chains, all of them in
 * lockstep (krun_sessions_draft).  Runs without the lock: the drafter computes (a chain step
 * reads its weights), and the active list changes only on this thread.  A drafter that cannot
 * read an embedding row drafts nothing; the sweep reads the same file and reports it. */
static void draft_sweep(srv_engine *e, sreq **sw, const size_t *max, size_t n, size_t *nd)
{
    krun_session *others[KRUN_MAX_SEQS], *ss[KRUN_MAX_SEQS];
    int32_t ids[KRUN_MAX_SEQS], *out[KRUN_MAX_SEQS];
    size_t n_others = 0;
    krun_err err;
    for (size_t j = 0; j < e->n_active; j++) others[n_others++] = e->active[j]->s;
    if (e->cache) n_others += krun_pcache_ram_entries(e->cache, others + n_others, KRUN_MAX_SEQS - n_others);
    for (size_t k = 0; k < n; k++) {
        ss[k] = sw[k]->s;
        ids[k] = sw[k]->next;
        out[k] = e->drafts + k * e->spec;
    }
    pthread_mutex_unlock(&e->mu);
    if (krun_sessions_draft(e->m, ss, ids, max, n, others, n_others, out, nd, &err))
        for (size_t k = 0; k < n; k++) nd[k] = 0;
    pthread_mutex_lock(&e->mu);
}

/* The sweep: every decoding sequence's next token, then its drafts (while the journal has
 * rows), then prompt positions up to the block, in admission order.  The block: the decoding
 * one, or the prefill layout's when the cost model says the positions waiting read fewer bytes
 * in it.  take[k]: prompt tokens of sw[k] in this sweep (0: a decoding step); nd[k]: its
 * drafts.  Returns the number of sequences in it. */
static size_t plan_sweep_locked(srv_engine *e, sreq **sw, size_t *take, size_t *nd)
{
    size_t n = 0, budget, waiting = 0, rows = e->jrows, seqs = e->jseqs;
    int echo = 0;
    for (size_t k = 0; k < e->n_active; k++)
        waiting += e->active[k]->fed < e->active[k]->n_prompt ? e->active[k]->n_prompt - e->active[k]->fed : 1;
    budget = krun_model_prompt_block(e->m, waiting);
    for (size_t k = 0; k < e->n_active; k++) {
        sreq *r = e->active[k];
        if (r->fed < r->n_prompt) continue;
        sw[n] = r;
        nd[n] = 0;
        take[n++] = 0;
        budget--;
    }
    {
        /* every decoding sequence drafts within what the sweep could give it alone (the drafter's
         * chains in lockstep); then, in admission order, each keeps what the journal's rows and
         * sequences and the block still hold of its drafts (a prefix of a draft is a draft) */
        size_t max[KRUN_MAX_SEQS];
        for (size_t k = 0; k < n; k++) max[k] = seqs ? draft_limit(sw[k], rows, budget) : 0;
        if (n) draft_sweep(e, sw, max, n, nd);
        for (size_t k = 0; k < n; k++) {
            size_t lim = seqs ? draft_limit(sw[k], rows, budget) : 0;
            if (nd[k] > lim) nd[k] = lim;
            if (!nd[k]) continue;
            rows -= nd[k] + 1;
            seqs--;
            budget -= nd[k];
        }
    }
    for (size_t k = 0; k < e->n_active && budget; k++) {
        sreq *r = e->active[k];
        size_t left = r->n_prompt - r->fed;
        if (!left) continue;
        if (r->echo && r->logprobs) {
            /* the logits of each of its positions: SRV_ECHO_ROWS at most, one such request a sweep */
            if (echo) continue;
            echo = 1;
            if (left > SRV_ECHO_ROWS) left = SRV_ECHO_ROWS;
        }
        sw[n] = r;
        nd[n] = 0;
        take[n] = left < budget ? left : budget;
        budget -= take[n++];
    }
    return n;
}

/* Echo with logprobs: the prompt positions [fed, fed + rows) have just run, their logits in
 * e->echo_logits: each row is the distribution of the prompt's next token, made its entry at once
 * (the prompt's first token has none: null).  0, or -1 out of memory. */
static int echo_logprobs(srv_engine *e, sreq *r, size_t rows)
{
    int32_t top_ids[OAI_MAX_TOP_LOGPROBS];
    double top_lp[OAI_MAX_TOP_LOGPROBS];
    size_t nt = (size_t)r->top_logprobs;
    if (!r->fed && sgen_logprob_null(r->gen, r->prompt[0])) return -1;
    for (size_t i = 0; i < rows && r->fed + i + 1 < r->n_prompt; i++) {
        int32_t id = r->prompt[r->fed + i + 1];
        double lp = ksampler_logprobs(e->echo_logits + i * e->vocab, e->vocab, id, nt, top_ids, top_lp);
        if (sgen_logprob(r->gen, id, lp, top_ids, top_lp, nt)) return -1;
    }
    return 0;
}

/* Run the sweep and read what each sequence generated (without the lock).
 * Returns 0, or -1 with err when the forward block failed (every sequence in
 * it is broken).  done[k]: sw[k] is complete (its output says why). */
static int run_sweep(srv_engine *e, sreq **sw, const size_t *take, const size_t *nd, size_t n, int *done, krun_err *err)
{
    krun_session *ss[KRUN_MAX_SEQS];
    int32_t ids[KRUN_MAX_SEQS];
    const int32_t *drafts[KRUN_MAX_SEQS];
    size_t acc[KRUN_MAX_SEQS];
    for (size_t k = 0; k < n; k++) {
        sreq *r = sw[k];
        ss[k] = r->s;
        drafts[k] = e->drafts + k * e->spec;
        done[k] = 0;
        if (!take[k]) { ids[k] = r->next; continue; }
        /* a block of the prompt: all but its last token pending, the last as the step's token */
        if (take[k] > 1 && krun_session_append(r->s, r->prompt + r->fed, take[k] - 1, err)) return -1;
        ids[k] = r->prompt[r->fed + take[k] - 1];
        if (r->echo && r->logprobs) {
            if (!e->echo_logits && !(e->echo_logits = malloc((size_t)SRV_ECHO_ROWS * e->vocab * sizeof *e->echo_logits))) {
                krun_err_set(err, KRUN_ENOMEM, "out of memory for the prompt's logits (echo)");
                return -1;
            }
            krun_session_all_logits(r->s, e->echo_logits, SRV_ECHO_ROWS);
        }
    }
    if (krun_step_batch_verify(e->m, ss, ids, drafts, nd, n, acc, err)) return -1;
    for (size_t k = 0; k < n; k++) {
        sreq *r = sw[k];
        int rc = 0;
        if (take[k] && r->echo && r->logprobs && echo_logprobs(e, r, take[k])) { done[k] = -1; continue; }
        r->fed += take[k];
        r->emitted = 0;
        if (r->fed < r->n_prompt) continue;             /* more prompt to read */
        if (take[k] && e->cache) krun_pcache_keep(e->cache, r->s);   /* the end of the prompt: kept */
        if (nd[k]) {
            /* the drafts kept are the next tokens, already run: out they go, up to an end */
            size_t nt;
            const int32_t *h = krun_session_tokens(r->s, &nt);
            r->verifications++;
            r->drafted += nd[k];
            r->accepted += acc[k];
            r->acc_last = acc[k];
            {
                /* the drafter's part of it (its counters are the session's, since the request began) */
                krun_spec_stats now;
                krun_session_spec_stats(r->s, &now);
                r->dr_last[0] = now.drafter_verifications - r->seen.drafter_verifications;
                r->dr_last[1] = now.drafter_drafted - r->seen.drafter_drafted;
                r->dr_last[2] = now.drafter_accepted - r->seen.drafter_accepted;
                r->seen = now;
            }
            for (size_t i = nt - acc[k]; i < nt && rc == 0; i++, r->emitted++) rc = sgen_token(r->gen, h[i]);
            if (rc) { done[k] = rc < 0 ? -1 : rc; continue; }
        }
        done[k] = next_token(e, r);
    }
    return 0;
}

/* The prompt has run: sample the next token and hand it to the request's
 * output.  1: the request is complete, 0: go on, -1: out of memory. */
static int next_token(srv_engine *e, sreq *r)
{
    int32_t id;
    int rc;
    if (r->echo && sgen_echo(r->gen, r->prompt, r->n_prompt)) return -1;
    if (!r->max_tokens) {                             /* echo with max_tokens 0: the prompt scored, nothing generated */
        sgen_end(r->gen, "length");
        return 1;
    }
    id = krun_session_sample(r->s);
    if (id < 0) return -2;                            /* the constraint allows no token (cannot happen: its grammar ends the reply) */
    if (r->logprobs) {
        int32_t top_ids[OAI_MAX_TOP_LOGPROBS];
        double top_lp[OAI_MAX_TOP_LOGPROBS];
        size_t nt = (size_t)r->top_logprobs;
        double lp = ksampler_logprobs(krun_session_logits(r->s), e->vocab, id, nt, top_ids, top_lp);
        if (sgen_logprob(r->gen, id, lp, top_ids, top_lp, nt)) return -1;
    }
    rc = sgen_token(r->gen, id);
    r->emitted++;
    if (rc < 0) return -1;                            /* out of memory for the output */
    if (rc == 0 && krun_session_pos(r->s) + 1 > e->ctx) {
        sgen_end(r->gen, "length");                   /* no room to run the token */
        rc = 1;
    }
    r->next = id;
    return rc;
}

/* What a request's token did (next_token): its output published, or the
 * request over (complete, or out of memory) and its sequence freed. */
static void conclude_locked(srv_engine *e, sreq *r, int done)
{
    if (!done) { publish_locked(r); return; }
    for (size_t j = 0; j < e->n_active; j++)
        if (e->active[j] == r) { remove_active(e, j); break; }
    if (done < 0) {
        oai_error oe;
        oai_error_set(&oe, 500, NULL, NULL, "%s", done == -2 ? "the reply's constraint allows no token here"
                                                              : "out of memory while building the response");
        fail_locked(e, r, &oe);
    } else {
        e->st.completed++;
        e->st.request_seconds += know() - r->t_submit;
        log_end(e, r, sgen_finish_reason(r->gen), NULL);
        finish_locked(e, r);
    }
}

/* Every running and queued request fails with oe. */
static void fail_all_locked(srv_engine *e, const oai_error *oe)
{
    while (e->n_active) {
        sreq *r = e->active[e->n_active - 1];
        e->n_active--;
        fail_locked(e, r, oe);
    }
    while (e->qhead) {
        sreq *r = e->qhead;
        e->qhead = r->next_in_queue;
        e->n_queued--;
        fail_locked(e, r, oe);
    }
    e->qtail = NULL;
}

/* The model is damaged (a checksum mismatch, non-finite logits): nothing
 * computed from it may be served.  Every running and queued request fails
 * with 500 and the damage named; later ones get 503 (srv_submit). */
static void damaged_locked(srv_engine *e, const krun_err *err)
{
    oai_error oe;
    const char *states = krun_model_state_file(e->m);       /* paged states (krun batch): their file, not the model's */
    e->damaged = 1;
    snprintf(e->damage, sizeof e->damage, "%s", err->msg);
    if (states && strstr(err->msg, states))
        oai_error_set(&oe, 500, NULL, "model_damaged",
                      "the sequences' state file is damaged: %s; nothing more is computed (it is scratch: the same command runs "
                      "the requests not yet recorded again)", err->msg);
    else
        oai_error_set(&oe, 500, NULL, "model_damaged",
                      "the model file is damaged: %s; this server serves nothing more computed from it (restart it with a good "
                      "file: kpack verify names every bad extent)", err->msg);
    fail_all_locked(e, &oe);
}

/* Several machines: a rank, or the network to it, was lost (or a block
 * failed half way on the ranks): nothing more can be computed.  Every running
 * and queued request fails with 503 and the rank named; later ones too
 * (srv_submit), and /health says so. */
static void lost_locked(srv_engine *e, const krun_err *err)
{
    oai_error oe;
    e->damaged = 2;
    snprintf(e->damage, sizeof e->damage, "%s", err->msg);
    oai_error_set(&oe, 503, NULL, "cluster_unavailable", "%s; this server computes nothing more (restart the cluster: mpirun)", err->msg);
    fail_all_locked(e, &oe);
}

/* A burst of requests that finds the engine idle starts in one sweep: wait
 * until none has arrived for SERVE_GATHER_QUIET seconds (at most
 * SERVE_GATHER_MAX).  A lone request waits SERVE_GATHER_QUIET; a sweep takes
 * milliseconds in memory and seconds when streaming, and a request that just
 * missed one waits for the whole next sweep. */
#define SERVE_GATHER_QUIET 0.003
#define SERVE_GATHER_MAX 0.05

static void gather_locked(srv_engine *e)
{
    double end = know() + SERVE_GATHER_MAX;
    uint64_t seen = e->st.requests;
    while (e->n_queued < e->max_seqs && know() < end) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(SERVE_GATHER_QUIET * 1e9);
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&e->wake, &e->mu, &ts);
        if (e->st.requests == seen || e->cancel_all) break;
        seen = e->st.requests;
    }
}

static void *engine_main(void *arg)
{
    srv_engine *e = arg;
    sreq **sw = calloc(e->max_seqs, sizeof *sw);
    size_t *take = calloc(e->max_seqs, sizeof *take), *nd = calloc(e->max_seqs, sizeof *nd);
    int *done = calloc(e->max_seqs, sizeof *done);
    pthread_mutex_lock(&e->mu);
    for (;;) {
        size_t n;
        krun_err err;
        int rc;
        double t;
        krun_stats ks;
        int prefill = 0;
        drop_cancelled_locked(e);
        if (e->held && !e->cancel_all && !e->quit) {      /* the first requests are being handed over */
            pthread_cond_wait(&e->wake, &e->mu);
            continue;
        }
        admit_locked(e);
        if (!e->n_active) {
            pthread_cond_broadcast(&e->idle);
            if (e->quit) break;
            pthread_cond_wait(&e->wake, &e->mu);
            if (e->n_queued) gather_locked(e);
            continue;
        }
        if (!sw || !take || !nd || !done) {               /* no memory for the sweep's lists: fail what runs */
            oai_error oe;
            oai_error_set(&oe, 500, NULL, NULL, "out of memory");
            while (e->n_active) fail_locked(e, e->active[--e->n_active], &oe);
            continue;
        }
        n = plan_sweep_locked(e, sw, take, nd);
        e->sweep_T = 0;
        for (size_t k = 0; k < n; k++) {
            sw[k]->in_sweep = take[k] ? take[k] : 1 + nd[k];
            e->sweep_T += sw[k]->in_sweep;
        }
        e->sweep_prefill = e->sweep_T > e->block;
        atomic_store(&e->sweep_layer, 0);
        pthread_mutex_unlock(&e->mu);

        t = know();
        rc = run_sweep(e, sw, take, nd, n, done, &err);
        t = know() - t;
        krun_model_stats(e->m, &ks);

        pthread_mutex_lock(&e->mu);
        e->st.sweeps++;
        e->st.sweep_seconds += t;
        for (size_t k = 0; k < n; k++) prefill |= take[k] != 0;
        if (prefill) {
            e->st.prefill_sweeps++;
            e->st.prefill_seconds += t;
            e->st.prefill_bytes_read += ks.bytes_read - e->st.bytes_read;
        }
        e->st.bytes_read = ks.bytes_read;
        e->st.phase_switches = ks.phase_switches;
        e->sweep_T = 0;
        for (size_t k = 0; k < n; k++) {
            sw[k]->in_sweep = 0;
            sw[k]->prefilled = sw[k]->fed;
            sw[k]->generated = sgen_n_tokens(sw[k]->gen);
        }
        if (rc) {
            if (err.code == KRUN_EDATA) { damaged_locked(e, &err); continue; }
            if (krun_model_cluster_lost(e->m, NULL)) { lost_locked(e, &err); continue; }
            /* not the model's fault (a bug): the sequences of this block fail, the rest go on */
            oai_error oe;
            oai_error_set(&oe, 500, NULL, NULL, "%s", err.msg);
            for (size_t k = 0; k < n; k++)
                for (size_t j = 0; j < e->n_active; j++)
                    if (e->active[j] == sw[k]) { remove_active(e, j); fail_locked(e, sw[k], &oe); break; }
            continue;
        }
        for (size_t k = 0; k < n; k++) {
            sreq *r = sw[k];
            e->st.positions += (take[k] ? take[k] : 1) + nd[k];
            e->st.generated += r->emitted;                      /* tokens sampled or accepted */
            if (prefill) e->st.prefill_generated += r->emitted;
            if (nd[k]) {
                e->st.verifications++;
                e->st.drafted += nd[k];
                e->st.accepted += r->acc_last;
                e->st.dr_verifications += r->dr_last[0];
                e->st.dr_drafted += r->dr_last[1];
                e->st.dr_accepted += r->dr_last[2];
            }
            conclude_locked(e, r, done[k]);
        }
    }
    pthread_mutex_unlock(&e->mu);
    free(sw);
    free(take);
    free(nd);
    free(done);
    return NULL;
}

/* ---- the connection's side ------------------------------------------------------------------- */

/* Did the client leave?  Only a reset or an error on its socket says so, or a failed write
 * (which MHD reports: on_completed).  The end of its input does not: a client may shut its
 * writing side down once its request is sent (shutdown(SHUT_WR), nc -N, socat) and still read
 * the answer.  A client that closed its socket and one that only half-closed it look the same
 * from here (the end of input); they differ in what they do with data sent to them: a closed
 * socket answers it with a reset.  So, the first time its input is seen ended, the client is sent
 * something every client skips, and the reset (if it comes) is seen at the next look:
 *   - before the response's status is known, an interim response "HTTP/1.1 100 Continue" (an
 *     HTTP/1.1 client must accept 1xx responses before the final one, RFC 9110 15.2; HTTP/1.0
 *     has none, so there the end of input counts as a hang-up);
 *   - in a started stream, an SSE comment line (":"), which clients ignore (srv_read). */
enum { CLIENT_HERE, CLIENT_GONE, CLIENT_EOF };
#define CLIENT_PROBE "HTTP/1.1 100 Continue\r\n\r\n"
#define SSE_PROBE ":\n\n"
/* After a probe, look again this soon (a reset comes back within a round trip). */
#define PROBE_RECHECK 0.02

static int client_check(const sreq *r)
{
    struct pollfd p = {r->client_fd, POLLIN | POLLRDHUP, 0};
    if (r->client_fd < 0 || poll(&p, 1, 0) <= 0) return CLIENT_HERE;
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return CLIENT_GONE;   /* a reset, an error, or both sides shut */
    return p.revents & POLLRDHUP ? CLIENT_EOF : CLIENT_HERE;               /* POLLIN alone: a pipelined request */
}

/* Before the status is known: is the client gone?  *soon: look again soon (a probe was sent).
 * The connection's thread is inside MHD's access handler, so MHD writes nothing meanwhile and the
 * interim response goes out whole before the final one. */
static int client_gone_head(sreq *r, double *soon)
{
    ssize_t n;
    int st = client_check(r);
    if (st != CLIENT_EOF) return st == CLIENT_GONE;
    if (r->probed_head) return 0;                   /* probed: only half-closed */
    if (!r->client_probe) return 1;                 /* HTTP/1.0: no interim responses */
    n = send(r->client_fd, CLIENT_PROBE, sizeof CLIENT_PROBE - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;   /* its buffer is full: later */
    /* a write that failed means the client left; a partial one (cannot happen with an empty
     * buffer, but) would leave a torn response on the wire: the connection is given up */
    if (n != (ssize_t)(sizeof CLIENT_PROBE - 1)) return 1;
    r->probed_head = 1;
    *soon = PROBE_RECHECK;
    return 0;
}

static void cancel_locked(srv_engine *e, sreq *r)
{
    if (r->cancelled || r->state == SREQ_DONE) return;
    r->cancelled = 1;
    if (r->state == SREQ_QUEUED) {         /* not running yet: out of the queue now */
        sreq **p = &e->qhead, *prev = NULL;
        while (*p && *p != r) { prev = *p; p = &(*p)->next_in_queue; }
        if (*p) {
            *p = r->next_in_queue;
            if (e->qtail == r) e->qtail = prev;
            e->n_queued--;
            e->st.cancelled++;
            log_end(e, r, "cancelled while queued", "the client went away");
            finish_locked(e, r);
        }
    }
    pthread_cond_signal(&e->wake);
}

void srv_cancel(srv_engine *e, sreq *r)
{
    pthread_mutex_lock(&e->mu);
    cancel_locked(e, r);
    pthread_mutex_unlock(&e->mu);
}

/* A connection waiting for output looks at its client this often (seconds). */
#define CLIENT_LOOK 0.2

/* Wait on r->cv for at most the given seconds (< 1), then look at the client again. */
static void wait_a_little(sreq *r, pthread_mutex_t *mu, double seconds)
{
    struct timespec ts;
    long ns = (long)(seconds * 1e9);
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += ns;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(&r->cv, mu, &ts);
}

int srv_wait_started(srv_engine *e, sreq *r)
{
    int status = -1;
    pthread_mutex_lock(&e->mu);
    r->last_sent = r->t_submit;
    while (!r->started && r->state != SREQ_DONE) {
        double next = CLIENT_LOOK;
        if (client_gone_head(r, &next)) { cancel_locked(e, r); break; }
        if (e->progress_every > 0 && know() - r->t_submit >= e->progress_every) {
            /* still queued or reading its prompt: the stream opens now, for progress comments */
            r->started = 1;
            r->status = 200;
            r->early_stream = 1;
            break;
        }
        wait_a_little(r, &e->mu, next);
    }
    if (r->started && !r->cancelled) status = r->status;
    pthread_mutex_unlock(&e->mu);
    return status;
}

/* ": prefill 1234/5000 (a block of 2048 positions: layer 40/93)": where the request is, as an
 * SSE comment (clients skip it).  Returns its length, 0 if it does not fit. */
static size_t progress_comment_locked(srv_engine *e, const sreq *r, char *buf, size_t max)
{
    char t[192];
    int n;
    if (r->state == SREQ_QUEUED || r->state == SREQ_NEW) n = snprintf(t, sizeof t, ": queued\n\n");
    else if (r->prefilled < r->n_prompt && r->in_sweep)
        n = snprintf(t, sizeof t, ": prefill %zu/%zu (a block of %zu positions: layer %d/%d)\n\n", r->prefilled, r->n_prompt,
                     e->sweep_T, atomic_load(&e->sweep_layer), e->n_layers);
    else if (r->prefilled < r->n_prompt) n = snprintf(t, sizeof t, ": prefill %zu/%zu\n\n", r->prefilled, r->n_prompt);
    else n = snprintf(t, sizeof t, ": generating (%zu tokens)\n\n", r->generated);
    if (n <= 0 || (size_t)n > max) return 0;
    memcpy(buf, t, (size_t)n);
    return (size_t)n;
}

long srv_read(srv_engine *e, sreq *r, char *buf, size_t max)
{
    long got = -1;
    pthread_mutex_lock(&e->mu);
    while (!r->out.n && r->state != SREQ_DONE && !r->cancelled) {
        int st = client_check(r);
        size_t c;
        if (st == CLIENT_GONE) { cancel_locked(e, r); break; }
        if (e->progress_every > 0 && know() - r->last_sent >= e->progress_every && (c = progress_comment_locked(e, r, buf, max))) {
            r->last_sent = know();     /* between events (out is empty: every event published was taken whole) */
            pthread_mutex_unlock(&e->mu);
            return (long)c;
        }
        if (st == CLIENT_EOF && !r->probed_stream && max >= sizeof SSE_PROBE - 1) {
            /* between events (out is empty: every event published so far was taken whole) */
            r->probed_stream = 1;
            memcpy(buf, SSE_PROBE, sizeof SSE_PROBE - 1);
            pthread_mutex_unlock(&e->mu);
            return (long)(sizeof SSE_PROBE - 1);
        }
        wait_a_little(r, &e->mu, CLIENT_LOOK);
    }
    if (r->out.n) {
        size_t n = r->out.n < max ? r->out.n : max;
        memcpy(buf, r->out.p, n);
        memmove(r->out.p, r->out.p + n, r->out.n - n);
        r->out.n -= n;
        got = (long)n;
        r->last_sent = know();
    } else if (r->state == SREQ_DONE && !r->cancelled) {
        got = 0;
    }
    pthread_mutex_unlock(&e->mu);
    return got;
}

/* Bytes of r's output to take now: whole events up to max (out holds whole events: each ends
 * with a blank line, and none has one inside), or -- mid-event (*cur), or an event longer than
 * max -- up to the event's end or max. */
static size_t event_bytes(const sreq *r, int mid, int nl, size_t max)
{
    size_t lim = r->out.n < max ? r->out.n : max, end = 0;
    if (mid) {
        if (nl && r->out.p[0] == '\n') return 1;
        for (size_t i = 0; i + 1 < r->out.n; i++)
            if (r->out.p[i] == '\n' && r->out.p[i + 1] == '\n') return i + 2 <= lim ? i + 2 : lim;
        return lim;
    }
    for (size_t i = 0; i + 1 < lim; i++)
        if (r->out.p[i] == '\n' && r->out.p[i + 1] == '\n') end = i + 2;
    return end ? end : lim;
}

long srv_read_choices(srv_engine *e, sreq *const *rs, size_t n, int *cur, int *nl, char *buf, size_t max)
{
    long got = -1;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        size_t over = 0, c;
        int pick = -1, st;
        if (rs[0]->cancelled) break;
        for (size_t i = 0; i < n; i++) over += rs[i]->state == SREQ_DONE && !rs[i]->out.n;
        if (*cur >= 0) pick = *cur;
        else
            for (size_t i = 0; i < n && pick < 0; i++)
                if (rs[i]->out.n) pick = (int)i;
        if (pick >= 0 && rs[pick]->out.n) {
            sreq *r = rs[pick];
            int mid = *cur >= 0, ended;
            size_t k = event_bytes(r, mid, *nl, max);
            memcpy(buf, r->out.p, k);
            memmove(r->out.p, r->out.p + k, r->out.n - k);
            r->out.n -= k;
            ended = (k >= 2 && buf[k - 1] == '\n' && buf[k - 2] == '\n') || (k == 1 && mid && *nl && buf[0] == '\n');
            *nl = buf[k - 1] == '\n';
            *cur = ended ? -1 : pick;
            for (size_t i = 0; i < n; i++) rs[i]->last_sent = know();
            got = (long)k;
            break;
        }
        if (over == n) { got = 0; break; }
        st = client_check(rs[0]);
        if (st == CLIENT_GONE) break;
        if (*cur < 0 && e->progress_every > 0 && know() - rs[0]->last_sent >= e->progress_every &&
            (c = progress_comment_locked(e, rs[0], buf, max))) {
            for (size_t i = 0; i < n; i++) rs[i]->last_sent = know();
            got = (long)c;
            break;
        }
        wait_a_little(rs[0], &e->mu, CLIENT_LOOK);     /* every choice's output wakes rs[0] too (publish_locked) */
    }
    if (got < 0)
        for (size_t i = 0; i < n; i++) cancel_locked(e, rs[i]);
    pthread_mutex_unlock(&e->mu);
    return got;
}

void srv_choices_usage(srv_engine *e, sreq *const *rs, size_t n, long *prompt, long *completion, long *cached, const sgen_opts **o)
{
    pthread_mutex_lock(&e->mu);
    *prompt = (long)rs[0]->n_prompt;
    *cached = (long)sgen_cached(rs[0]->gen);
    *completion = 0;
    for (size_t i = 0; i < n; i++) *completion += (long)sgen_n_tokens(rs[i]->gen);
    *o = sgen_options(rs[0]->gen);
    pthread_mutex_unlock(&e->mu);
}

int srv_done(srv_engine *e, sreq *r)
{
    int done;
    pthread_mutex_lock(&e->mu);
    done = r->state == SREQ_DONE;
    pthread_mutex_unlock(&e->mu);
    return done;
}

void srv_wait_done(srv_engine *e, sreq *r)
{
    pthread_mutex_lock(&e->mu);
    while (r->state != SREQ_DONE && !r->cancelled) {
        double next = CLIENT_LOOK;
        if (client_gone_head(r, &next)) { cancel_locked(e, r); break; }
        wait_a_little(r, &e->mu, next);
    }
    pthread_mutex_unlock(&e->mu);
}

int srv_take_body(srv_engine *e, sreq *r, char **body)
{
    int status = -1;
    *body = NULL;
    pthread_mutex_lock(&e->mu);
    if (!r->cancelled) {
        *body = strndup(r->out.p ? r->out.p : "", r->out.n);
        r->out.n = 0;
        status = *body ? r->status : -1;
    }
    pthread_mutex_unlock(&e->mu);
    return status;
}

/* A seed for a request without one: distinct per request and per run. */
static uint64_t fresh_seed(srv_engine *e)
{
    struct timespec ts;
    uint64_t z;
    clock_gettime(CLOCK_REALTIME, &ts);
    z = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ (++e->seeds * 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    return (z ^ (z >> 27)) & 0x7fffffffffffffffull;
}

uint64_t srv_engine_fresh_seed(srv_engine *e)
{
    uint64_t z;
    pthread_mutex_lock(&e->mu);
    z = fresh_seed(e);
    pthread_mutex_unlock(&e->mu);
    return z;
}

int srv_submit_n(srv_engine *e, sreq *const *rs, size_t n, oai_error *err)
{
    int rc = -1;
    pthread_mutex_lock(&e->mu);
    if (e->damaged == 2) {
        oai_error_set(err, 503, NULL, "cluster_unavailable", "%s; this server computes nothing more (restart the cluster: mpirun)", e->damage);
    } else if (e->damaged) {
        oai_error_set(err, 503, NULL, "model_damaged", "the model file is damaged: %s; this server serves nothing computed from "
                      "it (restart it with a good file: kpack verify names every bad extent)", e->damage);
    } else if (e->draining) {
        oai_error_set(err, 503, NULL, "server_shutting_down", "the server is shutting down and takes no new requests");
    } else if (e->n_queued + n > e->max_seqs - e->n_active + e->max_queue) {
        oai_error_set(err, 503, NULL, "server_busy", "all %zu sequences are busy and %zu requests are waiting (--max-queue); retry later",
                      e->max_seqs, e->n_queued);
    } else {
        /* all at once: choice i > 0 of n finds choice 0 queued before it, and waits for its prompt */
        for (size_t i = 0; i < n; i++) {
            sreq *r = rs[i];
            if (!r->has_seed) r->sampling.seed = fresh_seed(e);
            r->t_submit = know();
            r->state = SREQ_QUEUED;
            r->refs++;
            if (r->leader && r->leader->state != SREQ_NEW) { r->leader->refs++; r->leader_ref = 1; }   /* it reads its leader */
            r->next_in_queue = NULL;
            if (e->qtail) e->qtail->next_in_queue = r;
            else e->qhead = r;
            e->qtail = r;
            e->n_queued++;
            e->n_open++;
            e->st.requests++;
            if (!r->leader) e->st.prompt_tokens += r->n_prompt;      /* n > 1: one prompt (as usage counts it) */
        }
        pthread_cond_signal(&e->wake);
        rc = 0;
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

int srv_submit(srv_engine *e, sreq *r, oai_error *err) { return srv_submit_n(e, &r, 1, err); }

/* Seconds a client should wait before retrying a busy server: a sequence
 * frees up about every (a request's mean time / sequences). */
int srv_retry_after(srv_engine *e)
{
    double s = 1;
    pthread_mutex_lock(&e->mu);
    if (e->st.completed) s = e->st.request_seconds / (double)e->st.completed / (double)e->max_seqs;
    pthread_mutex_unlock(&e->mu);
    return s < 1 ? 1 : s > 3600 ? 3600 : (int)ceil(s);
}

/* ---- lifetime and health ------------------------------------------------------------------------ */

/* The model's layer hook, on the engine thread inside a sweep: how far the sweep is. */
static void sweep_layer_done(void *ctx, int done, int n)
{
    srv_engine *e = ctx;
    (void)n;
    atomic_store(&e->sweep_layer, done);
}

int srv_engine_start(krun_model *m, const srv_engine_opts *o, srv_engine **out, krun_err *err)
{
    srv_engine *e = calloc(1, sizeof *e);
    *out = NULL;
    if (!e) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
    e->m = m;
    e->cache = o->cache;
    snprintf(e->model_name, sizeof e->model_name, "%s", o->model_name);
    e->max_queue = o->max_queue;
    e->quiet = o->quiet;
    e->progress_every = o->progress_every;
    e->held = o->held;
    e->command = o->command ? o->command : "krun serve";
    e->ctx_lenient = o->ctx_lenient;
    e->default_effort = o->default_effort;
    e->default_effort_set = o->default_effort_set;
    e->n_layers = krun_model_config(m)->n_layers;
    atomic_init(&e->sweep_layer, 0);
    e->ctx = krun_model_ctx(m);
    e->max_seqs = krun_model_max_seqs(m);       /* the model was prepared for them */
    e->block = krun_model_block(m);
    e->vocab = (size_t)krun_model_config(m)->vocab;
    krun_model_journal(m, &e->jrows, &e->jseqs);
    e->spec = e->jrows ? e->jrows - 1 : 0;
    e->drafts = malloc(e->max_seqs * (e->spec ? e->spec : 1) * sizeof *e->drafts);
    e->active = calloc(e->max_seqs, sizeof *e->active);
    e->t0 = know();
    if (!e->active || !e->drafts || pthread_mutex_init(&e->mask_mu, NULL)) goto oom;
    if (pthread_mutex_init(&e->mu, NULL)) { pthread_mutex_destroy(&e->mask_mu); goto oom; }
    if (pthread_cond_init(&e->wake, NULL)) { pthread_mutex_destroy(&e->mu); goto oom; }
    if (pthread_cond_init(&e->idle, NULL)) { pthread_cond_destroy(&e->wake); pthread_mutex_destroy(&e->mu); goto oom; }
    krun_model_set_layer_hook(m, sweep_layer_done, e);
    if (pthread_create(&e->thread, NULL, engine_main, e)) {
        krun_err_set(err, KRUN_ENOMEM, "cannot start the engine thread: %s", strerror(errno));
        pthread_cond_destroy(&e->idle);
        pthread_cond_destroy(&e->wake);
        pthread_mutex_destroy(&e->mu);
        free(e->active);
        free(e->drafts);
        free(e);
        return -1;
    }
    e->have_thread = 1;
    *out = e;
    return 0;
oom:
    free(e->active);
    free(e->drafts);
    free(e);
    krun_err_set(err, KRUN_ENOMEM, "out of memory");
    return -1;
}

void srv_engine_drain(srv_engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->draining = 1;
    pthread_mutex_unlock(&e->mu);
}

int srv_engine_wait_idle(srv_engine *e, double timeout, volatile int *interrupt)
{
    double end = know() + timeout;
    int idle;
    pthread_mutex_lock(&e->mu);
    while ((e->n_active || e->n_queued || e->n_open) && !(interrupt && *interrupt) && (timeout < 0 || know() < end)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&e->idle, &e->mu, &ts);
    }
    idle = !e->n_active && !e->n_queued && !e->n_open;
    pthread_mutex_unlock(&e->mu);
    return idle;
}

void srv_engine_cancel_all(srv_engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->draining = 1;
    e->cancel_all = 1;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
}

void srv_engine_release(srv_engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->held = 0;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
}

void srv_engine_stop(srv_engine *e)
{
    if (!e) return;
    if (e->have_thread) {
        pthread_mutex_lock(&e->mu);
        e->draining = e->cancel_all = e->quit = 1;
        pthread_cond_signal(&e->wake);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    pthread_cond_destroy(&e->idle);
    pthread_cond_destroy(&e->wake);
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->mask_mu);
    kmask_index_free(e->mask_index);
    free(e->echo_logits);
    free(e->active);
    free(e->drafts);
    free(e);
}

const kmask_index *srv_engine_mask_index(srv_engine *e, krun_err *err)
{
    kmask_index *ix;
    pthread_mutex_lock(&e->mask_mu);
    if (!e->mask_index) e->mask_index = kmask_index_new(krun_model_tokenizer(e->m), e->vocab, err);
    ix = e->mask_index;
    pthread_mutex_unlock(&e->mask_mu);
    return ix;
}

void srv_engine_count_response(srv_engine *e, int endpoint, int status)
{
    int c = status / 100;
    if (endpoint < 0 || endpoint >= SRV_N_EP) endpoint = SRV_EP_OTHER;
    pthread_mutex_lock(&e->mu);
    e->responses[endpoint][c >= 1 && c <= 5 ? c : 0]++;
    pthread_mutex_unlock(&e->mu);
}

/* The Prometheus text exposition format 0.0.4: # HELP, # TYPE, then samples. */
static void metric(kbuf *b, const char *name, const char *type, const char *help, double v)
{
    char line[512];
    snprintf(line, sizeof line, "# HELP krun_%s %s\n# TYPE krun_%s %s\nkrun_%s %.17g\n", name, help, name, type, name, v);
    kbuf_puts(b, line);
}

char *srv_engine_metrics(srv_engine *e)
{
    static const char *const ep[SRV_N_EP] = {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
                                             "/tokenize", "/detokenize", "/v1/models", "/health", "/metrics", "/machine", "/v1/responses",
                                             "/api", "other"};
    kbuf b = {0};
    krun_stats ks;
    char line[256];
    krun_model_stats(e->m, &ks);
    pthread_mutex_lock(&e->mu);
    kbuf_puts(&b, "# HELP krun_responses_total HTTP responses by endpoint and status class.\n# TYPE krun_responses_total counter\n");
    for (int i = 0; i < SRV_N_EP; i++)
        for (int c = 1; c <= 5; c++) {
            if (!e->responses[i][c]) continue;
            snprintf(line, sizeof line, "krun_responses_total{endpoint=\"%s\",status=\"%dxx\"} %llu\n", ep[i], c,
                     (unsigned long long)e->responses[i][c]);
            kbuf_puts(&b, line);
        }
    metric(&b, "requests_total", "counter", "Generation requests accepted by the engine.", (double)e->st.requests);
    metric(&b, "requests_completed_total", "counter", "Generation requests completed.", (double)e->st.completed);
    metric(&b, "requests_failed_total", "counter", "Generation requests failed.", (double)e->st.failed);
    metric(&b, "requests_cancelled_total", "counter", "Generation requests whose client went away.", (double)e->st.cancelled);
    metric(&b, "prompt_tokens_total", "counter", "Prompt tokens submitted (an n > 1 request's once).", (double)e->st.prompt_tokens);
    metric(&b, "generated_tokens_total", "counter", "Tokens generated.", (double)e->st.generated);
    metric(&b, "sweeps_total", "counter", "Forward sweeps run.", (double)e->st.sweeps);
    metric(&b, "positions_total", "counter", "Positions run by the sweeps.", (double)e->st.positions);
    metric(&b, "prefill_seconds_total", "counter", "Seconds of sweeps that ran prompt positions.", e->st.prefill_seconds);
    metric(&b, "decode_seconds_total", "counter", "Seconds of sweeps that ran only decoding steps.", e->st.sweep_seconds - e->st.prefill_seconds);
    metric(&b, "queue_depth", "gauge", "Requests waiting for a sequence.", (double)e->n_queued);
    metric(&b, "live_sequences", "gauge", "Sequences running.", (double)e->n_active);
    metric(&b, "damaged", "gauge", "1 when the model file was found damaged.", e->damaged);
    metric(&b, "cached_prompt_tokens_total", "counter", "Prompt tokens served by the prefix cache (not run).", (double)e->st.cached_tokens);
    metric(&b, "copied_prompt_tokens_total", "counter", "Prompt tokens of n > 1 choices copied from choice 0's state (not run).",
           (double)e->st.copied_tokens);
    metric(&b, "speculation_verifications_total", "counter", "Sequences that verified drafts in a sweep.", (double)e->st.verifications);
    metric(&b, "speculation_drafted_total", "counter", "Draft tokens verified.", (double)e->st.drafted);
    metric(&b, "speculation_accepted_total", "counter", "Draft tokens kept (part of generated_tokens_total).", (double)e->st.accepted);
    metric(&b, "speculation_drafter_verifications_total", "counter", "Sequences that verified the EAGLE drafter's drafts in a sweep.",
           (double)e->st.dr_verifications);
    metric(&b, "speculation_drafter_drafted_total", "counter", "The EAGLE drafter's draft tokens verified.", (double)e->st.dr_drafted);
    metric(&b, "speculation_drafter_accepted_total", "counter", "The EAGLE drafter's draft tokens kept.", (double)e->st.dr_accepted);
    metric(&b, "tokens_per_sweep", "gauge", "Tokens generated per sweep (speculation makes it exceed the sequences decoding).",
           e->st.sweeps ? (double)e->st.generated / (double)e->st.sweeps : 0.0);
    metric(&b, "bytes_per_generated_token", "gauge", "Bytes read per token generated (prompts included).",
           e->st.generated ? (double)e->st.bytes_read / (double)e->st.generated : 0.0);
    pthread_mutex_unlock(&e->mu);
    if (e->cache) {
        krun_pcache_stats cs;
        krun_pcache_get_stats(e->cache, &cs);
        metric(&b, "prefix_cache_lookups_total", "counter", "Requests that looked for a kept state.", (double)cs.lookups);
        metric(&b, "prefix_cache_hits_total", "counter", "Requests started from a kept state.", (double)cs.hits);
        metric(&b, "prefix_cache_disk_hits_total", "counter", "Requests started from a kept state read from disk.", (double)cs.hits_disk);
    }
    kbuf_puts(&b, "# HELP krun_bytes_read_total Bytes read from the model file, by kind.\n# TYPE krun_bytes_read_total counter\n");
    {
        static const char *const kind[] = {"trunk", "head", "experts", "globals", "resident"};
        const uint64_t v[] = {ks.bytes_trunk, ks.bytes_head, ks.bytes_experts, ks.bytes_globals, ks.bytes_resident};
        for (int i = 0; i < 5; i++) {
            snprintf(line, sizeof line, "krun_bytes_read_total{kind=\"%s\"} %llu\n", kind[i], (unsigned long long)v[i]);
            kbuf_puts(&b, line);
        }
    }
    metric(&b, "expert_cache_hits_total", "counter", "Routed experts already resident when asked for.", (double)ks.expert_hits);
    metric(&b, "expert_cache_misses_total", "counter", "Routed experts read from the file.", (double)ks.expert_misses);
    metric(&b, "io_wait_seconds_total", "counter", "Seconds compute waited for reads.", ks.io_wait_seconds);
    metric(&b, "uptime_seconds", "gauge", "Seconds since the engine started.", know() - e->t0);
    kbuf_add(&b, "", 1);
    if (b.oom) { kbuf_free(&b); return NULL; }
    return b.p;
}

const char *srv_engine_model_name(const srv_engine *e) { return e->model_name; }
krun_model *srv_engine_model(srv_engine *e) { return e->m; }
const char *srv_engine_command(const srv_engine *e) { return e->command; }
int srv_engine_ctx_lenient(const srv_engine *e) { return e->ctx_lenient; }
int srv_engine_default_effort(const srv_engine *e) { return e->default_effort_set ? e->default_effort : -1; }

/* The prefix cache's counters for /health. */
static json_t *pcache_json(krun_pcache *c)
{
    json_t *j = json_object();
    krun_pcache_stats st;
    const char *dir = krun_pcache_dir(c);
    krun_pcache_get_stats(c, &st);
#define PUT(name, v) json_object_set_new(j, name, json_integer((json_int_t)(v)))
    json_object_set_new(j, "dir", dir ? json_string(dir) : json_null());
    PUT("lookups", st.lookups);
    PUT("hits", st.hits);
    PUT("hits_disk", st.hits_disk);
    PUT("positions_reused", st.positions_reused);
    PUT("entries_made", st.made);
    PUT("entries_ram", st.entries_ram);
    PUT("bytes_ram", st.bytes_ram);
    PUT("entries_disk", st.entries_disk);
    PUT("bytes_disk", st.bytes_disk);
    PUT("written", st.written);
    PUT("write_failed", st.write_failed);
    PUT("evicted", st.evicted);
    PUT("damaged", st.damaged);
#undef PUT
    return j;
}

/* Each request running or queued: its prompt, how much of it is read, what it generated. */
static json_t *requests_json_locked(srv_engine *e)
{
    json_t *a = json_array();
    for (size_t k = 0; k < e->n_active; k++) {
        const sreq *r = e->active[k];
        json_t *o = json_object();
        json_object_set_new(o, "id", json_string(r->id));
        json_object_set_new(o, "state", json_string(r->prefilled < r->n_prompt ? "prefill" : "generating"));
        json_object_set_new(o, "prompt_tokens", json_integer((json_int_t)r->n_prompt));
        json_object_set_new(o, "prefilled", json_integer((json_int_t)r->prefilled));
        json_object_set_new(o, "cached_tokens", json_integer((json_int_t)r->cached));
        json_object_set_new(o, "in_sweep", json_integer((json_int_t)r->in_sweep));
        json_object_set_new(o, "generated", json_integer((json_int_t)r->generated));
        json_object_set_new(o, "seconds", json_real(know() - r->t_submit));
        json_array_append_new(a, o);
    }
    for (const sreq *r = e->qhead; r; r = r->next_in_queue) {
        json_t *o = json_object();
        json_object_set_new(o, "id", json_string(r->id));
        json_object_set_new(o, "state", json_string("queued"));
        json_object_set_new(o, "prompt_tokens", json_integer((json_int_t)r->n_prompt));
        json_object_set_new(o, "seconds", json_real(know() - r->t_submit));
        json_array_append_new(a, o);
    }
    return a;
}

json_t *srv_engine_health(srv_engine *e, int *status)
{
    json_t *j = json_object(), *st = json_object();
    const kmemplan *p = krun_model_plan(e->m);
    size_t prefilling = 0;
    krun_err ch;
    int changed = krun_model_file_changed(e->m, &ch);      /* one fstat: the file may change while no sweep runs */
    pthread_mutex_lock(&e->mu);
    if (changed && !e->damaged) {
        /* the sweeps that run on it fail (k3_forward); new requests are refused from now on */
        e->damaged = 1;
        snprintf(e->damage, sizeof e->damage, "%s", ch.msg);
    }
    for (size_t k = 0; k < e->n_active; k++) prefilling += e->active[k]->fed < e->active[k]->n_prompt;
    *status = e->damaged ? 503 : 200;
    json_object_set_new(j, "status", json_string(e->damaged == 2 ? "unavailable" : e->damaged ? "damaged" : e->draining ? "draining" : "ok"));
    json_object_set_new(j, "model", json_string(e->model_name));
    json_object_set_new(j, "file", json_string(krun_model_path(e->m)));
    json_object_set_new(j, "damage", e->damaged ? json_string(e->damage) : json_null());
    json_object_set_new(j, "file_warning", krun_model_warning(e->m) ? json_string(krun_model_warning(e->m)) : json_null());
    json_object_set_new(j, "ctx", json_integer((json_int_t)e->ctx));
    json_object_set_new(j, "max_seqs", json_integer((json_int_t)e->max_seqs));
    json_object_set_new(j, "block", json_integer((json_int_t)e->block));
    json_object_set_new(j, "live_sequences", json_integer((json_int_t)e->n_active));
    json_object_set_new(j, "prefilling", json_integer((json_int_t)prefilling));
    json_object_set_new(j, "queued", json_integer((json_int_t)e->n_queued));
    json_object_set_new(j, "max_queue", json_integer((json_int_t)e->max_queue));
    json_object_set_new(j, "block_prefill", json_integer((json_int_t)krun_model_block_max(e->m)));
    json_object_set_new(j, "requests", requests_json_locked(e));
    if (e->sweep_T) {
        json_t *w = json_object();
        json_object_set_new(w, "positions", json_integer((json_int_t)e->sweep_T));
        json_object_set_new(w, "layout", json_string(e->sweep_prefill ? "prefill" : "decoding"));
        json_object_set_new(w, "layers_done", json_integer(atomic_load(&e->sweep_layer)));
        json_object_set_new(w, "layers", json_integer(e->n_layers));
        json_object_set_new(j, "sweep", w);
    } else {
        json_object_set_new(j, "sweep", json_null());
    }
    json_object_set_new(st, "requests", json_integer((json_int_t)e->st.requests));
    json_object_set_new(st, "completed", json_integer((json_int_t)e->st.completed));
    json_object_set_new(st, "failed", json_integer((json_int_t)e->st.failed));
    json_object_set_new(st, "cancelled", json_integer((json_int_t)e->st.cancelled));
    json_object_set_new(st, "prompt_tokens", json_integer((json_int_t)e->st.prompt_tokens));
    json_object_set_new(st, "cached_tokens", json_integer((json_int_t)e->st.cached_tokens));
    json_object_set_new(st, "copied_tokens", json_integer((json_int_t)e->st.copied_tokens));
    json_object_set_new(st, "generated_tokens", json_integer((json_int_t)e->st.generated));
    json_object_set_new(st, "sweeps", json_integer((json_int_t)e->st.sweeps));
    json_object_set_new(st, "positions", json_integer((json_int_t)e->st.positions));
    json_object_set_new(st, "sweep_seconds", json_real(e->st.sweep_seconds));
    json_object_set_new(st, "bytes_read", json_integer((json_int_t)e->st.bytes_read));
    /* the sweeps that ran prompt positions (the others only decoded) */
    json_object_set_new(st, "prefill_sweeps", json_integer((json_int_t)e->st.prefill_sweeps));
    json_object_set_new(st, "prefill_seconds", json_real(e->st.prefill_seconds));
    json_object_set_new(st, "prefill_bytes_read", json_integer((json_int_t)e->st.prefill_bytes_read));
    json_object_set_new(st, "prefill_generated_tokens", json_integer((json_int_t)e->st.prefill_generated));
    json_object_set_new(st, "phase_switches", json_integer((json_int_t)e->st.phase_switches));
    {
        /* speculation: of the generated tokens, `accepted` came from drafts verified in sweeps */
        json_t *sp = json_object();
        json_object_set_new(sp, "max_drafts", json_integer((json_int_t)e->spec));
        json_object_set_new(sp, "verifications", json_integer((json_int_t)e->st.verifications));
        json_object_set_new(sp, "drafted", json_integer((json_int_t)e->st.drafted));
        json_object_set_new(sp, "accepted", json_integer((json_int_t)e->st.accepted));
        json_object_set_new(sp, "acceptance", e->st.drafted ? json_real((double)e->st.accepted / (double)e->st.drafted) : json_null());
        json_object_set_new(sp, "tokens_per_sweep", e->st.sweeps ? json_real((double)e->st.generated / (double)e->st.sweeps) : json_null());
        json_object_set_new(sp, "bytes_per_generated_token", e->st.generated ? json_real((double)e->st.bytes_read / (double)e->st.generated)
                                                                                : json_null());
        if (krun_model_draft(e->m)) {
            json_t *d = json_object();
            json_object_set_new(d, "file", json_string(krun_model_draft(e->m)));
            json_object_set_new(d, "verifications", json_integer((json_int_t)e->st.dr_verifications));
            json_object_set_new(d, "drafted", json_integer((json_int_t)e->st.dr_drafted));
            json_object_set_new(d, "accepted", json_integer((json_int_t)e->st.dr_accepted));
            json_object_set_new(d, "acceptance", e->st.dr_drafted ? json_real((double)e->st.dr_accepted / (double)e->st.dr_drafted) : json_null());
            json_object_set_new(sp, "drafter", d);
        } else {
            json_object_set_new(sp, "drafter", json_null());
        }
        json_object_set_new(st, "speculation", sp);
    }
    json_object_set_new(st, "uptime_seconds", json_real(know() - e->t0));
    {
        /* the process's CPU time: against sweep_seconds it says whether sweeps wait for the disk or compute */
        struct rusage ru;
        if (!getrusage(RUSAGE_SELF, &ru))
            json_object_set_new(st, "cpu_seconds", json_real((double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
                                                             (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6));
    }
    pthread_mutex_unlock(&e->mu);
    json_object_set_new(j, "stats", st);
    json_object_set_new(j, "plan", p ? kmemplan_json(p) : json_null());
    json_object_set_new(j, "prefix_cache", e->cache ? pcache_json(e->cache) : json_null());
    return j;
}
