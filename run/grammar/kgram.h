/* Grammars for constrained decoding: a recursive automaton over bytes and the chat markers, and
 * the sets of parses ("threads") that a text so far leaves alive.
 *
 * A grammar is a graph of nodes.  Consuming nodes take one symbol: a byte of a set (KG_BYTES), a
 * chat marker (KG_SYM: <|open|> <|close|> <|sep|> <|end_of_msg|>, which are special token ids and
 * never bytes of text), or a run of text (KG_BODY: a JSON string's content, a raw text with a
 * length range, or free text).  The other nodes move without consuming: a choice (KG_SPLIT), a call
 * of a rule (KG_CALL: push, run the rule, come back), the end of a rule (KG_RET), the end of the
 * whole text (KG_ACCEPT), and a counter per call frame (KG_CZERO, KG_CINC, and the guards KG_CGE,
 * KG_CLT) for bounds on repetitions.  JSON Schema compiles to this (kschema.h); so does the shape of
 * a K3 reply (chat_constrain.c).
 *
 * A thread is a stack of frames (node, counter, text state), at most KG_MAX_DEPTH deep; a state is
 * the set of threads the text so far leaves alive, at most KG_MAX_THREADS (deduplicated, in a fixed
 * order: the same text gives the same state, bit for bit).  Every node knows the least stack depth
 * a way from it to the end needs (kgram_finish), and a thread never moves to a node from which it
 * could not finish within KG_MAX_DEPTH: so a state is never a dead end -- some symbol always
 * continues it, until it accepts -- and parts of a grammar that cannot be completed (an empty
 * enum, minItems over maxItems, a required property that refers to itself) are never entered.
 * Dropping threads beyond KG_MAX_THREADS keeps that true (each kept thread can finish); it only
 * narrows what is allowed.
 *
 * Nothing here allocates while stepping: states live in a caller's buffer (kg_set). */
#ifndef KRUN_KGRAM_H
#define KRUN_KGRAM_H

#include <stddef.h>
#include <stdint.h>

/* Symbols: 0..255 a byte; then the four chat markers (K3_CHAT.md), in chat_seg.h's order. */
enum { KG_SYM_OPEN = 256, KG_SYM_CLOSE, KG_SYM_SEP, KG_SYM_EOM, KG_NSYM };

#define KG_MAX_DEPTH   48      /* frames in a thread */
#define KG_MAX_THREADS 64      /* threads in a state */
#define KG_INF         0x7fffffff

typedef enum {
    KG_FAIL,       /* matches nothing: an alternative that cannot be */
    KG_BYTES,      /* one byte of byte set `set` */
    KG_SYM,        /* the marker symbol `arg` */
    KG_BODY,       /* text of kind `arg` (kg_body_kind) with lo..hi characters */
    KG_SPLIT,      /* on to next and to alt */
    KG_CALL,       /* rule `lo` (starting at alt); back at next */
    KG_RET,        /* back to the caller */
    KG_ACCEPT,     /* the whole text is complete */
    KG_CZERO,      /* the frame's counter := 0 */
    KG_CINC,       /* counter + 1 */
    KG_CGE,        /* on only if counter >= lo (alt: where the repetitions start, for kgram_finish) */
    KG_CLT         /* on only if counter < hi */
} kg_kind;

typedef enum {
    KG_TEXT_JSON,  /* a JSON string's content: escapes (but none of a surrogate or of NUL), valid UTF-8,
                      no control bytes; the closing quote ends it (consumed).  Characters = code points
                      of the decoded string. */
    KG_TEXT_RAW,   /* valid UTF-8, anything else allowed; ends (without consuming) where the next node
                      matches, at a character boundary with at least lo characters */
    KG_TEXT_ATTR,  /* an attribute value of a chat tag: valid UTF-8 without '"', '&', '<' or control
                      bytes; the closing quote ends it (consumed) */
    KG_TEXT_FREE,  /* any bytes, not counted (lo = 0, hi = KG_INF); ends where the next node matches */
    KG_NTEXT
} kg_body_kind;

typedef struct {
    uint8_t kind, arg;
    uint16_t set;
    uint32_t next, alt;
    int32_t lo, hi;
} kg_node;

typedef struct kgram kgram;

/* ---- building --------------------------------------------------------------------------- */
/* Grammars are built back to front: each constructor takes the node to go on to and returns the
 * node that starts it.  Every constructor returns 0 on allocation failure (node 0 is KG_FAIL, so a
 * failure can only narrow the grammar); kgram_oom says whether one happened. */
kgram *kgram_new(void);
void kgram_free(kgram *g);
int kgram_oom(const kgram *g);
uint32_t kg_fail(kgram *g);                                   /* node 0 */
uint32_t kg_ret(kgram *g);                                    /* the one KG_RET node */
uint32_t kg_accept(kgram *g);                                 /* the one KG_ACCEPT node */
uint32_t kg_byteset(kgram *g, const uint8_t set[32], uint32_t next);
uint32_t kg_byte(kgram *g, uint8_t b, uint32_t next);
uint32_t kg_range(kgram *g, uint8_t lo, uint8_t hi, uint32_t next);
uint32_t kg_lit(kgram *g, const char *s, size_t n, uint32_t next);       /* these bytes in a row */
uint32_t kg_sym(kgram *g, int sym, uint32_t next);
uint32_t kg_body(kgram *g, kg_body_kind kind, int32_t lo, int32_t hi, uint32_t next);
uint32_t kg_split(kgram *g, uint32_t a, uint32_t b);
uint32_t kg_node_new(kgram *g, kg_kind kind, uint32_t next, uint32_t alt, int32_t lo, int32_t hi);
void kg_set_next(kgram *g, uint32_t node, uint32_t next, uint32_t alt);  /* for loops: fill in a node made early */
/* Rules: a rule is made (kg_rule_new) before its body so that bodies can call it (recursion);
 * kg_rule_body sets where it starts.  kg_call calls it. */
uint32_t kg_rule_new(kgram *g);
void kg_rule_body(kgram *g, uint32_t rule, uint32_t start);
uint32_t kg_call(kgram *g, uint32_t rule, uint32_t next);
/* The grammar starts at start (whose ways end at kg_accept).  Computes what each node needs to
 * finish (see above).  Returns 0, or -1 when nothing can be accepted within KG_MAX_DEPTH (or an
 * allocation failed). */
int kgram_finish(kgram *g, uint32_t start);

const kg_node *kgram_node(const kgram *g, uint32_t n);
size_t kgram_n_nodes(const kgram *g);
const uint8_t *kgram_byteset(const kgram *g, uint16_t set);

/* ---- states ---------------------------------------------------------------------------- */
/* A set of threads, packed: per thread, its depth d then d frames (node, count, sub).  cap words. */
typedef struct {
    uint32_t *w;
    size_t n, cap;    /* words used, words available */
    unsigned threads;
} kg_set;
#define KG_THREAD_WORDS(d) (1 + 3 * (size_t)(d))
#define KG_SET_WORDS (KG_MAX_THREADS * KG_THREAD_WORDS(KG_MAX_DEPTH))   /* a state's room, at most */

/* The state at the start (the text so far is empty).  out has KG_SET_WORDS words. */
void kgram_start(const kgram *g, kg_set *out);
/* The state after one more symbol (out: KG_SET_WORDS words, distinct from in).  Empty when the
 * symbol does not continue the text. */
void kgram_step(const kgram *g, const kg_set *in, int sym, kg_set *out);
/* Whether the text so far is complete (a thread at KG_ACCEPT). */
int kgram_accepts(const kgram *g, const kg_set *s);
/* The bytes that may come next (a 256-bit set), from any thread. */
void kgram_first_bytes(const kgram *g, const kg_set *s, uint8_t set[32]);

/* The text-run machine, shared with the token tables (tokmask.c).  sub is the state inside a
 * character or escape (0: between characters); *chars counts characters begun.  Returns 1 if the
 * byte continues the text (sub and chars updated), 2 if it ends it (KG_TEXT_JSON / ATTR: the
 * closing quote, consumed; only with at least lo characters), 0 if it cannot come here.  No
 * character begins beyond hi. */
int kg_text_byte(kg_body_kind kind, uint32_t *sub, int32_t *chars, int32_t lo, int32_t hi, uint8_t b);
/* The bytes kg_text_byte would take (continue or end) from sub and chars. */
void kg_text_first(kg_body_kind kind, uint32_t sub, int32_t chars, int32_t lo, int32_t hi, uint8_t set[32]);
/* Text sub-states (kg_text_byte): 0 between characters, then inside a UTF-8 sequence or escape. */
#define KG_TEXT_SUBS 17

#endif
