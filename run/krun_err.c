#include "krun_err.h"

#include "kpk.h"

#include <stdarg.h>
#include <stdio.h>

void krun_err_set(krun_err *e, int code, const char *fmt, ...)
{
    va_list ap;
    if (!e) return;
    e->code = code;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
}

int krun_code_of_kpk(int kpk_code)
{
    switch (kpk_code) {
    case KPK_ENOMEM: return KRUN_ENOMEM;
    case KPK_EFORMAT:
    case KPK_ECHECKSUM:
    case KPK_EINVAL: return KRUN_EDATA;
    default: return KRUN_EINPUT;    /* KPK_EIO, KPK_ENOTKPK, KPK_EVERSION */
    }
}
