/* rawcall.c — see rawcall.h. */
#include "rawcall.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "upstream/upstream.h"

struct raw_call *raw_call_new(const char *method, const char *suffix, const char *ctype,
                              const char *body, size_t len)
{
    struct raw_call *rc = calloc(1, sizeof(*rc));

    if (!rc)
        return NULL;
    rc->method = method ? method : "POST";
    if (!(rc->suffix = strdup(suffix ? suffix : "")))
        goto fail;
    if (ctype) {
        size_t n = strlen(ctype) + sizeof("Content-Type: ");
        if (!(rc->ctype_line = malloc(n)))
            goto fail;
        snprintf(rc->ctype_line, n, "Content-Type: %s", ctype);
    }
    if (len > 0) {
        if (!(rc->body = malloc(len)))
            goto fail;
        memcpy(rc->body, body, len);
        rc->body_len = len;
    }
    return rc;
fail:
    raw_call_free(rc);
    return NULL;
}

static void raw_call_drop_url(struct raw_call *rc)
{
    if (rc->url) {
        explicit_bzero(rc->url, strlen(rc->url)); /* auth_query puts the key in it */
        free(rc->url);
        rc->url = NULL;
    }
}

void raw_call_free(struct raw_call *rc)
{
    if (!rc)
        return;
    raw_call_drop_url(rc);
    free(rc->headers);
    free(rc->suffix);
    free(rc->ctype_line);
    free(rc->body);
    free(rc);
}

/* Is s[0..n) "." or "..", any dot percent-encoded or not? */
static bool dot_segment(const char *s, size_t n)
{
    size_t dots = 0;

    for (size_t i = 0; i < n; dots++) {
        if (s[i] == '.')
            i++;
        else if (n - i >= 3 && s[i] == '%' && s[i + 1] == '2' && (s[i + 2] | 0x20) == 'e')
            i += 3;
        else
            return false;
    }
    return dots == 1 || dots == 2;
}

/* The length of the path separator at s[0..n), or 0: '/', and what an
 * upstream or a proxy on the way may take for one ('\\', "%2F", "%5C"),
 * so that no dot segment hides behind them. */
static size_t separator_len(const char *s, size_t n)
{
    if (s[0] == '/' || s[0] == '\\')
        return 1;
    if (n >= 3 && s[0] == '%' &&
        ((s[1] == '2' && (s[2] | 0x20) == 'f') || (s[1] == '5' && (s[2] | 0x20) == 'c')))
        return 3;
    return 0;
}

const char *raw_call_suffix_problem(const char *s, size_t n)
{
    const char *q = memchr(s, '?', n);
    size_t path = q ? (size_t)(q - s) : n, start = 0;

    if (n > 0 && s[0] != '/' && s[0] != '?')
        return "must be empty or start with '/' or '?'";
    for (size_t i = 0; i < n; i++)
        if (s[i] <= ' ' || s[i] > '~' || s[i] == '#')
            return "must be printable ASCII without spaces or '#'";
    for (size_t i = 0; i <= path; i++) {
        size_t sep = i == path ? 1 : separator_len(s + i, path - i);
        if (sep) {
            if (dot_segment(s + start, i - start))
                return "a path with a '.' or '..' segment is refused";
            i += sep - 1;
            start = i + 1;
        }
    }
    return NULL;
}

const char *raw_call_method(const char *s, size_t n)
{
    static const char *const known[] = { "GET", "POST", "DELETE" };

    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        if (strlen(known[i]) == n && memcmp(s, known[i], n) == 0)
            return known[i];
    return NULL;
}

bool raw_call_idempotent(const struct raw_call *rc)
{
    return strcmp(rc->method, "GET") == 0 || strcmp(rc->method, "DELETE") == 0;
}

int raw_call_spec(struct raw_call *rc, const struct config_source *src, const char *cap_path,
                  struct attempt_spec *as)
{
    size_t nh = 0;

    while (src->req_headers && src->req_headers[nh])
        nh++;
    free(rc->headers);
    if (!(rc->headers = calloc(nh + 2, sizeof(*rc->headers))))
        return -1;
    for (size_t i = 0; i < nh; i++)
        rc->headers[i] = src->req_headers[i];
    /* A POST without one: "Content-Type:" keeps libcurl from adding its
     * form type. */
    if (strcmp(rc->method, "POST") == 0)
        rc->headers[nh] = rc->ctype_line ? rc->ctype_line : (char *)"Content-Type:";
    /* The source's own query follows the client's, joined by '&' when the
     * client sent one. */
    const char *q = src->req_query;
    bool join = *q == '?' && strchr(rc->suffix, '?');
    size_t n = strlen(src->base_url) + strlen(cap_path) + strlen(rc->suffix) + strlen(q) + 1;
    raw_call_drop_url(rc);
    if (!(rc->url = malloc(n)))
        return -1;
    snprintf(rc->url, n, "%s%s%s%s%s", src->base_url, cap_path, rc->suffix, join ? "&" : "",
             join ? q + 1 : q);
    as->url = rc->url;
    as->headers = (const char *const *)rc->headers;
    as->body = NULL;
    as->body_len = 0;
    if (rc->body_len > 0 && strcmp(rc->method, "POST") == 0) {
        if (!(as->body = malloc(rc->body_len)))
            return -1;
        memcpy(as->body, rc->body, rc->body_len);
        as->body_len = rc->body_len;
    }
    as->raw = true;
    as->method = strcmp(rc->method, "POST") == 0 ? NULL : rc->method;
    return 0;
}
