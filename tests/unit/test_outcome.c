/* test_outcome.c — HTTP status classification and Retry-After parsing,
 * always against a fixed `now` (no clock reads). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "outcome.h"
#include "suites.h"

/* Sun, 06 Nov 1994 08:49:37 GMT — the RFC 9110 example date. */
#define T_EXAMPLE 784111777.0
/* Thu, 01 Jan 2026 00:00:00 GMT */
#define T_2026    1767225600.0

static void check_http(int status, const char *ra, double now, enum outcome_kind kind,
                       enum outcome_reason reason, double retry_after_s)
{
    struct outcome o;

    memset(&o, 0x5a, sizeof(o)); /* every field must be written */
    outcome_from_http(&o, status, ra, now);
    ck_assert_msg(o.kind == kind, "status %d: kind %s, want %s", status, outcome_kind_name(o.kind),
                  outcome_kind_name(kind));
    ck_assert_msg(o.reason == reason, "status %d: reason %s, want %s", status,
                  outcome_reason_name(o.reason), outcome_reason_name(reason));
    ck_assert_int_eq(o.http_status, status);
    if (retry_after_s < 0)
        ck_assert_msg(o.retry_after_s < 0, "status %d: retry_after %g, want absent", status,
                      o.retry_after_s);
    else
        ck_assert_msg(o.retry_after_s == retry_after_s, "status %d: retry_after %g, want %g",
                      status, o.retry_after_s, retry_after_s);
}

/* Parses `v` and expects `want` seconds (or failure when want < 0). */
static void check_ra(const char *v, double now, double want)
{
    double out = -12345;
    int rc = outcome_parse_retry_after(v, now, &out);

    if (want < 0) {
        ck_assert_msg(rc == OUTCOME_EINVAL, "'%s': rc %d (%g), want OUTCOME_EINVAL",
                      v ? v : "(null)", rc, out);
        ck_assert_msg(out == -12345, "'%s': *out_s written on failure", v ? v : "(null)");
    } else {
        ck_assert_msg(rc == 0, "'%s': rc %d, want 0", v, rc);
        ck_assert_msg(fabs(out - want) < 1e-9, "'%s': %.9g s, want %.9g", v, out, want);
    }
}

START_TEST(test_outcome__http_2xx_success)
{
    check_http(200, NULL, T_EXAMPLE, OUTCOME_SUCCESS, REASON_NONE, -1);
    check_http(201, NULL, T_EXAMPLE, OUTCOME_SUCCESS, REASON_NONE, -1);
    check_http(204, NULL, T_EXAMPLE, OUTCOME_SUCCESS, REASON_NONE, -1);
    check_http(299, NULL, T_EXAMPLE, OUTCOME_SUCCESS, REASON_NONE, -1);
    /* A Retry-After on a success means nothing. */
    check_http(200, "5", T_EXAMPLE, OUTCOME_SUCCESS, REASON_NONE, -1);
}
END_TEST

START_TEST(test_outcome__http_429_rate_limited)
{
    check_http(429, NULL, T_EXAMPLE, OUTCOME_RATE_LIMITED, REASON_HTTP_429, -1);
    check_http(429, "7", T_EXAMPLE, OUTCOME_RATE_LIMITED, REASON_HTTP_429, 7);
    check_http(429, "0.25", T_EXAMPLE, OUTCOME_RATE_LIMITED, REASON_HTTP_429, 0.25);
    check_http(429, "Sun, 06 Nov 1994 08:50:37 GMT", T_EXAMPLE, OUTCOME_RATE_LIMITED,
               REASON_HTTP_429, 60);
    check_http(429, "soon", T_EXAMPLE, OUTCOME_RATE_LIMITED, REASON_HTTP_429, -1);
    check_http(429, "", T_EXAMPLE, OUTCOME_RATE_LIMITED, REASON_HTTP_429, -1);
}
END_TEST

START_TEST(test_outcome__http_408_409_transient)
{
    check_http(408, NULL, T_EXAMPLE, OUTCOME_TRANSIENT, REASON_HTTP_408, -1);
    check_http(409, NULL, T_EXAMPLE, OUTCOME_TRANSIENT, REASON_HTTP_409, -1);
    /* Retry-After is defined for 503/429 (and 3xx), not these. */
    check_http(408, "3", T_EXAMPLE, OUTCOME_TRANSIENT, REASON_HTTP_408, -1);
}
END_TEST

START_TEST(test_outcome__http_5xx_transient)
{
    check_http(500, NULL, T_EXAMPLE, OUTCOME_TRANSIENT, REASON_HTTP_5XX, -1);
    check_http(502, NULL, T_EXAMPLE, OUTCOME_TRANSIENT, REASON_HTTP_5XX, -1);
    check_http(503, NULL, T_EXAMPLE, OUTCOME_TRANSIENT, REASON_HTTP_5XX, -1);
    check_http(503, "3", T_EXAMPLE, OUTCOME_TRANSIENT, REASON_HTTP_5XX, 3);
    check_http(503, "junk", T_EXAMPLE, OUTCOME_TRANSIENT, REASON_HTTP_5XX, -1);
    check_http(529, "10", T_EXAMPLE, OUTCOME_TRANSIENT, REASON_HTTP_5XX, 10);
    check_http(599, NULL, T_EXAMPLE, OUTCOME_TRANSIENT, REASON_HTTP_5XX, -1);
}
END_TEST

START_TEST(test_outcome__http_4xx_fail_fast)
{
    static const int st[] = { 400, 401, 402, 403, 404, 405, 410, 413, 415, 422, 451, 499 };

    for (size_t i = 0; i < sizeof(st) / sizeof(st[0]); i++)
        check_http(st[i], NULL, T_EXAMPLE, OUTCOME_FAIL_FAST, REASON_HTTP_4XX, -1);
    check_http(400, "5", T_EXAMPLE, OUTCOME_FAIL_FAST, REASON_HTTP_4XX, -1);
}
END_TEST

START_TEST(test_outcome__http_unexpected_status)
{
    static const int st[] = { 100, 101, 199, 300, 301, 302, 304, 307, 399, 0, -1, 99, 600, 999 };

    for (size_t i = 0; i < sizeof(st) / sizeof(st[0]); i++)
        check_http(st[i], NULL, T_EXAMPLE, OUTCOME_TRANSIENT, REASON_BAD_RESPONSE, -1);
    check_http(301, "5", T_EXAMPLE, OUTCOME_TRANSIENT, REASON_BAD_RESPONSE, -1);
}
END_TEST

START_TEST(test_outcome__from_reason_table)
{
    struct outcome o;

    for (int r = 0; r < OUTCOME_REASON_COUNT; r++) {
        enum outcome_kind want;
        switch (r) {
        case REASON_NONE:
            want = OUTCOME_SUCCESS;
            break;
        case REASON_HTTP_429:
            want = OUTCOME_RATE_LIMITED;
            break;
        case REASON_HTTP_4XX:
        case REASON_CANCELLED:
            want = OUTCOME_FAIL_FAST;
            break;
        default:
            want = OUTCOME_TRANSIENT;
            break;
        }
        memset(&o, 0x5a, sizeof(o));
        outcome_from_reason(&o, (enum outcome_reason)r);
        ck_assert_msg(o.kind == want, "%s: kind %s", outcome_reason_name((enum outcome_reason)r),
                      outcome_kind_name(o.kind));
        ck_assert_int_eq(o.reason, r);
        ck_assert_int_eq(o.http_status, 0);
        ck_assert(o.retry_after_s < 0);
    }
    /* Transport failures are all retryable. */
    outcome_from_reason(&o, REASON_TTFT_TIMEOUT);
    ck_assert_int_eq(o.kind, OUTCOME_TRANSIENT);
    outcome_from_reason(&o, REASON_TRUNCATED);
    ck_assert_int_eq(o.kind, OUTCOME_TRANSIENT);
    outcome_from_reason(&o, (enum outcome_reason)OUTCOME_REASON_COUNT);
    ck_assert_int_eq(o.reason, REASON_BAD_RESPONSE);
    ck_assert_int_eq(o.kind, OUTCOME_TRANSIENT);
}
END_TEST

START_TEST(test_outcome__names_stable)
{
    static const char *const want[OUTCOME_REASON_COUNT] = {
        "none",
        "connect_timeout",
        "ttft_timeout",
        "idle_timeout",
        "total_timeout",
        "dns_timeout",
        "dns_failed",
        "connect_failed",
        "connection_reset",
        "truncated",
        "http_5xx",
        "http_408",
        "http_409",
        "http_429",
        "http_4xx",
        "bad_response",
        "tls",
        "cancelled",
    };

    ck_assert_str_eq(outcome_reason_name(REASON_NONE), "none");
    ck_assert_str_eq(outcome_reason_name(REASON_CONNECTION_RESET), "connection_reset");
    ck_assert_str_eq(outcome_reason_name(REASON_HTTP_5XX), "http_5xx");
    ck_assert_str_eq(outcome_reason_name(REASON_CANCELLED), "cancelled");
    for (int r = 0; r < OUTCOME_REASON_COUNT; r++) {
        const char *n = outcome_reason_name((enum outcome_reason)r);
        ck_assert_str_eq(n, want[r]);
        for (const char *c = n; *c; c++)
            ck_assert_msg((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_', "%s",
                          n);
        for (int q = 0; q < r; q++)
            ck_assert_str_ne(n, outcome_reason_name((enum outcome_reason)q));
    }
    ck_assert_str_eq(outcome_reason_name((enum outcome_reason)OUTCOME_REASON_COUNT), "unknown");
    ck_assert_str_eq(outcome_reason_name((enum outcome_reason) - 1), "unknown");

    ck_assert_str_eq(outcome_kind_name(OUTCOME_SUCCESS), "success");
    ck_assert_str_eq(outcome_kind_name(OUTCOME_RATE_LIMITED), "rate_limited");
    ck_assert_str_eq(outcome_kind_name(OUTCOME_TRANSIENT), "transient");
    ck_assert_str_eq(outcome_kind_name(OUTCOME_FAIL_FAST), "fail_fast");
    ck_assert_str_eq(outcome_kind_name((enum outcome_kind)4), "unknown");
    ck_assert_str_eq(outcome_kind_name((enum outcome_kind) - 1), "unknown");
}
END_TEST

START_TEST(test_outcome__retry_after_seconds)
{
    check_ra("0", T_EXAMPLE, 0);
    check_ra("1", T_EXAMPLE, 1);
    check_ra("120", T_EXAMPLE, 120);
    check_ra("007", T_EXAMPLE, 7);
    check_ra(" 30\t", T_EXAMPLE, 30);
    check_ra("86400", T_EXAMPLE, 86400);
    /* Delta-seconds do not depend on now. */
    check_ra("42", 0, 42);
    check_ra("42", T_2026, 42);
}
END_TEST

START_TEST(test_outcome__retry_after_decimal)
{
    check_ra("1.5", T_EXAMPLE, 1.5);
    check_ra("0.25", T_EXAMPLE, 0.25);
    check_ra("10.0", T_EXAMPLE, 10);
    check_ra("1.", T_EXAMPLE, -1);
    check_ra(".5", T_EXAMPLE, -1);
    check_ra("1.2.3", T_EXAMPLE, -1);
    check_ra("1,5", T_EXAMPLE, -1); /* no locale decimal comma */
}
END_TEST

START_TEST(test_outcome__retry_after_imf_fixdate)
{
    check_ra("Sun, 06 Nov 1994 08:49:37 GMT", T_EXAMPLE - 120, 120);
    check_ra("Sun, 06 Nov 1994 08:49:37 GMT", T_EXAMPLE - 0.5, 0.5);
    check_ra("Thu, 01 Jan 2026 00:00:00 GMT", T_2026 - 3600, 3600);
    check_ra("  Thu, 01 Jan 2026 00:00:00 GMT ", T_2026 - 1, 1);
    /* Names match case-insensitively, in C whatever the locale. */
    check_ra("THU, 01 JAN 2026 00:00:00 GMT", T_2026 - 1, 1);
    /* Leap day and the end of a month. */
    check_ra("Thu, 29 Feb 2024 00:00:10 GMT", 1709164800.0, 10);
    check_ra("Sat, 31 Dec 2033 23:59:59 GMT", 2019686399.0 - 9, 9);
}
END_TEST

START_TEST(test_outcome__retry_after_rfc850)
{
    check_ra("Sunday, 06-Nov-94 08:49:37 GMT", T_EXAMPLE - 120, 120);
    /* Two-digit years: "26" seen at the end of 2025 is 2026 ... */
    check_ra("Thursday, 01-Jan-26 00:00:00 GMT", T_2026 - 60, 60);
    /* ... and "94" seen in 2025 is 1994 (2094 is > 50 years ahead): past. */
    check_ra("Sunday, 06-Nov-94 08:49:37 GMT", T_2026, 0);
    check_ra("Sunday, 06-Nov-94 08:49:37 GMT", T_2026 - 60, 0);
}
END_TEST

START_TEST(test_outcome__retry_after_asctime)
{
    check_ra("Sun Nov  6 08:49:37 1994", T_EXAMPLE - 120, 120);
    check_ra("Sun Nov 06 08:49:37 1994", T_EXAMPLE - 120, 120);
    check_ra("Thu Jan  1 00:00:00 2026", T_2026 - 5, 5);
    check_ra("Thu Jan 01 00:00:00 2026", T_2026 - 5, 5);
    /* Day 16: two digits, no padding space. */
    check_ra("Wed Nov 16 08:49:37 1994", T_EXAMPLE + 10 * 86400.0 - 7, 7);
}
END_TEST

START_TEST(test_outcome__retry_after_past_date_is_zero)
{
    check_ra("Sun, 06 Nov 1994 08:49:37 GMT", T_EXAMPLE, 0);
    check_ra("Sun, 06 Nov 1994 08:49:37 GMT", T_EXAMPLE + 1, 0);
    check_ra("Sun, 06 Nov 1994 08:49:37 GMT", T_2026, 0);
    check_ra("Sun Nov  6 08:49:37 1994", T_2026, 0);
    check_ra("Thu, 01 Jan 1970 00:00:00 GMT", T_EXAMPLE, 0);
}
END_TEST

START_TEST(test_outcome__retry_after_huge_clamped)
{
    check_ra("86401", T_EXAMPLE, OUTCOME_RETRY_AFTER_MAX_S);
    check_ra("999999999999999999999999999999", T_EXAMPLE, OUTCOME_RETRY_AFTER_MAX_S);
    check_ra("Fri, 01 Jan 9999 00:00:00 GMT", T_EXAMPLE, OUTCOME_RETRY_AFTER_MAX_S);
    check_ra("Thu, 01 Jan 2026 00:00:00 GMT", T_2026 - 2 * 86400.0, OUTCOME_RETRY_AFTER_MAX_S);
}
END_TEST

START_TEST(test_outcome__retry_after_garbage)
{
    static const char *const bad[] = {
        "",
        "   ",
        "abc",
        "-1",
        "-0",
        "+5",
        "1e3",
        "5s",
        "5 s",
        "0x10",
        "inf",
        "nan",
        "Infinity",
        /* malformed dates */
        "Sun, 06 Nov 1994 08:49:37 PST",
        "Sun, 06 Nov 1994 08:49:37",
        "Sun, 06 Nov 1994 08:49:37 GMT x",
        "Sun, 6 Nov 1994 08:49:37 GMT",
        "Sun,06 Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 94 08:49:37 GMT",
        "Sun, 06 Nov 1994 8:49:37 GMT",
        "Sun, 06 Novem 1994 08:49:37 GMT",
        "Foo, 06 Nov 1994 08:49:37 GMT",
        "Sunday, 06 Nov 1994 08:49:37 GMT",
        "Sun, 06-Nov-94 08:49:37 GMT",
        "Sunday, 06-Nov-1994 08:49:37 GMT",
        "Sunday, 06-Nov-94 08:49:37",
        "Sun Nov 6 08:49:37 1994",
        "Sun Nov  6 08:49:37 94",
        "Sun Nov  6 08:49:37 1994 GMT",
        "Sun Nov   6 08:49:37 1994",
        /* out-of-range fields */
        "Sun, 00 Nov 1994 08:49:37 GMT",
        "Sun, 31 Nov 1994 08:49:37 GMT",
        "Wed, 29 Feb 2023 00:00:00 GMT",
        "Mon, 29 Feb 2100 00:00:00 GMT",
        "Sun, 06 Nov 1994 24:00:00 GMT",
        "Sun, 06 Nov 1994 08:60:00 GMT",
        "Sun, 06 Nov 1994 08:49:61 GMT",
        "Sun, 06 Nov 1994 08:49:37 GMT\n",
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        check_ra(bad[i], T_EXAMPLE, -1);
    check_ra(NULL, T_EXAMPLE, -1);
    /* A date cannot be resolved against a non-finite now. */
    check_ra("Sun, 06 Nov 1994 08:49:37 GMT", INFINITY, -1);
    check_ra("Sun, 06 Nov 1994 08:49:37 GMT", NAN, -1);
    /* A leap second and the year 2000 (divisible by 400) are valid. */
    check_ra("Sun, 06 Nov 1994 08:49:60 GMT", T_EXAMPLE, 23);
    check_ra("Tue, 29 Feb 2000 00:00:00 GMT", 951782400.0 - 1, 1);
}
END_TEST

Suite *outcome_suite(void)
{
    Suite *s = suite_create("outcome");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_outcome__http_2xx_success);
    tcase_add_test(tc, test_outcome__http_429_rate_limited);
    tcase_add_test(tc, test_outcome__http_408_409_transient);
    tcase_add_test(tc, test_outcome__http_5xx_transient);
    tcase_add_test(tc, test_outcome__http_4xx_fail_fast);
    tcase_add_test(tc, test_outcome__http_unexpected_status);
    tcase_add_test(tc, test_outcome__from_reason_table);
    tcase_add_test(tc, test_outcome__names_stable);
    tcase_add_test(tc, test_outcome__retry_after_seconds);
    tcase_add_test(tc, test_outcome__retry_after_decimal);
    tcase_add_test(tc, test_outcome__retry_after_imf_fixdate);
    tcase_add_test(tc, test_outcome__retry_after_rfc850);
    tcase_add_test(tc, test_outcome__retry_after_asctime);
    tcase_add_test(tc, test_outcome__retry_after_past_date_is_zero);
    tcase_add_test(tc, test_outcome__retry_after_huge_clamped);
    tcase_add_test(tc, test_outcome__retry_after_garbage);
    suite_add_tcase(s, tc);
    return s;
}
