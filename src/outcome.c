/* outcome.c — classification of an attempt's end (see outcome.h). */
#include "outcome.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

static const char *const outcome_kind_names[] = {
    [OUTCOME_SUCCESS] = "success",
    [OUTCOME_RATE_LIMITED] = "rate_limited",
    [OUTCOME_TRANSIENT] = "transient",
    [OUTCOME_FAIL_FAST] = "fail_fast",
};

/* These strings are an external contract (logs, stats, error sources):
 * never rename one, only add. */
static const char *const outcome_reason_names[OUTCOME_REASON_COUNT] = {
    [REASON_NONE] = "none",
    [REASON_CONNECT_TIMEOUT] = "connect_timeout",
    [REASON_TTFT_TIMEOUT] = "ttft_timeout",
    [REASON_IDLE_TIMEOUT] = "idle_timeout",
    [REASON_TOTAL_TIMEOUT] = "total_timeout",
    [REASON_DNS_TIMEOUT] = "dns_timeout",
    [REASON_DNS_FAILED] = "dns_failed",
    [REASON_CONNECT_FAILED] = "connect_failed",
    [REASON_CONNECTION_RESET] = "connection_reset",
    [REASON_TRUNCATED] = "truncated",
    [REASON_HTTP_5XX] = "http_5xx",
    [REASON_HTTP_408] = "http_408",
    [REASON_HTTP_409] = "http_409",
    [REASON_HTTP_429] = "http_429",
    [REASON_HTTP_4XX] = "http_4xx",
    [REASON_BAD_RESPONSE] = "bad_response",
    [REASON_TLS] = "tls",
    [REASON_CANCELLED] = "cancelled",
};

const char *outcome_kind_name(enum outcome_kind kind)
{
    size_t n = sizeof(outcome_kind_names) / sizeof(outcome_kind_names[0]);

    if ((unsigned)kind >= n)
        return "unknown";
    return outcome_kind_names[kind];
}

const char *outcome_reason_name(enum outcome_reason reason)
{
    if ((unsigned)reason >= OUTCOME_REASON_COUNT || outcome_reason_names[reason] == NULL)
        return "unknown";
    return outcome_reason_names[reason];
}

static enum outcome_kind reason_kind(enum outcome_reason reason)
{
    switch (reason) {
    case REASON_NONE:
        return OUTCOME_SUCCESS;
    case REASON_HTTP_429:
        return OUTCOME_RATE_LIMITED;
    case REASON_HTTP_4XX:
        return OUTCOME_FAIL_FAST;
    case REASON_CANCELLED:
        return OUTCOME_FAIL_FAST;
    default:
        return OUTCOME_TRANSIENT;
    }
}

void outcome_from_reason(struct outcome *o, enum outcome_reason reason)
{
    if ((unsigned)reason >= OUTCOME_REASON_COUNT)
        reason = REASON_BAD_RESPONSE;
    o->kind = reason_kind(reason);
    o->reason = reason;
    o->http_status = 0;
    o->retry_after_s = -1;
}

void outcome_from_http(struct outcome *o, int status, const char *retry_after_header,
                       double now_unix_s)
{
    enum outcome_reason reason;
    bool wants_retry_after = false;

    if (status >= 200 && status <= 299) {
        reason = REASON_NONE;
    } else if (status == 429) {
        reason = REASON_HTTP_429;
        wants_retry_after = true;
    } else if (status == 408) {
        reason = REASON_HTTP_408;
    } else if (status == 409) {
        reason = REASON_HTTP_409;
    } else if (status >= 400 && status <= 499) {
        reason = REASON_HTTP_4XX;
    } else if (status >= 500 && status <= 599) {
        reason = REASON_HTTP_5XX;
        wants_retry_after = true;
    } else {
        reason = REASON_BAD_RESPONSE;
    }
    outcome_from_reason(o, reason);
    o->http_status = status;
    if (wants_retry_after && retry_after_header != NULL) {
        double s;
        if (outcome_parse_retry_after(retry_after_header, now_unix_s, &s) == 0)
            o->retry_after_s = s;
    }
}

/* ---------------------------------------------------------------------------
 * Retry-After parsing. A small cursor over [s, end); every helper advances it
 * only on success, and a parse is valid only if it consumes everything. */

struct outcome_cur {
    const char *s;
    const char *end;
};

static const char *const outcome_wday_short[] = { "Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun" };
static const char *const outcome_wday_long[] = { "Monday", "Tuesday",  "Wednesday", "Thursday",
                                                 "Friday", "Saturday", "Sunday" };
static const char *const outcome_month[] = { "Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                             "Jul", "Aug", "Sep", "Oct", "Nov", "Dec" };

static bool is_alpha(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static char to_lower(char c)
{
    return (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
}

static bool eq_nocase(const char *a, size_t n, const char *b)
{
    if (strlen(b) != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (to_lower(a[i]) != to_lower(b[i]))
            return false;
    return true;
}

/* Reads a run of letters; returns its index in `names` (case-insensitive,
 * whole-word) or -1. */
static int cur_word(struct outcome_cur *c, const char *const *names, int n)
{
    const char *w = c->s;
    size_t len = 0;

    while (w + len < c->end && is_alpha(w[len]))
        len++;
    for (int i = 0; i < n; i++) {
        if (eq_nocase(w, len, names[i])) {
            c->s += len;
            return i;
        }
    }
    return -1;
}

static bool cur_char(struct outcome_cur *c, char ch)
{
    if (c->s < c->end && *c->s == ch) {
        c->s++;
        return true;
    }
    return false;
}

static bool cur_lit(struct outcome_cur *c, const char *lit)
{
    size_t n = strlen(lit);

    if ((size_t)(c->end - c->s) < n || memcmp(c->s, lit, n) != 0)
        return false;
    c->s += n;
    return true;
}

/* Exactly `n` digits. */
static bool cur_digits(struct outcome_cur *c, int n, int *out)
{
    int v = 0;

    if (c->end - c->s < n)
        return false;
    for (int i = 0; i < n; i++) {
        if (!is_digit(c->s[i]))
            return false;
        v = v * 10 + (c->s[i] - '0');
    }
    c->s += n;
    *out = v;
    return true;
}

/* "HH:MM:SS" */
static bool cur_time(struct outcome_cur *c, int *h, int *m, int *s)
{
    return cur_digits(c, 2, h) && cur_char(c, ':') && cur_digits(c, 2, m) && cur_char(c, ':') &&
        cur_digits(c, 2, s);
}

static bool is_leap(long long y)
{
    return y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
}

static int days_in_month(long long y, int m)
{
    static const int dim[12] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
    return m == 2 && is_leap(y) ? 29 : dim[m - 1];
}

/* Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
 * days_from_civil), month 1..12. */
static long long days_from_civil(long long y, int m, int d)
{
    y -= m <= 2;
    long long era = (y >= 0 ? y : y - 399) / 400;
    long long yoe = y - era * 400;
    long long doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    long long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* The Gregorian year containing day `z` (days since 1970-01-01). */
static long long year_from_days(long long z)
{
    z += 719468;
    long long era = (z >= 0 ? z : z - 146096) / 146097;
    long long doe = z - era * 146097;
    long long yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    long long doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    long long mp = (5 * doy + 2) / 153;
    long long m = mp < 10 ? mp + 3 : mp - 9;
    return yoe + era * 400 + (m <= 2);
}

/* Parses one of the three HTTP-date forms spanning all of [s, end) into
 * seconds since the epoch. */
static bool parse_http_date(const char *s, const char *end, double now, double *out)
{
    struct outcome_cur c = { s, end };
    long long year;
    int day, mon, yy, hh, mi, ss;
    const char *w = c.s;

    if (cur_word(&c, outcome_wday_short, 7) >= 0) {
        if (cur_char(&c, ',')) {
            /* IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT */
            int y4;
            if (!cur_char(&c, ' ') || !cur_digits(&c, 2, &day) || !cur_char(&c, ' '))
                return false;
            if ((mon = cur_word(&c, outcome_month, 12)) < 0)
                return false;
            if (!cur_char(&c, ' ') || !cur_digits(&c, 4, &y4) || !cur_char(&c, ' ') ||
                !cur_time(&c, &hh, &mi, &ss) || !cur_lit(&c, " GMT"))
                return false;
            year = y4;
        } else {
            /* asctime: Sun Nov  6 08:49:37 1994 (day is " 6" or "16") */
            int y4;
            if (!cur_char(&c, ' ') || (mon = cur_word(&c, outcome_month, 12)) < 0 ||
                !cur_char(&c, ' '))
                return false;
            if (cur_char(&c, ' ')) {
                if (!cur_digits(&c, 1, &day))
                    return false;
            } else if (!cur_digits(&c, 2, &day)) {
                return false;
            }
            if (!cur_char(&c, ' ') || !cur_time(&c, &hh, &mi, &ss) || !cur_char(&c, ' ') ||
                !cur_digits(&c, 4, &y4))
                return false;
            year = y4;
        }
    } else {
        /* RFC 850: Sunday, 06-Nov-94 08:49:37 GMT */
        long long now_year, cand;
        long long now_day;

        c.s = w;
        if (cur_word(&c, outcome_wday_long, 7) < 0 || !cur_lit(&c, ", ") ||
            !cur_digits(&c, 2, &day) || !cur_char(&c, '-') ||
            (mon = cur_word(&c, outcome_month, 12)) < 0 || !cur_char(&c, '-') ||
            !cur_digits(&c, 2, &yy) || !cur_char(&c, ' ') || !cur_time(&c, &hh, &mi, &ss) ||
            !cur_lit(&c, " GMT"))
            return false;
        /* RFC 9110 5.6.7: a two-digit year more than 50 years in the future
         * means the most recent past year with those digits. */
        now_day = (long long)(now / 86400.0);
        if ((double)now_day * 86400.0 > now)
            now_day--;
        now_year = year_from_days(now_day);
        cand = now_year - (now_year % 100 + 100) % 100 + yy;
        if (cand > now_year + 50)
            cand -= 100;
        year = cand;
    }
    if (c.s != c.end)
        return false;
    mon += 1;
    if (day < 1 || day > days_in_month(year, mon) || hh > 23 || mi > 59 || ss > 60)
        return false;
    *out = (double)(days_from_civil(year, mon, day) * 86400 + hh * 3600 + mi * 60 + ss);
    return true;
}

/* delta-seconds, leniently with one decimal point: DIGITS [ "." DIGITS ]. */
static bool parse_delta(const char *s, const char *end, double *out)
{
    double v = 0, scale = 1;
    const char *p = s;

    if (p == end || !is_digit(*p))
        return false;
    while (p < end && is_digit(*p))
        v = v * 10 + (*p++ - '0');
    if (p < end && *p == '.') {
        p++;
        if (p == end || !is_digit(*p))
            return false;
        while (p < end && is_digit(*p)) {
            scale /= 10;
            v += (*p++ - '0') * scale;
        }
    }
    if (p != end)
        return false;
    *out = v;
    return true;
}

int outcome_parse_retry_after(const char *value, double now_unix_s, double *out_s)
{
    const char *s, *end;
    double v;

    if (value == NULL)
        return OUTCOME_EINVAL;
    s = value;
    end = value + strlen(value);
    while (s < end && (*s == ' ' || *s == '\t'))
        s++;
    while (end > s && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    if (s == end)
        return OUTCOME_EINVAL;

    if (is_digit(*s)) {
        if (!parse_delta(s, end, &v))
            return OUTCOME_EINVAL;
    } else {
        double date;
        /* Reject a non-finite or absurd `now` before converting it to days. */
        if (!isfinite(now_unix_s) || fabs(now_unix_s) > 1e15)
            return OUTCOME_EINVAL;
        if (!parse_http_date(s, end, now_unix_s, &date))
            return OUTCOME_EINVAL;
        v = date - now_unix_s;
    }
    if (!(v > 0))
        v = 0;
    if (v > OUTCOME_RETRY_AFTER_MAX_S)
        v = OUTCOME_RETRY_AFTER_MAX_S;
    *out_s = v;
    return 0;
}
