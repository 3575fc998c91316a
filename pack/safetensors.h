/* Reading safetensors headers (spec §1.3): [u64 LE N][N bytes JSON][data].
 * Only headers are parsed here; tensor bytes are read by the converter. */
#ifndef KPACK_SAFETENSORS_H
#define KPACK_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

typedef struct st_tensor {
    const char *name;       /* points into the file's name arena */
    const char *st_dtype;   /* the safetensors spelling ("BF16", "I64", "F8_E4M3", ...): static */
    unsigned bits;          /* bits per element (4 for F4, 6 for F6_*, 8 .. 64) */
    int dtype;              /* the KPK_DT_* of the same bytes (F32, BF16, F16, U8), or 0: none
                               (the archive keeps such a tensor as BYTES, FORMAT.md §9.1) */
    int ndim;
    uint64_t shape[8];
    uint64_t begin, end;    /* absolute file offsets: 8 + N + data_offsets */
} st_tensor;

typedef struct st_file {
    char *path;
    uint64_t file_size;     /* actual size on disk */
    uint64_t header_len;    /* N */
    uint64_t data_start;    /* 8 + N */
    uint64_t expected_size; /* 8 + N + the largest data end */
    st_tensor *t;
    size_t n;
    char *arena;            /* tensor names */
    int io_errno;           /* after a failed st_open: the errno of the open, stat or read that
                               failed (ENODATA: the file ended early); 0: not a safetensors file */
} st_file;

/* Parse and validate a header: JSON well formed, every entry has one of
 * the safetensors dtypes (all of them: the archive keeps any tensor's
 * bytes; the text tensors' dtypes are the schema's business), a shape and
 * data_offsets with end - begin == elements * bits / 8 (a whole number of
 * bytes), entries do not overlap.  Does NOT require the file to be complete:
 * compare expected_size with file_size for that.  Errors name the file and,
 * where there is one, the tensor. */
int st_open(const char *path, st_file *out, char *err, size_t errlen);
/* The same checks on a header held in memory: head is the file's first len =
 * 8 + N bytes, file_size its size (a shard deleted by `convert --consume`,
 * whose header the consume log keeps); path names it in messages. */
int st_parse(const char *path, const uint8_t *head, uint64_t len, uint64_t file_size, st_file *out, char *err,
             size_t errlen);
/* The dtype's bits per element and KPK dtype (0 if none); 0 bits: not a safetensors dtype. */
unsigned st_dtype_bits(const char *name, int *kpk_dtype);
void st_free(st_file *f);

#endif
