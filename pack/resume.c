#include "resume.h"

#include "cli.h"
#include "copy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Why an earlier run's files cannot be resumed, for the "starting over" note. */
static void stale_reason(int jrc, const char *partial, const char *journal, char *buf, size_t len)
{
    struct stat js;
    if (stat(journal, &js) != 0)
        snprintf(buf, len, "the run that wrote %s was stopped before its journal was written: nothing to resume", partial);
    else if ((uint64_t)js.st_size < KJ_HEADER_SIZE)
        snprintf(buf, len, "the run that wrote %s was stopped while creating its journal: nothing to resume", partial);
    else if (jrc != 0)
        snprintf(buf, len, "%s was written from another source or with other options (or its journal %s is damaged)",
                 partial, journal);
    else
        snprintf(buf, len, "the run that wrote %s was stopped before its first extent was complete: nothing to resume", partial);
}

/* A codec-2 record's blocks are the planned ones, tiling its stored bytes. */
static int blocks_agree(const kp_plan *p, uint32_t i, const kj_record *r)
{
    const kpk_extent *x = &p->extents[i];
    uint64_t stored = 0;
    if (r->n_blocks != kp_extent_nblocks(p, i)) return 0;
    for (uint32_t k = 0; k < r->n_blocks; k++) {
        const kpk_block *b = &r->blocks[k];
        const kp_cut *c = &p->cuts[x->first_block + k];
        if (b->raw_off != c->raw_off || b->raw_len != c->raw_len || b->stored_off != stored ||
            b->stored_len > kpk_block_stored_max(b->raw_len))
            return 0;
        stored += b->stored_len;
    }
    return stored == r->stored_len;
}

/* The journal's records that agree with the plan, placing each where the
 * plan puts the next extent of its target (offsets are assigned in extent
 * order, so a record that disagrees ends the usable prefix). */
static uint64_t agreeing_prefix(const kp_plan *p, const kj_record *recs, uint64_t n, uint64_t *cursor)
{
    kp_cursors_init(p, cursor);
    for (uint64_t i = 0; i < n && i < p->n_extents; i++) {
        const kpk_extent *x = &p->extents[i];
        uint32_t t = kp_target(p, x->member);
        int ok = recs[i].member == x->member && recs[i].offset == cursor[t];
        if (x->codec == KPK_CODEC_BLOCKS) ok = ok && blocks_agree(p, (uint32_t)i, &recs[i]);
        else ok = ok && recs[i].stored_len == x->raw_len && !recs[i].n_blocks && recs[i].raw_xxh3 == recs[i].stored_xxh3;
        if (!ok) return i;
        cursor[t] += kpk_round_up(recs[i].stored_len, p->opt.align);
    }
    return n < p->n_extents ? n : p->n_extents;
}

static void restore(kp_plan *p, const kj_record *recs, uint64_t n, uint64_t *cursor)
{
    kp_cursors_init(p, cursor);
    for (uint64_t i = 0; i < n; i++) {
        kpk_extent *x = &p->extents[i];
        x->offset = recs[i].offset;
        x->stored_len = recs[i].stored_len;
        x->stored_xxh3 = recs[i].stored_xxh3;
        x->raw_xxh3 = recs[i].raw_xxh3;
        if (recs[i].n_blocks) memcpy(p->blocks + x->first_block, recs[i].blocks, sizeof *recs[i].blocks * recs[i].n_blocks);
        cursor[kp_target(p, x->member)] = x->offset + kpk_round_up(x->stored_len, p->opt.align);
    }
}

int kp_resume_point(kp_plan *p, const char *journal, kjournal *jr, uint64_t *cursor, uint32_t *first, int quiet,
                    char *err, size_t errlen)
{
    kj_record *recs = NULL;
    uint64_t n = 0, read = 0;
    int *fds = NULL, rc, any_partial = 0;
    char why[900] = "";

    *first = 0;
    kp_cursors_init(p, cursor);
    rc = kj_open(jr, journal, p->plan_id, &recs, &n);
    if (rc < 0) {
        snprintf(err, errlen, "cannot read %s: %s; fix the cause, or remove it and the .partial files to start over",
                 journal, strerror(errno));
        return -1;
    }
    read = n;
    for (uint32_t m = 0; m < p->n_members; m++) any_partial |= access(p->members[m].partial, F_OK) == 0;
    if (rc == 0) n = agreeing_prefix(p, recs, n, cursor);
    /* every partial file is there, holding at least what the records describe */
    if (rc == 0 && n > 0) {
        fds = malloc(sizeof *fds * p->n_members);
        for (uint32_t m = 0; fds && m < p->n_members; m++) fds[m] = -1;
        for (uint32_t m = 0; fds && m < p->n_members && n; m++) {
            struct stat st;
            uint64_t need = kp_member_end(p, cursor, (uint16_t)m);
            fds[m] = open(p->members[m].partial, O_RDONLY | O_CLOEXEC);
            if (fds[m] < 0 || fstat(fds[m], &st)) {
                snprintf(why, sizeof why, "its journal is there but %s is not", p->members[m].partial);
                n = 0;
            } else if ((uint64_t)st.st_size < need) {
                snprintf(why, sizeof why, "%s has %llu bytes, this conversion writes %llu: it was truncated or replaced since",
                         p->members[m].partial, (unsigned long long)st.st_size, (unsigned long long)need);
                n = 0;
            }
        }
        if (!fds) n = 0;
    }
    /* The records were appended after their data was synced; re-hash the
     * newest one from disk anyway, and step back past any that fail. */
    while (n > 0) {
        uint64_t h = 0;
        restore(p, recs, n, cursor);
        if (kp_hash_written_extent(p, fds, (uint32_t)(n - 1), &h) == 0 && h == recs[n - 1].stored_xxh3) break;
        n--;
    }
    if (fds) {
        for (uint32_t m = 0; m < p->n_members; m++)
            if (fds[m] >= 0) close(fds[m]);
        free(fds);
    }
    if (n == 0) {
        if (rc == 0) kj_close(jr);
        if (any_partial) {
            if (!why[0]) stale_reason(rc, p->members[0].partial, journal, why, sizeof why);
            kx_note(quiet, "not resuming: %s; starting over", why);
        }
        kp_cursors_init(p, cursor);
        kj_free_records(recs, read);
        return 0;
    }
    restore(p, recs, n, cursor);
    if (kj_truncate(jr, recs, n)) {
        snprintf(err, errlen, "cannot truncate %s: %s", journal, strerror(errno));
        kj_free_records(recs, read);
        kj_close(jr);
        return -1;
    }
    kj_free_records(recs, read);
    *first = (uint32_t)n;
    return 0;
}
