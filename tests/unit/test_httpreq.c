/*
 * test_httpreq.c — the HTTP front's request reader (sidecar/http/httpreq.c)
 * over whole and split inputs: what a request yields (target, kept headers,
 * body without chunked framing), pipelining, the malformed heads it refuses
 * with 400, and its bounds (414, 431, 413).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/httpreq.h"
#include "suites.h"

/* What the hooks saw. */
struct seen {
    int begins, heads, stop_at_head;
    bool has_body, keep_alive, json; /* as the head hook saw them */
    char body[256];
    size_t body_len;
};

static void on_begin(struct httpreq *r)
{
    struct seen *s = r->owner;
    s->begins++;
    s->body_len = 0;
}

static int on_head(struct httpreq *r)
{
    struct seen *s = r->owner;
    s->heads++;
    s->has_body = httpreq_has_body(r);
    s->keep_alive = httpreq_keep_alive(r);
    s->json = httpreq_ctype_is_json(r);
    return s->stop_at_head ? 1 : 0;
}

static int on_body(struct httpreq *r, const char *at, size_t n)
{
    struct seen *s = r->owner;
    ck_assert_uint_le(s->body_len + n, sizeof(s->body));
    memcpy(s->body + s->body_len, at, n);
    s->body_len += n;
    return 0;
}

static const struct httpreq_ops ops = { on_begin, on_head, on_body };

static void reader(struct httpreq *r, struct seen *s)
{
    memset(s, 0, sizeof(*s));
    httpreq_init(r, &ops, s);
    r->max_header_bytes = 1024;
    r->max_body_bytes = 64;
}

/* Feeds `in` in pieces of `step` bytes (the unused rest first, as http.c
 * does) until a request completes or fails; *used: bytes used in all. */
static enum httpreq_rc feed(struct httpreq *r, const char *in, size_t n, size_t step, size_t *used)
{
    size_t have = 0, off = 0;
    enum httpreq_rc rc = HTTPREQ_MORE;

    while (rc == HTTPREQ_MORE && have < n) {
        have = have + step < n ? have + step : n;
        size_t k = 0;
        rc = httpreq_execute(r, in + off, have - off, &k);
        off += k;
    }
    *used = off;
    return rc;
}

START_TEST(test_httpreq__pipelined_requests_read_one_at_a_time)
{
    static const char in[] = "POST /v1/chat/completions HTTP/1.1\r\n"
                             "Host: localhost:8080\r\n"
                             "Content-Type: application/json; charset=utf-8\r\n"
                             "X-Unknown: ignored\r\n"
                             "Content-Length: 7\r\n"
                             "\r\n"
                             "{\"a\":1}"
                             "GET /healthz HTTP/1.1\r\n"
                             "Host: localhost\r\n"
                             "Connection: close\r\n"
                             "\r\n";
    size_t n = sizeof(in) - 1;

    /* Whole, then byte by byte, then 7 at a time: the same two requests. */
    static const size_t steps[] = { sizeof(in), 1, 7 };
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        struct httpreq r;
        struct seen s;
        size_t used;

        reader(&r, &s);
        ck_assert_int_eq(feed(&r, in, n, steps[i], &used), HTTPREQ_DONE);
        ck_assert_str_eq(r.url, "/v1/chat/completions");
        ck_assert_int_eq(r.parser.method, HTTP_POST);
        ck_assert(r.present[HRQ_HOST]);
        ck_assert_str_eq(r.val[HRQ_HOST], "localhost:8080");
        ck_assert(s.json);
        ck_assert(s.has_body);
        ck_assert(s.keep_alive);
        ck_assert_uint_eq(s.body_len, 7);
        ck_assert(memcmp(s.body, "{\"a\":1}", 7) == 0);
        /* The second request starts right where the first ended. */
        ck_assert(memcmp(in + used, "GET /healthz", 12) == 0);
        size_t used2;
        ck_assert_int_eq(feed(&r, in + used, n - used, steps[i], &used2), HTTPREQ_DONE);
        ck_assert_uint_eq(used + used2, n);
        ck_assert_str_eq(r.url, "/healthz");
        ck_assert(!r.present[HRQ_CTYPE]); /* nothing kept from the first */
        ck_assert(!s.has_body);
        ck_assert(!s.keep_alive);
        ck_assert_int_eq(s.begins, 2);
        ck_assert_int_eq(s.heads, 2);
    }
}
END_TEST

START_TEST(test_httpreq__chunked_body_loses_its_framing_and_trailers)
{
    static const char in[] = "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                             "3\r\nabc\r\n"
                             "a;ext=1\r\n0123456789\r\n"
                             "0\r\nContent-Type: text/evil\r\n\r\n";
    struct httpreq r;
    struct seen s;
    size_t used;

    for (size_t step = 1; step <= sizeof(in); step += 13) {
        reader(&r, &s);
        ck_assert_int_eq(feed(&r, in, sizeof(in) - 1, step, &used), HTTPREQ_DONE);
        ck_assert_uint_eq(used, sizeof(in) - 1);
        ck_assert_uint_eq(s.body_len, 13);
        ck_assert(memcmp(s.body, "abc0123456789", 13) == 0);
        ck_assert_uint_eq(r.body_len, 13);
        /* The trailer never became a header. */
        ck_assert(!r.present[HRQ_CTYPE]);
    }
}
END_TEST

/* The status a head is refused with, read whole and byte by byte (the same
 * either way); the head hook never ran. */
static size_t max_head = 1024;

static int refused(const char *in)
{
    int status = 0;

    for (size_t step = 1; step <= strlen(in); step += strlen(in) - 1) {
        struct httpreq r;
        struct seen s;
        size_t used;
        reader(&r, &s);
        r.max_header_bytes = max_head;
        ck_assert_msg(feed(&r, in, strlen(in), step, &used) == HTTPREQ_FAIL, "accepted: %s", in);
        ck_assert_int_eq(s.heads, 0);
        ck_assert_msg(status == 0 || status == r.status, "%s: %d then %d", in, status, r.status);
        status = r.status;
    }
    return status;
}

START_TEST(test_httpreq__malformed_heads_are_refused)
{
    /* A space before the colon (RFC 9112 5.1). */
    ck_assert_int_eq(refused("GET / HTTP/1.1\r\nHost: a\r\nContent-Length : 5\r\n\r\nhello"), 400);
    /* obs-fold: a line starting with white space (5.2). */
    ck_assert_int_eq(refused("GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n  continued\r\n\r\n"), 400);
    ck_assert_int_eq(refused("GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n\tcontinued\r\n\r\n"), 400);
    /* A CR not followed by LF (2.2). */
    ck_assert_int_eq(refused("GET / HTTP/1.1\r\nHost: a\rX-B: 2\r\n\r\n"), 400);
    /* Not HTTP at all; a name that is not a token. */
    ck_assert_int_eq(refused("HELLO\r\n\r\n"), 400);
    ck_assert_int_eq(refused("GET / HTTP/1.1\r\nBad Name: 1\r\n\r\n"), 400);
    /* Two different lengths: request smuggling. */
    ck_assert_int_eq(
        refused("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"),
        400);
}
END_TEST

START_TEST(test_httpreq__bounds_give_414_431_413)
{
    char big[4096];

    /* A target longer than HTTPREQ_URL_MAX. */
    int n = snprintf(big, sizeof(big), "GET /%0*d HTTP/1.1\r\nHost: a\r\n\r\n", HTTPREQ_URL_MAX, 0);
    ck_assert_int_lt(n, (int)sizeof(big));
    max_head = sizeof(big); /* the head bound is not what refuses it */
    ck_assert_int_eq(refused(big), 414);
    max_head = 1024;
    /* A head longer than max_header_bytes (1024 here). */
    snprintf(big, sizeof(big), "GET / HTTP/1.1\r\nHost: a\r\nX-Pad: %01100d\r\n\r\n", 0);
    ck_assert_int_eq(refused(big), 431);
    /* A Content-Length past max_body_bytes (64): refused at the head. */
    ck_assert_int_eq(refused("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 65\r\n\r\n"), 413);

    /* A chunked body that grows past the bound: refused once it does, after
     * the head was accepted. */
    struct httpreq r;
    struct seen s;
    size_t used;
    reader(&r, &s);
    n = snprintf(big, sizeof(big),
                 "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "40\r\n%064d\r\n1\r\nx\r\n0\r\n\r\n",
                 0);
    ck_assert_int_eq(feed(&r, big, (size_t)n, (size_t)n, &used), HTTPREQ_FAIL);
    ck_assert_int_eq(r.status, 413);
    ck_assert_int_eq(s.heads, 1);
    ck_assert_uint_le(s.body_len, 64);

    /* Exactly at the bounds is fine. */
    reader(&r, &s);
    n = snprintf(big, sizeof(big), "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 64\r\n\r\n%064d",
                 0);
    ck_assert_int_eq(feed(&r, big, (size_t)n, 5, &used), HTTPREQ_DONE);
    ck_assert_uint_eq(s.body_len, 64);
}
END_TEST

START_TEST(test_httpreq__long_values_are_flagged_not_cut)
{
    char in[1024];
    struct httpreq r;
    struct seen s;
    size_t used;

    snprintf(in, sizeof(in), "GET / HTTP/1.1\r\nHost: a\r\nX-Polygw-App: %0*d\r\n\r\n",
             HTTPREQ_VAL_MAX + 1, 0);
    reader(&r, &s);
    ck_assert_int_eq(feed(&r, in, strlen(in), strlen(in), &used), HTTPREQ_DONE);
    ck_assert_int_eq(r.over, HRQ_APP);
    ck_assert_str_eq(r.val[HRQ_APP], ""); /* nothing of it is kept */

    /* The head hook can stop the reading. */
    reader(&r, &s);
    s.stop_at_head = 1;
    static const char two[] = "GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /b HTTP/1.1\r\n\r\n";
    ck_assert_int_eq(feed(&r, two, sizeof(two) - 1, sizeof(two), &used), HTTPREQ_STOP);
    ck_assert_str_eq(r.url, "/a");
    ck_assert_int_eq(s.heads, 1);
}
END_TEST

START_TEST(test_httpreq__tracestate_lines_are_one_list)
{
    struct httpreq r;
    struct seen s;
    size_t used;

    static const char in[] = "GET / HTTP/1.1\r\nHost: a\r\ntracestate: a=1\r\n"
                             "X-Other: 1\r\nTraceState: b=2\r\n"
                             "X-Polygw-App: one\r\nX-Polygw-App: two\r\n\r\n";
    static const size_t steps[] = { sizeof(in), 1, 5 };
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        reader(&r, &s);
        ck_assert_int_eq(feed(&r, in, sizeof(in) - 1, steps[i], &used), HTTPREQ_DONE);
        ck_assert_str_eq(r.val[HRQ_TRACESTATE], "a=1,b=2");
        ck_assert_str_eq(r.val[HRQ_APP], "two"); /* others: the last one wins */
    }

    /* Too long in all: none of it. */
    char big[1024];
    snprintf(big, sizeof(big), "GET / HTTP/1.1\r\ntracestate: a=%0*d\r\ntracestate: b=1\r\n\r\n",
             HTTPREQ_VAL_MAX - 3, 0);
    reader(&r, &s);
    ck_assert_int_eq(feed(&r, big, strlen(big), strlen(big), &used), HTTPREQ_DONE);
    ck_assert(r.present[HRQ_TRACESTATE]);
    ck_assert_str_eq(r.val[HRQ_TRACESTATE], "");
    ck_assert_int_eq(r.over, HRQ_NONE); /* dropped, never refused */
}
END_TEST

START_TEST(test_httpreq__values_lose_surrounding_spaces)
{
    struct httpreq r;
    struct seen s;
    size_t used;

    static const char in[] =
        "GET / HTTP/1.1\r\nHost:  a \t\r\n"
        "traceparent: \t00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01   \r\n"
        "tracestate: a=1 \r\ntracestate:  \r\ntracestate: b = 2\t\r\n"
        "X-Polygw-App: my app \r\n\r\n";
    static const size_t steps[] = { sizeof(in), 1, 3 };
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        reader(&r, &s);
        ck_assert_int_eq(feed(&r, in, sizeof(in) - 1, steps[i], &used), HTTPREQ_DONE);
        ck_assert_str_eq(r.val[HRQ_HOST], "a");
        ck_assert_str_eq(r.val[HRQ_TRACEPARENT],
                         "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        ck_assert_str_eq(r.val[HRQ_TRACESTATE], "a=1,b = 2");
        ck_assert_str_eq(r.val[HRQ_APP], "my app"); /* inner spaces kept */
    }
}
END_TEST

Suite *httpreq_suite(void)
{
    Suite *s = suite_create("httpreq");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_httpreq__pipelined_requests_read_one_at_a_time);
    tcase_add_test(tc, test_httpreq__chunked_body_loses_its_framing_and_trailers);
    tcase_add_test(tc, test_httpreq__malformed_heads_are_refused);
    tcase_add_test(tc, test_httpreq__bounds_give_414_431_413);
    tcase_add_test(tc, test_httpreq__long_values_are_flagged_not_cut);
    tcase_add_test(tc, test_httpreq__tracestate_lines_are_one_list);
    tcase_add_test(tc, test_httpreq__values_lose_surrounding_spaces);
    suite_add_tcase(s, tc);
    return s;
}
