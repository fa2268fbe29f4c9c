/* access.c — one JSON line per finished call (see access.h). */
#include "access.h"

#include <math.h>

#include "core/log.h"

/* The fields every line has, in order. */
#define ACCESS_FIELDS(e, app, peer)                                                                \
    "conn", LOG_N, (e)->conn ? (long long)(e)->conn : -1LL, "msgid", LOG_U,                        \
        (unsigned long long)(e)->msgid, "app", LOG_S, (app), "capability", LOG_S, (e)->capability, \
        "scope", LOG_S, (e)->scope, "model", LOG_S, (e)->model, "source", LOG_S, (e)->source,      \
        "task", LOG_S, (e)->task, "peer_pid", LOG_N, (peer) ? (e)->peer_pid : -1LL, "peer_uid",    \
        LOG_N, (peer) ? (e)->peer_uid : -1LL, "code", LOG_S,                                       \
        (e)->answered ? pgw_code_name((e)->code) : "client_gone", "stream", LOG_B,                 \
        (int)(e)->stream, "attempts", LOG_U, (unsigned long long)(e)->attempts, "status", LOG_N,   \
        (long long)((e)->status > 0 ? (e)->status : -1), "elapsed_s", LOG_F, (e)->elapsed_s,       \
        "stalled_s", LOG_F, (e)->stalled_s, "ttft_s", LOG_F, (e)->ttft_s, "tokens", LOG_F,         \
        (e)->tokens

/* `cost` and `cache` are the last pairs, each left out when unknown (a
 * NULL key ends the list there): an unpriced call has no cost, not a null
 * one, and a call of an uncached capability no cache verdict. */
void access_log_write(const struct config *cfg, const struct access_entry *e)
{
    bool peer = e->peer_pid > 0;
    const char *app = e->app ? e->app : CONFIG_DEFAULT_APP;

    if (!cfg->access_log || LOG_INFO < log_threshold)
        return;
    if (cost_is_known(e->cost))
        log_event(LOG_INFO, "call", ACCESS_FIELDS(e, app, peer), "cost", LOG_F, e->cost,
                  e->cache ? "cache" : NULL, LOG_S, e->cache, NULL);
    else
        log_event(LOG_INFO, "call", ACCESS_FIELDS(e, app, peer), e->cache ? "cache" : NULL, LOG_S,
                  e->cache, NULL);
}
