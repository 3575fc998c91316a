/* A request's framing: can its body's length be known for sure, and is its header sound?  (serve.h)
 *
 * libmicrohttpd reads the body by the first Content-Length header it sees,
 * decodes chunked only when the first Transfer-Encoding field is exactly
 * "chunked" and otherwise reads the body to the connection's end, and lets
 * the rest pass.  A proxy in front may have framed the same bytes another
 * way (the last Content-Length, Content-Length over chunked, a field name
 * with a space before its colon taken as Transfer-Encoding): the request it
 * sent and the one krun reads differ, and the difference is a second request
 * smuggled in.  RFC 9112 5.1, 6.1 and 6.3 say what to refuse; this is that
 * list, plus what libmicrohttpd cannot frame the way the RFC allows
 * ("chunked," or "chunked " are one coding to the RFC, not to MHD: refused). */
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

/* RFC 9110 5.6.2: tchar. */
static int tchar(unsigned char c)
{
    return isalnum(c) || (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* RFC 9110 5.5: a field value holds VCHAR, obs-text, SP and HTAB; no control character (a bare
 * CR, a NUL). */
static int field_value_ok(const char *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)v[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f) return 0;
    }
    return 1;
}

/* RFC 9112 3.2 / RFC 3986 3.2.2: Host = uri-host [ ":" port ], here its characters only (a reg-name,
 * an IP literal in brackets, a port); empty is allowed (RFC 9112 3.2). */
static int host_ok(const char *v)
{
    for (; *v; v++)
        if (!isalnum((unsigned char)*v) && !strchr("-._~%!$&'()*+,;=:[]", *v)) return 0;
    return 1;
}

static void note_bad(srv_framing *f, const char *key)
{
    if (!f->bad[0]) snprintf(f->bad, sizeof f->bad, "%s", key);
}

void srv_framing_header(srv_framing *f, const char *key, const char *value, size_t value_len)
{
    if (!key || !value) return;
    if (!*key) f->bad_name = 1;
    for (const char *k = key; *k; k++)
        if (!tchar((unsigned char)*k)) { f->bad_name = 1; note_bad(f, key); break; }
    if (strlen(value) != value_len || !field_value_ok(value, value_len)) { f->bad_value = 1; note_bad(f, key); }
    if (!strcasecmp(key, "Content-Length")) {
        unsigned long long n;
        if (content_length(value, &n)) f->cl_invalid = 1;
        else if (f->n_cl && n != f->cl) f->cl_differ = 1;
        else f->cl = n;
        f->n_cl++;
    } else if (!strcasecmp(key, "Transfer-Encoding")) {
        if (!f->n_te) f->te_exact = !strcasecmp(value, "chunked");
        f->n_te++;
        transfer_codings(f, value);
    } else if (!strcasecmp(key, "Host")) {
        f->n_host++;
        if (!host_ok(value)) f->host_invalid = 1;
    }
}

/* RFC 9112 3.2: a target is visible ASCII (RFC 3986), nothing else, in one of the four forms: origin
 * ("/..."), absolute ("http://..."), asterisk ("*"); authority (CONNECT's "host:port") is refused
 * with the rest, krun serving no tunnel. */
int srv_framing_target_ok(const char *target)
{
    if (!target || !(*target == '/' || !strcmp(target, "*") || !strncasecmp(target, "http://", 7) ||
                     !strncasecmp(target, "https://", 8)))
        return 0;
    for (const char *t = target; *t; t++)
        if ((unsigned char)*t <= 0x20 || (unsigned char)*t >= 0x7f) return 0;
    return 1;
}

void srv_framing_request_line(srv_framing *f, const char *method, int target_ok)
{
    if (!method || !*method || !target_ok) f->bad_line = 1;
    for (const char *m = method ? method : ""; *m; m++)
        if (!tchar((unsigned char)*m)) f->bad_line = 1;
}

int srv_framing_verdict(const srv_framing *f, int http_1_0, char *msg, size_t len)
{
    if (f->bad_line) {
        snprintf(msg, len, "the request line is not one: a method that is a token, SP, a target of visible ASCII characters, "
                 "SP, the version (RFC 9112 3)");
        return 400;
    }
    if (f->bad_name) {
        snprintf(msg, len, "the header field name \"%.40s\" is not a token: no whitespace may come before the colon (RFC 9112 5.1)",
                 f->bad);
        return 400;
    }
    if (f->bad_value) {
        snprintf(msg, len, "the header field %.40s holds a control character (RFC 9110 5.5)", f->bad);
        return 400;
    }
    if (!http_1_0 && f->n_host != 1) {
        snprintf(msg, len, "an HTTP/1.1 request needs exactly one Host header field, not %d (RFC 9112 3.2)", f->n_host);
        return 400;
    }
    if (f->n_host > 1 || f->host_invalid) {
        snprintf(msg, len, "%s (RFC 9112 3.2)", f->n_host > 1 ? "more than one Host header field" : "the Host header field is not a host");
        return 400;
    }
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
    if (f->n_te && (f->n_te > 1 || !f->te_exact)) {
        snprintf(msg, len, "Transfer-Encoding must be exactly \"chunked\", one field, no other list element or space: "
                 "the request's length cannot be known for sure (RFC 9112 6.3)");
        return 400;
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
