/* reload.c — see reload.h. */
#include "reload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cache.h"
#include "call/call.h"
#include "call/governor.h"
#include "core/log.h"
#include "metrics/metrics.h"
#include "call/redact.h"
#include "trace/trace.h"
#include "upstream/cloudauth.h"

/* Keys of earlier configurations kept in the redactor: an attempt started
 * before a key rotation may still be running, and its upstream may echo
 * the old key. Rotations are rare; the oldest are dropped past this. */
#define RELOAD_OLD_KEYS_MAX 64

struct reload_ctx {
    struct server *srv;
    config_report_fn *report;
    void *arg;
    size_t n_errors;
};

static void on_config_error(void *arg, const char *msg)
{
    struct reload_ctx *x = arg;

    x->n_errors++;
    log_at(LOG_ERROR, "reload: configuration error", "error", LOG_S, msg, NULL);
    if (x->report)
        x->report(x->arg, msg);
}

static bool str_eq(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* Appends ", name" to the list of keys that need a restart. */
static void note_restart(char *buf, size_t cap, const char *name)
{
    size_t n = strlen(buf);
    snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", name);
}

/* The apps' limits are the same: their own, and per_capability those of
 * the `n_old` capabilities equal and none on one the reload appends. */
static bool app_limits_same(const struct config_app *x, const struct config_app *y, size_t n_old,
                            size_t n_new)
{
    if (x->max_concurrency != y->max_concurrency ||
        memcmp(&x->limits, &y->limits, sizeof(x->limits)) != 0)
        return false;
    if (!x->per_capability || !y->per_capability)
        return !x->per_capability && !y->per_capability;
    for (size_t c = n_old; c < n_new; c++)
        if (y->per_capability[c].set)
            return false;
    for (size_t c = 0; c < n_old; c++) {
        const struct config_app_limits *a = &x->per_capability[c], *b = &y->per_capability[c];
        if (a->set != b->set || a->max_concurrency != b->max_concurrency ||
            a->limits.rpm != b->limits.rpm || a->limits.tpm != b->limits.tpm ||
            a->limits.daily_tokens != b->limits.daily_tokens ||
            a->limits.window_s != b->limits.window_s)
            return false;
    }
    return true;
}

/* Rule 2 of reload.h: the keys a reload cannot apply. */
static void restart_only(const struct config *o, const struct config *n, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (!str_eq(o->socket_path, n->socket_path))
        note_restart(buf, cap, "listen.socket");
    if (o->socket_mode != n->socket_mode)
        note_restart(buf, cap, "listen.mode");
    if (o->max_message_bytes != n->max_message_bytes)
        note_restart(buf, cap, "listen.max_message_bytes");
    if (o->max_connections != n->max_connections)
        note_restart(buf, cap, "listen.max_connections");
    if (o->max_inflight_per_connection != n->max_inflight_per_connection)
        note_restart(buf, cap, "listen.max_inflight_per_connection");
    if (o->max_write_queue_bytes != n->max_write_queue_bytes)
        note_restart(buf, cap, "listen.max_write_queue_bytes");
    if (o->max_buffered_input_bytes != n->max_buffered_input_bytes)
        note_restart(buf, cap, "listen.max_buffered_input_bytes");
    if (o->idle_timeout_s != n->idle_timeout_s)
        note_restart(buf, cap, "listen.idle_timeout_s");
    if (o->backend != n->backend)
        note_restart(buf, cap, "backend.kind");
    if (!str_eq(o->redis_url, n->redis_url))
        note_restart(buf, cap, "backend.url");
    if (!str_eq(o->redis_prefix, n->redis_prefix))
        note_restart(buf, cap, "backend.prefix");
    if (o->redis_command_timeout_s != n->redis_command_timeout_s)
        note_restart(buf, cap, "backend.command_timeout_s");
    if (o->redis_lease_ttl_s != n->redis_lease_ttl_s)
        note_restart(buf, cap, "backend.lease_ttl_s");
    if (!str_eq(o->http_socket, n->http_socket))
        note_restart(buf, cap, "http.socket");
    if (!str_eq(o->http_listen, n->http_listen))
        note_restart(buf, cap, "http.listen");
    if (o->http_allow_remote != n->http_allow_remote)
        note_restart(buf, cap, "http.allow_remote");
    if (o->http_max_body_bytes != n->http_max_body_bytes ||
        o->http_max_header_bytes != n->http_max_header_bytes ||
        o->http_max_connections != n->http_max_connections ||
        o->http_header_timeout_s != n->http_header_timeout_s ||
        o->http_body_timeout_s != n->http_body_timeout_s ||
        o->http_keepalive_timeout_s != n->http_keepalive_timeout_s ||
        o->http_send_timeout_s != n->http_send_timeout_s)
        note_restart(buf, cap, "http (bounds and timeouts)");
    if (o->upstream_client != n->upstream_client)
        note_restart(buf, cap, "server.upstream_client");
    /* The governance core holds one slot per app, in file order (a call
     * and its place in a wait queue name its app by index): the apps'
     * names and order are fixed until a restart. Their weight and limits
     * are carried over by a reload (gov_apps_reconf); who maps to an app
     * (uids, gids), admin, allow_declared and the allowed capabilities are
     * read from the live configuration. */
    bool apps_same = o->n_apps == n->n_apps;
    for (size_t i = 0; apps_same && i < o->n_apps; i++)
        apps_same = strcmp(o->apps[i].name, n->apps[i].name) == 0;
    if (!apps_same)
        note_restart(buf, cap, "apps (added, removed, renamed or reordered)");
    if (o->task_ttl_s != n->task_ttl_s)
        note_restart(buf, cap, "tasks.ttl_s");
    if (o->max_tasks != n->max_tasks)
        note_restart(buf, cap, "tasks.max_tasks");
    if (o->defaults.node_timeout_s != n->defaults.node_timeout_s)
        note_restart(buf, cap, "defaults.node_timeout_s");
    bool caps_ok = n->n_capabilities >= o->n_capabilities;
    for (size_t i = 0; caps_ok && i < o->n_capabilities; i++)
        caps_ok = strcmp(o->capabilities[i].name, n->capabilities[i].name) == 0;
    if (!caps_ok)
        note_restart(buf, cap, "capabilities (one removed or reordered)");
}

/* With the Redis backend, the apps' limits are the fleet's too (admit.lua
 * holds them); their weights order this sidecar's wait queue only. */
static void fleet_fixed_apps(const struct config *o, const struct config *n, char *buf, size_t cap)
{
    char name[CONFIG_NAME_MAX + 128];

    for (size_t i = 0; i < o->n_apps && i < n->n_apps; i++) {
        if (app_limits_same(&o->apps[i], &n->apps[i], o->n_capabilities, n->n_capabilities))
            continue;
        snprintf(name, sizeof(name),
                 "apps[%zu] %s max_concurrency/limits/per_capability (with the redis backend)", i,
                 n->apps[i].name);
        note_restart(buf, cap, name);
    }
}

/* With the Redis backend: what the fleet's scripts were set up with. */
static void fleet_fixed(const struct config *o, const struct config *n, char *buf, size_t cap)
{
    char name[CONFIG_NAME_MAX + 128];

    fleet_fixed_apps(o, n, buf, cap);
    if (o->n_sources != n->n_sources) {
        note_restart(buf, cap, "sources (added or removed, with the redis backend)");
        return;
    }
    for (size_t i = 0; i < n->n_sources; i++) {
        const struct config_source *a = &o->sources[i], *b = &n->sources[i];
        if (strcmp(a->name, b->name) != 0 || a->capability_index != b->capability_index) {
            snprintf(name, sizeof(name), "sources[%zu] (renamed or moved, with the redis backend)",
                     i);
            note_restart(buf, cap, name);
        } else if (a->max_concurrency != b->max_concurrency ||
                   memcmp(&a->limits, &b->limits, sizeof(a->limits)) != 0 ||
                   memcmp(&a->breaker, &b->breaker, sizeof(a->breaker)) != 0) {
            snprintf(name, sizeof(name),
                     "sources[%zu] %s max_concurrency/limits/breaker (with the redis backend)", i,
                     b->name);
            note_restart(buf, cap, name);
        }
    }
}

/* The old source a new one continues: same name and capability, not retired. */
static long find_source(const struct config *o, const struct config_source *s)
{
    for (size_t i = 0; i < o->n_sources; i++) {
        const struct config_source *x = &o->sources[i];
        if (!x->retired && x->capability_index == s->capability_index &&
            strcmp(x->name, s->name) == 0)
            return (long)i;
    }
    return -1;
}

/* The secrets source `s` sends: its API key and the header values read from
 * the environment or a file (a literal value is in the file for anyone to
 * read). Fills out[] (room for 1 + s->n_headers), returns the count. */
static size_t source_secrets(const struct config_source *s, const char **out)
{
    size_t n = 0;

    if (s->api_key)
        out[n++] = s->api_key;
    for (size_t j = 0; j < s->n_headers; j++)
        if ((s->headers[j].value_env || s->headers[j].value_file) && s->headers[j].value)
            out[n++] = s->headers[j].value;
    return n;
}

static size_t max_secrets(const struct config_source *s, size_t n)
{
    size_t m = 0;

    for (size_t i = 0; i < n; i++)
        m += 1 + s[i].n_headers;
    return m;
}

static bool key_in(const char *key, const struct config_source *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (s[i].api_key && strcmp(s[i].api_key, key) == 0)
            return true;
        for (size_t j = 0; j < s[i].n_headers; j++)
            if (s[i].headers[j].value && strcmp(s[i].headers[j].value, key) == 0)
                return true;
    }
    return false;
}

static void wipe_free(char *s)
{
    if (s) {
        explicit_bzero(s, strlen(s));
        free(s);
    }
}

/* The next list of old keys: the current list plus the running
 * configuration's keys that the new one no longer has (rule: see
 * RELOAD_OLD_KEYS_MAX), as owned copies in out[0..*n_out). */
static int next_old_keys(const struct server *srv, const struct config_source *slots, size_t n,
                         char **out, size_t *n_out)
{
    const struct config *o = srv->cfg;
    size_t k = 0;

    for (size_t i = 0; i < srv->n_old_keys; i++)
        if (!key_in(srv->old_keys[i], slots, n))
            out[k++] = srv->old_keys[i]; /* borrowed until commit */
    size_t borrowed = k;
    for (size_t i = 0; i < o->n_sources; i++) {
        const char *sec[1 + o->sources[i].n_headers];
        size_t ns = source_secrets(&o->sources[i], sec);
        for (size_t q = 0; q < ns; q++) {
            const char *key = sec[q];
            bool seen = key_in(key, slots, n);
            for (size_t j = 0; !seen && j < k; j++)
                seen = strcmp(out[j], key) == 0;
            if (seen)
                continue;
            if (!(out[k] = strdup(key))) {
                while (k > borrowed)
                    wipe_free(out[--k]);
                return -1;
            }
            k++;
        }
    }
    *n_out = k;
    return (int)borrowed;
}

static struct redact *make_redact(const struct config_source *slots, size_t n, char **old,
                                  size_t n_old)
{
    const char **keys = calloc(max_secrets(slots, n) + n_old + 1, sizeof(*keys));
    struct redact *r;
    size_t k = 0;

    if (!keys)
        return NULL;
    for (size_t i = 0; i < n; i++)
        k += source_secrets(&slots[i], keys + k);
    for (size_t i = 0; i < n_old; i++)
        keys[k++] = old[i];
    r = redact_new(keys, k);
    free(keys);
    return r;
}

/* Loads the file and checks what a reload cannot change. Returns the new
 * configuration (owned; its sources not yet arranged into slots), or NULL
 * with err. */
static struct config *load_new(struct reload_ctx *x, char *err, size_t errlen)
{
    struct server *srv = x->srv;
    char first[CONFIG_ERR_MAX], why[768];
    struct config *n =
        config_load_report(srv->config_path, on_config_error, x, first, sizeof(first));

    if (!n) {
        snprintf(err, errlen, "%s: invalid configuration (%zu error%s), nothing changed: %s",
                 srv->config_path, x->n_errors, x->n_errors == 1 ? "" : "s", first);
        return NULL;
    }
    /* The command line's overrides win over the file, as at start-up. */
    struct {
        const char *value;
        char **slot;
    } over[] = {
        { srv->socket_override, &n->socket_path },
        { srv->http_socket_override, &n->http_socket },
        { srv->http_listen_override, &n->http_listen },
    };
    for (size_t i = 0; i < sizeof(over) / sizeof(over[0]); i++) {
        if (!over[i].value)
            continue;
        char *p = strdup(over[i].value);
        if (!p) {
            config_free(n);
            snprintf(err, errlen, "out of memory");
            return NULL;
        }
        free(*over[i].slot);
        *over[i].slot = p;
    }
    restart_only(srv->cfg, n, why, sizeof(why));
    if (!why[0] && n->backend == BACKEND_REDIS)
        fleet_fixed(srv->cfg, n, why, sizeof(why));
    if (why[0]) {
        snprintf(err, errlen, "%s: changed: %s; these need a restart (nothing changed)",
                 srv->config_path, why);
        config_free(n);
        return NULL;
    }
    return n;
}

static bool from_has(const long *from, size_t n, long i)
{
    for (size_t j = 0; j < n; j++)
        if (from[j] == i)
            return true;
    return false;
}

static int reload_apply(struct reload_ctx *x, struct reload_summary *sum, char *err, size_t errlen)
{
    struct server *srv = x->srv;
    struct config *o = srv->cfg;
    double now = ev_now(srv->loop);
    struct config *n = load_new(x, err, errlen);
    struct config_source *slots = NULL;
    struct gov_source_params *params = NULL;
    long *from = NULL;
    char **old_keys = NULL;
    size_t n_old_keys = 0;
    struct redact *red = NULL;
    struct gov_reconf r;
    struct gov_app_params *app_params = NULL;
    struct gov_app_cap_params *app_caps = NULL;
    int borrowed = 0;

    if (!n)
        return -1;
    memset(sum, 0, sizeof(*sum));
    size_t n_ret = 0;
    bool *keep = calloc(o->n_sources ? o->n_sources : 1, sizeof(*keep));
    if (!keep)
        goto oom;
    for (size_t j = 0; j < n->n_sources; j++) {
        long i = find_source(o, &n->sources[j]);
        if (i >= 0)
            keep[i] = true;
    }
    for (size_t i = 0; i < o->n_sources; i++) {
        if (!keep[i] && (srv->gov.sources[i].in_flight > 0 || call_uses_source(srv, i))) {
            keep[i] = true;
            n_ret++;
        } else if (!keep[i]) {
            sum->removed += !o->sources[i].retired;
        }
    }
    size_t n_slots = n->n_sources + n_ret;
    slots = calloc(n_slots ? n_slots : 1, sizeof(*slots));
    params = calloc(n_slots ? n_slots : 1, sizeof(*params));
    from = calloc(n_slots ? n_slots : 1, sizeof(*from));
    old_keys =
        calloc(srv->n_old_keys + max_secrets(o->sources, o->n_sources) + 1, sizeof(*old_keys));
    if (!slots || !params || !from || !old_keys)
        goto oom;
    memcpy(slots, n->sources, n->n_sources * sizeof(*slots));
    for (size_t j = 0; j < n->n_sources; j++) {
        from[j] = find_source(o, &n->sources[j]);
        sum->added += from[j] < 0;
    }
    size_t s = n->n_sources;
    for (size_t i = 0; i < o->n_sources; i++) {
        if (!keep[i] || from_has(from, n->n_sources, (long)i))
            continue;
        slots[s] = o->sources[i]; /* moved at commit */
        slots[s].retired = true;
        sum->removed += !o->sources[i].retired;
        from[s++] = (long)i;
    }
    sum->retired = n_ret;
    sum->sources = n->n_sources;

    /* Everything that can fail, before anything changes. */
    struct config view = *n;
    view.sources = slots;
    view.n_sources = n_slots;
    governor_source_params(&view, params);
    borrowed = next_old_keys(srv, slots, n_slots, old_keys, &n_old_keys);
    if (borrowed < 0)
        goto oom;
    red = make_redact(slots, n_slots, old_keys, n_old_keys);
    if (!red)
        goto oom_keys;
    int rc = gov_reconf_prepare(&r, &srv->gov, params, from, n_slots, n->n_capabilities, now);
    if (rc < 0) {
        snprintf(err, errlen, rc == -1 ? "out of memory" : "internal: inconsistent source map");
        goto fail_keys;
    }
    if (call_reconf_prepare(srv, &r) < 0) {
        gov_reconf_abort(&r);
        goto oom_keys;
    }
    struct metrics_reconf mr = { NULL, NULL };
    if (srv->metrics && metrics_reconf_prepare(srv->metrics, &view, from, &mr) < 0) {
        call_reconf_abort(srv);
        gov_reconf_abort(&r);
        goto oom_keys;
    }
    /* The apps' weights and limits (their names and order are the same). */
    struct gov_apps_reconf ar = { 0 };
    if (governor_app_params(n, &app_params, &app_caps) < 0 ||
        (srv->gov.apps &&
         gov_apps_reconf_prepare(&ar, &srv->gov, app_params, n->n_apps, n->n_capabilities) < 0)) {
        if (srv->metrics)
            metrics_reconf_abort(&mr);
        call_reconf_abort(srv);
        gov_reconf_abort(&r);
        goto oom_keys;
    }

    /* The swap: nothing below can fail. */
    gov_reconf_commit(&srv->gov, &r);
    if (srv->gov.apps)
        gov_apps_reconf_commit(&srv->gov, &ar, now);
    free(n->sources);
    n->sources = slots;
    n->n_sources = n_slots;
    call_reconf_commit(srv, &r, n);
    gov_reconf_finish(&r);
    if (srv->metrics)
        metrics_reconf_commit(srv->metrics, n, &mr);
    backend_rebind(srv->backend, n); /* it borrows the configuration */
    for (size_t i = 0; i < o->n_sources; i++)
        if (keep[i] && !from_has(from, n_slots - n_ret, (long)i))
            /* moved into a retired slot */
            memset(&o->sources[i], 0, sizeof(o->sources[i]));
    /* Old keys no longer kept are wiped; kept ones move to the new list. */
    for (size_t i = 0; i < srv->n_old_keys; i++) {
        bool kept = false;
        for (int j = 0; j < borrowed && !kept; j++)
            kept = old_keys[j] == srv->old_keys[i];
        if (!kept)
            wipe_free(srv->old_keys[i]);
    }
    free(srv->old_keys);
    while (n_old_keys > RELOAD_OLD_KEYS_MAX) {
        wipe_free(old_keys[0]);
        memmove(old_keys, old_keys + 1, --n_old_keys * sizeof(*old_keys));
    }
    srv->old_keys = old_keys;
    srv->n_old_keys = n_old_keys;
    redact_free(srv->redact);
    srv->redact = red;
    srv->cfg = n;
    char terr[160];
    if (srv->tracer && tracer_reconf(srv->tracer, &n->tracing, terr, sizeof(terr)) < 0)
        log_at(LOG_WARN, "tracing keeps its settings", "error", LOG_S, terr, NULL);
    cache_set_max_bytes(srv->cache, n->cache_max_bytes);
    cloudauth_ensure(&srv->aws_auth, &srv->gcp_auth, srv->loop, srv->up, n);
    upstream_set_dns_ttl(srv->up, n->dns_ttl_s);
    if (!srv->log_level_override)
        log_threshold = n->log_level;
    config_free(o);
    free(params);
    free(from);
    free(keep);
    free(app_params);
    free(app_caps);
    return 0;

oom_keys:
    snprintf(err, errlen, "out of memory");
fail_keys:
    redact_free(red);
    for (size_t i = (size_t)borrowed; i < n_old_keys; i++)
        wipe_free(old_keys[i]);
    goto fail;
oom:
    snprintf(err, errlen, "out of memory");
fail:
    free(app_params);
    free(app_caps);
    free(old_keys);
    free(slots);
    free(params);
    free(from);
    free(keep);
    config_free(n);
    return -1;
}

int reload_run(struct server *srv, const char *trigger, config_report_fn *report, void *arg,
               struct reload_summary *sum, char *err, size_t errlen)
{
    struct reload_ctx x = { .srv = srv, .report = report, .arg = arg };
    struct reload_summary tmp;

    if (!sum)
        sum = &tmp;
    if (srv->state != SERVER_RUNNING) {
        snprintf(err, errlen, "the sidecar is shutting down; not reloading");
        return -1;
    }
    sdnotify_reloading(&srv->notify);
    int rc = reload_apply(&x, sum, err, errlen);
    if (rc < 0) {
        srv->stats.reloads_failed++;
        snprintf(srv->reload_error, sizeof(srv->reload_error), "%s", err);
        log_at(LOG_ERROR, "reload failed; the running configuration is unchanged", "trigger", LOG_S,
               trigger, "error", LOG_S, err, NULL);
    } else {
        srv->stats.reloads_ok++;
        srv->reload_error[0] = '\0';
        if (srv->reloaded)
            srv->reloaded(srv->reloaded_ud);
        log_at(LOG_INFO, "configuration reloaded", "trigger", LOG_S, trigger, "config", LOG_S,
               srv->config_path, "sources", LOG_U, (unsigned long long)sum->sources, "added", LOG_U,
               (unsigned long long)sum->added, "removed", LOG_U, (unsigned long long)sum->removed,
               "retired_in_use", LOG_U, (unsigned long long)sum->retired, NULL);
    }
    server_notify_ready(srv);
    return rc;
}

void reload_on_done(struct server *srv, void (*fn)(void *ud), void *ud)
{
    srv->reloaded = fn;
    srv->reloaded_ud = fn ? ud : NULL;
}

void reload_fini(struct server *srv)
{
    for (size_t i = 0; i < srv->n_old_keys; i++)
        wipe_free(srv->old_keys[i]);
    free(srv->old_keys);
    srv->old_keys = NULL;
    srv->n_old_keys = 0;
}
