/* The I/O pool's cancel (kiop_cancel, the prediction's "the router chose
 * otherwise"): requests no worker has started are taken back unread, the
 * started ones land whole, and the bytes add up -- read + cancelled = queued,
 * the member's byte count = read -- whatever the race between the workers
 * and the cancel.  Two batches share the queues: cancelling one never takes
 * a request of the other, and urgent requests are served before read-ahead.
 * The member's busy time (kiop_member_busy: the union of its reads' times) is
 * more than 0 and at most the time the batches took, whatever the workers'
 * overlap (a sum over workers would exceed it), and stops when they are done. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "check.h"
#include "run/store/iopool.h"
#include "format/kprogress.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define REQ (256u << 10)  /* bytes per request */
#define NREQ 48           /* requests per batch */

static uint8_t pattern(uint64_t off) { return (uint8_t)(off * 2654435761u >> 13); }

/* How many of the batch's NREQ regions hold the file's bytes (whole), how
 * many are untouched (the sentinel), and whether any is torn. */
static void regions(const uint8_t *buf, uint64_t file_off, int *whole, int *untouched, int *torn)
{
    *whole = *untouched = *torn = 0;
    for (int k = 0; k < NREQ; k++) {
        const uint8_t *r = buf + (size_t)k * REQ;
        int same = 1, sentinel = 1;
        for (size_t i = 0; i < REQ; i++) {
            same &= r[i] == pattern(file_off + (uint64_t)k * REQ + i);
            sentinel &= r[i] == 0xA5;
        }
        if (same) (*whole)++;
        else if (sentinel) (*untouched)++;
        else (*torn)++;
    }
}

int main(void)
{
    char path[] = "/tmp/kpk-test-iopool-XXXXXX";
    const uint64_t size = 2ull * NREQ * REQ;
    int fd = mkstemp(path);
    uint8_t *file = malloc(size), *a = malloc((size_t)NREQ * REQ), *b = malloc((size_t)NREQ * REQ);
    CHECK(fd >= 0 && file && a && b, "a %llu-byte scratch file and two buffers", (unsigned long long)size);
    if (fd < 0 || !file || !a || !b) return check_exit();
    for (uint64_t i = 0; i < size; i++) file[i] = pattern(i);
    CHECK(write(fd, file, size) == (ssize_t)size, "scratch file written");
    unlink(path);

    for (int round = 0; round < 40; round++) {
        kiop_member m = {fd, 0};
        int threads = 1 + round % 3;
        kiop_pool *p = kiop_pool_create(&m, 1, &threads, NULL, 0);
        kiop_batch ba, bb;
        kiop_req req[2 * NREQ];
        uint64_t cancelled, read_bytes;
        double t0, t1, busy;
        int whole, untouched, torn, wb, ub, tb;
        if (!p || kiop_reserve(p, 2 * NREQ)) { CHECK(0, "pool of %d workers", threads); break; }
        memset(a, 0xA5, (size_t)NREQ * REQ);
        memset(b, 0xA5, (size_t)NREQ * REQ);
        memset(&ba, 0, sizeof ba);
        memset(&bb, 0, sizeof bb);
        memset(req, 0, sizeof req);
        /* batch a: read-ahead (a prediction); batch b: urgent, queued after it */
        for (int k = 0; k < NREQ; k++) {
            req[k] = (kiop_req){.member = 0, .off = (uint64_t)k * REQ, .len = REQ, .buf = a + (size_t)k * REQ,
                               .first = REQ, .prio = KIOP_AHEAD, .kind = 'P', .batch = &ba};
            req[NREQ + k] = (kiop_req){.member = 0, .off = (uint64_t)(NREQ + k) * REQ, .len = REQ, .buf = b + (size_t)k * REQ,
                                      .first = REQ, .prio = KIOP_URGENT, .kind = 'E', .batch = &bb};
        }
        t0 = know();
        if (kiop_submit(p, req, NREQ) || kiop_submit(p, req + NREQ, NREQ)) { CHECK(0, "submit"); kiop_pool_destroy(p); break; }
        if (round % 4 == 3) usleep(2000); /* sometimes let the workers get further first */
        cancelled = kiop_cancel(p, &ba);
        CHECK(kiop_wait(p, &ba) == 0 && kiop_wait(p, &bb) == 0, "round %d: both batches complete without error", round);
        t1 = know();
        read_bytes = kiop_member_bytes(p, 0);
        busy = kiop_member_busy(p, 0);
        CHECK(busy > 0 && busy <= t1 - t0, "round %d (%d workers): busy %.6f s, within the %.6f s the batches took", round, threads,
              busy, t1 - t0);
        usleep(2000);
        CHECK(kiop_member_busy(p, 0) == busy && kiop_member_busy(p, 1) == 0, "round %d: idle, the busy time stands still", round);
        regions(a, 0, &whole, &untouched, &torn);
        regions(b, (uint64_t)NREQ * REQ, &wb, &ub, &tb);
        CHECK(cancelled % REQ == 0 && (uint64_t)untouched * REQ == cancelled && torn == 0 && whole + untouched == NREQ,
              "round %d (%d workers): %d requests cancelled unread, %d landed whole, none torn", round, threads,
              untouched, whole);
        CHECK(wb == NREQ && ub == 0 && tb == 0, "round %d: the urgent batch is untouched by the cancel: %d/%d whole", round, wb, NREQ);
        CHECK(read_bytes + cancelled == 2ull * NREQ * REQ, "round %d: bytes read %llu + cancelled %llu = queued", round,
              (unsigned long long)read_bytes, (unsigned long long)cancelled);
        CHECK(kiop_cancel(p, &ba) == 0 && kiop_cancel(p, &bb) == 0, "round %d: cancelling a complete batch takes nothing", round);
        kiop_pool_destroy(p);
    }
    close(fd);
    free(file);
    free(a);
    free(b);
    return check_exit();
}
