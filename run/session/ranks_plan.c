/* The cluster's plan and its cost: what each rank holds, reads and sends
 * per decoding sweep, and the seconds that takes (session.h,
 * krun_model_cluster_plan; docs/RUNTIME.md §10). */
#include "ranks.h"

#include "format/kprogress.h"
#include "run/engine/forward.h"

#include <stdlib.h>
#include <string.h>

#define SAMPLES 32                 /* random top-k draws per MoE layer for the expected cost */

/* AttnRes snapshots a position carries into layer L (n_layers: the output). */
static size_t snaps_before(const k3_config *c, int L) { return L == 0 ? 0 : (size_t)((L - 1) / c->attn_res_block + 1); }

/* The disks rank r's trunk is read from: a stripe's members, or one. */
static int trunk_drives(const kpk_file *f, const k3_model *m, const krun_layout *lay, int r)
{
    int drives = 1;
    for (int L = 0; L < m->cfg.n_layers; L++) {
        if (lay->owner[L] != r) continue;
        if (kpk_extent_at(f, m->trunk_extent[L])->member == KPK_STRIPED) {
            drives = 0;
            for (uint16_t k = 0; k < kpk_member_count(f); k++) drives += kpk_member_at(f, k)->role == KPK_ROLE_STRIPE;
        }
        break;
    }
    return drives > 0 ? drives : 1;
}

/* Rank r's own memory plan for its layers (the planner every rank runs). */
static int rank_plan(const krun_model *model, k3_model *m, const krun_model_opts *o, const krun_layout *lay, int r, krun_rank_plan *rp,
                     krun_err *err)
{
    const int NL = m->cfg.n_layers;
    uint8_t away[K3_MAX_LAYERS];
    krun_model_opts q = *o;
    kmemplan p;
    int rc;
    for (int L = 0; L < NL; L++) away[L] = lay->owner[L] != r;
    rp->first = rp->last = -1;
    for (int L = 0; L < NL; L++)
        if (!away[L]) {
            if (rp->first < 0) rp->first = L;
            rp->last = L;
            rp->layers++;
        }
    rp->budget = lay->budget[r];
    if (!rp->budget) {             /* in place: every layer it computes is in its mapping */
        rp->pinned = rp->layers;
        return 0;
    }
    q.budget = rp->budget;
    if (r) q.pin = q.expert_slots = q.head = -1;   /* --pin and the like are rank 0's */
    if (k3_model_set_away(m, away, r != 0, err)) return -1;
    rc = krun_model_make_plan(model, &q, &p, err);
    if (rc) return krun_err_prefix(err, "%s: ", rp->who);
    for (int L = 0; L < NL && L < p.pin; L++) rp->pinned += !away[L];
    rp->expert_slots = p.expert_slots;
    rp->total = p.total;
    rp->trunk_bytes = (double)(p.trunk_stream_bytes + p.head_stream_bytes);
    return 0;
}

int krun_ranks_cost(const krun_model *model, k3_model *m, const krun_model_opts *o, const krun_layout *lay, int hypothetical,
                    double disk_mbps, double net_mbps, krun_cluster_plan *out, krun_err *err)
{
    const k3_config *c = &m->cfg;
    const int NL = c->n_layers;
    const size_t T = o->max_seqs, E = (size_t)c->hidden, Lt = (size_t)c->latent;
    const double D = (disk_mbps > 0 ? disk_mbps : 1) * 1e6;
    kcl_moe *moe = NULL;
    memset(out, 0, sizeof *out);
    out->nranks = lay->nranks;
    out->hypothetical = hypothetical;
    out->seqs = T;
    out->disk_mbps = disk_mbps;
    out->net_mbps = net_mbps;
    for (int r = 0; r < lay->nranks; r++) {
        krun_rank_plan *rp = &out->rank[r];
        if (hypothetical) snprintf(rp->who, sizeof rp->who, "rank %d (a machine like this one)", r);
        else snprintf(rp->who, sizeof rp->who, "%s", kcl_who(r));
        rp->drives = trunk_drives(m->file, m, lay, r);
        if (rank_plan(model, m, o, lay, r, rp, err)) return -1;
        out->trunk_bytes += rp->trunk_bytes;
        out->s_trunk += rp->trunk_bytes / ((double)rp->drives * D);
    }
    k3_model_set_away(m, NULL, 0, err);
    /* the hidden state's moves: P and the snapshots of every position, at each change of rank */
    for (int L = 0; L <= NL; L++) {
        const int prev = L == 0 ? 0 : lay->owner[L - 1], cur = L == NL ? 0 : lay->owner[L];
        double b;
        if (prev == cur) continue;
        b = (double)T * (double)(1 + snaps_before(c, L)) * (double)E * 4 + 32;
        out->hops++;
        out->rank[prev].sent += b;
        out->rank[cur].received += b;
        out->net_bytes += b;
    }
    /* each MoE layer's experts: given to the ranks that can read them, read at the pace of the slowest disk */
    if (kcl_moe_new(m, NULL, lay->have, lay->nranks, &moe, err)) return -1;
    for (int L = 0; L < NL; L++) {
        kcl_moe_cost k;
        const int req = lay->owner[L];
        double rows, outs;
        if (!k3_layer_is_moe(c, L)) continue;
        kcl_moe_expect(moe, req, L, T, D, SAMPLES, &k);
        out->s_experts += k.seconds;
        for (int r = 0; r < lay->nranks; r++) {
            out->rank[r].expert_bytes += k.bytes[r];
            out->expert_bytes += k.bytes[r];
        }
        /* requests and rows out, each expert's output rows back (with their headers) */
        rows = k.remote_ranks * (16.0 + 4 * 2) + k.remote_experts * 4 + k.remote_rows * (double)Lt * 4 +
               k.remote_experts * k.rows_per_expert * 4 + k.remote_ranks * 16;
        outs = k.remote_experts * (32 + k.rows_per_expert * (double)Lt * 4) + k.remote_ranks * 16;
        out->rank[req].sent += rows;
        out->rank[req].received += outs;
        if (lay->nranks > 1) {
            /* the servers' side, spread as their reads are */
            double all = 0;
            for (int r = 0; r < lay->nranks; r++) all += r == req ? 0 : k.bytes[r];
            for (int r = 0; r < lay->nranks && all > 0; r++)
                if (r != req) {
                    out->rank[r].received += rows * k.bytes[r] / all;
                    out->rank[r].sent += outs * k.bytes[r] / all;
                }
        }
        out->net_bytes += rows + outs;
    }
    kcl_moe_free(moe);
    out->s_net = net_mbps > 0 ? out->net_bytes / (net_mbps * 1e6 / 8) : 0;
    out->s_sweep = out->s_trunk + out->s_experts + out->s_net;
    out->s_token = T ? out->s_sweep / (double)T : 0;
    out->tokens_per_hour = out->s_sweep > 0 ? 3600.0 * (double)T / out->s_sweep : 0;
    return 0;
}

static const char *size_str(double b, char *buf, size_t n)
{
    kfmt_bytes((uint64_t)(b + 0.5), buf, (int)n);
    return buf;
}

void krun_cluster_plan_print(const krun_cluster_plan *p, FILE *out)
{
    char a[32], b[32], d[32], e[32], g[32];
    fprintf(out, "cluster plan: %d rank%s%s, %zu sequence%s per decoding sweep\n", p->nranks, p->nranks == 1 ? "" : "s",
            p->hypothetical ? " (machines like this one: its budget and its disks each)" : "", p->seqs, p->seqs == 1 ? "" : "s");
    for (int r = 0; r < p->nranks; r++) {
        const krun_rank_plan *x = &p->rank[r];
        char layers[64];
        if (x->layers) snprintf(layers, sizeof layers, "layers %d..%d (%d, %d pinned)", x->first, x->last, x->layers, x->pinned);
        else snprintf(layers, sizeof layers, "no trunk layer");
        fprintf(out, "  %s: budget %s, %s%s, %d expert slots; per sweep reads %s trunk + %s experts, sends %s, receives %s\n", x->who,
                x->budget ? size_str((double)x->budget, a, sizeof a) : "none (in place)", layers, r == 0 ? ", embedding and lm_head" : "",
                x->expert_slots, size_str(x->trunk_bytes, b, sizeof b), size_str(x->expert_bytes, d, sizeof d), size_str(x->sent, e, sizeof e),
                size_str(x->received, g, sizeof g));
    }
    fprintf(out, "per sweep: trunk %s, experts %s, network %s (%d hops of the hidden state)\n", size_str(p->trunk_bytes, a, sizeof a),
            size_str(p->expert_bytes, b, sizeof b), size_str(p->net_bytes, d, sizeof d), p->hops);
    if (p->disk_mbps > 0) {
        fprintf(out, "at %.0f MB/s per drive%s: trunk %.2f s + experts %.2f s (each MoE layer at its slowest disk)", p->disk_mbps,
                p->net_mbps > 0 ? " and the network's speed" : "", p->s_trunk, p->s_experts);
        if (p->net_mbps > 0) fprintf(out, " + network %.2f s at %.0f Mbit/s", p->s_net, p->net_mbps);
        fprintf(out, " = %.2f s per sweep: %.2f s per token, %.0f tokens/hour (reading and sending only)\n", p->s_sweep, p->s_token,
                p->tokens_per_hour);
    }
}

json_t *krun_cluster_plan_json(const krun_cluster_plan *p)
{
    json_t *j = json_object(), *a = json_array();
    for (int r = 0; r < p->nranks; r++) {
        const krun_rank_plan *x = &p->rank[r];
        json_array_append_new(a, json_pack("{s:i, s:s, s:I, s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:f, s:f, s:f, s:f}", "rank", r, "who", x->who,
                                           "budget", (json_int_t)x->budget, "layers", x->layers, "first", x->first, "last", x->last,
                                           "pinned", x->pinned, "expert_slots", x->expert_slots, "drives", x->drives, "total",
                                           (json_int_t)x->total, "trunk_bytes", x->trunk_bytes, "expert_bytes", x->expert_bytes, "sent",
                                           x->sent, "received", x->received));
    }
    json_object_set_new(j, "ranks", json_integer(p->nranks));
    json_object_set_new(j, "hypothetical", json_boolean(p->hypothetical));
    json_object_set_new(j, "seqs", json_integer((json_int_t)p->seqs));
    json_object_set_new(j, "disk_mbps", json_real(p->disk_mbps));
    json_object_set_new(j, "net_mbps", json_real(p->net_mbps));
    json_object_set_new(j, "hops", json_integer(p->hops));
    json_object_set_new(j, "per_rank", a);
    json_object_set_new(j, "trunk_bytes", json_real(p->trunk_bytes));
    json_object_set_new(j, "expert_bytes", json_real(p->expert_bytes));
    json_object_set_new(j, "net_bytes", json_real(p->net_bytes));
    json_object_set_new(j, "seconds_trunk", json_real(p->s_trunk));
    json_object_set_new(j, "seconds_experts", json_real(p->s_experts));
    json_object_set_new(j, "seconds_net", json_real(p->s_net));
    json_object_set_new(j, "seconds_sweep", json_real(p->s_sweep));
    json_object_set_new(j, "seconds_per_token", json_real(p->s_token));
    json_object_set_new(j, "tokens_per_hour", json_real(p->tokens_per_hour));
    return j;
}
