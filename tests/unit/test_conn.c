/*
 * test_conn.c — the msgpack front's connection budgets (sidecar/rpc/conn.c)
 * on a real sidecar (harness.h) and real Unix socket clients: the message
 * bound, the input held across connections, and the output budget that
 * stops reading a client that does not read its replies.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "suites.h"

/* A request [0, msgid, "ping", [str of `n` bytes]]: its head only (the
 * string's bytes are the caller's). Returns the head's length. */
static size_t ping_head(unsigned char *p, uint32_t msgid, size_t n)
{
    size_t k = 0;
    p[k++] = 0x94;
    p[k++] = 0x00;
    p[k++] = 0xce;
    p[k++] = (unsigned char)(msgid >> 24);
    p[k++] = (unsigned char)(msgid >> 16);
    p[k++] = (unsigned char)(msgid >> 8);
    p[k++] = (unsigned char)msgid;
    memcpy(p + k, "\xa4ping", 5);
    k += 5;
    p[k++] = 0x91;
    p[k++] = 0xdb; /* str 32 */
    p[k++] = (unsigned char)(n >> 24);
    p[k++] = (unsigned char)(n >> 16);
    p[k++] = (unsigned char)(n >> 8);
    p[k++] = (unsigned char)n;
    return k;
}

static void send_all(int fd, const void *p, size_t n)
{
    ck_assert_int_eq(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

static void send_fill(int fd, size_t n)
{
    char x[4096];
    memset(x, 'x', sizeof(x));
    while (n) {
        size_t k = n < sizeof(x) ? n : sizeof(x);
        send_all(fd, x, k);
        n -= k;
    }
}

/* Runs the loop until the sidecar closed client `cl` (true) or 2 s pass. */
static bool closed_by_sidecar(struct harness *h, int cl)
{
    char buf[65536];
    for (int i = 0; i < 1000; i++) {
        ssize_t n = recv(h->fds[cl], buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            return true;
        if (n < 0)
            harness_run(h, 0.002);
    }
    return false;
}

START_TEST(test_conn__a_message_over_the_bound_is_refused_and_closed)
{
    struct harness h;
    unsigned char head[32];
    struct reply r;

    harness_start(&h, NULL);
    h.cfg->max_message_bytes = 1024;
    int cl = harness_connect(&h);
    /* The claimed size alone decides: nothing past the head is sent. */
    send_all(h.fds[cl], head, ping_head(head, 7, 2000));
    ck_assert(harness_recv(&h, cl, &r, 2.0));
    ck_assert_str_eq(r.code, "too_large");
    ck_assert(closed_by_sidecar(&h, cl));

    /* Right at the bound is a message like any other. */
    int ok = harness_connect(&h);
    size_t n = ping_head(head, 8, 1000);
    send_all(h.fds[ok], head, n);
    send_fill(h.fds[ok], 1000);
    ck_assert(harness_recv(&h, ok, &r, 2.0));
    ck_assert_uint_eq(r.msgid, 8);
    ck_assert_str_ne(r.code, "too_large");
    harness_stop(&h);
}
END_TEST

START_TEST(test_conn__unfinished_input_past_the_budget_refuses_the_largest)
{
    struct harness h;
    unsigned char head[32];
    struct reply r;

    harness_start(&h, NULL);
    h.cfg->max_message_bytes = 8192;
    h.cfg->max_buffered_input_bytes = 8192;
    int big = harness_connect(&h), small = harness_connect(&h);
    /* small: 3,000 of 6,000 bytes; big: 5,500 of 6,000. Together they hold
     * more than 8,192 bytes of unfinished messages: big, holding the most,
     * is refused; small is not. */
    send_all(h.fds[small], head, ping_head(head, 1, 6000));
    send_fill(h.fds[small], 3000);
    harness_run(&h, 0.02);
    uint64_t refusals = h.srv.stats.input_refusals;
    send_all(h.fds[big], head, ping_head(head, 2, 6000));
    send_fill(h.fds[big], 5500);
    ck_assert(harness_recv(&h, big, &r, 2.0));
    ck_assert_str_eq(r.code, "overloaded");
    ck_assert(closed_by_sidecar(&h, big));
    ck_assert_uint_eq(h.srv.stats.input_refusals, refusals + 1);
    ck_assert_uint_le(h.srv.input_bytes, 8192);
    /* small finishes its message and is answered. */
    send_fill(h.fds[small], 3000);
    ck_assert(harness_recv(&h, small, &r, 2.0));
    ck_assert_uint_eq(r.msgid, 1);
    ck_assert_str_ne(r.code, "overloaded");
    harness_stop(&h);
}
END_TEST

START_TEST(test_conn__a_client_that_does_not_read_is_paused_not_buffered)
{
    struct harness h;
    static const unsigned char ping[] = { 0x94, 0x00, 0x01, 0xa4, 'p', 'i', 'n', 'g', 0x90 };
    unsigned char burst[sizeof(ping) * 1000];

    harness_start(&h, NULL);
    h.cfg->max_message_bytes = 1024;
    h.cfg->max_write_queue_bytes = 4096;
    int cl = harness_connect(&h);
    int one = 4096;
    /* Small socket buffers, so that the replies back up into the queue. */
    setsockopt(h.fds[cl], SOL_SOCKET, SO_RCVBUF, &one, sizeof(one));
    for (size_t i = 0; i < 1000; i++)
        memcpy(burst + i * sizeof(ping), ping, sizeof(ping));
    uint64_t pauses = h.srv.stats.read_pauses;
    /* Pipeline pings and never read: the sidecar must stop reading this
     * client rather than queue replies without bound. */
    size_t sent = 0;
    for (int round = 0; round < 400 && h.srv.stats.read_pauses == pauses; round++) {
        ssize_t n = send(h.fds[cl], burst, sizeof(burst), MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0)
            sent += (size_t)n;
        harness_run(&h, 0.002);
    }
    ck_assert_uint_gt(h.srv.stats.read_pauses, pauses);
    struct conn *c = h.srv.conns;
    ck_assert_ptr_nonnull(c);
    /* Queued output stays within the budget plus the replies of one read. */
    ck_assert_uint_le(strbuf_live(&c->out), 4096 + 64 * 1024);
    ck_assert(!c->reading);
    /* Reading the replies resumes it: every ping sent is answered. */
    struct reply r;
    size_t answered = 0;
    while (answered < sent / sizeof(ping) && harness_recv(&h, cl, &r, 2.0))
        answered++;
    ck_assert_uint_eq(answered, sent / sizeof(ping));
    harness_stop(&h);
}
END_TEST

Suite *conn_suite(void)
{
    Suite *s = suite_create("conn");
    TCase *tc = tcase_create("core");

    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_conn__a_message_over_the_bound_is_refused_and_closed);
    tcase_add_test(tc, test_conn__unfinished_input_past_the_budget_refuses_the_largest);
    tcase_add_test(tc, test_conn__a_client_that_does_not_read_is_paused_not_buffered);
    suite_add_tcase(s, tc);
    return s;
}
