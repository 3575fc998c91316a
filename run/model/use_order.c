/* The order in which the forward pass uses a layer's tensors (use_order.h). */
#include "use_order.h"

/* Keep in step with forward.c, kda.c, mla.c, moe.c: a streamed product out of
 * this order fails the step (k3_weights_end names it), and the tests run every
 * layer kind streamed. */
static const k3_use_step ORDER_COMMON[] = {
    /* AttnRes and the norms, all at the front of the extent */
    {K3T_INPUT_LN, K3U_VEC}, {K3T_POST_ATTN_LN, K3U_VEC}, {K3T_ATTN_RES_NORM, K3U_VEC},
    {K3T_ATTN_RES_PROJ, K3U_VEC}, {K3T_MLP_RES_NORM, K3U_VEC}, {K3T_MLP_RES_PROJ, K3U_VEC}};
static const k3_use_step ORDER_KDA[] = { /* kda_forward */
    {K3T_KDA_Q, K3U_ONCE}, {K3T_KDA_K, K3U_ONCE}, {K3T_KDA_V, K3U_ONCE}, {K3T_KDA_G, K3U_ONCE}, {K3T_KDA_B, K3U_ONCE},
    {K3T_KDA_FA, K3U_ONCE}, {K3T_KDA_FB, K3U_ONCE}, {K3T_KDA_QCONV, K3U_VEC}, {K3T_KDA_KCONV, K3U_VEC},
    {K3T_KDA_VCONV, K3U_VEC}, {K3T_KDA_ALOG, K3U_VEC}, {K3T_KDA_DTBIAS, K3U_VEC}, {K3T_KDA_ONORM, K3U_VEC},
    {K3T_KDA_O, K3U_ONCE}};
static const k3_use_step ORDER_MLA[] = { /* mla_forward */
    {K3T_MLA_QA, K3U_ONCE}, {K3T_MLA_QA_NORM, K3U_VEC}, {K3T_MLA_QB, K3U_ONCE}, {K3T_MLA_KVA, K3U_ONCE},
    {K3T_MLA_KVA_NORM, K3U_VEC}, {K3T_MLA_G, K3U_ONCE}, {K3T_MLA_KVB, K3U_MULTI}, {K3T_MLA_O, K3U_ONCE}};
static const k3_use_step ORDER_DENSE[] = { /* dense_ffn_forward */
    {K3T_FFN_GATE, K3U_ONCE}, {K3T_FFN_UP, K3U_ONCE}, {K3T_FFN_DOWN, K3U_ONCE}};
static const k3_use_step ORDER_MOE[] = { /* moe_forward */
    {K3T_MOE_ROUTER, K3U_ONCE}, {K3T_MOE_BIAS, K3U_VEC}, {K3T_MOE_DOWN, K3U_ONCE}, {K3T_MOE_NORM, K3U_VEC},
    {K3T_MOE_UP, K3U_ONCE}, {K3T_SH_GATE, K3U_ONCE}, {K3T_SH_UP, K3U_ONCE}, {K3T_SH_DOWN, K3U_ONCE}};
static const k3_use_step ORDER_HEAD[] = {{K3T_LM_HEAD, K3U_ONCE}}; /* output(): the vectors of the globals are held */

static int append(const k3_model *m, int L, const k3_use_step *src, size_t n, k3_use_step *out, int k)
{
    for (size_t i = 0; i < n; i++) {
        const kt_loc *l = L == K3_GLOBALS ? &m->globals[src[i].role] : &m->trunk[(size_t)L * K3T_COUNT + src[i].role];
        if (l->nbytes) out[k++] = src[i];
    }
    return k;
}
#define APPEND(T) (k = append(m, L, T, sizeof T / sizeof T[0], out, k))

int k3_use_order(const k3_model *m, int L, k3_use_step *out)
{
    int k = 0;
    if (L == K3_GLOBALS) return APPEND(ORDER_HEAD);
    APPEND(ORDER_COMMON);
    if (m->cfg.layer_is_mla[L]) APPEND(ORDER_MLA);
    else APPEND(ORDER_KDA);
    if (k3_layer_is_moe(&m->cfg, L)) APPEND(ORDER_MOE);
    else APPEND(ORDER_DENSE);
    return k;
}
