/* Token masks for constrained decoding: which token ids may come next in a grammar's state
 * (kgram.h), and the state after the one chosen.
 *
 * A token is allowed when its bytes (or its marker, for the four chat markers) walk through the
 * grammar from the state without a dead end.  What does not depend on the grammar is computed
 * once per tokenizer (kmask_index, ~0.1 s for K3's 163,840 ids):
 *   - a trie of every text token's bytes, so that a walk shares prefixes and drops a whole subtree
 *     at its first impossible byte;
 *   - for a state inside a JSON string, a raw text or an attribute value (where a reply spends most
 *     of its tokens),
 *     each token's fate from a character boundary: stays inside (with how many characters it
 *     adds), ends the string at byte k (then only its rest is walked, in a second trie of those
 *     rests), or cannot come; so the mask there is a bit-set copy plus the few hundred tokens
 *     holding a quote;
 *   - free text (the think channel) allows every text token.
 * Special ids other than the markers are never allowed.  The result is a deterministic function
 * of the grammar and the tokens so far.
 *
 * A kmask_index is immutable once built (any thread may use it); a kmask is one sequence's state
 * and workspace (one thread at a time). */
#ifndef KRUN_TOKMASK_H
#define KRUN_TOKMASK_H

#include "kgram.h"
#include "run/text/tokenizer.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kmask_index kmask_index;
typedef struct kmask kmask;

/* The index of tk's tokens for a model vocabulary of vocab ids (ids without bytes are never
 * allowed).  NULL with err on allocation failure. */
kmask_index *kmask_index_new(const ktok *tk, size_t vocab, krun_err *err);
void kmask_index_free(kmask_index *ix);
size_t kmask_index_vocab(const kmask_index *ix);
size_t kmask_index_bytes(const kmask_index *ix);   /* memory it holds */

/* A sequence constrained by g (finished, borrowed: it must outlive the kmask), at its start.
 * NULL on allocation failure. */
kmask *kmask_new(const kmask_index *ix, const kgram *g);
void kmask_free(kmask *m);
/* The ids allowed next, as a bit set of kmask_index_vocab bits (64-bit words, bit i of word i/64).
 * Returns how many, or -1 on allocation failure.  0 only once the text is complete. */
long kmask_allowed(kmask *m, uint64_t *bits);
/* Take the id chosen.  Returns 0, or -1 if the grammar does not allow it (nothing changes). */
int kmask_take(kmask *m, int32_t id);
/* The text so far is complete (the grammar accepts it). */
int kmask_complete(const kmask *m);
/* The grammar state (the tests check masks against it). */
const kg_set *kmask_state(const kmask *m);
/* Trie nodes walked by kmask_allowed so far (its cost, for the measurements). */
uint64_t kmask_steps(const kmask *m);

#endif
