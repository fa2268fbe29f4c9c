/*
 * redis_cluster.c — Redis Cluster over redis.c's single-endpoint adapter:
 * slots, the slot map, routing and redirections. redis_cluster.h holds the
 * contract.
 *
 * Nodes. Every address the client learns (a seed, a primary or a replica
 * of the map, a MOVED / ASK target) is a struct node, kept until rcl_free
 * so that slot_node[] can hold indexes. A node has an adapter (struct rds,
 * its own command connection, scripts loaded there) while it is a seed or
 * a primary of the current map; a node that stops being either loses it
 * in gc_w (a timer: never inside the adapter's own callbacks).
 *
 * Map. slot_node[s] is the index of slot s's primary, or -1. A refresh
 * (CLUSTER SHARDS, or SLOTS) goes to a connected primary, else a connected seed; one
 * at a time. Its answer replaces the whole table; a MOVED reply re-points
 * one slot at once, before the refresh that it schedules confirms it.
 *
 * A request (struct req) is one caller's command: its arguments copied (a
 * redirection sends them again), its own timer of command_timeout_s over
 * every hop, and `inner`, the hops the adapters still hold. The caller's
 * side ends once (`done`: answered, redirected to a node that is not
 * connected, timed out, closed); the record is freed when both sides are
 * over (done && inner == 0).
 */
#include "redis_cluster.h"
#include "dlist.h"
#include "iplit.h"
#include "strbuf.h"
#include "redis_url.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/log.h"

#define RCL_MAX_NODES            128
#define RCL_ERR_MAX              160
/* The subscriber's check period: as redis.c's subscriber ping. */
#define RCL_SUB_EVERY(timeout_s) fmax(1.0, 2.0 * (timeout_s))
/* A refresh asked for by a MOVED or a lost primary waits this long, so a
 * storm of redirections makes one refresh. */
#define RCL_REFRESH_SOON_S       0.05
#define RCL_REFRESH_DOWN_S       1.0

/* --- slots ------------------------------------------------------------ */

uint16_t rcl_crc16(const char *buf, size_t len)
{
    uint16_t crc = 0;

    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((uint16_t)(unsigned char)buf[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

unsigned rcl_keyslot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);

    if (open) {
        size_t from = (size_t)(open - key) + 1;
        const char *close = memchr(key + from, '}', len - from);
        if (close && close > key + from) /* a non-empty tag */
            return rcl_crc16(key + from, (size_t)(close - key) - from) & (RCL_SLOTS - 1);
    }
    return rcl_crc16(key, len) & (RCL_SLOTS - 1);
}

/* --- state ------------------------------------------------------------ */

struct node {
    struct rcl *cl;
    char host[256];
    int port;
    char where[300];
    struct rds *rds; /* NULL unless a seed or a primary of the map */
    bool seed, primary;
    unsigned slots; /* of the current map */
};

struct req {
    struct req *prev, *next; /* cl->live */
    struct rcl *cl;
    int script; /* enum rds_script, or -1: a plain command */
    int nkeys, argc;
    const char **argv;
    size_t *lens;
    rds_cb *cb;
    void *ud;
    ev_timer timer_w;
    unsigned inner; /* hops the adapters hold */
    bool done, redirected;
};

struct rcl_counters {
    uint64_t moved, ask, cross_slot, refreshes, refresh_failures, not_routed;
};

struct rcl {
    struct ev_loop *loop;
    struct node *node[RCL_MAX_NODES];
    size_t n_nodes;
    int16_t slot_node[RCL_SLOTS];
    bool map_known;
    double map_at; /* ev_now() of the last map */
    unsigned covered;
    bool refreshing, up, closing;
    bool slots_only; /* the nodes have no CLUSTER SHARDS (Redis < 7) */
    ev_timer refresh_w, soon_w, gc_w, sub_w;
    /* Pub/sub: one adapter with the channels, on node sub_node. */
    struct rds *sub;
    int sub_node;
    unsigned sub_misses;
    char **channels;
    /* The nodes' options (rcl_opts.node), its strings copied here. */
    struct rds_opts tmpl;
    char username[128], password[256];
    struct rtls_opts tls;
    char *tls_str[4]; /* tls' strings, owned (a reload frees the configuration's) */
    struct rds_hooks hooks;
    struct req *live;
    struct rcl_counters n;
    struct rds_stats agg;
    char last_error[RCL_ERR_MAX];
    char down_why[RCL_ERR_MAX];
    char mode_error[RCL_ERR_MAX];
};

static void refresh_start(struct rcl *cl);
static void refresh_soon(struct rcl *cl);

static void note_error(struct rcl *cl, const char *why)
{
    snprintf(cl->last_error, sizeof(cl->last_error), "%s", why);
}

/* --- nodes ------------------------------------------------------------ */

static void node_on_up(struct rds *r, void *ud);
static void node_on_down(struct rds *r, const char *why, void *ud);

static int node_find(const struct rcl *cl, const char *host, int port)
{
    for (size_t i = 0; i < cl->n_nodes; i++)
        if (cl->node[i]->port == port && strcmp(cl->node[i]->host, host) == 0)
            return (int)i;
    return -1;
}

/* The node at host:port, made if new; -1 when the table is full. */
static int node_get(struct rcl *cl, const char *host, int port)
{
    int i = node_find(cl, host, port);

    if (i >= 0)
        return i;
    if (cl->n_nodes >= RCL_MAX_NODES || strlen(host) >= sizeof(cl->node[0]->host) || port <= 0 ||
        port > 65535)
        return -1;
    struct node *n = calloc(1, sizeof(*n));
    if (!n)
        return -1;
    n->cl = cl;
    snprintf(n->host, sizeof(n->host), "%s", host);
    n->port = port;
    if (iplit_parse(host, strlen(host), IPLIT_V6, NULL))
        snprintf(n->where, sizeof(n->where), "[%s]:%d", host, port);
    else
        snprintf(n->where, sizeof(n->where), "%s:%d", host, port);
    cl->node[cl->n_nodes] = n;
    return (int)cl->n_nodes++;
}

/* An adapter to node `n`; with `hooks` NULL the node's own, else the
 * subscriber's (with the channels). */
static struct rds *node_adapter(struct rcl *cl, struct node *n, const struct rds_hooks *hooks)
{
    char url[320], err[RCL_ERR_MAX];
    struct rds_opts o = cl->tmpl;
    const struct rds_hooks own = { .on_up = node_on_up, .on_down = node_on_down, .ud = n };

    snprintf(url, sizeof(url), "%s://%s", o.tls ? "rediss" : "redis", n->where);
    o.url = url;
    o.cluster_node = true;
    if (!hooks) {
        o.channels = NULL;
        o.n_channels = 0;
    }
    struct rds *r = rds_new(cl->loop, &o, hooks ? hooks : &own, err, sizeof(err));
    if (!r) {
        log_at(LOG_WARN, "redis cluster node", "address", LOG_S, n->where, "error", LOG_S, err,
               NULL);
        note_error(cl, err);
    }
    return r;
}

static bool node_up(const struct rcl *cl, int i)
{
    return i >= 0 && (size_t)i < cl->n_nodes && cl->node[i]->rds && rds_up(cl->node[i]->rds);
}

/* Usable: map complete, every primary connected. Fires on_up / on_down
 * on a change. */
static void cl_update(struct rcl *cl)
{
    bool up = false;

    if (cl->closing)
        return;
    if (cl->mode_error[0])
        snprintf(cl->down_why, sizeof(cl->down_why), "%s", cl->mode_error);
    else if (!cl->map_known)
        snprintf(cl->down_why, sizeof(cl->down_why), "cluster slot map unknown");
    else if (cl->covered < RCL_SLOTS)
        snprintf(cl->down_why, sizeof(cl->down_why), "%u of %u slots have no primary",
                 RCL_SLOTS - cl->covered, RCL_SLOTS);
    else
        up = true;
    for (size_t i = 0; up && i < cl->n_nodes; i++) {
        if (cl->node[i]->primary && !node_up(cl, (int)i)) {
            snprintf(cl->down_why, sizeof(cl->down_why), "primary %.100s not connected",
                     cl->node[i]->where);
            up = false;
        }
    }
    if (up)
        cl->down_why[0] = '\0';
    if (up == cl->up)
        return;
    cl->up = up;
    /* While unusable the map is read every second: a fail-over or a slot
     * given a primary again is seen soon after the cluster itself sees it. */
    cl->refresh_w.repeat = up ? RCL_REFRESH_EVERY_S : RCL_REFRESH_DOWN_S;
    ev_timer_again(cl->loop, &cl->refresh_w);
    log_at(up ? LOG_INFO : LOG_WARN, up ? "redis cluster usable" : "redis cluster unusable",
           "reason", LOG_S, up ? "" : cl->down_why, NULL);
    if (up && cl->hooks.on_up)
        cl->hooks.on_up(NULL, cl->hooks.ud);
    else if (!up && cl->hooks.on_down)
        cl->hooks.on_down(NULL, cl->down_why, cl->hooks.ud);
}

static void node_on_up(struct rds *r, void *ud)
{
    struct node *n = ud;
    struct rcl *cl = n->cl;

    (void)r;
    if (!cl->map_known || !cl->refreshing)
        refresh_start(cl);
    cl_update(cl);
}

static void node_on_down(struct rds *r, const char *why, void *ud)
{
    struct node *n = ud;
    struct rcl *cl = n->cl;

    (void)r;
    note_error(cl, why);
    if (n->primary)
        refresh_soon(cl);
    cl_update(cl);
}

/* --- the slot map ----------------------------------------------------- */

static bool str_el(const redisReply *e)
{
    return e && (e->type == REDIS_REPLY_STRING || e->type == REDIS_REPLY_STATUS);
}

/* One address of a CLUSTER SLOTS range: [host, port, id, ...]. An empty
 * host (or "?") is the node that answered. */
static int slots_addr(struct rcl *cl, const redisReply *a, const struct node *asked)
{
    if (!a || a->type != REDIS_REPLY_ARRAY || a->elements < 2 || !str_el(a->element[0]) ||
        a->element[1]->type != REDIS_REPLY_INTEGER)
        return -1;
    const char *host = a->element[0]->str;
    if (!host[0] || strcmp(host, "?") == 0)
        host = asked->host;
    return node_get(cl, host, (int)a->element[1]->integer);
}

/* CLUSTER SLOTS: [[from, to, primary, replica...], ...] into map. */
static void parse_slots(struct rcl *cl, const redisReply *reply, const struct node *asked,
                        int16_t *map)
{
    for (size_t i = 0; i < reply->elements; i++) {
        const redisReply *e = reply->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER)
            continue;
        long long from = e->element[0]->integer, to = e->element[1]->integer;
        int p = slots_addr(cl, e->element[2], asked);
        if (p < 0 || from < 0 || to >= (long long)RCL_SLOTS || from > to)
            continue;
        cl->node[p]->primary = true;
        for (long long s = from; s <= to; s++)
            map[s] = (int16_t)p;
        for (size_t k = 3; k < e->elements; k++)
            (void)slots_addr(cl, e->element[k], asked); /* replicas: listed, not connected */
    }
}

/* The value of `key` in a RESP2 map (a flat [key, value, ...] array). */
static const redisReply *kv_get(const redisReply *a, const char *key)
{
    if (!a || a->type != REDIS_REPLY_ARRAY)
        return NULL;
    for (size_t i = 0; i + 1 < a->elements; i += 2)
        if (str_el(a->element[i]) && strcmp(a->element[i]->str, key) == 0)
            return a->element[i + 1];
    return NULL;
}

/* One node of a CLUSTER SHARDS shard: its endpoint (else its ip, else the
 * node asked) and its port (tls-port over TLS when given). */
static int shards_node(struct rcl *cl, const redisReply *n, const struct node *asked)
{
    const redisReply *host = kv_get(n, "endpoint"), *ip = kv_get(n, "ip");
    const redisReply *port = cl->tmpl.tls ? kv_get(n, "tls-port") : NULL;

    if (!port)
        port = kv_get(n, "port");
    if (!str_el(host) || !host->str[0] || strcmp(host->str, "?") == 0)
        host = ip;
    if (!port || port->type != REDIS_REPLY_INTEGER)
        return -1;
    const char *h = str_el(host) && host->str[0] ? host->str : asked->host;
    return node_get(cl, h, (int)port->integer);
}

/* CLUSTER SHARDS (Redis >= 7): [{slots: [from, to, ...], nodes: [{...,
 * role}, ...]}, ...] into map. */
static void parse_shards(struct rcl *cl, const redisReply *reply, const struct node *asked,
                         int16_t *map)
{
    for (size_t i = 0; i < reply->elements; i++) {
        const redisReply *slots = kv_get(reply->element[i], "slots");
        const redisReply *nodes = kv_get(reply->element[i], "nodes");
        int p = -1;
        for (size_t k = 0; nodes && nodes->type == REDIS_REPLY_ARRAY && k < nodes->elements; k++) {
            const redisReply *role = kv_get(nodes->element[k], "role");
            int idx = shards_node(cl, nodes->element[k], asked);
            if (idx >= 0 && str_el(role) && strcmp(role->str, "master") == 0)
                p = idx;
        }
        if (p < 0 || !slots || slots->type != REDIS_REPLY_ARRAY)
            continue;
        for (size_t k = 0; k + 1 < slots->elements; k += 2) {
            const redisReply *a = slots->element[k], *b = slots->element[k + 1];
            if (a->type != REDIS_REPLY_INTEGER || b->type != REDIS_REPLY_INTEGER ||
                a->integer < 0 || b->integer >= (long long)RCL_SLOTS || a->integer > b->integer)
                continue;
            cl->node[p]->primary = true;
            for (long long s = a->integer; s <= b->integer; s++)
                map[s] = (int16_t)p;
        }
    }
}

static void gc_nodes(struct rcl *cl)
{
    if (!ev_is_active(&cl->gc_w)) {
        ev_timer_set(&cl->gc_w, 0., 0.);
        ev_timer_start(cl->loop, &cl->gc_w);
    }
}

static void sub_place(struct rcl *cl);

/* The slot map's answer, CLUSTER SHARDS or SLOTS (ud: the node asked). */
static void on_slots(const redisReply *reply, const char *err, void *ud)
{
    struct node *asked = ud;
    struct rcl *cl = asked->cl;
    int16_t map[RCL_SLOTS];

    cl->refreshing = false;
    if (cl->closing)
        return;
    if (!err && reply && reply->type == REDIS_REPLY_ERROR)
        err = reply->str;
    if (err) {
        cl->n.refresh_failures++;
        if (!cl->slots_only && strcasestr(err, "unknown subcommand")) {
            /* Redis < 7: no CLUSTER SHARDS. Ask CLUSTER SLOTS from now on. */
            cl->n.refresh_failures--;
            cl->slots_only = true;
            refresh_start(cl);
            return;
        }
        if (strstr(err, "cluster support disabled")) {
            snprintf(cl->mode_error, sizeof(cl->mode_error),
                     "%.60s is not a cluster node (cluster support disabled): use backend.url",
                     asked->where);
            log_at(LOG_ERROR, "redis cluster seed is not a cluster node", "address", LOG_S,
                   asked->where, NULL);
        } else {
            char why[RCL_ERR_MAX];
            snprintf(why, sizeof(why), "CLUSTER %s on %.60s: %.70s",
                     cl->slots_only ? "SLOTS" : "SHARDS", asked->where, err);
            note_error(cl, why);
        }
        cl_update(cl);
        return;
    }
    if (!reply || reply->type != REDIS_REPLY_ARRAY) {
        cl->n.refresh_failures++;
        note_error(cl, "the slot map: unexpected reply");
        return;
    }
    for (size_t s = 0; s < RCL_SLOTS; s++)
        map[s] = -1;
    for (size_t i = 0; i < cl->n_nodes; i++)
        cl->node[i]->primary = false;
    if (cl->slots_only)
        parse_slots(cl, reply, asked, map);
    else
        parse_shards(cl, reply, asked, map);
    memcpy(cl->slot_node, map, sizeof(map));
    cl->covered = 0;
    for (size_t i = 0; i < cl->n_nodes; i++)
        cl->node[i]->slots = 0;
    for (size_t s = 0; s < RCL_SLOTS; s++) {
        if (map[s] >= 0) {
            cl->covered++;
            cl->node[map[s]]->slots++;
        }
    }
    cl->map_known = true;
    cl->map_at = ev_now(cl->loop);
    cl->n.refreshes++;
    for (size_t i = 0; i < cl->n_nodes; i++) {
        struct node *n = cl->node[i];
        if (n->primary && !n->rds)
            n->rds = node_adapter(cl, n, NULL);
    }
    gc_nodes(cl);
    if (!cl->sub && cl->tmpl.n_channels)
        sub_place(cl);
    cl_update(cl);
}

/* Asks the map of a connected primary, else of a connected seed. */
static void refresh_start(struct rcl *cl)
{
    const char *argv[] = { "CLUSTER", cl->slots_only ? "SLOTS" : "SHARDS" };
    int pick = -1;

    if (cl->refreshing || cl->closing)
        return;
    for (size_t i = 0; pick < 0 && i < cl->n_nodes; i++)
        if (cl->node[i]->primary && node_up(cl, (int)i))
            pick = (int)i;
    for (size_t i = 0; pick < 0 && i < cl->n_nodes; i++)
        if (cl->node[i]->seed && node_up(cl, (int)i))
            pick = (int)i;
    if (pick < 0)
        return; /* a node's on_up asks */
    if (rds_command(cl->node[pick]->rds, 2, argv, NULL, on_slots, cl->node[pick]) == 0)
        cl->refreshing = true;
}

static void on_refresh_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    refresh_start(w->data);
}

static void refresh_soon(struct rcl *cl)
{
    if (!ev_is_active(&cl->soon_w) && !cl->closing) {
        ev_timer_set(&cl->soon_w, RCL_REFRESH_SOON_S, 0.);
        ev_timer_start(cl->loop, &cl->soon_w);
    }
}

/* Drops the adapters of nodes that are neither seeds nor primaries (from
 * a timer: never inside the adapter's callbacks). */
static void on_gc(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct rcl *cl = w->data;

    (void)loop;
    (void)revents;
    for (size_t i = 0; i < cl->n_nodes; i++) {
        struct node *n = cl->node[i];
        if (n->rds && !n->seed && !n->primary) {
            struct rds *r = n->rds;
            n->rds = NULL;
            rds_free(r);
        }
    }
    cl_update(cl);
}

/* --- pub/sub ---------------------------------------------------------- */

static void sub_on_subscribed(struct rds *r, void *ud)
{
    struct rcl *cl = ud;
    (void)r;
    cl->sub_misses = 0;
    if (cl->hooks.on_subscribed)
        cl->hooks.on_subscribed(NULL, cl->hooks.ud);
}

static void sub_on_unsubscribed(struct rds *r, void *ud)
{
    struct rcl *cl = ud;
    (void)r;
    if (cl->hooks.on_unsubscribed)
        cl->hooks.on_unsubscribed(NULL, cl->hooks.ud);
}

static void sub_on_message(struct rds *r, size_t channel, const char *msg, size_t len, void *ud)
{
    struct rcl *cl = ud;
    (void)r;
    if (cl->hooks.on_message)
        cl->hooks.on_message(NULL, channel, msg, len, cl->hooks.ud);
}

/* The subscriber on the next primary after sub_node (any node if none is
 * a primary yet). Never from the subscriber's own callbacks. */
static void sub_place(struct rcl *cl)
{
    if (cl->sub) {
        struct rds *r = cl->sub;
        cl->sub = NULL;
        rds_free(r);
    }
    int pick = -1;
    for (size_t k = 1; pick < 0 && k <= cl->n_nodes; k++) {
        size_t i = ((size_t)(cl->sub_node < 0 ? -1 : cl->sub_node) + k) % cl->n_nodes;
        if (cl->node[i]->primary && node_up(cl, (int)i))
            pick = (int)i;
    }
    if (pick < 0)
        return;
    cl->sub_node = pick;
    cl->sub_misses = 0;
    const struct rds_hooks hooks = {
        .on_subscribed = sub_on_subscribed,
        .on_unsubscribed = sub_on_unsubscribed,
        .on_message = sub_on_message,
        .ud = cl,
    };
    cl->sub = node_adapter(cl, cl->node[pick], &hooks);
    if (cl->sub)
        log_at(LOG_INFO, "redis cluster subscriber", "address", LOG_S, cl->node[pick]->where, NULL);
}

/* sub_w: a subscriber not subscribed at two checks in a row moves on. */
static void on_sub_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct rcl *cl = w->data;

    (void)loop;
    (void)revents;
    if (!cl->tmpl.n_channels || !cl->map_known)
        return;
    if (cl->sub && rds_subscribed(cl->sub)) {
        cl->sub_misses = 0;
        return;
    }
    if (!cl->sub || ++cl->sub_misses >= 2)
        sub_place(cl);
}

/* --- requests --------------------------------------------------------- */

static void req_maybe_free(struct req *q)
{
    if (q->done && q->inner == 0)
        free(q);
}

/* The caller's side ends: one callback. */
static void req_finish(struct req *q, const redisReply *reply, const char *err)
{
    struct rcl *cl = q->cl;

    if (q->done)
        return;
    q->done = true;
    ev_timer_stop(cl->loop, &q->timer_w);
    DLIST_UNLINK(cl->live, q, prev, next);
    q->cb(reply, err, q->ud);
    req_maybe_free(q);
}

static void req_on_reply(const redisReply *reply, const char *err, void *ud);

static void on_asking(const redisReply *reply, const char *err, void *ud)
{
    (void)reply;
    (void)err;
    (void)ud;
}

/* One hop to node i; ASKING first for an ASK redirection. */
static int req_send(struct req *q, int i, bool asking)
{
    struct rcl *cl = q->cl;

    if (!node_up(cl, i))
        return -1;
    struct rds *r = cl->node[i]->rds;
    if (asking) {
        static const char *const argv[] = { "ASKING" };
        if (rds_command(r, 1, (const char **)argv, NULL, on_asking, NULL) < 0)
            return -1;
    }
    int rc = q->script >= 0 ? rds_eval(r, (enum rds_script)q->script, q->nkeys, q->argc, q->argv,
                                       q->lens, req_on_reply, q)
                            : rds_command(r, q->argc, q->argv, q->lens, req_on_reply, q);
    if (rc == 0)
        q->inner++;
    return rc;
}

/* "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381": the node. */
static int redirect_target(struct rcl *cl, const char *text, unsigned *slot)
{
    char host[256];
    int port;
    const char *sp = strchr(text, ' ');
    char *end;

    if (!sp)
        return -1;
    unsigned long s = strtoul(sp + 1, &end, 10);
    if (*end != ' ' || s >= RCL_SLOTS)
        return -1;
    const char *addr = end + 1;
    const char *colon = strrchr(addr, ':');
    if (!colon || (size_t)(colon - addr) >= sizeof(host))
        return -1;
    size_t hl = (size_t)(colon - addr);
    if (hl >= 2 && addr[0] == '[' && addr[hl - 1] == ']') {
        memcpy(host, addr + 1, hl - 2);
        host[hl - 2] = '\0';
    } else {
        memcpy(host, addr, hl);
        host[hl] = '\0';
    }
    port = (int)strtol(colon + 1, &end, 10);
    if (*end != '\0' && *end != '\r' && *end != '\n')
        return -1;
    *slot = (unsigned)s;
    return node_get(cl, host, port);
}

static void req_on_reply(const redisReply *reply, const char *err, void *ud)
{
    struct req *q = ud;
    struct rcl *cl = q->cl;

    q->inner--;
    if (q->done) {
        req_maybe_free(q);
        return;
    }
    /* redis.c hands an error reply over as its text (err), or as is. */
    const char *text = reply && reply->type == REDIS_REPLY_ERROR ? reply->str : reply ? NULL : err;
    bool moved = text && strncmp(text, "MOVED ", 6) == 0;
    bool ask = text && strncmp(text, "ASK ", 4) == 0;
    if ((moved || ask) && !cl->closing) {
        unsigned slot = 0;
        int to = redirect_target(cl, text, &slot);
        if (moved) {
            cl->n.moved++;
            if (to >= 0)
                cl->slot_node[slot] = (int16_t)to;
            refresh_soon(cl);
        } else {
            cl->n.ask++;
        }
        bool first = !q->redirected;
        if (to >= 0 && first) {
            q->redirected = true;
            if (req_send(q, to, ask) == 0)
                return;
        }
        req_finish(q, NULL,
                   to < 0      ? "redirected to an unknown node"
                       : first ? "redirected to a node that is not connected"
                               : "redirected twice");
        return;
    }
    if (text && strncmp(text, "CLUSTERDOWN", 11) == 0)
        refresh_soon(cl); /* a slot may have lost its primary: the map says */
    req_finish(q, reply, err);
}

static void req_on_timeout(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    req_finish(w->data, NULL, "timeout");
}

/* The node of a command: the slot of its key, or any usable primary. */
static int route(struct rcl *cl, int nkeys, int first, int argc, const char **argv,
                 const size_t *argvlen)
{
    if (!cl->up)
        return -1;
    if (nkeys <= 0 || first < 0 || first >= argc) {
        for (size_t i = 0; i < cl->n_nodes; i++)
            if (cl->node[i]->primary && node_up(cl, (int)i))
                return (int)i;
        return -1;
    }
    size_t len0 = argvlen ? argvlen[first] : strlen(argv[first]);
    unsigned slot = rcl_keyslot(argv[first], len0);
    for (int k = first + 1; k < first + nkeys && k < argc; k++) {
        size_t len = argvlen ? argvlen[k] : strlen(argv[k]);
        if (rcl_keyslot(argv[k], len) != slot) {
            cl->n.cross_slot++;
            return -2;
        }
    }
    return cl->slot_node[slot];
}

static int req_start_at(struct rcl *cl, int to, int script, int nkeys, int argc, const char **argv,
                        const size_t *argvlen, rds_cb *cb, void *ud);

static int req_start(struct rcl *cl, int script, int nkeys, int first, int argc, const char **argv,
                     const size_t *argvlen, rds_cb *cb, void *ud)
{
    if (!cl || cl->closing || !cb || argc < 1 || !argv || nkeys < 0 || nkeys > argc)
        return -1;
    int to = route(cl, nkeys, first, argc, argv, argvlen);
    if (to < 0 || !node_up(cl, to)) {
        if (to != -2)
            cl->n.not_routed++;
        return -1;
    }
    return req_start_at(cl, to, script, nkeys, argc, argv, argvlen, cb, ud);
}

/* A request to node `to` (up). */
static int req_start_at(struct rcl *cl, int to, int script, int nkeys, int argc, const char **argv,
                        const size_t *argvlen, rds_cb *cb, void *ud)
{
    size_t bytes = sizeof(struct req) + (size_t)argc * (sizeof(char *) + sizeof(size_t));
    for (int i = 0; i < argc; i++) {
        size_t len = argvlen ? argvlen[i] : argv[i] ? strlen(argv[i]) : 0;
        if (len > SIZE_MAX / 2 - bytes)
            return -1;
        bytes += len + 1;
    }
    struct req *q = calloc(1, bytes);
    if (!q)
        return -1;
    q->argv = (const char **)(q + 1);
    q->lens = (size_t *)(q->argv + argc);
    char *p = (char *)(q->lens + argc);
    for (int i = 0; i < argc; i++) {
        size_t len = argvlen ? argvlen[i] : argv[i] ? strlen(argv[i]) : 0;
        if (len)
            memcpy(p, argv[i], len);
        p[len] = '\0';
        q->argv[i] = p;
        q->lens[i] = len;
        p += len + 1;
    }
    q->cl = cl;
    q->script = script;
    q->nkeys = nkeys;
    q->argc = argc;
    q->cb = cb;
    q->ud = ud;
    if (req_send(q, to, false) < 0) {
        free(q);
        return -1;
    }
    ev_timer_init(&q->timer_w, req_on_timeout, cl->tmpl.command_timeout_s, 0.);
    q->timer_w.data = q;
    ev_timer_start(cl->loop, &q->timer_w);
    DLIST_PUSH(cl->live, q, prev, next);
    return 0;
}

int rcl_eval(struct rcl *cl, enum rds_script s, int nkeys, int argc, const char **argv,
             const size_t *argvlen, rds_cb *cb, void *ud)
{
    if ((unsigned)s >= RDS_N_SCRIPTS)
        return -1;
    return req_start(cl, (int)s, nkeys, 0, argc, argv, argvlen, cb, ud);
}

int rcl_command(struct rcl *cl, int key, int argc, const char **argv, const size_t *argvlen,
                rds_cb *cb, void *ud)
{
    return req_start(cl, -1, key >= 1 ? 1 : 0, key, argc, argv, argvlen, cb, ud);
}

size_t rcl_primaries(const struct rcl *cl)
{
    size_t n = 0;

    for (size_t i = 0; cl->map_known && i < cl->n_nodes; i++)
        n += cl->node[i]->primary;
    return n;
}

int rcl_command_on(struct rcl *cl, size_t nth, int argc, const char **argv, const size_t *argvlen,
                   rds_cb *cb, void *ud)
{
    if (!cl || cl->closing || !cl->up || !cb || argc < 1 || !argv)
        return -1;
    for (size_t i = 0; i < cl->n_nodes; i++) {
        if (cl->node[i]->primary && nth-- == 0)
            return node_up(cl, (int)i)
                ? req_start_at(cl, (int)i, -1, 0, argc, argv, argvlen, cb, ud)
                : -1;
    }
    return -1;
}

/* --- life ------------------------------------------------------------- */

struct rcl *rcl_new(struct ev_loop *loop, const struct rcl_opts *opts,
                    const struct rds_hooks *hooks, char *err, size_t errlen)
{
    const struct rds_opts *o = opts ? &opts->node : NULL;

    if (!loop || !opts || !opts->n_seeds || !opts->seeds || opts->n_seeds > RCL_MAX_NODES) {
        str_setf(err, errlen, "redis cluster: give 1 to %d seed nodes", RCL_MAX_NODES);
        return NULL;
    }
    if (!(o->command_timeout_s > 0) || !isfinite(o->command_timeout_s)) {
        str_setf(err, errlen, "redis cluster: command_timeout_s must be positive");
        return NULL;
    }
    if ((o->username && strlen(o->username) >= sizeof(((struct rcl *)0)->username)) ||
        (o->password && strlen(o->password) >= sizeof(((struct rcl *)0)->password)) ||
        (o->n_channels && !o->channels)) {
        str_setf(err, errlen, "redis cluster: bad credentials or channels");
        return NULL;
    }
    struct rcl *cl = calloc(1, sizeof(*cl));
    if (!cl) {
        str_setf(err, errlen, "out of memory");
        return NULL;
    }
    cl->loop = loop;
    cl->tmpl = *o;
    cl->tmpl.url = NULL;
    cl->tmpl.sentinels = NULL;
    cl->tmpl.n_sentinels = 0;
    cl->tmpl.channels = NULL;
    cl->tmpl.n_channels = 0;
    cl->sub_node = -1;
    if (hooks)
        cl->hooks = *hooks;
    if (o->password) {
        snprintf(cl->password, sizeof(cl->password), "%s", o->password);
        snprintf(cl->username, sizeof(cl->username), "%s", o->username ? o->username : "");
        cl->tmpl.password = cl->password;
        cl->tmpl.username = cl->username;
    }
    if (o->tls) {
        const char *const from[4] = { o->tls->ca_file, o->tls->cert_file, o->tls->key_file,
                                      o->tls->server_name };
        for (size_t i = 0; i < 4; i++)
            if (from[i] && !(cl->tls_str[i] = strdup(from[i])))
                goto oom;
        cl->tls =
            (struct rtls_opts){ cl->tls_str[0], cl->tls_str[1], cl->tls_str[2], cl->tls_str[3] };
        cl->tmpl.tls = &cl->tls;
    }
    for (size_t s = 0; s < RCL_SLOTS; s++)
        cl->slot_node[s] = -1;
    ev_timer_init(&cl->refresh_w, on_refresh_tick, RCL_REFRESH_EVERY_S, RCL_REFRESH_EVERY_S);
    ev_timer_init(&cl->soon_w, on_refresh_tick, 0., 0.);
    ev_timer_init(&cl->gc_w, on_gc, 0., 0.);
    ev_timer_init(&cl->sub_w, on_sub_tick, RCL_SUB_EVERY(o->command_timeout_s),
                  RCL_SUB_EVERY(o->command_timeout_s));
    cl->refresh_w.data = cl->soon_w.data = cl->gc_w.data = cl->sub_w.data = cl;
    snprintf(cl->down_why, sizeof(cl->down_why), "cluster slot map unknown");
    if (o->n_channels) {
        cl->channels = calloc(o->n_channels, sizeof(*cl->channels));
        if (!cl->channels)
            goto oom;
        cl->tmpl.channels = (const char *const *)cl->channels;
        cl->tmpl.n_channels = o->n_channels;
        for (size_t i = 0; i < o->n_channels; i++)
            if (!(cl->channels[i] = strdup(o->channels[i] ? o->channels[i] : "")))
                goto oom;
    }
    for (size_t i = 0; i < opts->n_seeds; i++) {
        char host[256], perr[RCL_ERR_MAX];
        int port;
        if (rds_parse_hostport(opts->seeds[i], host, sizeof(host), &port, perr, sizeof(perr)) < 0) {
            str_setf(err, errlen, "redis cluster seed %zu: %s", i + 1, perr);
            rcl_free(cl);
            return NULL;
        }
        int k = node_get(cl, host, port);
        if (k < 0)
            goto oom;
        struct node *n = cl->node[k];
        if (n->seed)
            continue; /* listed twice */
        n->seed = true;
        n->rds = node_adapter(cl, n, NULL);
        if (!n->rds) {
            str_setf(err, errlen, "redis cluster seed %s: %s", n->where, cl->last_error);
            rcl_free(cl);
            return NULL;
        }
    }
    cl->refresh_w.repeat = RCL_REFRESH_DOWN_S;
    ev_timer_again(loop, &cl->refresh_w);
    if (cl->tmpl.n_channels)
        ev_timer_start(loop, &cl->sub_w);
    return cl;
oom:
    str_setf(err, errlen, "out of memory");
    rcl_free(cl);
    return NULL;
}

void rcl_free(struct rcl *cl)
{
    if (!cl)
        return;
    cl->closing = true;
    ev_timer_stop(cl->loop, &cl->refresh_w);
    ev_timer_stop(cl->loop, &cl->soon_w);
    ev_timer_stop(cl->loop, &cl->gc_w);
    ev_timer_stop(cl->loop, &cl->sub_w);
    while (cl->live)
        req_finish(cl->live, NULL, "closed");
    rds_free(cl->sub);
    /* The adapters first: the hops they hold call back (their records go,
     * and a map answer still names its node). */
    for (size_t i = 0; i < cl->n_nodes; i++) {
        struct rds *r = cl->node[i]->rds;
        cl->node[i]->rds = NULL;
        rds_free(r);
    }
    for (size_t i = 0; i < cl->n_nodes; i++)
        free(cl->node[i]);
    for (size_t i = 0; cl->channels && i < cl->tmpl.n_channels; i++)
        free(cl->channels[i]);
    free(cl->channels);
    for (size_t i = 0; i < 4; i++)
        free(cl->tls_str[i]);
    explicit_bzero(cl->password, sizeof(cl->password));
    free(cl);
}

bool rcl_up(const struct rcl *cl)
{
    return cl && !cl->closing && cl->up;
}

bool rcl_subscribed(const struct rcl *cl)
{
    return cl && !cl->closing && cl->sub && rds_subscribed(cl->sub);
}

const char *rcl_down_why(const struct rcl *cl)
{
    return cl->up ? "" : cl->down_why;
}

const char *rcl_mode_error(const struct rcl *cl)
{
    return cl->mode_error[0] ? cl->mode_error : NULL;
}

void rcl_flush(struct rcl *cl)
{
    if (!cl)
        return;
    for (size_t i = 0; i < cl->n_nodes; i++)
        rds_flush(cl->node[i]->rds);
}

double rcl_clock_offset(const struct rcl *cl)
{
    for (size_t i = 0; i < cl->n_nodes; i++) {
        if (node_up(cl, (int)i)) {
            double off = rds_clock_offset(cl->node[i]->rds);
            if (!isnan(off))
                return off;
        }
    }
    return NAN;
}

const struct rds_stats *rcl_get_stats(struct rcl *cl)
{
    struct rds_stats *a = &cl->agg;
    struct prom_hist h = a->rtt;

    memset(a, 0, sizeof(*a));
    a->rtt = h; /* the histogram is not summed (the nodes keep their own) */
    for (size_t i = 0; i < cl->n_nodes; i++) {
        if (!cl->node[i]->rds)
            continue;
        const struct rds_stats *s = rds_get_stats(cl->node[i]->rds);
        a->connects += s->connects;
        a->disconnects += s->disconnects;
        a->connect_failures += s->connect_failures;
        a->commands += s->commands;
        a->replies += s->replies;
        a->errors += s->errors;
        a->timeouts += s->timeouts;
        a->noscript_reloads += s->noscript_reloads;
        a->rejected_not_connected += s->rejected_not_connected;
        a->lost += s->lost;
        a->pending += s->pending;
        a->rtt_sum_s += s->rtt_sum_s;
        a->rtt_max_s = fmax(a->rtt_max_s, s->rtt_max_s);
    }
    if (cl->sub)
        a->messages = rds_get_stats(cl->sub)->messages;
    return a;
}

/* Ours (a map, a redirection), else the first node's that has one (a
 * refused connect, WRONGPASS, ...). */
const char *rcl_last_error(const struct rcl *cl)
{
    if (cl->mode_error[0])
        return cl->mode_error;
    if (cl->last_error[0])
        return cl->last_error;
    for (size_t i = 0; i < cl->n_nodes; i++)
        if (cl->node[i]->rds && rds_last_error(cl->node[i]->rds)[0])
            return rds_last_error(cl->node[i]->rds);
    return "";
}

/* --- figures ---------------------------------------------------------- */

#define CL(obj) ((struct rcl *)(obj))
#define CN(f)   (offsetof(struct rcl, n) + offsetof(struct rcl_counters, f))

static struct fig_val fig_kind(const void *obj, size_t row)
{
    (void)obj;
    (void)row;
    return (struct fig_val){ .s = "redis" };
}

static struct fig_val fig_mode(const void *obj, size_t row)
{
    (void)obj;
    (void)row;
    return (struct fig_val){ .s = "cluster" };
}

static struct fig_val fig_state(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .s = rcl_up(CL(obj)) ? "up" : "down" };
}

static struct fig_val fig_subscribed(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .b = rcl_subscribed(CL(obj)) };
}

static struct fig_val fig_map_age(const void *obj, size_t row)
{
    const struct rcl *cl = CL(obj);
    (void)row;
    return (struct fig_val){ .d = cl->map_known ? ev_now(cl->loop) - cl->map_at : -1 };
}

static struct fig_val fig_covered(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .u = CL(obj)->covered };
}

static struct fig_val fig_sum(const void *obj, size_t off)
{
    const struct rds_stats *s = rcl_get_stats(CL(obj));
    return (struct fig_val){ .u = *(const uint64_t *)((const char *)s + off) };
}

/* A getter of the summed counter `field` (rcl_get_stats). */
#define SUM_FIGURE(name, field)                                 \
    static struct fig_val name(const void *obj, size_t row)     \
    {                                                           \
        (void)row;                                              \
        return fig_sum(obj, offsetof(struct rds_stats, field)); \
    }
SUM_FIGURE(fig_commands, commands)
SUM_FIGURE(fig_errors, errors)
SUM_FIGURE(fig_timeouts, timeouts)
SUM_FIGURE(fig_pending, pending)
SUM_FIGURE(fig_noscript, noscript_reloads)

static struct fig_val fig_last_error(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .s = rcl_last_error(CL(obj)) };
}

static struct fig_val fig_down_why(const void *obj, size_t row)
{
    (void)row;
    return (struct fig_val){ .s = rcl_down_why(CL(obj)) };
}

static struct fig_val fig_subscriber(const void *obj, size_t row)
{
    const struct rcl *cl = CL(obj);
    (void)row;
    return (struct fig_val){ .s = cl->sub ? cl->node[cl->sub_node]->where : "" };
}

static void write_nodes(struct writer *w, const void *obj, size_t row)
{
    const struct rcl *cl = CL(obj);
    (void)row;

    writer_array(w, (uint32_t)cl->n_nodes);
    for (size_t i = 0; i < cl->n_nodes; i++) {
        const struct node *n = cl->node[i];
        writer_map(w, 5);
        writer_kv_str(w, "address", n->where);
        writer_kv_bool(w, "primary", n->primary);
        writer_kv_bool(w, "seed", n->seed);
        writer_kv_bool(w, "up", n->rds && rds_up(n->rds));
        writer_kv_u64(w, "slots", n->slots);
    }
}

static const struct figure rcl_figure_list[] = {
    { .key = "kind", .kind = FIG_STR, .get = fig_kind },
    { .key = "mode", .kind = FIG_STR, .get = fig_mode },
    { .key = "state", .kind = FIG_STR, .get = fig_state },
    { .key = "down_reason", .kind = FIG_STR, .get = fig_down_why },
    { .key = "subscribed",
      .metric = "polygw_redis_subscribed",
      .type = "gauge",
      .help = "1 while the pub/sub connection listens to every channel.",
      .kind = FIG_BOOL,
      .get = fig_subscribed },
    { .key = "subscriber", .kind = FIG_STR, .get = fig_subscriber },
    { .key = "map_age_s",
      .metric = "polygw_redis_cluster_map_age_seconds",
      .type = "gauge",
      .help = "Cluster: seconds since the slot map was last read (-1: never).",
      .kind = FIG_DOUBLE,
      .get = fig_map_age },
    { .key = "slots_covered",
      .metric = "polygw_redis_cluster_slots_covered",
      .type = "gauge",
      .help = "Cluster: slots of the map that have a primary (16384 when complete).",
      .get = fig_covered },
    { .key = "nodes", .kind = FIG_CUSTOM, .write = write_nodes },
    { .key = "commands",
      .metric = "polygw_redis_commands_total",
      .type = "counter",
      .help = "Redis commands sent.",
      .get = fig_commands },
    { .key = "errors", .get = fig_errors },
    { .key = "timeouts", .get = fig_timeouts },
    { .key = "pending",
      .metric = "polygw_redis_pending_commands",
      .type = "gauge",
      .help = "Redis commands sent, not answered.",
      .get = fig_pending },
    { .key = "noscript_reloads", .get = fig_noscript },
    { .key = "moved",
      .metric = "polygw_redis_cluster_redirections_total",
      .type = "counter",
      .help = "Cluster: replies that sent a command to another node, by kind (moved, ask).",
      .label = "kind",
      .label_value = "moved",
      .off = CN(moved) },
    { .key = "ask",
      .metric = "polygw_redis_cluster_redirections_total",
      .label = "kind",
      .label_value = "ask",
      .off = CN(ask) },
    { .key = "cross_slot",
      .metric = "polygw_redis_cluster_cross_slot_total",
      .type = "counter",
      .help = "Cluster: commands refused because their keys span slots.",
      .off = CN(cross_slot) },
    { .key = "not_routed", .off = CN(not_routed) },
    { .key = "map_refreshes",
      .metric = "polygw_redis_cluster_map_refreshes_total",
      .type = "counter",
      .help = "Cluster: slot maps read.",
      .off = CN(refreshes) },
    { .key = "map_refresh_failures", .off = CN(refresh_failures) },
    { .key = "last_error", .kind = FIG_STR, .get = fig_last_error },
};

const struct fig_table rcl_figures = FIG_TABLE(rcl_figure_list);
