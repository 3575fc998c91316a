/* The cluster's transport over Open MPI: kcl.h.  The only file that
 * includes <mpi.h>; without KRUN_MPI (a build without libopenmpi-dev) a
 * stand-in that says what is missing. */
#include "kcl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kcl_launched(void)
{
    /* Open MPI's mpirun (and PMI-based launchers such as srun) say how many ranks they started */
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 1) return atoi(v);
    }
    return 0;
}

#ifndef KRUN_MPI

int kcl_built_with_mpi(void) { return 0; }
int kcl_start(int *argc, char ***argv, krun_err *err)
{
    (void)argc;
    (void)argv;
    return krun_err_set(err, KRUN_EINPUT,
                        "started by mpirun with %d ranks, but this krun was built without MPI: install Open MPI's "
                        "development files (Debian: apt-get install libopenmpi-dev openmpi-bin) and rebuild (make), "
                        "or run one process without mpirun", kcl_launched());
}
int kcl_active(void) { return 0; }
int kcl_rank(void) { return 0; }
int kcl_size(void) { return 1; }
const char *kcl_who(int rank) { (void)rank; return "rank 0"; }
void kcl_finish(int status) { (void)status; }
void kcl_stopped(const void *msg, size_t len) { (void)msg; (void)len; }
void kcl_fail(const krun_err *why) { (void)why; }
void kcl_linger(void) {}
int kcl_failed(krun_err *why) { (void)why; return 0; }
void kcl_set_server(kcl_serve_fn fn, void *ctx) { (void)fn; (void)ctx; }
static int none(krun_err *err) { return krun_err_set(err, KRUN_EINPUT, "no cluster: this krun was built without MPI"); }
int kcl_send(int to, int tag, const void *buf, size_t len, krun_err *err) { (void)to; (void)tag; (void)buf; (void)len; return none(err); }
int kcl_wait(uint64_t from, int tag, int *src, size_t *len, krun_err *err)
{
    (void)from; (void)tag; (void)src; (void)len;
    return none(err);
}
int kcl_recv(int from, int tag, void *buf, size_t cap, size_t len, krun_err *err)
{
    (void)from; (void)tag; (void)buf; (void)cap; (void)len;
    return none(err);
}
int kcl_get(int from, int tag, void *buf, size_t cap, size_t *len, krun_err *err)
{
    (void)from; (void)tag; (void)buf; (void)cap; (void)len;
    return none(err);
}
int kcl_pending(int from, int tag, size_t *len) { (void)from; (void)tag; (void)len; return 0; }
int kcl_post(int to, int tag, const void *buf, size_t len, krun_err *err) { (void)to; (void)tag; (void)buf; (void)len; return none(err); }
int kcl_flush(krun_err *err) { (void)err; return 0; }
void kcl_bytes(uint64_t *sent, uint64_t *received) { *sent = *received = 0; }
int kcl_interrupted(int clear) { (void)clear; return 0; }
int kcl_wait_order(int *tag, size_t *len, krun_err *err) { (void)tag; (void)len; return none(err); }

#else

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#define CHUNK ((size_t)1 << 30)      /* MPI counts are ints: larger messages go in pieces of 1 GiB */
#define BEAT_NS 500000000L           /* a sign of life twice a second */

static struct {
    int active, rank, size;
    MPI_Comm data, beat;             /* messages; signs of life (a duplicate: they never mix) */
    char who[KCL_MAX_RANKS][96];
    _Atomic double seen[KCL_MAX_RANKS];   /* when each rank was last heard from */
    double timeout;
    pthread_t beater;
    atomic_int stop;
    int beater_up;
    kcl_serve_fn serve;
    void *serve_ctx;
    int failed;
    krun_err why;
    uint64_t sent, received;
    MPI_Request posted[256];         /* kcl_post's sends in flight */
    int posted_to[256], nposted;
    int interrupted;
} K;

int kcl_built_with_mpi(void) { return 1; }
int kcl_active(void) { return K.active; }
int kcl_rank(void) { return K.rank; }
int kcl_size(void) { return K.active ? K.size : 1; }
const char *kcl_who(int rank) { return rank >= 0 && rank < KCL_MAX_RANKS && K.who[rank][0] ? K.who[rank] : "a rank"; }
void kcl_set_server(kcl_serve_fn fn, void *ctx) { K.serve = fn; K.serve_ctx = ctx; }
void kcl_bytes(uint64_t *sent, uint64_t *received) { *sent = K.sent; *received = K.received; }
int kcl_interrupted(int clear)
{
    int v = K.interrupted;
    if (clear) K.interrupted = 0;
    return v;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int mpi_fail(krun_err *err, int rc, const char *call, int peer)
{
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    s[0] = 0;
    MPI_Error_string(rc, s, &n);
    krun_err_set(err, KRUN_EINPUT, "cluster: %s with %s failed: %s (the network to it, or the rank itself, failed)", call,
                 kcl_who(peer), s);
    kcl_fail(err);
    return -1;
}

/* The signs of life: every rank to every other, and what was heard. */
static void *beat_main(void *arg)
{
    MPI_Request out[KCL_MAX_RANKS];
    char one = 1, in;
    (void)arg;
    for (int r = 0; r < K.size; r++) out[r] = MPI_REQUEST_NULL;
    while (!atomic_load(&K.stop)) {
        struct timespec ts = {0, BEAT_NS};
        for (int r = 0; r < K.size; r++) {
            int done = 1;
            if (r == K.rank) continue;
            if (out[r] != MPI_REQUEST_NULL) MPI_Test(&out[r], &done, MPI_STATUS_IGNORE);
            if (done) MPI_Issend(&one, 1, MPI_CHAR, r, 0, K.beat, &out[r]);   /* synchronous: done only once received */
        }
        for (;;) {
            int flag = 0;
            MPI_Status st;
            if (MPI_Iprobe(MPI_ANY_SOURCE, 0, K.beat, &flag, &st) != MPI_SUCCESS || !flag) break;
            MPI_Recv(&in, 1, MPI_CHAR, st.MPI_SOURCE, 0, K.beat, MPI_STATUS_IGNORE);
            atomic_store(&K.seen[st.MPI_SOURCE], now());
        }
        nanosleep(&ts, NULL);
    }
    /* what is still unsent is taken back (a peer that stopped listening must not hold us) */
    for (int r = 0; r < K.size; r++)
        if (out[r] != MPI_REQUEST_NULL) { MPI_Cancel(&out[r]); MPI_Request_free(&out[r]); }
    return NULL;
}

int kcl_start(int *argc, char ***argv, krun_err *err)
{
    int provided = 0, rc;
    char host[MPI_MAX_PROCESSOR_NAME] = "?", all[KCL_MAX_RANKS][MPI_MAX_PROCESSOR_NAME];
    int hl = 0, pids[KCL_MAX_RANKS], pid = (int)getpid();
    const char *t = getenv("KRUN_CLUSTER_TIMEOUT");
    rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) return krun_err_set(err, KRUN_EINPUT, "cluster: MPI_Init_thread failed (code %d)", rc);
    MPI_Comm_rank(MPI_COMM_WORLD, &K.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &K.size);
    if (provided < MPI_THREAD_MULTIPLE) {
        krun_err_set(err, KRUN_EINPUT, "cluster: this MPI library does not allow MPI calls from several threads "
                     "(MPI_THREAD_MULTIPLE), which krun needs for its signs of life; Open MPI 4 does");
        MPI_Abort(MPI_COMM_WORLD, 2);
        return -1;
    }
    if (K.size > KCL_MAX_RANKS) {
        krun_err_set(err, KRUN_EINPUT, "cluster: %d ranks; krun runs on at most %d", K.size, KCL_MAX_RANKS);
        MPI_Abort(MPI_COMM_WORLD, 2);
        return -1;
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &K.data);
    MPI_Comm_dup(MPI_COMM_WORLD, &K.beat);
    MPI_Comm_set_errhandler(K.data, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(K.beat, MPI_ERRORS_RETURN);
    MPI_Get_processor_name(host, &hl);
    MPI_Allgather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, K.data);
    MPI_Allgather(&pid, 1, MPI_INT, pids, 1, MPI_INT, K.data);
    for (int r = 0; r < K.size; r++) {
        all[r][MPI_MAX_PROCESSOR_NAME - 1] = 0;
        snprintf(K.who[r], sizeof K.who[r], "rank %d (host %.40s, pid %d)", r, all[r], pids[r]);
        atomic_store(&K.seen[r], now());
    }
    K.timeout = t && atof(t) > 0 ? atof(t) : 30;
    K.active = 1;
    if (pthread_create(&K.beater, NULL, beat_main, NULL) == 0) K.beater_up = 1;
    return 0;
}

void kcl_linger(void)
{
    const double t0 = now();
    if (!K.active || K.rank == 0) return;
    atomic_store(&K.stop, 1);
    if (K.beater_up) pthread_join(K.beater, NULL);
    K.beater_up = 0;
    while (now() - t0 < 2 * K.timeout + 5 && now() - atomic_load(&K.seen[0]) < 2 * K.timeout + 5) {
        struct timespec ts = {0, 10000000};
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(0, KCL_CTRL, K.data, &flag, &st) == MPI_SUCCESS && flag) {
            char buf[64];
            int n = 0;
            MPI_Get_count(&st, MPI_BYTE, &n);
            if (n <= (int)sizeof buf) MPI_Recv(buf, n, MPI_BYTE, 0, KCL_CTRL, K.data, MPI_STATUS_IGNORE);
            if (n >= 4 && buf[0] == KCL_STOP) return;
            continue;
        }
        nanosleep(&ts, NULL);
    }
}

void kcl_fail(const krun_err *why)
{
    if (K.failed) return;
    K.failed = 1;
    K.why = *why;
}

int kcl_failed(krun_err *why)
{
    if (K.failed && why) *why = K.why;
    return K.failed;
}

/* A rank other than 0 of a failed cluster, leaving: rank 0 leaves first.  A
 * rank that ends without MPI_Finalize makes mpirun end every other at once,
 * so a follower that left before rank 0 could cut rank 0 off before its
 * exit status is known: it waits here until rank 0's signs of life stop
 * (rank 0 leaves right after its stop was taken), or as long as a lost
 * rank 0 takes to be noticed. */
static void after_rank0(void)
{
    const double t0 = now();
    double heard = t0;
    char in;
    while (now() - heard < 3.0 * BEAT_NS * 1e-9 && now() - t0 < 2 * K.timeout + 5) {
        struct timespec ts = {0, 10000000};
        int flag = 0;
        while (MPI_Iprobe(0, 0, K.beat, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
            MPI_Recv(&in, 1, MPI_CHAR, 0, 0, K.beat, MPI_STATUS_IGNORE);
            heard = now();
        }
        nanosleep(&ts, NULL);
    }
}

void kcl_finish(int status)
{
    if (!K.active) return;
    if (K.rank == 0) {
        /* every other rank is told to stop, and whether the cluster failed (the live ones are waiting
         * for it); synchronous sends, done when taken: a lost rank never takes it (3 s at most) */
        int32_t stop[8] = {KCL_STOP, K.failed};
        MPI_Request q[KCL_MAX_RANKS];
        double t0 = now();
        int n = 0, done = 0;
        for (int r = 1; r < K.size; r++)
            if (MPI_Issend(stop, (int)sizeof stop, MPI_BYTE, r, KCL_CTRL, K.data, &q[n++]) != MPI_SUCCESS) q[n - 1] = MPI_REQUEST_NULL;
        while (!done && now() - t0 < 3) {
            struct timespec ts = {0, 1000000};
            MPI_Testall(n, q, &done, MPI_STATUSES_IGNORE);
            if (!done) nanosleep(&ts, NULL);
        }
        if (!done) K.failed = 1;
    }
    atomic_store(&K.stop, 1);
    if (K.beater_up) pthread_join(K.beater, NULL);
    K.beater_up = 0;
    K.active = 0;
    if (!K.failed) {
        MPI_Finalize();
        return;
    }
    /* a lost rank never reaches MPI_Finalize's fence, and Open MPI finalizes at exit itself:
     * leave without either, what was written flushed */
    fflush(NULL);
    if (K.rank != 0) after_rank0();
    _exit(status);
}

void kcl_stopped(const void *msg, size_t len)
{
    int32_t v[2] = {0, 0};
    memcpy(v, msg, len < sizeof v ? len : sizeof v);
    if (v[0] == KCL_STOP && v[1]) K.failed = 1;
}

/* A rank that has been silent too long, among `who` (0: none). */
static int lost(uint64_t who, krun_err *err)
{
    const double t = now();
    for (int r = 0; r < K.size; r++) {
        if (r == K.rank || !(who >> r & 1)) continue;
        if (t - atomic_load(&K.seen[r]) > K.timeout) {
            krun_err_set(err, KRUN_EINPUT, "cluster: %s stopped answering: nothing heard from it for %.0f s (it died, or the "
                         "network to it failed; KRUN_CLUSTER_TIMEOUT sets how long to wait)", kcl_who(r), t - atomic_load(&K.seen[r]));
            kcl_fail(err);
            return 1;
        }
    }
    return 0;
}

static void nap(unsigned *us)
{
    struct timespec ts = {0, (long)*us * 1000};
    nanosleep(&ts, NULL);
    if (*us < 200) *us = *us ? *us * 2 : 1;
}

/* Serve the requests pending from anyone; -1 when serving failed. */
static int serve_pending(krun_err *err, int *served)
{
    static const int tags[] = {KCL_EXQ, KCL_PRED};
    *served = 0;
    if (!K.serve) return 0;
    for (size_t i = 0; i < sizeof tags / sizeof tags[0]; i++) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, tags[i], K.data, &flag, &st) != MPI_SUCCESS || !flag) continue;
        *served = 1;
        if (K.serve(K.serve_ctx, st.MPI_SOURCE, tags[i], err)) return -1;
    }
    return 0;
}

int kcl_pending(int from, int tag, size_t *len)
{
    int flag = 0, n = 0;
    MPI_Status st;
    if (MPI_Iprobe(from == KCL_ANY ? MPI_ANY_SOURCE : from, tag, K.data, &flag, &st) != MPI_SUCCESS || !flag) return 0;
    MPI_Get_count(&st, MPI_BYTE, &n);
    if (len) *len = (size_t)n;
    return 1;
}

int kcl_send(int to, int tag, const void *buf, size_t len, krun_err *err)
{
    const uint8_t *p = buf;
    size_t off = 0;
    if (K.failed) { *err = K.why; return -1; }
    do {
        size_t n = len - off < CHUNK ? len - off : CHUNK;
        MPI_Request q;
        unsigned us = 0;
        int done = 0, rc = MPI_Isend(p + off, (int)n, MPI_BYTE, to, tag, K.data, &q);
        if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "sending", to);
        while (!done) {
            int served;
            if ((rc = MPI_Test(&q, &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS) return mpi_fail(err, rc, "sending", to);
            if (done) break;
            if (serve_pending(err, &served)) { MPI_Cancel(&q); MPI_Request_free(&q); return -1; }
            if (lost(1ull << to, err)) { MPI_Cancel(&q); MPI_Request_free(&q); return -1; }
            if (!served) nap(&us);
        }
        off += n;
        K.sent += n;
    } while (off < len);
    return 0;
}

int kcl_flush(krun_err *err)
{
    unsigned us = 0;
    while (K.nposted) {
        int served, done = 0, rc = MPI_Test(&K.posted[K.nposted - 1], &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "sending", K.posted_to[K.nposted - 1]);
        if (done) { K.nposted--; us = 0; continue; }
        if (serve_pending(err, &served) || lost(1ull << K.posted_to[K.nposted - 1], err)) {
            /* the sends still in flight are abandoned: the cluster has failed (or serving did) */
            for (int i = 0; i < K.nposted; i++) { MPI_Cancel(&K.posted[i]); MPI_Request_free(&K.posted[i]); }
            K.nposted = 0;
            return -1;
        }
        if (!served) nap(&us);
    }
    return 0;
}

int kcl_post(int to, int tag, const void *buf, size_t len, krun_err *err)
{
    const uint8_t *p = buf;
    size_t off = 0;
    if (K.failed) { *err = K.why; return -1; }
    do {
        size_t n = len - off < CHUNK ? len - off : CHUNK;
        int rc;
        if (K.nposted == (int)(sizeof K.posted / sizeof K.posted[0]) && kcl_flush(err)) return -1;
        rc = MPI_Isend(p + off, (int)n, MPI_BYTE, to, tag, K.data, &K.posted[K.nposted]);
        if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "sending", to);
        K.posted_to[K.nposted++] = to;
        off += n;
        K.sent += n;
    } while (off < len);
    return 0;
}

int kcl_wait(uint64_t from, int tag, int *src, size_t *len, krun_err *err)
{
    unsigned us = 0;
    for (;;) {
        int served;
        if (K.failed) { *err = K.why; return -1; }
        for (int r = 0; r < K.size; r++)
            if (from >> r & 1 && kcl_pending(r, tag, len)) { *src = r; return 0; }
        /* rank 0 stops, or gave the block up: what we wait for will not come */
        if (K.rank != 0 && kcl_pending(0, KCL_CTRL, NULL)) { K.interrupted = 1; return 1; }
        if (serve_pending(err, &served)) return -1;
        if (lost(from | (K.rank ? 1 : 0), err)) return -1;
        if (!served) nap(&us);
    }
}

int kcl_wait_order(int *tag, size_t *len, krun_err *err)
{
    unsigned us = 0;
    for (;;) {
        int served;
        if (K.failed) { *err = K.why; return -1; }
        if (kcl_pending(0, KCL_CTRL, len)) { *tag = KCL_CTRL; return 0; }
        if (kcl_pending(0, KCL_OP, len)) { *tag = KCL_OP; return 0; }
        if (serve_pending(err, &served) || lost(1, err)) return -1;
        if (!served) nap(&us);
    }
}

int kcl_recv(int from, int tag, void *buf, size_t cap, size_t len, krun_err *err)
{
    uint8_t *p = buf;
    size_t off = 0;
    if (len > cap) {
        krun_err_set(err, KRUN_EINPUT, "cluster: %s sent %zu bytes where at most %zu were expected (tag %d): ranks of "
                     "different krun versions or options?", kcl_who(from), len, cap, tag);
        kcl_fail(err);
        return -1;
    }
    do {
        size_t n = len - off < CHUNK ? len - off : CHUNK, got;
        int rc, cnt = 0;
        MPI_Status st;
        if (off) {                    /* the next piece of a large message */
            int s;
            if (kcl_wait(1ull << from, tag, &s, &got, err)) return -1;
        }
        rc = MPI_Recv(p + off, (int)n, MPI_BYTE, from, tag, K.data, &st);
        if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "receiving", from);
        MPI_Get_count(&st, MPI_BYTE, &cnt);
        if ((size_t)cnt != n) {
            krun_err_set(err, KRUN_EINPUT, "cluster: a message from %s was cut (%d of %zu bytes)", kcl_who(from), cnt, n);
            kcl_fail(err);
            return -1;
        }
        off += n;
        K.received += n;
    } while (off < len);
    return 0;
}

int kcl_get(int from, int tag, void *buf, size_t cap, size_t *len, krun_err *err)
{
    int src, rc;
    size_t n;
    if ((rc = kcl_wait(1ull << from, tag, &src, &n, err))) return rc;
    if (len) *len = n;
    else if (n != cap) {
        krun_err_set(err, KRUN_EINPUT, "cluster: %s sent %zu bytes where %zu were expected (tag %d): ranks of different krun "
                     "versions or options?", kcl_who(from), n, cap, tag);
        kcl_fail(err);
        return -1;
    }
    return kcl_recv(from, tag, buf, cap, n, err);
}

#endif
