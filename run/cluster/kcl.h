/* The cluster's transport: the processes mpirun started, and the messages
 * between them (Open MPI, run over TCP or whatever fabric it finds).
 *
 * One krun process per machine (a "rank"); rank 0 does what a single process
 * does (the tokenizer, sampling, HTTP, the journal), the others serve it
 * (docs/RUNTIME.md §10).  This file is the only one that knows MPI: a build
 * without Open MPI (libopenmpi-dev) compiles a stand-in whose kcl_start says
 * what is missing, so krun still builds and runs as one process.
 *
 * Waiting never spins: a wait polls with a growing sleep (up to 200 us), so
 * that the ranks sharing a machine's cores with krun's compute threads (and,
 * in tests, with each other) do not take them.  While a rank waits it serves
 * what other ranks ask of it (kcl_set_server): the expert requests of a MoE
 * layer run on another rank, and the read-ahead of predicted experts.
 *
 * Faults.  Every rank sends every other a sign of life twice a second from
 * a thread of its own; a wait on a rank that has been silent for
 * KRUN_CLUSTER_TIMEOUT seconds (default 30) fails, naming the rank and its
 * host: it died, or the network to it failed.  (Plain mpirun ends every rank
 * when one dies; `mpirun --enable-recovery` keeps the others running, so
 * that rank 0 can fail the request and say which rank was lost.)  An MPI
 * call that fails is an error naming the rank and the call.  After a fault
 * the cluster is done: rank 0 tells the live ranks to stop, and fails what
 * is asked of it from then on. */
#ifndef KRUN_KCL_H
#define KRUN_KCL_H

#include "run/util/krun_err.h"

#include <stddef.h>
#include <stdint.h>

#define KCL_MAX_RANKS 64
#define KCL_ANY (-1)

/* Message kinds.  OP: rank 0's orders to a rank (run/cluster/kcl_ops.h);
 * HELLO..: the handshake; HID: a block's hidden state between pipeline
 * stages; EXQ..EXO: a MoE layer's experts computed by another rank; PRED:
 * read-ahead of predicted experts; GATHER: a state layer sent to rank 0. */
enum kcl_tag {
    KCL_OP = 1,
    KCL_REPLY = 2,         /* a rank's answer to an OP */
    KCL_HID = 3,
    KCL_EXQ = 4,           /* expert request: which experts, from which layer */
    KCL_EXROWS = 5,        /* their positions' latent rows (or a cancel) */
    KCL_EXO = 6,           /* one expert's output rows, or the end of the answer (an error) */
    KCL_PRED = 7,
    KCL_STATE = 8,         /* one layer of a sequence's state (saving, loading) */
    KCL_CTRL = 9,          /* rank 0's stop, or its giving a block up: interrupts any wait */
};

/* Was this process started by mpirun (or srun with PMI) with several ranks?
 * From the environment the launcher sets (OMPI_COMM_WORLD_SIZE, PMI_SIZE):
 * the number of ranks, 0 when not. */
int kcl_launched(void);
/* 1 when this build has MPI (Open MPI was found when it was built). */
int kcl_built_with_mpi(void);

/* Join the cluster: MPI up (threads allowed), the signs of life started.
 * Fails (KRUN_EINPUT) when this build has no MPI, naming what to install. */
int kcl_start(int *argc, char ***argv, krun_err *err);
/* In the cluster (kcl_start succeeded, more than one rank). */
int kcl_active(void);
int kcl_rank(void);
int kcl_size(void);
/* "rank 2 (host node3, pid 4711)": for messages; known after kcl_start. */
const char *kcl_who(int rank);
/* The end (at exit, with the exit status): on rank 0 every other rank is
 * sent a stop (KCL_CTRL, first word KCL_STOP, second whether the cluster
 * failed), then the signs of life stop and MPI is finalized -- unless the
 * cluster failed: then finalizing would wait forever for a lost rank, and
 * the process leaves without it (_exit(status), stdio flushed): rank 0 at
 * once, the others once rank 0 has gone (so that mpirun, which ends every
 * rank when one leaves unfinalized, never cuts rank 0 off before its exit
 * status and its error are out). */
#define KCL_STOP 1
void kcl_finish(int status);
/* A follower took rank 0's stop message: a failed cluster is marked so. */
void kcl_stopped(const void *msg, size_t len);
/* A rank other than 0 after its cluster failed: fall silent (no more signs
 * of life, so rank 0 notices within its timeout and says which rank was
 * lost) and wait for rank 0's stop, or until it must be gone too; then the
 * process may exit 0 (a rank that exits non-zero makes plain mpirun end
 * every rank before rank 0 can say what happened). */
void kcl_linger(void);
/* Mark the cluster failed (err says why); every later wait fails with it. */
void kcl_fail(const krun_err *why);
int kcl_failed(krun_err *why);

/* Serve other ranks' requests while waiting: fn(ctx, from, tag) is called
 * when a message with one of these tags (KCL_EXQ, KCL_PRED) is pending; it
 * receives it and does the work.  Returns -1 with err to fail the wait. */
typedef int (*kcl_serve_fn)(void *ctx, int from, int tag, krun_err *err);
void kcl_set_server(kcl_serve_fn fn, void *ctx);

/* Send len bytes to rank `to`; returns when buf may be reused (serving
 * meanwhile).  Messages between two ranks with one tag arrive in order. */
int kcl_send(int to, int tag, const void *buf, size_t len, krun_err *err);
/* Start sending without waiting; kcl_flush waits until everything started
 * has gone (serving meanwhile).  buf must stay as it is until then. */
int kcl_post(int to, int tag, const void *buf, size_t len, krun_err *err);
int kcl_flush(krun_err *err);
/* Wait until a message with this tag is pending from one of the ranks in
 * `from` (a bit per rank), serving meanwhile; *src and *len say which.
 * Fails when one of them stops answering.  On a rank other than 0 a control
 * message from rank 0 (KCL_CTRL: stop, or a block given up) interrupts it:
 * returns 1, and the caller gives up what it was doing; its loop takes the
 * message. */
int kcl_wait(uint64_t from, int tag, int *src, size_t *len, krun_err *err);
/* A rank other than 0, idle: wait for rank 0's next order (KCL_OP) or
 * control message (KCL_CTRL, first), serving meanwhile; *tag says which. */
int kcl_wait_order(int *tag, size_t *len, krun_err *err);
/* 1 when a wait was interrupted by an order from rank 0 since the flag was
 * last cleared (clear: clear it now). */
int kcl_interrupted(int clear);
/* Receive the pending message (from, tag) of len bytes into buf (cap bytes). */
int kcl_recv(int from, int tag, void *buf, size_t cap, size_t len, krun_err *err);
/* kcl_wait then kcl_recv from one rank; *len (NULL: must be cap) gets the size. */
int kcl_get(int from, int tag, void *buf, size_t cap, size_t *len, krun_err *err);
/* 1 when a message (from, tag) is pending (no wait, no serving). */
int kcl_pending(int from, int tag, size_t *len);

/* Bytes sent and received by this rank so far (the network's share of a
 * token, in --json). */
void kcl_bytes(uint64_t *sent, uint64_t *received);

#endif
