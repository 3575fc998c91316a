/* kpack on a drafter checkpoint: Kimi K3's EAGLE-3.1 drafter
 * (../shared/spec/K3_EAGLE.md), one `model.safetensors` and its `config.json`.
 *
 * check-source and convert recognise such a directory (its config names an
 * EAGLE drafter) and take this path: the roster of K3_EAGLE §1.3 exactly
 * (any other name, dtype or shape is refused with the tensor named), the
 * file whole, SHA-256 of both files always computed, and the pinned digests
 * of the released revision (§1.2) recognised and named.  A converted drafter
 * is a KPK file of its own (docs/FORMAT.md §15: meta, the drafter's weights
 * and embedding, the archive), written through the same plan, copy and
 * directory code as a model, so it is resumable, verified and exportable
 * like one. */
#ifndef KPACK_DRAFTER_H
#define KPACK_DRAFTER_H

#include "source.h"
#include "format/k3_eagle.h"

#include <jansson.h>
#include <stdio.h>

typedef struct kd_source {
    k3_source src;             /* one shard (model.safetensors), config.json its one extra: what the copy reads */
    k3_eagle_config cfg;       /* valid when src.have_cfg */
    uint32_t loc[K3E_MAX_TAPS + K3E_ROLE_COUNT];   /* roster index -> tensor index in the header */
    char config_sha[65];       /* computed */
    int pinned;                /* both files are the pinned release (K3_EAGLE §1.2) */
    double sha_seconds;
} kd_source;

/* Does dir hold a drafter checkpoint: a config.json with `eagle_config` or
 * an EAGLE architecture?  (A model's config has neither.)  1, 0, or -1 with
 * errno when config.json exists but cannot be read (an I/O error). */
int kd_is_drafter_dir(const char *dir);

/* Index and check the directory: config, header, roster, size; the SHA-256
 * of both files (with a progress line when progress is set), compared with
 * sums (sha256sum format, may be NULL) and the pinned digests.  Returns 0
 * when the directory could be read (ks_ok(&d->src) is the verdict), -1 with
 * err when it cannot be read as a drafter at all (exit 2 when
 * ks_io_errno). */
int kd_open(const char *dir, const char *sums, int progress, kd_source *d, char *err, size_t errlen);
void kd_free(kd_source *d);

void kd_print(const kd_source *d, FILE *out);
json_t *kd_json(const kd_source *d);
/* What the manifest records about the drafter (FORMAT.md §15). */
json_t *kd_manifest_json(const kd_source *d);

/* The pinned revision's config.json, kept in the archive, gets its digest as the expected one
 * (checked when the archive is hashed, recorded as "pinned"). */
struct ka_archive;
void kd_archive_pins(const kd_source *d, struct ka_archive *a);

/* kpack check-source DIR on a drafter directory (after cmd_check_source's options). */
int kd_check_source(const char *dir, const char *sums, int json, int quiet);

#endif
