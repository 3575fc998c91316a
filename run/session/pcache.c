/* The prefix cache (pcache.h; docs/RUNTIME.md §9). */
#include "pcache.h"

#include "statefile.h"
#include "format/kio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

enum { PC_NONE = 0, PC_PREAMBLE, PC_PROMPT, PC_REPLY };   /* what a slot's state is as an entry */

typedef struct pc_slot {
    krun_session *s;           /* the model's slot */
    int kind;                  /* PC_NONE: its state is no entry */
    uint64_t used;             /* the clock at its last use */
    int writing;               /* the writer has it (queued or writing): it stays as it is */
    int on_disk;               /* its entry is in a file too */
    krun_session *marker;      /* a snapshot of that session's is due in it (krun_session_mark) */
    struct timespec t_used;    /* when its entry was made or last used: its file's mtime once written */
} pc_slot;

typedef struct pc_file {
    char name[64];
    uint64_t hash;             /* XXH3-64 of its tokens */
    size_t pos;
    int logits;
    uint64_t bytes;
    int64_t mtime;             /* ns: the last use */
} pc_file;

struct krun_pcache {
    krun_model *m;
    krun_pcache_opts o;
    char *dir;                 /* DIR/k3-<set_id>-<config hash>, or NULL */
    int dirfd, lockfd;
    pc_slot *slots;
    size_t n_slots;
    pc_file *files;            /* the directory at the last look */
    size_t n_files, cap_files;
    uint64_t writing_bytes;      /* entries this process is writing now (room made for them, no file yet) */
    uint64_t clock;
    krun_session *file_marker; /* whose snapshot goes straight to a file (no free slot) */
    char file_mark_name[64];
    uint64_t file_mark_bytes;  /* its entry's size, counted in writing_bytes until it is settled */
    char **warned;             /* files warned about and not removable: not again */
    size_t n_warned;
    pthread_mutex_t mu;        /* the slots' and files' records, the queue, the stats */
    pthread_cond_t cv;
    pthread_t thread;
    int have_thread, quit;
    size_t *queue, qhead, qn;  /* slots to write, in order */
    krun_pcache_stats st;
};

/* ---- small things ---------------------------------------------------------------- */

static void warn(krun_pcache *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn(krun_pcache *c, const char *fmt, ...)
{
    va_list ap;
    if (!c->o.log) return;
    va_start(ap, fmt);
    fprintf(c->o.log, "%s: prefix cache: ", c->o.prog ? c->o.prog : "krun");
    vfprintf(c->o.log, fmt, ap);
    fputc('\n', c->o.log);
    fflush(c->o.log);
    va_end(ap);
}

static uint64_t hash_ids(const int32_t *ids, size_t n) { return XXH3_64bits(ids, n * sizeof *ids); }

static void file_name(char *out, size_t len, uint64_t hash, size_t pos, int logits)
{
    snprintf(out, len, "%016llx-%zu%s.krs", (unsigned long long)hash, pos, logits ? "-l" : "");
}

/* An entry file's name read back; 0 if it is not one (exactly as file_name writes it). */
static int parse_name(const char *name, pc_file *f)
{
    unsigned long long h;
    size_t pos;
    char again[64];
    if (strlen(name) >= sizeof again || sscanf(name, "%16llx-%zu", &h, &pos) != 2 || pos == 0) return 0;
    for (int l = 0; l < 2; l++) {
        file_name(again, sizeof again, h, pos, l);
        if (!strcmp(again, name)) {
            snprintf(f->name, sizeof f->name, "%s", name);
            f->hash = h;
            f->pos = pos;
            f->logits = l;
            return 1;
        }
    }
    return 0;
}

/* Bytes of an entry of pos positions as a file (its size in RAM counted alike). */
static uint64_t entry_bytes(const krun_model *m, size_t pos, int logits) { return krun_model_state_bytes(m, pos, logits); }

static pc_slot *slot_of(krun_pcache *c, const krun_session *s)
{
    for (size_t k = 0; k < c->n_slots; k++)
        if (c->slots[k].s == s) return &c->slots[k];
    return NULL;
}

static int warned_before(krun_pcache *c, const char *name)
{
    for (size_t i = 0; i < c->n_warned; i++)
        if (!strcmp(c->warned[i], name)) return 1;
    return 0;
}

/* A file that must never be used: removed, with one warning (why: the path, then what is wrong). */
static void reject_locked(krun_pcache *c, const char *name, const char *why)
{
    if (warned_before(c, name)) return;
    c->st.damaged++;
    if (unlinkat(c->dirfd, name, 0) == 0 || errno == ENOENT) {
        warn(c, "%s; removed, never used", why);
    } else {
        char **w = realloc(c->warned, (c->n_warned + 1) * sizeof *w);
        warn(c, "%s; not used (it cannot be removed: %s)", why, strerror(errno));
        if (w && (w[c->n_warned] = strdup(name))) c->warned = w, c->n_warned++;
        else if (w) c->warned = w;
    }
    for (size_t i = 0; i < c->n_files; i++)
        if (!strcmp(c->files[i].name, name)) { c->files[i] = c->files[--c->n_files]; break; }
}

/* ---- the directory ------------------------------------------------------------- */

/* A temporary file of the safe writer (NAME.tmp-PID-N) whose writer is dead. */
static int stale_tmp(const char *name)
{
    const char *t = strstr(name, ".krs.tmp-");
    long pid;
    if (!t || sscanf(t + 9, "%ld-", &pid) != 1 || pid <= 0) return 0;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* Look at the directory again: every entry file, its size and last use. */
static void scan_locked(krun_pcache *c)
{
    DIR *d;
    struct dirent *de;
    int fd = openat(c->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);   /* its own offset: a dup would share one */
    c->n_files = 0;
    c->st.bytes_disk = 0;
    if (fd < 0 || !(d = fdopendir(fd))) { if (fd >= 0) close(fd); return; }
    while ((de = readdir(d))) {
        pc_file f;
        struct stat sb;
        if (!parse_name(de->d_name, &f)) {
            if (stale_tmp(de->d_name)) unlinkat(c->dirfd, de->d_name, 0);
            continue;
        }
        if (fstatat(c->dirfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) || !S_ISREG(sb.st_mode) || warned_before(c, f.name)) continue;
        f.bytes = (uint64_t)sb.st_size;
        f.mtime = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
        if (c->n_files == c->cap_files) {
            size_t cap = c->cap_files ? 2 * c->cap_files : 64;
            pc_file *p = realloc(c->files, cap * sizeof *p);
            if (!p) break;
            c->files = p;
            c->cap_files = cap;
        }
        c->files[c->n_files++] = f;
        c->st.bytes_disk += f.bytes;
    }
    closedir(d);
    c->st.entries_disk = c->n_files;
}

/* The directory within max_bytes, with room for `incoming` more besides the
 * entries being written (the writer thread's and a request's own may run at
 * once: each made room for itself, neither file is there yet): the least
 * recently used files out.  Under the directory's lock, so that two processes
 * do not both count the same files. */
static void evict_locked(krun_pcache *c, uint64_t incoming)
{
    uint64_t total = c->writing_bytes;
    flock(c->lockfd, LOCK_EX);
    scan_locked(c);
    for (size_t i = 0; i < c->n_files; i++) total += c->files[i].bytes;
    while (total + incoming > c->o.max_bytes && c->n_files) {
        size_t old = 0;
        for (size_t i = 1; i < c->n_files; i++)
            if (c->files[i].mtime < c->files[old].mtime) old = i;
        if (unlinkat(c->dirfd, c->files[old].name, 0) == 0) c->st.evicted++;
        total -= c->files[old].bytes;
        for (size_t k = 0; k < c->n_slots; k++) {
            pc_slot *p = &c->slots[k];
            if (p->on_disk && p->kind && !krun_session_live(p->s) && krun_session_pos(p->s) == c->files[old].pos) {
                size_t n;
                const int32_t *t = krun_session_tokens(p->s, &n);
                if (hash_ids(t, c->files[old].pos) == c->files[old].hash) p->on_disk = 0;
            }
        }
        c->files[old] = c->files[--c->n_files];
    }
    c->st.entries_disk = c->n_files;
    c->st.bytes_disk = total - c->writing_bytes;
    flock(c->lockfd, LOCK_UN);
}

static pc_file *find_file(krun_pcache *c, uint64_t hash, size_t pos, int logits)
{
    for (size_t i = 0; i < c->n_files; i++)
        if (c->files[i].hash == hash && c->files[i].pos == pos && c->files[i].logits == logits) return &c->files[i];
    return NULL;
}

/* A file's mtime is its entry's last use: now (the clock itself, not the file system's
 * coarser one, so that it orders with the times set_used gives), or when it was used in RAM. */
static void set_used(krun_pcache *c, const char *name, struct timespec t)
{
    const struct timespec ts[2] = {t, t};
    utimensat(c->dirfd, name, ts, AT_SYMLINK_NOFOLLOW);
}

static struct timespec now_real(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t;
}

static void touch(krun_pcache *c, const char *name) { set_used(c, name, now_real()); }

/* Write session s's state as an entry file (not under the lock), beneath the directory opened at
 * start: never through its path, which may name another directory by now (issue 34.10: a cache
 * directory replaced by a symbolic link, or removed and made again, took unbounded writes while
 * scans and eviction went on in the old one). */
static int write_entry(krun_pcache *c, krun_session *s, char *name, size_t len)
{
    size_t n;
    const int32_t *t = krun_session_tokens(s, &n);
    krun_err e;
    const size_t pos = krun_session_pos(s);
    const int logits = krun_session_logits(s) != NULL;
    file_name(name, len, hash_ids(t, pos), pos, logits);
    if (faccessat(c->dirfd, name, F_OK, 0) == 0) return 0;          /* another process wrote it: the same bytes */
    if (krun_session_save_at(s, c->dirfd, name, &e)) {
        warn(c, "in %s: %s", c->dir, e.msg);
        return -1;
    }
    return 1;
}

/* ---- the writer ------------------------------------------------------------------ */

/* A write of slot p's entry (into name) is over (rc: write_entry's).  A file written
 * now holds an entry made (or used) earlier, when the writer lags: its mtime is set to
 * that use, so that eviction by last use does not count the write as one (a hit on
 * another entry between the two would otherwise look older than this file). */
static void written_locked(krun_pcache *c, pc_slot *p, int rc, const char *name)
{
    if (rc > 0) set_used(c, name, p->t_used);
    p->writing = 0;
    p->on_disk = rc >= 0;
    c->st.written += rc > 0;
    c->st.write_failed += rc < 0;
    if (rc >= 0) evict_locked(c, 0);      /* and the directory looked at again */
    pthread_cond_broadcast(&c->cv);
}

/* Queue slot p's entry for the writer, or write it now; an entry larger than
 * the whole cache stays in RAM only. */
static void persist_locked(krun_pcache *c, pc_slot *p)
{
    uint64_t bytes = entry_bytes(c->m, krun_session_pos(p->s), krun_session_logits(p->s) != NULL);
    char name[64];
    int rc;
    p->t_used = now_real();             /* the entry is made (or used) now */
    if (!c->dir || p->on_disk || bytes > c->o.max_bytes) return;
    if (c->have_thread) {
        p->writing = 1;
        c->queue[(c->qhead + c->qn++) % c->n_slots] = (size_t)(p - c->slots);
        pthread_cond_broadcast(&c->cv);
        return;
    }
    evict_locked(c, bytes);
    rc = write_entry(c, p->s, name, sizeof name);
    written_locked(c, p, rc, name);
}

static void *writer_main(void *arg)
{
    krun_pcache *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        pc_slot *p;
        uint64_t bytes;
        char name[64];
        int rc;
        while (!c->qn && !c->quit) pthread_cond_wait(&c->cv, &c->mu);
        if (!c->qn) break;
        p = &c->slots[c->queue[c->qhead]];
        c->qhead = (c->qhead + 1) % c->n_slots;
        c->qn--;
        bytes = entry_bytes(c->m, krun_session_pos(p->s), krun_session_logits(p->s) != NULL);
        evict_locked(c, bytes);
        c->writing_bytes += bytes;
        pthread_mutex_unlock(&c->mu);
        rc = write_entry(c, p->s, name, sizeof name);      /* the slot stays as it is while `writing` */
        pthread_mutex_lock(&c->mu);
        c->writing_bytes -= bytes;
        written_locked(c, p, rc, name);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ---- opening ---------------------------------------------------------------------- */

int krun_pcache_open(krun_model *m, const krun_pcache_opts *o, krun_pcache **out, krun_err *err)
{
    krun_pcache *c = calloc(1, sizeof *c);
    *out = NULL;
    if (!c) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
    c->m = m;
    c->o = *o;
    if (!c->o.max_bytes) c->o.max_bytes = KRUN_PCACHE_DEFAULT_BYTES;
    c->dirfd = c->lockfd = -1;
    c->n_slots = krun_model_slots(m);
    c->slots = calloc(c->n_slots, sizeof *c->slots);
    c->queue = calloc(c->n_slots, sizeof *c->queue);
    if (!c->slots || !c->queue) { krun_pcache_close(c); return krun_err_set(err, KRUN_ENOMEM, "out of memory"); }
    for (size_t k = 0; k < c->n_slots; k++) {
        c->slots[k].s = krun_model_slot(m, k);
        if (krun_session_live(c->slots[k].s)) { krun_pcache_close(c); return krun_err_set(err, KRUN_EINPUT, "a prefix cache over live sessions"); }
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if (o->dir) {
        /* one directory per model file (and drafter: its rows are in the files): DIR may be shared by several models */
        const char *id = krun_model_cache_identity(m);
        if (mkdir(o->dir, 0755) && errno != EEXIST) {
            krun_err_set(err, KRUN_EINPUT, "--cache-dir %s: cannot create it: %s", o->dir, strerror(errno));
            krun_pcache_close(c);
            return -1;
        }
        if (asprintf(&c->dir, "%s/k3-%s", o->dir, id) < 0) { c->dir = NULL; krun_pcache_close(c); return krun_err_set(err, KRUN_ENOMEM, "out of memory"); }
        if ((mkdir(c->dir, 0755) && errno != EEXIST) || (c->dirfd = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0 ||
            (c->lockfd = openat(c->dirfd, ".lock", O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0) {
            krun_err_set(err, KRUN_EINPUT, "--cache-dir: cannot use %s: %s", c->dir, strerror(errno));
            krun_pcache_close(c);
            return -1;
        }
        pthread_mutex_lock(&c->mu);
        evict_locked(c, 0);        /* within the size from the start (it may have been lowered) */
        pthread_mutex_unlock(&c->mu);
        if (o->background) {
            if (pthread_create(&c->thread, NULL, writer_main, c)) {
                krun_err_set(err, KRUN_ENOMEM, "cannot start the prefix cache's writer: %s", strerror(errno));
                krun_pcache_close(c);
                return -1;
            }
            c->have_thread = 1;
        }
    }
    *out = c;
    return 0;
}

void krun_pcache_close(krun_pcache *c)
{
    if (!c) return;
    if (c->have_thread) {
        pthread_mutex_lock(&c->mu);
        c->quit = 1;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thread, NULL);
    }
    if (c->slots) {
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
    }
    if (c->lockfd >= 0) close(c->lockfd);
    if (c->dirfd >= 0) close(c->dirfd);
    for (size_t i = 0; i < c->n_warned; i++) free(c->warned[i]);
    free(c->warned);
    free(c->files);
    free(c->queue);
    free(c->slots);
    free(c->dir);
    free(c);
}

const char *krun_pcache_dir(const krun_pcache *c) { return c->dir; }

void krun_pcache_get_stats(krun_pcache *c, krun_pcache_stats *st)
{
    pthread_mutex_lock(&c->mu);
    c->st.entries_ram = c->st.bytes_ram = 0;
    for (size_t k = 0; k < c->n_slots; k++) {
        const pc_slot *p = &c->slots[k];
        if (!p->kind || krun_session_live(p->s)) continue;
        c->st.entries_ram++;
        c->st.bytes_ram += entry_bytes(c->m, krun_session_pos(p->s), krun_session_logits(p->s) != NULL);
    }
    *st = c->st;
    pthread_mutex_unlock(&c->mu);
}

size_t krun_pcache_ram_entries(krun_pcache *c, krun_session **out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t k = 0; k < c->n_slots && n < max; k++) {
        const pc_slot *p = &c->slots[k];
        if (p->kind && !krun_session_live(p->s)) out[n++] = p->s;
    }
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* ---- finding an entry ------------------------------------------------------------- */

/* May an entry of pos positions (logits or not) serve a history of n? */
static int serves(size_t pos, int logits, size_t n) { return pos > 0 && (pos < n || (pos == n && logits)); }

typedef struct cand {
    size_t pos;
    pc_slot *slot;             /* in RAM, or */
    pc_file file;              /* on disk */
} cand;

static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->pos != y->pos) return x->pos < y->pos ? 1 : -1;
    return (y->slot != NULL) - (x->slot != NULL);           /* RAM first */
}

/* A free slot to put a state in: not live, not being written, not due a
 * snapshot, not `not`; no entry first, then the least recently used.  NULL:
 * none now. */
static pc_slot *victim_locked(krun_pcache *c, const pc_slot *not)
{
    pc_slot *best = NULL;
    for (size_t k = 0; k < c->n_slots; k++) {
        pc_slot *p = &c->slots[k];
        if (p == not || krun_session_live(p->s) || p->writing || p->marker) continue;
        if (!p->kind) return p;
        if (!best || p->used < best->used) best = p;
    }
    return best;
}

/* A slot for a request: a free one, else one due a snapshot (the snapshot is
 * given up: a request never waits for a cache's copy). */
static pc_slot *request_slot_locked(krun_pcache *c)
{
    pc_slot *p = victim_locked(c, NULL);
    for (size_t k = 0; k < c->n_slots && !p; k++)
        if (c->slots[k].marker) {
            p = &c->slots[k];
            krun_session_unmark(p->marker);
            p->marker = NULL;
        }
    return p;
}

/* Is the writer holding a slot?  Then one comes free when it is done. */
static int writing_locked(const krun_pcache *c)
{
    for (size_t k = 0; k < c->n_slots; k++)
        if (c->slots[k].writing) return 1;
    return 0;
}

/* Wait for the writer to give a slot back (when every free slot is being written). */
static void wait_writer_locked(krun_pcache *c) { pthread_cond_wait(&c->cv, &c->mu); }

/* Slot p, claimed: live again as it is. */
static krun_session *claim_locked(krun_pcache *c, pc_slot *p)
{
    krun_err e;
    p->kind = PC_NONE;
    p->on_disk = 0;
    p->used = ++c->clock;
    return krun_session_claim(p->s, &e) ? NULL : p->s;
}

/* The entry file f loaded into session s (not under the lock): 1 used, 0 not
 * this history (its tokens differ: a hash collision) or gone, -1 rejected.
 * Read straight into the slot (krun_session_load_fd), whose memory the plan
 * counts: a copy of the file would be an entry's size above the budget. */
static int load_file(krun_pcache *c, krun_session *s, const pc_file *f, const int32_t *ids, char *why, size_t wl)
{
    char path[4096];
    size_t n;
    const int32_t *t;
    krun_err e;
    int fd, rc;
    const uint64_t want = entry_bytes(c->m, f->pos, f->logits);
    snprintf(path, sizeof path, "%s/%s", c->dir, f->name);
    /* its size is known from its name: a file of another size is not read at all */
    if (f->bytes < want || f->bytes > want + (uint64_t)4 * krun_session_ctx_of(s)) {
        snprintf(why, wl, "%s: %llu bytes where an entry of %zu positions has %llu (truncated, extended, or not an entry)", path,
                 (unsigned long long)f->bytes, f->pos, (unsigned long long)want);
        return -1;
    }
    if ((fd = openat(c->dirfd, f->name, O_RDONLY | O_CLOEXEC)) < 0) return 0;   /* evicted meanwhile: missed */
    rc = krun_session_load_fd(s, fd, path, &e);
    close(fd);
    if (rc) {
        if (e.code != KRUN_EINPUT) return 0;
        snprintf(why, wl, "%s", e.msg);
        return -1;
    }
    krun_session_drop_pending(s);
    t = krun_session_tokens(s, &n);
    if (krun_session_pos(s) != f->pos || (krun_session_logits(s) != NULL) != f->logits || hash_ids(t, n) != f->hash) {
        snprintf(why, wl, "%s: its contents do not match its name (positions, logits or history)", path);
        return -1;
    }
    return memcmp(t, ids, n * sizeof *ids) == 0;
}

/* ---- the three calls ---------------------------------------------------------------- */

/* Is there an entry of exactly ids[0..pos) (with logits, if asked)? */
static int have_entry_locked(krun_pcache *c, const int32_t *ids, size_t pos, int logits)
{
    uint64_t h = hash_ids(ids, pos);
    for (size_t k = 0; k < c->n_slots; k++) {
        pc_slot *p = &c->slots[k];
        size_t n;
        const int32_t *t;
        if (!p->kind || krun_session_live(p->s) || krun_session_pos(p->s) != pos) continue;
        if (logits && !krun_session_logits(p->s)) continue;
        t = krun_session_tokens(p->s, &n);
        if (!memcmp(t, ids, pos * sizeof *ids)) { p->used = ++c->clock; return 1; }
    }
    for (int l = logits; l < 2; l++) {
        pc_file *f = c->dir ? find_file(c, h, pos, l) : NULL;
        if (f) { touch(c, f->name); return 1; }
    }
    return 0;
}

/* Arrange the snapshot at the end of the preamble: into a free slot, or else
 * straight into a file. */
static void mark_preamble_locked(krun_pcache *c, krun_session *s, const int32_t *ids, size_t preamble, const pc_slot *mine)
{
    pc_slot *z;
    krun_err e;
    if (have_entry_locked(c, ids, preamble, 0)) return;
    if ((z = victim_locked(c, mine))) {
        if (krun_session_mark(s, preamble, z->s, &e) == 0) {
            z->kind = PC_NONE;
            z->on_disk = 0;
            z->marker = s;
        }
        return;
    }
    if (c->dir && !c->file_marker && entry_bytes(c->m, preamble, 0) <= c->o.max_bytes) {
        const uint64_t bytes = entry_bytes(c->m, preamble, 0);
        file_name(c->file_mark_name, sizeof c->file_mark_name, hash_ids(ids, preamble), preamble, 0);
        if (faccessat(c->dirfd, c->file_mark_name, F_OK, 0) == 0) return;
        evict_locked(c, bytes);            /* room first: the file is written as the block runs */
        if (krun_session_mark_save_at(s, preamble, c->dirfd, c->file_mark_name, &e) == 0) {
            c->file_marker = s;
            c->file_mark_bytes = bytes;
            c->writing_bytes += bytes;
        }
    }
}

/* s's preamble snapshot, once taken or dropped: an entry, or nothing. */
static void settle_mark_locked(krun_pcache *c, krun_session *s)
{
    const char *why;
    int st = krun_session_mark_status(s, &why);
    if (st == KRUN_MARK_PENDING) { krun_session_unmark(s); st = KRUN_MARK_DROPPED; }
    for (size_t k = 0; k < c->n_slots; k++) {
        pc_slot *z = &c->slots[k];
        if (z->marker != s) continue;
        z->marker = NULL;
        if (st == KRUN_MARK_TAKEN) {
            z->kind = PC_PREAMBLE;
            z->used = ++c->clock;
            c->st.made++;
            persist_locked(c, z);
        }
    }
    if (c->file_marker == s) {
        c->file_marker = NULL;
        c->writing_bytes -= c->file_mark_bytes;
        c->file_mark_bytes = 0;
        if (st == KRUN_MARK_TAKEN) {
            c->st.made++;
            c->st.written++;
            evict_locked(c, 0);
        }
    }
}

int krun_pcache_begin(krun_pcache *c, const int32_t *ids, size_t n, size_t preamble, krun_session **out, size_t *reused,
                      krun_err *err)
{
    cand *cs = NULL;
    size_t nc = 0, cap = c->n_slots;
    krun_session *s = NULL;
    pc_slot *mine = NULL;
    *out = NULL;
    *reused = 0;
    pthread_mutex_lock(&c->mu);
    c->st.lookups++;
    if (c->dir) scan_locked(c);
    cap += c->n_files;
    if (!(cs = malloc(cap * sizeof *cs))) goto pick;            /* no memory to look: start empty */
    for (size_t k = 0; k < c->n_slots; k++) {
        pc_slot *p = &c->slots[k];
        size_t m;
        const int32_t *t;
        if (!p->kind || krun_session_live(p->s)) continue;
        t = krun_session_tokens(p->s, &m);
        if (serves(m, krun_session_logits(p->s) != NULL, n) && !memcmp(t, ids, m * sizeof *ids))
            cs[nc++] = (cand){m, p, {{0}, 0, 0, 0, 0, 0}};
    }
    for (size_t i = 0; i < c->n_files; i++) {
        const pc_file *f = &c->files[i];
        if (serves(f->pos, f->logits, n) && hash_ids(ids, f->pos) == f->hash) cs[nc++] = (cand){f->pos, NULL, *f};
    }
    qsort(cs, nc, sizeof *cs, cand_cmp);
    for (size_t i = 0; i < nc && !s; i++) {
        cand *x = &cs[i];
        if (x->slot) {
            /* a preamble is shared: copied while a slot is free; else the entry moves into the request */
            pc_slot *y = (x->slot->kind == PC_PREAMBLE || x->slot->writing) ? victim_locked(c, x->slot) : NULL;
            int disk;                  /* the entry has a file, whose mtime says it was used now */
            if (y) {
                krun_err e;
                if (!(s = claim_locked(c, y))) continue;
                if (krun_session_copy(s, x->slot->s, &e)) { krun_session_free(s); s = NULL; continue; }
                mine = y;
                x->slot->used = c->clock;
                x->slot->t_used = now_real();
                disk = x->slot->on_disk;
            } else {
                while (x->slot->writing) wait_writer_locked(c);
                /* read before the claim, which clears it: an entry moved into its request is still
                 * used (without this a hit that moved the slot left the file's mtime as it was, and
                 * eviction took a file every request used: when the writer held the other slot) */
                disk = x->slot->on_disk;
                if (krun_session_live(x->slot->s) || !(s = claim_locked(c, x->slot))) continue;
                mine = x->slot;
            }
            if (disk) {
                char name[64];
                file_name(name, sizeof name, hash_ids(ids, x->pos), x->pos, krun_session_logits(s) != NULL);
                touch(c, name);
            }
        } else {
            pc_slot *y;
            char why[600];
            int rc;
            while (!(y = request_slot_locked(c)) && writing_locked(c)) wait_writer_locked(c);
            if (!y || !(s = claim_locked(c, y))) break;
            mine = y;
            pthread_mutex_unlock(&c->mu);
            rc = load_file(c, s, &x->file, ids, why, sizeof why);
            pthread_mutex_lock(&c->mu);
            if (rc <= 0) {
                if (rc < 0) reject_locked(c, x->file.name, why);
                krun_session_free(s);
                s = NULL;
                mine = NULL;
                continue;
            }
            touch(c, x->file.name);
            c->st.hits_disk++;
        }
        *reused = x->pos;
    }
pick:
    if (!s) {
        pc_slot *y;
        while (!(y = request_slot_locked(c)) && writing_locked(c)) wait_writer_locked(c);
        if (y && (s = claim_locked(c, y))) krun_session_reset(s);
        mine = y;
    }
    free(cs);
    if (!s) {
        pthread_mutex_unlock(&c->mu);
        return krun_err_set(err, KRUN_EINPUT, "no free session slot for a new request");
    }
    krun_session_drop_pending(s);
    krun_session_spec_restart(s);      /* a new request drafts as in a new session (the entry's drafter was another's) */
    if (*reused) {
        c->st.hits++;
        c->st.positions_reused += *reused;
    }
    if (preamble > *reused && preamble < n) mark_preamble_locked(c, s, ids, preamble, mine);
    pthread_mutex_unlock(&c->mu);
    *out = s;
    return 0;
}

void krun_pcache_keep(krun_pcache *c, krun_session *s)
{
    size_t n;
    const int32_t *t = krun_session_tokens(s, &n);
    const size_t pos = krun_session_pos(s);
    pc_slot *z;
    pthread_mutex_lock(&c->mu);
    settle_mark_locked(c, s);
    if (pos == 0 || n != pos || !krun_session_logits(s) || have_entry_locked(c, t, pos, 1)) goto out;
    if ((z = victim_locked(c, slot_of(c, s)))) {
        krun_err e;
        krun_session *d = claim_locked(c, z);
        if (!d) goto out;
        if (krun_session_copy(d, s, &e)) { krun_session_free(d); goto out; }
        krun_session_free(d);
        z->kind = PC_PROMPT;
        c->st.made++;
        persist_locked(c, z);
    } else if (c->dir) {
        /* no free slot: the state goes to disk from the session itself, now */
        char name[64];
        uint64_t bytes = entry_bytes(c->m, pos, 1);
        if (bytes <= c->o.max_bytes) {
            int rc;
            evict_locked(c, bytes);
            c->writing_bytes += bytes;
            pthread_mutex_unlock(&c->mu);
            rc = write_entry(c, s, name, sizeof name);          /* s is this thread's */
            pthread_mutex_lock(&c->mu);
            c->writing_bytes -= bytes;
            c->st.made += rc >= 0;
            c->st.written += rc > 0;
            c->st.write_failed += rc < 0;
            if (rc >= 0) evict_locked(c, 0);   /* the directory looked at again: another process may have written meanwhile */
        }
    }
out:
    pthread_mutex_unlock(&c->mu);
}

void krun_pcache_end(krun_pcache *c, krun_session *s)
{
    pc_slot *p = slot_of(c, s);
    size_t n;
    const int32_t *t;
    size_t pos;
    pthread_mutex_lock(&c->mu);
    settle_mark_locked(c, s);
    krun_session_drop_pending(s);
    t = krun_session_tokens(s, &n);
    pos = krun_session_pos(s);
    krun_session_free(s);
    p->kind = PC_NONE;
    p->on_disk = 0;
    if (pos && krun_session_logits(s)) {
        /* one RAM entry per history: an older one of the same goes */
        for (size_t k = 0; k < c->n_slots; k++) {
            pc_slot *o = &c->slots[k];
            size_t m;
            const int32_t *u;
            if (o == p || !o->kind || o->writing || krun_session_live(o->s) || krun_session_pos(o->s) != pos ||
                !krun_session_logits(o->s))
                continue;
            u = krun_session_tokens(o->s, &m);
            if (!memcmp(u, t, pos * sizeof *t)) { p->on_disk = o->on_disk; o->kind = PC_NONE; }
        }
        p->kind = PC_REPLY;
        p->used = ++c->clock;
        c->st.made++;
        if (c->dir && !p->on_disk) {
            pc_file *f = find_file(c, hash_ids(t, pos), pos, 1);
            if (f) { p->on_disk = 1; touch(c, f->name); }
        }
        persist_locked(c, p);
    }
    pthread_mutex_unlock(&c->mu);
}
