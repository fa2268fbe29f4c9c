/*
 * cacheops.c — operator actions on the response cache (cacheops.h).
 */
#include "cacheops.h"

#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cache.h"
#include "core/log.h"
#include "dlist.h"

#include <stdlib.h>

/* A purge of the shared tier in progress, for request `msgid` of `out`
 * (NULL: its connection is gone; the walk still runs to its end). */
struct cacheops_wait {
    struct server *srv;
    struct reply_outlet *out;
    struct cacheops_wait *prev, *next; /* out->purges */
    uint32_t msgid;
    size_t purged; /* from the memory tier, before the walk */
    char caller[CONFIG_NAME_MAX], capability[CONFIG_NAME_MAX], app[CONFIG_NAME_MAX];
};

static void wait_unlink(struct cacheops_wait *w)
{
    struct reply_outlet *o = w->out;

    if (!o)
        return;
    DLIST_UNLINK(o->purges, w, prev, next);
    w->out = NULL;
    o->srv->stats.in_flight--;
    if (o->ops->waiting)
        o->ops->waiting(o, -1);
}

void cacheops_fail_pending(struct reply_outlet *o, enum pgw_code code, const char *message)
{
    while (o->purges) {
        struct cacheops_wait *w = o->purges;
        wait_unlink(w);
        if (code != PGW_OK) {
            const struct reply_error e = REPLY_ERROR(code, message);
            o->ops->error(o, w->msgid, &e);
        }
        server_on_request_done(o->srv);
    }
}

bool cacheops_is_pending(const struct reply_outlet *o, uint32_t msgid)
{
    for (const struct cacheops_wait *w = o->purges; w; w = w->next)
        if (w->msgid == msgid)
            return true;
    return false;
}

static const char *or_any(const char *s)
{
    return s[0] ? s : "*";
}

/* The shared tier's walk ended. The memory tier is purged again: a
 * lookup during the walk may have copied an entry the walk then dropped.
 * A client gone meanwhile gets no answer; the purge is logged all the
 * same (the server outlives its backend: a walk still running at exit
 * ends, "closed", inside backend_free). */
static void on_shared_purged(void *ud, int rc, size_t removed, const char *why)
{
    struct cacheops_wait *w = ud;
    struct reply_outlet *o = w->out;
    struct server *srv = w->srv;
    const char *cap = w->capability[0] ? w->capability : NULL, *app = w->app[0] ? w->app : NULL;
    const char *failed = rc == 0 ? "" : why ? why : "?";
    char msg[300];

    if (srv->cache)
        w->purged += cache_purge_match(srv->cache, cap, app);
    wait_unlink(w);
    log_at(rc == 0 ? LOG_INFO : LOG_WARN, "cache purged", "app", LOG_S, w->caller, "capability",
           LOG_S, or_any(w->capability), "of_app", LOG_S, or_any(w->app), "entries", LOG_U,
           (unsigned long long)w->purged, "shared_entries", LOG_U, (unsigned long long)removed,
           "shared_error", LOG_S, failed, NULL);
    if (!o) {
        free(w);
        return;
    }
    if (rc == 0) {
        struct writer *wr = o->ops->result_begin(o, w->msgid);
        writer_map(wr, 2);
        writer_kv_u64(wr, "purged", w->purged);
        writer_kv_u64(wr, "purged_shared", removed);
        o->ops->result_end(o, w->msgid);
    } else {
        snprintf(msg, sizeof(msg),
                 "cache purge: %zu entries dropped from this sidecar's memory and %zu from the "
                 "shared tier, then the shared tier failed (%.100s): purge again",
                 w->purged, removed, failed);
        const struct reply_error e = REPLY_ERROR(PGW_BACKEND_UNAVAILABLE, msg);
        o->ops->error(o, w->msgid, &e);
    }
    if (o->ops->flush)
        o->ops->flush(o);
    server_on_request_done(srv);
    free(w);
}

void cacheops_on_fleet_purge(struct server *srv, const char *capability, const char *app,
                             bool missed)
{
    size_t n = srv->cache ? cache_purge_match(srv->cache, capability, app) : 0;
    if (missed) {
        if (n) /* none at start-up: the first subscription is a "gap" too */
            log_at(LOG_INFO, "cache dropped: fleet purges may have been missed", "entries", LOG_U,
                   (unsigned long long)n, NULL);
        return;
    }
    log_at(LOG_INFO, "cache purged by the fleet", "capability", LOG_S,
           capability ? capability : "*", "of_app", LOG_S, app ? app : "*", "entries", LOG_U,
           (unsigned long long)n, NULL);
}

int cacheops_purge(struct server *srv, const struct config_app *caller, const char *capability,
                   const char *app, struct reply_outlet *out, uint32_t msgid, size_t *purged,
                   enum pgw_code *code, char *err, size_t errlen)
{
    const struct config *cfg = srv->cfg;

    *purged = 0;
    /* An operator's action: a purge by one app would let it empty another
     * app's entries and, timed against a hit, learn what that app asks. */
    if (!caller || !caller->admin) {
        *code = PGW_BAD_REQUEST;
        snprintf(err, errlen, "cache purge: app '%s' is not an admin app (docs/APPS.md)",
                 caller ? caller->name : "?");
        return -1;
    }
    if (capability && config_find_capability(cfg, capability, strlen(capability)) < 0) {
        *code = PGW_UNKNOWN_CAPABILITY;
        snprintf(err, errlen, "cache purge: no capability '%.64s'", capability);
        return -2;
    }
    if (app && !config_find_app(cfg, app)) {
        *code = PGW_BAD_REQUEST;
        snprintf(err, errlen, "cache purge: no app '%.64s'", app);
        return -2;
    }
    if (srv->cache)
        *purged = cache_purge_match(srv->cache, capability, app);
    if (backend_has_cache(srv->backend)) {
        struct cacheops_wait *w = calloc(1, sizeof(*w));
        if (!w) {
            *code = PGW_INTERNAL;
            snprintf(err, errlen, "cache purge: out of memory");
            return -2;
        }
        w->srv = srv;
        w->msgid = msgid;
        w->purged = *purged;
        snprintf(w->caller, sizeof(w->caller), "%s", caller->name);
        snprintf(w->capability, sizeof(w->capability), "%s", capability ? capability : "");
        snprintf(w->app, sizeof(w->app), "%s", app ? app : "");
        if (backend_cache_purge(srv->backend, capability, app, on_shared_purged, w) < 0) {
            free(w);
            log_at(LOG_WARN, "cache purged", "app", LOG_S, caller->name, "capability", LOG_S,
                   capability ? capability : "*", "of_app", LOG_S, app ? app : "*", "entries",
                   LOG_U, (unsigned long long)*purged, "shared_error", LOG_S, "not connected",
                   NULL);
            *code = PGW_BACKEND_UNAVAILABLE;
            snprintf(err, errlen,
                     "cache purge: %zu entries dropped from this sidecar's memory; the shared "
                     "tier is not reachable, nothing was dropped there: purge again",
                     *purged);
            return -3;
        }
        w->out = out;
        DLIST_PUSH(out->purges, w, prev, next);
        srv->stats.in_flight++;
        if (out->ops->waiting)
            out->ops->waiting(out, 1);
        return 1;
    }
    log_at(LOG_INFO, "cache purged", "app", LOG_S, caller->name, "capability", LOG_S,
           capability ? capability : "*", "of_app", LOG_S, app ? app : "*", "entries", LOG_U,
           (unsigned long long)*purged, NULL);
    return 0;
}
