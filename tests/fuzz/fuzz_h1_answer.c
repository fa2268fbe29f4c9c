/*
 * fuzz_h1_answer.c — libFuzzer target for the own HTTP/1.1 client's answer
 * handling (sidecar/upstream/h1.c): status line, header fields, Content-Length,
 * chunked and close-delimited bodies, trailers, interim and bodiless
 * answers, early answers, a close anywhere, and a pooled connection's reuse.
 *
 * The client runs its real code, unchanged, on real connections: its origin
 * is an abstract Unix socket this target listens on, so each request is a
 * connect, a sendmsg and recvs as with TCP; this target plays the upstream,
 * writes the answer from the input and closes when the client waits for
 * more. Input:
 *
 *   byte 0   flags: 0x01 the body hook pauses (H1_PAUSE) on new buffers,
 *            resumed from the loop; 0x02 it refuses (H1_ABORT) the first;
 *            0x04 the request carries 1 MiB the upstream never reads (the
 *            answer comes while the client still sends); 0x08 a second
 *            request follows on the same pool; 0x10 the upstream closes the
 *            second request's connection, if it was a pooled one, before
 *            any answer (the client may send it once more on a new one)
 *   byte 1-2 with 0x08: the length of the first answer (little-endian)
 *   byte 3   seeds the write sizes (1 byte to 64 KiB) and the pauses
 *   rest     the answer(s)
 *
 * Each input runs twice: every answer written whole, then in pieces with
 * the loop run between them (and with pauses when asked). Checked: hooks
 * keep h1.h's contract (h1_contract.h: on_end exactly once and last, a
 * detail with every failure, header lines CRLF-terminated within
 * H1_LINE_MAX and each set opened by a status line, a paused buffer
 * offered again whole, no body byte after a 1xx, 204 or 304 head, H1_OK
 * only after a final status), a request ends without a deadline once the
 * upstream closed, a connection whose request was not written whole is
 * never reused; and both runs tell the same (told_compare()).
 */
#include "h1_contract.h"

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <linux/sockios.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define F_PAUSE       0x01
#define F_REFUSE      0x02
#define F_BIG_REQUEST 0x04
#define F_SECOND      0x08
#define F_CLOSE_FIRST 0x10
#define BIG_REQUEST   (1u << 20)
#define LOOP_GUARD    100000

static struct ev_loop *loop;
static struct sockaddr_un addr;
static socklen_t addr_len;
static int listen_fd = -1;
static int fds_at_start;

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    if (!d)
        abort();
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static void turn(struct exchange *x)
{
    exchange_turn(loop, x);
}

/* The upstream's end of the connection the request went out on: a new
 * connection when there is one to accept (the older one is then closed),
 * else `fd`, the pooled one. */
static int upstream_fd(int fd)
{
    int nfd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

    if (nfd < 0)
        return fd;
    if (fd >= 0)
        close(fd);
    return nfd;
}

/* Whether the client has read every byte written on `fd`. */
static bool drained(int fd)
{
    int queued = 0;
    return ioctl(fd, SIOCOUTQ, &queued) == 0 && queued == 0;
}

static void write_all(struct exchange *x, int fd, const uint8_t *p, size_t n)
{
    for (int guard = 0; n > 0; guard++) {
        if (guard > LOOP_GUARD)
            abort(); /* the client stopped reading for good */
        ssize_t w = write(fd, p, n);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EINTR)
            return; /* the client closed: what is left goes nowhere */
        if (x->ended)
            return;
        turn(x);
    }
}

/* Answers one request with `answer` on the upstream's end `*fd`. The
 * request has ended on return; *fd is closed (-1) unless the answer left
 * the connection open. */
static void serve(struct exchange *x, bool split, int *fd, const uint8_t *answer, size_t n)
{
    size_t off = 0;
    int guard = 0;

    *fd = upstream_fd(*fd);
    while (off < n && !x->ended) {
        size_t k = n - off;
        if (split) {
            k = rng_piece(x->rng);
            if (k > n - off)
                k = n - off;
        }
        write_all(x, *fd, answer + off, k);
        off += k;
        turn(x);
    }
    /* Read to the end by the client, and not ended: it waits for more of an
     * answer that will not come. The upstream closes. */
    while (!x->ended) {
        if (++guard > LOOP_GUARD)
            abort(); /* the request does not end */
        if (*fd >= 0 && !x->paused && drained(*fd)) {
            close(*fd);
            *fd = -1;
        }
        turn(x);
        *fd = upstream_fd(*fd);
    }
}

/* Runs the whole input once; what each request told in `out`. */
static void run(const uint8_t *data, size_t size, bool split, struct told out[2])
{
    static char big[BIG_REQUEST];
    static const char head[] = "POST /v1/chat/completions HTTP/1.1\r\nHost: fuzz\r\n"
                               "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n";
    unsigned flags = data[0];
    size_t first = size - 4;
    int busy = 0, fd = -1;
    uint32_t rng[2];
    struct exchange *x = calloc(2, sizeof(*x));
    struct h1_pool *pool = h1_pool_new(loop, &busy, 8);
    struct h1_origin *origin;
    struct iovec iov[2] = {
        { (void *)head, sizeof(head) - 1 },
        { (flags & F_BIG_REQUEST) ? big : (char *)"{}", (flags & F_BIG_REQUEST) ? BIG_REQUEST : 2 },
    };

    if (!x || !pool)
        abort();
    origin = h1_origin_get(pool, (struct sockaddr *)&addr, addr_len, "fuzz");
    if (!origin)
        abort();
    if (flags & F_SECOND) {
        size_t want = (size_t)data[1] | (size_t)data[2] << 8;
        if (want < first)
            first = want;
    }
    for (int i = 0; i < 2; i++) {
        rng[i] = data[3] * 2654435761u + (uint32_t)i;
        x[i].busy = &busy;
        x[i].rng = &rng[i];
        x[i].pauses = split && (flags & F_PAUSE);
        x[i].refuse = (flags & F_REFUSE) != 0;
        x[i].told = &out[i];
        out[i].end = -1;
    }

    h1_req_start(&x[0].req, pool, origin, iov, 2, &exchange_hooks, &x[0]);
    serve(&x[0], split, &fd, data + 4, first);
    if (flags & F_SECOND) {
        bool cut = (flags & F_BIG_REQUEST) && out[0].end == H1_OK;
        turn(&x[0]); /* a connection pooled in this turn is taken from the next */
        h1_req_start(&x[1].req, pool, origin, iov, 2, &exchange_hooks, &x[1]);
        int nfd = upstream_fd(-1);
        if (nfd >= 0) {
            if (fd >= 0)
                close(fd);
            fd = nfd;
        } else if (cut) {
            abort(); /* reused although its request was never written whole */
        } else if (fd >= 0 && (flags & F_CLOSE_FIRST)) {
            close(fd); /* a pooled connection the upstream closed unanswered */
            fd = -1;
            for (int guard = 0; fd < 0 && !x[1].ended; guard++) {
                if (guard > LOOP_GUARD)
                    abort();
                turn(&x[1]);
                fd = upstream_fd(-1);
            }
        }
        if (!x[1].ended)
            serve(&x[1], split, &fd, data + 4 + first, size - 4 - first);
    }
    if (fd >= 0)
        close(fd);
    for (int i = 0; i < 8; i++)
        ev_run(loop, EVRUN_NOWAIT); /* pooled connections see the close */
    h1_pool_free(pool);
    for (int i = 0; i < 2; i++)
        exchange_free(&x[i]);
    /* Nothing the client left behind: every connection was accepted. */
    while ((fd = upstream_fd(-1)) >= 0)
        close(fd);
    free(x);
}

static void setup(void)
{
    listen_fd = upstream_listen("polygw-fuzz-h1", &addr, &addr_len);
    loop = ev_loop_new(EVFLAG_AUTO);
    if (!loop)
        abort();
    fds_at_start = open_fds();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct told whole[2], split[2];

    if (size < 4)
        return 0;
    if (listen_fd < 0)
        setup();
    memset(whole, 0, sizeof(whole));
    memset(split, 0, sizeof(split));
    run(data, size, false, whole);
    run(data, size, true, split);
    if (open_fds() != fds_at_start)
        abort(); /* a connection left open */
    for (int i = 0; i < 2; i++)
        told_compare(&whole[i], &split[i]);
    told_free(whole);
    told_free(split);
    return 0;
}
