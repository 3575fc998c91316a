/* The model file must stay the file that was opened (store.h, kstore_file_changed; issue 34.1).
 *
 * A file overwritten in place while krun runs hands krun other bytes: an extent verified once
 * (--verify first) and read again later, a page of a mapping.  Two things catch it, at no
 * measurable cost per token:
 *
 *   - the file's identity (format/kpk_ident.c): size, modification and change times, taken when
 *     it was opened, compared with fstat(2) after every forward block, before a token computed in
 *     the block is used (k3_forward): a write, a truncation, a repair in place all show there,
 *     since the kernel sets the times before the data changes.  One fstat per member file;
 *   - a read from a mapping past the file's end (the file was truncated under --io mmap or an
 *     in-place mapping) raises SIGBUS, which would kill the process with no word (issue 34.1:
 *     `truncate -s 40M` under krun serve).  The handler below puts a page of zeros where the
 *     file's page was, notes which mapping it hit, and lets the computation go on to the end of
 *     its block; the block then fails (kstore_file_changed), so nothing computed from the zeros
 *     is used, and the process says what happened.
 *
 * Every mapping of a member file is registered here (kstore_map_members) and unregistered before
 * it is unmapped (kstore_close).  The handler is installed once, for the process, the first time;
 * a SIGBUS outside every registered mapping gets the default action (the process ends, as before). */
#include "store_internal.h"

#include "format/kos.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define WATCHED_MAX 256

static struct {
    _Atomic uintptr_t lo, hi;  /* [lo, hi): a mapping; lo 0: a free entry */
    atomic_int hit;            /* a read past the file's end faulted in it */
} watched[WATCHED_MAX];
static uintptr_t page_mask;
static pthread_once_t installed = PTHREAD_ONCE_INIT;
static struct sigaction before;   /* the action there was (called for a SIGBUS that is not ours) */

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < WATCHED_MAX; i++) {
        uintptr_t lo = atomic_load(&watched[i].lo), hi = atomic_load(&watched[i].hi);
        if (!lo || a < lo || a >= hi) continue;
        /* a page of zeros in the file's place (mmap is a plain system call: safe in a handler) */
        if (mmap((void *)(a & page_mask), ~page_mask + 1, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
            break;
        atomic_store(&watched[i].hit, 1);
        return;
    }
    /* not a mapping of a model file: what would have happened without this handler */
    if (before.sa_flags & SA_SIGINFO && before.sa_sigaction) { before.sa_sigaction(sig, si, uc); return; }
    if (before.sa_handler != SIG_DFL && before.sa_handler != SIG_IGN && before.sa_handler) { before.sa_handler(sig); return; }
    signal(SIGBUS, SIG_DFL);      /* the faulting access runs again, and ends the process */
}

static void install(void)
{
    struct sigaction sa;
    page_mask = ~(uintptr_t)(kos_page_size() - 1);
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &before);
}

int kstore_ident_watch(const void *p, size_t len)
{
    pthread_once(&installed, install);
    for (int i = 0; i < WATCHED_MAX; i++) {
        uintptr_t zero = 0;
        if (atomic_load(&watched[i].lo)) continue;
        atomic_store(&watched[i].hi, (uintptr_t)p + len);
        atomic_store(&watched[i].hit, 0);
        if (atomic_compare_exchange_strong(&watched[i].lo, &zero, (uintptr_t)p)) return i;
    }
    return -1;                    /* more mappings than entries: this one is not watched (a SIGBUS in it ends the process) */
}

static int kstore_ident_hit(int w) { return w >= 0 && atomic_load(&watched[w].hit) > 0; }

void kstore_ident_unwatch(int w)
{
    if (w < 0) return;
    atomic_store(&watched[w].hi, 0);     /* the handler stops matching it before it is unmapped */
    atomic_store(&watched[w].lo, 0);
}

int kstore_file_changed(const kstore *s, krun_err *err)
{
    kpk_err e;
    for (uint16_t m = 0; s->map_watch && m < s->nm; m++)
        if (kstore_ident_hit(s->map_watch[m]))
            return krun_err_set(err, KRUN_EDATA, "%s: a read from its mapping went past the end of %s: the file was truncated or "
                                "replaced in place while it was in use; nothing computed from it since is used", kpk_path(s->f),
                                kpk_member_path(s->f, m));
    if (kpk_unchanged(s->f, &e))
        return krun_err_set(err, KRUN_EDATA, "%s; nothing computed from it since is used", e.msg);
    return 0;
}
