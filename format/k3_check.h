/* Does a KPK file hold exactly the Kimi K3 model its config describes?  The
 * check krun needs before it runs a file, and `kpack verify` runs so that
 * "verify OK" means krun will accept it.  Structural rules of the container
 * are kpk_open's; this is the model's schema (format/k3_schema.h). */
#ifndef K3_CHECK_H
#define K3_CHECK_H

#include "k3_config.h"
#include "kpk_reader.h"

#include <stddef.h>

/* Every tensor the config implies is present, with an accepted dtype, its
 * shape, in the extent of its kind/layer/expert, in canonical order; no
 * trunk or expert extent lies beyond the config; the model extents hold
 * nothing else; the 16-bit float tensors share one type (BF16 or F16: a
 * relabelled tensor keeps its size, only this catches it); the meta extent
 * holds config.json and only files (BYTES, 1-D).  Returns 0, or -1 with a
 * message naming the tensor or extent in err. */
int k3_check_file(const kpk_file *f, const k3_config *cfg, char *err, size_t errlen);

/* Read and parse the embedded config.json, then k3_check_file.  *cfg is
 * filled when the config parsed. */
int k3_check_kpk(const kpk_file *f, k3_config *cfg, char *err, size_t errlen);

#endif
