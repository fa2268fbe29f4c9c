/* log.c — JSON-lines logger (see log.h). */
#include "log.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "jsonw.h"
#include "utf8.h"

enum log_level log_threshold = LOG_INFO;

const char *log_level_name(enum log_level lvl)
{
    switch (lvl) {
    case LOG_DEBUG:
        return "debug";
    case LOG_INFO:
        return "info";
    case LOG_WARN:
        return "warn";
    default:
        return "error";
    }
}

struct line {
    char buf[4096];
    size_t len;
};

static void put(struct line *l, const char *s, size_t n)
{
    size_t room = sizeof(l->buf) - 2 - l->len; /* keep space for "}\n" */
    if (n > room)
        n = room;
    memcpy(l->buf + l->len, s, n);
    l->len += n;
}

static void putf(struct line *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(struct line *l, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n > 0)
        put(l, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

/* Puts all n bytes, or none when they do not fit (a character is never cut). */
static void put_whole(struct line *l, const char *s, size_t n)
{
    if (n <= sizeof(l->buf) - 2 - l->len)
        put(l, s, n);
}

/* A JSON string: the line stays valid UTF-8 whatever `s` holds (a client's
 * identifier, a defect): each maximal invalid subpart becomes U+FFFD. */
static void put_json_str(struct line *l, const char *s)
{
    if (!s) {
        put(l, "null", 4);
        return;
    }
    put(l, "\"", 1);
    const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
    while (p < end) {
        if (*p >= 0x80) {
            size_t k = utf8_seq_len(p, end);
            put_whole(l, k ? (const char *)p : "\xEF\xBF\xBD", k ? k : 3);
            p += k ? k : utf8_bad_len(p, end);
            continue;
        }
        char esc[6];
        size_t e = jsonw_escape(*p, esc);
        put(l, e ? esc : (const char *)p, e ? e : 1);
        p++;
    }
    put(l, "\"", 1);
}

void log_event(enum log_level lvl, const char *msg, ...)
{
    struct line l = { .len = 0 };
    struct timespec ts;
    struct tm tm;
    va_list ap;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    putf(&l, "{\"level\":\"%s\",\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"msg\":",
         log_level_name(lvl), tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
         tm.tm_sec, ts.tv_nsec / 1000000);
    put_json_str(&l, msg);

    va_start(ap, msg);
    for (const char *key = va_arg(ap, const char *); key; key = va_arg(ap, const char *)) {
        put(&l, ",", 1);
        put_json_str(&l, key);
        put(&l, ":", 1);
        switch (va_arg(ap, int)) {
        case LOG_S:
            put_json_str(&l, va_arg(ap, const char *));
            break;
        case LOG_I:
            putf(&l, "%lld", va_arg(ap, long long));
            break;
        case LOG_U:
            putf(&l, "%llu", va_arg(ap, unsigned long long));
            break;
        case LOG_B:
            if (va_arg(ap, int))
                put(&l, "true", 4);
            else
                put(&l, "false", 5);
            break;
        case LOG_N: {
            long long v = va_arg(ap, long long);
            if (v >= 0)
                putf(&l, "%lld", v);
            else
                put(&l, "null", 4);
            break;
        }
        case LOG_F: {
            double d = va_arg(ap, double);
            if (isfinite(d))
                putf(&l, "%.6g", d);
            else
                put(&l, "null", 4);
            break;
        }
        default:
            put(&l, "null", 4);
            break;
        }
    }
    va_end(ap);
    l.buf[l.len++] = '}';
    l.buf[l.len++] = '\n';
    /* One write() per line: lines from one process never interleave. */
    ssize_t w = write(STDERR_FILENO, l.buf, l.len);
    (void)w;
}
