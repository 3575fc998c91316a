/* kpack info FILE.kpk and kpack cat FILE.kpk TENSOR. */
#include "cli.h"
#include "format/k3_config.h"
#include "format/k3_eagle.h"
#include "format/kio.h"
#include "format/kpk_reader.h"
#include "format/kprogress.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char info_usage[] =
    "usage: kpack info FILE.kpk [--json]\n"
    "\n"
    "Prints the model configuration, extents and bytes by kind (stored and decoded,\n"
    "with the compression ratio), the extent order and alignment, the member files\n"
    "of a set (path, role, size) and its stripe geometry, the tokenizer files, the\n"
    "provenance (kpack version, options, source files with their sizes and SHA-256\n"
    "when it was checked), the tensors that were dropped (vision) or, in a file\n"
    "with an archive, what the archive keeps.\n"
    "Exit: 0, 1 if the file is damaged, 2 if it is unreadable, not a KPK file, or a\n"
    "member file of a set is missing or wrong.\n";

static const char cat_usage[] =
    "usage: kpack cat FILE.kpk TENSOR_NAME\n"
    "\n"
    "Writes the tensor's bytes, exactly as in the source checkpoint, to stdout\n"
    "(after checking its extent: checksums, and every block of a compressed one).\n"
    "Embedded files are named meta/config.json, meta/tiktoken.model,\n"
    "meta/tokenizer_config.json.\n"
    "Exit: 0, 1 if the extent is corrupt, 2 if there is no such tensor or the file is unreadable.\n";

static int open_or_report(const char *path, kpk_file **f)
{
    kpk_err e = {0};
    if (kpk_open(path, f, &e) == 0) return KX_OK;
    kx_error("%s", e.msg);
    return kpk_err_is_damage(e.code) ? KX_BAD : KX_FAIL;
}

struct by_kind { uint32_t count; uint64_t stored, raw; uint32_t compressed; };

static double ratio(uint64_t stored, uint64_t raw) { return raw ? (double)stored / (double)raw : 1.0; }

static json_t *members_json(const kpk_file *f)
{
    json_t *a = json_array();
    for (uint16_t m = 0; m < kpk_member_count(f); m++) {
        const kpk_member *r = kpk_member_at(f, m);
        json_t *o = json_object();
        json_object_set_new(o, "index", json_integer(m));
        json_object_set_new(o, "path", json_string(m ? kpk_member_name(f, m) : kpk_path(f)));
        json_object_set_new(o, "role", json_string(kpk_role_name(r->role)));
        json_object_set_new(o, "bytes", json_integer((json_int_t)r->file_size));
        if (r->role == KPK_ROLE_STRIPE) json_object_set_new(o, "stripe_index", json_integer(r->stripe_index));
        json_array_append_new(a, o);
    }
    return a;
}

static void print_members(const kpk_file *f)
{
    const kpk_superblock *sb = kpk_super(f);
    char b[32];
    if (kpk_member_count(f) == 1) return;
    printf("members:   %u files", kpk_member_count(f));
    if (sb->stripe_count) {
        kfmt_bytes(sb->stripe_len, b, sizeof b);
        printf("; stripe space %s over %u members in units of %u KiB", b, sb->stripe_count, sb->stripe_unit >> 10);
    }
    printf("\n");
    for (uint16_t m = 0; m < kpk_member_count(f); m++) {
        const kpk_member *r = kpk_member_at(f, m);
        uint64_t held = 0;
        for (uint32_t i = 0; i < kpk_extent_count(f); i++) {
            const kpk_extent *x = kpk_extent_at(f, i);
            if (x->member == m) held += x->stored_len;
        }
        kfmt_bytes(r->file_size, b, sizeof b);
        if (r->role == KPK_ROLE_STRIPE)
            printf("  %3u %-6s %9s  %s (stripe %u)\n", m, kpk_role_name(r->role), b, kpk_member_name(f, m), r->stripe_index);
        else {
            char h[32];
            kfmt_bytes(held, h, sizeof h);
            printf("  %3u %-6s %9s  %s (extents: %s)\n", m, kpk_role_name(r->role), b, m ? kpk_member_name(f, m) : kpk_path(f), h);
        }
    }
}

/* What the archive keeps (§9.2): the recipe's files, or nothing. */
static void print_archive(json_t *manifest, const struct by_kind *k)
{
    json_t *ar = json_object_get(manifest, "archive"), *files = json_object_get(ar, "files"), *it;
    json_t *nk = json_object_get(ar, "not_kept");
    size_t i, checked = 0;
    uint64_t total = 0;
    char b[32];
    if (!ar) return;
    json_array_foreach(files, i, it) {
        total += (uint64_t)json_integer_value(json_object_get(it, "size"));
        checked += json_is_string(json_object_get(it, "sha256"));
    }
    kfmt_bytes(total, b, sizeof b);
    printf("archive:   %zu file%s of the download (%s) can be rebuilt with kpack export, SHA-256 recorded for %zu",
           json_array_size(files), json_array_size(files) == 1 ? "" : "s", b, checked);
    kfmt_bytes(k[KPK_KIND_ARCHIVE].stored, b, sizeof b);
    printf("; %u archive extent%s hold %s\n", k[KPK_KIND_ARCHIVE].count, k[KPK_KIND_ARCHIVE].count == 1 ? "" : "s", b);
    json_array_foreach(files, i, it) {
        kfmt_bytes((uint64_t)json_integer_value(json_object_get(it, "size")), b, sizeof b);
        printf("  %-12s %9s  %s  %s\n", json_string_value(json_object_get(it, "kind")), b,
               json_is_string(json_object_get(it, "sha256")) ? "sha256 checked" : "              ",
               json_string_value(json_object_get(it, "name")));
    }
    json_array_foreach(nk, i, it) {
        kfmt_bytes((uint64_t)json_integer_value(json_object_get(it, "size")), b, sizeof b);
        printf("  not kept: %s (%s): %s\n", json_string_value(json_object_get(it, "name")), b,
               json_string_value(json_object_get(it, "reason")));
    }
}

int cmd_info(int argc, char **argv)
{
    const char *path = NULL;
    int json = 0, rc;
    kpk_file *f;
    struct by_kind k[KPK_KIND_MAX + 1];
    char *cfg_text = NULL, cfg_err[600] = "";
    size_t cfg_len;
    k3_config cfg;
    k3_eagle_config dcfg;
    int have_cfg = 0, drafter;
    json_t *manifest;
    json_error_t je;
    kpk_err e = {0};
    size_t mlen;
    const char *mtext;
    const kpk_superblock *sb;

    for (int i = 1; i < argc; i++) {
        if (kx_flag(argc, argv, &i, "--help", NULL) || kx_flag(argc, argv, &i, "-h", NULL)) { fputs(info_usage, stdout); return KX_OK; }
        else if (kx_flag(argc, argv, &i, "--json", NULL)) json = 1;
        else if (argv[i][0] == '-') { kx_error("info: unknown option %s", argv[i]); fputs(info_usage, stderr); return KX_FAIL; }
        else if (!path) path = argv[i];
        else { kx_error("info: unexpected argument %s", argv[i]); return KX_FAIL; }
    }
    if (!path) { fputs(info_usage, stderr); return KX_FAIL; }
    if ((rc = open_or_report(path, &f))) return rc;
    sb = kpk_super(f);

    memset(k, 0, sizeof k);
    for (uint32_t i = 0; i < kpk_extent_count(f); i++) {
        const kpk_extent *x = kpk_extent_at(f, i);
        k[x->kind].count++;
        k[x->kind].stored += x->stored_len;
        k[x->kind].raw += x->raw_len;
        k[x->kind].compressed += x->codec != KPK_CODEC_NONE;
    }
    drafter = k3e_is_drafter_file(f);
    if (kpk_meta_file(f, "config.json", &cfg_text, &cfg_len, &e) == 0)
        have_cfg = (drafter ? k3e_config_parse(cfg_text, cfg_len, &dcfg, cfg_err, sizeof cfg_err)
                            : k3_config_parse(cfg_text, cfg_len, &cfg, cfg_err, sizeof cfg_err)) == 0;
    else snprintf(cfg_err, sizeof cfg_err, "%s", e.msg);
    mtext = kpk_manifest(f, &mlen);
    manifest = json_loadb(mtext, mlen, 0, &je);

    if (json) {
        json_t *j = json_object(), *kinds = json_object(), *files = json_array();
        const kpk_extent *meta = kpk_extent_at(f, (uint32_t)kpk_find_meta(f));
        json_object_set_new(j, "file", json_string(path));
        json_object_set_new(j, "bytes", json_integer((json_int_t)kpk_total_size(f)));
        json_object_set_new(j, "version", json_sprintf("%u.%u", sb->major, sb->minor));
        json_object_set_new(j, "align", json_integer(sb->align));
        json_object_set_new(j, "order", json_string(sb->order == KPK_ORDER_TRUNK_FIRST ? "trunk-first" : "layer-major"));
        json_object_set_new(j, "tensors", json_integer((json_int_t)kpk_tensor_count(f)));
        for (int kind = KPK_KIND_META; kind <= KPK_KIND_MAX; kind++) {
            json_t *o = json_object();
            json_object_set_new(o, "count", json_integer(k[kind].count));
            json_object_set_new(o, "bytes", json_integer((json_int_t)k[kind].stored));
            json_object_set_new(o, "raw_bytes", json_integer((json_int_t)k[kind].raw));
            json_object_set_new(o, "compressed", json_integer(k[kind].compressed));
            json_object_set_new(o, "ratio", json_real(ratio(k[kind].stored, k[kind].raw)));
            json_object_set_new(kinds, kpk_kind_name(kind), o);
        }
        json_object_set_new(j, "extents", kinds);
        json_object_set_new(j, "members", members_json(f));
        if (sb->stripe_count) {
            json_t *s = json_object();
            json_object_set_new(s, "members", json_integer(sb->stripe_count));
            json_object_set_new(s, "unit", json_integer(sb->stripe_unit));
            json_object_set_new(s, "length", json_integer((json_int_t)sb->stripe_len));
            json_object_set_new(j, "stripe", s);
        } else json_object_set_new(j, "stripe", json_null());
        json_object_set_new(j, "blocks", json_integer((json_int_t)sb->block_count));
        for (uint64_t i = meta->first_tensor; i < (uint64_t)meta->first_tensor + meta->tensor_count; i++) {
            kpk_tensor t;
            kpk_tensor_at(f, i, &t);
            json_array_append_new(files, json_string(t.name + strlen(KPK_META_PREFIX)));
        }
        json_object_set_new(j, "embedded_files", files);
        json_object_set_new(j, "kind", json_string(drafter ? "drafter" : "model"));
        if (have_cfg && drafter) {
            json_t *c = json_object(), *taps = json_array();
            for (int t = 0; t < dcfg.n_taps; t++) json_array_append_new(taps, json_integer(dcfg.tap_ids[t]));
            json_object_set_new(c, "hidden", json_integer(dcfg.hidden));
            json_object_set_new(c, "vocab", json_integer(dcfg.vocab));
            json_object_set_new(c, "heads", json_integer(dcfg.heads));
            json_object_set_new(c, "intermediate", json_integer(dcfg.inter));
            json_object_set_new(c, "yarn_factor", dcfg.yarn ? json_real(dcfg.yarn_factor) : json_null());
            json_object_set_new(c, "tap_ids", taps);
            json_object_set_new(c, "weights_bytes", json_integer((json_int_t)k3e_bytes(&dcfg, 0)));
            json_object_set_new(j, "drafter", c);
        } else if (have_cfg) {
            json_t *c = json_object();
            json_object_set_new(c, "layers", json_integer(cfg.n_layers));
            json_object_set_new(c, "mla_layers", json_integer(k3_config_mla_layer_count(&cfg)));
            json_object_set_new(c, "hidden", json_integer(cfg.hidden));
            json_object_set_new(c, "vocab", json_integer(cfg.vocab));
            json_object_set_new(c, "experts", json_integer(cfg.n_experts));
            json_object_set_new(c, "topk", json_integer(cfg.topk));
            json_object_set_new(c, "latent", json_integer(cfg.latent));
            json_object_set_new(j, "config", c);
        } else json_object_set_new(j, "config_error", json_string(cfg_err));
        json_object_set_new(j, "manifest", manifest ? manifest : json_null());
        manifest = NULL;
        json_dumpf(j, stdout, JSON_INDENT(1) | JSON_SORT_KEYS);
        fputc('\n', stdout);
        json_decref(j);
    } else {
        const kpk_extent *meta = kpk_extent_at(f, (uint32_t)kpk_find_meta(f));
        char b[32], r[32];
        kfmt_bytes(kpk_total_size(f), b, sizeof b);
        printf("file:      %s (%s), KPK %u.%u, extents aligned to %u, order %s\n", path, b, sb->major, sb->minor,
               sb->align, sb->order == KPK_ORDER_TRUNK_FIRST ? "trunk-first" : "layer-major");
        if (have_cfg && drafter) {
            kfmt_bytes(k3e_bytes(&dcfg, 0), r, sizeof r);
            printf("drafter:   %s, one MLA layer of %d heads, MLP %d, hidden %d, vocab %d, rope theta %g%s; taps [", dcfg.architecture,
                   dcfg.heads, dcfg.inter, dcfg.hidden, dcfg.vocab, dcfg.rope_theta, dcfg.yarn ? " with YaRN" : "");
            for (int t = 0; t < dcfg.n_taps; t++) printf("%s%d", t ? "," : "", dcfg.tap_ids[t]);
            printf("]; %s of weights held by krun (the embedding read by rows)\n", r);
        } else if (have_cfg)
            printf("model:     %d layers (%d MLA, %d KDA), hidden %d, vocab %d, %d routed experts top-%d + %d shared, latent %d\n",
                   cfg.n_layers, k3_config_mla_layer_count(&cfg), cfg.n_layers - k3_config_mla_layer_count(&cfg), cfg.hidden,
                   cfg.vocab, cfg.n_experts, cfg.topk, cfg.n_shared, cfg.latent);
        else printf("model:     config unreadable: %s\n", cfg_err);
        print_members(f);
        printf("extents:   %u in all, %llu tensors%s\n", kpk_extent_count(f), (unsigned long long)kpk_tensor_count(f),
               sb->block_count ? "; stored / decoded (ratio)" : "");
        for (int kind = KPK_KIND_META; kind <= KPK_KIND_MAX; kind++) {
            if ((kind == KPK_KIND_ARCHIVE || kind == KPK_KIND_DRAFTER || (drafter && kind != KPK_KIND_META)) && !k[kind].count) continue;
            kfmt_bytes(k[kind].stored, b, sizeof b);
            if (!k[kind].compressed) { printf("  %-8s %7u  %s\n", kpk_kind_name(kind), k[kind].count, b); continue; }
            kfmt_bytes(k[kind].raw, r, sizeof r);
            printf("  %-8s %7u  %s / %s (%.3f; %u compressed)\n", kpk_kind_name(kind), k[kind].count, b, r,
                   ratio(k[kind].stored, k[kind].raw), k[kind].compressed);
        }
        printf("files:    ");
        for (uint64_t i = meta->first_tensor; i < (uint64_t)meta->first_tensor + meta->tensor_count; i++) {
            kpk_tensor t;
            kpk_tensor_at(f, i, &t);
            printf(" %s", t.name + strlen(KPK_META_PREFIX));
        }
        printf("\n");
        if (manifest) {
            json_t *src = json_object_get(manifest, "source"), *fl = json_object_get(src, "files"), *d = json_object_get(manifest, "dropped");
            json_t *opts = json_object_get(manifest, "options");
            size_t nf = json_array_size(fl), nsha = 0, i;
            json_t *it;
            json_array_foreach(fl, i, it) nsha += json_is_string(json_object_get(it, "sha256"));
            printf("producer:  %s; options: align %lld, order %s\n", json_string_value(json_object_get(manifest, "producer")),
                   (long long)json_integer_value(json_object_get(opts, "align")),
                   json_string_value(json_object_get(opts, "order")));
            printf("source:    %s, %zu file%s, SHA-256 verified for %zu\n", json_string_value(json_object_get(src, "layout")),
                   nf, nf == 1 ? "" : "s", nsha);
            if (d) {
                kfmt_bytes((uint64_t)json_integer_value(json_object_get(d, "bytes")), b, sizeof b);
                printf("dropped:   %lld non-text tensors (%s)", (long long)json_integer_value(json_object_get(d, "count")), b);
                json_array_foreach(json_object_get(d, "names"), i, it) {
                    if (i == 3) { printf(", ..."); break; }
                    printf("%s%s", i ? ", " : ": ", json_string_value(it));
                }
                printf("\n");
            }
            print_archive(manifest, k);
        } else printf("manifest:  unreadable JSON\n");
    }
    json_decref(manifest);
    free(cfg_text);
    kpk_close(f);
    return KX_OK;
}

int cmd_cat(int argc, char **argv)
{
    const char *path = NULL, *name = NULL;
    kpk_file *f;
    kpk_tensor t;
    kpk_err e = {0};
    uint8_t *buf;
    int rc;
    const size_t CH = (size_t)8 << 20;

    for (int i = 1; i < argc; i++) {
        if (kx_flag(argc, argv, &i, "--help", NULL) || kx_flag(argc, argv, &i, "-h", NULL)) { fputs(cat_usage, stdout); return KX_OK; }
        else if (argv[i][0] == '-' && argv[i][1]) { kx_error("cat: unknown option %s", argv[i]); return KX_FAIL; }
        else if (!path) path = argv[i];
        else if (!name) name = argv[i];
        else { kx_error("cat: unexpected argument %s", argv[i]); return KX_FAIL; }
    }
    if (!path || !name) { fputs(cat_usage, stderr); return KX_FAIL; }
    if ((rc = open_or_report(path, &f))) return rc;
    if (kpk_find_tensor(f, name, &t) < 0) {
        kx_error("%s: no tensor named %s", path, name);
        kpk_close(f);
        return KX_FAIL;
    }
    buf = malloc(CH);
    if (!buf) { kx_error("out of memory"); kpk_close(f); return KX_FAIL; }
    if (kpk_extent_verify(f, t.extent, buf, CH, &e)) {
        kx_error("%s", e.msg);
        free(buf);
        kpk_close(f);
        return kpk_err_is_damage(e.code) ? KX_BAD : KX_FAIL;
    }
    /* raw bytes through the member files and the blocks, a chunk at a time */
    for (uint64_t pos = 0; pos < t.nbytes;) {
        size_t n = t.nbytes - pos < CH ? (size_t)(t.nbytes - pos) : CH;
        if (kpk_extent_read_raw(f, t.extent, buf, n, t.offset + pos, &e)) {
            kx_error("%s", e.msg);
            free(buf); kpk_close(f);
            return kpk_err_is_damage(e.code) ? KX_BAD : KX_FAIL;
        }
        if (fwrite(buf, 1, n, stdout) != n) {
            kx_error("writing stdout: %s", strerror(errno));
            free(buf); kpk_close(f);
            return KX_FAIL;
        }
        pos += n;
    }
    free(buf);
    kpk_close(f);
    if (fflush(stdout) != 0) { kx_error("writing stdout: %s", strerror(errno)); return KX_FAIL; }
    return KX_OK;
}
