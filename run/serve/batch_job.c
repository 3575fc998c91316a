/* krun batch's job (batch.h): every request of IN not yet in the journal goes to the server's
 * engine (serve_engine.c), which runs them many to a sweep; each output line is made durable in
 * the journal as its request ends; once every line has one, OUT is written in input order to a
 * temporary file, fsynced and renamed into place (savefile.h), and the journal removed.
 *
 * Killed at any moment, the same command continues: what the journal holds is not run again, and
 * what runs again gives the same bytes, because nothing in an output depends on the run: a
 * request's result does not depend on what shares its sweeps (docs/NUMERICS.md §5), a sampled
 * request without a seed gets one from the job's seed and its line, and the ids and "created"
 * come from the input and the job, kept in the journal's header. */
#include "batch.h"

#include "format/kprogress.h"
#include "run/util/savefile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <xxhash.h>

uint64_t kbatch_request_seed(uint64_t job_seed, size_t line)
{
    uint64_t z = job_seed + (uint64_t)line * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (z ^ (z >> 31)) & 0x7fffffffffffffffull;    /* as the server's seeds: a JSON integer any client reads */
}

/* The job's identity: what the output bytes depend on besides the seed and "created".  The model
 * is named by its identity (the file's set_id and its config's hash, as a saved state names it):
 * another model of the same size is another job. */
static uint64_t job_key(krun_model *m, const kbatch_input *in, const kbatch_opts *o)
{
    char buf[600];
    int n = snprintf(buf, sizeof buf, "%016llx %llu %s %zu %s", (unsigned long long)in->hash, (unsigned long long)in->size,
                     krun_model_identity(m), krun_model_ctx(m), o->model_name);
    return XXH3_64bits(buf, (size_t)n);
}

/* The status of an output line (its response's status_code; 0 for a bad line).  The custom_id
 * before it is JSON text, where a quote is escaped: the first ,"response": is the field. */
static int line_status(const char *line)
{
    static const char key[] = ",\"response\":{\"status_code\":";
    const char *p = strstr(line, key);
    return p ? atoi(p + sizeof key - 1) : 0;
}

/* The engine's counters (GET /health's "stats"); with st, also the decoding-only sweeps' share. */
static void engine_counters(srv_engine *e, uint64_t *sweeps, uint64_t *bytes, kbatch_stats *st)
{
    int status;
    json_t *h = srv_engine_health(e, &status), *s = json_object_get(h, "stats");
#define C(name) ((uint64_t)json_integer_value(json_object_get(s, name)))
    *sweeps = C("sweeps");
    *bytes = C("bytes_read");
    if (st) {
        st->decode_sweeps = C("sweeps") - C("prefill_sweeps");
        st->decode_bytes_read = C("bytes_read") - C("prefill_bytes_read");
        st->decode_generated = C("generated_tokens") - C("prefill_generated_tokens");
        st->decode_seconds = json_real_value(json_object_get(s, "sweep_seconds")) - json_real_value(json_object_get(s, "prefill_seconds"));
        s = json_object_get(s, "speculation");
        st->drafted = C("drafted");
        st->accepted = C("accepted");
        s = json_object_get(s, "drafter");
        st->drafter_drafted = C("drafted");
        st->drafter_accepted = C("accepted");
    }
#undef C
    json_decref(h);
}

typedef struct {
    krun_model *m;
    const kbatch_input *in;
    const kbatch_opts *o;
    kbatch_journal j;
    srv_engine *e;
    kbatch_stats *st;
    char tag[17];
    uint64_t sweeps0, bytes0;
    double t0;
} job;

/* Item k's output line into the journal. */
static int record(job *b, size_t k, int status, const char *request_id, const char *body, krun_err *err)
{
    char *line = kbatch_line_response(b->tag, &b->in->items[k], status, request_id, body);
    int rc;
    if (!line) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
    rc = kbatch_journal_add(&b->j, b->in, k, line, err);
    free(line);
    if (rc) return -1;
    b->st->done++;
    if (status != 200) b->st->failed++;
    return 0;
}

/* A request the API refused before it ran (400 ...): its error is its output. */
static int record_refusal(job *b, size_t k, const char *request_id, const oai_error *oe, krun_err *err)
{
    char *body;
    int rc;
    if (oe->status >= 500) return krun_err_set(err, KRUN_ENOMEM, "line %zu: %s", b->in->items[k].line, oe->message);
    if (!(body = oai_error_json(oe))) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
    rc = record(b, k, oe->status, request_id, body, err);
    free(body);
    return rc;
}

/* Item k made a request and handed to the engine; *r NULL when it was refused (recorded). */
static int submit(job *b, size_t k, sreq **r, krun_err *err)
{
    const kbatch_item *it = &b->in->items[k];
    char id[96];
    oai_error oe;
    oai_meta meta = {id, b->o->model_name, b->o->created};
    *r = NULL;
    snprintf(id, sizeof id, "%s-batch-%s-%zu", it->chat ? "chatcmpl" : "cmpl", b->tag, it->line);
    meta.created = b->j.created;
    *r = srv_prepare(b->e, b->o->model_name, it->chat, it->body, it->body_len, &meta, NULL, NULL, &oe);
    if (!*r) return record_refusal(b, k, id, &oe, err);
    if ((*r)->stream) {
        sreq_discard(*r);
        *r = NULL;
        oai_error_set(&oe, 400, "stream", "unsupported_value", "a batch request's output is one body: stream must be false or absent");
        return record_refusal(b, k, id, &oe, err);
    }
    if (!(*r)->has_seed) {
        (*r)->sampling.seed = kbatch_request_seed(b->j.seed, it->line);
        (*r)->has_seed = 1;
    }
    if (srv_submit(b->e, *r, &oe)) {
        srv_release(b->e, *r);
        *r = NULL;
        return krun_err_set(err, !strcmp(oe.code ? oe.code : "", "model_damaged") ? KRUN_EDATA : KRUN_EINPUT, "%s", oe.message);
    }
    b->st->prompt_tokens += (*r)->n_prompt;
    return 0;
}

/* A request that ended: its output recorded, or the job stopped (5xx: the model is damaged, or
 * out of memory: nothing is recorded, so the next run does it again). */
static int collect(job *b, size_t k, sreq *r, krun_err *err)
{
    char *body = NULL;
    int status = srv_take_body(b->e, r, &body), rc;
    b->st->generated += r->gen ? sgen_n_tokens(r->gen) : 0;
    if (status < 0 || !body) { free(body); return krun_err_set(err, KRUN_ENOMEM, "out of memory"); }
    if (status >= 500) {
        json_t *j = json_loads(body, 0, NULL), *e = json_object_get(j, "error");
        const char *code = json_string_value(json_object_get(e, "code")), *msg = json_string_value(json_object_get(e, "message"));
        krun_err_set(err, code && !strcmp(code, "model_damaged") ? KRUN_EDATA : KRUN_ENOMEM, "line %zu: %s", b->in->items[k].line,
                     msg ? msg : body);
        json_decref(j);
        free(body);
        return -1;
    }
    rc = record(b, k, status, r->id, body, err);
    b->st->ran += rc == 0;
    free(body);
    return rc;
}

static void progress(job *b, int force)
{
    static double last;
    double now = know();
    if (!force && (!b->o->progress || now - last < 0.25)) return;     /* the last call counts for the summary */
    last = now;
    b->st->seconds = now - b->t0;
    if (b->e) {
        engine_counters(b->e, &b->st->sweeps, &b->st->bytes_read, b->st);
        b->st->sweeps -= b->sweeps0;
        b->st->bytes_read -= b->bytes0;
    }
    if (b->o->progress) b->o->progress(b->o->progress_ctx, b->st);
}

typedef struct { sreq *r; size_t k; } flight;

/* Every request not yet recorded, through the engine. */
static int run_requests(job *b, krun_err *err)
{
    const kbatch_input *in = b->in;
    size_t window = b->o->window ? b->o->window : 1, n = 0, next = 0;
    flight *fl = calloc(window, sizeof *fl);
    /* held until the first window is handed over: the first sweep takes every request it has room
     * for (one handed over a moment late would start a sweep behind the others and end one later,
     * in a sweep of fewer sequences) */
    srv_engine_opts eo = {.max_queue = window, .model_name = b->o->model_name, .quiet = 1, .held = 1, .command = "krun batch"};
    int held = 1;
    int rc = 0;
    if (!fl) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
    if (srv_engine_start(b->m, &eo, &b->e, err)) { free(fl); return -1; }
    engine_counters(b->e, &b->sweeps0, &b->bytes0, NULL);
    for (;;) {
        int any = 0;
        while (!rc && n < window && next < in->n && !(b->o->stop && *b->o->stop)) {
            size_t k = next++;
            sreq *r;
            if (in->items[k].bad || b->j.lines[k]) continue;
            if ((rc = submit(b, k, &r, err))) break;
            if (r) fl[n++] = (flight){r, k};
        }
        if (held) {
            srv_engine_release(b->e);
            held = 0;
        }
        if (rc || !n) break;
        if (b->o->stop && *b->o->stop) { rc = -2; break; }
        for (size_t i = 0; i < n && !rc;) {
            if (!srv_done(b->e, fl[i].r)) { i++; continue; }
            any = 1;
            rc = collect(b, fl[i].k, fl[i].r, err);
            srv_release(b->e, fl[i].r);
            fl[i] = fl[--n];
        }
        if (rc) break;
        progress(b, 0);
        if (!any) {
            struct timespec ts = {0, 2 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    progress(b, 1);
    if (rc) srv_engine_cancel_all(b->e);          /* what runs fails at once; nothing more is recorded */
    for (size_t i = 0; i < n; i++) {
        srv_wait_done(b->e, fl[i].r);
        srv_release(b->e, fl[i].r);
    }
    srv_engine_stop(b->e);
    b->e = NULL;
    free(fl);
    return rc;
}

/* OUT, every line in input order, in place by a rename; then the journal removed. */
static int write_out(job *b, krun_err *err)
{
    ksave sv;
    if (ksave_begin(&sv, b->o->out, err)) return -1;
    for (size_t k = 0; k < b->in->n; k++) {
        char *bad = b->in->items[k].bad ? kbatch_line_bad(b->tag, &b->in->items[k]) : NULL;
        const char *line = b->in->items[k].bad ? bad : b->j.lines[k];
        if (!line) { ksave_abort(&sv); return krun_err_set(err, KRUN_ENOMEM, "out of memory"); }
        ksave_write(&sv, line, strlen(line));
        ksave_write(&sv, "\n", 1);
        free(bad);
    }
    if (ksave_commit(&sv, err)) return -1;
    return kbatch_journal_remove(&b->j, err);
}

int kbatch_run(krun_model *m, const kbatch_input *in, const kbatch_opts *o, kbatch_stats *st, krun_err *err)
{
    job b;
    struct stat sb;
    char *jpath = NULL;
    uint64_t seed = o->seed;
    long long created = o->created;
    int rc, have_journal;
    memset(st, 0, sizeof *st);
    memset(&b, 0, sizeof b);
    b.m = m;
    b.in = in;
    b.o = o;
    b.st = st;
    b.t0 = know();
    st->total = in->n;
    kbatch_tag(in, b.tag);
    if (ksave_target_ok(o->out, NULL, "a krun batch output", err)) return -1;
    if (asprintf(&jpath, "%s.krun-journal", o->out) < 0) return krun_err_set(err, KRUN_ENOMEM, "out of memory");
    have_journal = !lstat(jpath, &sb);
    free(jpath);
    if (!have_journal && !lstat(o->out, &sb) && !o->force)
        return krun_err_set(err, KRUN_EINPUT, "%s exists (a finished batch, or another file): give another OUT, or --force to replace it", o->out);
    rc = kbatch_journal_open(&b.j, o->out, in, job_key(m, in, o), &seed, o->seed_given, &created, o->created_given, o->force, err);
    if (rc) return -1;
    st->resumed = b.j.n_recorded;
    for (size_t k = 0; k < in->n; k++) {
        if (in->items[k].bad) { st->done++; st->failed++; }
        else if (b.j.lines[k]) { st->done++; st->failed += line_status(b.j.lines[k]) != 200; }
    }
    if ((rc = run_requests(&b, err)) == 0) rc = b.o->stop && *b.o->stop ? -2 : write_out(&b, err);
    st->seconds = know() - b.t0;
    kbatch_journal_close(&b.j);
    return rc;
}
