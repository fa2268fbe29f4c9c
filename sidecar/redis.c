/*
 * redis.c — hiredis 0.14's async API on the sidecar's libev loop, plus what
 * hiredis leaves to its user: name resolution off the loop, connect and
 * command timeouts, reconnection with backoff, the embedded scripts and
 * their NOSCRIPT fallback. redis.h holds the contract.
 *
 * Each of the two connections (commands, subscriber) runs this machine; it
 * changes state only in conn_set_state():
 *
 *             retry_w                  ev_async            onConnect(OK)
 *    DOWN ────────────▶ RESOLVING ─────────────▶ CONNECTING ─────────────▶ HANDSHAKE
 *     ▲  (an IP literal or a unix socket goes straight to CONNECTING)          │
 *     │                                                    every handshake  │
 *     │                                                    reply OK         ▼
 *     └──── conn_fail(): any failed step, connect_w expiring, a command  ◀── UP
 *           timeout, an error reply in the handshake, an unanswered
 *           subscriber ping, hiredis dropping the link. Then retry_w after
 *           the backoff delay.
 *
 * connect_w bounds RESOLVING + CONNECTING by command_timeout_s and is
 * re-armed once for HANDSHAKE: AUTH (if a password), SELECT (if db != 0),
 * then SCRIPT LOAD of every script and TIME on the command connection, or
 * SUBSCRIBE to every channel on the subscriber, all pipelined. Backoff: the
 * n-th failure in a row waits reconnect_min_s * 2^(n-1), capped at
 * reconnect_max_s, times a jitter in [0.5, 1); reaching UP resets n. The
 * hooks on_down / on_unsubscribed fire on UP -> DOWN only.
 *
 * Subscriber liveness. A subscriber only reads, so a link that died without
 * a FIN or RST (a NAT or load-balancer idle timeout, a partition) looks fine
 * until TCP keepalive gives up, or for ever if the server hangs (a
 * SIGSTOPped server's kernel still answers keepalives), and messages
 * published meanwhile are lost. While UP, ping_w sends a ping every
 * RDS_PING_EVERY (see there) and gives it command_timeout_s to be answered,
 * like any command; no answer in time goes through conn_fail() ("subscriber
 * ping timeout"), which sends the subscriber through backoff, reconnect and
 * SUBSCRIBE, firing on_unsubscribed and later on_subscribed.
 *   The ping is not PING: in RESP2 a subscribed connection answers PING with
 * the multi-bulk ["pong", arg], and hiredis 0.14 cannot route it. Its
 * redisAsyncCommand() queues the PING callback on ac->sub.invalid, which
 * only a non-array reply (an error) shifts; the pong is an array, so
 * __redisGetSubscribeCallback() takes it for a pattern reply ('p' of "pong"
 * = the psubscribe variant), looks `arg` up in ac->sub.patterns, finds
 * nothing and leaves the callback of the previous reply in that read (a
 * channel's) or none. The PING callback never runs and stays queued until
 * the context is freed: one leaked record per ping (hiredis issue #351,
 * fixed upstream by PR #1027, long after 0.14). So the ping is a SUBSCRIBE to the first channel, which
 * we already are subscribed to: Redis answers ["subscribe", channel, count]
 * and changes nothing; hiredis replaces that channel's dict entry with the
 * same callback (sub_on_reply, no privdata) and routes the confirmation to
 * it by channel name, as any confirmation. In UP, with a ping out, a
 * "subscribe" confirmation is its answer (the handshake's are all in by
 * then, and nothing else subscribes). One ping at a time: no record, no
 * privdata, nothing to free.
 *   Stats: pings are internal round trips, like the handshake and TIME, so
 * they are not in `commands`, `replies`, `pending` or the RTT, which stay
 * the application's commands (backend_redis.c reads `commands` as "calls that
 * reached Redis"). An unanswered ping counts in `timeouts`, as a TIME
 * timeout does, and its drop in `disconnects`, with last_error saying so.
 *
 * A command record (struct cmd) has two owners: hiredis, from the moment it
 * accepts the command until it calls back (with a reply, or with NULL when
 * it frees the context), and the caller, until its callback ran (`done`).
 * Whichever lets go last frees it (done && !in_hiredis): a late reply to a
 * command that timed out, or a NULL reply from a context we dropped, only
 * frees the record and never reaches the caller again.
 *
 * Who frees a hiredis context:
 *  - we do, with redisAsyncFree(), when we drop it (a timeout, a handshake
 *    error, rds_free). Inside one of its reply callbacks hiredis defers that
 *    until the callback returns (REDIS_IN_CALLBACK); from a timer it is
 *    immediate and runs the NULL replies and onDisconnect synchronously.
 *    conn_detach() first clears ac->data and takes the live list, so those
 *    late callbacks find nothing to do.
 *  - hiredis does, right after onConnect(status != OK) and around
 *    onDisconnect (read/write error, EOF). We only detach then, and never
 *    touch that context again. In 0.14 neither callback runs under
 *    REDIS_IN_CALLBACK, so a redisAsyncFree() from there would free the
 *    context under hiredis' feet: onConnect never runs user code (nothing in
 *    it can reach rds_free), and onDisconnect detaches before user code runs.
 * The NULL replies of a dying context come before its onDisconnect: they
 * only mark the records; the callers are failed from onDisconnect, which
 * knows the reason.
 *
 * User code (command callbacks, hooks) may call rds_free(). `depth` counts
 * our frames on the stack, and the memory is released when the outermost
 * one returns; after user code we check `closing`.
 */
#include "redis.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <hiredis/adapters/libev.h>
#include <hiredis/async.h>
#include <hiredis/sds.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "rpc.h"

/* Generated by the Makefile from the sidecar/lua/ scripts, in enum
 * rds_script order: each script's full source, and its name. */
extern const char *const rds_script_src[RDS_N_SCRIPTS];
extern const char *const rds_script_name[RDS_N_SCRIPTS];

#define RDS_TIME_EVERY_S 60.0
/* The subscriber's ping period, from one answer to the next ping. Twice
 * command_timeout_s: the link's death is noticed within RDS_PING_EVERY +
 * command_timeout_s = 3 x command_timeout_s (3 s with the default 1 s), the
 * same order as the command connection, whose users wait at most
 * command_timeout_s; and each ping costs Redis one no-op SUBSCRIBE per 2
 * timeouts per sidecar (a fleet of 100 with 1 s: 50 a second, nothing).
 * The 1 s floor keeps a small timeout (0.3 s in tests) from becoming a
 * busy poll. The traffic also keeps NAT and load-balancer idle timers (tens
 * of seconds at least) from expiring in the first place. */
#define RDS_PING_EVERY(timeout_s) fmax(1.0, 2.0 * (timeout_s))
#define RDS_ERR_MAX 128
#define RDS_SHA_LEN 40
/* Lookup threads alive in the process, abandoned ones included: with a
 * resolver that hangs, each retry would otherwise leave one more thread
 * blocked in getaddrinfo(). Past the cap an attempt fails at once. */
#define RDS_MAX_LOOKUPS 8

static atomic_int rds_lookups;

enum rconn_kind { RC_CMD, RC_SUB, RC_N };
enum rconn_state { RC_DOWN, RC_RESOLVING, RC_CONNECTING, RC_HANDSHAKE, RC_UP };
enum cmd_kind { CMD_USER, CMD_AUTH, CMD_SELECT, CMD_LOAD, CMD_TIME };

/* One lookup of the host name on a detached thread. Shared by the thread
 * and the loop (two references); the loop gives up its reference when it
 * gets the answer or abandons the attempt (timeout, rds_free), the thread
 * when it is done, and the last one frees. The thread signals the loop only
 * while holding `mu` and only if the loop still wants the answer, so after
 * resolve_abandon() it never touches the loop or the watcher again. */
struct resolve {
    pthread_mutex_t mu;
    int refs;
    bool abandoned;                 /* the loop no longer wants the answer */
    struct ev_loop *loop;
    ev_async done_w;
    struct rconn *cn;               /* loop side only */
    int rc;                         /* getaddrinfo()'s, 0 = addr is set */
    char addr[INET6_ADDRSTRLEN];
    char host[256];
};

struct cmd {
    struct cmd *prev, *next;        /* the connection's live list */
    struct rconn *cn;               /* NULL once off the live list */
    enum cmd_kind kind;
    int script;                     /* CMD_USER: EVAL it on NOSCRIPT (-1: none); CMD_LOAD: which */
    bool setup;                     /* handshake: no own timer, counted in setup_left */
    bool done;                      /* the caller's side is over: no callback any more */
    bool in_hiredis;                /* hiredis holds it as privdata */
    bool retried;                   /* the EVAL fallback was sent */
    rds_cb *cb;
    void *ud;
    ev_timer timer_w;
    double sent_at;                 /* ev_time(), for the round-trip time */
    double sent_now;                /* ev_now(), for the clock offset */
    int argc;                       /* EVALSHA's arguments, kept for the EVAL fallback */
    const char **argv;
    size_t *argvlen;
    char nkeys[16];
};

struct rconn {
    struct rds *r;
    enum rconn_kind kind;
    enum rconn_state state;
    redisAsyncContext *ac;          /* NULL unless CONNECTING, HANDSHAKE or UP */
    struct resolve *res;            /* RESOLVING only */
    ev_timer connect_w;
    ev_timer retry_w;
    unsigned failures;              /* failed attempts in a row: the backoff exponent */
    unsigned setup_left;            /* handshake replies still awaited */
    size_t subs_left;               /* subscribe confirmations still awaited */
    bool time_inflight;             /* a periodic TIME sample is out */
    bool ping_out;                  /* subscriber: a ping is out, ping_w is its deadline */
    ev_timer ping_w;                /* subscriber, UP only: the next ping, or its deadline */
    const char *soon_why;           /* connect_w was set to fire at once for this reason */
    struct cmd *live;               /* sent and unanswered */
};

struct rds {
    struct ev_loop *loop;
    struct rds_addr addr;
    char where[300];                /* host:port or the socket path, for logs and stats */
    bool numeric;                   /* the host is an IP literal: no lookup */
    double timeout_s, min_s, max_s;
    char **channels;
    size_t *channel_len;
    size_t n_channels;
    struct rds_hooks hooks;
    struct rconn conn[RC_N];
    char sha[RDS_N_SCRIPTS][RDS_SHA_LEN + 1];
    double clock_offset;
    ev_timer time_w;
    ev_prepare flush_w;             /* writes queued commands before the loop polls */
    uint64_t rng;
    unsigned depth;                 /* our frames on the stack (see the top comment) */
    bool closing;
    struct rds_stats stats;
    char last_error[RDS_ERR_MAX];
};

static void conn_fail(struct rconn *cn, const char *why, bool hiredis_frees);
static void conn_check_ready(struct rconn *cn);

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (!err || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* --- URL ------------------------------------------------------------- */

static int hexval(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    ch = tolower(ch);
    return ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

/* Percent-decodes s[0..n) into out[cap] (the URL's `what`); -1 with a
 * reason on a malformed or NUL escape, or when it does not fit. The
 * reason never quotes the text (it may be the password). */
static int pct_decode(const char *s, size_t n, char *out, size_t cap, const char *what,
                      char *err, size_t errlen)
{
    size_t j = 0;

    for (size_t i = 0; i < n; i++) {
        int ch = (unsigned char)s[i];
        if (ch == '%') {
            if (n - i < 3 || hexval(s[i + 1]) < 0 || hexval(s[i + 2]) < 0 ||
                hexval(s[i + 1]) * 16 + hexval(s[i + 2]) == 0) {
                set_err(err, errlen, "bad percent-encoding in the %s (%%XX, not %%00)", what);
                return -1;
            }
            ch = hexval(s[i + 1]) * 16 + hexval(s[i + 2]);
            i += 2;
        }
        if (j + 1 >= cap) {
            set_err(err, errlen, "%s too long (max %zu bytes)", what, cap - 1);
            return -1;
        }
        out[j++] = (char)ch;
    }
    out[j] = '\0';
    return 0;
}

/* Parses a decimal number made only of digits, at most `max`. */
static int parse_uint(const char *s, size_t n, long long max, long long *v)
{
    long long x = 0;

    if (n == 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        x = x * 10 + (s[i] - '0');
        if (x > max)
            return -1;
    }
    *v = x;
    return 0;
}

static int parse_password(const char *s, size_t n, struct rds_addr *out, char *err,
                          size_t errlen)
{
    return pct_decode(s, n, out->password, sizeof(out->password), "password", err, errlen);
}

static int parse_db(const char *s, size_t n, struct rds_addr *out, char *err, size_t errlen)
{
    long long v;

    if (parse_uint(s, n, INT_MAX, &v) < 0) {
        set_err(err, errlen, "bad db (expected a number 0..%d)", INT_MAX);
        return -1;
    }
    out->db = (int)v;
    return 0;
}

/* redis://[[user]:password@]host[:port][/db]. The user info ends at the
 * LAST '@', so an unencoded '@' or '/' in the password still works. */
static int parse_tcp(const char *s, struct rds_addr *out, char *err, size_t errlen)
{
    const char *at = strrchr(s, '@'), *p = s;

    if (at) {
        const char *colon = memchr(s, ':', (size_t)(at - s));
        if (!colon) {
            set_err(err, errlen, "the part before '@' must be [user]:password");
            return -1;
        }
        size_t ulen = (size_t)(colon - s);
        if (ulen && !(ulen == 7 && strncmp(s, "default", 7) == 0)) {
            set_err(err, errlen, "user names other than 'default' are not supported "
                                 "(use redis://:password@host)");
            return -1;
        }
        if (parse_password(colon + 1, (size_t)(at - colon - 1), out, err, errlen) < 0)
            return -1;
        p = at + 1;
    }

    size_t hlen;
    if (*p == '[') {
        const char *close = strchr(p, ']');
        if (!close) {
            set_err(err, errlen, "unterminated '[' in the host");
            return -1;
        }
        hlen = (size_t)(close - p - 1);
        if (hlen == 0) {
            set_err(err, errlen, "empty host");
            return -1;
        }
        unsigned char tmp[sizeof(struct in6_addr)];
        if (hlen >= sizeof(out->host)) {
            set_err(err, errlen, "bad IPv6 address in the host");
            return -1;
        }
        memcpy(out->host, p + 1, hlen);
        out->host[hlen] = '\0';
        if (inet_pton(AF_INET6, out->host, tmp) != 1) {
            set_err(err, errlen, "bad IPv6 address in the host");
            return -1;
        }
        p = close + 1;
        if (*p && *p != ':' && *p != '/') {
            set_err(err, errlen, "unexpected characters after the host");
            return -1;
        }
    } else {
        hlen = strcspn(p, ":/");
        if (hlen == 0) {
            set_err(err, errlen, "empty host");
            return -1;
        }
        if (hlen >= sizeof(out->host)) {
            set_err(err, errlen, "host too long (max %zu bytes)", sizeof(out->host) - 1);
            return -1;
        }
        for (size_t i = 0; i < hlen; i++) {
            unsigned char ch = (unsigned char)p[i];
            if (!isalnum(ch) && ch != '-' && ch != '.' && ch != '_') {
                set_err(err, errlen, "bad character in the host (letters, digits, '-', '.', '_')");
                return -1;
            }
        }
        memcpy(out->host, p, hlen);
        out->host[hlen] = '\0';
        p += hlen;
    }

    if (*p == ':') {
        size_t n = strcspn(++p, "/");
        long long v;
        if (parse_uint(p, n, 65535, &v) < 0 || v == 0) {
            set_err(err, errlen, "bad port (expected 1..65535)");
            return -1;
        }
        out->port = (int)v;
        p += n;
    }
    if (*p == '/') {
        size_t n = strlen(++p);
        size_t digits = strspn(p, "0123456789");
        if (n && digits == 0) {
            set_err(err, errlen, "bad db (expected a number 0..%d)", INT_MAX);
            return -1;
        }
        if (digits && parse_db(p, digits, out, err, errlen) < 0)
            return -1;
        if (digits < n) {
            set_err(err, errlen, "unexpected characters after the db number");
            return -1;
        }
    }
    return 0;
}

/* unix:///path/to/socket[?db=N][&password=P] (parameters in any order). */
static int parse_unix(const char *s, struct rds_addr *out, char *err, size_t errlen)
{
    if (*s != '/') {
        set_err(err, errlen, "the socket path must be absolute (unix:///path)");
        return -1;
    }
    size_t n = strcspn(s, "?");
    if (pct_decode(s, n, out->path, sizeof(out->path), "socket path", err, errlen) < 0)
        return -1;
    out->port = 0;
    if (!s[n])
        return 0;

    bool have_db = false, have_pw = false;
    const char *p = s + n + 1;
    for (;;) {
        size_t len = strcspn(p, "&");
        if (len > 3 && strncmp(p, "db=", 3) == 0) {
            if (have_db) {
                set_err(err, errlen, "db given twice");
                return -1;
            }
            have_db = true;
            if (parse_db(p + 3, len - 3, out, err, errlen) < 0)
                return -1;
        } else if (len >= 9 && strncmp(p, "password=", 9) == 0) {
            if (have_pw) {
                set_err(err, errlen, "password given twice");
                return -1;
            }
            have_pw = true;
            if (parse_password(p + 9, len - 9, out, err, errlen) < 0)
                return -1;
        } else {
            /* The text is not echoed: it could be a mistyped password. */
            set_err(err, errlen, "bad query parameter (expected db=N or password=P)");
            return -1;
        }
        if (!p[len])
            return 0;
        p += len + 1;
    }
}

int rds_parse_url(const char *url, struct rds_addr *out, char *err, size_t errlen)
{
    int rc;

    memset(out, 0, sizeof(*out));
    out->port = 6379;
    if (!url) {
        set_err(err, errlen, "no URL");
        return -1;
    }
    if (strncasecmp(url, "redis://", 8) == 0)
        rc = parse_tcp(url + 8, out, err, errlen);
    else if (strncasecmp(url, "unix://", 7) == 0)
        rc = parse_unix(url + 7, out, err, errlen);
    else if (strncasecmp(url, "rediss://", 9) == 0) {
        set_err(err, errlen, "TLS (rediss://) is not supported");
        rc = -1;
    } else {
        set_err(err, errlen, "unsupported scheme (expected redis:// or unix://)");
        rc = -1;
    }
    if (rc < 0)
        explicit_bzero(out, sizeof(*out));
    return rc;
}

/* --- small helpers --------------------------------------------------- */

static const char *const conn_names[RC_N] = {"command", "subscriber"};

static const char *state_name(enum rconn_state s)
{
    static const char *const names[] = {"down", "resolving", "connecting", "handshake", "up"};
    return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s] : "unknown";
}

static void rds_enter(struct rds *r)
{
    r->depth++;
}

static void rds_destroy(struct rds *r);

/* Leaves one of our frames; the outermost one releases a closing adapter. */
static void rds_leave(struct rds *r)
{
    if (--r->depth == 0 && r->closing)
        rds_destroy(r);
}

/* A reason for logs, stats and hooks. Redis' error texts never echo AUTH's
 * argument, but a proxy in front of it might: a text that holds the
 * password is cut to its first word (the error code). */
static void rds_reason(const struct rds *r, const char *why, char *out, size_t cap)
{
    snprintf(out, cap, "%s", why && *why ? why : "unknown error");
    if (r->addr.password[0] && strstr(out, r->addr.password)) {
        out[strcspn(out, " ")] = '\0';
        if (strstr(out, r->addr.password))
            snprintf(out, cap, "error text withheld (it holds the password)");
    }
}

/* xorshift64: jitter only, nothing secret. */
static double rds_jitter(struct rds *r)
{
    uint64_t x = r->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    r->rng = x;
    return 0.5 + 0.5 * (double)(x >> 11) / 9007199254740992.0; /* [0.5, 1) */
}

/* --- command records ------------------------------------------------- */

static struct cmd *cmd_new(struct rds *r, enum cmd_kind kind, size_t extra)
{
    struct cmd *c = calloc(1, sizeof(*c) + extra);
    if (!c)
        return NULL;
    c->kind = kind;
    c->script = -1;
    ev_timer_init(&c->timer_w, NULL, r->timeout_s, 0.);
    c->timer_w.data = c;
    return c;
}

static void cmd_on_reply(redisAsyncContext *ac, void *reply, void *privdata);
static void cmd_on_timeout(struct ev_loop *loop, ev_timer *w, int revents);

static void cmd_link(struct rconn *cn, struct cmd *c)
{
    c->cn = cn;
    c->prev = NULL;
    c->next = cn->live;
    if (cn->live)
        cn->live->prev = c;
    cn->live = c;
}

static void cmd_unlink(struct cmd *c)
{
    struct rconn *cn = c->cn;

    if (!cn)
        return;
    if (c->prev)
        c->prev->next = c->next;
    else
        cn->live = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
    c->cn = NULL;
}

/* Hands `c` to hiredis on cn's context; on failure nothing changed. */
static int cmd_send(struct rconn *cn, struct cmd *c, int argc, const char **argv,
                    const size_t *argvlen)
{
    if (redisAsyncCommandArgv(cn->ac, cmd_on_reply, c, argc, argv, argvlen) != REDIS_OK)
        return -1;
    c->in_hiredis = true;
    c->sent_at = ev_time();
    c->sent_now = ev_now(cn->r->loop);
    cmd_link(cn, c);
    if (!ev_is_active(&cn->r->flush_w))
        ev_prepare_start(cn->r->loop, &cn->r->flush_w);
    return 0;
}

/* Before the loop polls: write what the commands of this loop turn queued
 * (all of them in one write per connection, as the write watcher would one
 * turn later). The adapter's write watcher was started by hiredis and is
 * stopped again by a complete write, both before libev applies watcher
 * changes to epoll: no epoll_ctl and no extra loop turn per command. */
static void rds_on_flush(struct ev_loop *loop, ev_prepare *w, int revents)
{
    struct rds *r = w->data;
    (void)revents;

    ev_prepare_stop(loop, w);
    rds_enter(r);
    for (int k = 0; k < RC_N && !r->closing; k++) {
        struct rconn *cn = &r->conn[k];
        if ((cn->state == RC_HANDSHAKE || cn->state == RC_UP) && cn->ac &&
            sdslen(cn->ac->c.obuf) > 0)
            redisAsyncHandleWrite(cn->ac); /* an error detaches cn (conn_on_disconnect) */
    }
    rds_leave(r);
}

static void cmd_start_timer(struct rds *r, struct cmd *c)
{
    ev_set_cb(&c->timer_w, cmd_on_timeout);
    ev_timer_set(&c->timer_w, r->timeout_s, 0.);
    ev_timer_start(r->loop, &c->timer_w);
}

/* The caller's side of `c` is over (answered, failed, timed out): off the
 * live list, no timer, and freed unless hiredis still holds it. */
static void cmd_finish(struct rds *r, struct cmd *c)
{
    if (c->cn && c->kind == CMD_TIME && !c->setup)
        c->cn->time_inflight = false;
    cmd_unlink(c);
    c->done = true;
    ev_timer_stop(r->loop, &c->timer_w);
    if (c->kind == CMD_USER)
        r->stats.pending--;
    if (!c->in_hiredis)
        free(c);
}

/* Fails every record of a list taken by conn_detach(). User callbacks run
 * here; `why` must outlive them. The list is ours alone, so a rds_free()
 * from a callback cannot pull it from under us. */
static void fail_list(struct rds *r, struct cmd *list, const char *why)
{
    while (list) {
        struct cmd *c = list;
        list = c->next;
        c->prev = c->next = NULL;
        rds_cb *cb = c->kind == CMD_USER ? c->cb : NULL;
        void *ud = c->ud;
        cmd_finish(r, c);
        if (cb)
            cb(NULL, why, ud);
    }
}

/* --- resolver thread ------------------------------------------------- */

static void resolve_destroy(struct resolve *res)
{
    pthread_mutex_destroy(&res->mu);
    free(res);
}

static void *resolve_main(void *arg)
{
    struct resolve *res = arg;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char addr[INET6_ADDRSTRLEN] = "";

    int rc = getaddrinfo(res->host, NULL, &hints, &ai);
    if (rc == 0) {
        /* IPv4 first, as hiredis' own resolution does. */
        const struct addrinfo *pick = NULL;
        for (const struct addrinfo *a = ai; a && !pick; a = a->ai_next)
            if (a->ai_family == AF_INET)
                pick = a;
        for (const struct addrinfo *a = ai; a && !pick; a = a->ai_next)
            if (a->ai_family == AF_INET6)
                pick = a;
        if (!pick)
            rc = EAI_FAMILY;
        else if (pick->ai_family == AF_INET)
            inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)pick->ai_addr)->sin_addr,
                      addr, sizeof(addr));
        else
            inet_ntop(AF_INET6,
                      &((const struct sockaddr_in6 *)(const void *)pick->ai_addr)->sin6_addr, addr,
                      sizeof(addr));
        freeaddrinfo(ai);
    }

    pthread_mutex_lock(&res->mu);
    res->rc = rc;
    memcpy(res->addr, addr, sizeof(addr));
    if (!res->abandoned)
        ev_async_send(res->loop, &res->done_w);
    bool last = --res->refs == 0;
    pthread_mutex_unlock(&res->mu);
    if (last)
        resolve_destroy(res);
    atomic_fetch_sub(&rds_lookups, 1);
    return NULL;
}

/* Drops the loop's reference. The watcher is stopped under the mutex, so
 * the thread can no longer be inside ev_async_send() on it. */
static void resolve_abandon(struct resolve *res)
{
    pthread_mutex_lock(&res->mu);
    res->abandoned = true;
    ev_async_stop(res->loop, &res->done_w);
    bool last = --res->refs == 0;
    pthread_mutex_unlock(&res->mu);
    if (last)
        resolve_destroy(res);
}

static void conn_connect(struct rconn *cn, const char *ip);

static void resolve_on_done(struct ev_loop *loop, ev_async *w, int revents)
{
    struct resolve *res = w->data;
    struct rconn *cn = res->cn;
    struct rds *r = cn->r;
    char addr[INET6_ADDRSTRLEN];
    int rc;

    (void)loop;
    (void)revents;
    pthread_mutex_lock(&res->mu);
    rc = res->rc;
    memcpy(addr, res->addr, sizeof(addr));
    pthread_mutex_unlock(&res->mu);
    cn->res = NULL;
    resolve_abandon(res);

    rds_enter(r);
    if (rc != 0) {
        char why[RDS_ERR_MAX];
        snprintf(why, sizeof(why), "cannot resolve the host: %s", gai_strerror(rc));
        conn_fail(cn, why, false);
    } else {
        conn_connect(cn, addr);
    }
    rds_leave(r);
}

/* Returns 0, -1 (out of resources) or -2 (too many lookups in flight). */
static int resolve_start(struct rconn *cn)
{
    struct rds *r = cn->r;
    struct resolve *res;
    pthread_attr_t attr;
    pthread_t tid;
    sigset_t all, old;

    if (atomic_fetch_add(&rds_lookups, 1) >= RDS_MAX_LOOKUPS) {
        atomic_fetch_sub(&rds_lookups, 1);
        return -2;
    }
    res = calloc(1, sizeof(*res));
    if (!res || pthread_mutex_init(&res->mu, NULL) != 0) {
        free(res);
        atomic_fetch_sub(&rds_lookups, 1);
        return -1;
    }
    res->refs = 2;
    res->loop = r->loop;
    res->cn = cn;
    snprintf(res->host, sizeof(res->host), "%s", r->addr.host);
    ev_async_init(&res->done_w, resolve_on_done);
    res->done_w.data = res;
    ev_async_start(r->loop, &res->done_w);

    if (pthread_attr_init(&attr) != 0) {
        ev_async_stop(r->loop, &res->done_w);
        resolve_destroy(res);
        atomic_fetch_sub(&rds_lookups, 1);
        return -1;
    }
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* The thread inherits a full signal mask: signals stay with the loop. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&tid, &attr, resolve_main, res);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        ev_async_stop(r->loop, &res->done_w);
        resolve_destroy(res);
        atomic_fetch_sub(&rds_lookups, 1);
        return -1;
    }
    cn->res = res;
    return 0;
}

/* --- connection state machine ---------------------------------------- */

static void conn_set_state(struct rconn *cn, enum rconn_state to)
{
    if (cn->state == to)
        return;
    log_at(LOG_DEBUG, "redis state", "conn", LOG_S, conn_names[cn->kind], "from", LOG_S,
           state_name(cn->state), "to", LOG_S, state_name(to), NULL);
    cn->state = to;
}

/* Ends the connection or the attempt: no timer, no lookup, no context (ours
 * is freed unless hiredis is freeing it), and returns the live list for
 * fail_list(). Runs no user code. */
static struct cmd *conn_detach(struct rconn *cn, bool hiredis_frees)
{
    struct rds *r = cn->r;
    struct cmd *list = cn->live;

    ev_timer_stop(r->loop, &cn->connect_w);
    if (cn->res) {
        resolve_abandon(cn->res);
        cn->res = NULL;
    }
    cn->live = NULL;
    for (struct cmd *c = list; c; c = c->next)
        c->cn = NULL;
    cn->time_inflight = false;
    ev_timer_stop(r->loop, &cn->ping_w);
    cn->ping_out = false;
    cn->setup_left = 0;
    cn->subs_left = 0;
    cn->soon_why = NULL;
    if (cn->kind == RC_CMD)
        ev_timer_stop(r->loop, &r->time_w);

    redisAsyncContext *ac = cn->ac;
    cn->ac = NULL;
    if (ac) {
        ac->data = NULL;
        if (!hiredis_frees)
            redisAsyncFree(ac); /* deferred by hiredis when inside its callback */
    }
    return list;
}

static double conn_backoff(struct rconn *cn)
{
    struct rds *r = cn->r;
    unsigned n = cn->failures ? cn->failures - 1 : 0;
    double d = r->min_s * ldexp(1.0, n > 30 ? 30 : (int)n);

    if (d > r->max_s)
        d = r->max_s;
    return d * rds_jitter(r);
}

/* The single failure path: see the diagram at the top. */
static void conn_fail(struct rconn *cn, const char *why, bool hiredis_frees)
{
    struct rds *r = cn->r;
    char reason[RDS_ERR_MAX];

    if (cn->state == RC_DOWN)
        return;
    bool was_up = cn->state == RC_UP;
    rds_reason(r, why, reason, sizeof(reason)); /* `why` may live in the context */
    struct cmd *list = conn_detach(cn, hiredis_frees);
    conn_set_state(cn, RC_DOWN);
    cn->failures++;
    snprintf(r->last_error, sizeof(r->last_error), "%s", reason);
    if (was_up)
        r->stats.disconnects++;
    else
        r->stats.connect_failures++;

    if (!r->closing) {
        double delay = conn_backoff(cn);
        ev_timer_set(&cn->retry_w, delay, 0.);
        ev_timer_start(r->loop, &cn->retry_w);
        if (was_up)
            log_at(LOG_WARN, "redis connection lost", "conn", LOG_S, conn_names[cn->kind],
                   "address", LOG_S, r->where, "reason", LOG_S, reason, "retry_in_s", LOG_F,
                   delay, NULL);
        else
            log_at(cn->failures == 1 ? LOG_WARN : LOG_INFO, "redis connect failed", "conn",
                   LOG_S, conn_names[cn->kind], "address", LOG_S, r->where, "reason", LOG_S,
                   reason, "failures", LOG_U, (unsigned long long)cn->failures, "retry_in_s",
                   LOG_F, delay, NULL);
    }

    for (const struct cmd *c = list; c; c = c->next)
        r->stats.lost++;
    fail_list(r, list, "connection lost");
    if (!was_up || r->closing)
        return;
    if (cn->kind == RC_CMD && r->hooks.on_down)
        r->hooks.on_down(r, reason, r->hooks.ud);
    else if (cn->kind == RC_SUB && r->hooks.on_unsubscribed)
        r->hooks.on_unsubscribed(r, r->hooks.ud);
}

static void conn_up(struct rconn *cn)
{
    struct rds *r = cn->r;

    ev_timer_stop(r->loop, &cn->connect_w);
    conn_set_state(cn, RC_UP);
    cn->failures = 0;
    r->stats.connects++;
    log_at(LOG_INFO, "redis connected", "conn", LOG_S, conn_names[cn->kind], "address", LOG_S,
           r->where, NULL);
    if (cn->kind == RC_CMD) {
        ev_timer_set(&r->time_w, RDS_TIME_EVERY_S, RDS_TIME_EVERY_S);
        ev_timer_start(r->loop, &r->time_w);
        if (r->hooks.on_up)
            r->hooks.on_up(r, r->hooks.ud);
    } else {
        cn->ping_out = false;
        ev_timer_stop(r->loop, &cn->ping_w);
        ev_timer_set(&cn->ping_w, RDS_PING_EVERY(r->timeout_s), 0.);
        ev_timer_start(r->loop, &cn->ping_w);
        if (r->hooks.on_subscribed)
            r->hooks.on_subscribed(r, r->hooks.ud);
    }
}

static void conn_check_ready(struct rconn *cn)
{
    if (cn->state == RC_HANDSHAKE && cn->setup_left == 0 && cn->subs_left == 0)
        conn_up(cn);
}

/* Makes connect_w fire on the next loop iteration and fail the attempt:
 * for failures found inside onConnect, where freeing the context is not
 * allowed (see the top comment). */
static void conn_fail_soon(struct rconn *cn, const char *why)
{
    struct rds *r = cn->r;

    cn->soon_why = why;
    ev_timer_stop(r->loop, &cn->connect_w);
    ev_timer_set(&cn->connect_w, 0., 0.);
    ev_timer_start(r->loop, &cn->connect_w);
}

static int setup_send(struct rconn *cn, enum cmd_kind kind, int script, int argc,
                      const char **argv, const size_t *argvlen)
{
    struct cmd *c = cmd_new(cn->r, kind, 0);

    if (!c)
        return -1;
    c->setup = true;
    c->script = script;
    if (cmd_send(cn, c, argc, argv, argvlen) < 0) {
        free(c);
        return -1;
    }
    cn->setup_left++;
    return 0;
}

/* Subscriber replies: subscribe confirmations, then messages. hiredis keeps
 * this callback per channel and calls it with NULL for each one when it
 * frees the context; onDisconnect handles that. */
static void sub_on_reply(redisAsyncContext *ac, void *reply_, void *privdata)
{
    struct rconn *cn = ac->data;
    const redisReply *reply = reply_;

    (void)privdata;
    if (!cn || !reply || reply->type != REDIS_REPLY_ARRAY || reply->elements < 3 ||
        reply->element[0]->type != REDIS_REPLY_STRING ||
        reply->element[1]->type != REDIS_REPLY_STRING)
        return;
    struct rds *r = cn->r;
    const redisReply *kind = reply->element[0], *chan = reply->element[1];
    rds_enter(r);
    if (strcasecmp(kind->str, "message") == 0 && reply->element[2]->type == REDIS_REPLY_STRING) {
        r->stats.messages++;
        for (size_t i = 0; i < r->n_channels; i++) {
            if (r->channel_len[i] == chan->len && memcmp(r->channels[i], chan->str, chan->len) == 0) {
                if (r->hooks.on_message)
                    r->hooks.on_message(r, i, reply->element[2]->str, reply->element[2]->len,
                                        r->hooks.ud);
                break;
            }
        }
    } else if (strcasecmp(kind->str, "subscribe") == 0) {
        if (cn->subs_left > 0) {
            cn->subs_left--;
            conn_check_ready(cn);
        } else if (cn->state == RC_UP && cn->ping_out) {
            /* The ping's answer: the next one in RDS_PING_EVERY. */
            cn->ping_out = false;
            ev_timer_stop(r->loop, &cn->ping_w);
            ev_timer_set(&cn->ping_w, RDS_PING_EVERY(r->timeout_s), 0.);
            ev_timer_start(r->loop, &cn->ping_w);
        }
    }
    rds_leave(r);
}

/* ping_w: sends the subscriber's ping, or finds it unanswered (see the top
 * comment). */
static void sub_on_ping(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct rconn *cn = w->data;
    struct rds *r = cn->r;

    (void)loop;
    (void)revents;
    if (cn->state != RC_UP || r->closing)
        return;
    rds_enter(r);
    if (cn->ping_out) {
        r->stats.timeouts++;
        conn_fail(cn, "subscriber ping timeout", false);
    } else {
        const char *argv[] = {"SUBSCRIBE", r->channels[0]};
        const size_t lens[] = {9, r->channel_len[0]};
        if (redisAsyncCommandArgv(cn->ac, sub_on_reply, NULL, 2, argv, lens) != REDIS_OK) {
            conn_fail(cn, "cannot send the subscriber ping", false);
        } else {
            cn->ping_out = true;
            ev_timer_set(&cn->ping_w, r->timeout_s, 0.);
            ev_timer_start(r->loop, &cn->ping_w);
        }
    }
    rds_leave(r);
}

static int sub_send(struct rconn *cn)
{
    struct rds *r = cn->r;
    size_t n = r->n_channels + 1;
    const char **argv = malloc(n * sizeof(*argv));
    size_t *lens = malloc(n * sizeof(*lens));
    int rc = -1;

    if (argv && lens && n <= INT_MAX) {
        argv[0] = "SUBSCRIBE";
        lens[0] = 9;
        for (size_t i = 0; i < r->n_channels; i++) {
            argv[i + 1] = r->channels[i];
            lens[i + 1] = r->channel_len[i];
        }
        if (redisAsyncCommandArgv(cn->ac, sub_on_reply, NULL, (int)n, argv, lens) == REDIS_OK) {
            cn->subs_left = r->n_channels;
            rc = 0;
        }
    }
    free(argv);
    free(lens);
    return rc;
}

/* Pipelines the handshake behind the fresh connection. */
static void conn_handshake(struct rconn *cn)
{
    struct rds *r = cn->r;
    int rc = 0;

    conn_set_state(cn, RC_HANDSHAKE);
    ev_timer_stop(r->loop, &cn->connect_w);
    ev_timer_set(&cn->connect_w, r->timeout_s, 0.);
    ev_timer_start(r->loop, &cn->connect_w);
    if (!r->addr.path[0])
        redisEnableKeepAlive(&cn->ac->c); /* finds a dead peer on a quiet link */

    if (r->addr.password[0]) {
        const char *argv[] = {"AUTH", r->addr.password};
        rc |= setup_send(cn, CMD_AUTH, -1, 2, argv, NULL);
    }
    if (r->addr.db != 0) {
        char db[16];
        snprintf(db, sizeof(db), "%d", r->addr.db);
        const char *argv[] = {"SELECT", db};
        rc |= setup_send(cn, CMD_SELECT, -1, 2, argv, NULL);
    }
    if (cn->kind == RC_CMD) {
        for (int i = 0; i < RDS_N_SCRIPTS; i++) {
            const char *argv[] = {"SCRIPT", "LOAD", rds_script_src[i]};
            rc |= setup_send(cn, CMD_LOAD, i, 3, argv, NULL);
        }
        const char *argv[] = {"TIME"};
        rc |= setup_send(cn, CMD_TIME, -1, 1, argv, NULL);
    } else if (rc == 0) {
        rc = sub_send(cn);
    }
    if (rc != 0)
        conn_fail_soon(cn, "cannot queue the handshake (out of memory)");
}

/* hiredis: the non-blocking connect finished. Runs no user code and never
 * frees the context (see the top comment). */
static void conn_on_connect(const redisAsyncContext *ac, int status)
{
    struct rconn *cn = ac->data;

    if (!cn)
        return;
    struct rds *r = cn->r;
    rds_enter(r);
    if (status != REDIS_OK)
        conn_fail(cn, ac->c.err ? ac->c.errstr : "connect failed", true);
    else
        conn_handshake(cn);
    rds_leave(r);
}

/* hiredis: the context is being freed (error, EOF, or our redisAsyncFree,
 * in which case ac->data is already NULL). */
static void conn_on_disconnect(const redisAsyncContext *ac, int status)
{
    struct rconn *cn = ac->data;

    (void)status;
    if (!cn)
        return;
    struct rds *r = cn->r;
    rds_enter(r);
    conn_fail(cn, ac->c.err ? ac->c.errstr : "connection closed", true);
    rds_leave(r);
}

static void conn_connect(struct rconn *cn, const char *ip)
{
    struct rds *r = cn->r;
    redisAsyncContext *ac = r->addr.path[0] ? redisAsyncConnectUnix(r->addr.path)
                                            : redisAsyncConnect(ip, r->addr.port);
    char why[RDS_ERR_MAX];

    if (!ac) {
        conn_fail(cn, "out of memory", false);
        return;
    }
    if (ac->c.err) {
        snprintf(why, sizeof(why), "%s", ac->c.errstr);
        redisAsyncFree(ac); /* not connected: no callback runs */
        conn_fail(cn, why, false);
        return;
    }
    if (redisLibevAttach(r->loop, ac) != REDIS_OK) {
        redisAsyncFree(ac);
        conn_fail(cn, "cannot attach to the loop", false);
        return;
    }
    ac->data = cn;
    cn->ac = ac;
    redisAsyncSetConnectCallback(ac, conn_on_connect);
    redisAsyncSetDisconnectCallback(ac, conn_on_disconnect);
    conn_set_state(cn, RC_CONNECTING);
}

/* One attempt, from DOWN. */
static void conn_attempt(struct rconn *cn)
{
    struct rds *r = cn->r;

    cn->soon_why = NULL;
    ev_timer_set(&cn->connect_w, r->timeout_s, 0.);
    ev_timer_start(r->loop, &cn->connect_w);
    if (r->addr.path[0] || r->numeric) {
        conn_set_state(cn, RC_CONNECTING);
        conn_connect(cn, r->addr.host);
        return;
    }
    conn_set_state(cn, RC_RESOLVING);
    int rc = resolve_start(cn);
    if (rc == -2)
        conn_fail(cn, "too many host-name lookups in flight (is the resolver hanging?)", false);
    else if (rc < 0)
        conn_fail(cn, "cannot start a resolver thread", false);
}

static void conn_on_retry(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct rconn *cn = w->data;
    struct rds *r = cn->r;

    (void)loop;
    (void)revents;
    rds_enter(r);
    if (cn->state == RC_DOWN && !r->closing)
        conn_attempt(cn);
    rds_leave(r);
}

static void conn_on_connect_timeout(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct rconn *cn = w->data;
    struct rds *r = cn->r;
    const char *why = cn->soon_why;

    (void)loop;
    (void)revents;
    if (!why)
        why = cn->state == RC_RESOLVING    ? "timeout resolving the host"
              : cn->state == RC_CONNECTING ? "connect timeout"
                                           : "handshake timeout";
    rds_enter(r);
    conn_fail(cn, why, false);
    rds_leave(r);
}

/* --- replies ---------------------------------------------------------- */

static void time_sample(struct rds *r, const struct cmd *c, const redisReply *reply)
{
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
        reply->element[0]->type != REDIS_REPLY_STRING ||
        reply->element[1]->type != REDIS_REPLY_STRING)
        return;
    double s = strtod(reply->element[0]->str, NULL), us = strtod(reply->element[1]->str, NULL);
    double mid = (c->sent_now + ev_now(r->loop)) / 2;
    r->clock_offset = s + us / 1e6 - mid;
}

/* A handshake or TIME reply. */
static void internal_reply(struct rds *r, struct cmd *c, const redisReply *reply)
{
    static const char *const what[] = {"", "AUTH", "SELECT", "SCRIPT LOAD", "TIME"};
    struct rconn *cn = c->cn;
    enum cmd_kind kind = c->kind;
    bool setup = c->setup;
    int script = c->script;
    char why[RDS_ERR_MAX];

    if (kind == CMD_TIME)
        time_sample(r, c, reply);
    cmd_finish(r, c);
    if (reply->type == REDIS_REPLY_ERROR) {
        snprintf(why, sizeof(why), "%s refused: %s", what[kind], reply->str);
        conn_fail(cn, why, false);
        return;
    }
    if (kind == CMD_LOAD) {
        if (reply->type != REDIS_REPLY_STRING || reply->len != RDS_SHA_LEN) {
            snprintf(why, sizeof(why), "SCRIPT LOAD %s: unexpected reply", rds_script_name[script]);
            conn_fail(cn, why, false);
            return;
        }
        memcpy(r->sha[script], reply->str, RDS_SHA_LEN);
        r->sha[script][RDS_SHA_LEN] = '\0';
    }
    if (setup && cn->setup_left > 0) {
        cn->setup_left--;
        conn_check_ready(cn);
    }
}

static void user_reply(struct rds *r, struct cmd *c, const redisReply *reply)
{
    bool is_err = reply->type == REDIS_REPLY_ERROR;

    if (is_err && c->script >= 0 && !c->retried && reply->str &&
        strncmp(reply->str, "NOSCRIPT", 8) == 0) {
        /* The server lost its script cache: EVAL the source once, same
         * record, same timer (what is left of it). EVAL caches it again. */
        c->retried = true;
        c->argv[0] = "EVAL";
        c->argvlen[0] = 4;
        c->argv[1] = rds_script_src[c->script];
        c->argvlen[1] = strlen(rds_script_src[c->script]);
        if (redisAsyncCommandArgv(c->cn->ac, cmd_on_reply, c, c->argc, c->argv, c->argvlen) ==
            REDIS_OK) {
            c->in_hiredis = true;
            r->stats.noscript_reloads++;
            return;
        }
    }
    double rtt = ev_time() - c->sent_at;
    rds_cb *cb = c->cb;
    void *ud = c->ud;
    r->stats.replies++;
    r->stats.rtt_sum_s += rtt;
    prom_hist_observe(&r->stats.rtt, rtt);
    if (rtt > r->stats.rtt_max_s)
        r->stats.rtt_max_s = rtt;
    if (is_err)
        r->stats.errors++;
    cmd_finish(r, c);
    if (is_err)
        cb(NULL, reply->str && *reply->str ? reply->str : "error", ud);
    else
        cb(reply, NULL, ud);
}

static void cmd_on_reply(redisAsyncContext *ac, void *reply, void *privdata)
{
    struct cmd *c = privdata;

    (void)ac;
    c->in_hiredis = false;
    if (c->done) {
        free(c);
        return;
    }
    /* Off the live list: a fail_list() in progress will fail it. NULL: the
     * context is going away; onDisconnect fails it with the reason. */
    if (!c->cn || !reply)
        return;
    struct rds *r = c->cn->r;
    rds_enter(r);
    if (c->kind == CMD_USER)
        user_reply(r, c, reply);
    else
        internal_reply(r, c, reply);
    rds_leave(r);
}

/* A round trip outlived command_timeout_s: the command fails at once and
 * the connection goes, since hiredis cannot skip the missing reply. */
static void cmd_on_timeout(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct cmd *c = w->data;
    struct rconn *cn = c->cn;
    struct rds *r = cn->r;
    rds_cb *cb = c->kind == CMD_USER ? c->cb : NULL;
    void *ud = c->ud;

    (void)loop;
    (void)revents;
    rds_enter(r);
    r->stats.timeouts++;
    cmd_finish(r, c);
    conn_fail(cn, cb ? "command timeout" : "TIME timeout", false);
    if (cb)
        cb(NULL, "timeout", ud);
    rds_leave(r);
}

/* Re-samples the clock offset while up. */
static void time_on_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct rds *r = w->data;
    struct rconn *cn = &r->conn[RC_CMD];

    (void)loop;
    (void)revents;
    if (cn->state != RC_UP || cn->time_inflight || r->closing)
        return;
    struct cmd *c = cmd_new(r, CMD_TIME, 0);
    const char *argv[] = {"TIME"};
    if (!c)
        return;
    if (cmd_send(cn, c, 1, argv, NULL) < 0) {
        free(c);
        return;
    }
    cn->time_inflight = true;
    cmd_start_timer(r, c);
}

/* --- public ---------------------------------------------------------- */

static void rds_teardown(struct rds *r)
{
    ev_timer_stop(r->loop, &r->time_w);
    ev_prepare_stop(r->loop, &r->flush_w);
    for (int k = 0; k < RC_N; k++) {
        struct rconn *cn = &r->conn[k];
        ev_timer_stop(r->loop, &cn->retry_w);
        struct cmd *list = conn_detach(cn, false);
        cn->state = RC_DOWN;
        fail_list(r, list, "closed");
    }
}

static void rds_destroy(struct rds *r)
{
    r->depth = 1; /* pinned: callbacks run by the teardown must not free us again */
    rds_teardown(r);
    for (size_t i = 0; i < r->n_channels; i++)
        free(r->channels[i]);
    free(r->channels);
    free(r->channel_len);
    explicit_bzero(&r->addr, sizeof(r->addr));
    free(r);
}

void rds_free(struct rds *r)
{
    if (!r || r->closing)
        return;
    r->closing = true;
    rds_enter(r);
    rds_teardown(r);
    rds_leave(r);
}

struct rds *rds_new(struct ev_loop *loop, const struct rds_opts *opts,
                    const struct rds_hooks *hooks, char *err, size_t errlen)
{
    char perr[RDS_ERR_MAX];

    if (!loop || !opts || !opts->url) {
        set_err(err, errlen, "redis: no URL");
        return NULL;
    }
    if (!(opts->command_timeout_s > 0) || !isfinite(opts->command_timeout_s) ||
        !(opts->reconnect_min_s > 0) || !isfinite(opts->reconnect_min_s) ||
        !(opts->reconnect_max_s >= opts->reconnect_min_s) || !isfinite(opts->reconnect_max_s)) {
        set_err(err, errlen, "redis: timeouts must be positive (and reconnect_max_s >= "
                             "reconnect_min_s)");
        return NULL;
    }
    if (opts->n_channels && !opts->channels) {
        set_err(err, errlen, "redis: no channel names");
        return NULL;
    }
    struct rds *r = calloc(1, sizeof(*r));
    if (!r) {
        set_err(err, errlen, "out of memory");
        return NULL;
    }
    prom_hist_init(&r->stats.rtt, &prom_buckets_rtt_s);
    ev_timer_init(&r->time_w, time_on_tick, RDS_TIME_EVERY_S, RDS_TIME_EVERY_S);
    ev_prepare_init(&r->flush_w, rds_on_flush);
    r->flush_w.data = r;
    r->time_w.data = r;
    for (int k = 0; k < RC_N; k++) {
        struct rconn *cn = &r->conn[k];
        cn->r = r;
        cn->kind = (enum rconn_kind)k;
        cn->state = RC_DOWN;
        ev_timer_init(&cn->connect_w, conn_on_connect_timeout, 0., 0.);
        cn->connect_w.data = cn;
        ev_timer_init(&cn->retry_w, conn_on_retry, 0., 0.);
        cn->retry_w.data = cn;
        ev_timer_init(&cn->ping_w, sub_on_ping, 0., 0.);
        cn->ping_w.data = cn;
    }
    if (rds_parse_url(opts->url, &r->addr, perr, sizeof(perr)) < 0) {
        set_err(err, errlen, "redis URL: %s", perr);
        free(r);
        return NULL;
    }
    r->loop = loop;
    r->timeout_s = opts->command_timeout_s;
    r->min_s = opts->reconnect_min_s;
    r->max_s = opts->reconnect_max_s;
    if (hooks)
        r->hooks = *hooks;
    r->clock_offset = NAN;
    r->rng = ((uint64_t)getpid() << 32) ^ (uint64_t)(ev_time() * 1e6) ^ (uint64_t)(uintptr_t)r;
    if (!r->rng)
        r->rng = 0x9e3779b97f4a7c15ULL;

    if (opts->n_channels) {
        r->channels = calloc(opts->n_channels, sizeof(*r->channels));
        r->channel_len = calloc(opts->n_channels, sizeof(*r->channel_len));
        if (!r->channels || !r->channel_len)
            goto oom;
        r->n_channels = opts->n_channels;
        for (size_t i = 0; i < opts->n_channels; i++) {
            if (!opts->channels[i]) {
                set_err(err, errlen, "redis: channel %zu has no name", i);
                rds_destroy(r);
                return NULL;
            }
            r->channels[i] = strdup(opts->channels[i]);
            if (!r->channels[i])
                goto oom;
            r->channel_len[i] = strlen(r->channels[i]);
        }
    }

    unsigned char tmp[sizeof(struct in6_addr)];
    if (r->addr.path[0]) {
        snprintf(r->where, sizeof(r->where), "%s", r->addr.path);
    } else if (inet_pton(AF_INET6, r->addr.host, tmp) == 1) {
        r->numeric = true;
        snprintf(r->where, sizeof(r->where), "[%s]:%d", r->addr.host, r->addr.port);
    } else {
        r->numeric = inet_pton(AF_INET, r->addr.host, tmp) == 1;
        snprintf(r->where, sizeof(r->where), "%s:%d", r->addr.host, r->addr.port);
    }

    /* First attempts on the next loop iteration: nothing runs in here. */
    ev_timer_start(loop, &r->conn[RC_CMD].retry_w);
    if (r->n_channels)
        ev_timer_start(loop, &r->conn[RC_SUB].retry_w);
    return r;

oom:
    set_err(err, errlen, "out of memory");
    rds_destroy(r);
    return NULL;
}

bool rds_up(const struct rds *r)
{
    return r && !r->closing && r->conn[RC_CMD].state == RC_UP;
}

bool rds_subscribed(const struct rds *r)
{
    return r && !r->closing && r->conn[RC_SUB].state == RC_UP;
}

int rds_eval(struct rds *r, enum rds_script s, int nkeys, int argc, const char **argv,
             const size_t *argvlen, rds_cb *cb, void *ud)
{
    if (!r || r->closing || (unsigned)s >= RDS_N_SCRIPTS || !cb || argc < 0 || nkeys < 0 ||
        nkeys > argc || argc > INT_MAX - 3 || (argc > 0 && !argv))
        return -1;
    struct rconn *cn = &r->conn[RC_CMD];
    if (cn->state != RC_UP) {
        r->stats.rejected_not_connected++;
        return -1;
    }

    /* One block: the record, then argv[argc + 3], argvlen[argc + 3], the bytes. */
    size_t n = (size_t)argc + 3, bytes = 0;
    for (int i = 0; i < argc; i++) {
        size_t len = argvlen ? argvlen[i] : argv[i] ? strlen(argv[i]) : 0;
        if ((!argv[i] && len) || len > SIZE_MAX / 2 - bytes)
            return -1;
        bytes += len;
    }
    struct cmd *c = cmd_new(r, CMD_USER, n * (sizeof(char *) + sizeof(size_t)) + bytes);
    if (!c)
        return -1;
    c->argv = (const char **)(void *)(c + 1);
    c->argvlen = (size_t *)(void *)(c->argv + n);
    char *p = (char *)(c->argvlen + n);
    snprintf(c->nkeys, sizeof(c->nkeys), "%d", nkeys);
    c->argv[0] = "EVALSHA";
    c->argvlen[0] = 7;
    c->argv[1] = r->sha[s];
    c->argvlen[1] = RDS_SHA_LEN;
    c->argv[2] = c->nkeys;
    c->argvlen[2] = strlen(c->nkeys);
    for (int i = 0; i < argc; i++) {
        size_t len = argvlen ? argvlen[i] : argv[i] ? strlen(argv[i]) : 0;
        if (len)
            memcpy(p, argv[i], len);
        c->argv[i + 3] = p;
        c->argvlen[i + 3] = len;
        p += len;
    }
    c->argc = (int)n;
    c->script = (int)s;
    c->cb = cb;
    c->ud = ud;
    if (cmd_send(cn, c, c->argc, c->argv, c->argvlen) < 0) {
        free(c);
        return -1;
    }
    cmd_start_timer(r, c);
    r->stats.commands++;
    r->stats.pending++;
    return 0;
}

int rds_command(struct rds *r, int argc, const char **argv, const size_t *argvlen, rds_cb *cb,
                void *ud)
{
    static const char *const refused[] = {"subscribe", "psubscribe", "unsubscribe",
                                          "punsubscribe", "monitor"};

    if (!r || r->closing || !cb || argc < 1 || !argv || !argv[0])
        return -1;
    /* These change the connection's protocol state under hiredis. */
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        size_t len = argvlen ? argvlen[0] : strlen(argv[0]);
        if (len == strlen(refused[i]) && strncasecmp(argv[0], refused[i], len) == 0)
            return -1;
    }
    struct rconn *cn = &r->conn[RC_CMD];
    if (cn->state != RC_UP) {
        r->stats.rejected_not_connected++;
        return -1;
    }
    struct cmd *c = cmd_new(r, CMD_USER, 0);
    if (!c)
        return -1;
    c->cb = cb;
    c->ud = ud;
    if (cmd_send(cn, c, argc, argv, argvlen) < 0) {
        free(c);
        return -1;
    }
    cmd_start_timer(r, c);
    r->stats.commands++;
    r->stats.pending++;
    return 0;
}

double rds_clock_offset(const struct rds *r)
{
    return r->clock_offset;
}

const struct rds_stats *rds_get_stats(const struct rds *r)
{
    return &r->stats;
}

void rds_pack_stats(const struct rds *r, msgpack_packer *pk)
{
    const struct rds_stats *s = &r->stats;
    const struct rconn *cn = &r->conn[RC_CMD];
    const char *state = cn->state == RC_UP ? "up" : cn->state == RC_DOWN ? "down" : "connecting";
    double retry_in = 0;

    if (cn->state == RC_DOWN && ev_is_active(&cn->retry_w))
        retry_in = ev_timer_remaining(r->loop, (ev_timer *)&cn->retry_w);
    if (retry_in < 0)
        retry_in = 0;

    msgpack_pack_map(pk, 19);
    rpc_pack_kv_str(pk, "kind", "redis");
    rpc_pack_kv_str(pk, "state", state);
    rpc_pack_str(pk, "subscribed");
    if (rds_subscribed(r))
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
    rpc_pack_kv_str(pk, "address", r->where);
    rpc_pack_kv_u64(pk, "connects", s->connects);
    rpc_pack_kv_u64(pk, "disconnects", s->disconnects);
    rpc_pack_kv_u64(pk, "connect_failures", s->connect_failures);
    rpc_pack_kv_u64(pk, "commands", s->commands);
    rpc_pack_kv_u64(pk, "replies", s->replies);
    rpc_pack_kv_u64(pk, "errors", s->errors);
    rpc_pack_kv_u64(pk, "timeouts", s->timeouts);
    rpc_pack_kv_u64(pk, "noscript_reloads", s->noscript_reloads);
    rpc_pack_kv_u64(pk, "rejected_not_connected", s->rejected_not_connected);
    rpc_pack_kv_u64(pk, "messages", s->messages);
    rpc_pack_kv_u64(pk, "pending", s->pending);
    rpc_pack_kv_double(pk, "rtt_avg_ms", s->replies ? s->rtt_sum_s / (double)s->replies * 1e3 : 0);
    rpc_pack_kv_double(pk, "rtt_max_ms", s->rtt_max_s * 1e3);
    rpc_pack_kv_str(pk, "last_error", r->last_error);
    rpc_pack_kv_double(pk, "next_retry_in_s", retry_in);
}
