/*
 * methods.c — the method table: validates each request's named parameters
 * and answers it. Requests that need I/O (call, later) complete
 * asynchronously; the rest answer before returning.
 */
#include "internal.h"
#include "strbuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "callrpc.h"
#include "http.h"
#include "log.h"
#include "metrics.h"
#include "progress.h"
#include "backend.h"
#include "reload.h"
#include "tasks.h"
#include "upstream.h"

typedef void method_fn(struct conn *c, const struct rpc_msg *m);

/* A bucket's level, or nil when it is unlimited. */
static void pack_kv_bucket(msgpack_packer *pk, const char *k, struct bucket *b, double now)
{
    rpc_pack_str(pk, k);
    if (bucket_is_unlimited(b))
        msgpack_pack_nil(pk);
    else
        msgpack_pack_double(pk, bucket_level(b, now));
}

struct scope_iter {
    msgpack_packer *pk;
    double now;
};

static void pack_scope(const char *scope, double last_at, void *ud)
{
    struct scope_iter *it = ud;
    rpc_pack_text(it->pk, scope);
    msgpack_pack_map(it->pk, 1);
    rpc_pack_kv_double(it->pk, "progress_age_s", it->now - last_at);
}

/* `sources`, `scopes` and `calls_waiting`: the governance state. A scope
 * that never succeeded is absent (its progress age is +inf). */
static void pack_governance(msgpack_packer *pk, struct server *srv)
{
    struct gov *g = &srv->gov;
    double now = ev_now(srv->loop);
    uint64_t waiting = 0;

    rpc_pack_str(pk, "sources");
    msgpack_pack_array(pk, g->n_sources);
    for (size_t i = 0; i < g->n_sources; i++) {
        struct gov_source *s = &g->sources[i];
        double next = breaker_next_admit(&s->breaker, now);
        uint32_t limit = aimd_permits(&s->aimd);
        if (limit > s->p.max_concurrency)
            limit = s->p.max_concurrency;
        msgpack_pack_map(pk, 16 + (s->p.retired ? 1 : 0));
        rpc_pack_str(pk, "name");
        rpc_pack_str(pk, s->p.name);
        if (s->p.retired) /* removed by a reload, still in use */
        {
            rpc_pack_str(pk, "retired");
            msgpack_pack_true(pk);
        }
        rpc_pack_str(pk, "capability");
        rpc_pack_str(pk, srv->cfg->capabilities[s->p.capability].name);
        rpc_pack_kv_u64(pk, "in_flight", s->in_flight);
        rpc_pack_kv_u64(pk, "limit", limit);
        rpc_pack_kv_double(pk, "aimd_limit", s->aimd.limit);
        rpc_pack_str(pk, "breaker");
        rpc_pack_str(pk, breaker_state_name(s->breaker.state));
        rpc_pack_kv_double(pk, "next_probe_in_s", next > now && next < 1e300 ? next - now : 0);
        pack_kv_bucket(pk, "rpm_level", &s->rpm, now);
        pack_kv_bucket(pk, "tpm_level", &s->tpm, now);
        pack_kv_bucket(pk, "daily_tokens_level", &s->daily, now);
        rpc_pack_kv_u64(pk, "attempts", s->attempts);
        rpc_pack_kv_u64(pk, "successes", s->successes);
        rpc_pack_kv_u64(pk, "failures", s->failures);
        rpc_pack_kv_u64(pk, "rate_limited", s->rate_limited);
        rpc_pack_kv_u64(pk, "breaker_opened", s->breaker.opened_total);
        rpc_pack_kv_u64(pk, "tokens_used", s->tokens_used);
    }
    rpc_pack_str(pk, "scopes");
    struct scope_iter it = { pk, now };
    msgpack_pack_map(pk, g->progress ? progress_count(g->progress) : 0);
    if (g->progress)
        progress_foreach(g->progress, pack_scope, &it);
    for (size_t i = 0; i < g->n_capabilities; i++)
        waiting += g->waitq[i].n;
    rpc_pack_kv_u64(pk, "calls_waiting", waiting);
}

/* Binds `params` against `spec`; on failure answers bad_request and returns -1. */
static int bind_or_reply(struct conn *c, const struct rpc_msg *m, const struct rpc_param *spec,
                         size_t n, const msgpack_object **out)
{
    char why[200];

    if (rpc_bind(m->params, spec, n, out, why, sizeof(why)) == 0)
        return 0;
    conn_reply_error(c, m->msgid, PGW_BAD_REQUEST, why);
    return -1;
}

static void method_ping(struct conn *c, const struct rpc_msg *m)
{
    if (bind_or_reply(c, m, NULL, 0, NULL) < 0)
        return;
    rpc_pack_result_begin(&c->pk, m->msgid);
    msgpack_pack_map(&c->pk, 2);
    rpc_pack_str(&c->pk, "version");
    rpc_pack_str(&c->pk, PGW_VERSION);
    rpc_pack_str(&c->pk, "uptime_s");
    msgpack_pack_double(&c->pk, server_uptime_s(c->srv));
    conn_response_done(c, PGW_OK);
}

/* The caller's identity as `hello` and `stats` show it. */
static void pack_identity(msgpack_packer *pk, const struct conn *c)
{
    const struct config_app *a = conn_app(c);

    msgpack_pack_map(pk, 6);
    rpc_pack_kv_str(pk, "app", a->name);
    rpc_pack_kv_str(pk, "peer_app", c->peer_app);
    rpc_pack_str(pk, "admin");
    a->admin ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
    rpc_pack_str(pk, "uid");
    c->peer.known ? msgpack_pack_uint32(pk, c->peer.uid) : msgpack_pack_nil(pk);
    rpc_pack_str(pk, "gid");
    c->peer.known ? msgpack_pack_uint32(pk, c->peer.gid) : msgpack_pack_nil(pk);
    rpc_pack_str(pk, "pid");
    c->peer.known ? msgpack_pack_uint32(pk, c->peer.pid) : msgpack_pack_nil(pk);
}

/* `apps`: each app's admission figures from the governance core; only the
 * caller's own unless it is admin. Sources are shared infrastructure: every
 * caller sees them (`sources`), as it sees the limits that hold its calls. */
static void pack_apps(msgpack_packer *pk, const struct conn *c)
{
    struct gov *g = &c->srv->gov;
    const struct config *cfg = c->srv->cfg;
    const struct config_app *me = conn_app(c);
    double now = ev_now(c->srv->loop);
    size_t n = 0;

    for (size_t i = 0; g->apps && i < g->n_apps && i < cfg->n_apps; i++)
        n += me->admin || &cfg->apps[i] == me;
    rpc_pack_str(pk, "apps");
    msgpack_pack_array(pk, (uint32_t)n);
    for (size_t i = 0; g->apps && i < g->n_apps && i < cfg->n_apps; i++) {
        struct gov_app *a = &g->apps[i];
        if (!me->admin && &cfg->apps[i] != me)
            continue;
        const struct config_app_limits *pc = cfg->apps[i].per_capability;
        size_t n_pc = 0;
        for (size_t ci = 0; pc && ci < a->n_caps && ci < cfg->n_capabilities; ci++)
            n_pc += pc[ci].set;
        msgpack_pack_map(pk, 8 + (n_pc > 0));
        rpc_pack_kv_str(pk, "name", cfg->apps[i].name);
        rpc_pack_kv_double(pk, "weight", a->p.weight);
        rpc_pack_kv_u64(pk, "in_flight", a->in_flight);
        rpc_pack_kv_u64(pk, "admitted", a->admitted);
        rpc_pack_kv_u64(pk, "limited", a->limited);
        pack_kv_bucket(pk, "rpm_level", &a->rpm, now);
        pack_kv_bucket(pk, "tpm_level", &a->tpm, now);
        pack_kv_bucket(pk, "daily_tokens_level", &a->daily, now);
        if (!n_pc)
            continue;
        rpc_pack_str(pk, "per_capability");
        msgpack_pack_map(pk, (uint32_t)n_pc);
        for (size_t ci = 0; ci < a->n_caps && ci < cfg->n_capabilities; ci++) {
            struct gov_app_cap *ac = &a->caps[ci];
            if (!pc[ci].set)
                continue;
            rpc_pack_str(pk, cfg->capabilities[ci].name);
            msgpack_pack_map(pk, 5);
            rpc_pack_kv_u64(pk, "in_flight", ac->in_flight);
            rpc_pack_kv_u64(pk, "limited", ac->limited);
            pack_kv_bucket(pk, "rpm_level", &ac->rpm, now);
            pack_kv_bucket(pk, "tpm_level", &ac->tpm, now);
            pack_kv_bucket(pk, "daily_tokens_level", &ac->daily, now);
        }
    }
}

/* `hello`: says who the connection is and, with `app`, declares another
 * app for the rest of the connection (see conn_declare_app for who may). */
static void method_hello(struct conn *c, const struct rpc_msg *m)
{
    static const struct rpc_param spec[] = { { "app", RPC_T_STR | RPC_T_NIL, false } };
    const msgpack_object *p[1];
    char why[200];

    if (bind_or_reply(c, m, spec, 1, p) < 0)
        return;
    if (p[0]) {
        const struct config_app *a =
            conn_declare_app(c, p[0]->via.str.ptr, p[0]->via.str.size, why, sizeof(why));
        if (!a) {
            conn_reply_error(c, m->msgid, PGW_BAD_REQUEST, why);
            return;
        }
        if (strcmp(a->name, c->app) != 0)
            log_at(LOG_INFO, "app declared", "conn", LOG_U, (unsigned long long)c->id, "app", LOG_S,
                   a->name, "peer_app", LOG_S, c->peer_app, NULL);
        str_copy(c->app, sizeof(c->app), a->name);
    }
    rpc_pack_result_begin(&c->pk, m->msgid);
    pack_identity(&c->pk, c);
    conn_response_done(c, PGW_OK);
}

static void method_stats(struct conn *c, const struct rpc_msg *m)
{
    const struct server_stats *st = &c->srv->stats;
    msgpack_packer *pk = &c->pk;

    if (bind_or_reply(c, m, NULL, 0, NULL) < 0)
        return;
    const struct http_stats *hst = http_get_stats(c->srv->http);
    rpc_pack_result_begin(pk, m->msgid);
    msgpack_pack_map(
        pk, 14 + c->srv->backend->ops->stats_keys + (hst ? 1 : 0)); /* caller, apps, reload */

    rpc_pack_str(pk, "version");
    rpc_pack_str(pk, PGW_VERSION);
    rpc_pack_str(pk, "uptime_s");
    msgpack_pack_double(pk, server_uptime_s(c->srv));

    rpc_pack_str(pk, "caller");
    pack_identity(pk, c);
    pack_apps(pk, c);

    rpc_pack_str(pk, "connections");
    msgpack_pack_map(pk, 6);
    rpc_pack_kv_u64(pk, "open", st->conns_open);
    rpc_pack_kv_u64(pk, "accepted", st->conns_accepted);
    rpc_pack_kv_u64(pk, "rejected", st->conns_rejected);
    rpc_pack_kv_u64(pk, "accept_errors", st->accept_errors);
    rpc_pack_kv_u64(pk, "idle_closed", st->conns_idle_closed);
    rpc_pack_kv_u64(pk, "input_refused", st->input_refusals);

    rpc_pack_str(pk, "requests");
    msgpack_pack_map(pk, 5);
    /* This request is answered right after: count it as served. */
    rpc_pack_kv_u64(pk, "served", st->requests_served + 1);
    rpc_pack_kv_u64(pk, "in_flight", st->in_flight);
    rpc_pack_kv_u64(pk, "notifications_ignored", st->notifications_ignored);
    rpc_pack_kv_u64(pk, "cancels", st->cancels);
    rpc_pack_kv_u64(pk, "chunks_relayed", st->chunks_relayed);

    rpc_pack_str(pk, "rejected");
    msgpack_pack_map(pk, PGW_CODE_COUNT - 1);
    for (int i = 1; i < PGW_CODE_COUNT; i++)
        rpc_pack_kv_u64(pk, pgw_code_name((enum pgw_code)i), st->rejected[i]);

    rpc_pack_str(pk, "io");
    msgpack_pack_map(pk, 3);
    rpc_pack_kv_u64(pk, "bytes_in", st->bytes_in);
    rpc_pack_kv_u64(pk, "bytes_out", st->bytes_out);
    rpc_pack_kv_u64(pk, "read_pauses", st->read_pauses);

    const struct upstream_stats *us = upstream_get_stats(c->srv->up);
    rpc_pack_str(pk, "upstream");
    msgpack_pack_map(pk, 18);
    rpc_pack_kv_u64(pk, "attempts_started", us->attempts_started);
    rpc_pack_kv_u64(pk, "attempts_done", us->attempts_done);
    rpc_pack_kv_u64(pk, "attempts_cancelled", us->attempts_cancelled);
    rpc_pack_kv_u64(pk, "attempts_active", us->attempts_active);
    rpc_pack_kv_u64(pk, "dns_lookups", us->dns_lookups);
    rpc_pack_kv_u64(pk, "dns_abandoned", us->dns_abandoned);
    rpc_pack_kv_u64(pk, "dns_busy", us->dns_busy);
    rpc_pack_kv_u64(pk, "dns_waits", us->dns_waits);
    rpc_pack_kv_u64(pk, "own_connections_opened", us->conns_opened);
    rpc_pack_kv_u64(pk, "own_connections_reused", us->conns_reused);
    rpc_pack_kv_u64(pk, "own_stale_retries", us->stale_retries);
    rpc_pack_kv_u64(pk, "own_tls_handshakes", us->tls_done);
    rpc_pack_kv_u64(pk, "own_tls_resumed", us->tls_resumed);
    for (int i = ATTEMPT_RESOLVING; i < ATTEMPT_DONE; i++) {
        char key[40];
        snprintf(key, sizeof(key), "timeouts_%s", attempt_phase_name((enum attempt_phase)i));
        rpc_pack_kv_u64(pk, key, us->timeouts[i]);
    }

    rpc_pack_str(pk, "reload");
    msgpack_pack_map(pk, 3);
    rpc_pack_kv_u64(pk, "succeeded", st->reloads_ok);
    rpc_pack_kv_u64(pk, "failed", st->reloads_failed);
    rpc_pack_kv_str(pk, "last_error", c->srv->reload_error);

    if (hst) {
        /* The HTTP front end, when it is configured. */
        rpc_pack_str(pk, "http");
        msgpack_pack_map(pk, 11);
        rpc_pack_kv_u64(pk, "open", hst->conns_open);
        rpc_pack_kv_u64(pk, "accepted", hst->conns_accepted);
        rpc_pack_kv_u64(pk, "rejected", hst->conns_rejected);
        rpc_pack_kv_u64(pk, "requests", hst->requests);
        static const char *const classes[] = { "responses_1xx", "responses_2xx", "responses_3xx",
                                               "responses_4xx", "responses_5xx" };
        for (int i = 1; i <= 5; i++)
            rpc_pack_kv_u64(pk, classes[i - 1], hst->responses[i]);
        rpc_pack_kv_u64(pk, "timeouts", hst->timeouts);
        rpc_pack_kv_u64(pk, "bad_requests", hst->bad_requests);
    }
    pack_governance(pk, c->srv);
    tasks_pack_stats(pk, c->srv, conn_app(c));
    c->srv->backend->ops->pack_stats(c->srv->backend, pk); /* `backend` (and its own) */
    conn_response_done(c, PGW_OK);
}

/* `log.level {level?}`: the process-wide log threshold, changed at run time
 * when `level` is given (debug, info, warn, error). Answers {level,
 * previous}. The change itself is always logged, whatever the levels. */
static void method_log_level(struct conn *c, const struct rpc_msg *m)
{
    static const struct rpc_param spec[] = { { "level", RPC_T_STR | RPC_T_NIL, false } };
    const msgpack_object *p[1];
    enum log_level prev = log_threshold;
    char name[16];

    if (bind_or_reply(c, m, spec, 1, p) < 0)
        return;
    if (p[0]) {
        int lv = rpc_str_copy(p[0], name, sizeof(name)) < 0 ? -1 : config_parse_log_level(name);
        if (lv < 0) {
            conn_reply_error(c, m->msgid, PGW_BAD_REQUEST,
                             "params.level: expected debug, info, warn or error");
            return;
        }
        log_threshold = (enum log_level)lv;
        log_event(LOG_INFO, "log level changed", "from", LOG_S, log_level_name(prev), "to", LOG_S,
                  log_level_name(log_threshold), "conn", LOG_U, (unsigned long long)c->id, NULL);
    }
    rpc_pack_result_begin(&c->pk, m->msgid);
    msgpack_pack_map(&c->pk, 2);
    rpc_pack_kv_str(&c->pk, "level", log_level_name(log_threshold));
    rpc_pack_kv_str(&c->pk, "previous", log_level_name(prev));
    conn_response_done(c, PGW_OK);
}

/* The errors of an invalid file, for config.reload's answer. */
#define METHODS_RELOAD_ERRORS_MAX 32
struct reload_errors {
    char *msg[METHODS_RELOAD_ERRORS_MAX];
    size_t n, dropped;
};

static void collect_reload_error(void *arg, const char *msg)
{
    struct reload_errors *e = arg;

    if (e->n < METHODS_RELOAD_ERRORS_MAX && (e->msg[e->n] = strdup(msg)))
        e->n++;
    else
        e->dropped++;
}

/* `config.reload`: reloads the configuration file (reload.h). Answers the
 * summary, or bad_request with every error of the file in `errors`. */
static void method_config_reload(struct conn *c, const struct rpc_msg *m)
{
    struct reload_errors e = { .n = 0 };
    struct reload_summary sum;
    char err[CONFIG_ERR_MAX];

    if (bind_or_reply(c, m, NULL, 0, NULL) < 0)
        return;
    if (reload_run(c->srv, "config.reload", collect_reload_error, &e, &sum, err, sizeof(err)) ==
        0) {
        rpc_pack_result_begin(&c->pk, m->msgid);
        msgpack_pack_map(&c->pk, 5);
        rpc_pack_kv_u64(&c->pk, "sources", sum.sources);
        rpc_pack_kv_u64(&c->pk, "added", sum.added);
        rpc_pack_kv_u64(&c->pk, "removed", sum.removed);
        rpc_pack_kv_u64(&c->pk, "retired_in_use", sum.retired);
        rpc_pack_kv_u64(&c->pk, "reloads", c->srv->stats.reloads_ok);
        conn_response_done(c, PGW_OK);
        return;
    }
    enum pgw_code code = c->srv->state != SERVER_RUNNING ? PGW_SHUTTING_DOWN
        : strcmp(err, "out of memory") == 0              ? PGW_INTERNAL
                                                         : PGW_BAD_REQUEST;
    rpc_pack_error_begin(&c->pk, m->msgid, code, err, 1);
    rpc_pack_str(&c->pk, "errors");
    msgpack_pack_array(&c->pk, e.n);
    for (size_t i = 0; i < e.n; i++) {
        rpc_pack_str(&c->pk, e.msg[i]);
        free(e.msg[i]);
    }
    rpc_pack_error_end(&c->pk);
    conn_response_done(c, code);
}

#ifdef PGW_DEBUG_HOOKS
/* Test hook, compiled only into debug builds (make DEBUG_HOOKS=1, the
 * default with SAN=1): blocks the event loop for `seconds` (at most 30) as
 * a wedged callback would, so a test can check that the watchdog keep-alive
 * stops. Answers once the loop runs again. Never in a release build. */
#define METHODS_WEDGE_MAX_S 30.0
static void method_debug_wedge(struct conn *c, const struct rpc_msg *m)
{
    static const struct rpc_param spec[] = { { "seconds", RPC_T_NUMBER, true } };
    const msgpack_object *p[1];
    double s = 0;

    if (bind_or_reply(c, m, spec, 1, p) < 0)
        return;
    if (!rpc_as_double(p[0], &s) || !(s >= 0 && s <= METHODS_WEDGE_MAX_S)) {
        conn_reply_error(c, m->msgid, PGW_BAD_REQUEST, "params.seconds: must be in [0, 30]");
        return;
    }
    log_at(LOG_WARN, "debug.wedge: blocking the event loop", "seconds", LOG_F, s, NULL);
    struct timespec end, now;
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_sec += (time_t)s;
    end.tv_nsec += (long)((s - (double)(time_t)s) * 1e9);
    if (end.tv_nsec >= 1000000000L) {
        end.tv_sec++;
        end.tv_nsec -= 1000000000L;
    }
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &end, NULL) != 0) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > end.tv_sec || (now.tv_sec == end.tv_sec && now.tv_nsec >= end.tv_nsec))
            break;
    }
    ev_now_update(c->srv->loop);
    rpc_pack_result_begin(&c->pk, m->msgid);
    msgpack_pack_true(&c->pk);
    conn_response_done(c, PGW_OK);
}
#endif
/* `metrics`: the Prometheus text exposition, as the HTTP front serves it. */
static void method_metrics(struct conn *c, const struct rpc_msg *m)
{
    size_t len;

    if (bind_or_reply(c, m, NULL, 0, NULL) < 0)
        return;
    char *text = metrics_render(c->srv, &len);
    if (!text) {
        conn_reply_error(c, m->msgid, PGW_INTERNAL, "out of memory rendering the metrics");
        return;
    }
    rpc_pack_result_begin(&c->pk, m->msgid);
    msgpack_pack_map(&c->pk, 1);
    rpc_pack_str(&c->pk, "text");
    rpc_pack_strn(&c->pk, text, len);
    free(text);
    conn_response_done(c, PGW_OK);
}

static const struct {
    const char *name;
    method_fn *fn;
} method_table[] = {
#ifdef PGW_DEBUG_HOOKS
    { "debug.wedge", method_debug_wedge },
#endif
    { "ping", method_ping },
    { "hello", method_hello },
    { "call", callrpc_start },
    { "task.start", tasks_start },
    { "task.stop", tasks_stop },
    { "task.guard", tasks_guard },
    { "task.node_begin", tasks_node_begin },
    { "task.node_end", tasks_node_end },
    { "task.finish", tasks_finish },
    { "task.get", tasks_get },
    { "task.list", tasks_list },
    { "stats", method_stats },
    { "log.level", method_log_level },
    { "config.reload", method_config_reload },
    { "metrics", method_metrics },
};

void methods_dispatch(struct conn *c, const struct rpc_msg *m)
{
    char buf[160], name[65];

    for (size_t i = 0; i < sizeof(method_table) / sizeof(method_table[0]); i++) {
        if (rpc_method_is(m, method_table[i].name)) {
            method_table[i].fn(c, m);
            return;
        }
    }
    rpc_quote_client_str(m->method, m->method_len, sizeof(name) - 1, name);
    snprintf(buf, sizeof(buf), "unknown method '%s'", name);
    conn_reply_error(c, m->msgid, PGW_UNKNOWN_METHOD, buf);
}

void methods_notify(struct conn *c, const struct rpc_msg *m)
{
    /* `cancel` takes its msgid positionally: [2, "cancel", [msgid]]. */
    if (rpc_method_is(m, "cancel") && m->params->type == MSGPACK_OBJECT_ARRAY &&
        m->params->via.array.size == 1 &&
        m->params->via.array.ptr[0].type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
        m->params->via.array.ptr[0].via.u64 <= UINT32_MAX) {
        if (call_cancel(&c->sink, (uint32_t)m->params->via.array.ptr[0].via.u64) == 0) {
            c->srv->stats.cancels++;
            return;
        }
    }
    /* Notifications have no reply channel: anything else (an unknown one,
     * or a cancel for a call that already ended) is counted and logged. */
    c->srv->stats.notifications_ignored++;
    log_at(LOG_DEBUG, "notification ignored", "conn", LOG_U, (unsigned long long)c->id,
           "method_len", LOG_U, (unsigned long long)m->method_len, NULL);
}
