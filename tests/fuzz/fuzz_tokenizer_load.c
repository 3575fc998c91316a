/* Loading a tokenizer from arbitrary files (run/text/tokenizer.c): ktok_load on
 * a rank file and ktok_specials_from_config on a tokenizer_config.json.  The
 * input is the JSON, a line "\n--\n", then the rank file (no separator: all
 * rank file, no specials).  A tokenizer that loads must be consistent: every
 * rank's bytes map back to that rank, and text round-trips through it. */
#include "fuzz.h"

#include "run/text/tokenizer.h"

#include <string.h>

static const char sample[] = "Hello, world! 123 <|im_end|> caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87\n\t  x";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char sep[] = "\n--\n";
    const uint8_t *ranks = data, *cut = NULL;
    size_t nranks_len = size;
    ktok_special *sp = NULL;
    size_t nsp = 0;
    krun_err ke = {0, ""};
    char *err = ke.msg;
    ktok *tk;

    for (size_t i = 0; i + 4 <= size; i++)
        if (memcmp(data + i, sep, 4) == 0) { cut = data + i; break; }
    if (cut) {
        if (ktok_specials_from_config((const char *)data, (size_t)(cut - data), &sp, &nsp, &ke)) {
            FUZZ_CHECK(err[0]);
            sp = NULL;
            nsp = 0;
        }
        ranks = cut + 4;
        nranks_len = size - (size_t)(ranks - data);
    }
    err[0] = 0;
    tk = ktok_load((const char *)ranks, nranks_len, sp, nsp, &ke);
    ktok_specials_free(sp, nsp);
    if (!tk) {
        FUZZ_CHECK(err[0]);
        return 0;
    }
    FUZZ_CHECK(ktok_n_ranks(tk) >= 256 && ktok_n_ranks(tk) <= ktok_vocab_size(tk));
    for (size_t r = 0; r < ktok_n_ranks(tk); r++) {
        size_t blen = 0;
        const uint8_t *b = ktok_id_bytes(tk, (int32_t)r, &blen);
        FUZZ_CHECK(b && blen > 0 && ktok_rank_of(tk, b, blen) == (int32_t)r);
    }
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        size_t n = 0, out_len = 0;
        uint8_t *out = NULL;
        FUZZ_CHECK(ktok_encode(tk, sample, sizeof sample - 1, special, &ids, &n) == 0);
        FUZZ_CHECK(ktok_decode(tk, ids, n, &out, &out_len) == 0);
        FUZZ_CHECK(out_len == sizeof sample - 1 && memcmp(out, sample, out_len) == 0);
        free(ids);
        free(out);
    }
    fuzz_accepted++;
    ktok_free(tk);
    return 0;
}
