/*
 * test_h1.c — the own HTTP/1.1 client's answer parsing
 * (sidecar/upstream/h1.c) through its public API, on real loopback TCP
 * connections: this file plays the upstream, reads the request and writes
 * an answer (whole or in pieces, with the loop run between them), then
 * checks what the hooks saw and how the request ended.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "upstream/h1.h"
#include "suites.h"

struct got {
    char head[1024];
    size_t head_len;
    char body[1024];
    size_t body_len;
    int ends;
    enum h1_end end;
    char detail[H1_DETAIL_MAX];
};

static int on_header(void *ud, const char *line, size_t n)
{
    struct got *g = ud;
    ck_assert_uint_le(g->head_len + n, sizeof(g->head));
    memcpy(g->head + g->head_len, line, n);
    g->head_len += n;
    return 0;
}

static enum h1_take on_body(void *ud, const char *p, size_t n)
{
    struct got *g = ud;
    ck_assert_uint_le(g->body_len + n, sizeof(g->body));
    memcpy(g->body + g->body_len, p, n);
    g->body_len += n;
    return H1_TAKEN;
}

static void on_end(void *ud, enum h1_end end, const char *detail)
{
    struct got *g = ud;
    g->ends++;
    g->end = end;
    snprintf(g->detail, sizeof(g->detail), "%s", detail ? detail : "");
}

static void on_step(void *ud)
{
    (void)ud;
}

static const struct h1_hooks hooks = {
    .on_connecting = on_step,
    .on_sending = on_step,
    .on_header = on_header,
    .on_body = on_body,
    .on_end = on_end,
};

/* Sends one request to a listener of ours, answers it with the `n_parts`
 * pieces of `answer` (closing after them when `close_after`), and runs
 * the loop until the request ends. */
static void exchange(const char *const *parts, size_t n_parts, bool close_after, struct got *g)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    int busy = 0;
    struct h1_pool *pool = h1_pool_new(loop, &busy, 4);
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t sl = sizeof(sa);
    static const char req[] = "POST /v1/x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}";
    struct iovec iov = { (void *)req, sizeof(req) - 1 };
    struct h1_req r;

    memset(g, 0, sizeof(*g));
    memset(&r, 0, sizeof(r));
    ck_assert_ptr_nonnull(pool);
    ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(listen(lfd, 4), 0);
    ck_assert_int_eq(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
    struct h1_origin *o = h1_origin_get(pool, (struct sockaddr *)&sa, sl, "test");
    ck_assert_ptr_nonnull(o);
    h1_req_start(&r, pool, o, &iov, 1, &hooks, g);
    /* The connect completes in the kernel's backlog; accept and read the
     * whole request (the loop writes it). */
    int fd = accept(lfd, NULL, NULL);
    ck_assert_int_ge(fd, 0);
    char buf[256];
    size_t have = 0;
    for (int i = 0; i < 1000 && have < sizeof(req) - 1; i++) {
        ev_run(loop, EVRUN_NOWAIT);
        ssize_t k = recv(fd, buf + have, sizeof(buf) - have, MSG_DONTWAIT);
        if (k > 0)
            have += (size_t)k;
    }
    ck_assert_uint_eq(have, sizeof(req) - 1);
    for (size_t i = 0; i < n_parts; i++) {
        ck_assert_int_eq(send(fd, parts[i], strlen(parts[i]), 0), (ssize_t)strlen(parts[i]));
        for (int k = 0; k < 3; k++)
            ev_run(loop, EVRUN_NOWAIT);
    }
    if (close_after)
        close(fd);
    for (int i = 0; i < 10000 && g->ends == 0; i++)
        ev_run(loop, EVRUN_ONCE);
    ck_assert_int_eq(g->ends, 1);
    if (!close_after)
        close(fd);
    close(lfd);
    h1_pool_free(pool);
    ev_loop_destroy(loop);
}

START_TEST(test_h1__content_length_answer_in_pieces)
{
    static const char *const parts[] = { "HTTP/1.1 200 OK\r\nContent-",
                                         "Length: 11\r\nX-A: b\r\n\r\nhello", " world" };
    struct got g;

    exchange(parts, 3, false, &g);
    ck_assert_int_eq(g.end, H1_OK);
    /* The status line comes without its reason phrase, then each field. */
    ck_assert_str_eq((g.head[g.head_len] = '\0', g.head),
                     "HTTP/1.1 200\r\nContent-Length: 11\r\nX-A: b\r\n");
    ck_assert_uint_eq(g.body_len, 11);
    ck_assert(memcmp(g.body, "hello world", 11) == 0);
}
END_TEST

START_TEST(test_h1__chunked_answer_and_interim_100)
{
    static const char *const parts[] = {
        "HTTP/1.1 100 Continue\r\n\r\n",
        "HTTP/1.1 429 Too Many\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
        "cde\r\n3;x=y\r\nfgh\r\n0\r\nTrailer: z\r\n\r\n"
    };
    struct got g;

    exchange(parts, 3, false, &g);
    ck_assert_int_eq(g.end, H1_OK); /* any complete final answer */
    g.head[g.head_len] = '\0';
    ck_assert_ptr_nonnull(strstr(g.head, "HTTP/1.1 100\r\n"));
    ck_assert_ptr_nonnull(strstr(g.head, "HTTP/1.1 429\r\n"));
    ck_assert_uint_eq(g.body_len, 8);
    ck_assert(memcmp(g.body, "abcdefgh", 8) == 0);
}
END_TEST

START_TEST(test_h1__no_body_after_204_whatever_it_says)
{
    static const char *const parts[] = { "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n" };
    struct got g;

    exchange(parts, 1, false, &g);
    ck_assert_int_eq(g.end, H1_OK);
    ck_assert_uint_eq(g.body_len, 0);
}
END_TEST

START_TEST(test_h1__malformed_and_truncated_answers)
{
    struct got g;

    static const char *const bad[] = { "SIP/2.0 200 OK\r\n\r\n" };
    exchange(bad, 1, true, &g);
    ck_assert_int_eq(g.end, H1_MALFORMED);
    ck_assert_str_ne(g.detail, "");

    static const char *const bad_len[] = { "HTTP/1.1 200 OK\r\nContent-Length: x1\r\n\r\n" };
    exchange(bad_len, 1, true, &g);
    ck_assert_int_eq(g.end, H1_MALFORMED);

    static const char *const bad_chunk[] = { "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                             "zz\r\n" };
    exchange(bad_chunk, 1, true, &g);
    ck_assert_int_eq(g.end, H1_MALFORMED);

    /* Closed before the announced body ended. */
    static const char *const short_body[] = {
        "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345"
    };
    exchange(short_body, 1, true, &g);
    ck_assert_int_eq(g.end, H1_TRUNCATED);
    ck_assert_uint_eq(g.body_len, 5);

    /* Closed in the middle of the head: the answer never came. */
    static const char *const short_head[] = { "HTTP/1.1 200 OK\r\nContent-Le" };
    exchange(short_head, 1, true, &g);
    ck_assert_int_ne(g.end, H1_OK);

    /* A close-delimited body ends well at the close. */
    static const char *const by_close[] = { "HTTP/1.1 200 OK\r\n\r\nuntil the end" };
    exchange(by_close, 1, true, &g);
    ck_assert_int_eq(g.end, H1_OK);
    ck_assert_uint_eq(g.body_len, 13);
}
END_TEST

Suite *h1_suite(void)
{
    Suite *s = suite_create("h1");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_h1__content_length_answer_in_pieces);
    tcase_add_test(tc, test_h1__chunked_answer_and_interim_100);
    tcase_add_test(tc, test_h1__no_body_after_204_whatever_it_says);
    tcase_add_test(tc, test_h1__malformed_and_truncated_answers);
    suite_add_tcase(s, tc);
    return s;
}
