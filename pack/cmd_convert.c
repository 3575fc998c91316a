/* kpack convert SRC OUT.kpk: check the source (a checkpoint directory, or a
 * KPK file or set to re-lay out), plan the member files and extents, copy
 * the extents into the partial member files, all written in parallel
 * (resumable through OUT.journal), write the directory and superblocks,
 * fsync, rename. */
#include "archive.h"
#include "cli.h"
#include "consume.h"
#include "copy.h"
#include "directory.h"
#include "drafter.h"
#include "estimate.h"
#include "guard.h"
#include "journal.h"
#include "output.h"
#include "plan.h"
#include "report.h"
#include "resume.h"
#include "source.h"
#include "space.h"
#include "format/k3_check.h"
#include "format/kargs.h"
#include "format/kprogress.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <malloc.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char usage_fmt[] =
    "usage: kpack convert SRC OUT.kpk [--compress none|trunk|all] [--stripe DIR,DIR,...] [--machines N] [--stripe-unit SIZE]\n"
    "                     [--trunk-to DIR] [--align N] [--order layer-major|trunk-first]\n"
    "                     [--keep-max SIZE | --no-archive] [--sha256 SUMS] [--threads N]\n"
    "                     [--consume | --consume-blobs] [--yes] [--force] [--dry-run] [--json] [--quiet]\n"
    "\n"
    "Repacks a checked Kimi K3 checkpoint (SRC a directory) into a KPK file, or\n"
    "re-lays out an existing KPK file or set (SRC its entry file; the original\n"
    "shards are not needed, and the result equals a conversion of them with the\n"
    "same options). OUT may be one file, or a set of member files on several disks:\n"
    "\n"
    "  --stripe DIR,DIR,..  one stripe member per directory (OUT's name + .s0, .s1, ...):\n"
    "                  the globals, trunks and experts are striped over them in units,\n"
    "                  so every read keeps every disk busy; OUT keeps the directory\n"
    "  --machines N    the --stripe directories are N machines' disks, in order (as many\n"
    "                  on each): one member per directory (OUT's name + .m<machine>.<disk>)\n"
    "                  holding whole extents -- the experts dealt over all of them, each\n"
    "                  trunk layer on its machine's share, the globals on machine 0 -- so\n"
    "                  every machine needs only OUT and its own members (krun under mpirun)\n"
    "  --stripe-unit SIZE  the stripe unit: a power of two, a multiple of the\n"
    "                  alignment, at most 64M (default 4M)\n"
    "  --trunk-to DIR  the globals and every trunk layer (read on every token) in one\n"
    "                  member on a faster disk (OUT's name + .trunk); with --stripe,\n"
    "                  the experts are striped\n"
    "Member files are found through paths relative to OUT's directory: move a set as\n"
    "a whole. Each member file is written by its own thread, front to back.\n"
    "\n"
    "  --compress MODE none (default): every extent stored as it is; trunk: the globals\n"
    "                  and every trunk layer (read on every token) stored as compressed\n"
    "                  blocks (BF16 as byte planes + zstd; the embedding raw); all: every\n"
    "                  extent, the experts' scales too. Lossless; see README for which\n"
    "                  disks it pays on. Blocks are encoded on --threads cores.\n"
    "  --block-size SIZE  raw bytes per compressed block (default %uM; 64K..32M)\n"
    "  --zstd-level N  zstd level of blocks of text, headers and F32 vectors (default %d)\n"
    "  --zstd-literal-level N  of byte planes and MXFP4 bytes (default %d: zstd's fastest,\n"
    "                  Huffman literals only, the smallest and fastest to decode here;\n"
    "                  docs/PERFORMANCE.md has what each level costs)\n"
    "\n"
    "The archive: from a checkpoint directory, OUT also keeps every byte of the\n"
    "download that the model does not hold (the shards' headers, their non-text\n"
    "tensors and any gap bytes, and every other file of the directory up to\n"
    "--keep-max), so that `kpack export` gives the original files back and the\n"
    "download can be deleted once `kpack export --check` says so.\n"
    "  --keep-max SIZE largest other file kept (default %uM); larger ones are listed\n"
    "                  as not kept\n"
    "  --no-archive    keep only the model (the non-text tensors are dropped)\n"
    "\n"
    "Converting on the disk that holds the download (too small for two copies):\n"
    "  --consume       delete each source shard as soon as everything OUT needs of it\n"
    "                  (its extents, its part of the archive) is written, synced, verified\n"
    "                  (rebuilt and compared with its SHA-256 when one was checked, else\n"
    "                  read back and compared with the checksums computed while reading it)\n"
    "                  and journaled: the conversion needs about one shard of free space\n"
    "                  instead of a second copy (--dry-run says how much, per filesystem,\n"
    "                  and it is checked first). Needs the archive; `kpack export OUT DIR`\n"
    "                  gives every deleted file back bit for bit. The shards must be plain\n"
    "                  files that SRC may delete. Asks first on a terminal.\n"
    "  --consume-blobs the same for a Hugging Face cache snapshot, whose shards are links:\n"
    "                  each shard's blob is deleted with its link (no other snapshot of\n"
    "                  the cache may use it)\n"
    "  --yes           do not ask\n"
    "\n"
    "It writes NAME.partial for each output file and OUT.journal next to OUT (and, with\n"
    "--consume, OUT.consumed: what it keeps of each deleted shard); if it is\n"
    "interrupted (even by kill -9 or a power cut), rerunning the same command resumes\n"
    "from the last completed, verified extent and produces the same bytes as an\n"
    "uninterrupted run. The finished files are fsynced and renamed into place (the\n"
    "members first, OUT last). One conversion per output: OUT.lock is held while it\n"
    "runs, and a second one stops naming the first's pid.\n"
    "\n"
    "  --align N       extent alignment: 4096 (default) up to 2M, a power of two\n"
    "  --order O       layer-major (default): globals, then each layer's trunk followed\n"
    "                  by its experts, so one decoding step reads each file front to back;\n"
    "                  trunk-first: every trunk layer before all experts\n"
    "  --sha256 SUMS   verify the shards' and other files' SHA-256 first (sha256sum format)\n"
    "                  and record them; a Hugging Face cache snapshot's blob names are\n"
    "                  checked the same way\n"
    "  --threads N     files hashed at once, blocks encoded at once (default: all cores)\n"
    "  --force         replace OUT (and its members) if they exist (the old files stay\n"
    "                  until the new ones are complete)\n"
    "  --dry-run       print the plan (extents, each output file's size; compressed sizes\n"
    "                  are an estimate from sampled blocks) and stop\n"
    "  --json          machine-readable summary on stdout\n"
    "  --quiet         no progress line or notes\n"
    "\n"
    "Exit: 0 converted, 1 the source has problems (see check-source) or a source KPK\n"
    "      file is damaged, 2 cannot convert (usage, OUT exists, another kpack is\n"
    "      converting to OUT, not enough space, an I/O error, a source file that\n"
    "      cannot be read, a source --consume may not delete, the answer no).\n";

static void usage(FILE *f)
{
    fprintf(f, usage_fmt, (unsigned)(KP_BLOCK_SIZE_DEFAULT >> 20), KP_LEVEL_DEFAULT, KP_LITERAL_LEVEL_DEFAULT,
            (unsigned)(KA_KEEP_MAX_DEFAULT >> 20));
}

struct run {
    kp_plan *plan;
    const uint64_t *cursor;  /* where each target continues: the ends of the completed extents */
    uint64_t *ends;          /* per member, scratch */
    kp_out *out;
    int *fds;
    kjournal jr;
    const char *journal; /* its path, for messages */
    kj_record *pending;
    uint64_t n_pending;
    uint64_t since_sync;
    uint64_t sync_bytes;
    uint32_t done_count;
    kc_state *kc;            /* --consume: shards released as their extents become durable */
    kprogress *prog;
    long kill_after;         /* test hook: SIGKILL ourselves after this many extents */
    long delay_ms;           /* test hook: slow down so a test can kill -9 us */
    char err[800];
};

static long env_long(const char *name, long dflt)
{
    const char *v = getenv(name);
    long n;
    return v && kargs_long(v, 0, 1L << 40, &n) == 0 ? n : dflt;
}

/* Records go to the journal only once every member file holds their data durably. */
static int flush_journal(struct run *r)
{
    if (!r->n_pending) return 0;
    for (uint16_t m = 0; m < r->plan->n_members; m++) r->ends[m] = kp_member_end(r->plan, r->cursor, m);
    if (kp_out_sync(r->out, r->ends)) { kp_out_failed(r->out, r->err, sizeof r->err); return -1; }
    if (kj_append(&r->jr, r->pending, r->n_pending)) { snprintf(r->err, sizeof r->err, "writing the journal %s: %s", r->journal, strerror(errno)); return -1; }
    r->n_pending = 0;
    r->since_sync = 0;
    return 0;
}

static int on_extent_done(void *ctx, uint32_t i)
{
    struct run *r = ctx;
    const kpk_extent *x = &r->plan->extents[i];
    kj_record *rec = &r->pending[r->n_pending++];
    memset(rec, 0, sizeof *rec);
    rec->extent = i;
    rec->member = x->member;
    rec->offset = x->offset;
    rec->stored_len = x->stored_len;
    rec->stored_xxh3 = x->stored_xxh3;
    rec->raw_xxh3 = x->raw_xxh3;
    rec->n_blocks = kp_extent_nblocks(r->plan, i);
    rec->blocks = rec->n_blocks ? r->plan->blocks + x->first_block : NULL;
    r->since_sync += kpk_round_up(x->stored_len, r->plan->opt.align);
    r->done_count++;
    if (r->since_sync >= r->sync_bytes && flush_journal(r)) return -1;
    if (r->kc && kc_releases_at(r->kc, i) && /* the journal first: a shard goes only once it says where its bytes are */
        (flush_journal(r) || kc_release(r->kc, i, i + 1, r->fds, r->prog, r->err, sizeof r->err)))
        return -1;
    if (r->delay_ms > 0) {
        struct timespec ts = {r->delay_ms / 1000, (r->delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (r->kill_after > 0 && r->done_count >= (uint32_t)r->kill_after) raise(SIGKILL);
    return 0;
}

/* The progress line's per-disk part: bytes and MB/s of each member file. */
static void per_disk(void *ctx, double elapsed, char *buf, size_t n)
{
    const struct run *r = ctx;
    const kp_plan *p = r->plan;
    size_t at = 0;
    if (r->kc) { /* --consume: what was given back so far */
        kc_stats st;
        char b[32];
        kc_get_stats(r->kc, &st);
        kfmt_bytes(st.freed, b, sizeof b);
        at += (size_t)snprintf(buf, n, "freed %s (%u of %u shards)%s%s", b, st.released, st.shards, st.doing ? ", " : "",
                               st.doing ? st.doing : "");
        if (at >= n) return;
    }
    if (p->n_members < 2 || !r->out) return;
    for (uint16_t m = 0; m < p->n_members && at + 40 < n; m++) {
        const kp_member *mb = &p->members[m];
        char b[32], label[16];
        uint64_t bytes = kp_out_bytes(r->out, m);
        if (mb->role == KPK_ROLE_STRIPE) snprintf(label, sizeof label, "s%u", mb->stripe_index);
        else snprintf(label, sizeof label, "%s", m ? "trunk" : "entry");
        kfmt_bytes(bytes, b, sizeof b);
        at += (size_t)snprintf(buf + at, n - at, "%s%s %s %.1f MB/s", at ? ", " : "", label, b,
                               elapsed > 0 ? (double)bytes / elapsed / 1e6 : 0.0);
    }
}

/* The disk space the whole conversion needs, per filesystem, without and
 * (from a directory) with --consume: 0, or -1 with err. */
static int measure_space(const kp_input *in, const kp_plan *p, kp_space *sp, char *err, size_t errlen)
{
    uint64_t *cursor = malloc(sizeof *cursor * ((size_t)p->n_members + 1));
    kp_release *rel = NULL;
    size_t n_rel = 0;
    int rc = -1;
    if (!cursor || (in->consume && kc_releases(in->consume, 0, 1, &rel, &n_rel))) { snprintf(err, errlen, "out of memory"); goto out; }
    kp_cursors_init(p, cursor);
    rc = kp_space_measure(p, in, 0, cursor, rel, n_rel, sp, err, errlen);
out:
    free(cursor);
    free(rel);
    return rc;
}

static void print_plan(const kp_input *in, const kp_plan *p, const kp_estimate_note *est, const char *out, int json)
{
    kp_space sp = {0};
    char serr[300];
    const char *largest_name = NULL;
    uint64_t largest = in->consume ? kc_largest(in->consume, &largest_name) : 0;
    uint32_t by_kind[KPK_KIND_MAX + 1] = {0};
    uint64_t bytes_kind[KPK_KIND_MAX + 1] = {0}, total = 0, raw_total = 0;
    char d[64], b1[32], b2[32], b3[32];
    kp_layout l, raw;
    if (measure_space(in, p, &sp, serr, sizeof serr)) kx_error("%s", serr);
    if (kp_plan_estimate(p, 0.0, &l)) { kx_error("out of memory"); kp_space_free(&sp); return; }
    {   /* the same plan stored raw: what compression saves */
        kp_plan q = *p;
        for (int c = 0; c < KP_BC_COUNT; c++) q.est_ratio[c] = 1.0;
        if (kp_plan_estimate(&q, 0.0, &raw)) { kx_error("out of memory"); kp_layout_free(&l); kp_space_free(&sp); return; }
        for (uint32_t m = 0; m < p->n_members; m++) raw_total += raw.member_size[m];
        kp_layout_free(&raw);
    }
    for (uint32_t i = 0; i < p->n_extents; i++) {
        by_kind[p->extents[i].kind]++;
        bytes_kind[p->extents[i].kind] += p->extents[i].raw_len;
    }
    for (uint32_t m = 0; m < p->n_members; m++) total += l.member_size[m];
    kpk_extent_describe(&p->extents[p->largest_extent_index], d, sizeof d);
    if (json) {
        json_t *j = json_object(), *k = json_object(), *mem = json_array();
        json_object_set_new(j, "output", json_string(out));
        json_object_set_new(j, "order", json_string(kp_order_name(p->opt.order)));
        json_object_set_new(j, "align", json_integer(p->opt.align));
        json_object_set_new(j, "extents", json_integer(p->n_extents));
        json_object_set_new(j, "tensors", json_integer((json_int_t)p->n_tensors));
        json_object_set_new(j, "output_bytes", json_integer((json_int_t)total));
        json_object_set_new(j, "data_bytes", json_integer((json_int_t)p->data_bytes));
        json_object_set_new(j, "directory_bytes", json_integer((json_int_t)(l.backup_off - l.extent_table_off)));
        json_object_set_new(j, "largest_extent", json_string(d));
        json_object_set_new(j, "largest_extent_bytes", json_integer((json_int_t)p->largest_extent));
        for (int kind = KPK_KIND_META; kind <= KPK_KIND_MAX; kind++) {
            json_t *o = json_object();
            json_object_set_new(o, "count", json_integer(by_kind[kind]));
            json_object_set_new(o, "bytes", json_integer((json_int_t)bytes_kind[kind]));
            json_object_set_new(k, kpk_kind_name(kind), o);
        }
        json_object_set_new(j, "by_kind", k);
        for (uint32_t m = 0; m < p->n_members; m++) {
            json_t *o = json_object();
            json_object_set_new(o, "path", json_string(p->members[m].path));
            json_object_set_new(o, "role", json_string(kpk_role_name(p->members[m].role)));
            json_object_set_new(o, "bytes", json_integer((json_int_t)l.member_size[m]));
            json_array_append_new(mem, o);
        }
        json_object_set_new(j, "members", mem);
        json_object_set_new(j, "stripe_unit", json_integer(p->stripe_unit));
        json_object_set_new(j, "dropped_tensors", json_integer(in->src && !in->arch ? (json_int_t)in->src->n_dropped : 0));
        json_object_set_new(j, "compress", json_string(kp_compress_name(p->opt.codec.compress)));
        json_object_set_new(j, "output_bytes_is_estimate", json_boolean(p->n_blocks > 0));
        json_object_set_new(j, "uncompressed_output_bytes", json_integer((json_int_t)raw_total));
        json_object_set_new(j, "blocks", json_integer((json_int_t)p->n_blocks));
        json_object_set_new(j, "space", kp_space_json(p, &sp, in->consume != NULL));
        if (in->consume) {
            json_t *c = json_object();
            json_object_set_new(c, "largest_shard", largest_name ? json_string(largest_name) : json_null());
            json_object_set_new(c, "largest_shard_bytes", json_integer((json_int_t)largest));
            json_object_set_new(j, "consume", c);
        }
        if (p->n_blocks) {
            json_t *e = json_object();
            for (int c = 0; c < KP_BC_COUNT; c++) {
                json_t *o;
                if (!est->blocks[c]) continue;
                o = json_object();
                json_object_set_new(o, "blocks", json_integer((json_int_t)est->blocks[c]));
                json_object_set_new(o, "sampled", json_integer(est->sampled[c]));
                json_object_set_new(o, "stored_over_raw", json_real(p->est_ratio[c]));
                json_object_set_new(e, kp_class_name(c), o);
            }
            json_object_set_new(j, "estimate", e);
        }
        json_dumpf(j, stdout, JSON_INDENT(1) | JSON_SORT_KEYS);
        fputc('\n', stdout);
        json_decref(j);
        kp_layout_free(&l);
        kp_space_free(&sp);
        return;
    }
    kfmt_bytes(total, b1, sizeof b1);
    kfmt_bytes(p->largest_extent, b2, sizeof b2);
    kfmt_bytes(l.backup_off - l.extent_table_off, b3, sizeof b3);
    printf("plan for %s:\n", out);
    printf("  order %s, extents aligned to %u bytes\n", kp_order_name(p->opt.order), p->opt.align);
    printf("  extents: %u (%u meta, %u globals, %u trunk, %u expert", p->n_extents, by_kind[KPK_KIND_META],
           by_kind[KPK_KIND_GLOBALS], by_kind[KPK_KIND_TRUNK], by_kind[KPK_KIND_EXPERT]);
    if (by_kind[KPK_KIND_ARCHIVE]) printf(", %u archive", by_kind[KPK_KIND_ARCHIVE]);
    printf(")\n");
    if (in->src && in->arch)
        printf("  tensors: %llu (%zu non-text tensors, the shards' headers and %zu other files kept in the archive)\n",
               (unsigned long long)p->n_tensors, in->src->n_dropped, in->arch->n_files);
    else if (in->src) printf("  tensors: %llu (%zu non-text tensors dropped)\n", (unsigned long long)p->n_tensors, in->src->n_dropped);
    else printf("  tensors: %llu (re-laid out from %s)\n", (unsigned long long)p->n_tensors, kpk_path(in->kpk));
    if (p->n_blocks) {
        kfmt_bytes(raw_total, b2, sizeof b2);
        printf("  output size: ~%s (%llu bytes, an ESTIMATE; %s uncompressed; directory %s)\n", b1,
               (unsigned long long)total, b2, b3);
        printf("  compressed (--compress %s): %llu blocks of about %u KiB, zstd level %d (planes and MXFP4: %d); the\n"
               "  estimate encodes a few blocks of each class, spread over the source, and applies their stored/raw\n"
               "  to the class:\n",
               kp_compress_name(p->opt.codec.compress), (unsigned long long)p->n_blocks, p->opt.codec.block_size >> 10,
               p->opt.codec.level, p->opt.codec.literal_level);
        for (int c = 0; c < KP_BC_COUNT; c++)
            if (est->blocks[c])
                printf("    %-15s %8llu blocks, %u sampled: stored/raw %.3f\n", kp_class_name(c),
                       (unsigned long long)est->blocks[c], est->sampled[c], p->est_ratio[c]);
    } else {
        printf("  output size: %s (%llu bytes; directory %s)\n", b1, (unsigned long long)total, b3);
    }
    printf("  largest extent: %s, %s\n", d, b2);
    if (p->n_members > 1) {
        printf("  %u member files", p->n_members);
        if (p->n_stripe) printf(" (%u striped in units of %u KiB)", p->n_stripe, p->stripe_unit >> 10);
        printf(":\n");
        for (uint32_t m = 0; m < p->n_members; m++) {
            kfmt_bytes(l.member_size[m], b1, sizeof b1);
            printf("    %-6s %9s  %s\n", kpk_role_name(p->members[m].role), b1, p->members[m].path);
        }
    }
    kp_space_print(p, &sp, in->consume != NULL, stdout);
    if (in->consume && largest_name) {
        kfmt_bytes(largest, b1, sizeof b1);
        printf("    (--consume deletes each shard once its bytes are in the output; the largest, %s, is %s)\n", largest_name, b1);
    }
    kp_layout_free(&l);
    kp_space_free(&sp);
}

/* The plan holds everything the copy needs (names, offsets, sizes): the
 * parsed headers (~80 MB for the 497,220 tensors of K3) can go before the
 * hours of copying. */
static void drop_headers(k3_source *src)
{
    for (size_t i = 0; i < src->n_shards; i++) st_free(&src->shards[i].st);
    free(src->loc_shard);
    free(src->loc_tensor);
    free(src->dropped); /* its names pointed into the headers; the manifest has them */
    src->loc_shard = src->loc_tensor = NULL;
    src->dropped = NULL;
    src->n_dropped = 0;
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

/* 1 if path is a KPK file (by its magic), 0 if not, -1 if unreadable. */
static int is_kpk_file(const char *path)
{
    char magic[KPK_MAGIC_LEN];
    struct stat st;
    int fd, r;
    if (stat(path, &st) != 0) return -1;
    if (!S_ISREG(st.st_mode)) return 0;
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) return -1;
    r = read(fd, magic, sizeof magic) == (ssize_t)sizeof magic && memcmp(magic, KPK_MAGIC, KPK_MAGIC_LEN) == 0;
    close(fd);
    return r;
}

/* Split "a,b,c" into the options' stripe directories (each must exist). */
static int parse_dirs(char *list, const char ***out, uint16_t *n)
{
    const char **v = NULL;
    uint16_t k = 0;
    char *save = NULL;
    for (char *d = strtok_r(list, ",", &save); d; d = strtok_r(NULL, ",", &save)) {
        const char **g;
        if (!*d) continue;
        if (k == KPK_MAX_MEMBERS - 2) { kx_error("--stripe: at most %u directories", KPK_MAX_MEMBERS - 2); free(v); return -1; }
        if (!kx_is_dir(d)) { free(v); return -1; }
        if (!(g = realloc(v, sizeof *v * (k + 1u)))) { free(v); kx_error("out of memory"); return -1; }
        v = g;
        v[k++] = d;
    }
    if (!k) { kx_error("--stripe: expected one or more directories, separated by commas"); free(v); return -1; }
    *out = v;
    *n = k;
    return 0;
}

/* Open (fresh: create empty; resumed: keep, cut to what is kept) every
 * partial file, each locked: OUT.lock guards OUT's conversion, but another
 * output of the same name can stripe into the same directories. */
static int open_partials(const kp_plan *p, const uint64_t *cursor, int fresh, int *fds)
{
    for (uint32_t m = 0; m < p->n_members; m++) {
        const char *path = p->members[m].partial;
        fds[m] = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fds[m] < 0) { kx_error("cannot %s %s: %s", fresh ? "create" : "open", path, strerror(errno)); return -1; }
        if (flock(fds[m], LOCK_EX | LOCK_NB)) {
            kx_error("%s is being written by another kpack (converting another output of the same name into the same "
                     "directory?); wait for it, or give this output another name", path);
            return -1;
        }
        /* everything past the verified prefix is rewritten, but all-zero
         * blocks are skipped and padding never written: cut the file there so
         * a stale byte cannot survive into the finished file */
        if (ftruncate(fds[m], fresh ? 0 : (off_t)kp_member_end(p, cursor, (uint16_t)m))) {
            kx_error("cannot clear the unfinished part of %s: %s", path, strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* Forget the extents from `to` on (journal, cursors, partial files), to
 * write them again. */
static int roll_back(kp_plan *p, kjournal *jr, uint64_t *cursor, uint32_t to, const int *fds, char *err, size_t errlen)
{
    kj_record *recs = calloc((size_t)to + 1, sizeof *recs);
    if (!recs) { snprintf(err, errlen, "out of memory"); return -1; }
    for (uint32_t i = 0; i < to; i++) recs[i].n_blocks = kp_extent_nblocks(p, i);
    if (kj_truncate(jr, recs, to)) { snprintf(err, errlen, "cannot truncate the journal: %s", strerror(errno)); free(recs); return -1; }
    free(recs);
    kp_cursors_init(p, cursor);
    for (uint32_t i = 0; i < to; i++)
        cursor[kp_target(p, p->extents[i].member)] = p->extents[i].offset + kpk_round_up(p->extents[i].stored_len, p->opt.align);
    for (uint16_t m = 0; m < p->n_members; m++)
        if (ftruncate(fds[m], (off_t)kp_member_end(p, cursor, m))) {
            snprintf(err, errlen, "cannot clear the unfinished part of %s: %s", p->members[m].partial, strerror(errno));
            return -1;
        }
    return 0;
}

/* The command line, for the consume log (a resume that cannot go on names
 * the command that began the conversion). */
static char *command_line(int argc, char **argv)
{
    size_t n = 8;
    char *s, *at;
    for (int i = 0; i < argc; i++) n += 3 + 4 * strlen(argv[i]);
    if (!(s = malloc(n))) return NULL;
    at = s + sprintf(s, "kpack");
    for (int i = 0; i < argc; i++) {
        int plain = argv[i][0] && strspn(argv[i], "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=.,/:+@%") ==
                                      strlen(argv[i]);
        *at++ = ' ';
        if (!plain) *at++ = '\'';
        for (const char *c = argv[i]; *c; c++) {
            if (!plain && *c == '\'') { memcpy(at, "'\\''", 4); at += 4; }
            else *at++ = *c;
        }
        if (!plain) *at++ = '\'';
    }
    *at = 0;
    return s;
}

/* Room for the rest of the conversion, per filesystem: its peak with
 * --consume, else the whole output; a plain run that does not fit is told
 * what --consume would need. */
static int check_space(const kp_plan *p, const kp_input *in, uint32_t first, const uint64_t *cursor, kc_state *kc,
                       int consume, char *err, size_t errlen)
{
    kp_release *rel = NULL;
    size_t n_rel = 0;
    kp_space sp;
    int rc = -1;
    if (kc && kc_releases(kc, first, 0, &rel, &n_rel)) { snprintf(err, errlen, "out of memory"); return -1; }
    if (kp_space_measure(p, in, first, cursor, rel, n_rel, &sp, err, errlen)) goto out;
    rc = kp_space_verdict(p, &sp, consume, err, errlen);
    kp_space_free(&sp);
    if (rc && kc && !consume) {
        free(rel);
        rel = NULL;
        if (kc_releases(kc, first, 1, &rel, &n_rel) == 0 && n_rel &&
            kp_space_measure(p, in, first, cursor, rel, n_rel, &sp, err + strlen(err), 0) == 0) {
            char why[8], b[32];
            uint64_t peak = 0;
            for (size_t f = 0; f < sp.n; f++)
                if (sp.fs[f].peak > peak) peak = sp.fs[f].peak;
            kfmt_bytes(peak, b, sizeof b);
            if (kp_space_verdict(p, &sp, 1, why, sizeof why) == 0)
                snprintf(err + strlen(err), errlen - strlen(err), ". With --consume (each shard deleted once its bytes are "
                         "in the output; see --help) it needs %s at its peak, which fits: add --consume", b);
            kp_space_free(&sp);
        }
    }
out:
    free(rel);
    return rc;
}

/* --consume on a terminal: ask, saying what will be deleted and the space it needs. */
static int confirm_consume(const k3_source *src, kc_state *kc, const char *out)
{
    uint64_t bytes = 0, largest;
    size_t n = 0;
    const char *name;
    char what[1200], b1[32], b2[32];
    for (size_t i = 0; i < src->n_shards; i++)
        if (!src->shards[i].gone) { bytes += src->shards[i].size; n++; }
    largest = kc_largest(kc, &name);
    kfmt_bytes(bytes, b1, sizeof b1);
    kfmt_bytes(largest, b2, sizeof b2);
    snprintf(what, sizeof what, "kpack: --consume deletes the %zu shards of %s (%s) one by one as their bytes are written "
             "to %s, synced and verified; `kpack export %s DIR` gives them back. The largest, %s, is %s.", n, src->dir, b1,
             out, out, name ? name : "-", b2);
    return kc_confirm(what);
}

int cmd_convert(int argc, char **argv)
{
    const char *src_path = NULL, *out = NULL, *sums = NULL, *v;
    char *stripe_list = NULL;
    const char **stripe_dirs = NULL;
    kp_options opt = {.align = 4096, .order = KPK_ORDER_LAYER_MAJOR};
    int json = 0, quiet = 0, force = 0, dry = 0, threads = kx_cpus(), kind, no_archive = 0, have_arch = 0;
    int consume = 0, blobs = 0, yes = 0, src_lock = -1;
    kc_state *kc = NULL;
    char *command = NULL;
    int64_t unit = 0, keep_max = -1;
    ka_archive arch;
    kp_estimate_note est;
    k3_source src;
    kpk_file *kpk = NULL;
    k3_config kcfg;
    k3_schema kschema;
    kp_input in = {0};
    kp_plan plan;
    kp_layout layout = {0};
    struct run r;
    char err[2000], *journal = NULL;
    uint64_t *cursor = NULL, written = 0;
    uint32_t first = 0;
    int rc = KX_FAIL, have_src = 0, have_plan = 0, drafter = 0, have_drafter = 0;
    kd_source dsrc;
    kprogress *prog = NULL;
    kp_copy_stats stats = {0};
    double t0 = know(), t_copy;
    struct stat st;
    long n;
    kp_lock lock = KP_LOCK_INIT;

    memset(&r, 0, sizeof r);
    memset(&est, 0, sizeof est);
    r.jr.fd = -1;
    kp_codec_defaults(&opt.codec);
    for (int i = 1; i < argc; i++) {
        if (kx_flag(argc, argv, &i, "--help", NULL) || kx_flag(argc, argv, &i, "-h", NULL)) { usage(stdout); return KX_OK; }
        else if (kx_flag(argc, argv, &i, "--align", &v)) {
            int64_t a = kargs_size(v);
            if (a < 4096 || a > (2 << 20) || (a & (a - 1))) { kx_error("--align: expected a power of two from 4096 to 2M, got %s", v); return KX_FAIL; }
            opt.align = (uint32_t)a;
        } else if (kx_flag(argc, argv, &i, "--order", &v)) {
            if (strcmp(v, "layer-major") == 0) opt.order = KPK_ORDER_LAYER_MAJOR;
            else if (strcmp(v, "trunk-first") == 0) opt.order = KPK_ORDER_TRUNK_FIRST;
            else { kx_error("--order: expected layer-major or trunk-first, got %s", v); return KX_FAIL; }
        } else if (kx_flag(argc, argv, &i, "--stripe-unit", &v)) {
            unit = kargs_size(v);
            if (unit < 4096 || unit > KPK_MAX_STRIPE_UNIT || (unit & (unit - 1))) {
                kx_error("--stripe-unit: expected a power of two from 4K to 64M, got %s", v);
                return KX_FAIL;
            }
        } else if (kx_flag(argc, argv, &i, "--compress", &v)) {
            if ((opt.codec.compress = kp_compress_parse(v)) < 0) { kx_error("--compress: expected none, trunk or all, got %s", v); return KX_FAIL; }
        } else if (kx_flag(argc, argv, &i, "--block-size", &v)) {
            int64_t b = kargs_size(v);
            if (b < (64 << 10) || b > (32 << 20)) { kx_error("--block-size: expected 64K to 32M, got %s", v); return KX_FAIL; }
            opt.codec.block_size = (uint32_t)b;
        } else if (kx_flag(argc, argv, &i, "--zstd-literal-level", &v)) {
            if (kargs_long(v, -131072, 19, &n)) { kx_error("--zstd-literal-level: expected -131072..19, got %s", v); return KX_FAIL; }
            opt.codec.literal_level = (int)n;
        } else if (kx_flag(argc, argv, &i, "--zstd-level", &v)) {
            if (kargs_long(v, -131072, 19, &n)) { kx_error("--zstd-level: expected -131072..19, got %s", v); return KX_FAIL; }
            opt.codec.level = (int)n;
        } else if (kx_flag(argc, argv, &i, "--keep-max", &v)) {
            if ((keep_max = kargs_size(v)) < 0) { kx_error("--keep-max: expected a size (e.g. 64M), got %s", v); return KX_FAIL; }
        } else if (kx_flag(argc, argv, &i, "--no-archive", NULL)) no_archive = 1;
        else if (kx_flag(argc, argv, &i, "--consume", NULL)) consume = 1;
        else if (kx_flag(argc, argv, &i, "--consume-blobs", NULL)) consume = blobs = 1;
        else if (kx_flag(argc, argv, &i, "--yes", NULL)) yes = 1;
        else if (kx_flag(argc, argv, &i, "--stripe", &v)) stripe_list = (char *)v;
        else if (kx_flag(argc, argv, &i, "--trunk-to", &v)) opt.trunk_dir = v;
        else if (kx_flag(argc, argv, &i, "--machines", &v)) {   /* a set laid out for N machines (plan.h) */
            if (kargs_long(v, 1, KPK_MAX_MEMBERS - 2, &n)) { kx_error("--machines: expected 1..%u, got %s", KPK_MAX_MEMBERS - 2, v); return KX_FAIL; }
            opt.machines = (uint16_t)n;
        }
        else if (kx_flag(argc, argv, &i, "--sha256", &v)) sums = v;
        else if (kx_flag(argc, argv, &i, "--threads", &v)) {
            if (kargs_long(v, 1, 256, &n)) { kx_error("--threads: expected 1..256, got %s", v); return KX_FAIL; }
            threads = (int)n;
        } else if (kx_flag(argc, argv, &i, "--force", NULL)) force = 1;
        else if (kx_flag(argc, argv, &i, "--dry-run", NULL)) dry = 1;
        else if (kx_flag(argc, argv, &i, "--json", NULL)) json = 1;
        else if (kx_flag(argc, argv, &i, "--quiet", NULL)) quiet = 1;
        else if (argv[i][0] == '-') { kx_error("convert: unknown option %s", argv[i]); usage(stderr); return KX_FAIL; }
        else if (!src_path) src_path = argv[i];
        else if (!out) out = argv[i];
        else { kx_error("convert: unexpected argument %s", argv[i]); return KX_FAIL; }
    }
    if (!src_path || !out) { usage(stderr); return KX_FAIL; }
    if (json) quiet = 1;
    if (no_archive && keep_max >= 0) { kx_error("--keep-max and --no-archive contradict each other"); return KX_FAIL; }
    if (unit && !stripe_list) { kx_error("--stripe-unit needs --stripe"); return KX_FAIL; }
    if (unit && (uint64_t)unit < opt.align) {
        kx_error("--stripe-unit %lld is smaller than the alignment %u; it must be a multiple of it", (long long)unit, opt.align);
        return KX_FAIL;
    }
    opt.stripe_unit = (uint32_t)unit;
    if (opt.machines && (!stripe_list || unit)) { kx_error("--machines N needs --stripe DIR,... (each machine's disks, in order) and no --stripe-unit"); return KX_FAIL; }
    if (stripe_list) {
        stripe_list = strdup(stripe_list);
        if (!stripe_list || parse_dirs(stripe_list, &stripe_dirs, &opt.n_stripe)) { free(stripe_list); return KX_FAIL; }
        opt.stripe_dirs = stripe_dirs;
        if (opt.machines && opt.n_stripe % opt.machines) {
            kx_error("--machines %u: the %u --stripe directories must be the machines' disks, as many on each", opt.machines, opt.n_stripe);
            goto out;
        }
    }
    if (opt.trunk_dir && !kx_is_dir(opt.trunk_dir)) goto out;

    kind = is_kpk_file(src_path);
    if (kind < 0) { kx_error("%s: %s", src_path, strerror(errno)); goto out; }
    if (!kind && !kx_is_dir(src_path)) goto out;
    /* a drafter checkpoint (drafter.h): one uncompressed file, its weights held in memory by krun */
    drafter = !kind ? kd_is_drafter_dir(src_path) : 0;
    if (drafter < 0) { kx_error("%s/config.json: %s", src_path, strerror(errno)); goto out; }
    if (drafter && (stripe_list || opt.trunk_dir || opt.codec.compress != KP_COMPRESS_NONE || opt.order != KPK_ORDER_LAYER_MAJOR)) {
        kx_error("%s is a drafter checkpoint: it converts to one uncompressed file (krun holds its weights in memory); --stripe, "
                 "--trunk-to, --compress and --order apply to a model", src_path);
        goto out;
    }
    if (kind && sums) { kx_error("--sha256 checks a checkpoint directory; a KPK source is checked by its own checksums"); goto out; }
    if (kind && (no_archive || keep_max >= 0)) {
        kx_error("%s applies to a checkpoint directory; a re-layout keeps what the KPK source keeps", no_archive ? "--no-archive" : "--keep-max");
        goto out;
    }
    if (consume && kind) {
        kx_error("--consume deletes a checkpoint directory's shards as they are converted; %s is a KPK file (verify the new "
                 "file, then delete the old one yourself)", src_path);
        goto out;
    }
    if (consume && no_archive) {
        kx_error("--consume needs the archive: without it the deleted shards could not be given back (kpack export)");
        goto out;
    }
    if (!dry) {
        /* From here on, this process is the only kpack writing OUT's files
         * (taken before the source check, which may hash for hours). */
        if (kp_lock_take(&lock, out, err, sizeof err)) { kx_error("%s", err); goto out; }
        if (!force && lstat(out, &st) == 0) {
            kx_error("%s already exists; use --force to replace it", out);
            if (kc_finished_note(out, err, sizeof err)) kx_note(0, "%s", err);
            goto out;
        }
    }
    if (kind) {
        kpk_err e = {0};
        if (kpk_open(src_path, &kpk, &e)) {
            kx_error("%s", e.msg);
            rc = kpk_err_is_damage(e.code) ? KX_BAD : KX_FAIL;
            goto out;
        }
        if (k3_check_kpk(kpk, &kcfg, err, sizeof err)) {
            kx_error("%s; the source is not a complete Kimi K3 model, nothing was written", err);
            rc = KX_BAD;
            goto out;
        }
        k3_schema_init(&kschema, &kcfg);
        in.kpk = kpk;
        in.cfg = &kcfg;
        in.schema = &kschema;
    } else if (drafter) {
        if (kd_open(src_path, sums, !quiet, &dsrc, err, sizeof err)) {
            kx_error("%s; nothing was written", err);
            rc = ks_io_errno(&dsrc.src) ? KX_FAIL : KX_BAD;
            kd_free(&dsrc);
            goto out;
        }
        have_drafter = 1;
        if (ks_io_errno(&dsrc.src) || !ks_ok(&dsrc.src)) {
            kx_error("%s is not a complete, intact K3 EAGLE-3.1 drafter checkpoint; nothing was written:", src_path);
            kd_print(&dsrc, stderr);
            rc = ks_io_errno(&dsrc.src) ? KX_FAIL : KX_BAD;
            goto out;
        }
        if (!no_archive) {
            if (ka_scan(&dsrc.src, out, keep_max >= 0 ? (uint64_t)keep_max : KA_KEEP_MAX_DEFAULT, sums, &arch, err, sizeof err)) {
                kx_error("listing the files to keep: %s", err);
                goto out;
            }
            have_arch = 1;
            kd_archive_pins(&dsrc, &arch);
            if (ka_check_sha256(&arch, err, sizeof err)) {
                kx_error("%s; nothing was written", err);
                rc = arch.io_errno ? KX_FAIL : KX_BAD;
                goto out;
            }
            in.arch = &arch;
        }
        in.src = &dsrc.src;
        in.drafter = &dsrc;
    } else {
        const ks_gone *gone;
        size_t n_gone;
        /* one consuming conversion of SRC, and no other conversion of it meanwhile */
        if (!dry && kc_lock_source(src_path, consume, &src_lock, err, sizeof err)) { kx_error("%s", err); goto out; }
        /* shards an earlier --consume run deleted: its log has what planning needs of them */
        if (kc_load(&kc, out, err, sizeof err)) { kx_error("%s", err); goto out; }
        gone = kc_gone(kc, &n_gone);
        if (ks_open_gone(src_path, sums, gone, n_gone, &src, err, sizeof err)) {
            kx_error("%s; nothing was written", err);
            rc = ks_io_errno(&src) ? KX_FAIL : KX_BAD; /* unreadable: an I/O error, exit 2 */
            ks_free(&src);
            goto out;
        }
        have_src = 1;
        if (!no_archive) {
            if (ka_scan(&src, out, keep_max >= 0 ? (uint64_t)keep_max : KA_KEEP_MAX_DEFAULT, sums, &arch, err, sizeof err)) {
                kx_error("listing the files to keep: %s", err);
                goto out;
            }
            have_arch = 1;
        }
        /* Hashes are recorded only when checked: --sha256, or a Hugging Face
         * cache's blob names (which name the SHA-256) when there is an archive
         * (its export --check compares with them); a shard put back after
         * --consume deleted it is checked against the SHA-256 it had. */
        if (sums || (have_arch && src.hf_snapshot) || kc_recorded(kc)) ks_check_sha256(&src, threads, !quiet);
        if (ks_io_errno(&src)) {
            kx_error("%s: a source file could not be read (%s); nothing was written; fix the cause and rerun:",
                     src_path, strerror(ks_io_errno(&src)));
            kr_source_problems(&src, stderr);
            rc = KX_FAIL;
            goto out;
        }
        if (!ks_ok(&src)) {
            kx_error("%s is not a complete, intact Kimi K3 checkpoint; nothing was written:", src_path);
            kr_source_problems(&src, stderr);
            snprintf(err, sizeof err, "%s.journal", out);
            if (!kc_recorded(kc) && access(err, F_OK) == 0)
                kx_note(0, "%s is there but not %s.consumed: if `kpack convert --consume` deleted these shards, its record "
                        "of them is gone; put them back to resume", err, out);
            rc = KX_BAD;
            goto out;
        }
        if (have_arch && ka_check_sha256(&arch, err, sizeof err)) {
            kx_error("%s; nothing was written", err);
            rc = arch.io_errno ? KX_FAIL : KX_BAD;
            goto out;
        }
        if (have_arch) in.arch = &arch;
        in.src = &src;
        in.cfg = &src.cfg;
        in.schema = &src.schema;
    }
    in.threads = threads;
    if (kp_plan_build(&in, &opt, out, "kpack " KPACK_VERSION, &plan, err, sizeof err)) { kx_error("%s", err); goto out; }
    have_plan = 1;
    if (kc) {
        if (kc_bind(kc, &plan, &src, consume, err, sizeof err) || kc_check_plan(kc, err, sizeof err) ||
            (consume && kc_check_rails(kc, blobs, err, sizeof err))) {
            kx_error("%s", err);
            goto out;
        }
        if (consume && kc_other_fs_note(kc)) kx_note(quiet, "%s", kc_other_fs_note(kc));
        in.consume = kc;
        if (consume) r.kc = kc;
    }
    if (kp_estimate_ratios(&in, &plan, &est, err, sizeof err)) { kx_error("%s", err); goto out; }
    if (dry) {
        print_plan(&in, &plan, &est, out, json);
        rc = KX_OK;
        goto out;
    }
    for (uint32_t m = 1; m < plan.n_members; m++)
        if (!force && lstat(plan.members[m].path, &st) == 0) {
            kx_error("%s already exists; use --force to replace it", plan.members[m].path);
            goto out;
        }
    if (asprintf(&journal, "%s.journal", out) < 0) { journal = NULL; kx_error("out of memory"); goto out; }
    r.plan = &plan;
    r.journal = journal;
    r.sync_bytes = (uint64_t)env_long("KPACK_SYNC_BYTES", 1L << 30);
    r.kill_after = env_long("KPACK_TEST_KILL_AFTER", 0);
    r.delay_ms = env_long("KPACK_TEST_DELAY_MS", 0);
    r.pending = malloc(sizeof *r.pending * (plan.n_extents + 1));
    r.fds = malloc(sizeof *r.fds * plan.n_members);
    cursor = malloc(sizeof *cursor * ((size_t)plan.n_members + 1));
    r.ends = malloc(sizeof *r.ends * plan.n_members);
    r.cursor = cursor;
    if (!r.pending || !r.fds || !cursor || !r.ends) { kx_error("out of memory"); goto out; }
    for (uint32_t m = 0; m < plan.n_members; m++) r.fds[m] = -1;

    /* (a resume that would need a deleted shard stops below: no "starting over" note before it) */
    if (kp_resume_point(&plan, journal, &r.jr, cursor, &first, quiet || (kc && kc_recorded(kc)), err, sizeof err) ||
        (kc && kc_check_resume(kc, first, err, sizeof err))) {
        kx_error("%s", err);
        goto out;
    }
    if (check_space(&plan, &in, first, cursor, kc, consume, err, sizeof err)) { kx_error("%s", err); goto out; }
    if (consume && !yes && isatty(STDIN_FILENO) && isatty(STDERR_FILENO) && !confirm_consume(&src, kc, out)) {
        kx_error("nothing was written or deleted");
        goto out;
    }
    if (first == 0) {
        /* the journal first: a partial file without one is never taken for resumable */
        if (kj_create(&r.jr, journal, plan.plan_id, plan.n_extents, plan.n_members)) {
            kx_error("cannot create %s: %s", journal, strerror(errno));
            goto out;
        }
        if (open_partials(&plan, cursor, 1, r.fds)) goto out;
    } else {
        char b[32];
        uint64_t done_bytes = 0;
        if (open_partials(&plan, cursor, 0, r.fds)) goto out;
        for (uint32_t i = 0; i < first; i++) done_bytes += plan.extents[i].stored_len;
        kfmt_bytes(done_bytes, b, sizeof b);
        kx_note(quiet, "resuming %s: %u of %u extents (%s) already written and verified", plan.members[0].partial, first,
                plan.n_extents, b);
    }
    if (kc) {
        uint32_t redo;
        int got;
        if (!(command = command_line(argc, argv))) { kx_error("out of memory"); goto out; }
        /* a journaled extent that no longer reads back as written: written again, from there */
        while ((got = kc_begin(kc, command, first, r.fds, NULL, &redo, err, sizeof err)) == 1) {
            kx_note(quiet, "%s; writing it and what follows again", err);
            if (kc_check_resume(kc, redo, err, sizeof err) || roll_back(&plan, &r.jr, cursor, redo, r.fds, err, sizeof err)) {
                got = -1;
                break;
            }
            first = redo;
        }
        if (got) {
            kx_error("%s; rerun the same command to resume", err);
            goto out;
        }
    }
    if (have_src) drop_headers(&src);

    prog = kprogress_start("convert", plan.data_bytes, !quiet);
    r.prog = prog;
    {
        uint64_t done_data = 0;
        for (uint32_t i = 0; i < first; i++) done_data += plan.extents[i].raw_len;
        kprogress_set_done(prog, done_data);
    }
    if (kp_out_start(&r.out, &plan, r.fds, kp_chunk_hold, kp_chunk_release, NULL, err, sizeof err)) { kx_error("%s", err); goto out; }
    kprogress_set_detail(prog, per_disk, &r);
    if (kp_copy_extents(&in, &plan, r.out, cursor, first, on_extent_done, &r, prog, &stats, err, sizeof err) ||
        flush_journal(&r)) {
        kprogress_finish(prog);
        prog = r.prog = NULL;
        kx_error("%s%s%s", err, r.err[0] && err[0] ? ": " : "", r.err);
        kx_error("the .partial files and %s are kept; rerun the same command to resume", journal);
        if (stats.source_damaged) rc = KX_BAD;
        goto out;
    }
    t_copy = kprogress_finish(prog);
    prog = r.prog = NULL;
    for (uint16_t m = 0; m < plan.n_members; m++) written += kp_out_written(r.out, m);
    if (kp_out_stop(r.out, err, sizeof err)) { r.out = NULL; kx_error("%s", err); goto out; }
    r.out = NULL;
    if (kp_layout_finish(&plan, cursor, &layout) || kp_finish_files(&plan, &layout, r.fds, err, sizeof err)) {
        kx_error("%s", layout.member_size ? err : "out of memory");
        goto out;
    }
    if (kp_check_before_publish(r.fds, journal, &plan, &layout, err, sizeof err)) {
        kx_error("%s; nothing was published. Rerun the same command: it resumes from what still verifies", err);
        goto out;
    }
    for (uint32_t m = 0; m < plan.n_members; m++) {
        int bad = close(r.fds[m]);
        r.fds[m] = -1;
        if (bad) { kx_error("closing %s: %s", plan.members[m].partial, strerror(errno)); goto out; }
    }
    /* the members first, the entry last: an entry in place means a complete set */
    for (uint32_t m = plan.n_members; m-- > 0;)
        if (rename(plan.members[m].partial, plan.members[m].path)) {
            kx_error("renaming %s to %s: %s", plan.members[m].partial, plan.members[m].path, strerror(errno));
            goto out;
        }
    for (uint32_t m = 0; m < plan.n_members; m++) kx_fsync_dir(plan.members[m].dir);
    kj_close(&r.jr);
    unlink(journal);
    kx_fsync_dir(plan.members[0].dir);
    if (kc) kc_finish(kc);
    {
        double secs = know() - t0;
        double mbps = t_copy > 0 ? (double)stats.bytes_in / t_copy / 1e6 : 0;
        uint64_t total = 0;
        for (uint32_t m = 0; m < plan.n_members; m++) total += layout.member_size[m];
        if (json) {
            json_t *j = json_object(), *mem = json_array();
            json_object_set_new(j, "output", json_string(out));
            json_object_set_new(j, "output_bytes", json_integer((json_int_t)total));
            json_object_set_new(j, "extents", json_integer(plan.n_extents));
            json_object_set_new(j, "tensors", json_integer((json_int_t)plan.n_tensors));
            json_object_set_new(j, "resumed_at_extent", json_integer(first));
            json_object_set_new(j, "bytes_copied", json_integer((json_int_t)stats.bytes_in));
            json_object_set_new(j, "bytes_stored", json_integer((json_int_t)stats.bytes_stored));
            json_object_set_new(j, "compress", json_string(kp_compress_name(plan.opt.codec.compress)));
            json_object_set_new(j, "blocks", json_integer((json_int_t)plan.n_blocks));
            json_object_set_new(j, "bytes_read", json_integer((json_int_t)stats.bytes_read));
            json_object_set_new(j, "bytes_written", json_integer((json_int_t)written));
            json_object_set_new(j, "copy_seconds", json_real(t_copy));
            json_object_set_new(j, "seconds", json_real(secs));
            json_object_set_new(j, "mb_per_s", json_real(mbps));
            for (uint32_t m = 0; m < plan.n_members; m++) {
                json_t *o = json_object();
                json_object_set_new(o, "path", json_string(plan.members[m].path));
                json_object_set_new(o, "role", json_string(kpk_role_name(plan.members[m].role)));
                json_object_set_new(o, "bytes", json_integer((json_int_t)layout.member_size[m]));
                json_array_append_new(mem, o);
            }
            json_object_set_new(j, "members", mem);
            if (r.kc) {
                kc_stats cs;
                json_t *o = json_object();
                kc_get_stats(r.kc, &cs);
                json_object_set_new(o, "shards", json_integer(cs.shards));
                json_object_set_new(o, "deleted", json_integer(cs.released));
                json_object_set_new(o, "deleted_by_this_run", json_integer(cs.released_now));
                json_object_set_new(o, "bytes_freed", json_integer((json_int_t)cs.freed));
                json_object_set_new(o, "bytes_freed_by_this_run", json_integer((json_int_t)cs.freed_now));
                json_object_set_new(j, "consume", o);
            }
            json_dumpf(j, stdout, JSON_INDENT(1) | JSON_SORT_KEYS);
            fputc('\n', stdout);
            json_decref(j);
        } else if (!quiet) {
            char b1[32], b2[32], mem[48] = "";
            kfmt_bytes(total, b1, sizeof b1);
            kfmt_bytes(stats.bytes_in, b2, sizeof b2);
            if (plan.n_members > 1) snprintf(mem, sizeof mem, " in %u member files", plan.n_members);
            fprintf(stderr, "kpack: wrote %s (%s%s, %u extents, %llu tensors); copied %s in %.1f s (%.0f MB/s)", out, b1,
                    mem, plan.n_extents, (unsigned long long)plan.n_tensors, b2, t_copy, mbps);
            if (plan.n_blocks && stats.bytes_in)
                fprintf(stderr, "; this run stored %.3f of what it copied (%llu compressed blocks in all)",
                        (double)stats.bytes_stored / (double)stats.bytes_in, (unsigned long long)plan.n_blocks);
            fputc('\n', stderr);
            if (r.kc) {
                kc_stats cs;
                kc_get_stats(r.kc, &cs);
                kfmt_bytes(cs.freed, b1, sizeof b1);
                fprintf(stderr, "kpack: deleted the %u shards of %s as they were converted (%s freed); `kpack export %s DIR` "
                        "gives them back, bit for bit\n", cs.released, src_path, b1, out);
            }
        }
    }
    rc = KX_OK;
out:
    if (prog) kprogress_finish(prog);
    if (r.out) kp_out_stop(r.out, NULL, 0);
    if (r.fds)
        for (uint32_t m = 0; have_plan && m < plan.n_members; m++)
            if (r.fds[m] >= 0) close(r.fds[m]);
    kj_close(&r.jr);
    kc_free(kc);
    if (src_lock >= 0) close(src_lock);
    free(command);
    kp_lock_release(&lock);
    kp_layout_free(&layout);
    free(r.pending);
    free(r.fds);
    free(r.ends);
    free(cursor);
    free(journal);
    if (have_plan) kp_plan_free(&plan);
    if (have_arch) ka_free(&arch);
    if (have_src) ks_free(&src);
    if (have_drafter) kd_free(&dsrc);
    kpk_close(kpk);
    free(stripe_dirs);
    free(stripe_list);
    return rc;
}
