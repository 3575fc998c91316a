/* GET /machine: what /health and /metrics do not say about the machine, for the page's machine
 * view and for scripts (docs/SERVE.md, "GET /machine"): each member file's bytes and busy time
 * (so its read rate, its utilization and the speed it delivers while krun waits on it), the
 * bytes read by kind, the expert cache's hits, the process's memory, and whether the server
 * is open to its network.  Counters only, since the start: a reader takes differences over its
 * own interval against "t", the server's monotonic clock. */
#include "serve.h"

#include "format/kprogress.h"
#include "run/util/procmem.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

int srv_listen_loopback(int fd)
{
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    if (getsockname(fd, (struct sockaddr *)&sa, &len)) return 0;
    if (sa.ss_family == AF_INET) return (ntohl(((struct sockaddr_in *)&sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa.ss_family == AF_INET6) {
        const struct in6_addr *a = &((struct sockaddr_in6 *)&sa)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a)) return a->s6_addr[12] == 127;
        return IN6_IS_ADDR_LOOPBACK(a);
    }
    return 0;
}

#define PUT(o, name, v) json_object_set_new(o, name, json_integer((json_int_t)(v)))

static json_t *members_json(krun_model *m, const krun_stats *st)
{
    json_t *a = json_array();
    for (size_t k = 0; a && k < krun_model_members(m); k++) {
        krun_member_info mi;
        json_t *o = json_object();
        if (krun_model_member(m, k, &mi)) break;
        PUT(o, "member", k);
        json_object_set_new(o, "path", json_string(mi.path));
        json_object_set_new(o, "role", json_string(mi.role));
        json_object_set_new(o, "stripe", mi.stripe < 0 ? json_null() : json_integer(mi.stripe));
        PUT(o, "size", mi.size);
        /* in place (no budget) nothing is read through the queues: the mapping's faults are the kernel's */
        PUT(o, "bytes", k < st->n_members ? st->member_bytes[k] : 0);
        PUT(o, "queued_bytes", k < st->n_members ? st->member_queued_bytes[k] : 0);
        json_object_set_new(o, "busy_seconds", json_real(k < st->n_members ? st->member_busy_seconds[k] : 0));
        json_array_append_new(a, o);
    }
    return a;
}

json_t *srv_machine_json(srv_engine *e, int api_key, int loopback)
{
    krun_model *m = srv_engine_model(e);
    const k3_config *c = krun_model_config(m);
    json_t *j = json_object(), *b = json_object(), *x = json_object();
    krun_stats st;
    krun_model_stats(m, &st);
    json_object_set_new(j, "t", json_real(know()));
    json_object_set_new(j, "api_key", json_boolean(api_key));
    json_object_set_new(j, "loopback", json_boolean(loopback));
    json_object_set_new(j, "in_place", json_boolean(krun_model_plan(m) == NULL));
    json_object_set_new(j, "members", members_json(m, &st));
    PUT(b, "total", st.bytes_read);
    PUT(b, "trunk", st.bytes_trunk);
    PUT(b, "head", st.bytes_head);
    PUT(b, "experts", st.bytes_experts);
    PUT(b, "globals", st.bytes_globals);
    PUT(b, "resident", st.bytes_resident);
    PUT(b, "predicted", st.bytes_predicted);
    json_object_set_new(j, "bytes", b);
    PUT(x, "hits", st.expert_hits);
    PUT(x, "misses", st.expert_misses);
    PUT(x, "predicted", st.experts_predicted);
    PUT(x, "predicted_used", st.experts_predicted_used);
    json_object_set_new(j, "experts", x);
    json_object_set_new(j, "io_wait_seconds", json_real(st.io_wait_seconds));
    json_object_set_new(j, "model", json_pack("{sisisisi}", "layers", c->n_layers, "n_experts", c->n_experts, "topk", c->topk,
                                              "vocab", c->vocab));
    json_object_set_new(j, "simd", json_string(krun_simd_name()));
    PUT(j, "threads", krun_model_threads(m));
    PUT(j, "rss_bytes", kmem_rss());
    PUT(j, "peak_rss_bytes", kmem_peak_rss());
    return j;
}
#undef PUT
