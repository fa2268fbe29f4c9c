/*
 * methods.c — the method table: validates each request's named parameters
 * and answers it. Requests that need I/O (call, later) complete
 * asynchronously; the rest answer before returning. Also sets up what the
 * methods keep in each connection (methods_conn_init).
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
#include "ops/stats.h"
#include "core/log.h"
#include "metrics/metrics.h"
#include "progress.h"
#include "backend/backend.h"
#include "ops/cacheops.h"
#include "ops/reload.h"
#include "upstream/upstream.h"

typedef void method_fn(struct conn *c, const struct rpc_msg *m);

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

static struct stats_caller conn_caller(const struct conn *c)
{
    return (struct stats_caller){ conn_app(c), c->peer_app, &c->peer };
}

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
    stats_write_identity(&w, &who);
    conn_response_done(c, PGW_OK);
}

static void method_stats(struct conn *c, const struct rpc_msg *m)
{
    if (bind_or_reply(c, m, NULL, 0, NULL) < 0)
        return;
    const struct stats_caller who = conn_caller(c);
    struct writer w;
    rpc_pack_result_begin(&c->pk, m->msgid);
    writer_init_msgpack(&w, &c->pk);
    stats_write(&w, c->srv, &who);
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

/* `cache.purge {capability?, app?}`: drops cached answers (cacheops.h);
 * admin apps only. Answers {purged}, or later {purged, purged_shared}
 * with a shared tier. */
static void method_cache_purge(struct conn *c, const struct rpc_msg *m)
{
    static const struct rpc_param spec[] = { { "capability", RPC_T_STR | RPC_T_NIL, false },
                                             { "app", RPC_T_STR | RPC_T_NIL, false } };
    static const char *const what[2] = { "params.capability", "params.app" };
    const msgpack_object *p[2];
    char name[2][CONFIG_NAME_MAX], err[200];
    enum pgw_code code;
    size_t purged;

    if (bind_or_reply(c, m, spec, 2, p) < 0)
        return;
    for (int i = 0; i < 2; i++) {
        if (p[i] && p[i]->type == MSGPACK_OBJECT_NIL)
            p[i] = NULL;
        if (p[i] && rpc_ident_copy(what[i], p[i], name[i], sizeof(name[i]), err, sizeof(err)) < 0) {
            conn_reply_error(c, m->msgid, PGW_BAD_REQUEST, err);
            return;
        }
    }
    int rc = cacheops_purge(c->srv, conn_app(c), p[0] ? name[0] : NULL, p[1] ? name[1] : NULL,
                            &c->tasks, m->msgid, &purged, &code, err, sizeof(err));
    if (rc == 1)
        return; /* answered once the shared tier is purged, through c->tasks */
    if (rc < 0) {
        conn_reply_error(c, m->msgid, code, err);
        return;
    }
    rpc_pack_result_begin(&c->pk, m->msgid);
    msgpack_pack_map(&c->pk, 1);
    rpc_pack_kv_u64(&c->pk, "purged", purged);
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
    { "task.list", taskrpc_list },
    { "stats", method_stats },
    { "cache.purge", method_cache_purge },
    { "log.level", method_log_level },
    { "config.reload", method_config_reload },
    { "metrics", method_metrics },
};

void methods_conn_init(struct conn *c)
{
    callrpc_sink_init(&c->sink, c->srv, &c->budget);
    taskrpc_outlet_init(&c->tasks, c->srv);
}

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
