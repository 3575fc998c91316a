/* ktok_load_kpk: the tokenizer from a KPK file's meta extent.  See tokenizer_kpk.h. */
#include "tokenizer_kpk.h"

#include "format/k3_config.h"

#include <stdlib.h>

/* A meta member that is missing is "absent"; any other failure says what went wrong. */
static int meta_status(const kpk_err *e)
{
    switch (e->code) {
    case KPK_EINVAL: return KTOK_KPK_ABSENT;
    case KPK_EFORMAT: case KPK_ECHECKSUM: return KTOK_KPK_BAD;
    default: return KTOK_KPK_IO;
    }
}

/* Fail with status st: err as set, but a damaged file is KRUN_EDATA whatever its part said. */
static void fail(krun_err *err, int *status, int st)
{
    *status = st;
    if (st == KTOK_KPK_BAD) err->code = KRUN_EDATA;
}

ktok *ktok_load_kpk(const kpk_file *f, int *status, krun_err *err)
{
    char *ranks = NULL, *tcfg = NULL, *cfg = NULL, cerr[800];
    size_t rlen = 0, tlen = 0, clen = 0, nranks = 0, nsp = 0;
    ktok_special *sp = NULL;
    ktok *tk = NULL;
    kpk_err e = {0};
    k3_config c;

    *status = KTOK_KPK_IO;
    if (kpk_meta_file(f, "tiktoken.model", &ranks, &rlen, &e)) {
        if (meta_status(&e) == KTOK_KPK_ABSENT)
            krun_err_set(err, KRUN_EINPUT, "%s: no tokenizer embedded (no tiktoken.model in the meta extent)", kpk_path(f));
        else
            krun_err_kpk(err, &e);
        fail(err, status, meta_status(&e));
        return NULL;
    }
    if (kpk_meta_file(f, "config.json", &cfg, &clen, &e)) {
        krun_err_kpk(err, &e);
        fail(err, status, meta_status(&e) == KTOK_KPK_ABSENT ? KTOK_KPK_BAD : meta_status(&e));
        goto out;
    }
    if (k3_config_parse(cfg, clen, &c, cerr, sizeof cerr)) {
        krun_err_set(err, KRUN_EDATA, "%s: embedded config.json: %s", kpk_path(f), cerr);
        fail(err, status, KTOK_KPK_BAD);
        goto out;
    }
    /* tokenizer_config.json is optional (a rank file alone has no specials) */
    if (kpk_meta_file(f, "tokenizer_config.json", &tcfg, &tlen, &e) && e.code != KPK_EINVAL) {
        krun_err_kpk(err, &e);
        fail(err, status, meta_status(&e));
        goto out;
    }
    if (tcfg && ktok_specials_from_config(tcfg, tlen, &sp, &nsp, err)) {
        krun_err_prefix(err, "%s: embedded tokenizer_config.json: ", kpk_path(f));
        fail(err, status, KTOK_KPK_BAD);
        goto out;
    }
    for (size_t i = 0; i < rlen; i++) nranks += ranks[i] == '\n';
    if ((size_t)c.vocab > nranks &&
        ktok_specials_fill_reserved(&sp, &nsp, (int32_t)nranks, (int32_t)((size_t)c.vocab - nranks))) {
        krun_err_set(err, KRUN_ENOMEM, "out of memory");
        goto out;
    }
    tk = ktok_load(ranks, rlen, sp, nsp, err);
    if (!tk) {
        krun_err_prefix(err, "%s: embedded tokenizer: ", kpk_path(f));
        fail(err, status, KTOK_KPK_BAD);
        goto out;
    }
    *status = KTOK_KPK_OK;
out:
    ktok_specials_free(sp, nsp);
    free(ranks);
    free(tcfg);
    free(cfg);
    return tk;
}
