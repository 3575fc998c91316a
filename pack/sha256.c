/* SHA-256 of the shards (OpenSSL libcrypto), several files at a time.  On an
 * HDD one worker is best (no seeking between files); on NVMe or an array
 * the hash itself (~0.5-1 GB/s per core) is the limit, so use every core. */
#include "source.h"

#include "format/kio.h"
#include "format/kos.h"
#include "format/kprogress.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SHA_CHUNK ((size_t)8 << 20)

struct sha_job {
    k3_source *src;
    _Atomic size_t next;
    kprogress *prog;
};

int ks_sha256_file(const char *path, char out[65], kprogress *prog, int *io_errno, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    uint8_t *buf = NULL;
    EVP_MD_CTX *ctx = NULL;
    unsigned char md[32];
    unsigned int mdlen = 0;
    uint64_t off = 0;
    int rc = -1;
    if (fd < 0) {
        if (io_errno && ks_is_io_errno(errno)) *io_errno = errno;
        snprintf(err, errlen, "%s", strerror(errno));
        return -1;
    }
    kos_cache_sequential(fd);
    buf = malloc(SHA_CHUNK);
    ctx = EVP_MD_CTX_new();
    if (!buf || !ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) { snprintf(err, errlen, "out of memory"); goto out; }
    for (;;) {
        ssize_t r = read(fd, buf, SHA_CHUNK);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (io_errno) *io_errno = errno;
            snprintf(err, errlen, "read error: %s", strerror(errno));
            goto out;
        }
        if (r == 0) break;
        if (EVP_DigestUpdate(ctx, buf, (size_t)r) != 1) { snprintf(err, errlen, "hash failed"); goto out; }
        /* hashed once: keep the page cache for something else (on a VM that
         * hands free memory back to the host this is also what is fast) */
        kos_cache_drop(fd, off, (uint64_t)r);
        off += (uint64_t)r;
        kprogress_add(prog, (uint64_t)r);
    }
    if (EVP_DigestFinal_ex(ctx, md, &mdlen) != 1 || mdlen != 32) { snprintf(err, errlen, "hash failed"); goto out; }
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
    rc = 0;
out:
    EVP_MD_CTX_free(ctx);
    free(buf);
    close(fd);
    return rc;
}

static void *sha_worker(void *arg)
{
    struct sha_job *job = arg;
    for (;;) {
        size_t i = atomic_fetch_add(&job->next, 1);
        ks_shard *s;
        char err[300];
        if (i >= job->src->n_shards) break;
        s = &job->src->shards[i];
        if (!s->present || !s->expect_sha[0] || s->gone) continue; /* a consumed shard: checked before it went */
        if (ks_sha256_file(s->path, s->got_sha, job->prog, &s->io_errno, err, sizeof err)) {
            s->got_sha[0] = 0;
            /* problems[] is per shard and only this worker touches shard i */
            char *m = malloc(strlen(err) + 40);
            if (m) snprintf(m, strlen(err) + 40, "SHA-256 not computed: %s", err);
            if (s->n_problems < KS_MAX_PROBLEMS) s->problems[s->n_problems] = m; else free(m);
            s->n_problems++;
        } else if (strcmp(s->got_sha, s->expect_sha) != 0) {
            char *m = malloc(220);
            if (m) snprintf(m, 220, "SHA-256 mismatch: got %.16s..., expected %.16s... (from %s)", s->got_sha, s->expect_sha, s->sha_from);
            if (s->n_problems < KS_MAX_PROBLEMS) s->problems[s->n_problems] = m; else free(m);
            s->n_problems++;
        }
    }
    return NULL;
}

int ks_check_sha256(k3_source *src, int threads, int progress)
{
    struct sha_job job = {.src = src};
    pthread_t *tid;
    int started = 0;
    if (threads < 1) threads = 1;
    job.prog = kprogress_start("sha256", ks_sha_bytes(src), progress);
    tid = calloc((size_t)threads, sizeof *tid);
    if (!tid) { kprogress_finish(job.prog); return -1; }
    for (int i = 1; i < threads; i++)
        if (pthread_create(&tid[i], NULL, sha_worker, &job) == 0) started++;
        else break;
    sha_worker(&job);
    for (int i = 1; i <= started; i++) pthread_join(tid[i], NULL);
    free(tid);
    kprogress_finish(job.prog);
    return 0;
}
