/*
 * redis.h — the Redis adapter: hiredis's async API on the sidecar's libev
 * loop, with what hiredis 0.14 leaves to its user.
 *
 *  - Two connections: one for commands (scripts), one subscribed to the
 *    configured pub/sub channels. Each connects in the background; nothing
 *    blocks the loop (host names are resolved off the loop, the TCP/unix
 *    connect is non-blocking, AUTH and SELECT are pipelined behind it).
 *  - Every round trip is bounded by `command_timeout_s` (hiredis 0.14 has no
 *    async timeouts: each command carries its own timer). A command that
 *    times out fails at once; its connection is then considered sick and is
 *    dropped and re-made, because hiredis cannot skip an unanswered reply.
 *  - The subscriber is checked every max(1 s, 2 x command_timeout_s) (a
 *    repeated SUBSCRIBE: hiredis 0.14 cannot route a PING's answer on a
 *    subscribed connection) and dropped when the answer is late, so a
 *    silently dead link (NAT or load-balancer idle timeout, partition,
 *    frozen server) is noticed within 3 x command_timeout_s.
 *  - Reconnection with exponential backoff (reconnect_min_s doubling up to
 *    reconnect_max_s) and jitter in [0.5, 1.0] of each delay.
 *  - The Lua scripts of sidecar/backend/lua/ are compiled into the binary, loaded
 *    with SCRIPT LOAD on every (re)connect, called with EVALSHA; a NOSCRIPT
 *    reply (the server lost its script cache: restart, SCRIPT FLUSH,
 *    fail-over) is retried once with EVAL, inside the same timeout.
 *
 * Callback contract: rds_eval() returns 0 and later calls `cb` exactly once
 * (with the reply, or with NULL and a reason: "timeout", "not connected",
 * "connection lost", the Redis error text, "closed" from rds_free), or
 * returns -1 at once and never calls `cb` (not connected, out of memory).
 * Callbacks never run inside rds_eval().
 *
 * Sentinel (opts.sentinels): a third connection asks the sentinels in turn
 * (SENTINEL get-master-addr-by-name), and stays subscribed to
 * +switch-master on the one that answered. The command and subscriber
 * connections go to the primary it names and check it with ROLE; when it
 * moves (+switch-master, a ROLE that is not master, a lost primary) they
 * are dropped and re-made at the new address. Until a primary is known
 * they stay down (rds_up() is false: callers fail closed).
 *
 * TLS (rediss://, or opts.tls with sentinels): see redis_tls.h.
 *
 * The URL may hold a password: it is never logged, returned or shown in
 * stats (only host:port or the socket path is); nor are opts.password and
 * opts.sentinel_password.
 */
#ifndef POLYGW_REDIS_H
#define POLYGW_REDIS_H

#include <ev.h>
#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codec/figures.h"
#include "prom.h"
#include "redis_url.h"
#include "redis_tls.h"

struct rds;

enum rds_script {
    RDS_ADMIT,
    RDS_RELEASE,
    RDS_RENEW,
    RDS_PROGRESS,
    RDS_TASK,
    RDS_BUDGET,
    RDS_N_SCRIPTS
};

struct rds_opts {
    const char *url;              /* one endpoint; or NULL with sentinels */
    const char *const *sentinels; /* "host:port" each (see rds_parse_hostport) */
    size_t n_sentinels;
    const char *master_name; /* required with sentinels */
    int db;                  /* with sentinels (the URL carries it otherwise) */
    /* ACL credentials, replacing the URL's when `password` is non-NULL.
     * `username` NULL or "" = the default user. The sentinel ones are sent
     * to the sentinels only (they have users of their own). */
    const char *username, *password;
    const char *sentinel_username, *sentinel_password;
    /* TLS settings; NULL = none. Required (may be all defaults) for TLS to
     * the sentinels; a rediss:// URL uses them, or the defaults. */
    const struct rtls_opts *tls;
    double command_timeout_s;    /* bounds each round trip and each connect */
    double reconnect_min_s;      /* first reconnect delay (before jitter) */
    double reconnect_max_s;      /* cap of the doubling */
    const char *const *channels; /* subscribed on the second connection */
    size_t n_channels;
    /* A node of a Redis Cluster (redis_cluster.h): skips the check that a
     * plain URL does not point at one (INFO cluster, cluster_enabled:1). */
    bool cluster_node;
};

struct rds_hooks {
    /* The command connection is ready (AUTH, SELECT, scripts loaded) / lost.
     * `why` is a short reason without secrets. */
    void (*on_up)(struct rds *r, void *ud);
    void (*on_down)(struct rds *r, const char *why, void *ud);
    /* The subscriber is subscribed to every channel / lost its subscription
     * (messages published meanwhile are lost: re-check what they carry). */
    void (*on_subscribed)(struct rds *r, void *ud);
    void (*on_unsubscribed)(struct rds *r, void *ud);
    /* A message on channel opts.channels[channel]. `msg` is not NUL-terminated. */
    void (*on_message)(struct rds *r, size_t channel, const char *msg, size_t len, void *ud);
    void *ud;
};

typedef void rds_cb(const redisReply *reply, const char *err, void *ud);

/* Starts connecting (in the background) and returns the adapter, or NULL
 * with a reason (bad URL, out of memory). Options and hooks are copied;
 * the URL and channel names too. */
struct rds *rds_new(struct ev_loop *loop, const struct rds_opts *opts,
                    const struct rds_hooks *hooks, char *err, size_t errlen);

/* Fails every pending command with "closed" and frees everything. NULL ok. */
void rds_free(struct rds *r);

/* Is the command connection ready? */
bool rds_up(const struct rds *r);
bool rds_subscribed(const struct rds *r);

/* EVALSHA script `s` with `nkeys` keys followed by the other arguments:
 * argv[0 .. nkeys-1] are the KEYS, argv[nkeys .. argc-1] the ARGV
 * (argvlen[i] bytes each; argvlen NULL = NUL-terminated strings). */
int rds_eval(struct rds *r, enum rds_script s, int nkeys, int argc, const char **argv,
             const size_t *argvlen, rds_cb *cb, void *ud);

/* Writes the commands queued so far now rather than before the loop polls:
 * for a caller that queues them from an ev_prepare of its own. NULL ok. */
void rds_flush(struct rds *r);

/* Any other command (e.g. PUBLISH, TIME), same contract. SUBSCRIBE,
 * PSUBSCRIBE, (P)UNSUBSCRIBE and MONITOR are refused (-1): they would change
 * the command connection's mode under hiredis. */
int rds_command(struct rds *r, int argc, const char **argv, const size_t *argvlen, rds_cb *cb,
                void *ud);

/* Redis' clock minus the loop's (ev_now), in seconds, sampled with TIME at
 * each connect and every 60 s while up (half the round trip subtracted);
 * add it to an ev_now() value to get Redis time. NAN until first sampled. */
double rds_clock_offset(const struct rds *r);


struct rds_stats {
    uint64_t connects, disconnects, connect_failures;
    uint64_t primary_changes; /* sentinel: a new primary address was learnt */
    uint64_t commands, replies, errors, timeouts, noscript_reloads, rejected_not_connected;
    uint64_t messages;
    uint64_t lost;               /* commands failed because their connection was lost */
    uint64_t pending;            /* commands sent and not yet answered */
    double rtt_sum_s, rtt_max_s; /* over `replies` */
    struct prom_hist rtt;        /* of `replies` */
};
const struct rds_stats *rds_get_stats(const struct rds *r);

/* Non-NULL once the URL's server answered that it is a Redis Cluster node
 * (INFO cluster: cluster_enabled:1): counting on one node of a cluster
 * would be per instance, so the command connection stays down, and this
 * says to configure backend.cluster instead. */
const char *rds_mode_error(const struct rds *r);

/* Why the last connection or attempt failed ("" if none yet): short, never
 * a password (see rds_reason in redis.c). Borrowed until the next failure. */
const char *rds_last_error(const struct rds *r);

/* The `backend` map of `stats` and the polygw_redis_* families
 * (codec/figures.h, of a struct rds): kind, mode (single / sentinel;
 * redis_cluster.h's map says cluster), state (up / connecting /
 * down), subscribed, address (host:port or path; never the password),
 * tls, the counters, rtt_avg_ms / rtt_max_ms, last_error,
 * next_retry_in_s; with sentinels also sentinel (the one asked last),
 * sentinel_state, master_name and primary_changes. */
extern const struct fig_table rds_figures;

#endif /* POLYGW_REDIS_H */
