/*
 * listen.h — listening sockets for the front ends.
 *
 * A Unix socket file is created with the configured mode (bound under a
 * umask that grants nothing more, then chmod), its directory (0750) when
 * missing. An existing path is probed with connect(): a live listener makes
 * the bind fail; a socket nobody listens on is stale and replaced; anything
 * that is not a socket is left alone and refused.
 */
#ifndef POLYGW_LISTEN_H
#define POLYGW_LISTEN_H

#include <stddef.h>
#include <stdint.h>

/* Creates the Unix socket `path` with permission bits `mode` and listens on
 * it. Returns the non-blocking fd, or -1 with err. */
int net_bind_unix(const char *path, uint32_t mode, char *err, size_t errlen);

#endif /* POLYGW_LISTEN_H */
