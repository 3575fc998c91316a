/* A request's framing: can its body's length be known for sure?  (serve.h)
 *
 * libmicrohttpd reads the body by the first Content-Length header it sees, or
 * decodes chunked when Transfer-Encoding names it anywhere, and lets the rest
 * pass.  A proxy in front may have framed the same bytes another way (the
 * last Content-Length, or Content-Length over chunked): the request it sent
 * and the one krun reads differ, and the difference is a second request
 * smuggled in.  RFC 9112 §6.1 and §6.3 say what to refuse; this is that list. */
#include "serve.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

void srv_framing_init(srv_framing *f) { memset(f, 0, sizeof *f); }

/* The value of a Content-Length field: 1*DIGIT, nothing else (RFC 9110 §8.6).  A list of values
 * ("5, 5") or anything else is invalid. */
static int content_length(const char *v, unsigned long long *out)
{
    unsigned long long n = 0;
    if (!isdigit((unsigned char)*v)) return -1;
    for (; isdigit((unsigned char)*v); v++) {
        unsigned long long d = (unsigned long long)(*v - '0');
        if (n > (~0ull - d) / 10) return -1;    /* 2^64 and beyond: no body is that long */
        n = n * 10 + d;
    }
    if (*v) return -1;
    *out = n;
    return 0;
}

/* The transfer codings of a Transfer-Encoding field, in order: "gzip, chunked".  Empty list
 * elements are allowed and ignored (RFC 9110 §5.6.1). */
static void transfer_codings(srv_framing *f, const char *v)
{
    while (*v) {
        const char *s, *e;
        while (*v == ' ' || *v == '\t' || *v == ',') v++;
        if (!*v) break;
        s = v;
        while (*v && *v != ',') v++;
        e = v;
        while (e > s && (e[-1] == ' ' || e[-1] == '\t')) e--;
        f->n_codings++;
        f->last_chunked = (size_t)(e - s) == 7 && !strncasecmp(s, "chunked", 7);
        f->n_chunked += f->last_chunked;
    }
}

void srv_framing_header(srv_framing *f, const char *key, const char *value)
{
    if (!key || !value) return;
    if (!strcasecmp(key, "Content-Length")) {
        unsigned long long n;
        if (content_length(value, &n)) f->cl_invalid = 1;
        else if (f->n_cl && n != f->cl) f->cl_differ = 1;
        else f->cl = n;
        f->n_cl++;
    } else if (!strcasecmp(key, "Transfer-Encoding")) {
        f->n_te++;
        transfer_codings(f, value);
    }
}

int srv_framing_verdict(const srv_framing *f, int http_1_0, char *msg, size_t len)
{
    if (f->n_te && http_1_0) {
        snprintf(msg, len, "an HTTP/1.0 request cannot use Transfer-Encoding (RFC 9112 6.1)");
        return 400;
    }
    if (f->n_te && f->n_cl) {
        snprintf(msg, len, "the request has both Transfer-Encoding and Content-Length: its length is ambiguous (RFC 9112 6.3)");
        return 400;
    }
    if (f->n_te && (!f->last_chunked || f->n_chunked != 1)) {
        snprintf(msg, len, "Transfer-Encoding must end with chunked, applied once: the request's length cannot be known (RFC 9112 6.3)");
        return 400;
    }
    if (f->n_te && f->n_codings > 1) {
        snprintf(msg, len, "the only transfer coding krun serve takes is chunked");
        return 501;
    }
    if (f->cl_invalid) {
        snprintf(msg, len, "Content-Length must be one decimal number (RFC 9110 8.6)");
        return 400;
    }
    if (f->cl_differ) {
        snprintf(msg, len, "the request has several Content-Length headers that disagree (RFC 9112 6.3)");
        return 400;
    }
    return 0;
}
