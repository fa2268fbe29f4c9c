/*
 * daemon.h — the process owner (daemon.c): builds the shared state
 * (core/server.h) and every part, starts them, and owns signals, readiness,
 * reload and the shutdown order. Only main.c and the tests call it.
 */
#ifndef POLYGW_DAEMON_H
#define POLYGW_DAEMON_H

#include <ev.h>

#include "core/server.h"

struct backend_hooks;
int server_init(struct server *srv, struct ev_loop *loop, struct config *cfg, char *err,
                size_t errlen);
/* Builds the state backend of `srv` once srv->tasks exists, with `hooks`
 * (copied; the backend reports its events through them). Returns the
 * backend, or NULL with `err`. */
typedef struct backend *server_backend_fn(struct server *srv, const struct backend_hooks *hooks,
                                          char *err, size_t errlen);
/* server_init with the backend `make_backend` builds instead of the one
 * cfg->backend names (the unit tests' fake backend). */
int server_init_with(struct server *srv, struct ev_loop *loop, struct config *cfg,
                     server_backend_fn *make_backend, char *err, size_t errlen);
void server_start(struct server *srv);
void server_fini(struct server *srv);
void server_begin_shutdown(struct server *srv, const char *why);


#endif /* POLYGW_DAEMON_H */
