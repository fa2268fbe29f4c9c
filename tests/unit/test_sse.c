/* test_sse.c — the SSE parser against the WHATWG event-stream rules.
 *
 * Every stream of the table-driven cases is fed whole, split in two at every
 * point, split in three at every pair of points (short streams), and byte by
 * byte; each way must produce the same events, return code and idleness. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sse.h"
#include "suites.h"

#define MAX_EVENTS 64

struct rec_event {
    char *event;
    char *data;
    size_t data_len;
    char *id;
    int64_t retry_ms;
};

struct rec {
    struct rec_event ev[MAX_EVENTS];
    size_t n;
    size_t
        abort_after; /* return abort_rc from the callback for event #abort_after (1-based), 0: never */
    int abort_rc;
};

static char *dup_n(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p == NULL)
        ck_abort_msg("out of memory");
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

static int rec_cb(const struct sse_event *ev, void *ud)
{
    struct rec *r = ud;

    if (r->n >= MAX_EVENTS)
        ck_abort_msg("more than %d events", MAX_EVENTS);
    /* The parser promises NUL termination at every length. */
    if (ev->event[ev->event_len] != '\0' || ev->data[ev->data_len] != '\0' ||
        ev->id[ev->id_len] != '\0')
        ck_abort_msg("event strings not NUL-terminated");
    r->ev[r->n].event = dup_n(ev->event, ev->event_len);
    r->ev[r->n].data = dup_n(ev->data, ev->data_len);
    r->ev[r->n].data_len = ev->data_len;
    r->ev[r->n].id = dup_n(ev->id, ev->id_len);
    r->ev[r->n].retry_ms = ev->retry_ms;
    r->n++;
    if (r->abort_after != 0 && r->n == r->abort_after)
        return r->abort_rc;
    return 0;
}

static void rec_clear(struct rec *r)
{
    for (size_t i = 0; i < r->n; i++) {
        free(r->ev[i].event);
        free(r->ev[i].data);
        free(r->ev[i].id);
    }
    r->n = 0;
}

/* An expected event; data is compared with strlen unless data_len is set. */
struct want {
    const char *event;
    const char *data;
    const char *id;
    int64_t retry_ms;
    size_t data_len;
};

struct result {
    int rc;
    bool idle;
};

/* Feeds `s` cut at the given points (sorted, in 1..len-1), stopping at the
 * first non-zero return. */
static struct result feed_cuts(struct rec *r, size_t max, const char *s, size_t len,
                               const size_t *cuts, size_t ncuts)
{
    struct sse_parser p;
    struct result res = { 0, false };
    size_t from = 0;

    if (sse_parser_init(&p, max) != 0)
        ck_abort_msg("init");
    for (size_t i = 0; i <= ncuts && res.rc == 0; i++) {
        size_t to = i < ncuts ? cuts[i] : len;
        res.rc = sse_parser_feed(&p, s + from, to - from, rec_cb, r);
        from = to;
    }
    res.idle = sse_parser_is_idle(&p);
    sse_parser_fini(&p);
    return res;
}

static struct result feed_bytes(struct rec *r, size_t max, const char *s, size_t len)
{
    struct sse_parser p;
    struct result res = { 0, false };

    if (sse_parser_init(&p, max) != 0)
        ck_abort_msg("init");
    for (size_t i = 0; i < len && res.rc == 0; i++)
        res.rc = sse_parser_feed(&p, s + i, 1, rec_cb, r);
    res.idle = sse_parser_is_idle(&p);
    sse_parser_fini(&p);
    return res;
}

/* Plain comparisons with ck_abort_msg only on a mismatch: every passing
 * ck_assert records a checkpoint through Check's pipe, which would dominate
 * the run time of thousands of splits. */
#define EXPECT(cond, ...)              \
    do {                               \
        if (!(cond))                   \
            ck_abort_msg(__VA_ARGS__); \
    } while (0)

static void check_rec(const struct rec *r, const struct want *w, size_t nw,
                      const struct result *res, int want_rc, bool want_idle, const char *how)
{
    EXPECT(res->rc == want_rc, "%s: rc %d, want %d", how, res->rc, want_rc);
    if (want_rc == 0)
        EXPECT(res->idle == want_idle, "%s: idle %d, want %d", how, res->idle, want_idle);
    EXPECT(r->n == nw, "%s: %zu events, want %zu", how, r->n, nw);
    for (size_t i = 0; i < nw; i++) {
        size_t dl = w[i].data_len ? w[i].data_len : strlen(w[i].data);
        EXPECT(strcmp(r->ev[i].event, w[i].event) == 0, "%s: event #%zu name '%s', want '%s'", how,
               i, r->ev[i].event, w[i].event);
        EXPECT(r->ev[i].data_len == dl && memcmp(r->ev[i].data, w[i].data, dl) == 0,
               "%s: event #%zu data '%s' (%zu), want '%s' (%zu)", how, i, r->ev[i].data,
               r->ev[i].data_len, w[i].data, dl);
        EXPECT(strcmp(r->ev[i].id, w[i].id) == 0, "%s: event #%zu id '%s', want '%s'", how, i,
               r->ev[i].id, w[i].id);
        EXPECT(r->ev[i].retry_ms == w[i].retry_ms, "%s: event #%zu retry %lld, want %lld", how, i,
               (long long)r->ev[i].retry_ms, (long long)w[i].retry_ms);
    }
}

/* The heart of the suite: every way of cutting `s` gives the same result. */
static void run_case_max(const char *s, size_t len, size_t max, const struct want *w, size_t nw,
                         int want_rc, bool want_idle)
{
    struct rec r = { 0 };
    struct result res;
    char how[64];

    res = feed_cuts(&r, max, s, len, NULL, 0);
    check_rec(&r, w, nw, &res, want_rc, want_idle, "whole");
    rec_clear(&r);

    for (size_t a = 1; a < len; a++) {
        size_t cut[1] = { a };
        res = feed_cuts(&r, max, s, len, cut, 1);
        snprintf(how, sizeof(how), "split at %zu", a);
        check_rec(&r, w, nw, &res, want_rc, want_idle, how);
        rec_clear(&r);
    }

    if (len <= 80) {
        for (size_t a = 1; a < len; a++) {
            for (size_t b = a + 1; b < len; b++) {
                size_t cut[2] = { a, b };
                res = feed_cuts(&r, max, s, len, cut, 2);
                snprintf(how, sizeof(how), "split at %zu,%zu", a, b);
                check_rec(&r, w, nw, &res, want_rc, want_idle, how);
                rec_clear(&r);
            }
        }
    }

    res = feed_bytes(&r, max, s, len);
    check_rec(&r, w, nw, &res, want_rc, want_idle, "byte by byte");
    rec_clear(&r);
}

#define NW(a) (sizeof(a) / sizeof((a)[0]))
#define BIG   4096

static void run_case(const char *s, const struct want *w, size_t nw, bool want_idle)
{
    run_case_max(s, strlen(s), BIG, w, nw, 0, want_idle);
}

static void run_case_lim(const char *s, size_t max, const struct want *w, size_t nw, int want_rc,
                         bool want_idle)
{
    run_case_max(s, strlen(s), max, w, nw, want_rc, want_idle);
}

START_TEST(test_sse__single_event)
{
    static const struct want w[] = { { "message", "hello", "", -1, 0 } };
    run_case("data: hello\n\n", w, NW(w), true);
}
END_TEST

START_TEST(test_sse__several_events_one_chunk)
{
    static const struct want w[] = {
        { "message", "one", "", -1, 0 },
        { "message", "two", "", -1, 0 },
        { "message", "three", "", -1, 0 },
    };
    run_case("data: one\n\ndata: two\n\ndata: three\n\n", w, NW(w), true);
}
END_TEST

START_TEST(test_sse__multiline_data_joined)
{
    static const struct want w[] = {
        { "message", "a\nb\nc", "", -1, 0 },
        { "message", "x\n", "", -1, 0 }, /* an empty data line adds an empty line */
    };
    run_case("data: a\ndata: b\ndata:c\n\ndata: x\ndata\n\n", w, NW(w), true);
}
END_TEST

START_TEST(test_sse__crlf_endings)
{
    static const struct want w[] = {
        { "message", "a\nb", "", -1, 0 },
        { "message", "c", "", -1, 0 },
    };
    /* A CR cut from its LF (any split after a '\r') must stay one line end. */
    run_case("data: a\r\ndata: b\r\n\r\ndata: c\r\n\r\n", w, NW(w), true);
}
END_TEST

START_TEST(test_sse__cr_endings)
{
    static const struct want w[] = {
        { "message", "a\nb", "", -1, 0 },
        { "message", "c", "", -1, 0 },
    };
    run_case("data: a\rdata: b\r\rdata: c\r\r", w, NW(w), true);
}
END_TEST

START_TEST(test_sse__mixed_endings)
{
    static const struct want w[] = {
        { "message", "a\nb\nc", "", -1, 0 },
        { "message", "d", "", -1, 0 },
        { "message", "e", "", -1, 0 },
    };
    /* "\n\r" is LF then CR: two line ends, i.e. the blank line. */
    run_case("data: a\rdata: b\r\ndata: c\n\r\ndata: d\n\rdata: e\r\n\n", w, NW(w), true);
}
END_TEST

START_TEST(test_sse__cr_then_lf_across_feeds)
{
    struct sse_parser p;
    struct rec r = { 0 };

    ck_assert_int_eq(sse_parser_init(&p, BIG), 0);
    ck_assert_int_eq(sse_parser_feed(&p, "data: a\r", 8, rec_cb, &r), 0);
    ck_assert_int_eq(sse_parser_feed(&p, "\n", 1, rec_cb, &r), 0);
    ck_assert_uint_eq(r.n, 0); /* no spurious blank line from the split CRLF */
    ck_assert_int_eq(sse_parser_feed(&p, "\r", 1, rec_cb, &r), 0);
    ck_assert_uint_eq(r.n, 1); /* a CR alone is a line end: dispatch now */
    ck_assert_int_eq(sse_parser_feed(&p, "\ndata: b\r", 9, rec_cb, &r), 0);
    ck_assert_uint_eq(r.n, 1); /* the LF only completed the CRLF */
    ck_assert(!sse_parser_is_idle(&p));
    ck_assert_int_eq(sse_parser_feed(&p, "\r", 1, rec_cb, &r), 0);
    ck_assert_uint_eq(r.n, 2);
    ck_assert_str_eq(r.ev[0].data, "a");
    ck_assert_str_eq(r.ev[1].data, "b");
    ck_assert(sse_parser_is_idle(&p));
    /* Empty feeds change nothing, even right after a CR. */
    ck_assert_int_eq(sse_parser_feed(&p, NULL, 0, rec_cb, &r), 0);
    ck_assert(sse_parser_is_idle(&p));
    sse_parser_fini(&p);
    rec_clear(&r);
}
END_TEST

START_TEST(test_sse__comments_ignored)
{
    static const struct want w[] = { { "message", "x", "", -1, 0 } };
    run_case(": hello\n:\ndata: x\n: in the middle\n\n: keep-alive\n\n:\n\n", w, NW(w), true);
}
END_TEST

START_TEST(test_sse__comment_lines_keep_idle)
{
    run_case(": ping\n", NULL, 0, true);
    run_case(":\r\n:\r\n", NULL, 0, true);
}
END_TEST

START_TEST(test_sse__field_without_colon)
{
    static const struct want w[] = {
        { "message", "", "", -1, 0 }, /* "data" alone == "data:" → one empty data line */
        { "message", "x", "", -1, 0 },
    };
    /* "event" alone sets an empty name: "message"; "id" alone resets the ID. */
    run_case("data\n\nid: 7\nevent\nid\ndata: x\n\n", w, NW(w), true);
}
END_TEST

START_TEST(test_sse__single_leading_space_stripped)
{
    static const struct want w[] = {
        { "message", "nospace", "", -1, 0 }, { "message", " two", "", -1, 0 },
        { "message", "\ttab", "", -1, 0 },   { "message", "trail ", "", -1, 0 },
        { "message", "a: b:c", "", -1, 0 }, /* only the first colon splits */
    };
    run_case("data:nospace\n\ndata:  two\n\ndata:\ttab\n\ndata: trail \n\ndata: a: b:c\n\n", w,
             NW(w), true);
}
END_TEST

START_TEST(test_sse__empty_data_not_dispatched)
{
    static const struct want w[] = {
        { "message", "", "1", -1, 0 }, /* a data field, even empty, makes an event */
        { "message", "z", "1", -1, 0 },
    };
    /* Blocks without any data field: nothing (their id still sticks). The
     * event name is reset. */
    run_case("event: ping\n\nid: 1\n\n\n\n\r\n:x\n\ndata:\n\ndata: z\n\n", w, NW(w), true);
}
END_TEST

START_TEST(test_sse__event_name)
{
    static const struct want w[] = {
        { "content_block_delta", "{}", "", -1, 0 },
        { "message", "reset", "", -1, 0 }, /* name does not carry over */
        { "message", "empty", "", -1, 0 }, /* empty name = "message" */
        { "second", "last-wins", "", -1, 0 },
    };
    run_case("event: content_block_delta\ndata: {}\n\ndata: reset\n\nevent:\ndata: empty\n\n"
             "event: first\ndata: last-wins\nevent: second\n\n",
             w, NW(w), true);
}
END_TEST

START_TEST(test_sse__id_persists)
{
    static const struct want w[] = {
        { "message", "a", "1", -1, 0 }, { "message", "b", "1", -1, 0 }, /* last event ID persists */
        { "message", "c", "2", -1, 0 }, /* an id in a non-dispatched block still counts */
        { "message", "d", "", -1, 0 },  /* "id:" resets it */
        { "message", "e", "", -1, 0 },
    };
    run_case("id: 1\ndata: a\n\ndata: b\n\nid: 2\n\ndata: c\n\nid:\ndata: d\n\ndata: e\n\n", w,
             NW(w), true);
}
END_TEST

START_TEST(test_sse__id_with_nul_ignored)
{
    static const char s[] = "id: ok\ndata: a\n\nid: b\0d\ndata: b\n\n";
    static const struct want w[] = {
        { "message", "a", "ok", -1, 0 },
        { "message", "b", "ok", -1, 0 },
    };
    run_case_max(s, sizeof(s) - 1, BIG, w, NW(w), 0, true);
}
END_TEST

START_TEST(test_sse__nul_in_data_kept)
{
    static const char s[] = "data: a\0b\n\n";
    static const struct want w[] = { { "message", "a\0b", "", -1, 3 } };
    run_case_max(s, sizeof(s) - 1, BIG, w, NW(w), 0, true);
}
END_TEST

START_TEST(test_sse__retry)
{
    static const struct want w[] = {
        { "message", "a", "", -1, 0 },   { "message", "b", "", 1500, 0 },
        { "message", "c", "", 1500, 0 }, /* invalid values are ignored */
        { "message", "d", "", 0, 0 },    { "message", "e", "", INT64_MAX, 0 },
    };
    run_case(
        "data: a\n\nretry: 1500\ndata: b\n\nretry: 1.5\nretry: abc\nretry:\nretry: -1\nretry:  5\n"
        "data: c\n\nretry: 0\ndata: d\n\nretry: 99999999999999999999999\ndata: e\n\n",
        w, NW(w), true);
}
END_TEST

START_TEST(test_sse__unknown_fields_ignored)
{
    static const struct want w[] = { { "message", "x", "", -1, 0 } };
    /* "data " (with a space) and "Data" are other fields. */
    run_case("foo: bar\ndata : no\nData: no\nDATA: no\ndata: x\n\n", w, NW(w), true);
}
END_TEST

START_TEST(test_sse__bom_stripped_at_start)
{
    static const struct want w[] = { { "message", "x", "", -1, 0 } };
    run_case("\xEF\xBB\xBF"
             "data: x\n\n",
             w, NW(w), true);
    run_case("\xEF\xBB\xBF", NULL, 0, true);
}
END_TEST

START_TEST(test_sse__bom_only_once)
{
    /* A second BOM is part of the first field name, so that field is unknown. */
    static const struct want w[] = { { "message", "y", "", -1, 0 } };
    run_case("\xEF\xBB\xBF\xEF\xBB\xBF"
             "data: x\n\ndata: y\n\n",
             w, NW(w), true);
}
END_TEST

START_TEST(test_sse__bom_later_is_data)
{
    static const struct want w[] = {
        { "message", "a", "", -1, 0 },
        { "message",
          "\xEF\xBB\xBF"
          "b",
          "", -1, 0 },
    };
    run_case("data: a\n\n\xEF\xBB\xBF"
             "data: z\n\ndata: \xEF\xBB\xBF"
             "b\n\n",
             w, NW(w), true);
}
END_TEST

START_TEST(test_sse__partial_bom_replayed)
{
    /* A BOM prefix that turns out not to be one is ordinary bytes: here it
     * makes the first field name unknown, and a bare "\xEF\xBB" is a
     * pending line. */
    static const struct want w[] = { { "message", "y", "", -1, 0 } };
    run_case("\xEF\xBB"
             "data: x\n\ndata: y\n\n",
             w, NW(w), true);
    run_case("\xEF"
             ":comment\ndata: y\n\n",
             w, NW(w), true);
    run_case("\xEF\xBB", NULL, 0, false);
    run_case("\xEF", NULL, 0, false);
}
END_TEST

START_TEST(test_sse__idle_tracks_partial_event)
{
    static const struct want w[] = { { "message", "a", "", -1, 0 } };
    run_case("", NULL, 0, true);
    run_case("data: a\n\n", w, NW(w), true);
    run_case("data: a\n\ndata: b\n", w, NW(w), false);  /* cut before the blank line */
    run_case("data: a\n\ndata: b", w, NW(w), false);    /* cut mid-line */
    run_case("data: a\n\nevent: x\n", w, NW(w), false); /* a field line opens a block */
    run_case("data: a\n\n:", w, NW(w), false);          /* unterminated comment */
    run_case("data: a\r\n\r", w, NW(w), true);          /* a bare CR ends the line */
}
END_TEST

START_TEST(test_sse__openai_stream_done)
{
    static const char s[] = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"
                            "data: {\"choices\":[{\"delta\":{}}]}\n\n"
                            "data: [DONE]\n\n";
    static const struct want w[] = {
        { "message", "{\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}", "", -1, 0 },
        { "message", "{\"choices\":[{\"delta\":{}}]}", "", -1, 0 },
        { "message", "[DONE]", "", -1, 0 },
    };
    run_case(s, w, NW(w), true);
}
END_TEST

START_TEST(test_sse__data_is_done)
{
    struct sse_event ev = { "message", 7, "[DONE]", 6, "", 0, -1 };

    ck_assert(sse_data_is_done(&ev));
    ev.data = " [DONE]\t";
    ev.data_len = 8;
    ck_assert(sse_data_is_done(&ev));
    ev.data = "[DONE]x";
    ev.data_len = 7;
    ck_assert(!sse_data_is_done(&ev));
    ev.data = "[done]";
    ev.data_len = 6;
    ck_assert(!sse_data_is_done(&ev));
    ev.data = "[DONE]";
    ev.data_len = 5;
    ck_assert(!sse_data_is_done(&ev));
    ev.data = "";
    ev.data_len = 0;
    ck_assert(!sse_data_is_done(&ev));
    ev.data = "[DONE]\n";
    ev.data_len = 7;
    ck_assert(!sse_data_is_done(&ev));
}
END_TEST

START_TEST(test_sse__line_too_large)
{
    static const struct want w[] = { { "message", "0123456789", "", -1, 0 } };

    /* max 16: "data: 0123456789" is exactly 16 bytes — allowed. */
    run_case_lim("data: 0123456789\n\n", 16, w, NW(w), 0, true);
    /* 17 bytes on one line fails, whatever the line is (comments too),
     * and events before it were delivered. */
    run_case_lim("data: 0123456789\n\ndata: 0123456789A\n\n", 16, w, NW(w), SSE_ETOO_LARGE, false);
    run_case_lim("data: 0123456789\n\n:23456789abcdefgh", 16, w, NW(w), SSE_ETOO_LARGE, false);
    run_case_lim("data: 0123456789\n\n:23456789abcdefgh\n", 16, w, NW(w), SSE_ETOO_LARGE, false);
}
END_TEST

START_TEST(test_sse__event_too_large)
{
    static const struct want w[] = { { "message", "0123456789\n01234", "", -1, 0 } };
    static const struct want w2[] = { { "abcdefg", "012345678", "", -1, 0 } };
    static const struct want w3[] = { { "message", "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n", "", -1,
                                        0 } };

    /* max 16: data "0123456789\n01234" is 16 bytes — allowed; one more fails. */
    run_case_lim("data: 0123456789\ndata: 01234\n\n", 16, w, NW(w), 0, true);
    run_case_lim("data: 0123456789\ndata: 01234\n\ndata: 0123456789\ndata: 012345\n\n", 16, w,
                 NW(w), SSE_ETOO_LARGE, false);
    /* The event name counts too: 7 + 9 = 16 passes, 8 + 9 = 17 fails, in
     * either order. */
    run_case_lim("event: abcdefg\ndata: 012345678\n\n", 16, w2, NW(w2), 0, true);
    run_case_lim("event: abcdefgh\ndata: 012345678\n\n", 16, NULL, 0, SSE_ETOO_LARGE, false);
    run_case_lim("data: 012345678\nevent: abcdefgh\n\n", 16, NULL, 0, SSE_ETOO_LARGE, false);
    /* Many empty data lines, none too long, add up: 17 lines give data of
     * 16 newlines (allowed), 18 lines fail. */
    run_case_lim(
        "data\ndata\ndata\ndata\ndata\ndata\ndata\ndata\ndata\ndata\ndata\ndata\ndata\ndata\ndata\n"
        "data\ndata\n\n",
        16, w3, NW(w3), 0, true);
    run_case_lim(
        "data\ndata\ndata\ndata\ndata\ndata\ndata\ndata\ndata\ndata\ndata\ndata\ndata\ndata\ndata\n"
        "data\ndata\ndata\n\n",
        16, NULL, 0, SSE_ETOO_LARGE, false);
}
END_TEST

START_TEST(test_sse__too_large_is_sticky)
{
    struct sse_parser p;
    struct rec r = { 0 };

    ck_assert_int_eq(sse_parser_init(&p, 8), 0);
    ck_assert_int_eq(sse_parser_feed(&p, "data: 12", 8, rec_cb, &r), 0);
    ck_assert_int_eq(sse_parser_feed(&p, "3", 1, rec_cb, &r), SSE_ETOO_LARGE);
    ck_assert_int_eq(sse_parser_feed(&p, "\n\ndata: a\n\n", 11, rec_cb, &r), SSE_ETOO_LARGE);
    ck_assert_int_eq(sse_parser_feed(&p, NULL, 0, rec_cb, &r), SSE_ETOO_LARGE);
    ck_assert_uint_eq(r.n, 0);
    sse_parser_fini(&p);
}
END_TEST

START_TEST(test_sse__callback_abort)
{
    static const char s[] = "data: 1\n\ndata: 2\n\ndata: 3\n\n";
    struct sse_parser p;
    struct rec r = { 0 };

    r.abort_after = 2;
    r.abort_rc = 7;
    ck_assert_int_eq(sse_parser_init(&p, BIG), 0);
    ck_assert_int_eq(sse_parser_feed(&p, s, sizeof(s) - 1, rec_cb, &r), 7);
    ck_assert_uint_eq(r.n, 2); /* stopped right after the aborting event */
    ck_assert_int_eq(sse_parser_feed(&p, s, sizeof(s) - 1, rec_cb, &r), SSE_EABORTED);
    ck_assert_uint_eq(r.n, 2);
    sse_parser_fini(&p);
    rec_clear(&r);

    /* Negative values come back unchanged too, at every split. */
    r.abort_after = 1;
    r.abort_rc = -1000;
    for (size_t a = 1; a < sizeof(s) - 1; a++) {
        int rc;
        ck_assert_int_eq(sse_parser_init(&p, BIG), 0);
        rc = sse_parser_feed(&p, s, a, rec_cb, &r);
        if (rc == 0)
            rc = sse_parser_feed(&p, s + a, sizeof(s) - 1 - a, rec_cb, &r);
        ck_assert_int_eq(rc, -1000);
        ck_assert_uint_eq(r.n, 1);
        ck_assert_str_eq(r.ev[0].data, "1");
        sse_parser_fini(&p);
        rec_clear(&r);
    }
}
END_TEST

START_TEST(test_sse__null_callback)
{
    struct sse_parser p;

    ck_assert_int_eq(sse_parser_init(&p, BIG), 0);
    ck_assert_int_eq(sse_parser_feed(&p, "data: x\n\ndata: y\n", 17, NULL, NULL), 0);
    ck_assert(!sse_parser_is_idle(&p));
    sse_parser_fini(&p);
}
END_TEST

static int count_cb(const struct sse_event *ev, void *ud)
{
    (void)ev;
    ++*(size_t *)ud;
    return 0;
}

START_TEST(test_sse__buffered_counts_the_pending_event)
{
    struct sse_parser p;

    ck_assert_int_eq(sse_parser_init(&p, 1024), 0);
    ck_assert_uint_eq(sse_parser_buffered(&p), 0);
    ck_assert_int_eq(sse_parser_feed(&p, "id: 7\nevent: e\ndata: abc", 24, NULL, NULL), 0);
    /* event name "e", the unterminated line "data: abc"; the id is not counted */
    ck_assert_uint_eq(sse_parser_buffered(&p), 1 + 9);
    ck_assert_int_eq(sse_parser_feed(&p, "\ndata: de\n", 10, NULL, NULL), 0);
    ck_assert_uint_eq(sse_parser_buffered(&p), 1 + 4 + 3); /* "abc\n" "de\n" */
    ck_assert_int_eq(sse_parser_feed(&p, "\n", 1, NULL, NULL), 0);
    ck_assert_uint_eq(sse_parser_buffered(&p), 0);
    sse_parser_fini(&p);

    /* One large event, split across feeds: once dispatched, its buffers
     * are given back (a long stream does not keep its largest event). */
    static char big[200000];
    size_t got = 0;
    memset(big, 'x', sizeof(big));
    memcpy(big, "data: ", 6);
    ck_assert_int_eq(sse_parser_init(&p, sizeof(big)), 0);
    for (size_t off = 0; off < sizeof(big); off += 16384) {
        size_t n = sizeof(big) - off < 16384 ? sizeof(big) - off : 16384;
        ck_assert_int_eq(sse_parser_feed(&p, big + off, n, NULL, NULL), 0);
    }
    ck_assert_uint_eq(sse_parser_buffered(&p), sizeof(big));
    ck_assert_int_eq(sse_parser_feed(&p, "\n\n", 2, count_cb, &got), 0);
    ck_assert_uint_eq(got, 1);
    ck_assert_uint_eq(sse_parser_buffered(&p), 0);
    ck_assert_uint_eq(p.line.cap + p.data.cap, 0);
    sse_parser_fini(&p);
}
END_TEST

START_TEST(test_sse__init_rejects_zero)
{
    struct sse_parser p;

    ck_assert_int_eq(sse_parser_init(&p, 0), SSE_EINVAL);
    ck_assert_int_eq(sse_parser_feed(&p, "data: x\n\n", 9, NULL, NULL), SSE_EINVAL);
    sse_parser_fini(&p);
    ck_assert_str_eq(sse_strerror(SSE_ETOO_LARGE),
                     "event stream line or event exceeds the size limit");
    ck_assert_str_eq(sse_strerror(12345), "unknown sse error");
}
END_TEST

/* A long stream of varied events, cut into pseudo-random chunks of 1..300
 * bytes (fixed seed), checked against the same stream fed whole. Exercises
 * lines spanning many feeds and buffer growth. */
START_TEST(test_sse__random_chunks_long_stream)
{
    enum { NEV = 50 };
    char *s = malloc(1 << 20);
    size_t len = 0;
    uint32_t seed = 12345;
    struct rec whole = { 0 }, chunked = { 0 };
    struct sse_parser p;
    static const char *const eol[] = { "\n", "\r", "\r\n" };

    ck_assert_ptr_nonnull(s);
    for (int i = 0; i < NEV; i++) {
        const char *e = eol[i % 3];
        len += (size_t)sprintf(s + len, "event: e%d%s: c%s", i, e, e);
        for (int l = 0; l < i % 4 + 1; l++) {
            len += (size_t)sprintf(s + len, "data: ");
            for (int k = 0; k < 40 * i + l; k++)
                s[len++] = (char)('a' + (k + i) % 26);
            len += (size_t)sprintf(s + len, "%s", e);
        }
        len += (size_t)sprintf(s + len, "id: %d%s%s", i, e, e);
    }

    ck_assert_int_eq(sse_parser_init(&p, 1 << 16), 0);
    ck_assert_int_eq(sse_parser_feed(&p, s, len, rec_cb, &whole), 0);
    ck_assert(sse_parser_is_idle(&p));
    sse_parser_fini(&p);
    ck_assert_uint_eq(whole.n, NEV);

    ck_assert_int_eq(sse_parser_init(&p, 1 << 16), 0);
    for (size_t off = 0; off < len;) {
        size_t n;
        seed = seed * 1103515245u + 12345u;
        n = 1 + (seed >> 16) % 300;
        if (n > len - off)
            n = len - off;
        ck_assert_int_eq(sse_parser_feed(&p, s + off, n, rec_cb, &chunked), 0);
        off += n;
    }
    ck_assert(sse_parser_is_idle(&p));
    sse_parser_fini(&p);

    ck_assert_uint_eq(chunked.n, whole.n);
    for (size_t i = 0; i < whole.n; i++) {
        char name[32];
        snprintf(name, sizeof(name), "e%zu", i);
        ck_assert_str_eq(whole.ev[i].event, name);
        ck_assert_str_eq(chunked.ev[i].event, whole.ev[i].event);
        ck_assert_uint_eq(chunked.ev[i].data_len, whole.ev[i].data_len);
        ck_assert(memcmp(chunked.ev[i].data, whole.ev[i].data, whole.ev[i].data_len) == 0);
        ck_assert_str_eq(chunked.ev[i].id, whole.ev[i].id);
    }
    rec_clear(&whole);
    rec_clear(&chunked);
    free(s);
}
END_TEST

Suite *sse_suite(void)
{
    Suite *s = suite_create("sse");
    TCase *tc = tcase_create("core");

    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_sse__single_event);
    tcase_add_test(tc, test_sse__several_events_one_chunk);
    tcase_add_test(tc, test_sse__multiline_data_joined);
    tcase_add_test(tc, test_sse__crlf_endings);
    tcase_add_test(tc, test_sse__cr_endings);
    tcase_add_test(tc, test_sse__mixed_endings);
    tcase_add_test(tc, test_sse__cr_then_lf_across_feeds);
    tcase_add_test(tc, test_sse__comments_ignored);
    tcase_add_test(tc, test_sse__comment_lines_keep_idle);
    tcase_add_test(tc, test_sse__field_without_colon);
    tcase_add_test(tc, test_sse__single_leading_space_stripped);
    tcase_add_test(tc, test_sse__empty_data_not_dispatched);
    tcase_add_test(tc, test_sse__event_name);
    tcase_add_test(tc, test_sse__id_persists);
    tcase_add_test(tc, test_sse__id_with_nul_ignored);
    tcase_add_test(tc, test_sse__nul_in_data_kept);
    tcase_add_test(tc, test_sse__retry);
    tcase_add_test(tc, test_sse__unknown_fields_ignored);
    tcase_add_test(tc, test_sse__bom_stripped_at_start);
    tcase_add_test(tc, test_sse__bom_only_once);
    tcase_add_test(tc, test_sse__bom_later_is_data);
    tcase_add_test(tc, test_sse__partial_bom_replayed);
    tcase_add_test(tc, test_sse__idle_tracks_partial_event);
    tcase_add_test(tc, test_sse__openai_stream_done);
    tcase_add_test(tc, test_sse__data_is_done);
    tcase_add_test(tc, test_sse__line_too_large);
    tcase_add_test(tc, test_sse__event_too_large);
    tcase_add_test(tc, test_sse__too_large_is_sticky);
    tcase_add_test(tc, test_sse__callback_abort);
    tcase_add_test(tc, test_sse__null_callback);
    tcase_add_test(tc, test_sse__buffered_counts_the_pending_event);
    tcase_add_test(tc, test_sse__init_rejects_zero);
    tcase_add_test(tc, test_sse__random_chunks_long_stream);
    suite_add_tcase(s, tc);
    return s;
}
