/*
 * h1.h — polygw's own HTTP/1.1 client, for the case that needs none of
 * libcurl's generality: a POST over http:// or https:// to a known address,
 * with no proxy in the way (a model server on the node, an in-cluster
 * gateway, a provider by host name once its address is known, the bench's
 * mock). The upstream engine (upstream.c) picks it per URL and keeps
 * libcurl for everything else (names to resolve, proxies, userinfo, h2).
 *
 * What it does, and no more:
 *   - a pool of keep-alive connections per origin (address and port),
 *     most recently used first; an idle connection is watched for input,
 *     so one the server closed (or wrote to unasked) is dropped when that
 *     happens, without a liveness poll before each reuse;
 *   - the request is handed over as a few ready buffers (request line and
 *     Host, header block, Content-Length, body) and written with one
 *     sendmsg; the answer is read into the pool's buffer and parsed with
 *     http_parser (Content-Length, chunked and close-delimited bodies;
 *     interim 1xx answers skipped; a 1xx, 204 or 304 has no body whatever
 *     its header fields say; a 101 is a final answer, its connection never
 *     reused);
 *   - a request sent on a reused connection that ends before any byte of an
 *     answer (the server closed it just as it was reused) is sent once more
 *     on a new connection, as libcurl does;
 *   - no timers of its own: the attempt's deadlines (upstream.c) end a
 *     request by stopping it, which closes its connection;
 *   - TLS (an origin made with h1_origin_get_tls): OpenSSL on the same
 *     loop, never blocking (SSL_connect, SSL_read and SSL_write, each
 *     WANT_READ / WANT_WRITE waited for on the connection's one watcher);
 *     ALPN offers http/1.1 alone; SNI and the verified name are the
 *     origin's name (an IP literal is checked against the certificate's
 *     addresses, without SNI); the certificate chain and the name are
 *     always verified, against the context's store; the last session the
 *     origin's server handed out is offered to its next new connection
 *     (resumption); no close_notify is waited for. A pooled TLS connection
 *     is reused exactly as a plain one, the stale retry included.
 *
 * Re-entrancy: hooks other than on_end run inside http_parser_execute, with
 * *busy (the engine's counter) raised: the engine defers any stop of a
 * request that happens there. on_end is called last, outside the parser,
 * with the request already detached from its connection; the request may
 * be freed by it and is never touched afterwards.
 */
#ifndef POLYGW_H1_H
#define POLYGW_H1_H

#include <ev.h>
#include <http_parser.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

struct h1_pool;
struct h1_origin;
struct h1_conn;
struct ssl_ctx_st; /* OpenSSL's SSL_CTX */

/* What on_body did with a buffer. */
enum h1_take {
    H1_TAKEN = 0,
    H1_PAUSE, /* not taken: offered again, whole, after h1_req_resume() */
    H1_ABORT, /* not taken: the request ends with H1_ABORTED */
};

enum h1_end {
    H1_OK = 0,          /* a complete final answer (any status) */
    H1_CONNECT_FAILED,  /* no connection could be made */
    H1_CONNECTION_LOST, /* reset or closed before the answer's body, or send failed */
    H1_TRUNCATED,       /* closed before the announced body ended */
    H1_MALFORMED,       /* not a valid HTTP/1.x answer */
    H1_ABORTED,         /* a hook refused the answer */
    H1_TLS,             /* the TLS handshake failed (verification included) */
};

struct h1_hooks {
    void (*on_connecting)(void *ud); /* a new connection is being made */
    void (*on_sending)(void *ud);    /* the request is about to be written (once) */
    /* One line of the answer's head, CRLF included: the status line
     * ("HTTP/1.1 200\r\n", no reason phrase) and then each "Name: value"
     * (a line longer than the buffer, H1_LINE_MAX with its CRLF, is cut:
     * the engine only parses short ones; a name that long loses its colon).
     * Lines of interim 1xx answers come too, each set starting with its
     * status line. Non-zero aborts. */
    int (*on_header)(void *ud, const char *line, size_t n);
    enum h1_take (*on_body)(void *ud, const char *p, size_t n);
    /* `detail`: a human description for every end but H1_OK. */
    void (*on_end)(void *ud, enum h1_end end, const char *detail);
};

/* A reused connection that dies before any byte of an answer is sent again
 * on a new one only within this long after the request was written: the
 * server closed it as it was reused. Later, the server may have worked on
 * the request (an LLM call is not idempotent): the attempt fails instead. */
#define H1_STALE_RETRY_S 1.0
#define H1_IOV_MAX       5
#define H1_LINE_MAX      256
#define H1_DETAIL_MAX    160

/* One exchange. Embedded in its owner; every field is private. */
struct h1_req {
    struct h1_pool *pool;
    struct h1_origin *origin;
    struct h1_conn *conn;
    const struct h1_hooks *hooks;
    void *ud;
    struct iovec iov[H1_IOV_MAX];
    int iovcnt;
    int iov_at;     /* first iovec not yet wholly written */
    size_t iov_off; /* bytes of iov[iov_at] written */
    http_parser parser;
    bool active, reused, retried, sending_told, got_bytes;
    bool status_told, headers_done, in_value, msg_done, paused, ended, starting;
    int send_errno; /* the send failed (then only the answer, if any, is read) */
    double sent_at; /* the request was written whole (0: not yet) */
    size_t line_len;
    char *held; /* a body buffer on_body paused on, offered again first */
    size_t held_len;
    char *rest; /* bytes read and not parsed yet while paused */
    size_t rest_len;
    ev_timer end_w; /* ends a request that failed inside h1_req_start */
    enum h1_end end_code;
    char detail[H1_DETAIL_MAX];
    char line[H1_LINE_MAX]; /* last: h1_req_start does not clear it */
};

struct h1_stats {
    uint64_t connections_opened; /* new connections (connect started) */
    uint64_t connections_reused; /* requests sent on a pooled connection */
    uint64_t stale_retries;      /* requests sent again after a reused one died */
    uint64_t tls_handshakes;     /* TLS handshakes completed */
    uint64_t tls_resumed;        /* of which resumed an earlier session */
};

/* `busy`: the engine's "inside a callback" counter (see above). */
struct h1_pool *h1_pool_new(struct ev_loop *loop, int *busy, uint32_t max_idle);
/* Closes the idle connections. Every request must have ended or stopped. */
void h1_pool_free(struct h1_pool *p);
const struct h1_stats *h1_pool_stats(const struct h1_pool *p);

/* The pool's origin for address `sa` (copied), made on first use; lives as
 * long as the pool. `label` ("127.0.0.1 port 8080") names it in details.
 * NULL when out of memory. */
struct h1_origin *h1_origin_get(struct h1_pool *p, const struct sockaddr *sa, socklen_t len,
                                const char *label);

/* The same for a TLS origin: `ctx` (borrowed; it must outlive the pool and
 * have been through h1_tls_ctx_setup) and `name` (copied: SNI and the name
 * verified, or an IP literal without brackets, verified as an address). An
 * origin is one (address, context, name): connections are never shared
 * between contexts (another CA set, another client certificate). */
struct h1_origin *h1_origin_get_tls(struct h1_pool *p, const struct sockaddr *sa, socklen_t len,
                                    const char *label, struct ssl_ctx_st *ctx, const char *name);

/* Prepares a client context for the own client: ALPN http/1.1 only, the
 * client session cache (sessions kept per origin, by h1). 0 or -1. */
int h1_tls_ctx_setup(struct ssl_ctx_st *ctx);

/* Starts `r` on a pooled connection to `o`, or a new one. The buffers are
 * borrowed until the request ends (its on_end) or is stopped. on_connecting
 * and on_sending may run from inside this call, the other hooks never: a
 * failure to even start is reported through on_end from the loop. */
void h1_req_start(struct h1_req *r, struct h1_pool *p, struct h1_origin *o, const struct iovec *iov,
                  int iovcnt, const struct h1_hooks *hooks, void *ud);

/* Ends `r` without a hook: its connection (if any) is closed, since the
 * answer was not read to its end. A no-op on a request that ended. */
void h1_req_stop(struct h1_req *r);

/* After on_body returned H1_PAUSE: offers the paused buffer again, parses
 * what was read meanwhile and reads on. May end the request (on_end) from
 * inside; not from a hook of this same request. */
void h1_req_resume(struct h1_req *r);

#endif /* POLYGW_H1_H */
