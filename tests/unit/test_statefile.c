/* The saved-conversation format (run/session/statefile.c, docs/STATE.md) without a
 * model: a written state parses back to the same bytes; every truncation,
 * every single-bit flip, and every re-sealed (checksums recomputed)
 * violation of the format is refused with a message; garbage never crashes
 * the parser.  The reader that loads a file straight into a state
 * (krun_state_read_begin + _payload, or + _check) gives the parser's verdict
 * on every one of those inputs, and the same bytes. */
#include "run/engine/state.h"
#include "run/session/statefile.h"

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

static int fails;
#define OK(cond, ...) do { int c_ = (cond); printf("%s - ", c_ ? "ok" : "not ok"); printf(__VA_ARGS__); printf("\n"); if (!c_) fails++; } while (0)

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint64_t next(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }

static void small_config(k3_config *c)
{
    memset(c, 0, sizeof *c);
    c->n_layers = 3;
    c->hidden = 8;
    c->vocab = 16;
    c->kda_heads = 2;
    c->kda_head_dim = 4;
    c->conv_width = 4;
    c->kv_lora = 4;
    c->qk_rope = 2;
    c->layer_is_mla[1] = 1;    /* KDA, MLA, KDA */
}

static uint8_t *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    uint8_t *b;
    long n;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    rewind(f);
    b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }

/* Recompute both checksums after a deliberate edit: the parser must then
 * refuse the edit on its own merits. */
static void reseal(uint8_t *b, size_t len)
{
    uint64_t payload = len - KRUN_STATE_HEADER - KRUN_STATE_TRAILER;
    put64(b + 152, XXH3_64bits(b, 152));
    put64(b + KRUN_STATE_HEADER + payload, XXH3_64bits(b + KRUN_STATE_HEADER, payload));
}

/* The streaming reader on the image b: the file rd_fd holds it; 0 if both ways
 * (into rd_st / rd_tokens / rd_logits, and checked only) accept it, -1 if both
 * refuse it with KRUN_EINPUT, 1 if they disagree. */
static int rd_fd = -1;
static const k3_config *rd_c;
static k3_state *rd_st;
static int32_t rd_tokens[16];
static float rd_logits[16];
static int reader(const uint8_t *b, size_t len)
{
    krun_state_reader r;
    krun_err e = {0, {0}};
    int rc[2];
    if (ftruncate(rd_fd, 0) || (len && pwrite(rd_fd, b, len, 0) != (ssize_t)len)) return 1;
    for (int way = 0; way < 2; way++) {
        rc[way] = krun_state_read_begin(&r, rd_fd, "image", &e);
        /* the session checks the context first: the history must fit the buffers */
        if (!rc[way] && r.h.n_tokens > 10) rc[way] = krun_err_set(&e, KRUN_EINPUT, "too long");
        if (!rc[way]) rc[way] = way ? krun_state_read_check(&r, NULL, &e) : krun_state_read_payload(&r, rd_c, rd_tokens, rd_st, rd_logits, NULL, &e);
        krun_state_read_end(&r);
        if (rc[way] && e.code != KRUN_EINPUT) return 1;
    }
    return rc[0] != rc[1] ? 1 : rc[0];
}

/* 1 if b holds a's layers: KDA state and history, the first pos MLA rows. */
static int same_layers(const k3_config *c, const k3_state *a, const k3_state *b, size_t pos)
{
    int same = 1;
    for (int L = 0; L < c->n_layers; L++) {
        if (!c->layer_is_mla[L])
            same &= !memcmp(a->kda_S[L], b->kda_S[L], k3_kda_S_floats(c) * 4) &&
                    !memcmp(a->kda_conv[L], b->kda_conv[L], k3_kda_conv_floats(c) * 4);
        else
            same &= !memcmp(a->mla_cache[L], b->mla_cache[L], pos * k3_mla_row(c) * 4);
    }
    return same;
}

static int refused(const uint8_t *b, size_t len, const char *expect, const char *what)
{
    krun_state_hdr h;
    krun_err e = {0, {0}};
    int rc = krun_state_parse(b, len, &h, &e);
    int ok = rc == -1 && e.code == KRUN_EINPUT && (!expect || strstr(e.msg, expect));
    OK(ok, "%s is refused (%s)", what, e.msg);
    OK(reader(b, len) == -1, "%s is refused by the reader too", what);
    return ok;
}

int main(void)
{
    k3_config c;
    k3_state st, back;
    karena a = {NULL, 0};
    void *mem, *mem2;
    int32_t tokens[10], tokens2[10];
    float logits[16], logits2[16];
    krun_state_hdr h, p;
    krun_err e = {0, {0}};
    char path[512];
    uint8_t *buf, *mut;
    size_t len;
    const char *tmp = getenv("KPK_TEST_TMP");

    small_config(&c);
    k3_state_carve(&st, &c, 10, &a);
    mem = calloc(1, a.used);
    mem2 = calloc(1, a.used);
    a.base = mem; a.used = 0;
    k3_state_carve(&st, &c, 10, &a);
    a.base = mem2; a.used = 0;
    k3_state_carve(&back, &c, 10, &a);
    /* 7 positions run, 2 pending; random finite state */
    st.pos = 7;
    for (int L = 0; L < c.n_layers; L++) {
        float *v[3] = {st.kda_S[L], st.kda_conv[L], st.mla_cache[L]};
        size_t n[3] = {v[0] ? k3_kda_S_floats(&c) : 0, v[1] ? k3_kda_conv_floats(&c) : 0, v[2] ? 10 * k3_mla_row(&c) : 0};
        for (int k = 0; k < 3; k++)
            for (size_t i = 0; i < n[k]; i++) v[k][i] = (float)((int64_t)(next() % 2001) - 1000) / 37.0f;
    }
    for (int i = 0; i < 9; i++) tokens[i] = (int32_t)(next() % 16);
    for (int i = 0; i < 16; i++) logits[i] = (float)i - 7.5f;

    snprintf(path, sizeof path, "%s/statefile-test-%ld", tmp ? tmp : "/tmp", (long)getpid());
    krun_state_hdr_for(&h, &c, 0x1234567890abcdefULL, 0xfeedfacecafebeefULL);
    h.pos = 7;
    h.n_tokens = 9;
    h.flags = KRUN_STATE_LOGITS;
    h.seed = 0x0123456789abcdefULL; h.stream = 2; h.reply_from = 5;
    OK(krun_state_write(path, &h, &c, tokens, &st, logits, NULL, &e) == 0, "a state is written (%s)", e.msg);
    buf = read_all(path, &len);
    if (!buf) { printf("not ok - cannot read back %s\n", path); return 1; }
    /* the reader's file: the same path, rewritten for every image */
    rd_fd = open(path, O_RDWR | O_CLOEXEC);
    unlink(path);
    if (rd_fd < 0) { printf("not ok - cannot open %s\n", path); return 1; }
    rd_c = &c;
    rd_st = &back;
    OK(len == KRUN_STATE_HEADER + h.payload_len + KRUN_STATE_TRAILER, "its length is header + payload + trailer (%zu bytes)", len);
    OK(krun_state_parse(buf, len, &p, &e) == 0, "it parses (%s)", e.msg);
    OK(p.set_id == h.set_id && p.config_xxh3 == h.config_xxh3 && p.pos == 7 && p.n_tokens == 9 && p.n_mla == 1 && p.n_kda == 2 &&
       p.vocab == 16 && p.flags == KRUN_STATE_LOGITS && p.seed == h.seed && p.stream == 2 && p.reply_from == 5 &&
       p.sampler == KRUN_STATE_SAMPLER_PHILOX && p.minor == 1, "the header reads back (1.1: seed, stream, reply start, sampler)");
    krun_state_restore(buf, &p, &c, tokens2, &back, logits2, NULL);
    {
        int same = back.pos == 7 && !memcmp(tokens, tokens2, 9 * sizeof *tokens) && !memcmp(logits, logits2, sizeof logits) &&
                   same_layers(&c, &st, &back, 7);
        OK(same, "restoring gives back every byte of the state, tokens and logits");
        memset(tokens2, 0, sizeof tokens2);
        k3_state_reset(&back);
        OK(reader(buf, len) == 0, "the reader accepts it");
        same = back.pos == 7 && !memcmp(tokens, rd_tokens, 9 * sizeof *tokens) && !memcmp(logits, rd_logits, sizeof logits) &&
               same_layers(&c, &st, &back, 7);
        OK(same, "the reader puts every byte of the state, tokens and logits in place");
    }

    /* every truncation */
    {
        int all = 1;
        for (size_t n = 0; n < len; n++) {
            krun_state_hdr x;
            krun_err ee;
            all &= krun_state_parse(buf, n, &x, &ee) == -1 && ee.code == KRUN_EINPUT && reader(buf, n) == -1;
        }
        OK(all, "each of the %zu truncations is refused, by the parser and the reader", len);
    }
    /* every single-bit flip */
    mut = malloc(len + 64);
    {
        int all = 1;
        size_t where = 0, accepted = 0;
        for (size_t bit = 0; bit < len * 8; bit++) {
            krun_state_hdr x;
            krun_err ee;
            memcpy(mut, buf, len);
            mut[bit / 8] ^= (uint8_t)(1u << (bit % 8));
            if (krun_state_parse(mut, len, &x, &ee) != -1 || reader(mut, len) != -1) { all = 0; where = bit; accepted++; }
        }
        OK(all, "each of the %zu single-bit flips is refused, by the parser and the reader (%zu accepted, the last at bit %zu)", len * 8,
           accepted, where);
    }
    /* re-sealed violations: the checksums are right, the content is not */
    memcpy(mut, buf, len); mut[8] = 2; reseal(mut, len);
    refused(mut, len, "version 2.1", "major version 2");
    memcpy(mut, buf, len); mut[93] = 1; reseal(mut, len);
    refused(mut, len, "reserved", "a non-zero reserved field");
    memcpy(mut, buf, len); mut[93] = 1; mut[10] = (uint8_t)(KRUN_STATE_MINOR + 1); mut[11] = 0; reseal(mut, len);
    OK(krun_state_parse(mut, len, &p, &e) == 0 && p.minor == KRUN_STATE_MINOR + 1,
       "the same reserved byte in a file of a later minor is read, as 1.1 (docs/STATE.md: additions only in reserved space)");
    memcpy(mut, buf, len); put32(mut + 88, 5); mut[10] = (uint8_t)(KRUN_STATE_MINOR + 1); mut[11] = 0; reseal(mut, len);
    refused(mut, len, "flags", "an unknown flag, even in a later minor");
    memcpy(mut, buf, len); put32(mut + 88, 5); reseal(mut, len);
    refused(mut, len, "flags", "an unknown flag");
    /* 1.1's sampler fields */
    memcpy(mut, buf, len); mut[124] = 1; reseal(mut, len);
    refused(mut, len, "reserved", "a non-zero reserved byte after the sampler field");
    memcpy(mut, buf, len); put32(mut + 120, 2); reseal(mut, len);
    refused(mut, len, "sampler", "a sampler this reader does not know (in 1.1)");
    memcpy(mut, buf, len); put64(mut + 112, 10); reseal(mut, len);
    refused(mut, len, "reply", "a reply that starts after the end of the history");
    memcpy(mut, buf, len); put64(mut + 112, 9); reseal(mut, len);
    OK(krun_state_parse(mut, len, &p, &e) == 0 && p.reply_from == 9, "a reply starting at the end of the history parses");
    /* a 1.0 file: its four PRNG words are read as the seed (the first); its reply is the end of its history */
    memcpy(mut, buf, len); mut[10] = 0; put64(mut + 104, 77); put64(mut + 112, 99); put64(mut + 120, 55); reseal(mut, len);
    OK(krun_state_parse(mut, len, &p, &e) == 0 && p.minor == 0 && p.seed == h.seed && p.stream == 0 && p.reply_from == 9 &&
       p.sampler == 0, "a 1.0 file parses: seed = its first PRNG word, stream 0, the reply at the end of its history");
    memcpy(mut, buf, len); put64(mut + 72, 10); reseal(mut, len);
    refused(mut, len, NULL, "a position beyond the history");
    memcpy(mut, buf, len); put32(mut + 68, 2); put32(mut + 64, 1); reseal(mut, len);
    refused(mut, len, NULL, "MLA layer counts that disagree with the payload");
    memcpy(mut, buf, len); mut[p.layer_types_at + 0] = 1; mut[p.layer_types_at + 1] = 0; reseal(mut, len);
    OK(krun_state_parse(mut, len, &p, &e) == 0, "a layer map with the same counts parses (the session layer compares it with the model's)");
    memcpy(mut, buf, len); mut[p.layer_types_at + 0] = 2; reseal(mut, len);
    refused(mut, len, "layer type", "a layer type that is neither KDA nor MLA");
    memcpy(mut, buf, len); put32(mut + p.tokens_at + 4, 16); reseal(mut, len);
    refused(mut, len, "vocabulary", "a token id outside the vocabulary");
    memcpy(mut, buf, len); put32(mut + p.tokens_at, 0xffffffffu); reseal(mut, len);
    refused(mut, len, "vocabulary", "a negative token id");
    {
        float nan = NAN, inf = INFINITY;
        memcpy(mut, buf, len); memcpy(mut + p.layers_at + 8, &nan, 4); reseal(mut, len);
        refused(mut, len, "not finite", "a NaN in the state");
        memcpy(mut, buf, len); memcpy(mut + p.logits_at, &inf, 4); reseal(mut, len);
        refused(mut, len, "not finite", "an infinite logit");
    }
    memcpy(mut, buf, len); put64(mut + 128, p.payload_len + 4); reseal(mut, len);
    refused(mut, len, NULL, "a payload length that disagrees with the geometry");
    memcpy(mut, buf, len); mut[len] = 0;
    refused(mut, len + 1, NULL, "one byte more");
    /* garbage of every small length, and a header of random bytes with valid magic */
    {
        int all = 1;
        for (int trial = 0; trial < 2000; trial++) {
            size_t n = (size_t)(next() % (len + 40));
            krun_state_hdr x;
            krun_err ee;
            uint8_t *g = malloc(n + 1);
            for (size_t i = 0; i < n; i++) g[i] = (uint8_t)next();
            if (n >= 8 && trial % 2) memcpy(g, KRUN_STATE_MAGIC, 8);
            if (n >= KRUN_STATE_HEADER && trial % 4 == 1) { g[8] = 1; g[9] = 0; put32(g + 12, 160); put64(g + 152, XXH3_64bits(g, 152)); }
            all &= krun_state_parse(g, n, &x, &ee) == -1 && reader(g, n) == -1;
            free(g);
        }
        OK(all, "2000 random inputs (half with the magic, a quarter with a valid header checksum) are refused");
    }
    close(rd_fd);
    free(mut);
    free(buf);
    free(mem);
    free(mem2);
    return fails ? 1 : 0;
}
