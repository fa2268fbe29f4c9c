/*
 * redis_resolve.h — a host-name lookup off the event loop, for the Redis
 * adapter: hiredis' connect calls getaddrinfo() itself, synchronously,
 * which would block the loop (for seconds, or for ever with a hanging
 * resolver). redis.c resolves here first and hands hiredis an address.
 *
 * Each lookup runs getaddrinfo() on a detached thread with every signal
 * blocked (signals stay with the loop) and wakes the loop with an
 * ev_async. At most RDS_RESOLVE_MAX lookup threads exist in the process,
 * abandoned ones included: with a resolver that hangs, each retry would
 * otherwise leave one more thread blocked in getaddrinfo().
 */
#ifndef POLYGW_REDIS_RESOLVE_H
#define POLYGW_REDIS_RESOLVE_H

#include <ev.h>

#define RDS_RESOLVE_MAX 8

struct rds_resolve;

/* `rc` is getaddrinfo()'s (0: `addr` is the textual IPv4 address, or the
 * IPv6 one when the host has no IPv4 address; gai_strerror() explains
 * any other). `addr` is borrowed for the call. */
typedef void rds_resolve_fn(int rc, const char *addr, void *ud);

/* Starts looking `host` up (copied). On 0, *out is the lookup and `cb`
 * runs later on the loop exactly once, unless rds_resolve_abandon() comes
 * first. When `cb` runs the lookup is already over: forget *out, never
 * abandon it. Returns -1 (out of memory or threads) or -2
 * (RDS_RESOLVE_MAX lookups alive) and never calls `cb`. */
int rds_resolve_start(struct ev_loop *loop, const char *host, rds_resolve_fn *cb, void *ud,
                      struct rds_resolve **out);

/* The caller no longer wants the answer: `cb` will not run. The thread
 * may still be in getaddrinfo(); it frees the lookup when it returns. */
void rds_resolve_abandon(struct rds_resolve *res);

#endif /* POLYGW_REDIS_RESOLVE_H */
