/* A request's framing (run/serve_framing.c): every combination of Content-Length and
 * Transfer-Encoding fields RFC 9112 §6.1 and §6.3 name, with the verdict each must get.  The same
 * requests are sent over raw sockets to a running server by tests/cli/test_krun_serve_hostile.sh. */
#include "check.h"
#include "run/serve/serve.h"

#include <string.h>

typedef struct {
    const char *what;
    const char *fields[8];     /* key, value, key, value, ..., NULL */
    int http_1_0;
    int status;                /* the verdict */
} framing_case;

static const framing_case cases[] = {
    {"no body fields", {NULL}, 0, 0},
    {"one Content-Length", {"Content-Length", "30", NULL}, 0, 0},
    {"Content-Length 0", {"Content-Length", "0", NULL}, 0, 0},
    {"two equal Content-Length fields (RFC 9110 8.6 lets a recipient take them as one)", {"Content-Length", "30", "content-length", "30", NULL}, 0, 0},
    {"two Content-Length fields that differ", {"Content-Length", "30", "Content-Length", "5", NULL}, 0, 400},
    {"two Content-Length fields that differ, the smaller first", {"Content-Length", "0", "Content-Length", "30", NULL}, 0, 400},
    {"Content-Length fields that differ in case and value", {"content-length", "30", "CONTENT-LENGTH", "7", NULL}, 0, 400},
    {"a list of values", {"Content-Length", "30, 30", NULL}, 0, 400},
    {"a sign", {"Content-Length", "+30", NULL}, 0, 400},
    {"a negative length", {"Content-Length", "-1", NULL}, 0, 400},
    {"trailing junk", {"Content-Length", "30x", NULL}, 0, 400},
    {"empty", {"Content-Length", "", NULL}, 0, 400},
    {"beyond 2^64", {"Content-Length", "18446744073709551616", NULL}, 0, 400},
    {"2^64 - 1", {"Content-Length", "18446744073709551615", NULL}, 0, 0},
    {"a valid one then an invalid one", {"Content-Length", "30", "Content-Length", "abc", NULL}, 0, 400},
    {"chunked", {"Transfer-Encoding", "chunked", NULL}, 0, 0},
    {"Chunked in capitals", {"Transfer-Encoding", "CHUNKED", NULL}, 0, 0},
    {"chunked with empty list elements", {"Transfer-Encoding", " , chunked ,", NULL}, 0, 0},
    {"chunked and Content-Length", {"Transfer-Encoding", "chunked", "Content-Length", "5", NULL}, 0, 400},
    {"Content-Length and chunked", {"Content-Length", "5", "Transfer-Encoding", "chunked", NULL}, 0, 400},
    {"chunked twice, one field", {"Transfer-Encoding", "chunked, chunked", NULL}, 0, 400},
    {"chunked twice, two fields", {"Transfer-Encoding", "chunked", "Transfer-Encoding", "chunked", NULL}, 0, 400},
    {"chunked not last", {"Transfer-Encoding", "chunked, identity", NULL}, 0, 400},
    {"chunked not last, across fields", {"Transfer-Encoding", "chunked", "Transfer-Encoding", "gzip", NULL}, 0, 400},
    {"identity alone", {"Transfer-Encoding", "identity", NULL}, 0, 400},
    {"an empty Transfer-Encoding", {"Transfer-Encoding", "", NULL}, 0, 400},
    {"a coding before chunked (not implemented)", {"Transfer-Encoding", "gzip, chunked", NULL}, 0, 501},
    {"a coding before chunked, across fields", {"Transfer-Encoding", "gzip", "Transfer-Encoding", "chunked", NULL}, 0, 501},
    {"chunked in HTTP/1.0", {"Transfer-Encoding", "chunked", NULL}, 1, 400},
    {"Content-Length in HTTP/1.0", {"Content-Length", "30", NULL}, 1, 0},
    {"other fields are not framing", {"Content-Type", "application/json", "X-Content-Length", "9", "Content-Length", "30", NULL}, 0, 0},
};

int main(void)
{
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const framing_case *c = &cases[i];
        srv_framing f;
        char msg[200] = "";
        srv_framing_init(&f);
        for (int k = 0; c->fields[k]; k += 2) srv_framing_header(&f, c->fields[k], c->fields[k + 1]);
        int v = srv_framing_verdict(&f, c->http_1_0, msg, sizeof msg);
        int ok = v == c->status && (v == 0) == (msg[0] == 0);
        if (!ok) {
            printf("# %s: verdict %d (%s), expected %d\n", c->what, v, msg, c->status);
            bad++;
        }
    }
    CHECK(!bad, "framing: %zu field combinations (RFC 9112 6.1, 6.3): conflicting or uncertain lengths refused with 400, "
          "codings other than chunked 501, the rest accepted (%d wrong)", sizeof cases / sizeof *cases, bad);
    return check_exit();
}
