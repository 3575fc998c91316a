#include "krun_err.h"

#include "kpk.h"

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
