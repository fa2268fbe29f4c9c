/*
 * stats.c — the `stats` result (stats.h), written once for both fronts.
 */
#include "stats.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "call/tasks.h"
#include "codec/transcode.h"
#include "progress.h"
#include "strbuf.h"
#include "upstream/upstream.h"

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

/* The caller's identity as `hello` and `stats` show it. */
void stats_write_identity(struct writer *w, const struct stats_caller *who)
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

void stats_write(struct writer *w, struct server *srv, const struct stats_caller *who)
{
    const struct server_stats *st = &srv->stats;
    const struct http_stats *hst = srv->http_stats;
    writer_map(w, 14 + srv->backend->ops->stats_keys + (hst ? 1 : 0)); /* caller, apps, reload */

    writer_str(w, "version");
    writer_str(w, PGW_VERSION);
    writer_str(w, "uptime_s");
    writer_double(w, server_uptime_s(srv));

    writer_str(w, "caller");
    stats_write_identity(w, who);
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
