/* Reading safetensors headers (spec §1.3): [u64 LE N][N bytes JSON][data].
 * Only headers are parsed here; tensor bytes are read by the converter. */
#ifndef KPACK_SAFETENSORS_H
#define KPACK_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

typedef struct st_tensor {
    const char *name;       /* points into the file's name arena */
    int dtype;              /* KPK_DT_* */
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

/* Parse and validate a header: JSON well formed, every entry has a known
 * dtype, a shape and data_offsets with end - begin == elements * size,
 * entries do not overlap.  Does NOT require the file to be complete:
 * compare expected_size with file_size for that.  Errors name the file and,
 * where there is one, the tensor. */
int st_open(const char *path, st_file *out, char *err, size_t errlen);
void st_free(st_file *f);

#endif
