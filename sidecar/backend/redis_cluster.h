/*
 * redis_cluster.h — Redis Cluster on top of the single-endpoint adapter
 * (redis.h): the key -> slot rule, the slot map, one struct rds per primary
 * and the routing of each command to the primary of its first key's slot.
 *
 *  - Slots: CRC16 (XMODEM: polynomial 0x1021, initial value 0, as the Redis
 *    Cluster specification defines it) of the key, or of its hash tag (the
 *    bytes between the first '{' and the first '}' after it, when there are
 *    any), modulo 16384.
 *  - The slot map is asked from the seeds (CLUSTER SHARDS; CLUSTER SLOTS
 *    from nodes older than Redis 7, which lack it) once one of them
 *    is connected, then again every RCL_REFRESH_EVERY_S (every second
 *    while the cluster is not usable), after a MOVED
 *    reply (at most one refresh in flight; redirection storms coalesce
 *    into it) and when a primary's connection is lost.
 *  - MOVED: the slot is re-pointed at once and the command is sent again,
 *    once, to the node named. ASK: ASKING then the command to the node
 *    named, once, the map unchanged. Every command is answered within
 *    command_timeout_s, redirections included (one timer per command, over
 *    its every hop).
 *  - NOSCRIPT: each node's adapter loads the scripts on its own connect and
 *    falls back to EVAL (redis.h), so each node's script cache is its own.
 *  - Fail closed: rcl_up() is false while the map is unknown, a slot has
 *    no primary, or a primary is not connected; rcl_eval() / rcl_command()
 *    then return -1 (the callers fail the call as with a Redis that is
 *    down). CLUSTERDOWN and TRYAGAIN replies reach the callback as errors.
 *  - Pub/sub: PUBLISH is broadcast to every node of a cluster, so one
 *    subscriber (on one primary) hears every channel; when it is lost or
 *    cannot subscribe within 2 x max(1 s, 2 x command_timeout_s) it moves
 *    to the next primary.
 *  - A seed that answers as a node without cluster support is a
 *    configuration error: rcl_mode_error() says so.
 *
 * Callback contract: as redis.h (rds_eval): 0 and `cb` later exactly once,
 * or -1 at once and `cb` never. Callbacks never run inside the call.
 * Passwords are never logged nor shown.
 */
#ifndef POLYGW_REDIS_CLUSTER_H
#define POLYGW_REDIS_CLUSTER_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codec/figures.h"
#include "redis.h"

#define RCL_SLOTS           16384u
/* The slot map is asked again this often while nothing else asks it. */
#define RCL_REFRESH_EVERY_S 10.0

/* CRC16/XMODEM of buf[0 .. len). CRC16("123456789") = 0x31C3. */
uint16_t rcl_crc16(const char *buf, size_t len);

/* The cluster slot (0 .. 16383) of key[0 .. len), hash tags honoured. */
unsigned rcl_keyslot(const char *key, size_t len);

struct rcl;

/* `node` is what each node's adapter gets (redis.h): credentials, TLS,
 * timeouts, reconnect delays and the channels (subscribed on one primary);
 * its url, sentinels and db are not used. The hooks are struct rds_hooks
 * for the cluster as a whole, called with r NULL: on_up when it becomes
 * usable (map complete, every primary connected), on_down when it stops
 * being so, the others for the one subscriber. */
struct rcl_opts {
    const char *const *seeds; /* "host:port" each (rds_parse_hostport), at least one */
    size_t n_seeds;
    struct rds_opts node;
};

/* Starts connecting to the seeds (in the background) and returns the
 * client, or NULL with a reason (a bad seed, out of memory). Options and
 * hooks are copied. */
struct rcl *rcl_new(struct ev_loop *loop, const struct rcl_opts *opts,
                    const struct rds_hooks *hooks, char *err, size_t errlen);

/* Fails every pending command with "closed" and frees everything. NULL ok.
 * Not from inside one of the client's own callbacks. */
void rcl_free(struct rcl *cl);

bool rcl_up(const struct rcl *cl);
bool rcl_subscribed(const struct rcl *cl);

/* Why rcl_up() is false, short and without secrets ("" when up). */
const char *rcl_down_why(const struct rcl *cl);

/* Non-NULL once a seed answered that it has no cluster support: the
 * configuration is wrong (use backend.url). */
const char *rcl_mode_error(const struct rcl *cl);

/* rds_eval() routed by the slot of argv[0] (every key must share it:
 * otherwise -1, counted as cross_slot). nkeys 0: any primary. */
int rcl_eval(struct rcl *cl, enum rds_script s, int nkeys, int argc, const char **argv,
             const size_t *argvlen, rds_cb *cb, void *ud);

/* rds_command() routed by the slot of argv[key] (key < 1: any primary). */
int rcl_command(struct rcl *cl, int key, int argc, const char **argv, const size_t *argvlen,
                rds_cb *cb, void *ud);

/* The primaries of the current map (0 while it is unknown), and a command
 * sent to the nth of them (0 .. rcl_primaries() - 1) as it is, for the
 * commands that address a node rather than a key (SCAN). Same contract as
 * rcl_command(); -1 while the cluster is not usable. The numbering holds
 * until the next map. */
size_t rcl_primaries(const struct rcl *cl);
int rcl_command_on(struct rcl *cl, size_t nth, int argc, const char **argv, const size_t *argvlen,
                   rds_cb *cb, void *ud);

/* rds_flush() of every node. NULL ok. */
void rcl_flush(struct rcl *cl);

/* Redis' clock minus the loop's, from the first connected primary; NAN
 * until sampled. */
double rcl_clock_offset(const struct rcl *cl);

/* The primaries' counters summed (commands, replies, pending, ...):
 * recomputed by each call, borrowed until the next. */
const struct rds_stats *rcl_get_stats(struct rcl *cl);

const char *rcl_last_error(const struct rcl *cl);

/* The `backend` map of `stats` in cluster mode: kind, mode ("cluster"),
 * state, subscribed, map_age_s (-1: never known), slots_covered, nodes
 * (address, primary, up, slots each), the summed counters, moved, ask,
 * cross_slot, map_refreshes, last_error. */
extern const struct fig_table rcl_figures;

#endif /* POLYGW_REDIS_CLUSTER_H */
