/* The config.json reader (format/k3_config.c) on arbitrary bytes, and the
 * tensor schema (format/k3_schema.c) of whatever config it accepts: an
 * accepted config is within the documented ranges, and the schema's index,
 * inverse and name classification agree for every tensor looked at. */
#include "fuzz.h"

#include "format/k3_config.h"
#include "format/k3_schema.h"

#include <math.h>
#include <string.h>

static void check_tensor(const k3_schema *s, const k3_config *c, uint64_t i)
{
    k3_tensor_spec spec, back;
    char why[200];
    FUZZ_CHECK(k3_schema_at(s, i, &spec) == 0);
    FUZZ_CHECK(k3_schema_index(s, spec.role, spec.layer, spec.expert) == i);
    FUZZ_CHECK(spec.layer < c->n_layers && spec.expert < c->n_experts);
    FUZZ_CHECK(k3_schema_classify(c, spec.name, &back, why, sizeof why) == K3_CLASS_TENSOR);
    FUZZ_CHECK(back.role == spec.role && back.layer == spec.layer && back.expert == spec.expert);
    FUZZ_CHECK(back.ndim == spec.ndim && memcmp(back.shape, spec.shape, sizeof spec.shape) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static k3_config c;   /* 1 KB layer map: not on the stack of every call */
    static k3_schema s;
    char err[1200];
    err[0] = 0;
    if (k3_config_parse((const char *)data, size, &c, err, sizeof err)) {
        FUZZ_CHECK(strncmp(err, "config", 6) == 0);
        return 0;
    }
    FUZZ_CHECK(c.n_layers >= 1 && c.n_layers <= K3_MAX_LAYERS);
    FUZZ_CHECK(c.topk >= 1 && c.topk <= c.n_experts && c.topk <= 64);
    FUZZ_CHECK(c.first_dense >= 0 && c.first_dense <= c.n_layers);
    FUZZ_CHECK(k3_config_mla_layer_count(&c) >= 1 && k3_config_mla_layer_count(&c) < c.n_layers);
    FUZZ_CHECK(c.latent % 32 == 0 && c.moe_inter % 32 == 0);
    FUZZ_CHECK(isfinite(c.rms_eps) && c.rms_eps > 0 && isfinite(c.gate_lb) && c.gate_lb < 0);
    FUZZ_CHECK(isfinite(c.routed_scale) && c.routed_scale > 0);
    FUZZ_CHECK(isfinite(c.situ_beta1) && c.situ_beta1 > 0 && isfinite(c.situ_beta2) && c.situ_beta2 > 0);
    k3_schema_init(&s, &c);
    FUZZ_CHECK(s.count > 0);
    /* the first and last tensors and a spread in between (the count can be
     * in the hundreds of millions for a large config) */
    for (uint64_t i = 0; i < s.count && i < 300; i++) check_tensor(&s, &c, i);
    for (uint64_t k = 1; k <= 64 && k < s.count; k++) check_tensor(&s, &c, s.count - k);
    for (uint64_t k = 0; k < 64; k++) check_tensor(&s, &c, s.count / 64 * k);
    fuzz_accepted++;
    return 0;
}
