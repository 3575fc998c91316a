/* Sequences' states paged to disk (krun batch --state-dir; docs/BATCH.md,
 * "States on disk").
 *
 * A forward block walks the layers in order, so a sequence's KDA state and
 * ShortConv history, or its MLA latent rows, of layer L are needed only
 * while layer L runs.  With a pager every session slot's state lives in one
 * file, and RAM holds a WINDOW of K3_PAGE_WINDOW layers for every slot:
 * while layer L computes, layer L+1 of the block's sequences is read ahead
 * and layer L-1 is written back, by one I/O thread of the pager's own.
 * The window keeps the kinds apart (a KDA layer's region is its state and
 * ShortConv history, an MLA layer's its ctx latent rows): of each kind it
 * holds as many layers as 3 consecutive layers may have of it (K3, 3 KDA
 * to 1 MLA: 3 KDA and 1 MLA region per sequence), and the j-th layer of a
 * kind uses window layer j mod that.  Every state's per-layer pointers are
 * set there once (k3_pager_attach), so the forward pass computes exactly as
 * on a resident state: the same floats, the same operations, the same bits.
 *
 * The file is layer-sectioned: layer L's regions of every slot follow each
 * other, each region a multiple of 4096 bytes at a 4096-aligned offset.  It
 * is read and written through the page cache, and where the weights are
 * read with O_DIRECT (direct) the write-back is bounded: each region written
 * has its write-back started at once (dirty pages never pile up), and the
 * states take at most a quarter of the memory available at the start in
 * the page cache: the whole file while it fits; a larger file keeps that
 * many bytes of the regions written last (at least a window's worth, at
 * most four sweeps' regions), the oldest waited for and dropped beyond it,
 * and rows that are only read are dropped once read.  So a write never
 * waits in the disk's queue behind the weights' reads or anyone else's
 * (issue 34.15: with O_DIRECT each write of a few pages did, up to half a
 * job's time; tests/root/test_statepage_io.sh), and the page cache holds
 * at most the bound of what paging keeps out of RAM.
 * (KRUN_TEST_STATE_WINDOW_CACHE forces a window's bound, for the tests.)
 * A KDA layer's region (head states, then the ShortConv history) is read
 * and written whole; an MLA layer's holds the latent rows of positions
 * 0..pos: a block reads the rows before it and writes back only the pages
 * holding its new rows.
 *
 * Each (slot, layer) on disk has an XXH3-64 of its bytes, kept in RAM and
 * checked on every read: a mismatch is a KRUN_EDATA error naming the file,
 * slot and layer, and nothing is computed from those bytes.  A reset slot
 * reads as zeros without any I/O (its layers are marked empty).
 *
 * The file is scratch: nothing in it is trusted across runs (the checksums
 * live only in RAM), so a stale file of a killed run is truncated and reused;
 * the file is removed at close.  A second process on the same file is
 * refused (a lock). */
#ifndef KRUN_STATEPAGE_H
#define KRUN_STATEPAGE_H

#include "state.h"
#include "run/util/krun_err.h"

#include <stddef.h>
#include <stdint.h>

#define K3_PAGE_ALIGN 4096         /* regions, their offsets and the window: whole pages */
#define K3_PAGE_WINDOW 3           /* layers of state in RAM: written back, computing, read ahead */
#define K3_PAGE_FILE "krun-states" /* the file's name in the state directory */

typedef struct k3_pager k3_pager;

/* What k3_pager_open allocates for nslots slots: the window's KDA and MLA
 * regions, each rounded to K3_PAGE_ALIGN.  The planner counts this (one
 * source of truth). */
uint64_t k3_page_window_bytes(const k3_config *c, size_t ctx, size_t nslots);
/* The file's size for nslots slots: every layer of every slot. */
uint64_t k3_page_file_bytes(const k3_config *c, size_t ctx, size_t nslots);
/* Bytes a decoding sweep of B sequences at position pos reads and writes
 * for their states: every KDA layer read and written whole, every MLA
 * layer's rows 0..pos read and the page(s) of the new row written. */
void k3_page_sweep_bytes(const k3_config *c, size_t B, size_t pos, uint64_t *read, uint64_t *written);

/* Create (or truncate: it is scratch) DIR/K3_PAGE_FILE for nslots slots of
 * ctx positions, lock it, allocate the window, start the I/O thread.
 * dir is created if missing (and removed at close if so).  direct: the
 * write-back bounded as above (the weights' --io direct); 0: buffered, the
 * page cache absorbs the writes (--io pread or mmap). */
int k3_pager_open(k3_pager **out, const k3_config *c, size_t ctx, size_t nslots, const char *dir, int direct, krun_err *err);
/* Stop the thread, remove the file (and the directory if it made it). */
void k3_pager_close(k3_pager *p);
/* Point st's per-layer pointers into the window as slot `slot`, and mark
 * it reset; st was carved without layer buffers (k3_state_carve_tables). */
void k3_pager_attach(k3_pager *p, k3_state *st, size_t slot);
/* The slot's state is all zeros again: no I/O, its layers marked empty. */
void k3_pager_reset(k3_pager *p, size_t slot);

/* The forward pass's calls around a block (forward.c): the block's states
 * and new positions per state (n[g]); the states' pos is the position
 * before the block.  begin starts reading layer 0; layer_begin(L) waits for
 * layer L and starts reading L+1; layer_end(L) starts writing L back;
 * block_end waits until everything is written.  A failure (I/O, checksum)
 * is returned by the next call that waits; after any failure the block's
 * states are unusable (reset them), as after any failed block. */
int k3_pager_block_begin(k3_pager *p, k3_state *const *sts, const size_t *n, size_t nseg, krun_err *err);
int k3_pager_layer_begin(k3_pager *p, int L, krun_err *err);
void k3_pager_layer_end(k3_pager *p, int L);
int k3_pager_block_end(k3_pager *p, krun_err *err);

/* Bytes read from and written to the state file so far, and the seconds the
 * forward pass waited for it (what paging cost in time beyond the overlap). */
void k3_pager_counters(const k3_pager *p, uint64_t *read, uint64_t *written, double *wait_seconds);
const char *k3_pager_path(const k3_pager *p);
/* 1 when the file is read and written with O_DIRECT. */
int k3_pager_direct(const k3_pager *p);

#endif
