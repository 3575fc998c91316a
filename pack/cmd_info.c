/* kpack info FILE.kpk and kpack cat FILE.kpk TENSOR. */
#include "cli.h"
#include "k3_config.h"
#include "kio.h"
#include "kprogress.h"
#include "kpk_reader.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char info_usage[] =
    "usage: kpack info FILE.kpk [--json]\n"
    "\n"
    "Prints the model configuration, extents and bytes by kind, the extent order\n"
    "and alignment, the tokenizer files, the provenance (kpack version, options,\n"
    "source files with their sizes and SHA-256 when it was checked) and the\n"
    "tensors that were dropped (vision).\n"
    "Exit: 0, 1 if the file is damaged, 2 if it is unreadable or not a KPK file.\n";

static const char cat_usage[] =
    "usage: kpack cat FILE.kpk TENSOR_NAME\n"
    "\n"
    "Writes the tensor's bytes, exactly as in the source checkpoint, to stdout\n"
    "(after checking its extent's checksum). Embedded files are named\n"
    "meta/config.json, meta/tiktoken.model, meta/tokenizer_config.json.\n"
    "Exit: 0, 1 if the extent is corrupt, 2 if there is no such tensor or the file is unreadable.\n";

static int open_or_report(const char *path, kpk_file **f)
{
    kpk_err e = {0};
    if (kpk_open(path, f, &e) == 0) return KX_OK;
    kx_error("%s", e.msg);
    return e.code == KPK_EFORMAT || e.code == KPK_ECHECKSUM ? KX_BAD : KX_FAIL;
}

int cmd_info(int argc, char **argv)
{
    const char *path = NULL;
    int json = 0, rc;
    kpk_file *f;
    uint32_t count[5] = {0};
    uint64_t bytes[5] = {0};
    char *cfg_text = NULL, cfg_err[600] = "";
    size_t cfg_len;
    k3_config cfg;
    int have_cfg = 0;
    json_t *manifest;
    json_error_t je;
    kpk_err e = {0};
    size_t mlen;
    const char *mtext;

    for (int i = 1; i < argc; i++) {
        if (kx_flag(argc, argv, &i, "--help", NULL) || kx_flag(argc, argv, &i, "-h", NULL)) { fputs(info_usage, stdout); return KX_OK; }
        else if (kx_flag(argc, argv, &i, "--json", NULL)) json = 1;
        else if (argv[i][0] == '-') { kx_error("info: unknown option %s", argv[i]); fputs(info_usage, stderr); return KX_FAIL; }
        else if (!path) path = argv[i];
        else { kx_error("info: unexpected argument %s", argv[i]); return KX_FAIL; }
    }
    if (!path) { fputs(info_usage, stderr); return KX_FAIL; }
    if ((rc = open_or_report(path, &f))) return rc;

    for (uint32_t i = 0; i < kpk_extent_count(f); i++) {
        const kpk_extent *x = kpk_extent_at(f, i);
        count[x->kind]++;
        bytes[x->kind] += x->stored_len;
    }
    if (kpk_meta_file(f, "config.json", &cfg_text, &cfg_len, &e) == 0)
        have_cfg = k3_config_parse(cfg_text, cfg_len, &cfg, cfg_err, sizeof cfg_err) == 0;
    else snprintf(cfg_err, sizeof cfg_err, "%s", e.msg);
    mtext = kpk_manifest(f, &mlen);
    manifest = json_loadb(mtext, mlen, 0, &je);

    if (json) {
        json_t *j = json_object(), *k = json_object(), *files = json_array();
        const kpk_superblock *sb = kpk_super(f);
        json_object_set_new(j, "file", json_string(path));
        json_object_set_new(j, "bytes", json_integer((json_int_t)kpk_size(f)));
        json_object_set_new(j, "version", json_sprintf("%u.%u", sb->major, sb->minor));
        json_object_set_new(j, "align", json_integer(sb->align));
        json_object_set_new(j, "order", json_string(sb->order == KPK_ORDER_TRUNK_FIRST ? "trunk-first" : "layer-major"));
        json_object_set_new(j, "tensors", json_integer((json_int_t)kpk_tensor_count(f)));
        for (int kind = KPK_KIND_META; kind <= KPK_KIND_EXPERT; kind++) {
            json_t *o = json_object();
            json_object_set_new(o, "count", json_integer(count[kind]));
            json_object_set_new(o, "bytes", json_integer((json_int_t)bytes[kind]));
            json_object_set_new(k, kpk_kind_name(kind), o);
        }
        json_object_set_new(j, "extents", k);
        for (uint64_t i = 0; i < kpk_tensor_count(f); i++) {
            kpk_tensor t;
            kpk_tensor_at(f, i, &t);
            if (t.dtype == KPK_DT_BYTES) json_array_append_new(files, json_string(t.name + strlen(KPK_META_PREFIX)));
            else break; /* the meta extent comes first */
        }
        json_object_set_new(j, "embedded_files", files);
        if (have_cfg) {
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
        const kpk_superblock *sb = kpk_super(f);
        char b[32];
        kfmt_bytes(kpk_size(f), b, sizeof b);
        printf("file:      %s (%s), KPK %u.%u, extents aligned to %u, order %s\n", path, b, sb->major, sb->minor,
               sb->align, sb->order == KPK_ORDER_TRUNK_FIRST ? "trunk-first" : "layer-major");
        if (have_cfg)
            printf("model:     %d layers (%d MLA, %d KDA), hidden %d, vocab %d, %d routed experts top-%d + %d shared, latent %d\n",
                   cfg.n_layers, k3_config_mla_layer_count(&cfg), cfg.n_layers - k3_config_mla_layer_count(&cfg), cfg.hidden,
                   cfg.vocab, cfg.n_experts, cfg.topk, cfg.n_shared, cfg.latent);
        else printf("model:     config unreadable: %s\n", cfg_err);
        printf("extents:   %u in all, %llu tensors\n", kpk_extent_count(f), (unsigned long long)kpk_tensor_count(f));
        for (int kind = KPK_KIND_META; kind <= KPK_KIND_EXPERT; kind++) {
            kfmt_bytes(bytes[kind], b, sizeof b);
            printf("  %-8s %7u  %s\n", kpk_kind_name(kind), count[kind], b);
        }
        printf("files:    ");
        for (uint64_t i = 0; i < kpk_tensor_count(f); i++) {
            kpk_tensor t;
            kpk_tensor_at(f, i, &t);
            if (t.dtype != KPK_DT_BYTES) break;
            printf(" %s", t.name + strlen(KPK_META_PREFIX));
        }
        printf("\n");
        if (manifest) {
            json_t *src = json_object_get(manifest, "source"), *fl = json_object_get(src, "files"), *d = json_object_get(manifest, "dropped");
            size_t nf = json_array_size(fl), nsha = 0, i;
            json_t *it;
            json_array_foreach(fl, i, it) nsha += json_is_string(json_object_get(it, "sha256"));
            printf("producer:  %s; options: align %lld, order %s\n", json_string_value(json_object_get(manifest, "producer")),
                   (long long)json_integer_value(json_object_get(json_object_get(manifest, "options"), "align")),
                   json_string_value(json_object_get(json_object_get(manifest, "options"), "order")));
            printf("source:    %s, %zu file%s, SHA-256 verified for %zu\n", json_string_value(json_object_get(src, "layout")),
                   nf, nf == 1 ? "" : "s", nsha);
            kfmt_bytes((uint64_t)json_integer_value(json_object_get(d, "bytes")), b, sizeof b);
            printf("dropped:   %lld non-text tensors (%s)", (long long)json_integer_value(json_object_get(d, "count")), b);
            json_array_foreach(json_object_get(d, "names"), i, it) {
                if (i == 3) { printf(", ..."); break; }
                printf("%s%s", i ? ", " : ": ", json_string_value(it));
            }
            printf("\n");
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
        return e.code == KPK_EIO ? KX_FAIL : KX_BAD;
    }
    {
        const kpk_extent *x = kpk_extent_at(f, t.extent);
        if (x->codec != KPK_CODEC_NONE) {
            uint8_t *raw = malloc(x->raw_len);
            if (!raw || kpk_extent_read(f, t.extent, raw, 1, &e) ||
                (t.nbytes && fwrite(raw + t.offset, 1, t.nbytes, stdout) != t.nbytes)) {
                kx_error("%s", raw ? e.msg : "out of memory");
                free(raw); free(buf); kpk_close(f);
                return KX_FAIL;
            }
            free(raw);
        } else {
            for (uint64_t pos = 0; pos < t.nbytes;) {
                size_t n = t.nbytes - pos < CH ? (size_t)(t.nbytes - pos) : CH;
                if (kio_pread_full(kpk_fd(f), buf, n, x->offset + t.offset + pos) || fwrite(buf, 1, n, stdout) != n) {
                    kx_error("%s: %s", path, strerror(errno));
                    free(buf); kpk_close(f);
                    return KX_FAIL;
                }
                pos += n;
            }
        }
    }
    free(buf);
    kpk_close(f);
    if (fflush(stdout) != 0) { kx_error("writing stdout: %s", strerror(errno)); return KX_FAIL; }
    return KX_OK;
}
