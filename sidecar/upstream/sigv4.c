/*
 * sigv4.c — AWS Signature Version 4 (sigv4.h has the rules).
 */
#include "sigv4.h"

#include <ctype.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static const char HEX_LOWER[] = "0123456789abcdef";
static const char HEX_UPPER[] = "0123456789ABCDEF";

static bool unreserved(unsigned char c)
{
    return isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~';
}

static int put_encoded(struct strbuf *b, const char *p, size_t n, bool keep_slash)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (unreserved(c) || (keep_slash && c == '/')) {
            if (strbuf_putc(b, (char)c) < 0)
                return -1;
        } else {
            char e[3] = { '%', HEX_UPPER[c >> 4], HEX_UPPER[c & 15] };
            if (strbuf_put(b, e, 3) < 0)
                return -1;
        }
    }
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = (char)tolower((unsigned char)c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Percent-decodes p[0..n) into b (a '%' not followed by two hex digits
 * stays as it is). */
static int put_decoded(struct strbuf *b, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int hi, lo;
        if (p[i] == '%' && i + 2 < n && (hi = hexval(p[i + 1])) >= 0 &&
            (lo = hexval(p[i + 2])) >= 0) {
            if (strbuf_putc(b, (char)(hi << 4 | lo)) < 0)
                return -1;
            i += 2;
        } else if (strbuf_putc(b, p[i]) < 0) {
            return -1;
        }
    }
    return 0;
}

/* Decodes then re-encodes p[0..n) (one query name or value). */
static int put_query_part(struct strbuf *b, const char *p, size_t n)
{
    struct strbuf raw;
    strbuf_init(&raw);
    int rc = put_decoded(&raw, p, n);
    if (rc == 0)
        rc = put_encoded(b, strbuf_head(&raw), strbuf_live(&raw), false);
    strbuf_fini(&raw);
    return rc;
}

struct qpair {
    char *name, *value; /* encoded, NUL-terminated */
};

static int qpair_cmp(const void *a, const void *b)
{
    const struct qpair *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : strcmp(x->value, y->value);
}

static char *encoded_dup(const char *p, size_t n)
{
    struct strbuf b;
    strbuf_init(&b);
    if (put_query_part(&b, p, n) < 0 || strbuf_putc(&b, '\0') < 0) {
        strbuf_fini(&b);
        return NULL;
    }
    return b.data ? b.data : strdup("");
}

static int put_canonical_query(struct strbuf *out, const char *q)
{
    if (!q || !*q)
        return 0;
    size_t n = 1;
    for (const char *s = q; *s; s++)
        n += *s == '&';
    struct qpair *pairs = calloc(n, sizeof(*pairs));
    if (!pairs)
        return -1;
    size_t k = 0;
    int rc = 0;
    for (const char *s = q; rc == 0;) {
        const char *end = strchr(s, '&');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        if (len > 0) {
            const char *eq = memchr(s, '=', len);
            size_t nlen = eq ? (size_t)(eq - s) : len;
            pairs[k].name = encoded_dup(s, nlen);
            pairs[k].value = eq ? encoded_dup(eq + 1, len - nlen - 1) : strdup("");
            if (!pairs[k].name || !pairs[k].value)
                rc = -1;
            k++;
        }
        if (!end)
            break;
        s = end + 1;
    }
    if (rc == 0) {
        qsort(pairs, k, sizeof(*pairs), qpair_cmp);
        for (size_t i = 0; i < k && rc == 0; i++) {
            if ((i && strbuf_putc(out, '&') < 0) ||
                strbuf_put(out, pairs[i].name, strlen(pairs[i].name)) < 0 ||
                strbuf_putc(out, '=') < 0 ||
                strbuf_put(out, pairs[i].value, strlen(pairs[i].value)) < 0)
                rc = -1;
        }
    }
    for (size_t i = 0; i < k; i++) {
        free(pairs[i].name);
        free(pairs[i].value);
    }
    free(pairs);
    return rc;
}

struct hdr {
    char *name;        /* lowercased, NUL-terminated */
    const char *value; /* borrowed */
    size_t value_len;
    size_t order; /* position given, so repeated names keep their order */
};

static int hdr_cmp(const void *a, const void *b)
{
    const struct hdr *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->order > y->order) - (x->order < y->order);
}

/* The value trimmed, runs of spaces folded to one. */
static int put_folded(struct strbuf *b, const char *v, size_t n)
{
    while (n && (*v == ' ' || *v == '\t'))
        v++, n--;
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    bool space = false;
    for (size_t i = 0; i < n; i++) {
        if (v[i] == ' ' || v[i] == '\t') {
            space = true;
            continue;
        }
        if ((space && strbuf_putc(b, ' ') < 0) || strbuf_putc(b, v[i]) < 0)
            return -1;
        space = false;
    }
    return 0;
}

static int add_hdr(struct hdr *h, size_t *n, const char *name, size_t name_len, const char *value,
                   size_t value_len)
{
    char *lower = malloc(name_len + 1);
    if (!lower)
        return -1;
    for (size_t i = 0; i < name_len; i++)
        lower[i] = (char)tolower((unsigned char)name[i]);
    lower[name_len] = '\0';
    h[*n] = (struct hdr){ lower, value, value_len, *n };
    (*n)++;
    return 0;
}

static void sigv4_amz_date(time_t when, char out[SIGV4_AMZ_DATE_LEN + 1])
{
    struct tm tm;
    gmtime_r(&when, &tm);
    strftime(out, SIGV4_AMZ_DATE_LEN + 1, "%Y%m%dT%H%M%SZ", &tm);
}

static bool has_token(const struct sigv4_creds *c)
{
    return c->session_token && *c->session_token;
}

static void hex_of(const unsigned char *d, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = HEX_LOWER[d[i] >> 4];
        out[2 * i + 1] = HEX_LOWER[d[i] & 15];
    }
    out[2 * n] = '\0';
}

static int sha256_hex(const void *p, size_t n, char out[65])
{
    unsigned char md[32];
    unsigned int len = 0;
    if (!EVP_Digest(p, n, md, &len, EVP_sha256(), NULL) || len != 32)
        return -1;
    hex_of(md, 32, out);
    return 0;
}

int sigv4_canonical_request(const struct sigv4_request *r, const struct sigv4_creds *c,
                            struct strbuf *out, struct strbuf *signed_headers)
{
    char date[SIGV4_AMZ_DATE_LEN + 1], body_hash[65];
    size_t max = r->n_headers + 3, n = 0;
    struct hdr *h = calloc(max, sizeof(*h));
    int rc = -1;

    if (!h)
        return -1;
    sigv4_amz_date(r->when, date);
    if (add_hdr(h, &n, "host", 4, r->host, strlen(r->host)) < 0 ||
        add_hdr(h, &n, "x-amz-date", 10, date, strlen(date)) < 0 ||
        (has_token(c) &&
         add_hdr(h, &n, "x-amz-security-token", 20, c->session_token, strlen(c->session_token)) <
             0))
        goto out;
    for (size_t i = 0; i < r->n_headers; i++) {
        const char *line = r->headers[i], *colon = strchr(line, ':');
        if (!colon || colon == line)
            goto out;
        if (add_hdr(h, &n, line, (size_t)(colon - line), colon + 1, strlen(colon + 1)) < 0)
            goto out;
    }
    qsort(h, n, sizeof(*h), hdr_cmp);

    if (strbuf_put(out, r->method, strlen(r->method)) < 0 || strbuf_putc(out, '\n') < 0)
        goto out;
    const char *path = r->path && *r->path ? r->path : "/";
    if (put_encoded(out, path, strlen(path), true) < 0 || strbuf_putc(out, '\n') < 0 ||
        put_canonical_query(out, r->query) < 0 || strbuf_putc(out, '\n') < 0)
        goto out;
    for (size_t i = 0; i < n; i++) {
        bool repeat = i > 0 && strcmp(h[i].name, h[i - 1].name) == 0;
        if (repeat) {
            if (strbuf_putc(out, ',') < 0)
                goto out;
        } else {
            if ((i > 0 && strbuf_putc(out, '\n') < 0) ||
                strbuf_put(out, h[i].name, strlen(h[i].name)) < 0 || strbuf_putc(out, ':') < 0)
                goto out;
            if (strbuf_live(signed_headers) && strbuf_putc(signed_headers, ';') < 0)
                goto out;
            if (strbuf_put(signed_headers, h[i].name, strlen(h[i].name)) < 0)
                goto out;
        }
        if (put_folded(out, h[i].value, h[i].value_len) < 0)
            goto out;
    }
    if (sha256_hex(r->body ? r->body : "", r->body ? r->body_len : 0, body_hash) < 0)
        goto out;
    if (strbuf_put(out, "\n\n", 2) < 0 ||
        strbuf_put(out, strbuf_head(signed_headers), strbuf_live(signed_headers)) < 0 ||
        strbuf_putc(out, '\n') < 0 || strbuf_put(out, body_hash, 64) < 0)
        goto out;
    strbuf_terminate(out);
    strbuf_terminate(signed_headers);
    rc = 0;
out:
    for (size_t i = 0; i < n; i++)
        free(h[i].name);
    free(h);
    return rc;
}

/* Appends "yyyymmdd/region/service/aws4_request". */
static int put_scope(struct strbuf *b, const struct sigv4_request *r, const char *date)
{
    return strbuf_put(b, date, 8) < 0 || strbuf_putc(b, '/') < 0 ||
            strbuf_put(b, r->region, strlen(r->region)) < 0 || strbuf_putc(b, '/') < 0 ||
            strbuf_put(b, r->service, strlen(r->service)) < 0 ||
            strbuf_put(b, "/aws4_request", 13) < 0
        ? -1
        : 0;
}

/* The string to sign, with the signed-header list left in *signed_headers. */
static int string_to_sign(const struct sigv4_request *r, const struct sigv4_creds *c,
                          struct strbuf *out, struct strbuf *signed_headers)
{
    struct strbuf creq;
    char date[SIGV4_AMZ_DATE_LEN + 1], hash[65];
    int rc = -1;

    strbuf_init(&creq);
    sigv4_amz_date(r->when, date);
    if (sigv4_canonical_request(r, c, &creq, signed_headers) == 0 &&
        sha256_hex(strbuf_head(&creq), strbuf_live(&creq), hash) == 0 &&
        strbuf_put(out, "AWS4-HMAC-SHA256\n", 17) == 0 &&
        strbuf_put(out, date, SIGV4_AMZ_DATE_LEN) == 0 && strbuf_putc(out, '\n') == 0 &&
        put_scope(out, r, date) == 0 && strbuf_putc(out, '\n') == 0 &&
        strbuf_put(out, hash, 64) == 0) {
        strbuf_terminate(out);
        rc = 0;
    }
    strbuf_fini(&creq);
    return rc;
}

int sigv4_string_to_sign(const struct sigv4_request *r, const struct sigv4_creds *c,
                         struct strbuf *out)
{
    struct strbuf sh;
    strbuf_init(&sh);
    int rc = string_to_sign(r, c, out, &sh);
    strbuf_fini(&sh);
    return rc;
}

static int hmac(const void *key, size_t key_len, const void *msg, size_t n, unsigned char out[32])
{
    unsigned int len = 0;
    return HMAC(EVP_sha256(), key, (int)key_len, msg, n, out, &len) && len == 32 ? 0 : -1;
}

int sigv4_sign(const struct sigv4_request *r, const struct sigv4_creds *c, struct sigv4_out *out)
{
    struct strbuf sts, sh;
    unsigned char k[32], sig[32];
    char sig_hex[65];
    size_t slen = strlen(c->secret_access_key);
    char *first = malloc(slen + 5);
    int rc = -1;

    if (!first)
        return -1;
    memcpy(first, "AWS4", 4);
    memcpy(first + 4, c->secret_access_key, slen + 1);
    strbuf_init(&sts);
    strbuf_init(&sh);
    sigv4_amz_date(r->when, out->amz_date);
    if (string_to_sign(r, c, &sts, &sh) < 0 || hmac(first, slen + 4, out->amz_date, 8, k) < 0 ||
        hmac(k, 32, r->region, strlen(r->region), k) < 0 ||
        hmac(k, 32, r->service, strlen(r->service), k) < 0 ||
        hmac(k, 32, "aws4_request", 12, k) < 0 ||
        hmac(k, 32, strbuf_head(&sts), strbuf_live(&sts), sig) < 0)
        goto out;
    hex_of(sig, 32, sig_hex);
    struct strbuf *a = &out->authorization;
    if (strbuf_put(a, "AWS4-HMAC-SHA256 Credential=", 28) < 0 ||
        strbuf_put(a, c->access_key_id, strlen(c->access_key_id)) < 0 || strbuf_putc(a, '/') < 0 ||
        put_scope(a, r, out->amz_date) < 0 || strbuf_put(a, ", SignedHeaders=", 16) < 0 ||
        strbuf_put(a, strbuf_head(&sh), strbuf_live(&sh)) < 0 ||
        strbuf_put(a, ", Signature=", 12) < 0 || strbuf_put(a, sig_hex, 64) < 0)
        goto out;
    strbuf_terminate(a);
    rc = 0;
out:
    explicit_bzero(first, slen + 4);
    explicit_bzero(k, sizeof(k));
    free(first);
    strbuf_fini(&sts);
    strbuf_fini(&sh);
    return rc;
}
