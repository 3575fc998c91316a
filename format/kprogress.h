/* A progress line for long operations: bytes done, MB/s, ETA.  Drawn on
 * stderr only when stderr is a terminal (and not disabled), at most a few
 * times a second; silent in pipes and logs.  Thread-safe updates. */
#ifndef KPK_KPROGRESS_H
#define KPK_KPROGRESS_H

#include <stddef.h>
#include <stdint.h>

typedef struct kprogress kprogress;

/* enabled: 1 = draw if stderr is a tty, 0 = never. */
kprogress *kprogress_start(const char *label, uint64_t total, int enabled);
void kprogress_add(kprogress *p, uint64_t bytes);      /* thread-safe */
void kprogress_set_done(kprogress *p, uint64_t done);  /* absolute, e.g. when resuming */
/* More on the line, e.g. per disk: fn writes into buf (n bytes) when the
 * line is drawn, from whichever thread draws it. */
typedef void (*kprogress_detail_fn)(void *ctx, double elapsed, char *buf, size_t n);
void kprogress_set_detail(kprogress *p, kprogress_detail_fn fn, void *ctx);
/* Clears the line; returns elapsed seconds. */
double kprogress_finish(kprogress *p);
double kprogress_elapsed(const kprogress *p);

/* "1.56 TB", "17.5 MB": decimal units, as disks are sold. */
void kfmt_bytes(uint64_t n, char *buf, int len);
void kfmt_duration(double seconds, char *buf, int len);
double know(void);  /* monotonic seconds */

#endif
