/* `krun serve`: the options, the model, the listening socket, and a clean
 * shutdown on SIGINT / SIGTERM.  The server itself is serve_http.c (HTTP) and
 * serve_engine.c (the batching engine); docs/SERVE.md describes it. */
#include "cmd_serve.h"

#include "krun_cli.h"
#include "format/kargs.h"
#include "format/kpk.h"
#include "format/kprogress.h"
#include "run/serve/serve.h"
#include "run/session/memplan.h"
#include "run/util/sd_notify.h"

#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SERVE_CTX_DEFAULT 4096
#define SERVE_SEQS_DEFAULT 4
#define SERVE_QUEUE_DEFAULT 16
/* Speculation is on by default: without evidence nothing is drafted (the same sweeps, the same
 * bytes); it costs its journal in the plan (--spec 8: 9 positions) and, where drafts are made,
 * their positions' arithmetic in the shared sweep (docs/SERVE.md, docs/PERFORMANCE.md). */
#define SERVE_SPEC_DEFAULT 8
/* Connections one address may open beyond the sequences and the queue it can fill: /health,
 * /v1/models, idle keep-alive ones.  The limit in all is this many addresses' worth. */
#define SERVE_CONN_SLACK 32
#define SERVE_CONN_ADDRESSES 4
#define SERVE_IDLE_DEFAULT 60
#define SERVE_REQUEST_TIMEOUT_DEFAULT 30
/* A streamed request silent this long gets a progress comment (": prefill 1234/5000"):
 * well inside the 30-60 s idle timeouts of common proxies and clients. */
#define SERVE_PROGRESS_DEFAULT 10
/* Responses kept for previous_response_id (POST /v1/responses with store). */
#define SERVE_RESPONSES_DEFAULT 256
/* After cancelling, how long connections may take to send what is left. */
#define SERVE_FLUSH_SECONDS 10
/* Open files besides one socket per connection: the model's member files (two descriptors each,
 * buffered and O_DIRECT), the listening socket, the prefix cache's files, stdio. */
#define SERVE_FD_RESERVE (64 + 2 * KPK_MAX_MEMBERS)

static const char usage[] =
    "usage: krun serve MODEL.kpk [options]\n"
    "\n"
    "An OpenAI-compatible HTTP server: POST /v1/chat/completions, POST /v1/completions,\n"
    "GET /v1/models, GET /health; GET / is a page for chatting and for watching the drives,\n"
    "prompts and tokens (--no-ui: none).  Requests that arrive while others run join the next\n"
    "forward sweep: the model's weights are read once for all of them, and each request's\n"
    "output is bit-identical to running it alone (docs/SERVE.md).\n"
    "\n"
    "Server:\n"
    "  --host ADDR           address to listen on (default 127.0.0.1; 0.0.0.0 or :: for all)\n"
    "  --port N              port (default 8080; 0: a free port, printed at startup)\n"
    "  --api-key KEY         require \"Authorization: Bearer KEY\" on /v1/ (or set KRUN_API_KEY)\n"
    "  --model-name NAME     the model's id in the API (default: the file name without .kpk)\n"
    "  --max-seqs N          sequences run at once, in one forward block (default 4; the plan\n"
    "                        budgets their state and says how many would fit)\n"
    "  --max-queue N         requests waiting for a sequence (default 16); more get 503 + Retry-After\n"
    "  --max-body SIZE       largest request body (default 8M)\n"
    "  --request-memory SIZE memory for requests being read and prepared, in all: each reserves 32 x\n"
    "                        its body + 1M before its body is read, and waits for room (default 1G,\n"
    "                        or one --max-body request's share if larger; docs/SERVE.md, \"Memory\")\n"
    "  --max-connections N   open connections at most (default 4 x the per-address limit); the last\n"
    "                        eighth (at least 2) is kept free: past that, the connection that has\n"
    "                        waited longest for its request (half a second at least) is closed\n"
    "  --max-connections-per-ip N\n"
    "                        open connections from one client address at most, with the same\n"
    "                        reserve (default max-seqs + max-queue + 32; 0: no limit, e.g. behind a\n"
    "                        proxy, where every client has the proxy's address)\n"
    "  --request-timeout S   a request (headers and body) must arrive within S seconds of its first\n"
    "                        byte, or its connection is closed (default 30)\n"
    "  --idle-timeout S      close a connection idle for S seconds between requests (default 60;\n"
    "                        a request never times out while it runs)\n"
    "  --progress-every S    a streamed request that has sent nothing for S seconds gets an SSE\n"
    "                        comment saying where it is (\": prefill 1234/5000\", \": queued\"); one whose\n"
    "                        prompt is still being read then starts its stream (200) early (default\n"
    "                        10; 0: never)\n"
    "  --shutdown-timeout S  on SIGINT / SIGTERM, seconds running requests may take to finish\n"
    "                        before they are cancelled (default 30; a second signal cancels at once)\n"
    "  --quiet               no plan and no line per request on stderr\n"
    "  --cors-origin ORIGIN  answer browsers from ORIGIN (repeatable, or *): CORS headers and\n"
    "                        preflights (default: none, the browser's same-origin rule holds)\n"
    "  --responses-store N   responses kept for previous_response_id and GET /v1/responses/ID\n"
    "                        (default 256, least recently used out; 0: none)\n"
    "  --no-ui               no page at GET / (404): the API only\n"
    "Sequences:\n"
    "  --ctx N               positions per sequence: prompt + max_tokens (default 4096)\n"
    "  --ctx-strict          refuse (400) a request whose prompt + max_tokens exceeds --ctx (default:\n"
    "                        serve it up to the context, finish_reason \"length\")\n"
    "  --reasoning-effort E  how much a request that does not say thinks: none (no thinking), low,\n"
    "                        high or max (default: K3's chat templates', thinking at max; Anthropic's\n"
    "                        API: no thinking unless asked)\n"
    "  --spec N              speculative decoding: a sequence may verify up to N drafts from its own\n"
    "                        text or another live sequence's in a sweep; the sweep's verifications\n"
    "                        share N + 1 positions (default 8; 0: off; a request's \"speculative\"\n"
    "                        lowers it).  The output is bit-identical with and without\n"
    "  sampling comes from each request (temperature, top_p, seed, and top_k, min_p)\n"
    "Prefix cache (on by default: a request starts from the longest kept state whose history\n"
    "is a prefix of its prompt -- the end of an earlier prompt, reply or system/tools part --\n"
    "kept in idle sequences; usage.prompt_tokens_details.cached_tokens says how many):\n"
    KRUN_CLI_USAGE_CACHE(" (every request runs its whole prompt)")
    "Execution:\n"
    KRUN_CLI_USAGE_EXECUTION
    KRUN_CLI_USAGE_MEMORY
    "\n"
    "Exit: 0 stopped by SIGINT or SIGTERM; 1 the model file is damaged (found while serving:\n"
    "the server answered 500/503 naming the extent from then on); 2 cannot run: usage, not a KPK\n"
    "file, no tokenizer in it, the address cannot be listened on; 3 out of memory.\n";

struct serve_opts {
    const char *model, *host, *api_key, *model_name, *max_body, *request_memory;
    long port, max_queue, max_connections, max_per_ip, idle_timeout;
    double shutdown_timeout, request_timeout, progress_every;
    int quiet, no_ui;
    int ctx_strict;
    int effort, effort_set;
    const char *cors[16];
    int n_cors;
    long responses_store;
    long spec;
    krun_cli c;
};

/* krun's sampling options, "--temp" or "--temp=0.7": a request brings its own. */
static int sampling_option(const char *a)
{
    static const char *const names[] = {"--temp", "--top-k", "--top-p", "--min-p", "--seed", "--repetition-penalty",
                                        "--presence-penalty", "--frequency-penalty"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        size_t n = strlen(names[k]);
        if (!strncmp(a, names[k], n) && (a[n] == 0 || a[n] == '=')) return 1;
    }
    return 0;
}

static void parse_args(int argc, char **argv, struct serve_opts *o)
{
    memset(o, 0, sizeof *o);
    krun_cli_init(&o->c);
    o->c.max_seqs = SERVE_SEQS_DEFAULT;
    o->host = "127.0.0.1";
    o->port = 8080;
    o->max_queue = SERVE_QUEUE_DEFAULT;
    o->max_body = "8M";
    o->shutdown_timeout = 30;
    o->idle_timeout = SERVE_IDLE_DEFAULT;
    o->request_timeout = SERVE_REQUEST_TIMEOUT_DEFAULT;
    o->progress_every = SERVE_PROGRESS_DEFAULT;
    o->max_per_ip = -1;
    o->spec = SERVE_SPEC_DEFAULT;
    o->responses_store = SERVE_RESPONSES_DEFAULT;
    o->api_key = getenv("KRUN_API_KEY");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
#define OPT(name) krun_cli_value(argc, argv, &i, name, &v)
        if (sampling_option(a))
            krun_cli_die("%s: krun serve takes sampling from each request (temperature, top_p, top_k, min_p, seed)", a);
        if (krun_cli_option(&o->c, argc, argv, &i)) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(usage, stdout); exit(KRUN_OK); }
        else if (OPT("--host")) o->host = v;
        else if (OPT("--port")) o->port = krun_cli_long(v, 0, 65535, "--port");
        else if (OPT("--api-key")) o->api_key = v;
        else if (OPT("--model-name")) o->model_name = v;
        else if (OPT("--max-queue")) o->max_queue = krun_cli_long(v, 0, 1L << 20, "--max-queue");
        else if (OPT("--max-body")) o->max_body = v;
        else if (OPT("--request-memory")) o->request_memory = v;
        else if (OPT("--max-connections"))
            o->max_connections = krun_cli_long(v, 1, 1L << 16, "--max-connections");
        else if (OPT("--max-connections-per-ip"))
            o->max_per_ip = krun_cli_long(v, 0, 1L << 16, "--max-connections-per-ip");
        else if (OPT("--request-timeout"))
            o->request_timeout = krun_cli_double(v, 0.1, 1e6, "--request-timeout");
        else if (OPT("--progress-every"))
            o->progress_every = krun_cli_double(v, 0, 1e6, "--progress-every");
        else if (OPT("--shutdown-timeout"))
            o->shutdown_timeout = krun_cli_double(v, 0, 1e9, "--shutdown-timeout");
        else if (OPT("--idle-timeout"))
            o->idle_timeout = krun_cli_long(v, 1, 1L << 20, "--idle-timeout");
        else if (OPT("--spec")) o->spec = krun_cli_long(v, 0, 64, "--spec (0..64)");
        else if (!strcmp(a, "--quiet")) o->quiet = 1;
        else if (!strcmp(a, "--ctx-strict")) o->ctx_strict = 1;
        else if (OPT("--reasoning-effort")) {
            kchat_effort ef = !strcmp(v, "none") ? KCHAT_EFFORT_NONE : kchat_effort_parse(v);
            if (ef == KCHAT_EFFORT_INVALID) krun_cli_die("--reasoning-effort %s: give none, low, high or max", v);
            o->effort = (int)ef;
            o->effort_set = 1;
        }
        else if (OPT("--cors-origin")) {
            if (o->n_cors == (int)(sizeof o->cors / sizeof *o->cors)) krun_cli_die("%s", "--cors-origin: at most 16 origins");
            if (!*v) krun_cli_die("%s", "--cors-origin: the origin is empty (give https://host[:port], or *)");
            o->cors[o->n_cors++] = v;
        } else if (OPT("--responses-store")) o->responses_store = krun_cli_long(v, 0, 1L << 20, "--responses-store");
        else if (!strcmp(a, "--no-ui")) o->no_ui = 1;
        else if (a[0] == '-') krun_cli_die("unknown option %s (see krun serve --help)", a);
        else if (!o->model) o->model = a;
        else krun_cli_die("unexpected argument %s", a);
#undef OPT
    }
    if (!o->model) { fputs(usage, stderr); exit(KRUN_EINPUT); }
    krun_cli_check(&o->c, NULL);
    if (o->api_key && !*o->api_key) krun_cli_die("%s", "--api-key: the key is empty");
    if (!o->c.ctx) o->c.ctx = SERVE_CTX_DEFAULT;
    if (o->max_per_ip < 0) o->max_per_ip = o->c.max_seqs + o->max_queue + SERVE_CONN_SLACK;
    if (!o->max_connections) o->max_connections = SERVE_CONN_ADDRESSES * (o->c.max_seqs + o->max_queue + SERVE_CONN_SLACK);
}

/* --max-connections needs that many sockets open at once: the soft limit on open files is raised to
 * it (up to the hard limit: no privilege needed), and a hard limit below it is refused before the
 * model is loaded, rather than connections failing one by one later. */
static int raise_fd_limit(long max_connections)
{
    struct rlimit rl;
    const rlim_t need = (rlim_t)max_connections + SERVE_FD_RESERVE;
    if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need) return 0;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need) {
        fprintf(stderr, "krun serve: --max-connections %ld needs %llu open files (%d for the model's files, the cache "
                "and the listening socket), but the limit is %llu at most (the hard limit): raise it (ulimit -n in a shell, LimitNOFILE= in a "
                "systemd unit) or lower --max-connections\n", max_connections, (unsigned long long)need, SERVE_FD_RESERVE,
                (unsigned long long)rl.rlim_max);
        return -1;
    }
    rl.rlim_cur = need;
    if (setrlimit(RLIMIT_NOFILE, &rl)) {
        fprintf(stderr, "krun serve: cannot raise the open-file limit to %llu for --max-connections %ld: %s\n",
                (unsigned long long)need, max_connections, strerror(errno));
        return -1;
    }
    return 0;
}

/* Tells systemd (Type=notify) what the server is doing; outside systemd, nothing. */
__attribute__((format(printf, 1, 2))) static void notify(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (krun_sd_notify(msg) < 0)
        fprintf(stderr, "krun serve: cannot notify systemd through NOTIFY_SOCKET=%s: %s\n", getenv("NOTIFY_SOCKET"), strerror(errno));
}

/* A bound, listening TCP socket; *port is the one it got. */
static int listen_on(const char *host, long want, long *port)
{
    struct addrinfo hints, *res = NULL;
    struct sockaddr_storage sa;
    socklen_t salen = sizeof sa;
    char ps[16];
    int fd = -1, one = 1, rc;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    snprintf(ps, sizeof ps, "%ld", want);
    if ((rc = getaddrinfo(host, ps, &hints, &res))) {
        fprintf(stderr, "krun serve: --host %s: %s\n", host, gai_strerror(rc));
        return -1;
    }
    fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) || bind(fd, res->ai_addr, res->ai_addrlen) ||
        listen(fd, 128) || getsockname(fd, (struct sockaddr *)&sa, &salen)) {
        fprintf(stderr, "krun serve: cannot listen on %s port %ld: %s%s\n", host, want, strerror(errno),
                errno == EADDRINUSE ? " (pick another --port, or --port 0 for any free one)" : "");
        if (fd >= 0) close(fd);
        freeaddrinfo(res);
        return -1;
    }
    freeaddrinfo(res);
    *port = sa.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&sa)->sin6_port) : ntohs(((struct sockaddr_in *)&sa)->sin_port);
    return fd;
}

/* Say what the model was prepared for: sequences, their state, what would fit. */
static void announce(const struct serve_opts *o, krun_model *m, const char *name, long port)
{
    const kmemplan *p = krun_model_plan(m);
    char b1[32];
    kfmt_bytes(krun_session_bytes(krun_model_config(m), krun_model_ctx(m)), b1, sizeof b1);
    if (p) {
        kmemplan_print(p, stderr);
        fprintf(stderr, "krun serve: %zu sequences of %zu positions (%s of state each; this budget would fit %llu), "
                "%zu positions per sweep", krun_model_max_seqs(m), krun_model_ctx(m), b1, (unsigned long long)p->sessions_fit,
                krun_model_block(m));
        if (krun_model_block_max(m) > krun_model_block(m))
            fprintf(stderr, " (%zu when prompts are waiting and the cost model says so)", krun_model_block_max(m));
        fputc('\n', stderr);
    } else {
        fprintf(stderr, "krun serve: the model file is used in place from a mapping; %zu sequences of %zu positions (%s of "
                "state each), %zu positions per sweep\n", krun_model_max_seqs(m), krun_model_ctx(m), b1, krun_model_block(m));
    }
    fprintf(stderr, "krun serve: model \"%s\"%s; listening on http://%s%s%s:%ld\n", name, o->api_key ? " (API key required)" : "",
            strchr(o->host, ':') ? "[" : "", o->host, strchr(o->host, ':') ? "]" : "", port);
    if (!o->no_ui)
        fprintf(stderr, "krun serve: a page to chat and to watch the drives, prompts and tokens: http://%s%s%s:%ld/\n",
                strchr(o->host, ':') ? "[" : "", o->host, strchr(o->host, ':') ? "]" : "", port);
}

int krun_serve_main(int argc, char **argv)
{
    struct serve_opts o;
    krun_model *m = NULL;
    krun_model_opts mo;
    krun_err e = {0, {0}};
    srv_engine *eng = NULL;
    krun_pcache *cache = NULL;
    srv_http *http = NULL;
    srv_engine_opts eo;
    srv_http_opts ho;
    uint64_t budget;
    int64_t max_body, request_memory;
    long port = 0;
    int fd = -1, rc = KRUN_EINPUT, sig = 0, damaged;
    char name[256];
    sigset_t stop_signals;
    json_t *health;

    parse_args(argc, argv, &o);
    if (raise_fd_limit(o.max_connections)) return KRUN_EINPUT;
    max_body = kargs_size(o.max_body);
    if (max_body <= 0) krun_cli_die("--max-body: expected a size like 8M, got %s", o.max_body);
    if ((uint64_t)max_body > SIZE_MAX / 64) krun_cli_die("--max-body %s: too large", o.max_body);
    request_memory = o.request_memory ? kargs_size(o.request_memory) : (int64_t)1 << 30;
    if (request_memory <= 0) krun_cli_die("--request-memory: expected a size like 1G, got %s", o.request_memory);
    if ((uint64_t)request_memory < srv_mem_share((size_t)max_body)) {
        if (o.request_memory)
            krun_cli_die("--request-memory %s cannot hold one request of --max-body (32 x the body + 1M): raise it or lower "
                         "--max-body", o.request_memory);
        request_memory = (int64_t)srv_mem_share((size_t)max_body);
    }
    srv_mem_install();                         /* before any thread parses JSON (serve_mem.c) */
    if (krun_cli_budget(&o.c, &budget)) return KRUN_EINPUT;
    if (o.model_name) snprintf(name, sizeof name, "%s", o.model_name);
    else krun_cli_model_name(o.model, name, sizeof name);

    /* every thread started from here on inherits the blocked signals: only
     * sigwait below sees SIGINT and SIGTERM; a client that hangs up is an
     * error on its socket, not a SIGPIPE */
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (krun_model_load(o.model, &m, &e)) { fprintf(stderr, "krun serve: %s\n", e.msg); return e.code; }
    krun_cli_file_warning("krun serve", m);
    if (!krun_model_tokenizer(m)) {
        fprintf(stderr, "krun serve: %s has no tokenizer: the server needs one to read requests and write text\n", o.model);
        goto out;
    }
    fd = listen_on(o.host, o.port, &port);
    if (fd < 0) goto out;
    krun_cli_model_opts(&o.c, o.model, budget, &mo);
    mo.extra_bytes += srv_echo_bytes(krun_model_config(m));   /* echo's prompt logits (serve.h) */
    mo.spec = (size_t)o.spec;
    if (krun_model_prepare(m, &mo, &e)) { fprintf(stderr, "krun serve: %s\n", e.msg); rc = e.code; goto out; }
    if (krun_cli_pcache(&o.c, m, "krun serve", 1, 1, &cache, &e)) { fprintf(stderr, "krun serve: %s\n", e.msg); rc = e.code; goto out; }
    eo = (srv_engine_opts){(size_t)o.max_queue, name, o.quiet, o.progress_every, cache, 0, NULL, !o.ctx_strict, o.effort, o.effort_set};
    if (srv_engine_start(m, &eo, &eng, &e)) { fprintf(stderr, "krun serve: %s\n", e.msg); rc = e.code; goto out; }
    ho = (srv_http_opts){o.api_key, (size_t)max_body, (size_t)request_memory, fd, (unsigned)o.max_connections, (unsigned)o.max_per_ip, (unsigned)o.idle_timeout,
                         o.request_timeout, o.cors, (size_t)o.n_cors, (size_t)o.responses_store, o.no_ui};
    if (srv_http_start(eng, &ho, &http, &e)) { fprintf(stderr, "krun serve: %s\n", e.msg); rc = e.code; goto out; }
    fd = -1;                                   /* the daemon's now */
    if (!o.quiet) announce(&o, m, name, port);
    else fprintf(stderr, "krun serve: listening on port %ld\n", port);
    notify("READY=1\nSTATUS=serving \"%s\" on port %ld", name, port);

    /* serve until a signal; then refuse new requests and let the running ones
     * finish (a second signal, or the timeout, cancels them) */
    while (sigwait(&stop_signals, &sig) != 0) {}
    notify("STOPPING=1\nSTATUS=draining: no new requests; running ones may finish for %.0f s", o.shutdown_timeout);
    {
        struct timespec zero = {0, 0};
        double t0 = know();
        int again = 0;
        if (!o.quiet)
            fprintf(stderr, "krun serve: %s: taking no new requests; running ones may finish for %.0f s (send it again to "
                    "cancel them)\n", sig == SIGINT ? "SIGINT" : "SIGTERM", o.shutdown_timeout);
        srv_http_quiesce(http);
        srv_engine_drain(eng);
        while (!srv_engine_wait_idle(eng, 0.1, NULL)) {
            if (sigtimedwait(&stop_signals, NULL, &zero) > 0) again = 1;
            if (again || know() - t0 > o.shutdown_timeout) {
                if (!o.quiet) fprintf(stderr, "krun serve: cancelling the requests still running\n");
                srv_engine_cancel_all(eng);
                /* their error events on their way; a client that reads nothing is cut off */
                srv_engine_wait_idle(eng, SERVE_FLUSH_SECONDS, NULL);
                break;
            }
        }
    }
    srv_http_stop(http);
    http = NULL;
    health = srv_engine_health(eng, &damaged);
    json_decref(health);
    rc = damaged == 200 ? KRUN_OK : KRUN_EDATA;
    if (o.c.trace && krun_model_trace_write(m, o.c.trace)) {
        fprintf(stderr, "krun serve: cannot write %s: %s\n", o.c.trace, strerror(errno));
        rc = KRUN_EINPUT;
    }
    if (!o.quiet) fprintf(stderr, "krun serve: stopped\n");
out:
    srv_http_stop(http);
    srv_engine_stop(eng);
    krun_pcache_close(cache);                  /* its writes finished */
    if (fd >= 0) close(fd);
    krun_model_close(m);
    return rc;
}
