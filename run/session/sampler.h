/* Choosing the next token from the logits: penalties, a token mask, greedy
 * or temperature sampling with top-k / min-p / top-p, and a random draw that
 * depends only on (seed, stream, position); plus the log-probabilities of the
 * model's distribution.  The scratch comes from the caller (a session's slot):
 * picking allocates nothing.
 *
 * ---- What ksampler_pick computes, in this order (the contract) -----------------------------
 *
 * The token chosen at position `pos` of a sequence (from the logits of position pos - 1) is a
 * function of those logits, the options, the sequence before it (tokens[0..pos)), where its
 * reply begins (reply_from) and the mask: nothing else.  In particular it does not depend on
 * how many tokens were drawn before, so a verification block that computes the logits of
 * several positions at once picks, at each, exactly the token plain decoding would
 * (speculative decoding at any temperature, docs/RUNTIME.md §7).
 *
 *  1. Penalties, on a copy of the logits (the caller's are never changed), each step rounded
 *     to float, token by token:
 *       repetition_penalty r (vLLM's; 1 = off): every token that occurs in tokens[0..pos), the
 *         prompt and the reply alike:  w = w > 0 ? w / r : w * r
 *       frequency_penalty f, presence_penalty p (OpenAI's; 0 = off), over the reply,
 *         tokens[reply_from..pos), c the token's occurrences there (as a float):
 *         w = w - c * f, then, if c > 0, w = w - p
 *     A penalized logit that is not finite (a huge r) becomes +-FLT_MAX.
 *  2. The mask (constrained decoding): with `allowed` (a bitmap of n bits, bit i of word i/64
 *     for token i), only tokens whose bit is set are candidates.  It applies before the
 *     temperature and every filter: a masked token is never picked, and the ranks of top-k
 *     and the maximum of min-p are among the allowed tokens.  No allowed token: -1.
 *  3. temp <= 0: the candidate with the largest w, the lowest id on ties (greedy).
 *  4. temp > 0: x_i = exp(((double)w_i - (double)w_max) / temp) for every candidate i, w_max
 *     the largest candidate w (so the most likely token has x = 1).  Then the filters, each on
 *     what the one before left; the canonical order is w descending, ties to the lower id:
 *       top_k k > 0:  the first k candidates in the canonical order;
 *       min_p m > 0:  those with x_i >= m (m times the largest probability);
 *       top_p P < 1:  the shortest prefix, in the canonical order, of what is left whose
 *                     running sum of x (double, in that order) reaches P * Z, Z the sum of the
 *                     x left (double, in id order).
 *  5. The draw: u = ksampler_draw(seed, stream, pos) in [0, 1), t = u * Z' with Z' the sum of
 *     the kept x in id order; the token is the first kept id i, in id order, for which
 *     t < x_0 + ... + x_i (kept ones only, a running double sum in id order); the last kept
 *     id if rounding leaves none.
 *
 * The draw (ksampler_draw) is Philox4x64-10 (Salmon et al., "Parallel random numbers: as
 * easy as 1, 2, 3", SC 2011; the generator of Random123, numpy's Philox, cuRAND) keyed by
 * (seed, stream) with the counter (pos, 0, 0, 0): the first output word's top 53 bits,
 * times 2^-53.  A counter-based generator: any position's draw is computed directly, with no
 * state carried from one draw to the next.  `stream` (0 by default) separates sequences
 * that share a seed (the n choices of one request: one stream each).
 *
 * Until this sampler (2026-12), krun drew from a xoshiro256** stream advanced once per
 * sampled token and walked the probabilities in descending order: a given seed gives other
 * tokens now (greedy output is unchanged).
 *
 * ---- Log-probabilities ------------------------------------------------------------------------
 *
 * ksampler_logprobs is what OpenAI's `logprobs` report: the log-softmax of the raw logits (the
 * model's distribution: before penalties, the mask, the temperature and the filters),
 *   lp_i = ((double)l_i - (double)l_max) - log(Z),  Z = sum_j exp((double)l_j - (double)l_max)
 * with Z summed in double in id order, so the same logits give the same bits; and the top_n
 * most likely tokens (the canonical order of the raw logits: larger first, ties to the lower
 * id).
 *
 * ---- Who sets what ------------------------------------------------------------------------------
 *
 * The options come from the user (ksampler_opts_init gives greedy, no filter, no penalty;
 * a zeroed struct is the same, its repetition_penalty 0 read as 1).  The sequence
 * (ksampler_seq) comes from the session: krun_session_sample and the speculative verification
 * fill it from the session's history, its reply start (krun_session_set_reply_start) and its
 * mask callback (krun_session_set_mask, which fills `allowed` for each position). */
#ifndef KRUN_SAMPLER_H
#define KRUN_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

typedef struct ksampler_opts {
    float temp;                /* 0 = greedy */
    int top_k;                 /* 0 = off */
    float top_p;               /* 1 = off; 0..1 */
    float min_p;               /* 0 = off; 0..1 */
    uint64_t seed;
    float presence_penalty;    /* 0 = off (OpenAI: -2..2) */
    float frequency_penalty;   /* 0 = off (OpenAI: -2..2) */
    float repetition_penalty;  /* 1 = off, > 0 (0 is read as 1, so a zeroed struct has no penalty) */
    uint64_t stream;           /* the draw's second key word (0): sequences sharing a seed, one stream each */
} ksampler_opts;

/* Greedy, no filter, no penalty, seed 0, stream 0. */
void ksampler_opts_init(ksampler_opts *o);

/* What the pick needs of the sequence: the token chosen is at position pos. */
typedef struct ksampler_seq {
    const int32_t *tokens;     /* tokens[0..pos): the sequence before it (prompt, then reply) */
    size_t pos;                /* the position of the token chosen: the draw's counter */
    size_t reply_from;         /* tokens[reply_from..pos) are the reply (frequency and presence penalties) */
    const uint64_t *allowed;   /* NULL (every token), or a bitmap of n bits: the candidates */
} ksampler_seq;

/* Scratch for a vocabulary of cap tokens (a session's slot holds one). */
typedef struct ksampler_scratch {
    uint32_t *order;           /* [cap] ids, heap-ordered while filtering */
    double *prob;              /* [cap] x_i of the kept tokens, -1 for the others */
    float *work;               /* [cap] the penalized logits */
    uint32_t *count;           /* [cap] occurrences in the sequence: zero between picks */
} ksampler_scratch;

typedef struct ksampler {
    ksampler_opts o;
    ksampler_scratch x;
    size_t cap;
} ksampler;

/* x: room for cap entries each (the vocabulary); count is zeroed here. */
void ksampler_init(ksampler *s, const ksampler_opts *o, const ksampler_scratch *x, size_t cap);
int32_t ksampler_argmax(const float *logits, size_t n);
/* The token chosen from logits[0..n) at q->pos (q NULL: position 0, no history, no mask),
 * by the contract above; -1 if n exceeds the scratch or no token is allowed. */
int32_t ksampler_pick(ksampler *s, const float *logits, size_t n, const ksampler_seq *q);
/* 1 if the pick at this setting depends on the sequence (penalties), so a caller knows
 * whether the history matters. */
int ksampler_uses_history(const ksampler_opts *o);

/* The draw at a position: uniform in [0, 1) with 53 random bits (Philox4x64-10 above). */
double ksampler_draw(uint64_t seed, uint64_t stream, uint64_t pos);
/* The generator itself: Philox4x64-10 of a 256-bit counter under a 128-bit key (the
 * known-answer vectors of Random123 and numpy's Philox check it). */
void ksampler_philox(const uint64_t ctr[4], const uint64_t key[2], uint64_t out[4]);

/* Log-probabilities of the model's distribution (above): returns lp of token id (id in
 * [0, n)); top_n of the most likely go to top_ids / top_lp (either may be NULL when top_n is
 * 0), the most likely first.  Allocates nothing; O(n * (1 + top_n)) at worst. */
double ksampler_logprobs(const float *logits, size_t n, int32_t id, size_t top_n, int32_t *top_ids, double *top_lp);

#endif
