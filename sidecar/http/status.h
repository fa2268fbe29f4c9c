/*
 * status.h — answers of the HTTP front end made from the sidecar's state.
 * The status page (docs/OPERATIONS.md §5): GET /polygw/ serves one
 * self-contained HTML page (sidecar/http/status.html, compiled in), which polls
 * GET /polygw/v1/stats, the msgpack `stats` result (proto/PROTOCOL.md §4.2)
 * written as JSON. And GET /v1/models, the models the sources set.
 *
 * The page and its stats are served only to Unix-socket and loopback
 * clients unless http.allow_status_remote: they show the sources' state and
 * task ids to whoever reads them, and the HTTP front authenticates no one.
 */
#ifndef POLYGW_STATUS_H
#define POLYGW_STATUS_H

#include <stdbool.h>
#include <stddef.h>

#include "strbuf.h"

struct config;
struct config_app;
struct server;

/* sidecar/http/status.html, bytes (no NUL), from the generated status_html.c. */
extern const unsigned char status_html[];
extern const size_t status_html_len;

/* May the client of the accepted connection `fd` read the status page?
 * True for a Unix-socket or loopback peer, for any peer when `cfg`
 * (borrowed) has http_allow_status_remote; false when the peer is unknown. */
bool status_peer_allowed(const struct config *cfg, int fd);

/* Appends the `stats` result as JSON to `out`, as the `stats` method makes
 * it for app `app` (borrowed: the page's reader, see docs/OPERATIONS.md §5): every
 * source, that app's own figures and running tasks, an admin app's view of
 * every app. Returns 0, or -1 with `why` (out of memory, a value JSON cannot
 * hold); `out` is then left as it was. */
int status_stats_json(struct server *srv, const struct config_app *app, struct strbuf *out,
                      char *why, size_t whylen);

/* Appends GET /v1/models' answer for `cfg` (borrowed: the configuration in
 * force, so a reload shows at once) to `out`: each distinct public model
 * name (models.h: a source's model and its serves entries that are not
 * globs) that app `app` (NULL: any) may ask for, in config order, owned by
 * the first source that serves it, with its capability; sources a reload
 * removed (retired while in use) are not listed. Returns 0, or -1 when out
 * of memory. */
int status_models_json(const struct config *cfg, const struct config_app *app, struct strbuf *out);

#endif /* POLYGW_STATUS_H */
