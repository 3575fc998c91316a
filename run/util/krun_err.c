/* krun's one error type (krun_err.h). */
#include "krun_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int krun_code_of_kpk(int kpk_code)
{
    switch (kpk_code) {
    case KPK_ENOMEM: return KRUN_ENOMEM;
    case KPK_EFORMAT:
    case KPK_ECHECKSUM:
    case KPK_ECHANGED:
    case KPK_EINVAL: return KRUN_EDATA;
    default: return KRUN_EINPUT;    /* KPK_EIO, KPK_ENOTKPK, KPK_EVERSION, KPK_EMEMBER */
    }
}

int krun_err_set(krun_err *e, int code, const char *fmt, ...)
{
    va_list ap;
    e->code = code;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int krun_err_kpk(krun_err *e, const kpk_err *k)
{
    return krun_err_set(e, krun_code_of_kpk(k->code), "%s", k->msg);
}

int krun_err_prefix(krun_err *e, const char *fmt, ...)
{
    char msg[sizeof e->msg];
    size_t n;
    va_list ap;
    va_start(ap, fmt);
    n = (size_t)vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < sizeof msg) snprintf(msg + n, sizeof msg - n, "%s", e->msg);
    memcpy(e->msg, msg, sizeof msg);
    return -1;
}
