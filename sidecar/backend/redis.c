/*
 * redis.c — hiredis 0.14's async API on the sidecar's libev loop, plus what
 * hiredis leaves to its user: name resolution off the loop, connect and
 * command timeouts, reconnection with backoff, the embedded scripts and
 * their NOSCRIPT fallback. redis.h holds the contract.
 *
 * Each connection (commands, subscriber, and with sentinels a third one to
 * the sentinel whose turn it is) runs this machine; it changes state only
 * in conn_set_state():
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
 * Sentinel. The sentinel connection's handshake is AUTH (the sentinels'
 * own credentials), SENTINEL get-master-addr-by-name and SUBSCRIBE
 * +switch-master, pipelined; UP means subscribed, and it is pinged like the
 * subscriber. Its answer goes to primary_set(), which is also where a
 * +switch-master lands: a new address drops the data connections and
 * starts them at once. The data connections' handshake gains ROLE; they
 * have no target until the first answer (conn_target). A data connection
 * that fails (ROLE not master included) re-asks through sen_refresh(),
 * which re-makes the sentinel link to the next sentinel without backoff:
 * the subscribed link cannot send the question again. A sentinel that
 * fails passes the turn to the next one, at once; a whole round that fails
 * backs off.
 *
 * TLS (redis_tls.h): conn_connect() slides the bridge under the context
 * before it is attached; conn_detach() frees it with the context. Its
 * failure reaches us as an ordinary EOF, and conn_fail() then prefers the
 * bridge's reason.
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
 * hiredis 0.14 work-arounds, each marked "hiredis 0.14:" where it lives,
 * to delete on an upgrade to hiredis >= 1.1:
 *  - per-command timers (cmd_start_timer, cmd_on_timeout): 1.0 has
 *    redisAsyncSetTimeout();
 *  - the connect and handshake bound (connect_w, conn_on_connect_timeout):
 *    1.0 has redisOptions.connect_timeout (the handshake bound stays);
 *  - the subscriber ping as a repeated SUBSCRIBE (sub_on_ping, sub_send,
 *    the "Subscriber liveness" paragraph): a plain PING from PR #1027 (1.1);
 *  - conn_detach(hiredis_frees): 1.0 runs onConnect and onDisconnect under
 *    REDIS_IN_CALLBACK, so redisAsyncFree() becomes safe there.
 * The host-name lookup off the loop (redis_resolve.c) is not one: every
 * hiredis resolves synchronously inside redisAsyncConnect().
 *
 * User code (command callbacks, hooks) may call rds_free(). `depth` counts
 * our frames on the stack, and the memory is released when the outermost
 * one returns; after user code we check `closing`.
 */
#include "redis.h"
#include "iplit.h"
#include "dlist.h"
#include "strbuf.h"
#include "redis_resolve.h"

#include <arpa/inet.h>
#include <hiredis/adapters/libev.h>
#include <hiredis/async.h>
#include <hiredis/sds.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/log.h"
#include "redis_tls.h"

/* Generated by the Makefile from the sidecar/backend/lua/ scripts, in enum
 * rds_script order: each script's full source, and its name. */
extern const char *const rds_script_src[RDS_N_SCRIPTS];
extern const char *const rds_script_name[RDS_N_SCRIPTS];

#define RDS_TIME_EVERY_S          60.0
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
#define RDS_ERR_MAX               128
#define RDS_SHA_LEN               40
/* An EVALSHA's command name and the length of its sha (RDS_SHA_LEN) in
 * RESP; the sha and its CRLF follow. */
#define RDS_EVALSHA_LEAD          "$7\r\nEVALSHA\r\n$40\r\n"
#define RDS_EVALSHA_HEAD          (sizeof(RDS_EVALSHA_LEAD) - 1 + RDS_SHA_LEN + 2)
/* rds_eval keeps the lengths of this many arguments instead of measuring
 * them twice (the scripts take fewer). */
#define RDS_EVAL_LENS             32
enum rconn_kind { RC_CMD, RC_SUB, RC_SEN, RC_N };
enum rconn_state { RC_DOWN, RC_RESOLVING, RC_CONNECTING, RC_HANDSHAKE, RC_UP };
enum cmd_kind {
    CMD_USER,
    CMD_AUTH,
    CMD_SELECT,
    CMD_LOAD,
    CMD_TIME,
    CMD_MASTER,
    CMD_ROLE,
    CMD_INFO
};

/* The sentinels' event announcing a new primary:
 * "<master name> <old ip> <old port> <new ip> <new port>". */
#define RDS_SWITCH_CHANNEL "+switch-master"
#define RDS_IS_CLUSTER                                                           \
    "the server is a Redis Cluster node (cluster_enabled:1): list its nodes in " \
    "backend.cluster instead of backend.url"
#define RDS_MAX_SENTINELS 16

struct cmd {
    struct cmd *prev, *next; /* the connection's live list */
    struct rconn *cn;        /* NULL once off the live list */
    enum cmd_kind kind;
    int script;      /* CMD_USER: EVAL it on NOSCRIPT (-1: none); CMD_LOAD: which */
    bool setup;      /* handshake: no own timer, counted in setup_left */
    bool done;       /* the caller's side is over: no callback any more */
    bool in_hiredis; /* hiredis holds it as privdata */
    bool retried;    /* the EVAL fallback was sent */
    rds_cb *cb;
    void *ud;
    ev_timer timer_w;
    double sent_at;  /* ev_time(), for the round-trip time */
    double sent_now; /* ev_now(), for the clock offset */
    /* rds_eval: the EVALSHA as sent (RESP), kept for the EVAL fallback,
     * which reuses its elements from `tail` on (numkeys, keys, args). */
    int argc;
    char *resp;
    size_t resp_len, tail;
};

struct rconn {
    struct rds *r;
    enum rconn_kind kind;
    enum rconn_state state;
    char host[256]; /* this attempt's target (see conn_target) */
    int port;
    bool numeric;            /* host is an IP literal: no lookup */
    char where[300];         /* host:port or the socket path, for logs */
    redisAsyncContext *ac;   /* NULL unless CONNECTING, HANDSHAKE or UP */
    struct rtls *tls;        /* the TLS bridge under ac, or NULL */
    struct rds_resolve *res; /* RESOLVING only */
    ev_timer connect_w;
    ev_timer retry_w;
    unsigned failures;    /* failed attempts in a row: the backoff exponent */
    unsigned setup_left;  /* handshake replies still awaited */
    size_t subs_left;     /* subscribe confirmations still awaited */
    bool time_inflight;   /* a periodic TIME sample is out */
    bool ping_out;        /* subscriber: a ping is out, ping_w is its deadline */
    ev_timer ping_w;      /* subscriber, UP only: the next ping, or its deadline */
    const char *soon_why; /* connect_w was set to fire at once for this reason */
    struct cmd *live;     /* sent and unanswered */
};

struct sentinel {
    char host[256];
    int port;
};

struct rds {
    struct ev_loop *loop;
    struct rds_addr addr; /* the URL's; with sentinels, the credentials and db */
    char where[300];      /* the data address (host:port or path) for stats */
    struct rtls_ctx *tls; /* TLS to the data connections and sentinels, or NULL */
    /* Sentinel mode (n_sentinels > 0): sentinel[sen_next] is asked next;
     * the primary is what the last answer or +switch-master said. */
    struct sentinel *sentinel;
    size_t n_sentinels, sen_next;
    char sen_where[300]; /* the sentinel asked last, for stats */
    char *master_name;
    char sen_user[128], sen_password[256];
    bool have_primary;
    bool moving; /* in primary_set(): drops are not failures */
    char primary_host[256];
    int primary_port;
    double timeout_s, min_s, max_s;
    char **channels;
    size_t *channel_len;
    size_t n_channels;
    struct rds_hooks hooks;
    struct rconn conn[RC_N];
    char sha[RDS_N_SCRIPTS][RDS_SHA_LEN + 1];
    /* Per script, once its SCRIPT LOAD answered: the first two elements of
     * its EVALSHA in RESP, "$7\r\nEVALSHA\r\n$40\r\n<sha>\r\n". */
    char evalsha_head[RDS_N_SCRIPTS][RDS_EVALSHA_HEAD];
    double clock_offset;
    ev_timer time_w;
    ev_prepare flush_w; /* writes queued commands before the loop polls */
    uint64_t rng;
    unsigned depth; /* our frames on the stack (see the top comment) */
    bool closing;
    bool cluster_node; /* opts.cluster_node: no INFO cluster check */
    bool is_cluster;   /* the URL's server is a cluster node (rds_mode_error) */
    struct rds_stats stats;
    char last_error[RDS_ERR_MAX];
};

static void conn_fail(struct rconn *cn, const char *why, bool hiredis_frees);
static void conn_check_ready(struct rconn *cn);
static void sen_refresh(struct rds *r);

/* --- small helpers --------------------------------------------------- */

static void format_where(char *out, size_t cap, const char *host, int port)
{
    if (iplit_parse(host, strlen(host), IPLIT_V6, NULL))
        snprintf(out, cap, "[%s]:%d", host, port);
    else
        snprintf(out, cap, "%s:%d", host, port);
}

static const char *const conn_names[RC_N] = { "command", "subscriber", "sentinel" };

static const char *state_name(enum rconn_state s)
{
    static const char *const names[] = { "down", "resolving", "connecting", "handshake", "up" };
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
    const char *const secret[] = { r->addr.password, r->sen_password };

    snprintf(out, cap, "%s", why && *why ? why : "unknown error");
    for (size_t i = 0; i < sizeof(secret) / sizeof(secret[0]); i++) {
        if (secret[i][0] && strstr(out, secret[i])) {
            out[strcspn(out, " ")] = '\0';
            if (strstr(out, secret[i]))
                snprintf(out, cap, "error text withheld (it holds the password)");
        }
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
    DLIST_PUSH(cn->live, c, prev, next);
}

static void cmd_unlink(struct cmd *c)
{
    struct rconn *cn = c->cn;

    if (!cn)
        return;
    DLIST_UNLINK(cn->live, c, prev, next);
    c->cn = NULL;
}

/* Hands `c` to hiredis on cn's context, as argv (argc > 0) or as the RESP
 * in c->resp (argc 0, rds_eval); on failure nothing changed. */
static int cmd_send(struct rconn *cn, struct cmd *c, int argc, const char **argv,
                    const size_t *argvlen)
{
    int rc = argc > 0 ? redisAsyncCommandArgv(cn->ac, cmd_on_reply, c, argc, argv, argvlen)
                      : redisAsyncFormattedCommand(cn->ac, cmd_on_reply, c, c->resp, c->resp_len);
    if (rc != REDIS_OK)
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
void rds_flush(struct rds *r)
{
    if (!r)
        return;
    ev_prepare_stop(r->loop, &r->flush_w);
    rds_enter(r);
    for (int k = 0; k < RC_N && !r->closing; k++) {
        struct rconn *cn = &r->conn[k];
        if ((cn->state == RC_HANDSHAKE || cn->state == RC_UP) && cn->ac &&
            sdslen(cn->ac->c.obuf) > 0)
            redisAsyncHandleWrite(cn->ac); /* an error detaches cn (conn_on_disconnect) */
    }
    rds_leave(r);
}

static void rds_on_flush(struct ev_loop *loop, ev_prepare *w, int revents)
{
    (void)loop;
    (void)revents;
    rds_flush(w->data);
}

/* hiredis 0.14: no async command timeout of its own. */
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

/* --- host-name lookup (redis_resolve.h) ------------------------------ */

static void conn_connect(struct rconn *cn, const char *ip);

static void conn_on_resolved(int rc, const char *addr, void *ud)
{
    struct rconn *cn = ud;
    struct rds *r = cn->r;

    cn->res = NULL;
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
 * fail_list(). Runs no user code. hiredis 0.14: `hiredis_frees` (see the
 * top comment). */
static struct cmd *conn_detach(struct rconn *cn, bool hiredis_frees)
{
    struct rds *r = cn->r;
    struct cmd *list = cn->live;

    ev_timer_stop(r->loop, &cn->connect_w);
    if (cn->res) {
        rds_resolve_abandon(cn->res);
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
    /* hiredis closes (or has closed) its end of the pair; the bridge never
     * calls back, so it can go now even if hiredis defers its free. */
    rtls_free(cn->tls);
    cn->tls = NULL;
    return list;
}

static double conn_backoff(struct rconn *cn)
{
    struct rds *r = cn->r;
    unsigned n = cn->failures ? cn->failures - 1 : 0;

    /* The sentinels are asked in turn: the next one at once, and the
     * backoff only between rounds. */
    if (cn->kind == RC_SEN) {
        if (cn->failures % r->n_sentinels != 0)
            return 0;
        n = cn->failures / (unsigned)r->n_sentinels - 1;
    }
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
    if (rtls_error(cn->tls))
        why = rtls_error(cn->tls);              /* what hiredis saw (EOF) only follows from it */
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
                   "address", LOG_S, cn->where, "reason", LOG_S, reason, "retry_in_s", LOG_F, delay,
                   NULL);
        else
            log_at(cn->failures == 1 ? LOG_WARN : LOG_INFO, "redis connect failed", "conn", LOG_S,
                   conn_names[cn->kind], "address", LOG_S, cn->where, "reason", LOG_S, reason,
                   "failures", LOG_U, (unsigned long long)cn->failures, "retry_in_s", LOG_F, delay,
                   NULL);
        if (cn->kind == RC_SEN)
            r->sen_next = (r->sen_next + 1) % r->n_sentinels;
        else if (r->n_sentinels)
            sen_refresh(r);
    }

    for (const struct cmd *c = list; c; c = c->next)
        if (c->kind == CMD_USER) /* like `commands`: the handshake is not counted */
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
           cn->where, NULL);
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
        if (cn->kind == RC_SUB && r->hooks.on_subscribed)
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

static int setup_send(struct rconn *cn, enum cmd_kind kind, int script, int argc, const char **argv,
                      const size_t *argvlen)
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

/* --- sentinel -------------------------------------------------------- */

/* The data connections go to host:port from now on. A new address drops
 * them (they may still talk to a demoted primary, which would answer
 * writes with READONLY or, worse, take them before it is told) and starts
 * them at once, without backoff. The same address changes nothing: a
 * primary that is down is retried at the connections' own backoff pace. */
static void primary_set(struct rds *r, const char *host, int port, const char *how)
{
    if (r->have_primary && port == r->primary_port && strcmp(host, r->primary_host) == 0)
        return;
    if (strlen(host) >= sizeof(r->primary_host) || port <= 0 || port > 65535) {
        log_at(LOG_WARN, "redis sentinel named an unusable primary", "via", LOG_S, how, NULL);
        return;
    }
    bool first = !r->have_primary;
    snprintf(r->primary_host, sizeof(r->primary_host), "%s", host);
    r->primary_port = port;
    r->have_primary = true;
    format_where(r->where, sizeof(r->where), host, port);
    if (!first)
        r->stats.primary_changes++;
    log_at(first ? LOG_INFO : LOG_WARN, first ? "redis primary" : "redis primary moved",
           "master_name", LOG_S, r->master_name, "address", LOG_S, r->where, "via", LOG_S, how,
           NULL);
    r->moving = true; /* these drops are no reason to ask the sentinels again */
    for (int k = RC_CMD; k <= RC_SUB && !r->closing; k++) {
        struct rconn *cn = &r->conn[k];
        if (k == RC_SUB && !r->n_channels)
            continue;
        conn_fail(cn, "the primary moved", false);
        if (r->closing)
            break;
        cn->failures = 0;
        ev_timer_stop(r->loop, &cn->retry_w);
        ev_timer_set(&cn->retry_w, 0., 0.);
        ev_timer_start(r->loop, &cn->retry_w);
    }
    r->moving = false;
}

/* A data connection failed: ask the sentinels again, on a fresh link (the
 * subscribed one cannot send commands), and the next sentinel in turn, so
 * one cut off from the others (still naming a primary that is gone, and
 * never announcing the switch) cannot hold us. This is how a missed
 * +switch-master is made up for, and how a ROLE that is not master is
 * acted on. While the sentinels still name a dead primary (before they
 * fail over), each failed retry of the data connections asks once more:
 * one sentinel round trip per backoff step. An attempt already under way,
 * or a link in backoff, will ask by itself. */
static void sen_refresh(struct rds *r)
{
    struct rconn *cn = &r->conn[RC_SEN];

    if (r->moving || r->closing || cn->state != RC_UP)
        return;
    struct cmd *list = conn_detach(cn, false);
    conn_set_state(cn, RC_DOWN);
    r->sen_next = (r->sen_next + 1) % r->n_sentinels;
    fail_list(r, list, "re-asking the sentinels"); /* handshake records only: no user code */
    ev_timer_set(&cn->retry_w, 0., 0.);
    ev_timer_start(r->loop, &cn->retry_w);
}

/* "+switch-master <name> <old ip> <old port> <new ip> <new port>". */
static void sen_on_switch(struct rds *r, const char *msg, size_t len)
{
    char buf[640], name[256], oldip[256], newip[256];
    int oldport, newport;

    if (len >= sizeof(buf))
        return;
    memcpy(buf, msg, len);
    buf[len] = '\0';
    if (sscanf(buf, "%255s %255s %d %255s %d", name, oldip, &oldport, newip, &newport) != 5 ||
        strcmp(name, r->master_name) != 0)
        return;
    primary_set(r, newip, newport, RDS_SWITCH_CHANNEL);
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
    if (cn->kind == RC_SEN && strcasecmp(kind->str, "message") == 0 &&
        reply->element[2]->type == REDIS_REPLY_STRING) {
        sen_on_switch(r, reply->element[2]->str, reply->element[2]->len);
    } else if (strcasecmp(kind->str, "message") == 0 &&
               reply->element[2]->type == REDIS_REPLY_STRING) {
        r->stats.messages++;
        for (size_t i = 0; i < r->n_channels; i++) {
            if (r->channel_len[i] == chan->len &&
                memcmp(r->channels[i], chan->str, chan->len) == 0) {
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
 * comment). hiredis 0.14: the ping is a SUBSCRIBE. */
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
        const char *argv[] = { "SUBSCRIBE",
                               cn->kind == RC_SEN ? RDS_SWITCH_CHANNEL : r->channels[0] };
        const size_t lens[] = { 9, strlen(argv[1]) };
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

    if (cn->kind == RC_SEN) {
        const char *argv[] = { "SUBSCRIBE", RDS_SWITCH_CHANNEL };
        if (redisAsyncCommandArgv(cn->ac, sub_on_reply, NULL, 2, argv, NULL) != REDIS_OK)
            return -1;
        cn->subs_left = 1;
        return 0;
    }
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
    if (cn->host[0] && !cn->tls)
        redisEnableKeepAlive(&cn->ac->c); /* finds a dead peer on a quiet link */

    const char *user = cn->kind == RC_SEN ? r->sen_user : r->addr.user;
    const char *pass = cn->kind == RC_SEN ? r->sen_password : r->addr.password;
    if (pass[0] && user[0]) {
        const char *argv[] = { "AUTH", user, pass };
        rc |= setup_send(cn, CMD_AUTH, -1, 3, argv, NULL);
    } else if (pass[0]) {
        const char *argv[] = { "AUTH", pass };
        rc |= setup_send(cn, CMD_AUTH, -1, 2, argv, NULL);
    }
    if (cn->kind == RC_SEN) {
        /* Then stay subscribed on the same link: hiredis routes the reply
         * of a command queued before SUBSCRIBE to its own callback. */
        const char *argv[] = { "SENTINEL", "get-master-addr-by-name", r->master_name };
        rc |= setup_send(cn, CMD_MASTER, -1, 3, argv, NULL);
        if (rc == 0)
            rc = sub_send(cn);
        if (rc != 0)
            conn_fail_soon(cn, "cannot queue the handshake (out of memory)");
        return;
    }
    if (r->n_sentinels) {
        const char *argv[] = { "ROLE" };
        rc |= setup_send(cn, CMD_ROLE, -1, 1, argv, NULL);
    } else if (!r->cluster_node && cn->kind == RC_CMD) {
        const char *argv[] = { "INFO", "cluster" };
        rc |= setup_send(cn, CMD_INFO, -1, 2, argv, NULL);
    }
    if (r->addr.db != 0) {
        char db[16];
        snprintf(db, sizeof(db), "%d", r->addr.db);
        const char *argv[] = { "SELECT", db };
        rc |= setup_send(cn, CMD_SELECT, -1, 2, argv, NULL);
    }
    if (cn->kind == RC_CMD) {
        for (int i = 0; i < RDS_N_SCRIPTS; i++) {
            const char *argv[] = { "SCRIPT", "LOAD", rds_script_src[i] };
            rc |= setup_send(cn, CMD_LOAD, i, 3, argv, NULL);
        }
        const char *argv[] = { "TIME" };
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
    redisAsyncContext *ac =
        cn->host[0] ? redisAsyncConnect(ip, cn->port) : redisAsyncConnectUnix(r->addr.path);
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
    /* Before the attach: the adapter's watchers take the descriptor then. */
    if (r->tls && cn->host[0] &&
        !(cn->tls = rtls_new(r->loop, r->tls, &ac->c.fd, cn->host, why, sizeof(why)))) {
        redisAsyncFree(ac);
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

/* Where this attempt goes: the URL's endpoint, the sentinel whose turn it
 * is, or the primary the sentinels named. -1: no primary known yet (the
 * connection waits for primary_set()). */
static int conn_target(struct rconn *cn)
{
    struct rds *r = cn->r;
    const char *host;
    int port;

    if (cn->kind == RC_SEN) {
        host = r->sentinel[r->sen_next].host;
        port = r->sentinel[r->sen_next].port;
    } else if (r->n_sentinels) {
        if (!r->have_primary)
            return -1;
        host = r->primary_host;
        port = r->primary_port;
    } else if (r->addr.path[0]) {
        cn->host[0] = '\0';
        cn->port = 0;
        cn->numeric = false;
        snprintf(cn->where, sizeof(cn->where), "%s", r->addr.path);
        return 0;
    } else {
        host = r->addr.host;
        port = r->addr.port;
    }
    snprintf(cn->host, sizeof(cn->host), "%s", host);
    cn->port = port;
    cn->numeric = iplit_is(host);
    format_where(cn->where, sizeof(cn->where), host, port);
    if (cn->kind == RC_SEN)
        snprintf(r->sen_where, sizeof(r->sen_where), "%s", cn->where);
    return 0;
}

/* One attempt, from DOWN. */
static void conn_attempt(struct rconn *cn)
{
    struct rds *r = cn->r;

    cn->soon_why = NULL;
    if (conn_target(cn) < 0)
        return;
    ev_timer_set(&cn->connect_w, r->timeout_s, 0.);
    ev_timer_start(r->loop, &cn->connect_w);
    if (!cn->host[0] || cn->numeric) {
        conn_set_state(cn, RC_CONNECTING);
        conn_connect(cn, cn->host);
        return;
    }
    conn_set_state(cn, RC_RESOLVING);
    int rc = rds_resolve_start(r->loop, cn->host, conn_on_resolved, cn, &cn->res);
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

/* hiredis 0.14: no connect timeout of its own. */
static void conn_on_connect_timeout(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct rconn *cn = w->data;
    struct rds *r = cn->r;
    const char *why = cn->soon_why;

    (void)loop;
    (void)revents;
    if (!why && cn->tls && !rtls_is_open(cn->tls))
        why = "TLS handshake timeout (does the server speak TLS on this port?)";
    if (!why)
        why = cn->state == RC_RESOLVING  ? "timeout resolving the host"
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
    static const char *const what[] = { "",       "AUTH",
                                        "SELECT", "SCRIPT LOAD",
                                        "TIME",   "SENTINEL get-master-addr-by-name",
                                        "ROLE",   "INFO cluster" };
    struct rconn *cn = c->cn;
    enum cmd_kind kind = c->kind;
    bool setup = c->setup;
    int script = c->script;
    char why[RDS_ERR_MAX];

    if (kind == CMD_TIME)
        time_sample(r, c, reply);
    cmd_finish(r, c);
    /* A user whose ACL forbids INFO still works: the check is a courtesy. */
    if (reply->type == REDIS_REPLY_ERROR && kind != CMD_INFO) {
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
        char *h = r->evalsha_head[script];
        size_t lead = sizeof(RDS_EVALSHA_LEAD) - 1;
        memcpy(h, RDS_EVALSHA_LEAD, lead);
        memcpy(h + lead, reply->str, RDS_SHA_LEN);
        memcpy(h + lead + RDS_SHA_LEN, "\r\n", 2);
    }
    if (kind == CMD_MASTER) {
        long port = 0;
        if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 &&
            reply->element[0]->type == REDIS_REPLY_STRING &&
            reply->element[1]->type == REDIS_REPLY_STRING)
            port = strtol(reply->element[1]->str, NULL, 10);
        if (port <= 0 || port > 65535) {
            snprintf(why, sizeof(why), "the sentinel knows no primary named '%s'", r->master_name);
            conn_fail(cn, why, false);
            return;
        }
        primary_set(r, reply->element[0]->str, (int)port, "sentinel");
        if (r->closing || cn->state != RC_HANDSHAKE)
            return;
    }
    if (kind == CMD_ROLE) {
        const redisReply *role =
            reply->type == REDIS_REPLY_ARRAY && reply->elements > 0 ? reply->element[0] : NULL;
        if (!role || role->type != REDIS_REPLY_STRING || strcmp(role->str, "master") != 0) {
            snprintf(why, sizeof(why), "not a primary (ROLE: %.40s)",
                     role && role->type == REDIS_REPLY_STRING ? role->str : "?");
            conn_fail(cn, why, false);
            return;
        }
    }
    if (kind == CMD_INFO && reply->type == REDIS_REPLY_STRING &&
        strstr(reply->str, "cluster_enabled:1")) {
        r->is_cluster = true;
        log_at(LOG_ERROR, "redis URL points at a cluster node", "address", LOG_S, cn->where, NULL);
        conn_fail(cn, RDS_IS_CLUSTER, false);
        return;
    }
    if (setup && cn->setup_left > 0) {
        cn->setup_left--;
        conn_check_ready(cn);
    }
}

/* --- RESP formatting (rds_eval) --------------------------------------- */

/* Longest "*<n>\r\n" or "$<n>\r\n" header: a size_t in decimal. */
#define RESP_HEAD_MAX (1 + 20 + 2)

/* Writes `type`, `n` in decimal and CRLF at p; returns the end. */
static char *resp_head(char *p, char type, size_t n)
{
    *p++ = type;
    p = put_uint(p, n);
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

/* One bulk string: at most RESP_HEAD_MAX + len + 2 bytes. */
static char *resp_bulk(char *p, const char *s, size_t len)
{
    p = resp_head(p, '$', len);
    if (len)
        memcpy(p, s, len);
    p += len;
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

/* The NOSCRIPT fallback of an rds_eval() record: EVAL <source> followed
 * by the EVALSHA's own numkeys, keys and args, handed to hiredis (which
 * copies it). 0, or -1 with nothing sent. */
static int eval_fallback(struct cmd *c)
{
    const char *src = rds_script_src[c->script];
    size_t src_len = strlen(src), rest = c->resp_len - c->tail;
    char *buf =
        malloc(RESP_HEAD_MAX + (RESP_HEAD_MAX + 4 + 2) + (RESP_HEAD_MAX + src_len + 2) + rest);
    if (!buf)
        return -1;
    char *p = resp_head(buf, '*', (size_t)c->argc);
    p = resp_bulk(p, "EVAL", 4);
    p = resp_bulk(p, src, src_len);
    memcpy(p, c->resp + c->tail, rest);
    p += rest;
    int rc = redisAsyncFormattedCommand(c->cn->ac, cmd_on_reply, c, buf, (size_t)(p - buf));
    free(buf);
    return rc == REDIS_OK ? 0 : -1;
}

static void user_reply(struct rds *r, struct cmd *c, const redisReply *reply)
{
    bool is_err = reply->type == REDIS_REPLY_ERROR;

    if (is_err && c->script >= 0 && !c->retried && reply->str &&
        strncmp(reply->str, "NOSCRIPT", 8) == 0) {
        /* The server lost its script cache: EVAL the source once, same
         * record, same timer (what is left of it). EVAL caches it again. */
        c->retried = true;
        if (eval_fallback(c) == 0) {
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
    const char *argv[] = { "TIME" };
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

static int copy_secret(char *dst, size_t cap, const char *src, const char *what, char *err,
                       size_t errlen)
{
    if (strlen(src) >= cap) {
        str_setf(err, errlen, "redis: %s too long (max %zu bytes)", what, cap - 1);
        return -1;
    }
    snprintf(dst, cap, "%s", src);
    return 0;
}

/* Credentials given apart from the URL replace the URL's. */
static int rds_setup_auth(struct rds *r, const struct rds_opts *opts, char *err, size_t errlen)
{
    const char *user = opts->username ? opts->username : "";
    const char *suser = opts->sentinel_username ? opts->sentinel_username : "";

    if (opts->password &&
        (copy_secret(r->addr.user, sizeof(r->addr.user), user, "user name", err, errlen) < 0 ||
         copy_secret(r->addr.password, sizeof(r->addr.password), opts->password, "password", err,
                     errlen) < 0))
        return -1;
    if (opts->sentinel_password &&
        (copy_secret(r->sen_user, sizeof(r->sen_user), suser, "sentinel user name", err, errlen) <
             0 ||
         copy_secret(r->sen_password, sizeof(r->sen_password), opts->sentinel_password,
                     "sentinel password", err, errlen) < 0))
        return -1;
    if (strcmp(r->addr.user, "default") == 0)
        r->addr.user[0] = '\0';
    if (strcmp(r->sen_user, "default") == 0)
        r->sen_user[0] = '\0';
    return 0;
}

static int rds_setup_sentinels(struct rds *r, const struct rds_opts *opts, char *err, size_t errlen)
{
    char why[RDS_ERR_MAX];

    if (!opts->n_sentinels)
        return 0;
    r->addr.db = opts->db;
    r->sentinel = calloc(opts->n_sentinels, sizeof(*r->sentinel));
    r->master_name = strdup(opts->master_name);
    if (!r->sentinel || !r->master_name) {
        str_setf(err, errlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < opts->n_sentinels; i++) {
        struct sentinel *sn = &r->sentinel[i];
        if (rds_parse_hostport(opts->sentinels[i], sn->host, sizeof(sn->host), &sn->port, why,
                               sizeof(why)) < 0) {
            str_setf(err, errlen, "redis: sentinel %zu: %s", i, why);
            return -1;
        }
    }
    r->n_sentinels = opts->n_sentinels;
    return 0;
}

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
    free(r->sentinel);
    free(r->master_name);
    rtls_ctx_free(r->tls); /* the bridges went with their connections */
    explicit_bzero(&r->addr, sizeof(r->addr));
    explicit_bzero(r->sen_password, sizeof(r->sen_password));
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

    if (!loop || !opts || (!opts->url == !opts->n_sentinels)) {
        str_setf(err, errlen, "redis: give either a URL or sentinels");
        return NULL;
    }
    if (opts->n_sentinels &&
        (!opts->sentinels || !opts->master_name || !*opts->master_name ||
         opts->n_sentinels > RDS_MAX_SENTINELS || opts->db < 0)) {
        str_setf(err, errlen, "redis: sentinels need a master name (and at most %d of them)",
                 RDS_MAX_SENTINELS);
        return NULL;
    }
    if (!(opts->command_timeout_s > 0) || !isfinite(opts->command_timeout_s) ||
        !(opts->reconnect_min_s > 0) || !isfinite(opts->reconnect_min_s) ||
        !(opts->reconnect_max_s >= opts->reconnect_min_s) || !isfinite(opts->reconnect_max_s)) {
        str_setf(err, errlen,
                 "redis: timeouts must be positive (and reconnect_max_s >= "
                 "reconnect_min_s)");
        return NULL;
    }
    if (opts->n_channels && !opts->channels) {
        str_setf(err, errlen, "redis: no channel names");
        return NULL;
    }
    struct rds *r = calloc(1, sizeof(*r));
    if (!r) {
        str_setf(err, errlen, "out of memory");
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
    r->loop = loop;
    if (opts->url && rds_parse_url(opts->url, &r->addr, perr, sizeof(perr)) < 0) {
        str_setf(err, errlen, "redis URL: %s", perr);
        free(r);
        return NULL;
    }
    if (rds_setup_auth(r, opts, err, errlen) < 0 || rds_setup_sentinels(r, opts, err, errlen) < 0) {
        rds_destroy(r);
        return NULL;
    }
    if (r->addr.tls || (opts->n_sentinels && opts->tls)) {
        r->tls = rtls_ctx_new(opts->tls, err, errlen);
        if (!r->tls) {
            rds_destroy(r);
            return NULL;
        }
    }
    r->timeout_s = opts->command_timeout_s;
    r->cluster_node = opts->cluster_node;
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
                str_setf(err, errlen, "redis: channel %zu has no name", i);
                rds_destroy(r);
                return NULL;
            }
            r->channels[i] = strdup(opts->channels[i]);
            if (!r->channels[i])
                goto oom;
            r->channel_len[i] = strlen(r->channels[i]);
        }
    }

    if (r->n_sentinels)
        snprintf(r->where, sizeof(r->where), "unknown (asking the sentinels)");
    else if (r->addr.path[0])
        snprintf(r->where, sizeof(r->where), "%s", r->addr.path);
    else
        format_where(r->where, sizeof(r->where), r->addr.host, r->addr.port);

    /* First attempts on the next loop iteration: nothing runs in here.
     * With sentinels the data connections wait for primary_set(). */
    if (r->n_sentinels) {
        ev_timer_start(loop, &r->conn[RC_SEN].retry_w);
        return r;
    }
    ev_timer_start(loop, &r->conn[RC_CMD].retry_w);
    if (r->n_channels)
        ev_timer_start(loop, &r->conn[RC_SUB].retry_w);
    return r;

oom:
    str_setf(err, errlen, "out of memory");
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

    /* One block: the record, then the command in RESP, formatted here
     * rather than by hiredis' generic printf-style formatter (most of an
     * EVALSHA's client-side cost): the script's pre-formatted head, then
     * numkeys, keys and args as bulk strings. */
    size_t lens[RDS_EVAL_LENS];
    size_t bytes = RESP_HEAD_MAX + RDS_EVALSHA_HEAD + RESP_HEAD_MAX + 20 + 2;
    for (int i = 0; i < argc; i++) {
        size_t len = argvlen ? argvlen[i] : argv[i] ? strlen(argv[i]) : 0;
        if ((!argv[i] && len) || len > SIZE_MAX / 4 - bytes)
            return -1;
        if (i < RDS_EVAL_LENS)
            lens[i] = len;
        bytes += RESP_HEAD_MAX + len + 2;
    }
    struct cmd *c = cmd_new(r, CMD_USER, bytes);
    if (!c)
        return -1;
    c->resp = (char *)(c + 1);
    char *p = resp_head(c->resp, '*', (size_t)argc + 3);
    memcpy(p, r->evalsha_head[s], RDS_EVALSHA_HEAD);
    p += RDS_EVALSHA_HEAD;
    c->tail = (size_t)(p - c->resp);
    /* numkeys: its decimal digits are its own bulk string. */
    char nk[RESP_HEAD_MAX];
    size_t nk_len = (size_t)(resp_head(nk, '$', (size_t)nkeys) - nk) - 3;
    p = resp_bulk(p, nk + 1, nk_len);
    for (int i = 0; i < argc; i++) {
        size_t len = i < RDS_EVAL_LENS ? lens[i]
            : argvlen                  ? argvlen[i]
            : argv[i]                  ? strlen(argv[i])
                                       : 0;
        p = resp_bulk(p, argv[i], len);
    }
    c->resp_len = (size_t)(p - c->resp);
    c->argc = argc + 3;
    c->script = (int)s;
    c->cb = cb;
    c->ud = ud;
    if (cmd_send(cn, c, 0, NULL, NULL) < 0) {
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
    static const char *const refused[] = { "subscribe", "psubscribe", "unsubscribe", "punsubscribe",
                                           "monitor" };

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

const char *rds_mode_error(const struct rds *r)
{
    return r->is_cluster ? RDS_IS_CLUSTER : NULL;
}

const char *rds_last_error(const struct rds *r)
{
    return r->last_error;
}

/* --- figures (redis.h) ------------------------------------------------- */

#define R(obj)    ((const struct rds *)(obj))
#define ST(field) (offsetof(struct rds, stats) + offsetof(struct rds_stats, field))
#define FAILURES  "polygw_redis_failures_total"

static const char *conn_state(const struct rconn *cn)
{
    return cn->state == RC_UP ? "up" : cn->state == RC_DOWN ? "down" : "connecting";
}

static struct fig_val fig_str_redis(const void *obj, size_t row)
{
    (void)obj;
    (void)row;
    return (struct fig_val){ .s = "redis" };
}

static struct fig_val fig_mode(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .s = R(obj)->n_sentinels ? "sentinel" : "single" };
}

static struct fig_val fig_state(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .s = conn_state(&R(obj)->conn[RC_CMD]) };
}

static struct fig_val fig_subscribed(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .b = rds_subscribed(R(obj)) };
}

static struct fig_val fig_address(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .s = R(obj)->where };
}

static struct fig_val fig_tls(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .b = R(obj)->tls != NULL };
}

static bool with_sentinels(const void *obj, size_t row)
{
    (void)row;
    return R(obj)->n_sentinels > 0;
}

static struct fig_val fig_sentinel(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .s = R(obj)->sen_where };
}

static struct fig_val fig_sentinel_state(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .s = conn_state(&R(obj)->conn[RC_SEN]) };
}

static struct fig_val fig_master_name(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .s = R(obj)->master_name };
}

static struct fig_val fig_rtt_avg_ms(const void *obj, size_t row)
{
    const struct rds_stats *s = &R(obj)->stats;
    (void)row;
    return (struct fig_val){ .d = s->replies ? s->rtt_sum_s / (double)s->replies * 1e3 : 0 };
}

static struct fig_val fig_rtt_max_ms(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .d = R(obj)->stats.rtt_max_s * 1e3 };
}

static struct fig_val fig_last_error(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .s = R(obj)->last_error };
}

static struct fig_val fig_next_retry(const void *obj, size_t row)
{
    const struct rds *r = R(obj);
    const struct rconn *cn = &r->conn[RC_CMD];
    double retry_in = 0;
    (void)row;

    if (cn->state == RC_DOWN && ev_is_active(&cn->retry_w))
        retry_in = ev_timer_remaining(r->loop, (ev_timer *)&cn->retry_w);
    return (struct fig_val){ .d = retry_in > 0 ? retry_in : 0 };
}

static const struct figure rds_figure_list[] = {
    { .key = "kind", .kind = FIG_STR, .get = fig_str_redis },
    { .key = "mode", .kind = FIG_STR, .get = fig_mode },
    { .key = "state", .kind = FIG_STR, .get = fig_state },
    { .key = "subscribed",
      .metric = "polygw_redis_subscribed",
      .type = "gauge",
      .help = "1 while the pub/sub connection listens to every channel.",
      .kind = FIG_BOOL,
      .get = fig_subscribed },
    { .key = "address", .kind = FIG_STR, .get = fig_address }, /* never the password */
    { .key = "tls", .kind = FIG_BOOL, .get = fig_tls },
    { .key = "sentinel", .kind = FIG_STR, .get = fig_sentinel, .shown = with_sentinels },
    { .key = "sentinel_state",
      .kind = FIG_STR,
      .get = fig_sentinel_state,
      .shown = with_sentinels },
    { .key = "master_name", .kind = FIG_STR, .get = fig_master_name, .shown = with_sentinels },
    { .key = "primary_changes",
      .metric = "polygw_redis_primary_changes_total",
      .type = "counter",
      .help = "Sentinel: times the primary moved to a new address (0 without sentinels).",
      .off = ST(primary_changes),
      .shown = with_sentinels },
    { .key = "connects",
      .metric = "polygw_redis_connects_total",
      .type = "counter",
      .help = "Redis connections made.",
      .off = ST(connects) },
    { .key = "disconnects",
      .metric = "polygw_redis_disconnects_total",
      .type = "counter",
      .help = "Redis connections lost.",
      .off = ST(disconnects) },
    { .key = "connect_failures",
      .metric = "polygw_redis_connect_failures_total",
      .type = "counter",
      .help = "Redis connects that failed.",
      .off = ST(connect_failures) },
    { .key = "commands",
      .metric = "polygw_redis_commands_total",
      .type = "counter",
      .help = "Redis commands sent.",
      .off = ST(commands) },
    { .metric = "polygw_redis_round_trip_seconds",
      .type = "histogram",
      .help = "Round trips of answered Redis commands (error replies included).",
      .kind = FIG_HIST,
      .off = ST(rtt) },
    { .key = "replies", .off = ST(replies) },
    { .key = "errors",
      .metric = FAILURES,
      .type = "counter",
      .help = "Redis commands that failed, by kind: reply (an error reply), timeout "
              "(command_timeout_s), connection_lost (their connection dropped first), "
              "not_connected (refused at once).",
      .label = "kind",
      .label_value = "reply",
      .off = ST(errors) },
    { .key = "timeouts",
      .metric = FAILURES,
      .label = "kind",
      .label_value = "timeout",
      .off = ST(timeouts) },
    { .metric = FAILURES, .label = "kind", .label_value = "connection_lost", .off = ST(lost) },
    { .key = "noscript_reloads", .off = ST(noscript_reloads) },
    { .key = "rejected_not_connected",
      .metric = FAILURES,
      .label = "kind",
      .label_value = "not_connected",
      .off = ST(rejected_not_connected) },
    { .key = "messages", .off = ST(messages) },
    { .key = "pending",
      .metric = "polygw_redis_pending_commands",
      .type = "gauge",
      .help = "Redis commands sent, not answered.",
      .off = ST(pending) },
    { .key = "rtt_avg_ms", .kind = FIG_DOUBLE, .get = fig_rtt_avg_ms },
    { .key = "rtt_max_ms", .kind = FIG_DOUBLE, .get = fig_rtt_max_ms },
    { .key = "last_error", .kind = FIG_STR, .get = fig_last_error },
    { .key = "next_retry_in_s", .kind = FIG_DOUBLE, .get = fig_next_retry },
};

const struct fig_table rds_figures = FIG_TABLE(rds_figure_list);
