/*
 * peer.h — who is calling (docs/APPS.md): the credentials the kernel
 * recorded for a Unix socket's peer, the app they resolve to, and the rule
 * for declaring another app. Shared by both front ends, so a uid is the
 * same app over msgpack-RPC and over HTTP.
 */
#ifndef POLYGW_PEER_H
#define POLYGW_PEER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/config.h"

/* A peer's credentials, read once at accept (SO_PEERCRED): the client
 * cannot forge them. */
struct peer {
    bool known; /* false: not a Unix socket, or the kernel gave none */
    uint32_t uid, gid, pid;
};

/* Fills *p from connected socket `fd` (-1 or a TCP socket: unknown). */
void peer_read(int fd, struct peer *p);

/* Its pid and uid as the access log takes them: -1 when unknown. */
void peer_ids(const struct peer *p, long long *pid, long long *uid);

/* The app of peer `p` in `cfg` (both borrowed): the entry listing its uid,
 * else its gid, else `default`. Never NULL. */
const struct config_app *peer_app(const struct config *cfg, const struct peer *p);

/* May a caller that is app `own` (a name, borrowed) act as the app named
 * by the `len` bytes at `name` (borrowed, client input)? Its own app
 * always; another configured app only when `own` allows declared names,
 * and never an admin app unless `own` is admin. A name that is not 1 to
 * CONFIG_NAME_MAX - 1 bytes of UTF-8 is refused first (rpc_check_ident),
 * on both fronts. Returns the app, or NULL with the reason (the name
 * quoted, bounded) in `why`. */
const struct config_app *peer_declare_app(const struct config *cfg, const char *own,
                                          const char *name, size_t len, char *why, size_t whylen);

#endif /* POLYGW_PEER_H */
