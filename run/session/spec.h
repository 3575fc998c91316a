/* Drafting for speculative decoding: prompt lookup over the sequence's own
 * history (its prompt included), and in a server over the other live
 * sequences' (docs/RUNTIME.md §7).
 *
 * The draft is what followed the last time the history's most recent tokens
 * occurred: find the longest suffix of the history (at least `need` tokens,
 * at most KSPEC_MAX_MATCH) that also occurs earlier, take the most recent
 * such occurrence, and propose the tokens that came after it (running on
 * into the draft itself when the occurrence overlaps the suffix, so a
 * repeating cycle is drafted as far as allowed).  A draft stops before any
 * stop id: a stop token is only ever the model's own choice.
 *
 * Drafting only pays when drafts are accepted: a rejected draft costs the
 * bytes of the experts its positions chose (streaming) or their arithmetic
 * (resident), and gains nothing.  So the drafter adapts, per sequence:
 *  - evidence: a match must be `need` tokens long, KSPEC_MIN_MATCH at first;
 *    each verification that accepts nothing raises it by one (up to
 *    KSPEC_MAX_MATCH), each that accepts something brings it back;
 *  - length: the first draft is at most KSPEC_FIRST_DRAFT tokens; a
 *    verification that accepts every draft doubles the next draft length (up
 *    to the maximum), one that rejects a draft sets it to what was accepted
 *    plus one.
 * On text without repetition nothing matches and nothing is drafted: the
 * decoding is exactly the plain one, token by token. */
#ifndef KRUN_SPEC_H
#define KRUN_SPEC_H

#include <stddef.h>
#include <stdint.h>

#define KSPEC_MIN_MATCH 3   /* tokens of context a draft needs at first */
#define KSPEC_MAX_MATCH 8   /* longer matches are not looked for */
#define KSPEC_MAX_DRAFT 64  /* --spec N: N <= this */
#define KSPEC_FIRST_DRAFT 2 /* the first draft's length: a first match may be chance */

typedef struct kspec {
    size_t max;             /* drafts per verification, at most */
    size_t len;             /* the next draft's length, at most (adaptive) */
    size_t need;            /* the match length a draft needs now (adaptive) */
} kspec;

void kspec_init(kspec *d, size_t max);
/* A draft for the history h[0..n): up to min(limit, d->len) tokens into out;
 * returns how many (0: no evidence). */
size_t kspec_draft(const kspec *d, const int32_t *h, size_t n, size_t limit, const int32_t *stop, size_t n_stop, int32_t *out);
/* A draft for h[0..n) from another sequence o[0..m) (another live
 * conversation): what followed, in o, the most recent occurrence of the
 * longest suffix of h (the same evidence rule, need tokens at least); no
 * running on past o's end.  Returns how many (0: no evidence). */
size_t kspec_draft_from(const kspec *d, const int32_t *h, size_t n, const int32_t *o, size_t m, size_t limit,
                        const int32_t *stop, size_t n_stop, int32_t *out);
/* What the verification of a draft of `drafted` tokens accepted. */
void kspec_result(kspec *d, size_t drafted, size_t accepted);

#endif
