/*
 * stats.h — the `stats` result (proto/PROTOCOL.md), written through the
 * reply writer (codec/writer.h) so the msgpack method and the HTTP status
 * page render the same figures without converting one into the other.
 * The counters /metrics shows too come from the same tables
 * (metrics/figures.h, the backend's `figures`); every map's size is
 * counted from its table.
 */
#ifndef POLYGW_STATS_H
#define POLYGW_STATS_H

#include "codec/writer.h"
#include "core/server.h"
#include "net/peer.h"

/* Who asks for `stats`: its app (borrowed from the config), the app its
 * credentials resolve to, and its peer (NULL: unknown). */
struct stats_caller {
    const struct config_app *app;
    const char *peer_app;
    const struct peer *peer;
};

/* Writes the `stats` result as `who` sees it. Counts this request as
 * served: the caller answers it at once. */
void stats_write(struct writer *w, struct server *srv, const struct stats_caller *who);

/* The caller's identity as `hello` and `stats` show it. */
void stats_write_identity(struct writer *w, const struct stats_caller *who);

#endif /* POLYGW_STATS_H */
