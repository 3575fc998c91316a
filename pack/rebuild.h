/* Rebuilding the files of the download from a KPK file with an archive
 * (docs/FORMAT.md §9.2): the recipe in the manifest, and each file as an
 * ordered list of pieces (byte ranges of decoded extents) that tile it.
 * `kpack export` writes them; `kpack export --check` hashes them. */
#ifndef KPACK_REBUILD_H
#define KPACK_REBUILD_H

#include "format/kpk_reader.h"
#include "format/kprogress.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* One file of the recipe (strings point into the recipe's JSON). */
typedef struct kr_file {
    const char *name;        /* relative path, '/'-separated (checked: no "..", not absolute) */
    int safetensors;         /* kind "safetensors" (else "file") */
    uint64_t size;
    const char *sha256;      /* recorded when converting (checked then), or NULL */
    const char *sha_from;    /* "--sha256", "hf-blob" or NULL */
} kr_file;

typedef struct kr_recipe {
    json_t *root;            /* the manifest */
    kr_file *files;          /* in recipe order (sorted by name) */
    size_t n;
    json_t *not_kept;        /* array of {name, size, reason} */
} kr_recipe;

/* A name the recipe may give a file (FORMAT.md §9.2): relative, '/'-separated
 * components, none empty, "." or "..": a rebuild writes it under its
 * directory and nowhere else.  The one rule export and verify apply. */
int kr_name_ok(const char *name);

/* Load the recipe.  -1 with err when the file has none (converted without
 * an archive: err says why the originals cannot be rebuilt) or it is
 * malformed; *damaged says which (1: the recipe is there but wrong). */
int kr_recipe_load(kpk_file *f, kr_recipe *r, int *damaged, char *err, size_t errlen);
void kr_recipe_free(kr_recipe *r);
/* The file named name, or NULL. */
const kr_file *kr_find(const kr_recipe *r, const char *name);

/* A byte range of the rebuilt file: bytes [pos, pos + len) of extent's
 * decoded bytes go to [off, off + len). */
typedef struct kr_piece { uint64_t off, len, pos; uint32_t extent; } kr_piece;

/* The pieces of one file, in file order, tiling [0, size) exactly (a file
 * whose archive does not add up is damage: err names the file and what is
 * missing or overlapping).  *out is malloc'd. */
int kr_pieces(kpk_file *f, const kr_file *rf, kr_piece **out, size_t *n, kpk_err *err);

/* Stream the file's bytes, in order, through sink (buf: scratch of buflen
 * bytes).  Decoded blocks are checked as they are read; uncompressed
 * extents are not (check them first, or compare a SHA-256 after).  Source
 * pages are dropped from the page cache as they are read. */
typedef int (*kr_sink)(void *ctx, const uint8_t *buf, size_t len, uint64_t off);
int kr_stream(kpk_file *f, const kr_piece *p, size_t n, uint8_t *buf, size_t buflen, kr_sink sink, void *ctx,
              kprogress *prog, kpk_err *err);

/* What `kpack verify` checks of the archive, so that "verify OK" means
 * export will work: the recipe loads (kr_recipe_load: its names, kinds,
 * sizes, order) and every file's pieces tile it (kr_pieces).  0 when it
 * does or the file has no archive; -1 with err, *damaged saying whether
 * the file is damaged (else an I/O error or out of memory). */
int kr_check(kpk_file *f, int *damaged, char *err, size_t errlen);

/* Check (kpk_extent_verify) every extent the pieces read, once each. */
int kr_verify_extents(kpk_file *f, const kr_piece *p, size_t n, kpk_err *err);

#endif
