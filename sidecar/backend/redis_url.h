/*
 * redis_url.h — the Redis URL syntax, parsed without connecting: the
 * loader validates `backend.url` and `backend.sentinels` with it at load
 * time (through rds_config_syntax, which the process owner hands to
 * config.c: core/ does not know Redis) and redis.c connects to what it
 * returns. No dependency on hiredis, libev or the log module.
 *
 * The URL may hold a password: it is never put in an error text.
 */
#ifndef POLYGW_REDIS_URL_H
#define POLYGW_REDIS_URL_H

#include <stdbool.h>
#include <stddef.h>

#include "core/config.h"

/* Where to connect, parsed from a URL:
 *   redis://[[user]:password@]host[:port][/db]     (host may be [v6addr])
 *   rediss://...                                   (the same, over TLS)
 *   unix:///path/to/socket[?db=N][&password=P]
 * Port defaults to 6379, db to 0. A user other than "default" is sent as
 * AUTH user password (an ACL user). */
struct rds_addr {
    char host[256]; /* host name or address; empty for unix */
    int port;
    char path[108];     /* unix socket path; empty for tcp */
    char user[128];     /* empty = the default user */
    char password[256]; /* empty = no AUTH */
    int db;
    bool tls; /* rediss:// */
};

/* "host:port" or "[v6]:port" (a sentinel's address; no default port). */
int rds_parse_hostport(const char *s, char *host, size_t hostcap, int *port, char *err,
                       size_t errlen);

/* Returns 0, or -1 with a reason in `err` that never contains the password. */
/* Fills `out` (borrowed) and returns 0, or zeroes it and returns -1 with a
 * reason in `err` (NULL or errlen 0: no reason) that never contains the
 * password. */
int rds_parse_url(const char *url, struct rds_addr *out, char *err, size_t errlen);

/* The loader's view of the above (config.h): a URL or "host:port" checked
 * as rds_parse_url / rds_parse_hostport would take it, whether a URL
 * holds a password, and the longest password (rds_addr.password). */
extern const struct config_backend_syntax rds_config_syntax;

#endif /* POLYGW_REDIS_URL_H */
