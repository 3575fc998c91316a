/* The safetensors header parser (pack/safetensors.c, st_open) on arbitrary
 * files.  Whatever it accepts must describe tensors inside the data region,
 * sized exactly by dtype (any safetensors dtype, in bits) and shape, sorted
 * and not overlapping. */
#include "fuzz.h"

#include "format/kpk.h"
#include "pack/safetensors.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64], err[700];
    st_file f;
    if (fuzz_as_file(data, size, path)) return 0;
    err[0] = 0;
    if (st_open(path, &f, err, sizeof err)) {
        /* refused: with a message that names the file */
        FUZZ_CHECK(strncmp(err, path, strlen(path)) == 0 && strlen(err) > strlen(path) + 2);
        return 0;
    }
    FUZZ_CHECK(f.file_size == size);
    FUZZ_CHECK(f.header_len >= 2 && f.data_start == 8 + f.header_len && f.data_start <= size);
    FUZZ_CHECK(f.expected_size >= f.data_start);
    uint64_t covered = 0; /* end of the non-empty tensors so far */
    for (size_t i = 0; i < f.n; i++) {
        const st_tensor *t = &f.t[i];
        uint64_t numel = 1;
        FUZZ_CHECK(t->name && strcmp(t->name, "__metadata__") != 0);
        int kdt = -1;
        FUZZ_CHECK(t->st_dtype && t->bits > 0 && st_dtype_bits(t->st_dtype, &kdt) == t->bits && kdt == t->dtype);
        FUZZ_CHECK(t->dtype == 0 || kpk_dtype_size(t->dtype) * 8 == t->bits);
        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= 8);
        for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
        FUZZ_CHECK(t->begin >= f.data_start && t->end >= t->begin && t->end <= f.expected_size);
        FUZZ_CHECK((numel * t->bits) % 8 == 0 && t->end - t->begin == numel * t->bits / 8);
        FUZZ_CHECK(i == 0 || f.t[i - 1].begin <= t->begin);
        if (t->end > t->begin) { /* no two non-empty tensors share a byte */
            FUZZ_CHECK(t->begin >= covered);
            covered = t->end;
        }
    }
    fuzz_accepted++;
    st_free(&f);
    return 0;
}
