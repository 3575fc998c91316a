/* Constrained decoding (run/grammar/kgram.c, kschema.c, tokmask.c, chat_constrain.c):
 *  - the text machine's first-byte sets equal what it takes, byte by byte;
 *  - schemas: documents accepted and refused as the JSON Schema rules say (a table of cases,
 *    each chosen so that a plausible bug flips it), refused keywords named with their path;
 *  - with the real tokenizer: every token mask equals a brute-force walk of each token's bytes
 *    (all tokens holding a quote, a random sample and a sample of the allowed ones, at every
 *    state of random walks), the ids a mask never allows (specials), kmask_take;
 *  - whole replies in K3's chat format drawn at random under the mask (thinking on and off,
 *    response_format json_object / json_schema, a named tool, strict tools): each parses with the
 *    reply parser into content that is JSON valid against the schema (tests/fuzz/schema_valid.h,
 *    an independent validator) or calls whose arguments are; the same seed gives the same reply.
 * The mask's cost per token is printed (under load it is not a measurement: docs/SERVE.md has
 * the figures). */
#include "check.h"
#include "../fuzz/schema_valid.h"

#include "run/text/chat.h"
#include "run/text/jsontext.h"
#include "run/grammar/chat_constrain.h"
#include "run/grammar/kgram.h"
#include "run/grammar/kschema.h"
#include "run/grammar/tokmask.h"

#include <string.h>
#include <time.h>

static void die(const char *m) { fprintf(stderr, "%s\n", m); exit(2); }

/* A seeded generator per walk (splitmix64): a walk's draws do not depend on the others. */
typedef struct { uint64_t s; } testrand;
static void testrand_seed(testrand *r, uint64_t seed) { r->s = seed; }
static uint64_t testrand_u64(testrand *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int has(const uint8_t set[32], unsigned b) { return set[b >> 3] >> (b & 7) & 1; }

static void test_text_first(void)
{
    int bad = 0, cases = 0;
    for (int kind = 0; kind < KG_NTEXT; kind++)
        for (uint32_t sub = 0; sub < KG_TEXT_SUBS; sub++)
            for (int32_t chars = 0; chars < 4; chars++) {
                int32_t lo = 2, hi = 3;
                uint8_t set[32] = {0};
                kg_text_first((kg_body_kind)kind, sub, chars, lo, hi, set);
                for (unsigned b = 0; b < 256; b++) {
                    uint32_t s = sub;
                    int32_t c = chars;
                    int takes = kg_text_byte((kg_body_kind)kind, &s, &c, lo, hi, (uint8_t)b) != 0;
                    bad += takes != has(set, b);
                }
                cases++;
            }
    CHECK(!bad, "kg_text_first == what kg_text_byte takes, for every kind, sub-state, count below / at the bounds (%d cases, %d bytes wrong)",
          cases, bad);
}

/* ---- schemas ------------------------------------------------------------------------------- */

typedef struct {
    kgram *g;
    json_t *root;
} compiled;

static int compile_json(const char *schema, compiled *c, kschema_err *e)
{
    kschema_ctx *sc;
    uint32_t start;
    int rc;
    c->root = json_loads(schema, JSON_DECODE_ANY, NULL);
    if (!c->root) die("bad test schema");
    c->g = kgram_new();
    sc = kschema_new(c->g, c->root);
    rc = kschema_json(sc, c->root, kg_accept(c->g), &start, e);
    kschema_free(sc);
    if (!rc && kgram_finish(c->g, start)) { snprintf(e->msg, sizeof e->msg, "unsatisfiable"); rc = -2; }
    return rc;
}

static void compiled_free(compiled *c)
{
    kgram_free(c->g);
    json_decref(c->root);
}

/* 0 refused, 1 a prefix, 2 complete */
static int run_text(const kgram *g, const char *s, size_t n)
{
    static uint32_t a[KG_SET_WORDS], b[KG_SET_WORDS];
    kg_set x = {a, 0, KG_SET_WORDS, 0}, y = {b, 0, KG_SET_WORDS, 0};
    kgram_start(g, &x);
    for (size_t i = 0; i < n; i++) {
        kg_set t;
        kgram_step(g, &x, (uint8_t)s[i], &y);
        if (!y.threads) return 0;
        t = x; x = y; y = t;
    }
    return kgram_accepts(g, &x) ? 2 : 1;
}

static void test_documents(void)
{
    static const struct { const char *schema, *doc; int want; } cases[] = {
        /* objects: required, order, optional, no extra, whitespace */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"a\"]}", "{\"a\":1}", 2},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"a\"]}", "{\"b\":\"x\"}", 0},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"a\"]}", "{\"a\":1,\"b\":\"x\"}", 2},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"a\"]}", "{\"b\":\"x\",\"a\":1}", 0},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}", "{}", 2},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}", "{\"c\":1}", 0},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}", "{\"a\":1,}", 0},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}", "{\n  \"a\": 5\n}", 2},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}", "{ \"a\" : 5 }", 2},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}", "{  \"a\":5}", 0},    /* two spaces */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}", "{\n\n\"a\":5}", 0},  /* two newlines */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}", "{\"a\":5", 1},
        {"{\"properties\":{\"x\":{\"type\":\"null\"}},\"required\":[\"x\"]}", "{\"x\":null}", 2},             /* type from the keywords */
        {"{\"required\":[\"k\"]}", "{\"k\":[true]}", 2},
        {"{\"type\":\"object\",\"properties\":{\"a b\\\"c\":{\"const\":1}},\"required\":[\"a b\\\"c\"]}", "{\"a b\\\"c\":1}", 2},
        /* maps */
        {"{\"type\":\"object\"}", "{\"x\":{\"y\":[1,\"z\",null]},\"w\":false}", 2},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"boolean\"}}", "{\"p\":true,\"q\":false}", 2},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"boolean\"}}", "{\"p\":1}", 0},
        {"{\"type\":\"object\",\"additionalProperties\":false}", "{}", 2},
        {"{\"type\":\"object\",\"additionalProperties\":false}", "{\"a\":1}", 0},
        /* arrays */
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}", "[1,2]", 2},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}", "[1]", 0},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}", "[1,2,3,4]", 0},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}", "[ 1, 2, 3 ]", 2},
        {"{\"type\":\"array\",\"maxItems\":0}", "[]", 2},
        /* minimum / maximum: digits either side of 0 */
        {"{\"type\":\"integer\",\"minimum\":0,\"maximum\":99}", "99", 2},
        {"{\"type\":\"integer\",\"minimum\":0,\"maximum\":99}", "100", 0},
        {"{\"type\":\"integer\",\"minimum\":0,\"maximum\":99}", "-1", 0},
        {"{\"type\":\"integer\",\"minimum\":-5,\"maximum\":5}", "-5", 2},
        {"{\"type\":\"integer\",\"minimum\":-5,\"maximum\":5}", "6", 0},
        {"{\"type\":\"integer\",\"minimum\":-9007199254740991,\"maximum\":9007199254740991}", "-999999999999999", 2},
        {"{\"type\":\"integer\",\"minimum\":-9007199254740991,\"maximum\":9007199254740991}", "1000000000000000", 0},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "0.25", 2},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "1", 2},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "1.5", 0},
        {"{\"type\":\"number\",\"minimum\":-0.5,\"maximum\":1}", "-0.25", 0},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}", "1e0", 0},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":10}", "9.5", 2},
        {"{\"type\":\"number\",\"minimum\":0,\"maximum\":9.9}", "9.5", 0},
        {"{\"type\":\"number\",\"maximum\":0.5}", "-12.5", 2},
        {"{\"type\":\"array\",\"maxItems\":0}", "[1]", 0},
        {"{\"type\":\"array\"}", "[[[]],{},\"\",0]", 2},
        /* strings */
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"ab\"", 2},
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"a\"", 0},
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"abcd\"", 0},
        {"{\"type\":\"string\",\"maxLength\":2}", "\"\xc3\xa9\xe2\x82\xac\"", 2},          /* 2 characters, 5 bytes */
        {"{\"type\":\"string\",\"maxLength\":2}", "\"\\u00e9\\n\"", 2},                      /* escapes are one character */
        {"{\"type\":\"string\",\"maxLength\":1}", "\"\\u00e9\\n\"", 0},
        {"{\"type\":\"string\"}", "\"\\ud83d\\ude00\"", 0},                                  /* no surrogate escapes */
        {"{\"type\":\"string\"}", "\"\xf0\x9f\x98\x80\"", 2},                                  /* non-BMP as UTF-8 */
        {"{\"type\":\"string\"}", "\"a\tb\"", 0},                                               /* a control byte */
        {"{\"type\":\"string\"}", "\"\\u0000\"", 0},                                           /* no NUL */
        {"{\"type\":\"string\"}", "\"\\u0001\\u0100\\u1000\"", 2},
        {"{\"type\":\"string\"}", "\"\xc0\xaf\"", 0},                                          /* overlong UTF-8 */
        {"{\"type\":\"string\"}", "\"\xed\xa0\x80\"", 0},                                      /* an encoded surrogate */
        {"{\"type\":\"string\"}", "\"\\x\"", 0},
        {"{\"type\":\"string\"}", "\"\\/\\\\\\\"\\b\\f\\r\\t\\u0041\"", 2},
        /* numbers */
        {"{\"type\":\"number\"}", "-0.5e+10", 2},
        {"{\"type\":\"number\"}", "01", 0},
        {"{\"type\":\"number\"}", "1.", 1},
        {"{\"type\":\"number\"}", ".5", 0},
        {"{\"type\":\"number\"}", "1e999", 0},                                                 /* 2 exponent digits */
        {"{\"type\":\"number\"}", "12345678901234567", 0},                                     /* 17 integer digits */
        {"{\"type\":\"integer\"}", "1.0", 0},
        {"{\"type\":\"integer\"}", "-12", 2},
        {"{\"type\":[\"integer\",\"null\"]}", "null", 2},
        {"{\"type\":\"boolean\"}", "true", 2},
        {"{\"type\":\"boolean\"}", "tru", 1},
        /* enum, const, anyOf, refs */
        {"{\"enum\":[\"x\",1,null,{\"k\":[1]}]}", "{\"k\":[1]}", 2},
        {"{\"enum\":[\"x\",1,null,{\"k\":[1]}]}", "\"y\"", 0},
        {"{\"type\":\"string\",\"enum\":[\"x\",1]}", "1", 0},                                 /* filtered by type */
        {"{\"const\":\"a\\\"b\"}", "\"a\\\"b\"", 2},
        {"{\"anyOf\":[{\"type\":\"string\",\"maxLength\":1},{\"type\":\"integer\"}]}", "\"ab\"", 0},
        {"{\"anyOf\":[{\"type\":\"string\",\"maxLength\":1},{\"type\":\"integer\"}]}", "7", 2},
        {"{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"const\":1}},\"required\":[\"a\"]},"
         "{\"type\":\"object\",\"properties\":{\"a\":{\"const\":2},\"b\":{\"const\":3}},\"required\":[\"a\",\"b\"]}]}", "{\"a\":2,\"b\":3}", 2},
        {"{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"}}},"
         "\"required\":[\"v\",\"kids\"]}},\"$ref\":\"#/$defs/n\"}", "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[]}]}", 2},
        {"{\"definitions\":{\"a~b/c\":{\"type\":\"null\"}},\"$ref\":\"#/definitions/a~0b~1c\"}", "null", 2},
        {"{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"integer\"},\"q\":{\"$ref\":\"#/properties/p\"}},\"required\":[\"q\"]}", "{\"q\":3}", 2},
        {"true", "[\"anything\"]", 2},
        {"{\"title\":\"t\",\"description\":\"d\",\"$schema\":\"x\",\"default\":1,\"examples\":[1]}", "{}", 2},   /* annotations only */
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        compiled c;
        kschema_err e;
        int got;
        if (compile_json(cases[i].schema, &c, &e)) {
            bad++;
            printf("# case %zu: %s refused: %s %s\n", i, cases[i].schema, e.path, e.msg);
            compiled_free(&c);
            continue;
        }
        got = run_text(c.g, cases[i].doc, strlen(cases[i].doc));
        if (got != cases[i].want) { bad++; printf("# case %zu: %s on %s: %d, wanted %d\n", i, cases[i].schema, cases[i].doc, got, cases[i].want); }
        compiled_free(&c);
    }
    CHECK(!bad, "%zu documents accepted, left incomplete or refused as the schema says (%d wrong)", sizeof cases / sizeof *cases, bad);
}

static void test_refusals(void)
{
    static const struct { const char *schema, *path, *words; } cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"^a\"}", "pattern", "\"pattern\""},
        {"{\"type\":\"string\",\"format\":\"email\"}", "format", "\"format\""},
        {"{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":1}}}", "properties.n.minimum", "\"minimum\" above 0"},
        {"{\"type\":\"number\",\"maximum\":-1}", "maximum", "\"maximum\" below 0"},
        {"{\"type\":\"number\",\"maximum\":\"1\"}", "maximum", "a number"},
        {"{\"type\":\"number\",\"multipleOf\":2}", "multipleOf", "\"multipleOf\""},
        {"{\"oneOf\":[{\"type\":\"string\"}]}", "oneOf", "\"oneOf\""},
        {"{\"allOf\":[{\"type\":\"string\"}]}", "allOf", "\"allOf\""},
        {"{\"type\":\"array\",\"items\":{\"type\":\"array\",\"uniqueItems\":true}}", "items.uniqueItems", "\"uniqueItems\""},
        {"{\"type\":\"array\",\"prefixItems\":[{}]}", "prefixItems", "\"prefixItems\""},
        {"{\"type\":\"array\",\"items\":[{}]}", "items", "tuple"},
        {"{\"$ref\":\"http://example.com/s\"}", "$ref", "inside the schema"},
        {"{\"$ref\":\"#/$defs/none\"}", "$ref", "points to nothing"},
        {"{\"type\":\"strin\"}", "type", "unknown type"},
        {"{\"type\":\"string\",\"minLength\":-1}", "minLength", "non-negative"},
        {"{\"anyOf\":[]}", "anyOf", "non-empty"},
        {"{\"type\":\"string\",\"enum\":[\"a\"],\"maxLength\":3}", "enum", "together"},
        {"{\"type\":\"object\",\"properties\":[1]}", "properties", "must be an object"},
        {"{\"anyOf\":[{\"type\":\"null\"},{\"type\":\"object\",\"properties\":{\"deep\":{\"not\":{}}}}]}", "anyOf.1.properties.deep.not", "\"not\""},
        {"7", "", "object or a boolean"},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        compiled c;
        kschema_err e;
        int rc = compile_json(cases[i].schema, &c, &e);
        if (rc != -1 || strcmp(e.path, cases[i].path) || !strstr(e.msg, cases[i].words)) {
            bad++;
            printf("# case %zu: %s: rc %d path \"%s\" msg \"%s\"\n", i, cases[i].schema, rc, e.path, e.msg);
        }
        compiled_free(&c);
    }
    CHECK(!bad, "%zu schemas refused, each naming the keyword and its path (%d wrong)", sizeof cases / sizeof *cases, bad);
    {
        /* schemas no value satisfies are refused at kgram_finish */
        static const char *const none[] = {
            "{\"enum\":[]}", "{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}",
            "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"minLength\":4,\"maxLength\":1}},\"required\":[\"a\"]}",
            "{\"type\":\"object\",\"properties\":{\"me\":{\"$ref\":\"#\"}},\"required\":[\"me\"]}", "false",
            "{\"type\":\"array\",\"items\":false,\"minItems\":1}", "{\"required\":[\"k\"],\"additionalProperties\":false}",
        };
        int ok = 1;
        for (size_t i = 0; i < sizeof none / sizeof *none; i++) {
            compiled c;
            kschema_err e;
            int rc = compile_json(none[i], &c, &e);
            if (rc != -2) { ok = 0; printf("# %s: rc %d\n", none[i], rc); }
            compiled_free(&c);
        }
        CHECK(ok, "schemas that no value satisfies (an empty enum, minItems over maxItems, a required property that must contain itself, false) are refused");
    }
    {
        /* the depth the constraint follows: a chain that must nest 60 deep cannot be; one of 40 can */
        char s[8192];
        for (int depth = 40; depth <= 60; depth += 20) {
            compiled c;
            kschema_err e;
            int rc;
            snprintf(s, sizeof s, "{\"$defs\":{\"d0\":{\"type\":\"null\"}");
            for (int k = 1; k <= depth; k++)
                snprintf(s + strlen(s), sizeof s - strlen(s), ",\"d%d\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/d%d\"},\"minItems\":1}", k, k - 1);
            snprintf(s + strlen(s), sizeof s - strlen(s), "},\"$ref\":\"#/$defs/d%d\"}", depth);
            rc = compile_json(s, &c, &e);
            CHECK(depth == 40 ? rc == 0 : rc == -2, "arrays that must nest %d deep: %s", depth, depth == 40 ? "compiled" : "refused (more than the 48 frames followed)");
            compiled_free(&c);
        }
    }
}

/* ---- with the tokenizer ---------------------------------------------------------------------- */

#define VOCAB 163840


static int brute(const kgram *g, const kg_set *st, const uint8_t *p, size_t len)
{
    static uint32_t a[KG_SET_WORDS], b[KG_SET_WORDS];
    kg_set x = {a, st->n, KG_SET_WORDS, st->threads}, y = {b, 0, KG_SET_WORDS, 0};
    memcpy(a, st->w, st->n * sizeof *a);
    for (size_t i = 0; i < len; i++) {
        kg_set t;
        kgram_step(g, &x, p[i], &y);
        if (!y.threads) return 0;
        t = x; x = y; y = t;
    }
    return 1;
}

static int bit(const uint64_t *b, int32_t id) { return (int)(b[id >> 6] >> (id & 63) & 1); }

/* Token ids worth choosing to reach the end of a document: short ones and structural ones. */
static int32_t *structural(const ktok *tk, size_t *n)
{
    int32_t *ids = malloc(VOCAB * sizeof *ids);
    *n = 0;
    for (int32_t id = 0; id < (int32_t)ktok_n_ranks(tk); id++) {
        size_t len;
        const uint8_t *p = ktok_id_bytes(tk, id, &len);
        int keep = len <= 1;
        for (size_t i = 0; i < len && !keep; i++) keep = strchr("\"{}[],:", p[i]) && p[i];
        if (keep) ids[(*n)++] = id;
    }
    return ids;
}

typedef struct {
    ktok *tk;
    kmask_index *ix;
    int32_t *quotes, *structs;
    size_t n_quotes, n_structs;
    int32_t marker[4];
    double mask_s;
    long masks, bad_masks, checked;
} env;

/* Check a mask against brute force: every token holding a quote, 600 random ids, 300 allowed ones. */
static void check_mask(env *E, const kgram *g, const kg_set *st, const uint64_t *bits, testrand *r)
{
    long bad = 0;
    for (size_t k = 0; k < E->n_quotes + 900; k++) {
        int32_t id;
        size_t len;
        const uint8_t *p;
        if (k < E->n_quotes) id = E->quotes[k];
        else if (k < E->n_quotes + 600) id = (int32_t)(testrand_u64(r) % (uint64_t)ktok_n_ranks(E->tk));
        else {
            int tries = 0;
            do id = (int32_t)(testrand_u64(r) % VOCAB); while (!bit(bits, id) && ++tries < 2000);
            if (!bit(bits, id)) break;
        }
        if (ktok_is_special(E->tk, id)) continue;
        p = ktok_id_bytes(E->tk, id, &len);
        bad += brute(g, st, p, len) != bit(bits, id);
        E->checked++;
    }
    for (int32_t id = (int32_t)ktok_n_ranks(E->tk); id < VOCAB; id++) {
        int is_marker = 0, want = 0;
        for (int m = 0; m < 4; m++)
            if (E->marker[m] == id) {
                static uint32_t w[KG_SET_WORDS];
                kg_set o = {w, 0, KG_SET_WORDS, 0};
                is_marker = 1;
                kgram_step(g, st, KG_SYM_OPEN + m, &o);
                want = o.threads > 0;
            }
        if (bit(bits, id) != (is_marker && want)) bad++;
    }
    if (bad) E->bad_masks++;
}

/* A reply drawn under g: ids into out (at most max).  Returns the number of ids, or -1 if the mask
 * ever disagreed with the grammar (a take refused, an empty mask before the end). */
static long draw(env *E, const kgram *g, testrand *r, int32_t *out, size_t max, int check)
{
    kmask *m = kmask_new(E->ix, g);
    uint64_t *bits = malloc(VOCAB / 8);
    size_t n = 0;
    if (!m || !bits) die("oom");
    while (n < max) {
        struct timespec t0, t1;
        long allowed;
        int32_t pick = -1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        allowed = kmask_allowed(m, bits);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        E->mask_s += (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        E->masks++;
        if (check) check_mask(E, g, kmask_state(m), bits, r);
        if (allowed <= 0) { n = kmask_complete(m) ? n : (size_t)-1; break; }
        /* markers when allowed (half the time), else a structural token (half), else any */
        for (int k = 0; k < 4 && pick < 0; k++)
            if (E->marker[k] >= 0 && bit(bits, E->marker[k]) && testrand_u64(r) % 2) pick = E->marker[k];
        if (pick < 0 && testrand_u64(r) % 2)
            for (int tries = 0; tries < 64 && pick < 0; tries++) {
                int32_t id = E->structs[testrand_u64(r) % E->n_structs];
                if (bit(bits, id)) pick = id;
            }
        for (int tries = 0; tries < 100000 && pick < 0; tries++) {
            int32_t id = (int32_t)(testrand_u64(r) % VOCAB);
            if (bit(bits, id)) pick = id;
        }
        for (int32_t id = 0; pick < 0 && id < VOCAB; id++) if (bit(bits, id)) pick = id;
        if (kmask_take(m, pick)) { n = (size_t)-1; break; }
        out[n++] = pick;
        if (pick == E->marker[3]) break;            /* <|end_of_msg|> */
    }
    kmask_free(m);
    free(bits);
    return (long)n;
}

static void test_masks(env *E)
{
    static const char *const schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},\"age\":{\"type\":\"integer\"},"
        "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":40},\"maxItems\":3}},"
        "\"required\":[\"name\",\"age\",\"tags\"],\"additionalProperties\":false}",
        "{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"string\",\"minLength\":3},{\"enum\":[true,\"x\\\"y\"]}]}",
        "{\"type\":\"object\"}",
    };
    testrand r;
    testrand_seed(&r, 11);
    E->bad_masks = E->checked = 0;
    for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i++) {
        compiled c;
        kschema_err e;
        int32_t ids[200];
        if (compile_json(schemas[i], &c, &e)) die(e.msg);
        for (int w = 0; w < 3; w++)
            if (draw(E, c.g, &r, ids, 60, 1) < 0) E->bad_masks++;
        compiled_free(&c);
    }
    CHECK(E->bad_masks == 0, "token masks == a brute-force walk of each token's bytes (%ld tokens checked at every state of 9 random walks; "
          "specials never allowed, markers when the grammar takes them)", E->checked);
}

/* A K3 reply grammar for a request, and replies drawn under it: each parses, valid. */
static void test_replies(env *E)
{
    static const char *const tools =
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"strict\":true,\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":30},\"unit\":{\"enum\":[\"c\",\"f\"]},"
        "\"days\":{\"type\":\"integer\"},\"opts\":{\"type\":\"object\",\"properties\":{\"alerts\":{\"type\":\"boolean\"}},\"required\":[\"alerts\"]}},"
        "\"required\":[\"city\",\"unit\"],\"additionalProperties\":false}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"free\",\"parameters\":{\"type\":\"object\"}}}]";
    static const char *const schema =
        "{\"type\":\"object\",\"properties\":{\"answer\":{\"type\":\"string\",\"maxLength\":25},\"score\":{\"type\":\"number\"},"
        "\"items\":{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"null\"}]},\"maxItems\":4}},"
        "\"required\":[\"answer\",\"score\"],\"additionalProperties\":false}";
    static const struct { const char *what; kchat_format f; kchat_tool_choice tc; const char *name; int tools; } cfg[] = {
        {"response_format json_schema", KCHAT_FORMAT_JSON_SCHEMA, KCHAT_TOOL_CHOICE_AUTO, NULL, 0},
        {"response_format json_object", KCHAT_FORMAT_JSON_OBJECT, KCHAT_TOOL_CHOICE_AUTO, NULL, 0},
        {"a named tool", KCHAT_FORMAT_TEXT, KCHAT_TOOL_CHOICE_NAMED, "get_weather", 1},
        {"strict tools, tool_choice required", KCHAT_FORMAT_TEXT, KCHAT_TOOL_CHOICE_REQUIRED, NULL, 1},
        {"strict tools, auto", KCHAT_FORMAT_TEXT, KCHAT_TOOL_CHOICE_AUTO, NULL, 1},
    };
    json_t *sch = json_loads(schema, 0, NULL), *tl = json_loads(tools, 0, NULL);
    json_t *wparams = json_object_get(json_object_get(json_array_get(tl, 0), "function"), "parameters");
    for (size_t ci = 0; ci < sizeof cfg / sizeof *cfg; ci++)
        for (int thinking = 0; thinking < 2; thinking++) {
            kchat_options o;
            kgram *g;
            char param[256], msg[512];
            int walks = 6, good = 0, same = 1, calls = 0, complete = 0;
            kchat_options_default(&o);
            o.thinking = thinking;
            o.format = cfg[ci].f;
            o.format_schema = schema;
            o.tool_choice = cfg[ci].tc;
            o.tool_name = cfg[ci].name;
            o.tools_json = cfg[ci].tools ? tools : NULL;
            if (kchat_constraint(&o, &g, param, sizeof param, msg, sizeof msg) || !g) {
                CHECK(0, "%s: constraint built (%s: %s)", cfg[ci].what, param, msg);
                continue;
            }
            for (int w = 0; w < walks; w++) {
                int32_t ids[700], ids2[700];
                testrand r1, r2;
                long n, n2;
                kchat_reply rep;
                int ok = 1;
                testrand_seed(&r1, 100 + (uint64_t)w);
                testrand_seed(&r2, 100 + (uint64_t)w);
                n = draw(E, g, &r1, ids, 700, 0);
                n2 = draw(E, g, &r2, ids2, 700, 0);
                same &= n == n2 && (n <= 0 || !memcmp(ids, ids2, (size_t)n * sizeof *ids));
                if (n <= 0) { printf("# %s: walk %d: %ld\n", cfg[ci].what, w, n); continue; }
                if (ids[n - 1] != E->marker[3]) continue;    /* not finished within 700 tokens: not checked */
                complete++;
                if (kchat_parse_ids(E->tk, ids, (size_t)n, thinking, &rep)) die("parse");
                ok = rep.malformed == 0 && rep.where == KCHAT_AT_END;
                if (ok && cfg[ci].f != KCHAT_FORMAT_TEXT && !rep.n_calls) {
                    json_t *v = json_loads(rep.content, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
                    ok = v && (cfg[ci].f == KCHAT_FORMAT_JSON_OBJECT ? json_is_object(v) : sv_valid(sch, sch, v, 0));
                    json_decref(v);
                }
                if (ok && cfg[ci].tc == KCHAT_TOOL_CHOICE_NAMED) ok = rep.n_calls == 1 && !strcmp(rep.calls[0].name, "get_weather");
                if (ok && cfg[ci].tc == KCHAT_TOOL_CHOICE_REQUIRED) ok = rep.n_calls >= 1;
                for (size_t k = 0; ok && k < rep.n_calls; k++) {
                    json_t *v = json_loads(rep.calls[k].arguments, JSON_ALLOW_NUL, NULL);
                    ok = json_is_object(v) && (strcmp(rep.calls[k].name, "get_weather") || sv_valid(wparams, wparams, v, 0));
                    json_decref(v);
                    calls++;
                }
                if (!ok) printf("# %s (thinking %d): malformed %zu, where %d, content [%s], %zu calls%s%s\n", cfg[ci].what, thinking,
                                rep.malformed, rep.where, rep.content, rep.n_calls, rep.n_calls ? ": " : "", rep.n_calls ? rep.calls[0].arguments : "");
                good += ok;
                kchat_reply_free(&rep);
            }
            CHECK(complete > 0 && good == complete && same, "%s, thinking %s: %d of %d replies drawn under the mask finished, each parsed "
                  "and valid (%d tool calls); the same seed, the same reply", cfg[ci].what, thinking ? "on" : "off", good, walks, calls);
            kgram_free(g);
        }
    json_decref(sch);
    json_decref(tl);
}

/* kmask_take refuses what the mask does not allow, and keeps its state. */
static void test_take(env *E)
{
    compiled c;
    kschema_err e;
    kmask *m;
    uint64_t *b1 = malloc(VOCAB / 8), *b2 = malloc(VOCAB / 8);
    int32_t *ids;
    size_t n;
    if (compile_json("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"}},\"required\":[\"a\"]}", &c, &e)) die(e.msg);
    m = kmask_new(E->ix, c.g);
    if (ktok_encode(E->tk, "{\"a\":", 5, 0, &ids, &n)) die("encode");
    for (size_t i = 0; i < n; i++) if (kmask_take(m, ids[i])) die("take");
    kmask_allowed(m, b1);
    free(ids);
    if (ktok_encode(E->tk, "1", 1, 0, &ids, &n)) die("encode");
    CHECK(kmask_take(m, ids[0]) == -1 && kmask_take(m, E->marker[0]) == -1 && kmask_take(m, -5) == -1 && kmask_take(m, VOCAB + 9) == -1,
          "kmask_take refuses a token, a marker and ids the grammar does not allow");
    kmask_allowed(m, b2);
    CHECK(!memcmp(b1, b2, VOCAB / 8) && !kmask_complete(m), "... and its state is what it was");
    free(ids);
    if (ktok_encode(E->tk, "true}", 5, 0, &ids, &n)) die("encode");
    for (size_t i = 0; i < n; i++) if (kmask_take(m, ids[i])) die("take");
    CHECK(kmask_complete(m) && kmask_allowed(m, b1) == 0, "a complete document: kmask_complete, and nothing more allowed");
    free(ids);
    kmask_free(m);
    compiled_free(&c);
    free(b1);
    free(b2);
}

static void test_directives(const ktok *tk)
{
    kchat_message u = {KCHAT_USER, "Hi", 2, NULL, NULL, 0, NULL, 0, NULL, NULL};
    kchat_options o;
    kchat_rendering rd;
    krun_err err;
    kchat_options_default(&o);
    o.thinking = 0;
    o.format = KCHAT_FORMAT_JSON_SCHEMA;
    o.format_schema = "{\"type\":\"object\",\"required\":[\"b\"],\"properties\":{\"b\":{\"type\":\"string\"}}}";
    if (kchat_render(tk, &u, 1, &o, &rd, &err)) die(err.msg);
    CHECK(strstr(rd.text, "<|open|>message role=\"system\" type=\"response-format\"<|sep|>The system is invoked with `response_format=json_schema`.\n")
          && strstr(rd.text, "```json\n{\"properties\":{\"b\":{\"type\":\"string\"}},\"required\":[\"b\"],\"type\":\"object\"}\n```<|close|>message<|sep|>"
                             "<|end_of_msg|><|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>"),
          "response_format json_schema: a response-format message (the schema compact, keys sorted) right before the generation prompt");
    kchat_rendering_free(&rd);
    o.format = KCHAT_FORMAT_TEXT;
    o.tools_json = "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]";
    o.tool_choice = KCHAT_TOOL_CHOICE_NAMED;
    o.tool_name = "f";
    if (kchat_render(tk, &u, 1, &o, &rd, &err)) die(err.msg);
    CHECK(strstr(rd.text, "type=\"tool-choice\"<|sep|>The system is invoked with `tool_choice={\"type\": \"function\", \"function\": {\"name\": \"f\"}}`.\n"
                          "You MUST call the tool `f` in the next message, and no other tool.<|close|>message<|sep|>") != NULL,
          "a named tool_choice: its tool-choice message");
    kchat_rendering_free(&rd);
}

int main(void)
{
    const char *sh = check_shared_dir();
    char path[1024];
    size_t rl;
    char *rf;
    ktok_special *sp;
    size_t nsp;
    krun_err err;
    env E = {0};
    test_text_first();
    test_documents();
    test_refusals();
    snprintf(path, sizeof path, "%s/fixtures/tokenizer/tiktoken.model", sh);
    rf = check_read_file(path, &rl);
    if (!rf) {
        SKIP("token masks and replies: %s is absent", path);
        return check_exit();
    }
    if (ktok_specials_builtin("k3", &sp, &nsp)) die("specials");
    E.tk = ktok_load(rf, rl, sp, nsp, &err);
    ktok_specials_free(sp, nsp);
    free(rf);
    if (!E.tk) die(err.msg);
    {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        E.ix = kmask_index_new(E.tk, VOCAB, &err);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (!E.ix) die(err.msg);
        printf("# token index: %.3f s, %.1f MB\n", (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9,
               (double)kmask_index_bytes(E.ix) / 1e6);
    }
    {
        static const char *const mk[4] = {KCHAT_OPEN, KCHAT_CLOSE, KCHAT_SEP, KCHAT_END_OF_MSG};
        size_t nq = 0;
        for (int k = 0; k < 4; k++) E.marker[k] = ktok_find_special(E.tk, mk[k]);
        E.quotes = malloc(VOCAB * sizeof *E.quotes);
        for (int32_t id = 0; id < (int32_t)ktok_n_ranks(E.tk); id++) {
            size_t len;
            const uint8_t *p = ktok_id_bytes(E.tk, id, &len);
            if (memchr(p, '"', len)) E.quotes[nq++] = id;
        }
        E.n_quotes = nq;
        E.structs = structural(E.tk, &E.n_structs);
    }
    test_directives(E.tk);
    test_take(&E);
    test_masks(&E);
    test_replies(&E);
    printf("# %ld masks, %.1f us each on average (this machine, now: not a measurement)\n", E.masks, E.mask_s / (double)E.masks * 1e6);
    kmask_index_free(E.ix);
    free(E.quotes);
    free(E.structs);
    ktok_free(E.tk);
    return check_exit();
}
