/*
 * check_redis_url.c — the Redis adapter's URL parser and the parts of
 * sidecar/backend/redis.c that need no server: construction, rejection while not
 * connected, the stats map, and freeing in every early state.
 *
 * Every rejected URL holds the password SECRET somewhere it could leak
 * from: the error must never contain it, and the output struct is wiped.
 */
#include <ev.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "backend/redis.h"
#include "backend/redis_url.h"
#include "suites.h"

#define SECRET "s3cr3t-TOPSECRET"

static void expect_ok(const char *url, const char *host, int port, const char *path,
                      const char *password, int db)
{
    struct rds_addr a;
    char err[256] = "";

    ck_assert_msg(rds_parse_url(url, &a, err, sizeof(err)) == 0, "%s: %s", url, err);
    ck_assert_str_eq(a.host, host);
    ck_assert_int_eq(a.port, port);
    ck_assert_str_eq(a.path, path);
    ck_assert_str_eq(a.password, password);
    ck_assert_int_eq(a.db, db);
}

static void expect_reject(const char *url, const char *why)
{
    struct rds_addr a;
    char err[256] = "";

    memset(&a, 0x55, sizeof(a));
    ck_assert_msg(rds_parse_url(url, &a, err, sizeof(err)) == -1, "accepted %s", url);
    ck_assert_msg(strstr(err, why) != NULL, "%s: got \"%s\", want \"%s\"", url, err, why);
    ck_assert_msg(strstr(err, SECRET) == NULL && strstr(err, "TOPSECRET") == NULL,
                  "%s: error shows the password: %s", url, err);
    ck_assert_msg(a.password[0] == '\0', "%s: password left in the output", url);
}

/* --- parsing ----------------------------------------------------------- */

START_TEST(test_redis_url__tcp_forms)
{
    expect_ok("redis://localhost", "localhost", 6379, "", "", 0);
    expect_ok("redis://127.0.0.1:6380", "127.0.0.1", 6380, "", "", 0);
    expect_ok("redis://h/", "h", 6379, "", "", 0);
    expect_ok("redis://h/3", "h", 6379, "", "", 3);
    expect_ok("redis://h:1/2147483647", "h", 1, "", "", 2147483647);
    expect_ok("redis://h:65535/0", "h", 65535, "", "", 0);
    expect_ok("REDIS://My-Host_1.example.com", "My-Host_1.example.com", 6379, "", "", 0);
    expect_ok("redis://:" SECRET "@10.0.0.1:7000/5", "10.0.0.1", 7000, "", SECRET, 5);
    expect_ok("redis://default:" SECRET "@h", "h", 6379, "", SECRET, 0);
    expect_ok("redis://:@h", "h", 6379, "", "", 0);
}
END_TEST

/* rediss:// is the same URL over TLS; an ACL user goes with its password
 * ("default" is no user: plain AUTH password). */
START_TEST(test_redis_url__tls_and_acl_user)
{
    struct rds_addr a;
    char err[256] = "";

    ck_assert_int_eq(
        rds_parse_url("rediss://bob:" SECRET "@cache.example:6380/2", &a, err, sizeof(err)), 0);
    ck_assert(a.tls);
    ck_assert_str_eq(a.user, "bob");
    ck_assert_str_eq(a.password, SECRET);
    ck_assert_str_eq(a.host, "cache.example");
    ck_assert_int_eq(a.port, 6380);
    ck_assert_int_eq(a.db, 2);
    ck_assert_int_eq(rds_parse_url("redis://default:pw@h", &a, err, sizeof(err)), 0);
    ck_assert(!a.tls);
    ck_assert_str_eq(a.user, "");
    ck_assert_int_eq(rds_parse_url("redis://a%40b:pw@h", &a, err, sizeof(err)), 0);
    ck_assert_str_eq(a.user, "a@b");
}
END_TEST

/* A sentinel's address: the port is required, nothing but host:port. */
START_TEST(test_redis_url__sentinel_hostport)
{
    char host[256], err[128];
    int port = 0;

    ck_assert_int_eq(
        rds_parse_hostport("10.0.0.7:26379", host, sizeof(host), &port, err, sizeof(err)), 0);
    ck_assert_str_eq(host, "10.0.0.7");
    ck_assert_int_eq(port, 26379);
    ck_assert_int_eq(rds_parse_hostport("[::1]:5000", host, sizeof(host), &port, err, sizeof(err)),
                     0);
    ck_assert_str_eq(host, "::1");
    ck_assert_int_eq(port, 5000);
    static const char *const bad[] = { "h",       "h:",    "[::1]", "h:0", "h:70000",
                                       "a:b@h:1", "h:1/0", "",      ":1" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(rds_parse_hostport(bad[i], host, sizeof(host), &port, err, sizeof(err)) == -1,
                      "accepted %s", bad[i]);
}
END_TEST

START_TEST(test_redis_url__ipv6)
{
    expect_ok("redis://[::1]", "::1", 6379, "", "", 0);
    expect_ok("redis://[::1]:7001/4", "::1", 7001, "", "", 4);
    expect_ok("redis://:pw@[2001:db8::2]:6379", "2001:db8::2", 6379, "", "pw", 0);
}
END_TEST

START_TEST(test_redis_url__password_decoding)
{
    expect_ok("redis://:a%2Fb%25c%40d@h", "h", 6379, "", "a/b%c@d", 0);
    /* Unencoded '@', '/' and ':' still work: the user info ends at the last '@'. */
    expect_ok("redis://:p@ss/w:rd@h:1/2", "h", 1, "", "p@ss/w:rd", 2);
    expect_ok("redis://:%7e%7E@h", "h", 6379, "", "~~", 0);
}
END_TEST

START_TEST(test_redis_url__unix_forms)
{
    expect_ok("unix:///tmp/redis.sock", "", 0, "/tmp/redis.sock", "", 0);
    expect_ok("unix:///tmp/r.sock?db=2", "", 0, "/tmp/r.sock", "", 2);
    expect_ok("unix:///tmp/r.sock?db=2&password=" SECRET, "", 0, "/tmp/r.sock", SECRET, 2);
    expect_ok("unix:///tmp/r.sock?password=p%26w%3D&db=1", "", 0, "/tmp/r.sock", "p&w=", 1);
    expect_ok("unix:///tmp/a%20b.sock", "", 0, "/tmp/a b.sock", "", 0);

    char url[160], path[108];
    memset(path, 'p', sizeof(path) - 1);
    path[0] = '/';
    path[sizeof(path) - 1] = '\0';
    snprintf(url, sizeof(url), "unix://%s", path); /* 107 bytes: the most sun_path holds */
    expect_ok(url, "", 0, path, "", 0);
}
END_TEST

START_TEST(test_redis_url__bad_scheme)
{
    expect_reject("http://:" SECRET "@h", "unsupported scheme");
    expect_reject("redis:/h", "unsupported scheme");
    expect_reject("", "unsupported scheme");
    expect_reject("rediss:/:" SECRET "@h", "unsupported scheme");
    expect_reject(NULL, "no URL");
}
END_TEST

START_TEST(test_redis_url__bad_host)
{
    expect_reject("redis://", "empty host");
    expect_reject("redis://:" SECRET "@", "empty host");
    expect_reject("redis://:" SECRET "@:6379", "empty host");
    expect_reject("redis://:" SECRET "@/0", "empty host");
    expect_reject("redis://[]:1", "empty host");
    expect_reject("redis://[::1", "unterminated");
    expect_reject("redis://:" SECRET "@[zz::1]", "bad IPv6");
    expect_reject("redis://[::1]x", "unexpected characters");
    expect_reject("redis://h?db=1", "bad character in the host");
    expect_reject("redis://a b", "bad character in the host");

    char url[400] = "redis://";
    memset(url + 8, 'h', 300);
    url[308] = '\0';
    expect_reject(url, "host too long");
}
END_TEST

START_TEST(test_redis_url__bad_port)
{
    expect_reject("redis://:" SECRET "@h:0", "bad port");
    expect_reject("redis://h:65536", "bad port");
    expect_reject("redis://h:99999999999999999999", "bad port");
    expect_reject("redis://h:", "bad port");
    expect_reject("redis://h:/1", "bad port");
    expect_reject("redis://h:-1", "bad port");
    expect_reject("redis://h:12ab", "bad port");
    expect_reject("redis://[::1]:x", "bad port");
}
END_TEST

START_TEST(test_redis_url__bad_db)
{
    expect_reject("redis://:" SECRET "@h/2147483648", "bad db");
    expect_reject("redis://h/-1", "bad db");
    expect_reject("redis://h/x", "bad db");
    expect_reject("redis://h/1x", "unexpected characters after the db");
    expect_reject("redis://h/1/", "unexpected characters after the db");
    expect_reject("redis://h/1?x=1", "unexpected characters after the db");
    expect_reject("unix:///s?db=", "bad query parameter");
    expect_reject("unix:///s?db=x&password=" SECRET, "bad db");
    expect_reject("unix:///s?password=" SECRET "&db=99999999999", "bad db");
}
END_TEST

START_TEST(test_redis_url__bad_userinfo)
{
    expect_reject("redis://" SECRET "@h", "[user]:password");
    expect_reject("redis://bob%zz:" SECRET "@h", "percent-encoding in the user name");
    expect_reject("redis://:" SECRET "%zz@h", "percent-encoding");
    expect_reject("redis://:" SECRET "%4@h", "percent-encoding");
    expect_reject("redis://:" SECRET "%00@h", "percent-encoding");

    char url[600] = "redis://:";
    memset(url + 9, 'x', 300);
    strcpy(url + 309, SECRET "@h");
    expect_reject(url, "password too long");
}
END_TEST

START_TEST(test_redis_url__bad_unix)
{
    expect_reject("unix://tmp/r.sock?password=" SECRET, "absolute");
    expect_reject("unix://", "absolute");
    expect_reject("unix:///s?password=" SECRET "&password=x", "password given twice");
    expect_reject("unix:///s?db=1&db=2&password=" SECRET, "db given twice");
    expect_reject("unix:///s?pass=" SECRET, "bad query parameter");
    expect_reject("unix:///s?password=" SECRET "&" SECRET, "bad query parameter");
    expect_reject("unix:///s?", "bad query parameter");
    expect_reject("unix:///s?db=1&", "bad query parameter");
    expect_reject("unix:///s%zz?password=" SECRET, "percent-encoding in the socket path");

    char url[300] = "unix:///";
    memset(url + 8, 'p', 200);
    strcpy(url + 208, "?password=" SECRET);
    expect_reject(url, "socket path too long");
}
END_TEST

/* A short buffer gets a truncated, terminated message; none at all is fine. */
START_TEST(test_redis_url__small_err_buffer)
{
    struct rds_addr a;
    char err[8];

    memset(err, 'z', sizeof(err));
    ck_assert_int_eq(rds_parse_url("redis://h:0", &a, err, sizeof(err)), -1);
    ck_assert_uint_eq(strlen(err), sizeof(err) - 1);
    ck_assert_int_eq(rds_parse_url("redis://h:0", &a, NULL, 0), -1);
    ck_assert_int_eq(rds_parse_url("redis://h:1", &a, NULL, 0), 0);
}
END_TEST

/* --- the adapter without a server -------------------------------------- */

static void never_cb(const redisReply *reply, const char *err, void *ud)
{
    (void)reply;
    (void)err;
    (void)ud;
    ck_abort_msg("callback of a rejected command ran");
}

static struct rds *new_rds(struct ev_loop *loop, const char *url, char *err, size_t errlen)
{
    static const char *const channels[] = { "p:task-end", "p:progress" };
    const struct rds_opts opts = {
        .url = url,
        .command_timeout_s = 0.2,
        .reconnect_min_s = 0.01,
        .reconnect_max_s = 0.05,
        .channels = channels,
        .n_channels = 2,
    };
    return rds_new(loop, &opts, NULL, err, errlen);
}

START_TEST(test_redis_url__new_rejects)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    char err[256];

    ck_assert_ptr_null(new_rds(loop, "redis://:" SECRET "@h:0", err, sizeof(err)));
    ck_assert_ptr_nonnull(strstr(err, "bad port"));
    ck_assert_ptr_null(strstr(err, SECRET));

    const struct rds_opts bad = {
        .url = "redis://h", .command_timeout_s = 0, .reconnect_min_s = 1, .reconnect_max_s = 2
    };
    ck_assert_ptr_null(rds_new(loop, &bad, NULL, err, sizeof(err)));
    const struct rds_opts bad2 = {
        .url = "redis://h", .command_timeout_s = 1, .reconnect_min_s = 2, .reconnect_max_s = 1
    };
    ck_assert_ptr_null(rds_new(loop, &bad2, NULL, err, sizeof(err)));
    const struct rds_opts bad3 = {
        .url = "redis://h", .command_timeout_s = NAN, .reconnect_min_s = 1, .reconnect_max_s = 1
    };
    ck_assert_ptr_null(rds_new(loop, &bad3, NULL, err, sizeof(err)));
    rds_free(NULL);
    ev_loop_destroy(loop);
}
END_TEST

struct stats_view {
    uint32_t n_keys;
    char state[16];
    char address[128];
    char last_error[160];
    bool subscribed;
    uint64_t rejected, connect_failures;
    bool all_keys_unique;
    char sentinel[64], sentinel_state[16];
};

static void read_stats(const struct rds *r, struct stats_view *v)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_unpacked u;

    memset(v, 0, sizeof(*v));
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    struct writer w;
    writer_init_msgpack(&w, &pk);
    figs_write_map(&w, &rds_figures, r, 0);
    ck_assert_int_eq(w.err, 0);
    msgpack_unpacked_init(&u);
    size_t off = 0;
    ck_assert_int_eq(msgpack_unpack_next(&u, sb.data, sb.size, &off), MSGPACK_UNPACK_SUCCESS);
    ck_assert_uint_eq(off, sb.size); /* exactly one object: the map count is right */
    ck_assert_int_eq(u.data.type, MSGPACK_OBJECT_MAP);
    ck_assert_ptr_null(memmem(sb.data, sb.size, SECRET, strlen(SECRET)));
    const msgpack_object_map *m = &u.data.via.map;
    v->n_keys = m->size;
    v->all_keys_unique = true;
    for (uint32_t i = 0; i < m->size; i++) {
        const msgpack_object_str *k = &m->ptr[i].key.via.str;
        const msgpack_object *val = &m->ptr[i].val;
        ck_assert_int_eq(m->ptr[i].key.type, MSGPACK_OBJECT_STR);
        for (uint32_t j = 0; j < i; j++) {
            const msgpack_object_str *k2 = &m->ptr[j].key.via.str;
            if (k2->size == k->size && memcmp(k2->ptr, k->ptr, k->size) == 0)
                v->all_keys_unique = false;
        }
#define KEY_IS(s)     (k->size == strlen(s) && memcmp(k->ptr, s, k->size) == 0)
#define COPY_STR(dst) snprintf(dst, sizeof(dst), "%.*s", (int)val->via.str.size, val->via.str.ptr)
        if (KEY_IS("state"))
            COPY_STR(v->state);
        else if (KEY_IS("address"))
            COPY_STR(v->address);
        else if (KEY_IS("last_error"))
            COPY_STR(v->last_error);
        else if (KEY_IS("subscribed"))
            v->subscribed = val->via.boolean;
        else if (KEY_IS("rejected_not_connected"))
            v->rejected = val->via.u64;
        else if (KEY_IS("connect_failures"))
            v->connect_failures = val->via.u64;
        else if (KEY_IS("sentinel"))
            COPY_STR(v->sentinel);
        else if (KEY_IS("sentinel_state"))
            COPY_STR(v->sentinel_state);
#undef KEY_IS
#undef COPY_STR
    }
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
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

/* A socket that does not exist: every attempt fails at once, and retries
 * keep coming with the backoff. Nothing needs a network. */
START_TEST(test_redis_url__not_connected)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    char err[256];
    struct stats_view v;
    const char *argv[] = { "k", "v" };

    log_threshold = LOG_ERROR; /* the retries log at warn and info */
    struct rds *r =
        new_rds(loop, "unix:///nonexistent/polygw-test.sock?password=" SECRET, err, sizeof(err));
    ck_assert_msg(r != NULL, "%s", err);
    ck_assert(!rds_up(r));
    ck_assert(!rds_subscribed(r));
    ck_assert(isnan(rds_clock_offset(r)));
    ck_assert_int_eq(rds_eval(r, RDS_ADMIT, 1, 2, argv, NULL, never_cb, NULL), -1);
    ck_assert_int_eq(rds_command(r, 2, argv, NULL, never_cb, NULL), -1);
    ck_assert_int_eq(rds_command(r, 2, (const char *[]){ "SUBSCRIBE", "x" }, NULL, never_cb, NULL),
                     -1);
    ck_assert_int_eq(rds_eval(r, RDS_N_SCRIPTS, 0, 0, NULL, NULL, never_cb, NULL), -1);
    ck_assert_int_eq(rds_eval(r, RDS_ADMIT, 3, 2, argv, NULL, never_cb, NULL), -1);

    read_stats(r, &v);
    ck_assert_uint_eq(v.n_keys, 21);
    ck_assert(v.all_keys_unique);
    ck_assert_str_eq(v.address, "/nonexistent/polygw-test.sock");
    ck_assert_uint_eq(v.rejected, 2);
    ck_assert(!v.subscribed);

    run_for(loop, 0.15);
    read_stats(r, &v);
    ck_assert_str_eq(v.state, "down");
    ck_assert_uint_ge(v.connect_failures, 4); /* both connections, backoff <= 0.05 s */
    ck_assert_msg(v.last_error[0] != '\0', "no last_error");
    ck_assert_int_eq(rds_eval(r, RDS_TASK, 1, 2, argv, NULL, never_cb, NULL), -1);
    rds_free(r);
    ev_loop_destroy(loop);
}
END_TEST

/* Freed before the first attempt, during a host-name lookup (its thread
 * must not touch the freed adapter), and while a TCP connect is pending. */
/* Sentinels that refuse the connection: each is tried in turn, the data
 * connections wait for a primary (no attempt, nothing to admit with), the
 * stats say so, and the sentinels' password shows nowhere. */
START_TEST(test_redis_url__sentinels_unreachable)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    static const char *const channels[] = { "p:task-end" };
    static const char *const sentinels[] = { "127.0.0.1:1", "127.0.0.1:2" };
    char err[256];
    struct stats_view v;
    struct rds_opts opts = {
        .sentinels = sentinels,
        .n_sentinels = 2,
        .master_name = "mymaster",
        .sentinel_password = SECRET,
        .password = SECRET,
        .command_timeout_s = 0.2,
        .reconnect_min_s = 0.01,
        .reconnect_max_s = 0.05,
        .channels = channels,
        .n_channels = 1,
    };

    log_threshold = LOG_ERROR;
    struct rds *r = rds_new(loop, &opts, NULL, err, sizeof(err));
    ck_assert_msg(r != NULL, "%s", err);
    run_for(loop, 0.15);
    read_stats(r, &v); /* also checks that SECRET is not in it */
    ck_assert_uint_eq(v.n_keys, 25);
    ck_assert(v.all_keys_unique);
    ck_assert_str_eq(v.address, "unknown (asking the sentinels)");
    ck_assert_str_eq(v.state, "down");
    ck_assert_str_ne(v.sentinel_state, "up");
    ck_assert_msg(strstr(v.sentinel, "127.0.0.1:"), "%s", v.sentinel);
    ck_assert_uint_ge(v.connect_failures, 2); /* both sentinels, in turn */
    ck_assert(!rds_up(r));
    rds_free(r);

    opts.url = "redis://h";
    ck_assert_ptr_null(rds_new(loop, &opts, NULL, err, sizeof(err)));
    ck_assert_msg(strstr(err, "either a URL or sentinels"), "%s", err);
    opts.url = NULL;
    opts.master_name = NULL;
    ck_assert_ptr_null(rds_new(loop, &opts, NULL, err, sizeof(err)));
    ck_assert_msg(strstr(err, "master name"), "%s", err);
    opts.master_name = "m";
    static const char *const bad[] = { "127.0.0.1:1", "h" };
    opts.sentinels = bad;
    ck_assert_ptr_null(rds_new(loop, &opts, NULL, err, sizeof(err)));
    ck_assert_msg(strstr(err, "sentinel 1: expected host:port"), "%s", err);
    ev_loop_destroy(loop);
}
END_TEST

START_TEST(test_redis_url__free_early)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    char err[256];
    struct stats_view v;

    log_threshold = LOG_ERROR;
    struct rds *r = new_rds(loop, "redis://127.0.0.1:1", err, sizeof(err));
    ck_assert_msg(r != NULL, "%s", err);
    read_stats(r, &v);
    ck_assert_str_eq(v.address, "127.0.0.1:1");
    rds_free(r);

    for (int i = 0; i < 20; i++) {
        r = new_rds(loop, "redis://:" SECRET "@localhost:1/3", err, sizeof(err));
        ck_assert_msg(r != NULL, "%s", err);
        ev_run(loop, EVRUN_NOWAIT); /* starts the lookup thread */
        if (i % 2)
            ev_run(loop, EVRUN_NOWAIT);
        read_stats(r, &v);
        ck_assert_str_eq(v.address, "localhost:1");
        rds_free(r);
    }

    r = new_rds(loop, "redis://[::1]:1", err, sizeof(err));
    ck_assert_msg(r != NULL, "%s", err);
    read_stats(r, &v);
    ck_assert_str_eq(v.address, "[::1]:1");
    run_for(loop, 0.05);
    rds_free(r);
    ev_loop_destroy(loop);
    usleep(200000); /* let abandoned lookup threads finish (LSan looks at exit) */
}
END_TEST

Suite *redis_url_suite(void)
{
    Suite *s = suite_create("redis_url");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_redis_url__tcp_forms);
    tcase_add_test(tc, test_redis_url__ipv6);
    tcase_add_test(tc, test_redis_url__password_decoding);
    tcase_add_test(tc, test_redis_url__unix_forms);
    tcase_add_test(tc, test_redis_url__bad_scheme);
    tcase_add_test(tc, test_redis_url__tls_and_acl_user);
    tcase_add_test(tc, test_redis_url__sentinel_hostport);
    tcase_add_test(tc, test_redis_url__bad_host);
    tcase_add_test(tc, test_redis_url__bad_port);
    tcase_add_test(tc, test_redis_url__bad_db);
    tcase_add_test(tc, test_redis_url__bad_userinfo);
    tcase_add_test(tc, test_redis_url__bad_unix);
    tcase_add_test(tc, test_redis_url__small_err_buffer);
    tcase_add_test(tc, test_redis_url__new_rejects);
    tcase_add_test(tc, test_redis_url__not_connected);
    tcase_add_test(tc, test_redis_url__free_early);
    tcase_add_test(tc, test_redis_url__sentinels_unreachable);
    suite_add_tcase(s, tc);
    return s;
}
