/*
 * main.c — the scriptable OpenAI-compatible mock upstream used by the
 * integration tests and benchmarks: CLI, listener, accept loop, signals.
 *
 *   mock_upstream [--port N] [--host 127.0.0.1]
 *
 * Prints exactly one line, "LISTENING <port>", once the socket listens, and
 * exits 0 on SIGTERM/SIGINT after closing and freeing everything (the test
 * build runs under ASan/LSan, so a leak fails the test that stops it).
 *
 * Accept: level-triggered, bounded batch per wake-up. On fd exhaustion
 * (EMFILE/ENFILE/ENOBUFS/ENOMEM) the accept watcher is stopped for 100 ms
 * instead of spinning on a listener that stays readable.
 */
#include "internal.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define ACCEPT_BATCH   64
#define ACCEPT_RETRY_S 0.1

static void usage(FILE *f)
{
    fputs("usage: mock_upstream [--port N] [--host ADDR]\n"
          "  --port N     TCP port, 0 (default) picks a free one\n"
          "  --host ADDR  address to listen on (default 127.0.0.1)\n"
          "Prints \"LISTENING <port>\" on stdout once ready; SIGTERM/SIGINT stop it (exit 0).\n"
          "Endpoints: POST .../chat/completions, .../embeddings, .../ocr;\n"
          "control: GET /_mock/stats, /_mock/last, /_mock/requests; POST /_mock/script, "
          "/_mock/reset.\n"
          "See tests/mock_upstream/README.md for the scripting interface.\n",
          f);
}

static void on_accept(struct ev_loop *loop, ev_io *w, int revents)
{
    struct mock *m = w->data;
    (void)revents;
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        int fd = accept4(m->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                if (!m->accept_paused_logged) /* once per exhaustion episode */
                    fprintf(stderr, "mock_upstream: accept: %s; pausing accepts\n",
                            strerror(errno));
                m->accept_paused_logged = true;
                ev_io_stop(loop, &m->accept_w);
                ev_timer_set(&m->accept_retry_w, ACCEPT_RETRY_S, 0.);
                ev_timer_start(loop, &m->accept_retry_w);
            }
            return; /* EAGAIN or a pause */
        }
        m->accept_paused_logged = false;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* trickle timing */
        conn_new(m, fd);
    }
}

static void on_accept_retry(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct mock *m = w->data;
    (void)revents;
    ev_io_start(loop, &m->accept_w);
}

static void on_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
    (void)w;
    (void)revents;
    ev_break(loop, EVBREAK_ALL);
}

static void reap(struct mock *m)
{
    while (m->dead) {
        struct conn *c = m->dead;
        m->dead = c->next;
        conn_free(c);
    }
}

static void on_prepare(struct ev_loop *loop, ev_prepare *w, int revents)
{
    (void)loop;
    (void)revents;
    reap(w->data);
}

/* Returns the listening fd, or -1 with a message on stderr. */
static int listen_on(const char *host, const char *port, int *bound_port)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "mock_upstream: %s: %s\n", host, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0)
            break;
        fprintf(stderr, "mock_upstream: bind/listen %s:%s: %s\n", host, port, strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return -1;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        close(fd);
        return -1;
    }
    *bound_port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                           : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

int main(int argc, char **argv)
{
    const char *host = "127.0.0.1";
    const char *port = "0";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--port") && i + 1 < argc) {
            port = argv[++i];
        } else if (!strncmp(a, "--port=", 7)) {
            port = a + 7;
        } else if (!strcmp(a, "--host") && i + 1 < argc) {
            host = argv[++i];
        } else if (!strncmp(a, "--host=", 7)) {
            host = a + 7;
        } else {
            fprintf(stderr, "mock_upstream: unknown or incomplete argument \"%s\"\n", a);
            usage(stderr);
            return 2;
        }
    }
    char *endp;
    long pn = strtol(port, &endp, 10);
    if (!*port || *endp || pn < 0 || pn > 65535) {
        fprintf(stderr, "mock_upstream: --port must be 0..65535\n");
        return 2;
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &sa, NULL);

    static struct mock m; /* static: ~10 KiB of counters, zero-initialised */
    int bound = 0;
    m.lfd = listen_on(host, port, &bound);
    if (m.lfd < 0)
        return 1;
    m.loop = ev_default_loop(EVFLAG_AUTO);
    if (!m.loop) {
        fprintf(stderr, "mock_upstream: cannot initialise libev\n");
        close(m.lfd);
        return 1;
    }
    m.queue = json_array();

    ev_io_init(&m.accept_w, on_accept, m.lfd, EV_READ);
    ev_init(&m.accept_retry_w, on_accept_retry);
    ev_signal_init(&m.sigterm_w, on_signal, SIGTERM);
    ev_signal_init(&m.sigint_w, on_signal, SIGINT);
    ev_prepare_init(&m.reap_w, on_prepare);
    m.accept_w.data = m.accept_retry_w.data = m.reap_w.data = &m;
    ev_io_start(m.loop, &m.accept_w);
    ev_signal_start(m.loop, &m.sigterm_w);
    ev_signal_start(m.loop, &m.sigint_w);
    ev_prepare_start(m.loop, &m.reap_w);

    printf("LISTENING %d\n", bound);
    fflush(stdout);

    ev_run(m.loop, 0);

    while (m.conns)
        conn_close(m.conns, false);
    reap(&m);
    ev_io_stop(m.loop, &m.accept_w);
    ev_timer_stop(m.loop, &m.accept_retry_w);
    ev_signal_stop(m.loop, &m.sigterm_w);
    ev_signal_stop(m.loop, &m.sigint_w);
    ev_prepare_stop(m.loop, &m.reap_w);
    close(m.lfd);
    json_decref(m.queue);
    json_decref(m.dflt);
    json_decref(m.auth);
    control_fini(&m);
    buf_fini(&m.scratch);
    ev_loop_destroy(m.loop);
    return 0;
}
