/* The release: one version for kpack, krun and the Debian package.  Bump it
 * here and in debian/changelog together (tests/cli/test_install.sh fails when
 * they differ).  It is also the `producer` kpack records in a KPK manifest.
 *
 * The files have their own versions, which --version prints beside it: the
 * KPK format (format/kpk.h, docs/FORMAT.md §12) and krun's state file
 * (run/session/statefile.h, docs/STATE.md). */
#ifndef KPK_RELEASE_H
#define KPK_RELEASE_H

#include <stdio.h>

#define KPK_RELEASE "0.3.0"

/* The first lines of `TOOL --version`: "TOOL RELEASE", then the KPK versions
 * read (every minor of the major, a later one when it uses no newer feature)
 * and, when writes_kpk, written. */
void kpk_release_print(FILE *f, const char *tool, int writes_kpk);

#endif
