/* `--version` of kpack and krun (release.h). */
#include "release.h"

#include "kpk.h"

void kpk_release_print(FILE *f, const char *tool, int writes_kpk)
{
    fprintf(f, "%s %s\n", tool, KPK_RELEASE);
    if (writes_kpk) fprintf(f, "KPK format: writes %d.%d\n", KPK_VERSION_MAJOR, KPK_VERSION_MINOR);
    fprintf(f, "KPK format: reads %d.0 to %d.%d, and a later %d.x that uses no feature newer than %d.%d\n", KPK_VERSION_MAJOR,
            KPK_VERSION_MAJOR, KPK_VERSION_MINOR, KPK_VERSION_MAJOR, KPK_VERSION_MAJOR, KPK_VERSION_MINOR);
}
