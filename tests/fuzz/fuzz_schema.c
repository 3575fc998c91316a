/* The JSON Schema compiler and the grammar automaton (run/grammar/kschema.c, kgram.c) on arbitrary
 * input: SCHEMA [0xff CHOICES].  The schema (any bytes: mostly not JSON, or not a schema) is
 * compiled twice, as a JSON document's grammar and as a K3 tool call's arguments; a refusal must
 * name a message.  A grammar that compiles is walked, the CHOICES picking each next byte (or
 * chat marker) among those the state allows, and must hold:
 *  - no dead end: a state that is not complete always allows some byte or marker, and the
 *    state after an allowed one is never empty (kgram.h's promise);
 *  - the bytes kgram_first_bytes names are exactly those a step takes (checked on a byte each
 *    step against kgram_step);
 *  - a complete document is JSON that the schema accepts (tests/fuzz/schema_valid.h, an
 *    independent validator); complete K3 arguments, wrapped in a tool call and read back by the
 *    K3 reply parser (chat_parse.c), give a call whose arguments the schema accepts, with nothing
 *    malformed;
 *  - the same input walked twice gives the same text (determinism). */
#include "fuzz.h"
#include "schema_valid.h"

#include "run/text/chat.h"
#include "run/text/jsontext.h"
#include "run/grammar/kgram.h"
#include "run/grammar/kschema.h"

#include <string.h>

#define MAX_WALK 400          /* bytes walked at most (most findings show within a few dozen) */
static int accepted;   /* this input went all the way through (in either form) */
static const char *const MARK[4] = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"};

typedef struct {
    const uint8_t *c;
    size_t n, i;
} choices;

FUZZ_HARNESS_LOOP static unsigned pick(choices *ch, unsigned n)
{
    unsigned v = ch->i < ch->n ? ch->c[ch->i] : 0;
    ch->i++;
    return n ? v % n : 0;
}

FUZZ_HARNESS_LOOP static int has(const uint8_t set[32], unsigned b) { return set[b >> 3] >> (b & 7) & 1; }

/* Walk g; the text (markers spelled out) into out.  Returns 1 if it ended complete.  *spelled:
 * bytes of the text spell "<|" (a marker's start: read back as text, they could be taken for one,
 * which a model's tokens never are). */
FUZZ_HARNESS_LOOP static int walk(const kgram *g, choices *ch, kbuf *out, int *spelled, int markers)
{
    unsigned last = 0;
    static uint32_t wa[KG_SET_WORDS], wb[KG_SET_WORDS], wc[KG_SET_WORDS];
    kg_set a = {wa, 0, KG_SET_WORDS, 0}, b = {wb, 0, KG_SET_WORDS, 0}, c = {wc, 0, KG_SET_WORDS, 0};
    kgram_start(g, &a);
    FUZZ_CHECK(a.threads > 0);
    for (int step = 0; step < MAX_WALK; step++) {
        uint8_t first[32];
        unsigned syms[260], n = 0;
        int done = kgram_accepts(g, &a);
        if (done && (ch->i >= ch->n || pick(ch, 4) == 0)) return 1;
        kgram_first_bytes(g, &a, first);
        for (unsigned w = 0; w < 32; w++)
            for (unsigned bits = first[w]; bits; bits &= bits - 1) syms[n++] = w * 8 + (unsigned)__builtin_ctz(bits);
        for (int k = 0; k < 4 && markers; k++) {
            kgram_step(g, &a, KG_SYM_OPEN + k, &c);
            if (c.threads) syms[n++] = KG_SYM_OPEN + (unsigned)k;
        }
        if (!n) { FUZZ_CHECK(done); return 1; }      /* a dead end is a bug */
        /* the first-byte set is exact: a byte outside it is refused */
        {
            unsigned probe = ch->i < ch->n ? ch->c[ch->i] : (unsigned)step & 255;
            kgram_step(g, &a, (int)probe, &c);
            FUZZ_CHECK(!!c.threads == has(first, probe));
        }
        {
            unsigned s = syms[pick(ch, n)];
            if (ch->i > ch->n) {
                /* out of choices: head for the end (close what is open, then the smallest values) */
                static const char pref[] = "\"}]0nultrefas";
                unsigned best = 0;
                for (unsigned k = 0; k < n; k++) if (syms[k] == KG_SYM_CLOSE || syms[k] == KG_SYM_SEP || syms[k] == KG_SYM_EOM) best = syms[k] + 1;
                for (const char *q = pref; !best && *q; q++)
                    for (unsigned k = 0; k < n && !best; k++) if (syms[k] == (uint8_t)*q) best = syms[k] + 1;
                if (best) s = best - 1;
            }
            kgram_step(g, &a, (int)s, &b);
            FUZZ_CHECK(b.threads > 0);
            if (s < 256) { uint8_t byte = (uint8_t)s; kbuf_add(out, &byte, 1); if (last == '<' && s == '|') *spelled = 1; }
            else kbuf_puts(out, MARK[s - 256]);
            last = s;
        }
        { kg_set t = a; a = b; b = t; }
    }
    return 0;   /* too long: not checked further */
}

static void json_doc(json_t *root, const uint8_t *ch, size_t nch)
{
    kgram *g = kgram_new();
    kschema_ctx *c = g ? kschema_new(g, root) : NULL;
    kschema_err e;
    uint32_t start;
    FUZZ_CHECK(g && c);
    if (kschema_json(c, root, kg_accept(g), &start, &e)) {
        FUZZ_CHECK(e.msg[0]);
    } else if (kgram_finish(g, start) == 0) {
        kbuf t1 = {0}, t2 = {0};
        choices a = {ch, nch, 0}, b = {ch, nch, 0};
        int sp = 0, done = walk(g, &a, &t1, &sp, 0);
        FUZZ_CHECK(walk(g, &b, &t2, &sp, 0) == done && t1.n == t2.n && (!t1.n || !memcmp(t1.p, t2.p, t1.n)));
        if (done) {
            json_error_t je;
            json_t *v = json_loadb(t1.p ? t1.p : "", t1.n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
            if (!v) fprintf(stderr, "not JSON: %.*s (%s)\n", (int)t1.n, t1.p, je.text);
            FUZZ_CHECK(v != NULL);
            if (!sv_valid(root, root, v, 0)) fprintf(stderr, "invalid: %.*s\n", (int)t1.n, t1.p);
            FUZZ_CHECK(sv_valid(root, root, v, 0));
            json_decref(v);
            accepted = 1;
        }
        kbuf_free(&t1);
        kbuf_free(&t2);
    }
    kschema_free(c);
    kgram_free(g);
}

static void k3_args(json_t *root, const uint8_t *ch, size_t nch)
{
    kgram *g = kgram_new();
    kschema_ctx *c = g ? kschema_new(g, root) : NULL;
    kschema_err e;
    uint32_t start;
    FUZZ_CHECK(g && c);
    if (kschema_k3_args(c, root, kg_accept(g), &start, &e)) {
        FUZZ_CHECK(e.msg[0]);
    } else if (kgram_finish(g, start) == 0) {
        kbuf t = {0};
        choices a = {ch, nch, 0};
        int sp = 0;
        if (walk(g, &a, &t, &sp, 1) && !sp) {
            /* the arguments in a tool call, read back by the reply parser */
            kbuf r = {0};
            kchat_reply rep;
            kbuf_puts(&r, "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>");
            kbuf_add(&r, t.p ? t.p : "", t.n);
            kbuf_puts(&r, "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>");
            FUZZ_CHECK(!r.oom && kchat_parse_text(r.p, r.n, 0, &rep) == 0);
            if (rep.malformed || rep.n_calls != 1) fprintf(stderr, "reply: %.*s\n", (int)r.n, r.p);
            FUZZ_CHECK(rep.malformed == 0 && rep.n_calls == 1 && rep.where == KCHAT_AT_END);
            {
                json_t *v = json_loads(rep.calls[0].arguments, JSON_ALLOW_NUL, NULL);
                FUZZ_CHECK(json_is_object(v));
                if (!sv_valid(root, root, v, 0)) fprintf(stderr, "invalid arguments: %s\n", rep.calls[0].arguments);
                FUZZ_CHECK(sv_valid(root, root, v, 0));
                json_decref(v);
            }
            kchat_reply_free(&rep);
            kbuf_free(&r);
            accepted = 1;
        }
        kbuf_free(&t);
    }
    kschema_free(c);
    kgram_free(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *sep = memchr(data, 0xff, size);
    size_t n = sep ? (size_t)(sep - data) : size;
    const uint8_t *ch = sep ? sep + 1 : data + size;
    size_t nch = sep ? size - n - 1 : 0;
    json_t *root = json_loadb((const char *)data, n, JSON_ALLOW_NUL | JSON_DECODE_ANY, NULL);
    if (!root) return 0;
    accepted = 0;
    json_doc(root, ch, nch);
    k3_args(root, ch, nch);
    fuzz_accepted += accepted;
    json_decref(root);
    return 0;
}
