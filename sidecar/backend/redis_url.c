/*
 * redis_url.c — rds_parse_url() and the loader's view of it;
 * redis_url.h holds the contract.
 */
#include "redis_url.h"
#include "iplit.h"
#include "strbuf.h"

#define RDS_ERR_MAX 128 /* as redis.c: room for one reason */

#include <arpa/inet.h>
#include <ctype.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static int hexval(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    ch = tolower(ch);
    return ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

/* Percent-decodes s[0..n) into out[cap] (the URL's `what`); -1 with a
 * reason on a malformed or NUL escape, or when it does not fit. The
 * reason never quotes the text (it may be the password). */
static int pct_decode(const char *s, size_t n, char *out, size_t cap, const char *what, char *err,
                      size_t errlen)
{
    size_t j = 0;

    for (size_t i = 0; i < n; i++) {
        int ch = (unsigned char)s[i];
        if (ch == '%') {
            if (n - i < 3 || hexval(s[i + 1]) < 0 || hexval(s[i + 2]) < 0 ||
                hexval(s[i + 1]) * 16 + hexval(s[i + 2]) == 0) {
                str_setf(err, errlen, "bad percent-encoding in the %s (%%XX, not %%00)", what);
                return -1;
            }
            ch = hexval(s[i + 1]) * 16 + hexval(s[i + 2]);
            i += 2;
        }
        if (j + 1 >= cap) {
            str_setf(err, errlen, "%s too long (max %zu bytes)", what, cap - 1);
            return -1;
        }
        out[j++] = (char)ch;
    }
    out[j] = '\0';
    return 0;
}

/* Parses a decimal number made only of digits, at most `max`. */
static int parse_uint(const char *s, size_t n, long long max, long long *v)
{
    long long x = 0;

    if (n == 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        x = x * 10 + (s[i] - '0');
        if (x > max)
            return -1;
    }
    *v = x;
    return 0;
}

static int parse_password(const char *s, size_t n, struct rds_addr *out, char *err, size_t errlen)
{
    return pct_decode(s, n, out->password, sizeof(out->password), "password", err, errlen);
}

static int parse_db(const char *s, size_t n, struct rds_addr *out, char *err, size_t errlen)
{
    long long v;

    if (parse_uint(s, n, INT_MAX, &v) < 0) {
        str_setf(err, errlen, "bad db (expected a number 0..%d)", INT_MAX);
        return -1;
    }
    out->db = (int)v;
    return 0;
}

/* redis://[[user]:password@]host[:port][/db]. The user info ends at the
 * LAST '@', so an unencoded '@' or '/' in the password still works. */
static int parse_tcp(const char *s, struct rds_addr *out, char *err, size_t errlen)
{
    const char *at = strrchr(s, '@'), *p = s;

    if (at) {
        const char *colon = memchr(s, ':', (size_t)(at - s));
        if (!colon) {
            str_setf(err, errlen, "the part before '@' must be [user]:password");
            return -1;
        }
        size_t ulen = (size_t)(colon - s);
        if (pct_decode(s, ulen, out->user, sizeof(out->user), "user name", err, errlen) < 0)
            return -1;
        if (strcmp(out->user, "default") == 0)
            out->user[0] = '\0';
        if (parse_password(colon + 1, (size_t)(at - colon - 1), out, err, errlen) < 0)
            return -1;
        p = at + 1;
    }

    size_t hlen;
    if (*p == '[') {
        const char *close = strchr(p, ']');
        if (!close) {
            str_setf(err, errlen, "unterminated '[' in the host");
            return -1;
        }
        hlen = (size_t)(close - p - 1);
        if (hlen == 0) {
            str_setf(err, errlen, "empty host");
            return -1;
        }
        if (hlen >= sizeof(out->host) || !iplit_parse(p + 1, hlen, IPLIT_V6, NULL)) {
            str_setf(err, errlen, "bad IPv6 address in the host");
            return -1;
        }
        memcpy(out->host, p + 1, hlen);
        out->host[hlen] = '\0';
        p = close + 1;
        if (*p && *p != ':' && *p != '/') {
            str_setf(err, errlen, "unexpected characters after the host");
            return -1;
        }
    } else {
        hlen = strcspn(p, ":/");
        if (hlen == 0) {
            str_setf(err, errlen, "empty host");
            return -1;
        }
        if (hlen >= sizeof(out->host)) {
            str_setf(err, errlen, "host too long (max %zu bytes)", sizeof(out->host) - 1);
            return -1;
        }
        for (size_t i = 0; i < hlen; i++) {
            unsigned char ch = (unsigned char)p[i];
            if (!isalnum(ch) && ch != '-' && ch != '.' && ch != '_') {
                str_setf(err, errlen, "bad character in the host (letters, digits, '-', '.', '_')");
                return -1;
            }
        }
        memcpy(out->host, p, hlen);
        out->host[hlen] = '\0';
        p += hlen;
    }

    if (*p == ':') {
        size_t n = strcspn(++p, "/");
        long long v;
        if (parse_uint(p, n, 65535, &v) < 0 || v == 0) {
            str_setf(err, errlen, "bad port (expected 1..65535)");
            return -1;
        }
        out->port = (int)v;
        p += n;
    }
    if (*p == '/') {
        size_t n = strlen(++p);
        size_t digits = strspn(p, "0123456789");
        if (n && digits == 0) {
            str_setf(err, errlen, "bad db (expected a number 0..%d)", INT_MAX);
            return -1;
        }
        if (digits && parse_db(p, digits, out, err, errlen) < 0)
            return -1;
        if (digits < n) {
            str_setf(err, errlen, "unexpected characters after the db number");
            return -1;
        }
    }
    return 0;
}

/* unix:///path/to/socket[?db=N][&password=P] (parameters in any order). */
static int parse_unix(const char *s, struct rds_addr *out, char *err, size_t errlen)
{
    if (*s != '/') {
        str_setf(err, errlen, "the socket path must be absolute (unix:///path)");
        return -1;
    }
    size_t n = strcspn(s, "?");
    if (pct_decode(s, n, out->path, sizeof(out->path), "socket path", err, errlen) < 0)
        return -1;
    out->port = 0;
    if (!s[n])
        return 0;

    bool have_db = false, have_pw = false;
    const char *p = s + n + 1;
    for (;;) {
        size_t len = strcspn(p, "&");
        if (len > 3 && strncmp(p, "db=", 3) == 0) {
            if (have_db) {
                str_setf(err, errlen, "db given twice");
                return -1;
            }
            have_db = true;
            if (parse_db(p + 3, len - 3, out, err, errlen) < 0)
                return -1;
        } else if (len >= 9 && strncmp(p, "password=", 9) == 0) {
            if (have_pw) {
                str_setf(err, errlen, "password given twice");
                return -1;
            }
            have_pw = true;
            if (parse_password(p + 9, len - 9, out, err, errlen) < 0)
                return -1;
        } else {
            /* The text is not echoed: it could be a mistyped password. */
            str_setf(err, errlen, "bad query parameter (expected db=N or password=P)");
            return -1;
        }
        if (!p[len])
            return 0;
        p += len + 1;
    }
}

int rds_parse_url(const char *url, struct rds_addr *out, char *err, size_t errlen)
{
    int rc;

    memset(out, 0, sizeof(*out));
    out->port = 6379;
    if (!url) {
        str_setf(err, errlen, "no URL");
        return -1;
    }
    if (strncasecmp(url, "redis://", 8) == 0)
        rc = parse_tcp(url + 8, out, err, errlen);
    else if (strncasecmp(url, "unix://", 7) == 0)
        rc = parse_unix(url + 7, out, err, errlen);
    else if (strncasecmp(url, "rediss://", 9) == 0) {
        out->tls = true;
        rc = parse_tcp(url + 9, out, err, errlen);
    } else {
        str_setf(err, errlen, "unsupported scheme (expected redis://, rediss:// or unix://)");
        rc = -1;
    }
    if (rc < 0)
        explicit_bzero(out, sizeof(*out));
    return rc;
}

int rds_parse_hostport(const char *s, char *host, size_t hostcap, int *port, char *err,
                       size_t errlen)
{
    struct rds_addr a;
    char why[RDS_ERR_MAX];

    if (!s || !*s || strchr(s, '@') || strchr(s, '/')) {
        str_setf(err, errlen, "expected host:port");
        return -1;
    }
    const char *colon = strrchr(s, ':');
    if (!colon || colon[1] == '\0' || (s[0] == '[' && colon < strchr(s, ']'))) {
        str_setf(err, errlen, "expected host:port (the port is required)");
        return -1;
    }
    memset(&a, 0, sizeof(a));
    if (parse_tcp(s, &a, why, sizeof(why)) < 0) {
        str_setf(err, errlen, "%s", why);
        return -1;
    }
    if (strlen(a.host) >= hostcap) {
        str_setf(err, errlen, "host too long");
        return -1;
    }
    snprintf(host, hostcap, "%s", a.host);
    *port = a.port;
    return 0;
}

static const char *url_problem(const char *url, char *why, size_t whylen)
{
    struct rds_addr addr;
    int rc = rds_parse_url(url, &addr, why, whylen);
    explicit_bzero(&addr, sizeof(addr)); /* it may hold the password */
    return rc < 0 ? why : NULL;
}

static const char *hostport_problem(const char *s, char *why, size_t whylen)
{
    char host[256];
    int port;
    return rds_parse_hostport(s, host, sizeof(host), &port, why, whylen) < 0 ? why : NULL;
}

static bool url_has_password(const char *url)
{
    struct rds_addr addr;
    bool has = rds_parse_url(url, &addr, NULL, 0) == 0 && addr.password[0];
    explicit_bzero(&addr, sizeof(addr));
    return has;
}

const struct config_backend_syntax rds_config_syntax = {
    .url_problem = url_problem,
    .hostport_problem = hostport_problem,
    .url_has_password = url_has_password,
    .password_max = sizeof(((struct rds_addr *)0)->password) - 1,
};
