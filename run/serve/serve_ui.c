/* krun serve's page: GET / answers one self-contained document (run/serve/ui/: its HTML, CSS
 * and JS, made one C array by run/serve/ui/embed.sh at build time; docs/SERVE.md, "The page").
 *
 * It loads nothing from anywhere but this server, and its Content-Security-Policy says so to the
 * browser: no source for anything by default, the page's own style and script allowed by their
 * SHA-256 (computed here once from the array, so they cannot drift from what is served), requests
 * only to this origin, images only as data: URIs (its icon).  An injected <script>, an inline
 * event handler, a framing page or a form posting elsewhere is refused by the browser.
 * Cache-Control: no-cache with an ETag: a browser asks again every load and gets 304 until the
 * binary changes. */
#include "serve.h"

#include <microhttpd.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* run/serve/ui/embed.sh's output ($(BUILD)/gen/ui_page.c) */
extern const unsigned char srv_ui_page[];
extern const size_t srv_ui_page_len, srv_ui_style_at, srv_ui_style_len, srv_ui_script_at, srv_ui_script_len;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char csp[512], etag[40];
static int ready;

/* 'sha256-BASE64' of bytes [at, at + len) of the page into out. */
static int source_hash(size_t at, size_t len, char *out, size_t max)
{
    unsigned char md[EVP_MAX_MD_SIZE], b64[4 * ((EVP_MAX_MD_SIZE + 2) / 3) + 1];
    unsigned n = 0;
    if (!EVP_Digest(srv_ui_page + at, len, md, &n, EVP_sha256(), NULL)) return -1;
    EVP_EncodeBlock(b64, md, (int)n);
    return snprintf(out, max, "'sha256-%s'", (const char *)b64) < (int)max ? 0 : -1;
}

static void prepare(void)
{
    char style[80], script[80];
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned n = 0;
    if (source_hash(srv_ui_style_at, srv_ui_style_len, style, sizeof style) ||
        source_hash(srv_ui_script_at, srv_ui_script_len, script, sizeof script) ||
        !EVP_Digest(srv_ui_page, srv_ui_page_len, md, &n, EVP_sha256(), NULL) || n < 8)
        return;
    snprintf(csp, sizeof csp, "default-src 'none'; script-src %s; style-src %s; connect-src 'self'; img-src data:; "
             "base-uri 'none'; form-action 'none'; frame-ancestors 'none'", script, style);
    snprintf(etag, sizeof etag, "\"%02x%02x%02x%02x%02x%02x%02x%02x\"", md[0], md[1], md[2], md[3], md[4], md[5], md[6], md[7]);
    ready = 1;
}

struct MHD_Response *srv_ui_response(struct MHD_Connection *c, unsigned *status)
{
    const char *match = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_NONE_MATCH);
    struct MHD_Response *r;
    pthread_once(&once, prepare);
    if (!ready) return NULL;                    /* libcrypto failed: no page rather than one without its policy */
    *status = match && strstr(match, etag) ? MHD_HTTP_NOT_MODIFIED : MHD_HTTP_OK;
    r = *status == MHD_HTTP_OK ? MHD_create_response_from_buffer(srv_ui_page_len, (void *)srv_ui_page, MHD_RESPMEM_PERSISTENT)
                               : MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!r) return NULL;
    if (*status == MHD_HTTP_OK) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/html; charset=utf-8");
    MHD_add_response_header(r, MHD_HTTP_HEADER_ETAG, etag);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "Content-Security-Policy", csp);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    return r;
}
