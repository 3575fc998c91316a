/* `kpack convert --consume`: release points, releases, resume checks
 * (consume.h; the rails in consume_check.c, the verification in
 * consume_verify.c, the log in consume_log.c). */
#include "consume_state.h"

#include "cli.h"
#include "format/kio.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct gone_ctx { const kc_log *log; const kc_piece *head; };

static int gone_header(const void *ctx, uint8_t **head, uint64_t *len)
{
    const struct gone_ctx *g = ctx;
    if (g->head->src_off != 0 || g->head->len < 8) { errno = EINVAL; return -1; }
    if (!(*head = malloc(g->head->len))) { errno = ENOMEM; return -1; }
    if (kc_log_read(g->log, g->head, 0, *head, g->head->len)) {
        int e = errno;
        free(*head);
        *head = NULL;
        errno = e;
        return -1;
    }
    *len = g->head->len;
    return 0;
}

int kc_load(kc_state **out, const char *outp, char *err, size_t errlen)
{
    kc_state *c = calloc(1, sizeof *c);
    struct gone_ctx *ctx;
    int rc;
    *out = c;
    if (!c || !(c->out = strdup(outp)) || asprintf(&c->log_path, "%s.consumed", outp) < 0) {
        if (c) c->log_path = NULL;
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    c->log.fd = -1;
    if ((rc = kc_log_open(&c->log, c->log_path, err, errlen)) < 0) return -1;
    if (rc == 1) { c->log.fd = -1; return 0; }
    c->have_log = 1;
    /* one entry per shard: its last record */
    c->gone = calloc(c->log.n + 1, sizeof *c->gone);
    ctx = calloc(c->log.n + 1, sizeof *ctx);
    if (!c->gone || !ctx) { free(ctx); snprintf(err, errlen, "out of memory"); return -1; }
    c->gone[0].ctx = ctx; /* kc_free frees the contexts through the first entry */
    for (size_t i = 0; i < c->log.n; i++) {
        const kc_record *r = &c->log.recs[i];
        ks_gone *g;
        if (kc_log_find(&c->log, r->name) != r) continue;
        g = &c->gone[c->n_gone];
        ctx[c->n_gone].log = &c->log;
        ctx[c->n_gone].head = &r->pieces[0];
        g->name = r->name;
        g->size = r->size;
        g->alloc_bytes = r->alloc_bytes;
        g->mtime_ns = r->mtime_ns;
        g->expect_sha = r->expect_sha;
        g->got_sha = r->got_sha;
        g->sha_from = r->sha_from;
        g->read_header = gone_header;
        g->ctx = &ctx[c->n_gone];
        c->n_gone++;
    }
    return 0;
}

void kc_free(kc_state *c)
{
    if (!c) return;
    if (c->gone) free((void *)c->gone[0].ctx);
    free(c->gone);
    kc_log_close(&c->log);
    for (size_t s = 0; c->sh && s < c->n; s++) free(c->sh[s].blob);
    free(c->sh);
    free(c->by_shard);
    free(c->waits);
    free(c->is_rp);
    free(c->out);
    free(c->log_path);
    free(c);
}

const ks_gone *kc_gone(const kc_state *c, size_t *n)
{
    *n = c->n_gone;
    return c->gone;
}

size_t kc_recorded(const kc_state *c) { return c->n_gone; }

/* ---- binding to the plan ------------------------------------------------------ */

struct by_off { uint64_t off, t; };

static int cmp_off(const void *a, const void *b)
{
    const struct by_off *x = a, *y = b;
    return (x->off > y->off) - (x->off < y->off);
}

/* The plan's tensors grouped by the shard they are read from, each group by offset. */
static int group_tensors(kc_state *c)
{
    const kp_plan *p = c->p;
    size_t *at = calloc(c->n + 1, sizeof *at), total = 0;
    struct by_off *tmp = NULL;
    int rc = -1;
    if (!at) return -1;
    for (uint64_t t = 0; t < p->n_tensors; t++)
        if (p->from[t].shard < c->n) at[p->from[t].shard + 1]++;
    for (size_t s = 0; s < c->n; s++) at[s + 1] += at[s];
    total = at[c->n];
    if (!(c->by_shard = malloc(sizeof *c->by_shard * (total + 1))) || !(tmp = malloc(sizeof *tmp * (total + 1)))) goto out;
    for (size_t s = 0; s < c->n; s++) {
        c->sh[s].t = c->by_shard + at[s];
        c->sh[s].nt = at[s + 1] - at[s];
    }
    {
        size_t *fill = calloc(c->n + 1, sizeof *fill);
        if (!fill) goto out;
        for (uint64_t t = 0; t < p->n_tensors; t++) {
            uint32_t s = p->from[t].shard;
            if (s >= c->n) continue;
            tmp[at[s] + fill[s]].off = p->from[t].offset;
            tmp[at[s] + fill[s]++].t = t;
        }
        free(fill);
    }
    for (size_t s = 0; s < c->n; s++) qsort(tmp + at[s], at[s + 1] - at[s], sizeof *tmp, cmp_off);
    for (size_t i = 0; i < total; i++) c->by_shard[i] = tmp[i].t;
    rc = 0;
out:
    free(tmp);
    free(at);
    return rc;
}

int kc_bind(kc_state *c, const kp_plan *p, const k3_source *src, int consume, char *err, size_t errlen)
{
    c->p = p;
    c->src = src;
    c->consume = consume;
    c->n = src->n_shards;
    c->sh = calloc(c->n + 1, sizeof *c->sh);
    c->waits = malloc(sizeof *c->waits * ((size_t)p->n_extents + 1));
    c->is_rp = calloc((size_t)p->n_extents + 1, 1);
    if (!c->sh || !c->waits || !c->is_rp || group_tensors(c)) { snprintf(err, errlen, "out of memory"); return -1; }
    for (uint32_t e = 0; e < p->n_extents; e++) c->waits[e] = KC_NONE;
    for (size_t s = 0; s < c->n; s++) {
        struct kc_shard *h = &c->sh[s];
        const ks_shard *ks = &src->shards[s];
        const kc_record *r = c->have_log ? kc_log_find(&c->log, ks->name) : NULL;
        struct stat st;
        h->archive = h->rp = KC_NONE;
        for (size_t k = 0; k < h->nt; k++) {
            uint64_t t = h->t[k];
            uint32_t e = p->tensors[t].extent;
            if (p->extents[e].kind == KPK_KIND_ARCHIVE && p->from[t].offset == 0) h->archive = e;
        }
        for (size_t k = 0; k < h->nt; k++) {
            uint32_t e = p->tensors[h->t[k]].extent;
            if (e != h->archive && (h->rp == KC_NONE || e > h->rp)) h->rp = e;
        }
        if (h->rp == KC_NONE) h->rp = h->archive;
        h->staged = h->archive != KC_NONE && h->rp != KC_NONE && h->archive > h->rp;
        h->present = !ks->gone;
        if (r) {
            h->rec = (size_t)(r - c->log.recs) + 1;
            if (r->blob && !(h->blob = strdup(r->blob))) { snprintf(err, errlen, "out of memory"); return -1; }
        }
        if (!h->present) {
            /* deleted by an earlier run: what the reader needs is in the log */
            h->pieces = r->pieces;
            h->n_pieces = r->n_pieces;
            atomic_store(&h->released, 1);
            continue;
        }
        if (stat(ks->path, &st) == 0) {
            h->dev = st.st_dev;
            h->freed = (uint64_t)st.st_blocks * 512;
        }
        if (consume && h->rp != KC_NONE) {
            c->is_rp[h->rp] = 1;
            if (h->staged) c->waits[h->archive] = (uint32_t)s;
        }
    }
    return 0;
}

int kc_check_plan(const kc_state *c, char *err, size_t errlen)
{
    size_t gone = 0;
    char names[400] = "";
    if (!c->have_log || c->log.plan_id == c->p->plan_id) return 0;
    for (size_t s = 0; s < c->n; s++)
        if (!c->sh[s].present) {
            if (gone++ < 3) snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", gone > 1 ? ", " : "",
                                     c->src->shards[s].name);
        }
    if (!gone) return 0; /* nothing it deleted is needed: the log is started anew */
    snprintf(err, errlen, "%zu shard%s of the source (%s%s) were deleted by an earlier `kpack convert --consume` into %s, "
             "which was planned with other options or from other files: `%s`. %s.partial holds their only copy, so this "
             "conversion cannot start over. Rerun that command to finish it (then re-lay out the result with `kpack "
             "convert %s NEW.kpk` and the options you want), or put the deleted shards back and remove %s.partial, "
             "%s.journal and %s to start over", gone, gone == 1 ? "" : "s", names, gone > 3 ? ", ..." : "", c->out,
             c->log.command, c->out, c->out, c->out, c->out, c->log_path);
    return -1;
}

int kc_check_resume(const kc_state *c, uint32_t first, char *err, size_t errlen)
{
    const kp_plan *p = c->p;
    size_t need = 0;
    uint32_t from = KC_NONE;
    char names[600] = "", d[64], journal[4200], where[4400];
    for (size_t s = 0; s < c->n; s++) {
        const struct kc_shard *h = &c->sh[s];
        int needed = 0;
        if (h->present) continue;
        for (size_t k = 0; k < h->nt && !needed; k++) {
            uint64_t t = h->t[k];
            uint32_t e = p->tensors[t].extent;
            int logged = 0;
            if (e < first) continue;
            for (uint32_t i = 0; e == h->archive && i < h->n_pieces; i++)
                logged |= h->pieces[i].src_off == p->from[t].offset && h->pieces[i].len == p->tensors[t].nbytes;
            if (logged) continue;
            needed = 1;
            if (from == KC_NONE || e < from) from = e;
        }
        if (!needed) continue;
        if (need++ < 4) snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", need > 1 ? ", " : "",
                                 c->src->shards[s].name);
    }
    if (!need) return 0;
    kpk_extent_describe(&p->extents[from], d, sizeof d);
    snprintf(journal, sizeof journal, "%s.journal", c->out);
    if (access(journal, F_OK) != 0) snprintf(where, sizeof where, "the journal %s is missing", journal);
    else snprintf(where, sizeof where, "the journal %s resumes at extent %u of %u (an extent after it no longer matched "
                  "its checksum, or the journal was damaged)", journal, first, p->n_extents);
    snprintf(err, errlen, "cannot resume %s without %zu shard%s that an earlier run of --consume deleted (%s%s): %s, so "
             "the %s and what follows must be read again. Nothing was changed. Put th%s back into %s exactly as %s (the "
             "same bytes; a SHA-256 recorded for them is checked) and rerun the same command", c->out, need,
             need == 1 ? "" : "s", names, need > 4 ? ", ..." : "", where, d, need == 1 ? "at file" : "ose files",
             c->src->dir, need == 1 ? "it was" : "they were");
    return -1;
}

/* ---- the space it frees ------------------------------------------------------------ */

/* What the record of shard s will add to the log. */
static uint64_t record_bytes(const kc_state *c, size_t s)
{
    const struct kc_shard *h = &c->sh[s];
    uint64_t n = 256 + strlen(c->src->shards[s].name) + (h->blob ? strlen(h->blob) : 0);
    if (h->rec) return 0;
    for (size_t k = 0; k < h->nt; k++) {
        uint64_t t = h->t[k];
        if (c->p->tensors[t].extent != h->archive || (!h->staged && c->p->from[t].offset != 0)) continue;
        n += 16 + c->p->tensors[t].nbytes;
    }
    return n;
}

static int cmp_release(const void *a, const void *b)
{
    const kp_release *x = a, *y = b;
    return (x->after > y->after) - (x->after < y->after);
}

int kc_releases(const kc_state *c, uint32_t first, int consume_all, kp_release **rel, size_t *n)
{
    *n = 0;
    if (!(*rel = calloc(c->n + 1, sizeof **rel))) return -1;
    if (!c->consume && !consume_all) return 0;
    for (size_t s = 0; s < c->n; s++) {
        const struct kc_shard *h = &c->sh[s];
        kp_release *r = &(*rel)[*n];
        if (!h->present || h->rp == KC_NONE) continue;
        r->after = h->rp < first ? KP_RELEASE_FIRST : h->rp;
        r->dev = h->dev;
        r->freed = h->freed;
        r->apparent = c->src->shards[s].size;
        r->staged = record_bytes(c, s) + (*n || c->have_log ? 0 : 4096); /* the log's header and last block */
        (*n)++;
    }
    qsort(*rel, *n, sizeof **rel, cmp_release);
    return 0;
}

uint64_t kc_largest(const kc_state *c, const char **name)
{
    uint64_t best = 0;
    *name = NULL;
    for (size_t s = 0; s < c->n; s++)
        if (c->sh[s].present && c->src->shards[s].size > best) {
            best = c->src->shards[s].size;
            *name = c->src->shards[s].name;
        }
    return best;
}

/* ---- releasing a shard ------------------------------------------------------------- */

/* The pieces of shard s's archive extent its record keeps (all of them when
 * staged, else the header), with their bytes read from the shard. */
static int stage(kc_state *c, uint32_t s, kc_piece **pieces, uint32_t *np, uint8_t **data, char *err, size_t errlen)
{
    const struct kc_shard *h = &c->sh[s];
    const ks_shard *ks = &c->src->shards[s];
    uint64_t bytes = 0, at = 0;
    int fd;
    *np = 0;
    *data = NULL;
    if (!(*pieces = calloc(h->nt + 1, sizeof **pieces))) { snprintf(err, errlen, "out of memory"); return -1; }
    for (size_t k = 0; k < h->nt; k++) {
        uint64_t t = h->t[k];
        if (c->p->tensors[t].extent != h->archive || (!h->staged && c->p->from[t].offset != 0)) continue;
        (*pieces)[*np].src_off = c->p->from[t].offset;
        (*pieces)[*np].len = c->p->tensors[t].nbytes;
        bytes += c->p->tensors[t].nbytes;
        (*np)++;
    }
    if (!*np || (*pieces)[0].src_off != 0) {
        snprintf(err, errlen, "%s: its header is not in the plan's archive (--consume needs the archive)", ks->path);
        return -1;
    }
    if (!(*data = malloc(bytes + 1))) { snprintf(err, errlen, "out of memory reading %s", ks->path); return -1; }
    if ((fd = open(ks->path, O_RDONLY | O_CLOEXEC)) < 0) { snprintf(err, errlen, "%s: %s", ks->path, strerror(errno)); return -1; }
    for (uint32_t i = 0; i < *np; i++) {
        if (kio_pread_full(fd, *data + at, (*pieces)[i].len, (*pieces)[i].src_off)) {
            snprintf(err, errlen, "%s: %s", ks->path, errno == ENODATA ? "unexpected end of file (it shrank?)" : strerror(errno));
            close(fd);
            return -1;
        }
        at += (*pieces)[i].len;
    }
    close(fd);
    return 0;
}

/* The output's directories hold the partial files, the journal and the log
 * by name before the first shard goes (a power cut must not take their
 * names with it). */
static int sync_output_dirs(kc_state *c, char *err, size_t errlen)
{
    if (c->dirs_synced) return 0;
    for (uint32_t m = 0; m < c->p->n_members; m++)
        if (kx_fsync_dir(c->p->members[m].dir)) {
            snprintf(err, errlen, "cannot sync the directory %s: %s; no shard was deleted", c->p->members[m].dir, strerror(errno));
            return -1;
        }
    c->dirs_synced = 1;
    return 0;
}

static int remove_file(const char *path, char *err, size_t errlen)
{
    char *dir = strdup(path);
    if (unlink(path) && errno != ENOENT) {
        /* the rails found it deletable, but a network or FUSE filesystem may still refuse */
        snprintf(err, errlen, "cannot delete %s: %s. Its bytes are safe in the output: make it deletable and rerun the same "
                 "command, or finish without --consume (the shards still there are kept)", path, strerror(errno));
        free(dir);
        return -1;
    }
    if (dir) kx_fsync_dir(dirname(dir)); /* a lost deletion is only redone by the next run */
    free(dir);
    return 0;
}

static void doing(kc_state *c, kprogress *prog, const char *fmt, const char *name)
{
    snprintf(c->doing, sizeof c->doing, fmt, name);
    atomic_store(&c->doing_on, 1);
    kprogress_add(prog, 0);
}

/* Shard s: every extent before `done` is durable. */
static int release_one(kc_state *c, uint32_t s, uint32_t done, const int *fds, kprogress *prog, uint32_t *bad, char *err,
                       size_t errlen)
{
    struct kc_shard *h = &c->sh[s];
    const ks_shard *ks = &c->src->shards[s];
    kc_piece *pieces = NULL;
    uint8_t *data = NULL;
    uint32_t np = 0;
    int rc = -1;
    char why[1200];
    doing(c, prog, "verifying %s", ks->name);
    if (!h->rec && stage(c, s, &pieces, &np, &data, err, errlen)) goto out;
    if (kc_verify_shard(c, s, done, fds, h->rec ? c->log.recs[h->rec - 1].pieces : pieces,
                        h->rec ? c->log.recs[h->rec - 1].n_pieces : np, data, prog, bad, why, sizeof why)) {
        snprintf(err, errlen, "%s was not deleted: %s", ks->path, why);
        goto out;
    }
    if (!h->rec) {
        kc_record r;
        memset(&r, 0, sizeof r);
        r.name = ks->name;
        r.blob = h->blob;
        r.size = ks->size;
        r.alloc_bytes = ks->alloc_bytes;
        r.mtime_ns = ks->mtime_ns;
        snprintf(r.expect_sha, sizeof r.expect_sha, "%s", ks->expect_sha);
        snprintf(r.got_sha, sizeof r.got_sha, "%s", ks->got_sha);
        snprintf(r.sha_from, sizeof r.sha_from, "%s", ks->sha_from ? ks->sha_from : "");
        r.pieces = pieces;
        r.n_pieces = np;
        if (kc_log_append(&c->log, &r, data, why, sizeof why)) {
            snprintf(err, errlen, "%s was not deleted: %s", ks->path, why);
            goto out;
        }
        h->rec = c->log.n;
    }
    if (sync_output_dirs(c, err, errlen)) goto out;
    doing(c, prog, "deleting %s", ks->name);
    /* the blob first: a kill between the two leaves a dangling link, which the next run removes */
    if ((h->blob && remove_file(h->blob, err, errlen)) || remove_file(ks->path, err, errlen)) goto out;
    h->pieces = c->log.recs[h->rec - 1].pieces;
    h->n_pieces = c->log.recs[h->rec - 1].n_pieces;
    atomic_store_explicit(&h->released, 1, memory_order_release);
    atomic_fetch_add(&c->freed_now, h->freed);
    atomic_fetch_add(&c->released_now, 1);
    rc = 0;
out:
    atomic_store(&c->doing_on, 0);
    free(pieces);
    free(data);
    return rc;
}

/* Every shard still here whose release point is i. */
static int release_at(kc_state *c, uint32_t i, uint32_t done, const int *fds, kprogress *prog, uint32_t *bad, char *err,
                      size_t errlen)
{
    *bad = KC_NONE;
    for (uint32_t s = 0; s < c->n; s++)
        if (c->sh[s].present && c->sh[s].rp == i && !atomic_load(&c->sh[s].released) &&
            release_one(c, s, done, fds, prog, bad, err, errlen))
            return -1;
    return 0;
}

int kc_begin(kc_state *c, const char *command, uint32_t first, const int *fds, kprogress *prog, uint32_t *redo, char *err,
             size_t errlen)
{
    *redo = KC_NONE;
    if (c->have_log && c->log.plan_id != c->p->plan_id) { /* kc_check_plan: nothing of it is needed */
        kc_log_close(&c->log);
        c->have_log = 0;
        for (size_t s = 0; s < c->n; s++) c->sh[s].rec = 0;
    }
    if (!c->consume) return 0;
    if (!c->have_log) {
        if (kc_log_create(&c->log, c->log_path, c->p->plan_id, command, err, errlen)) return -1;
        c->have_log = 1;
    } else if (kc_log_trim(&c->log, err, errlen)) {
        return -1;
    }
    for (size_t s = 0; s < c->n; s++) {
        const char *path = c->src->shards[s].path;
        struct stat st;
        /* a kill between a blob and its link: the link is left dangling */
        if (!c->sh[s].present && lstat(path, &st) == 0 && S_ISLNK(st.st_mode) && stat(path, &st) != 0 &&
            remove_file(path, err, errlen))
            return -1;
    }
    /* released late (a kill came after the journal passed them), in the
     * order of their release points, as the run that was killed would have */
    for (uint32_t e = 0; e < first; e++)
        if (c->is_rp[e] && release_at(c, e, first, fds, prog, redo, err, errlen)) return *redo != KC_NONE ? 1 : -1;
    return 0;
}

int kc_releases_at(const kc_state *c, uint32_t i) { return c->is_rp && c->is_rp[i]; }

int kc_release(kc_state *c, uint32_t i, uint32_t done, const int *fds, kprogress *prog, char *err, size_t errlen)
{
    uint32_t bad;
    if (release_at(c, i, done, fds, prog, &bad, err, errlen) == 0) return 0;
    if (bad != KC_NONE)
        snprintf(err + strlen(err), errlen - strlen(err), ". Nothing was lost: rerun the same command; it writes that "
                 "extent and what follows again");
    return -1;
}

void kc_finish(kc_state *c)
{
    if (c->have_log) kc_log_close(&c->log);
    c->have_log = 0;
    if (unlink(c->log_path) == 0) kx_fsync_dir(c->p->members[0].dir);
}

int kc_finished_note(const char *out, char *note, size_t n)
{
    char log[4200], partial[4200], journal[4200];
    snprintf(log, sizeof log, "%s.consumed", out);
    snprintf(partial, sizeof partial, "%s.partial", out);
    snprintf(journal, sizeof journal, "%s.journal", out);
    if (access(log, F_OK) != 0 || access(partial, F_OK) == 0) return 0;
    snprintf(note, n, "%s was written by `kpack convert --consume`, which was stopped after it renamed the file into place "
             "and before it removed %s%s%s: the conversion finished. Check it with `kpack verify %s`, then delete %s%s%s",
             out, log, access(journal, F_OK) == 0 ? " and " : "", access(journal, F_OK) == 0 ? journal : "", out, log,
             access(journal, F_OK) == 0 ? " and " : "", access(journal, F_OK) == 0 ? journal : "");
    return 1;
}

/* ---- the reader's side -------------------------------------------------------------- */

uint32_t kc_waits_for(const kc_state *c, uint32_t e) { return c->waits ? c->waits[e] : KC_NONE; }

int kc_released(kc_state *c, uint32_t s) { return atomic_load_explicit(&c->sh[s].released, memory_order_acquire); }

int kc_read(kc_state *c, uint32_t s, uint64_t src_off, uint64_t off, void *dst, uint64_t len)
{
    const struct kc_shard *h = &c->sh[s];
    uint32_t lo = 0, hi = h->n_pieces;
    while (lo < hi) { /* pieces are in source order */
        uint32_t mid = lo + (hi - lo) / 2;
        if (h->pieces[mid].src_off == src_off) return kc_log_read(&c->log, &h->pieces[mid], off, dst, len);
        if (h->pieces[mid].src_off < src_off) lo = mid + 1;
        else hi = mid;
    }
    errno = ENOENT;
    return -1;
}

int kc_extent_consumed(kc_state *c, uint32_t e)
{
    const kpk_extent *x = &c->p->extents[e];
    for (uint64_t t = x->first_tensor; t < (uint64_t)x->first_tensor + x->tensor_count; t++) {
        uint32_t s = c->p->from[t].shard;
        if (s < c->n && e != c->sh[s].archive && kc_released(c, s)) return 1;
    }
    return 0;
}

uint32_t kc_file_last_use(const kc_state *c, uint32_t s)
{
    return c->consume && c->sh[s].present ? c->sh[s].rp : KC_NONE;
}

void kc_get_stats(kc_state *c, kc_stats *st)
{
    memset(st, 0, sizeof *st);
    st->shards = (uint32_t)c->n;
    for (size_t s = 0; s < c->n; s++)
        if (atomic_load(&c->sh[s].released)) {
            st->released++;
            st->freed += c->src->shards[s].alloc_bytes;
        }
    st->released_now = atomic_load(&c->released_now);
    st->freed_now = atomic_load(&c->freed_now);
    st->doing = atomic_load(&c->doing_on) ? c->doing : NULL;
}
