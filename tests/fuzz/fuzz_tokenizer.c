/* The tokenizer (run/text/tokenizer.c) on arbitrary bytes, with a rank file in
 * the real format: encode then decode gives back the input byte for byte
 * (documented for any bytes, valid UTF-8 or not), every id is in the
 * vocabulary, the JIT and the interpreter give the same ids, and the regex
 * pieces tile the text.
 *
 * The rank file: $KPK_FUZZ_TIKTOKEN, else the real Kimi file of the shared
 * fixtures (../shared/fixtures/tokenizer/tiktoken.model), else the synthetic
 * one `make fuzz` generates (build/fuzz/seeds/tiktoken.model).  The first
 * input byte chooses whether special-token strings are honoured. */
#include "fuzz.h"

#include "format/kio.h"
#include "run/text/tokenizer.h"

#include <string.h>

static ktok *tk;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *env = getenv("KPK_FUZZ_TIKTOKEN");
    const char *paths[] = {env, "../shared/fixtures/tokenizer/tiktoken.model", "build/fuzz/seeds/tiktoken.model"};
    ktok_special *sp = NULL;
    size_t nsp = 0;
    krun_err ke = {0, ""};
    char *err = ke.msg;
    (void)argc;
    (void)argv;
    for (size_t i = 0; i < sizeof paths / sizeof paths[0] && !tk; i++) {
        char *ranks;
        size_t len;
        if (!paths[i] || kio_read_file(paths[i], (size_t)64 << 20, &ranks, &len)) continue;
        if (ktok_specials_builtin("k3", &sp, &nsp) == 0) {
            tk = ktok_load(ranks, len, sp, nsp, &ke);
            if (!tk) fprintf(stderr, "fuzz_tokenizer: %s: %s\n", paths[i], err);
            else fprintf(stderr, "fuzz_tokenizer: rank file %s (%zu ranks)\n", paths[i], ktok_n_ranks(tk));
            ktok_specials_free(sp, nsp);
        }
        free(ranks);
    }
    if (!tk) {
        fprintf(stderr, "fuzz_tokenizer: no rank file (set KPK_FUZZ_TIKTOKEN)\n");
        exit(2);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int32_t *ids = NULL, *ids2 = NULL;
    size_t n = 0, n2 = 0, *ends = NULL, npieces = 0;
    uint8_t *out = NULL;
    size_t out_len = 0;
    int allow_special;
    const char *text;
    size_t len;

    if (size == 0) return 0;
    allow_special = data[0] & 1;
    text = (const char *)data + 1;
    len = size - 1;

    FUZZ_CHECK(ktok_encode(tk, text, len, allow_special, &ids, &n) == 0);
    for (size_t i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && (size_t)ids[i] < ktok_vocab_size(tk));
    FUZZ_CHECK(ktok_decode(tk, ids, n, &out, &out_len) == 0);
    FUZZ_CHECK(out_len == len && memcmp(out, text, len) == 0);
    if (ktok_uses_jit(tk)) {
        ktok_set_jit(tk, 0);
        FUZZ_CHECK(ktok_encode(tk, text, len, allow_special, &ids2, &n2) == 0);
        ktok_set_jit(tk, 1);
        FUZZ_CHECK(n2 == n && (n == 0 || memcmp(ids, ids2, n * sizeof *ids) == 0));
    }
    if (ktok_split(tk, text, len, &ends, &npieces) == 0) {
        size_t at = 0;
        for (size_t i = 0; i < npieces; i++) {
            FUZZ_CHECK(ends[i] > at);
            at = ends[i];
        }
        FUZZ_CHECK(at == len);
    }
    FUZZ_CHECK(ktok_utf8_complete((const uint8_t *)text, len) <= len);
    fuzz_accepted++;
    free(ids);
    free(ids2);
    free(out);
    free(ends);
    return 0;
}
