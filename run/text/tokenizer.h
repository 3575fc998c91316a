/* Kimi (K2 / Kimi-Linear / K3) tokenizer: tiktoken-style rank BPE.
 *
 * Behaviour follows Moonshot's TikTokenTokenizer (tokenization_kimi.py) over Python tiktoken,
 * as documented in shared/fixtures/tokenizer/README.md and spec/K3_MODEL.md §6:
 *   - the text is cut into slices of at most 400,000 code points, and each slice wherever a run of
 *     whitespace (str.isspace) or of non-whitespace would exceed 25,000 code points;
 *   - within each part, special-token strings are matched first (when allowed), and the rest is
 *     split with the Kimi pre-tokenizer pattern (PCRE2 translation of pat_str) and rank-BPE'd.
 *
 * A loaded ktok is immutable: any number of threads may call the encode/decode functions on the
 * same ktok at once (each call allocates its own scratch and PCRE2 match state).
 *
 * Text is UTF-8.  Invalid UTF-8 is accepted and kept byte-exact (decode(encode(x)) == x for any
 * bytes): a maximal run of valid text is split with the regex as usual, and each invalid byte
 * becomes a piece of its own (it counts as one non-whitespace code point for the 25,000 cut).
 * The upstream tokenizer only ever sees valid text, so this is outside its domain.
 */
#ifndef KRUN_TOKENIZER_H
#define KRUN_TOKENIZER_H
#include "run/util/krun_err.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ktok ktok;
typedef struct { int32_t id; const char *text; } ktok_special;

/* Upstream constants of TikTokenTokenizer.encode(). */
#define KTOK_MAX_ENCODE_CHARS   400000   /* code points per slice */
#define KTOK_MAX_RUN_CHARS      25000    /* longest run of (non-)whitespace fed to tiktoken at once */

/* rank_file: bytes of a tiktoken.model ("base64 SP rank\n" lines; ranks must be 0..n-1 in any order,
 * no duplicate ranks or byte strings; empty lines are ignored, CRLF is accepted; every single byte
 * must have a rank).
 * specials: added tokens (id, literal text; non-empty valid UTF-8, distinct ids and texts); ids must
 * not collide with ranks (id >= n_ranks).  The texts are copied.
 * Errors: returns NULL and err names the problem (e.g. "tiktoken.model line 17: bad base64";
 * KRUN_EINPUT, or KRUN_ENOMEM). */
ktok *ktok_load(const char *rank_file, size_t len, const ktok_special *specials, size_t n_specials, krun_err *err);
void ktok_free(ktok *);

/* Parse added_tokens_decoder of a tokenizer_config.json (ids taken from the KEYS, text from
 * "content"); the list is sorted by id.  Returns 0, or -1 with a message in err.
 * Caller frees with ktok_specials_free. */
int  ktok_specials_from_config(const char *json, size_t len, ktok_special **out, size_t *n, krun_err *err);
void ktok_specials_free(ktok_special *, size_t n);
/* Add "<|reserved_token_{id}|>" for every id in [first, first+count) not already in the list, as
 * tokenization_kimi.py does for the 256-id block after the ranks; the list stays sorted by id.
 * Returns 0, or -1 on allocation failure (the list is then unchanged). */
int  ktok_specials_fill_reserved(ktok_special **list, size_t *n, int32_t first, int32_t count);
/* The K3 and K2 256-entry tables of README §4 (named ids, every other id in 163584..163839 named
 * <|reserved_token_{id}|>), sorted by id.  family: "k3" or "k2".  Returns 0, or -1 for an unknown
 * family or allocation failure.  Free with ktok_specials_free. */
int  ktok_specials_builtin(const char *family, ktok_special **out, size_t *n);

/* encode() as Moonshot's TikTokenTokenizer.encode (README §3): 400k/25k cuts; special strings are
 * matched (longest match at the earliest position) when allow_special, otherwise they are ordinary
 * text.  *ids is malloc'd (caller frees; may be NULL when *n_ids == 0).  Returns 0, -1 on error
 * (allocation failure or a regex engine failure). */
int  ktok_encode(const ktok *, const char *text, size_t len, int allow_special,
                 int32_t **ids, size_t *n_ids);
/* Rank-BPE of one pre-tokenized piece (no regex, no specials): lowest-rank merge first, leftmost on
 * ties.  Same return convention as ktok_encode. */
int  ktok_encode_piece(const ktok *, const uint8_t *piece, size_t len, int32_t **ids, size_t *n_ids);
/* The regex pieces of a text with no specials (no 400k/25k cuts): *piece_ends[i] is the byte offset
 * one past piece i; pieces are contiguous and cover the text.  Caller frees. */
int  ktok_split(const ktok *, const char *text, size_t len, size_t **piece_ends, size_t *n_pieces);

/* Bytes of one id (rank bytes, or the special's literal text); NULL for an unknown id.  The
 * pointer stays valid until ktok_free; the bytes are not NUL-terminated. */
const uint8_t *ktok_id_bytes(const ktok *, int32_t id, size_t *len);
/* Concatenated bytes of ids; unknown ids are skipped (as upstream does).  *out is malloc'd and
 * NUL-terminated (not counted in *out_len).  Returns the number of skipped ids, or -1 on OOM. */
long ktok_decode(const ktok *, const int32_t *ids, size_t n, uint8_t **out, size_t *out_len);
size_t  ktok_vocab_size(const ktok *);                       /* max id + 1 */
size_t  ktok_n_ranks(const ktok *);                          /* ids 0..n_ranks-1 are ranks */
int32_t ktok_find_special(const ktok *, const char *text);   /* exact special text -> id, -1 if none */
int     ktok_is_special(const ktok *, int32_t id);
int32_t ktok_rank_of(const ktok *, const uint8_t *bytes, size_t len);  /* -1 if not a rank */
/* Whether the regex uses PCRE2's JIT (results are identical either way). */
int     ktok_uses_jit(const ktok *);
/* Turn the JIT off (0) or back on (1, if it compiled); returns the new ktok_uses_jit().  For tests
 * and diagnosis; must not race with encode calls on the same ktok. */
int     ktok_set_jit(ktok *, int enable);

/* Streaming output: how many leading bytes of buf form complete UTF-8 sequences (an incomplete
 * trailing sequence of up to 3 bytes is held back; invalid bytes are passed through, never held
 * forever: a trailing fragment is held only while it is still a valid prefix of a sequence). */
size_t  ktok_utf8_complete(const uint8_t *buf, size_t len);

#endif
