/* A request's framing (run/serve_framing.c): every combination of Content-Length and
 * Transfer-Encoding fields RFC 9112 §6.1 and §6.3 name, with the verdict each must get, and the
 * header rules around them (field names, control characters, Host: RFC 9112 §3.2, §5.1).  The
 * same requests are sent over raw sockets to a running server by
 * tests/cli/test_krun_serve_hostile.sh.  Every case but those about Host gets "Host: x" first. */
#include "check.h"
#include "run/serve/serve.h"

#include <string.h>

typedef struct {
    const char *what;
    const char *fields[8];     /* key, value, key, value, ..., NULL */
    int http_1_0;
    int status;                /* the verdict */
    int own_host;              /* the case sets Host itself (none is added) */
} framing_case;

static const framing_case cases[] = {
    {"no body fields", {NULL}, 0, 0, 0},
    {"one Content-Length", {"Content-Length", "30", NULL}, 0, 0, 0},
    {"Content-Length 0", {"Content-Length", "0", NULL}, 0, 0, 0},
    {"two equal Content-Length fields (RFC 9110 8.6 lets a recipient take them as one)", {"Content-Length", "30", "content-length", "30", NULL}, 0, 0, 0},
    {"two Content-Length fields that differ", {"Content-Length", "30", "Content-Length", "5", NULL}, 0, 400, 0},
    {"two Content-Length fields that differ, the smaller first", {"Content-Length", "0", "Content-Length", "30", NULL}, 0, 400, 0},
    {"Content-Length fields that differ in case and value", {"content-length", "30", "CONTENT-LENGTH", "7", NULL}, 0, 400, 0},
    {"a list of values", {"Content-Length", "30, 30", NULL}, 0, 400, 0},
    {"a sign", {"Content-Length", "+30", NULL}, 0, 400, 0},
    {"a negative length", {"Content-Length", "-1", NULL}, 0, 400, 0},
    {"trailing junk", {"Content-Length", "30x", NULL}, 0, 400, 0},
    {"empty", {"Content-Length", "", NULL}, 0, 400, 0},
    {"beyond 2^64", {"Content-Length", "18446744073709551616", NULL}, 0, 400, 0},
    {"2^64 - 1", {"Content-Length", "18446744073709551615", NULL}, 0, 0, 0},
    {"a valid one then an invalid one", {"Content-Length", "30", "Content-Length", "abc", NULL}, 0, 400, 0},
    {"chunked", {"Transfer-Encoding", "chunked", NULL}, 0, 0, 0},
    {"Chunked in capitals", {"Transfer-Encoding", "CHUNKED", NULL}, 0, 0, 0},
    /* issue 34.7: "chunked," is chunked to the RFC, but libmicrohttpd then reads the body to the
     * connection's end (its test is the whole value against "chunked"): refused */
    {"chunked with empty list elements", {"Transfer-Encoding", " , chunked ,", NULL}, 0, 400, 0},
    {"chunked, (a trailing comma)", {"Transfer-Encoding", "chunked,", NULL}, 0, 400, 0},
    {"chunked and a trailing space", {"Transfer-Encoding", "chunked ", NULL}, 0, 400, 0},
    {"chunked and Content-Length", {"Transfer-Encoding", "chunked", "Content-Length", "5", NULL}, 0, 400, 0},
    {"Content-Length and chunked", {"Content-Length", "5", "Transfer-Encoding", "chunked", NULL}, 0, 400, 0},
    {"chunked twice, one field", {"Transfer-Encoding", "chunked, chunked", NULL}, 0, 400, 0},
    {"chunked twice, two fields", {"Transfer-Encoding", "chunked", "Transfer-Encoding", "chunked", NULL}, 0, 400, 0},
    {"chunked not last", {"Transfer-Encoding", "chunked, identity", NULL}, 0, 400, 0},
    {"chunked not last, across fields", {"Transfer-Encoding", "chunked", "Transfer-Encoding", "gzip", NULL}, 0, 400, 0},
    {"identity alone", {"Transfer-Encoding", "identity", NULL}, 0, 400, 0},
    {"an empty Transfer-Encoding", {"Transfer-Encoding", "", NULL}, 0, 400, 0},
    {"a coding before chunked (not implemented)", {"Transfer-Encoding", "gzip, chunked", NULL}, 0, 501, 0},
    {"a coding before chunked, across fields", {"Transfer-Encoding", "gzip", "Transfer-Encoding", "chunked", NULL}, 0, 501, 0},
    {"chunked in HTTP/1.0", {"Transfer-Encoding", "chunked", NULL}, 1, 400, 0},
    {"Content-Length in HTTP/1.0", {"Content-Length", "30", NULL}, 1, 0, 0},
    {"other fields are not framing", {"Content-Type", "application/json", "X-Content-Length", "9", "Content-Length", "30", NULL}, 0, 0, 0},
    /* issue 34.6: a space before the colon makes another name, which MHD ignores for framing */
    {"Transfer-Encoding with a space before the colon, and Content-Length", {"Transfer-Encoding ", "chunked", "Content-Length", "30", NULL}, 0, 400, 0},
    {"a tab before the colon", {"Content-Length\t", "30", NULL}, 0, 400, 0},
    {"a name with a slash", {"X/Y", "1", NULL}, 0, 400, 0},
    {"an empty name", {"", "1", NULL}, 0, 400, 0},
    {"a value with a bare CR", {"X-A", "1\r2", NULL}, 0, 400, 0},
    {"a value with a DEL", {"X-A", "1\x7f", NULL}, 0, 400, 0},
    {"a value with a tab and obs-text", {"X-A", "1\t\xe9", NULL}, 0, 0, 0},
    /* issue 34.9: HTTP/1.1 requires one Host */
    {"HTTP/1.1 without Host", {"Content-Length", "30", NULL}, 0, 400, 1},
    {"HTTP/1.1 with two Host fields", {"Host", "a", "Host", "a", NULL}, 0, 400, 1},
    {"HTTP/1.1 with an empty Host (allowed)", {"Host", "", NULL}, 0, 0, 1},
    {"HTTP/1.1 with a host and port", {"Host", "127.0.0.1:8080", NULL}, 0, 0, 1},
    {"HTTP/1.1 with an IPv6 literal", {"Host", "[::1]:8080", NULL}, 0, 0, 1},
    {"a Host with a space", {"Host", "a b", NULL}, 0, 400, 1},
    {"a Host with a slash", {"Host", "a/b", NULL}, 0, 400, 1},
    {"HTTP/1.0 without Host (allowed)", {"Content-Length", "30", NULL}, 1, 0, 1},
    {"HTTP/1.0 with two Host fields", {"Host", "a", "Host", "b", NULL}, 1, 400, 1},
};

int main(void)
{
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const framing_case *c = &cases[i];
        srv_framing f;
        char msg[200] = "";
        srv_framing_init(&f);
        if (!c->own_host) srv_framing_header(&f, "Host", "x", 1);
        for (int k = 0; c->fields[k]; k += 2) srv_framing_header(&f, c->fields[k], c->fields[k + 1], strlen(c->fields[k + 1]));
        int v = srv_framing_verdict(&f, c->http_1_0, msg, sizeof msg);
        int ok = v == c->status && (v == 0) == (msg[0] == 0);
        if (!ok) {
            printf("# %s: verdict %d (%s), expected %d\n", c->what, v, msg, c->status);
            bad++;
        }
    }
    CHECK(!bad, "framing: %zu field combinations (RFC 9112 3.2, 5.1, 6.1, 6.3): conflicting or uncertain lengths, names that "
          "are not tokens, control characters, a missing or doubled Host refused with 400, codings other than chunked 501, "
          "the rest accepted (%d wrong)", sizeof cases / sizeof *cases, bad);
    {
        /* a NUL inside a value (MHD hands the value's length): refused */
        srv_framing f;
        char msg[200] = "";
        srv_framing_init(&f);
        srv_framing_header(&f, "Host", "x", 1);
        srv_framing_header(&f, "Transfer-Encoding", "chunked\0x", 9);
        CHECK(srv_framing_verdict(&f, 0, msg, sizeof msg) == 400, "framing: a NUL inside a field value is refused (%s)", msg);
    }
    {
        /* the request line (fuzz_http): libmicrohttpd takes a target with spaces (up to the last one)
         * or bytes past 0x7e, and a method with control characters; RFC 9112 3 does not */
        static const struct { const char *method, *target; int status; } lines[] = {
            {"GET", "/health?x=1", 0}, {"POST", "/v1/completions", 0}, {"M-SEARCH", "/a%20b", 0},
            {"GET", "/health?x/v1/models /tokenize", 400}, {"GET", "/health?\xe2=1", 400}, {"GET", "/\x7f", 400},
            {"GET\x01", "/health", 400}, {"GE T", "/", 400}, {"", "/", 400},
            {"OPTIONS", "*", 0}, {"GET", "http://x/health", 0}, {"POST", "prompt\":[1,2]/v1/completions", 400}, {"GET", "", 400}};
        int wrong = 0;
        for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) {
            srv_framing f;
            char msg[200] = "";
            srv_framing_init(&f);
            srv_framing_request_line(&f, lines[i].method, srv_framing_target_ok(lines[i].target));
            srv_framing_header(&f, "Host", "x", 1);
            if (srv_framing_verdict(&f, 0, msg, sizeof msg) != lines[i].status) {
                printf("# request line %s %s: %s\n", lines[i].method, lines[i].target, msg);
                wrong++;
            }
        }
        CHECK(!wrong, "framing: %zu request lines: a method that is not a token, a target in none of RFC 9112's forms or "
              "with a space, a control character or a byte past 0x7e refused 400, the rest accepted (%d wrong)", sizeof lines / sizeof *lines, wrong);
    }
    return check_exit();
}
