/*
 * test_redis_cluster.c — sidecar/backend/redis_cluster.c: the CRC16 and
 * key -> slot rule against the specification's vector and slots that a
 * real cluster gave (redis-cli CLUSTER KEYSLOT on Redis 7.0), and the
 * client's behaviour without a reachable cluster: construction errors,
 * fail-closed routing, the stats map.
 */
#include <ev.h>
#include <math.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "backend/redis_cluster.h"
#include "codec/writer.h"
#include "suites.h"

#define SECRET "s3cr3t-TOPSECRET"

static unsigned slot_of(const char *key)
{
    return rcl_keyslot(key, strlen(key));
}

START_TEST(test_redis_cluster__crc16_vector)
{
    ck_assert_uint_eq(rcl_crc16("123456789", 9), 0x31C3);
    ck_assert_uint_eq(rcl_crc16("", 0), 0);
}
END_TEST

/* Each value as `redis-cli CLUSTER KEYSLOT` answered it. */
START_TEST(test_redis_cluster__keyslot_known)
{
    static const struct {
        const char *key;
        unsigned slot;
    } known[] = {
        { "foo", 12182 },
        { "{user1000}.following", 3443 },
        { "{user1000}.followers", 3443 },
        { "123456789", 12739 },
        { "{}foo", 9500 },         /* an empty tag: the whole key */
        { "foo{}{bar}", 8363 },    /* the first '{' opens an empty tag: the whole key */
        { "foo{{bar}}zap", 4015 }, /* tag "{bar" */
        { "foo{bar}{zap}", 5061 }, /* tag "bar" */
        { "a{b", 13340 },          /* no '}': the whole key */
        { "", 0 },
        { "{polygw:source:a}:breaker", 5125 },
    };
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        ck_assert_msg(slot_of(known[i].key) == known[i].slot, "%s: %u, want %u", known[i].key,
                      slot_of(known[i].key), known[i].slot);
    ck_assert_uint_eq(slot_of("foo{bar}{zap}"), slot_of("bar"));
    ck_assert_uint_eq(slot_of("{polygw:source:a}:leases"), slot_of("{polygw:source:a}:rpm"));
    /* A prefix with a hash tag of its own puts every key in one slot. */
    ck_assert_uint_eq(slot_of("{{p}:source:a}:breaker"), slot_of("{{p}:app:b}:leases"));
    /* Bytes, not C strings: a NUL inside the key counts. */
    ck_assert_uint_ne(rcl_keyslot("a\0b", 3), rcl_keyslot("a", 1));
}
END_TEST

static void never_cb(const redisReply *reply, const char *err, void *ud)
{
    (void)reply;
    (void)err;
    (void)ud;
    ck_abort_msg("a callback ran for a refused command");
}

static void stop_loop(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)w;
    (void)revents;
    ev_break(loop, EVBREAK_ALL);
}

static void run_for(struct ev_loop *loop, double s)
{
    ev_timer t;
    ev_timer_init(&t, stop_loop, s, 0.);
    ev_timer_start(loop, &t);
    ev_run(loop, 0);
    ev_timer_stop(loop, &t);
}

START_TEST(test_redis_cluster__new_rejects)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    char err[256];
    static const char *const bad[] = { "127.0.0.1" };
    struct rcl_opts o = {
        .seeds = bad,
        .n_seeds = 1,
        .node = { .command_timeout_s = 1, .reconnect_min_s = 0.1, .reconnect_max_s = 1 }
    };

    ck_assert_ptr_null(rcl_new(loop, &o, NULL, err, sizeof(err)));
    ck_assert_msg(strstr(err, "seed 1"), "%s", err);
    o.n_seeds = 0;
    ck_assert_ptr_null(rcl_new(loop, &o, NULL, err, sizeof(err)));
    ck_assert_msg(strstr(err, "seed"), "%s", err);
    static const char *const good[] = { "127.0.0.1:1" };
    o.seeds = good;
    o.n_seeds = 1;
    o.node.command_timeout_s = 0;
    ck_assert_ptr_null(rcl_new(loop, &o, NULL, err, sizeof(err)));
    ck_assert_msg(strstr(err, "command_timeout_s"), "%s", err);
    ev_loop_destroy(loop);
}
END_TEST

struct view {
    uint32_t n_keys;
    char mode[16], state[16], down_reason[160], last_error[160];
    double map_age_s;
    uint64_t slots_covered;
    uint32_t n_nodes;
    char node0[64];
    bool node0_seed, node0_up;
};

static void read_view(struct rcl *cl, struct view *v)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_unpacked u;
    struct writer w;
    size_t off = 0;

    memset(v, 0, sizeof(*v));
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    writer_init_msgpack(&w, &pk);
    figs_write_map(&w, &rcl_figures, cl, 0);
    ck_assert_int_eq(w.err, 0);
    msgpack_unpacked_init(&u);
    ck_assert_int_eq(msgpack_unpack_next(&u, sb.data, sb.size, &off), MSGPACK_UNPACK_SUCCESS);
    ck_assert_uint_eq(off, sb.size);
    ck_assert_ptr_null(memmem(sb.data, sb.size, SECRET, strlen(SECRET)));
    const msgpack_object_map *m = &u.data.via.map;
    v->n_keys = m->size;
    for (uint32_t i = 0; i < m->size; i++) {
        const msgpack_object_str *k = &m->ptr[i].key.via.str;
        const msgpack_object *val = &m->ptr[i].val;
#define KEY_IS(s)     (k->size == strlen(s) && memcmp(k->ptr, s, k->size) == 0)
#define COPY_STR(dst) snprintf(dst, sizeof(dst), "%.*s", (int)val->via.str.size, val->via.str.ptr)
        if (KEY_IS("mode"))
            COPY_STR(v->mode);
        else if (KEY_IS("state"))
            COPY_STR(v->state);
        else if (KEY_IS("down_reason"))
            COPY_STR(v->down_reason);
        else if (KEY_IS("last_error"))
            COPY_STR(v->last_error);
        else if (KEY_IS("map_age_s"))
            v->map_age_s =
                val->type == MSGPACK_OBJECT_FLOAT64 ? val->via.f64 : (double)val->via.i64;
        else if (KEY_IS("slots_covered"))
            v->slots_covered = val->via.u64;
        else if (KEY_IS("nodes")) {
            ck_assert_int_eq(val->type, MSGPACK_OBJECT_ARRAY);
            v->n_nodes = val->via.array.size;
            const msgpack_object_map *n0 = &val->via.array.ptr[0].via.map;
            for (uint32_t j = 0; j < n0->size; j++) {
                k = &n0->ptr[j].key.via.str;
                val = &n0->ptr[j].val;
                if (KEY_IS("address"))
                    COPY_STR(v->node0);
                else if (KEY_IS("seed"))
                    v->node0_seed = val->via.boolean;
                else if (KEY_IS("up"))
                    v->node0_up = val->via.boolean;
            }
        }
#undef KEY_IS
#undef COPY_STR
    }
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
}

/* Seeds that refuse the connection: no map, every command refused at once
 * (fail closed, never a callback), the stats say why, and the password
 * shows nowhere. */
START_TEST(test_redis_cluster__unreachable_fails_closed)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    static const char *const seeds[] = { "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:1" };
    static const char *const channels[] = { "p:task-end" };
    const char *argv[] = { "{a}:k", "{a}:j", "v" };
    char err[256];
    struct view v;
    const struct rcl_opts o = {
        .seeds = seeds,
        .n_seeds = 3,
        .node = { .username = "u",
                  .password = SECRET,
                  .command_timeout_s = 0.2,
                  .reconnect_min_s = 0.01,
                  .reconnect_max_s = 0.05,
                  .channels = channels,
                  .n_channels = 1 },
    };

    log_threshold = LOG_ERROR;
    struct rcl *cl = rcl_new(loop, &o, NULL, err, sizeof(err));
    ck_assert_msg(cl != NULL, "%s", err);
    ck_assert(!rcl_up(cl));
    ck_assert(!rcl_subscribed(cl));
    ck_assert(isnan(rcl_clock_offset(cl)));
    ck_assert_int_eq(rcl_eval(cl, RDS_ADMIT, 2, 3, argv, NULL, never_cb, NULL), -1);
    ck_assert_int_eq(rcl_command(cl, 1, 2, (const char *[]){ "GET", "k" }, NULL, never_cb, NULL),
                     -1);
    ck_assert_int_eq(rcl_eval(cl, RDS_N_SCRIPTS, 0, 0, NULL, NULL, never_cb, NULL), -1);
    run_for(loop, 0.15);
    ck_assert(!rcl_up(cl));
    ck_assert_ptr_null(rcl_mode_error(cl));
    ck_assert_str_eq(rcl_down_why(cl), "cluster slot map unknown");
    read_view(cl, &v);
    ck_assert_str_eq(v.mode, "cluster");
    ck_assert_str_eq(v.state, "down");
    ck_assert_str_eq(v.down_reason, "cluster slot map unknown");
    ck_assert(v.map_age_s < 0);
    ck_assert_uint_eq(v.slots_covered, 0);
    ck_assert_uint_eq(v.n_nodes, 2); /* a seed listed twice is one node */
    ck_assert_str_eq(v.node0, "127.0.0.1:1");
    ck_assert(v.node0_seed);
    ck_assert(!v.node0_up);
    ck_assert_msg(v.last_error[0], "no last_error");
    ck_assert_uint_eq(rcl_get_stats(cl)->pending, 0);
    rcl_free(cl);
    rcl_free(NULL);
    ev_loop_destroy(loop);
}
END_TEST

Suite *redis_cluster_suite(void)
{
    Suite *s = suite_create("redis_cluster");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_redis_cluster__crc16_vector);
    tcase_add_test(tc, test_redis_cluster__keyslot_known);
    tcase_add_test(tc, test_redis_cluster__new_rejects);
    tcase_add_test(tc, test_redis_cluster__unreachable_fails_closed);
    suite_add_tcase(s, tc);
    return s;
}
