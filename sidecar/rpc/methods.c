/*
 * methods.c — the method table: validates each request's named parameters
 * and answers it. Requests that need I/O (call, later) complete
 * asynchronously; the rest answer before returning.
 */
#include "conn.h"
#include "strbuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "callrpc.h"
#include "codec/transcode.h"
#include "taskrpc.h"
#include "http/http.h"
#include "core/log.h"
#include "metrics/metrics.h"
#include "progress.h"
#include "backend/backend.h"
#include "ops/reload.h"
#include "call/tasks.h"
#include "upstream/upstream.h"

typedef void method_fn(struct conn *c, const struct rpc_msg *m);

/* A bucket's level, or nil when it is unlimited. */
static void write_kv_bucket(struct writer *w, const char *k, struct bucket *b, double now)
{
    writer_str(w, k);
    if (bucket_is_unlimited(b))
        writer_nil(w);
    else
        writer_double(w, bucket_level(b, now));
}

struct scope_iter {
    struct writer *w;
    double now;
};

static void pack_scope(const char *scope, double last_at, void *ud)
{
    struct scope_iter *it = ud;
    writer_text(it->w, scope);
    writer_map(it->w, 1);
    writer_kv_double(it->w, "progress_age_s", it->now - last_at);
}

/* `sources`, `scopes` and `calls_waiting`: the governance state. A scope
 * that never succeeded is absent (its progress age is +inf). */
static void write_governance(struct writer *w, struct server *srv)
{
    struct gov *g = &srv->gov;
    double now = ev_now(srv->loop);
    uint64_t waiting = 0;

    writer_str(w, "sources");
    writer_array(w, g->n_sources);
    for (size_t i = 0; i < g->n_sources; i++) {
        struct gov_source *s = &g->sources[i];
        double next = breaker_next_admit(&s->breaker, now);
        uint32_t limit = aimd_permits(&s->aimd);
        if (limit > s->p.max_concurrency)
            limit = s->p.max_concurrency;
        writer_map(w, 16 + (s->p.retired ? 1 : 0));
        writer_str(w, "name");
        writer_str(w, s->p.name);
        if (s->p.retired) /* removed by a reload, still in use */
        {
            writer_str(w, "retired");
            writer_bool(w, true);
        }
        writer_str(w, "capability");
        writer_str(w, srv->cfg->capabilities[s->p.capability].name);
        writer_kv_u64(w, "in_flight", s->in_flight);
        writer_kv_u64(w, "limit", limit);
        writer_kv_double(w, "aimd_limit", s->aimd.limit);
        writer_str(w, "breaker");
        writer_str(w, breaker_state_name(s->breaker.state));
        writer_kv_double(w, "next_probe_in_s", next > now && next < 1e300 ? next - now : 0);
        write_kv_bucket(w, "rpm_level", &s->rpm, now);
        write_kv_bucket(w, "tpm_level", &s->tpm, now);
        write_kv_bucket(w, "daily_tokens_level", &s->daily, now);
        writer_kv_u64(w, "attempts", s->attempts);
        writer_kv_u64(w, "successes", s->successes);
        writer_kv_u64(w, "failures", s->failures);
        writer_kv_u64(w, "rate_limited", s->rate_limited);
        writer_kv_u64(w, "breaker_opened", s->breaker.opened_total);
        writer_kv_u64(w, "tokens_used", s->tokens_used);
    }
    writer_str(w, "scopes");
    struct scope_iter it = { w, now };
    writer_map(w, g->progress ? progress_count(g->progress) : 0);
    if (g->progress)
        progress_foreach(g->progress, pack_scope, &it);
    for (size_t i = 0; i < g->n_capabilities; i++)
        waiting += g->waitq[i].n;
    writer_kv_u64(w, "calls_waiting", waiting);
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
static void write_identity(struct writer *w, const struct stats_caller *who)
{
    const struct config_app *a = who->app;
    const struct peer *peer = who->peer;
    bool known = peer && peer->known;

    writer_map(w, 6);
    writer_kv_str(w, "app", a->name);
    writer_kv_str(w, "peer_app", who->peer_app);
    writer_str(w, "admin");
    writer_bool(w, a->admin);
    writer_str(w, "uid");
    known ? writer_u64(w, peer->uid) : writer_nil(w);
    writer_str(w, "gid");
    known ? writer_u64(w, peer->gid) : writer_nil(w);
    writer_str(w, "pid");
    known ? writer_u64(w, peer->pid) : writer_nil(w);
}

static struct stats_caller conn_caller(const struct conn *c)
{
    return (struct stats_caller){ conn_app(c), c->peer_app, &c->peer };
}

/* `apps`: each app's admission figures from the governance core; only the
 * caller's own unless it is admin. Sources are shared infrastructure: every
 * caller sees them (`sources`), as it sees the limits that hold its calls. */
static void write_apps(struct writer *w, struct server *srv, const struct config_app *me)
{
    struct gov *g = &srv->gov;
    const struct config *cfg = srv->cfg;
    double now = ev_now(srv->loop);
    size_t n = 0;

    for (size_t i = 0; g->apps && i < g->n_apps && i < cfg->n_apps; i++)
        n += me->admin || &cfg->apps[i] == me;
    writer_str(w, "apps");
    writer_array(w, (uint32_t)n);
    for (size_t i = 0; g->apps && i < g->n_apps && i < cfg->n_apps; i++) {
        struct gov_app *a = &g->apps[i];
        if (!me->admin && &cfg->apps[i] != me)
            continue;
        const struct config_app_limits *pc = cfg->apps[i].per_capability;
        size_t n_pc = 0;
        for (size_t ci = 0; pc && ci < a->n_caps && ci < cfg->n_capabilities; ci++)
            n_pc += pc[ci].set;
        writer_map(w, 8 + (n_pc > 0));
        writer_kv_str(w, "name", cfg->apps[i].name);
        writer_kv_double(w, "weight", a->p.weight);
        writer_kv_u64(w, "in_flight", a->in_flight);
        writer_kv_u64(w, "admitted", a->admitted);
        writer_kv_u64(w, "limited", a->limited);
        write_kv_bucket(w, "rpm_level", &a->rpm, now);
        write_kv_bucket(w, "tpm_level", &a->tpm, now);
        write_kv_bucket(w, "daily_tokens_level", &a->daily, now);
        if (!n_pc)
            continue;
        writer_str(w, "per_capability");
        writer_map(w, (uint32_t)n_pc);
        for (size_t ci = 0; ci < a->n_caps && ci < cfg->n_capabilities; ci++) {
            struct gov_app_cap *ac = &a->caps[ci];
            if (!pc[ci].set)
                continue;
            writer_str(w, cfg->capabilities[ci].name);
            writer_map(w, 5);
            writer_kv_u64(w, "in_flight", ac->in_flight);
            writer_kv_u64(w, "limited", ac->limited);
            write_kv_bucket(w, "rpm_level", &ac->rpm, now);
            write_kv_bucket(w, "tpm_level", &ac->tpm, now);
            write_kv_bucket(w, "daily_tokens_level", &ac->daily, now);
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
    const struct stats_caller who = conn_caller(c);
    struct writer w;
    writer_init_msgpack(&w, &c->pk);
    write_identity(&w, &who);
    conn_response_done(c, PGW_OK);
}

/* The backend's own `stats` pairs (backend.h packs them as msgpack): as
 * they are for the msgpack writer, through the transcoder for JSON. */
static void write_backend_stats(struct writer *w, struct server *srv)
{
    const struct backend_ops *ops = srv->backend->ops;

    if (w->pk) {
        ops->pack_stats(srv->backend, w->pk);
        return;
    }
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_unpacked up;
    struct strbuf json;
    msgpack_sbuffer_init(&sb);
    msgpack_unpacked_init(&up);
    strbuf_init(&json);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, ops->stats_keys);
    ops->pack_stats(srv->backend, &pk);
    if (msgpack_unpack_next(&up, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS &&
        transcode_msgpack_to_json(&up.data, &json, NULL, "stats", NULL, 0) == 0)
        writer_raw_json_members(w, json.data, json.len, ops->stats_keys);
    else
        writer_raw_json_members(w, NULL, 0, ops->stats_keys);
    strbuf_fini(&json);
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&sb);
}

void methods_write_stats(struct writer *w, struct server *srv, const struct stats_caller *who)
{
    const struct server_stats *st = &srv->stats;
    const struct http_stats *hst = http_get_stats(srv->http);
    writer_map(w, 14 + srv->backend->ops->stats_keys + (hst ? 1 : 0)); /* caller, apps, reload */

    writer_str(w, "version");
    writer_str(w, PGW_VERSION);
    writer_str(w, "uptime_s");
    writer_double(w, server_uptime_s(srv));

    writer_str(w, "caller");
    write_identity(w, who);
    write_apps(w, srv, who->app);

    writer_str(w, "connections");
    writer_map(w, 6);
    writer_kv_u64(w, "open", st->conns_open);
    writer_kv_u64(w, "accepted", st->conns_accepted);
    writer_kv_u64(w, "rejected", st->conns_rejected);
    writer_kv_u64(w, "accept_errors", st->accept_errors);
    writer_kv_u64(w, "idle_closed", st->conns_idle_closed);
    writer_kv_u64(w, "input_refused", st->input_refusals);

    writer_str(w, "requests");
    writer_map(w, 5);
    /* This request is answered right after: count it as served. */
    writer_kv_u64(w, "served", st->requests_served + 1);
    writer_kv_u64(w, "in_flight", st->in_flight);
    writer_kv_u64(w, "notifications_ignored", st->notifications_ignored);
    writer_kv_u64(w, "cancels", st->cancels);
    writer_kv_u64(w, "chunks_relayed", st->chunks_relayed);

    writer_str(w, "rejected");
    writer_map(w, PGW_CODE_COUNT - 1);
    for (int i = 1; i < PGW_CODE_COUNT; i++)
        writer_kv_u64(w, pgw_code_name((enum pgw_code)i), st->rejected[i]);

    writer_str(w, "io");
    writer_map(w, 3);
    writer_kv_u64(w, "bytes_in", st->bytes_in);
    writer_kv_u64(w, "bytes_out", st->bytes_out);
    writer_kv_u64(w, "read_pauses", st->read_pauses);

    const struct upstream_stats *us = upstream_get_stats(srv->up);
    writer_str(w, "upstream");
    writer_map(w, 18);
    writer_kv_u64(w, "attempts_started", us->attempts_started);
    writer_kv_u64(w, "attempts_done", us->attempts_done);
    writer_kv_u64(w, "attempts_cancelled", us->attempts_cancelled);
    writer_kv_u64(w, "attempts_active", us->attempts_active);
    writer_kv_u64(w, "dns_lookups", us->dns_lookups);
    writer_kv_u64(w, "dns_abandoned", us->dns_abandoned);
    writer_kv_u64(w, "dns_busy", us->dns_busy);
    writer_kv_u64(w, "dns_waits", us->dns_waits);
    writer_kv_u64(w, "own_connections_opened", us->conns_opened);
    writer_kv_u64(w, "own_connections_reused", us->conns_reused);
    writer_kv_u64(w, "own_stale_retries", us->stale_retries);
    writer_kv_u64(w, "own_tls_handshakes", us->tls_done);
    writer_kv_u64(w, "own_tls_resumed", us->tls_resumed);
    for (int i = ATTEMPT_RESOLVING; i < ATTEMPT_DONE; i++) {
        char key[40];
        snprintf(key, sizeof(key), "timeouts_%s", attempt_phase_name((enum attempt_phase)i));
        writer_kv_u64(w, key, us->timeouts[i]);
    }

    writer_str(w, "reload");
    writer_map(w, 3);
    writer_kv_u64(w, "succeeded", st->reloads_ok);
    writer_kv_u64(w, "failed", st->reloads_failed);
    writer_kv_str(w, "last_error", srv->reload_error);

    if (hst) {
        /* The HTTP front end, when it is configured. */
        writer_str(w, "http");
        writer_map(w, 11);
        writer_kv_u64(w, "open", hst->conns_open);
        writer_kv_u64(w, "accepted", hst->conns_accepted);
        writer_kv_u64(w, "rejected", hst->conns_rejected);
        writer_kv_u64(w, "requests", hst->requests);
        static const char *const classes[] = { "responses_1xx", "responses_2xx", "responses_3xx",
                                               "responses_4xx", "responses_5xx" };
        for (int i = 1; i <= 5; i++)
            writer_kv_u64(w, classes[i - 1], hst->responses[i]);
        writer_kv_u64(w, "timeouts", hst->timeouts);
        writer_kv_u64(w, "bad_requests", hst->bad_requests);
    }
    write_governance(w, srv);
    tasks_write_stats(w, srv, who->app);
    write_backend_stats(w, srv); /* `backend` (and its own) */
}

static void method_stats(struct conn *c, const struct rpc_msg *m)
{
    if (bind_or_reply(c, m, NULL, 0, NULL) < 0)
        return;
    const struct stats_caller who = conn_caller(c);
    struct writer w;
    rpc_pack_result_begin(&c->pk, m->msgid);
    writer_init_msgpack(&w, &c->pk);
    methods_write_stats(&w, c->srv, &who);
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
    { "task.start", taskrpc_start },
    { "task.stop", taskrpc_stop },
    { "task.guard", taskrpc_guard },
    { "task.node_begin", taskrpc_node_begin },
    { "task.node_end", taskrpc_node_end },
    { "task.finish", taskrpc_finish },
    { "task.get", taskrpc_get },
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
