/* A saved-conversation state file (docs/STATE.md) from arbitrary bytes,
 * against a small model: krun_state_parse on the image, krun_state_peek and
 * krun_session_load on it as a file.  Checked:
 *  - parse, peek and load agree: a state parse accepts whose identity,
 *    geometry and layer map are the model's and whose history fits the
 *    context is loaded; anything parse refuses, load refuses;
 *  - what parse accepts is laid out as the header says (the sections in
 *    order, without gaps, the file exactly 160 + payload_len + 8 bytes, every
 *    token in the vocabulary, pos <= n_tokens);
 *  - a loaded state is the file's: positions, pending tokens, history, the
 *    logits; saved again (krun_session_save) it gives the same bytes;
 *  - a refusal has code KRUN_EINPUT (or KRUN_ENOMEM) and a message, and
 *    leaves the session as it was (a baseline conversation: 3 tokens run, 1
 *    pending).
 *
 * Every input is tried as given and re-sealed twice (the header and payload
 * checksums recomputed; then with payload_len set to what the file length
 * says as well), since almost any mutation breaks a checksum and would never
 * reach the rules behind it.
 *
 * The model: $KPK_FUZZ_STATE_MODEL, else build/fuzz/seeds/kpk/layer-major.kpk
 * (make_seeds.sh converts it from `k3synth --geometry micro --seed 1`, and
 * saves the seed states build/fuzz/seeds/state/ with it).  A state records
 * its model's set_id and config hash, so the seeds must come from the same
 * file as the model: the replay test makes both. */
#include "fuzz.h"

#include "format/kio.h"
#include "format/kpk_reader.h"
#include "run/session/session.h"
#include "run/session/statefile.h"

#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define CTX 32

static krun_model *model;
static krun_session *sess;
static char dir[64], base_path[128], save_path[128];
static uint8_t *base;                    /* the baseline state, as saved */
static size_t base_len;
static krun_state_hdr base_h;

static void cleanup(void)
{
    unlink(base_path);
    unlink(save_path);
    rmdir(dir);
}

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "fuzz_state: %s: %s\n", what, msg);
    exit(2);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *path = getenv("KPK_FUZZ_STATE_MODEL");
    const char *tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp"; /* saves fsync: keep them off the disk */
    static const int32_t run[3] = {1, 2, 3}, pending = 4;
    krun_model_opts o;
    krun_err e = {0};
    (void)argc;
    (void)argv;
    if (!path) path = "build/fuzz/seeds/kpk/layer-major.kpk";
    krun_model_opts_init(&o);
    o.path = path;
    o.ctx = CTX;
    o.chunk = 4;
    o.threads = 1;
    if (krun_model_open(&o, &model, &e)) die(path, e.msg);
    if (krun_session_new(model, &sess, &e)) die("session", e.msg);
    snprintf(dir, sizeof dir, "%s/fuzz_state.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : tmp);
    if (!mkdtemp(dir)) die(dir, "cannot create a temporary directory");
    snprintf(base_path, sizeof base_path, "%s/base.state", dir);
    snprintf(save_path, sizeof save_path, "%s/save.state", dir);
    atexit(cleanup);
    if (krun_session_feed(sess, run, 3, NULL, &e) || krun_session_append(sess, &pending, 1, &e) ||
        krun_session_save(sess, base_path, &e))
        die("baseline", e.msg);
    if (kio_read_file(base_path, (size_t)1 << 30, (char **)&base, &base_len)) die(base_path, "cannot read it back");
    if (krun_state_parse(base, base_len, &base_h, &e)) die("baseline", e.msg);
    fprintf(stderr, "fuzz_state: model %s (%u layers, vocab %u), context %d\n", path, base_h.n_layers, base_h.vocab, CTX);
    return 0;
}

/* The session holds the baseline conversation. */
static void check_baseline(void)
{
    size_t n;
    const int32_t *t = krun_session_tokens(sess, &n);
    const float *lg = krun_session_logits(sess);
    FUZZ_CHECK(krun_session_pos(sess) == base_h.pos && n == base_h.n_tokens);
    FUZZ_CHECK(krun_session_pending(sess) == base_h.n_tokens - base_h.pos);
    FUZZ_CHECK(memcmp(t, base + base_h.tokens_at, n * 4) == 0);
    FUZZ_CHECK(lg && memcmp(lg, base + base_h.logits_at, (size_t)base_h.vocab * 4) == 0);
}

static int same_model(const krun_state_hdr *h, const uint8_t *b)
{
    return h->set_id == base_h.set_id && h->config_xxh3 == base_h.config_xxh3 && h->n_layers == base_h.n_layers &&
           h->hidden == base_h.hidden && h->vocab == base_h.vocab && h->kda_heads == base_h.kda_heads &&
           h->kda_head_dim == base_h.kda_head_dim && h->conv_width == base_h.conv_width && h->kv_lora == base_h.kv_lora &&
           h->qk_rope == base_h.qk_rope && h->n_mla == base_h.n_mla &&
           memcmp(b + h->layer_types_at, base + base_h.layer_types_at, base_h.n_layers) == 0;
}


static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint64_t get64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

/* What a session without a drafter saves: 1.1 (1.2 only adds the drafter's section; statefile.c) */
#define SAVED_MINOR 1

/* 1 if the session loaded the state */
static int check_state(const uint8_t *data, size_t size)
{
    char path[64];
    krun_state_hdr h;
    krun_err e = {0}, pe = {0}, le = {0};
    uint64_t pos = 0, ntok = 0;
    int parsed, peeked, loaded;

    parsed = krun_state_parse(data, size, &h, &e) == 0;
    if (parsed) {
        FUZZ_CHECK(h.payload_len == krun_state_payload_len(&h, NULL) && h.payload_len != 0);
        FUZZ_CHECK(size == KRUN_STATE_HEADER + h.payload_len + KRUN_STATE_TRAILER);
        FUZZ_CHECK(h.pos <= h.n_tokens && h.n_kda + h.n_mla == h.n_layers);
        FUZZ_CHECK(h.layer_types_at == KRUN_STATE_HEADER && h.tokens_at == h.layer_types_at + (h.n_layers + 7) / 8 * 8);
        FUZZ_CHECK(h.layers_at == h.tokens_at + h.n_tokens * 4 && h.layers_at <= h.logits_at);
        /* the logits end the payload, or (1.2) the drafter's section follows them */
        if (!(h.flags & KRUN_STATE_DRAFTER))
            FUZZ_CHECK(h.logits_at + ((h.flags & KRUN_STATE_LOGITS) ? (uint64_t)h.vocab * 4 : 0) == KRUN_STATE_HEADER + h.payload_len);
        else
            FUZZ_CHECK(h.draft_at == h.logits_at + ((h.flags & KRUN_STATE_LOGITS) ? (uint64_t)h.vocab * 4 : 0) &&
                       h.draft_at < KRUN_STATE_HEADER + h.payload_len);
        FUZZ_CHECK(!(h.flags & KRUN_STATE_LOGITS) || h.pos >= 1);
        for (uint64_t i = 0; i < h.n_tokens; i++) {
            int32_t t;
            memcpy(&t, data + h.tokens_at + 4 * i, 4);
            FUZZ_CHECK(t >= 0 && (uint32_t)t < h.vocab);
        }
    } else {
        FUZZ_CHECK(e.code == KRUN_EINPUT && e.msg[0]);
    }

    if (fuzz_as_file(data, size, path)) return 0;
    peeked = krun_state_peek(path, &pos, &ntok, &pe) == 0;
    if (parsed) FUZZ_CHECK(peeked && pos == h.pos && ntok == h.n_tokens);
    if (!peeked) FUZZ_CHECK(pe.code == KRUN_EINPUT && pe.msg[0]);

    loaded = krun_session_load(sess, path, &le) == 0;
    if (!loaded) {
        FUZZ_CHECK((le.code == KRUN_EINPUT || le.code == KRUN_ENOMEM) && le.msg[0]);
        FUZZ_CHECK(!(parsed && same_model(&h, data) && h.n_tokens <= CTX)); /* a usable state is not refused */
        {
            /* session.h: a file refused before its payload (another model, the context, a bad
             * header) leaves the session as it was; a payload found damaged while it is read
             * straight into the session (its checksum, an id, a float) resets it: only a file
             * the parser refuses can do that, and what was read is never kept */
            size_t n;
            krun_session_tokens(sess, &n);
            if (krun_session_pos(sess) == 0 && n == 0) {
                FUZZ_CHECK(!parsed && krun_session_logits(sess) == NULL && krun_session_pending(sess) == 0);
                FUZZ_CHECK(krun_session_load(sess, base_path, &le) == 0);
            }
        }
        check_baseline();                                                     /* the session is as it was */
        return 0;
    }
    FUZZ_CHECK(parsed && same_model(&h, data) && h.n_tokens <= CTX);
    {
        size_t n;
        const int32_t *t = krun_session_tokens(sess, &n);
        const float *lg = krun_session_logits(sess);
        char *again = NULL;
        size_t again_len = 0;
        FUZZ_CHECK(krun_session_pos(sess) == h.pos && n == h.n_tokens && krun_session_pending(sess) == n - h.pos);
        FUZZ_CHECK(n == 0 || memcmp(t, data + h.tokens_at, n * 4) == 0);
        if (h.flags & KRUN_STATE_LOGITS) FUZZ_CHECK(lg && memcmp(lg, data + h.logits_at, (size_t)h.vocab * 4) == 0);
        else FUZZ_CHECK(lg == NULL);
        /* saved again: the same bytes, but for the minor version and the
         * reserved fields: a higher minor is read as 1.1 (STATE.md §2, its
         * reserved space ignored) and saved as what it was read as; a 1.0
         * file's PRNG words become its seed (the first), stream 0, the reply
         * at the end of the history and the sampler of 1.1 */
        FUZZ_CHECK(krun_session_save(sess, save_path, &le) == 0);
        FUZZ_CHECK(kio_read_file(save_path, (size_t)1 << 30, &again, &again_len) == 0);
        if (h.flags & KRUN_STATE_DRAFTER) {
            /* this session has no drafter: the drafter's section was checked and dropped, and the
             * state is saved as 1.1 without it (STATE.md §7): the same history, position, logits */
            krun_state_hdr h2;
            FUZZ_CHECK(krun_state_parse(again, again_len, &h2, &e) == 0);
            FUZZ_CHECK(h2.minor == SAVED_MINOR && !(h2.flags & KRUN_STATE_DRAFTER) && h2.pos == h.pos && h2.n_tokens == h.n_tokens);
            FUZZ_CHECK(memcmp(again + h2.tokens_at, data + h.tokens_at, (size_t)h.n_tokens * 4) == 0);
            free(again);
            FUZZ_CHECK(krun_session_load(sess, base_path, &le) == 0);
            check_baseline();
            return 1;
        }
        FUZZ_CHECK(again_len == size);
        if (h.minor != SAVED_MINOR) {
            uint8_t *a = (uint8_t *)again;
            FUZZ_CHECK(again[10] == SAVED_MINOR && again[11] == 0);
            again[10] = data[10];
            again[11] = data[11];
            for (size_t i = 92; i < 96; i++) { FUZZ_CHECK(again[i] == 0); again[i] = data[i]; }   /* reserved */
            for (size_t i = 136; i < 152; i++) { FUZZ_CHECK(again[i] == 0); again[i] = data[i]; } /* reserved */
            FUZZ_CHECK(get64(a + 96) == get64(data + 96) && (a[120] | a[121] << 8) == 1 && !a[122] && !a[123]);
            FUZZ_CHECK(!a[124] && !a[125] && !a[126] && !a[127]);
            if (h.minor == 0) FUZZ_CHECK(get64(a + 104) == 0 && get64(a + 112) == h.n_tokens);
            memcpy(a + 104, data + 104, 24);
            put64(a + 152, XXH3_64bits(again, 152));
        }
        FUZZ_CHECK(memcmp(again, data, size) == 0);
        free(again);
    }
    /* back to the baseline for the next input */
    FUZZ_CHECK(krun_session_load(sess, base_path, &le) == 0);
    check_baseline();
    return 1;
}

/* The header checksum and the payload checksum (STATE.md §2) recomputed;
 * with fix_len, payload_len first set to what the file's length implies. */
static void reseal(uint8_t *b, size_t n, int fix_len)
{
    if (fix_len) put64(b + 128, n - KRUN_STATE_HEADER - KRUN_STATE_TRAILER);
    put64(b + 152, XXH3_64bits(b, 152));
    put64(b + n - KRUN_STATE_TRAILER, XXH3_64bits(b + KRUN_STATE_HEADER, n - KRUN_STATE_HEADER - KRUN_STATE_TRAILER));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy;
    if (check_state(data, size)) fuzz_accepted++; /* counted as given, not as re-sealed */
    if (size < KRUN_STATE_HEADER + KRUN_STATE_TRAILER || !(copy = malloc(size))) return 0;
    for (int fix_len = 0; fix_len <= 1; fix_len++) {
        memcpy(copy, data, size);
        reseal(copy, size, fix_len);
        check_state(copy, size);
    }
    free(copy);
    return 0;
}
