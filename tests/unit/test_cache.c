/* test_cache.c — the response cache's memory tier (sidecar/backend/cache):
 * the canonical key, LRU under the byte cap, expiry and max-age by an
 * injected clock, bounded fills, and the Cache-Control readers. */
#include <check.h>
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cache.h"
#include "codec/transcode.h"
#include "suites.h"

/* The key of JSON `json` for app `ns`. */
static struct cache_key key_of(const char *ns, const char *json, unsigned form)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_unpacked up;
    struct cache_key k;

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    ck_assert_int_eq(transcode_json_to_msgpack(json, strlen(json), &pk, NULL, NULL, 0), 0);
    msgpack_unpacked_init(&up);
    ck_assert(msgpack_unpack_next(&up, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS);
    ck_assert_int_eq(cache_key_make(&k, ns, "chat", "m", 1, form, &up.data), 0);
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&sb);
    return k;
}

static bool same(struct cache_key a, struct cache_key b)
{
    return memcmp(a.h, b.h, sizeof(a.h)) == 0;
}

START_TEST(test_cache__key_is_canonical_and_scoped)
{
    struct cache_key k = key_of("a", "{\"model\":\"m\",\"input\":[1,{\"x\":1,\"y\":2}]}", 0);

    /* Member order, whitespace and the ignored members do not matter. */
    ck_assert(same(k, key_of("a", " { \"input\" : [1, {\"y\":2,\"x\":1}], \"model\":\"m\" }", 0)));
    ck_assert(same(k,
                   key_of("a",
                          "{\"model\":\"m\",\"input\":[1,{\"x\":1,\"y\":2}],\"user\":\"u\","
                          "\"stream\":false,\"stream_options\":{}}",
                          0)));
    /* Nested `user` is content; order inside arrays, types, app, form are all part. */
    ck_assert(
        !same(k, key_of("a", "{\"model\":\"m\",\"input\":[1,{\"x\":1,\"y\":2,\"user\":1}]}", 0)));
    ck_assert(!same(k, key_of("a", "{\"model\":\"m\",\"input\":[{\"x\":1,\"y\":2},1]}", 0)));
    ck_assert(!same(k, key_of("a", "{\"model\":\"m\",\"input\":[1.0,{\"x\":1,\"y\":2}]}", 0)));
    ck_assert(!same(k, key_of("b", "{\"model\":\"m\",\"input\":[1,{\"x\":1,\"y\":2}]}", 0)));
    ck_assert(!same(
        k, key_of("a", "{\"model\":\"m\",\"input\":[1,{\"x\":1,\"y\":2}]}", CACHE_FORM_STREAM)));
    /* Strings are length-prefixed: no two splits hash the same. */
    ck_assert(!same(key_of("a", "[\"ab\",\"c\"]", 0), key_of("a", "[\"a\",\"bc\"]", 0)));
}
END_TEST

static struct cache_fill *fill_of(size_t n, size_t max)
{
    struct cache_fill *f = cache_fill_new(max);
    char *buf = calloc(1, n);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(cache_fill_add(f, "ev", buf, n, NULL, 0), 0);
    free(buf);
    return f;
}

START_TEST(test_cache__lru_keeps_the_byte_cap)
{
    struct cache *c = cache_new(10000);
    struct cache_stats st;
    struct cache_key k[40];

    for (int i = 0; i < 40; i++) {
        char json[32];
        snprintf(json, sizeof(json), "[%d]", i);
        k[i] = key_of("a", json, 0);
        cache_put(c, &k[i], fill_of(900, 4096), 0, 100);
        cache_get_stats(c, &st);
        ck_assert_uint_le(st.bytes, 10000);
        if (i == 5) /* keep the first entry recently used */
            ck_assert_ptr_nonnull(cache_get(c, &k[0], 1, -1));
        if (i > 5)
            ck_assert_ptr_nonnull(cache_get(c, &k[0], 1, -1));
    }
    cache_get_stats(c, &st);
    ck_assert_uint_gt(st.evictions, 20);
    ck_assert_ptr_nonnull(cache_get(c, &k[39], 1, -1));
    ck_assert_ptr_nonnull(cache_get(c, &k[0], 1, -1)); /* used: kept */
    ck_assert_ptr_null(cache_get(c, &k[1], 1, -1));    /* least recently used: gone */
    /* Larger than the whole cache: not stored, nothing evicted for it. */
    size_t before = st.entries;
    cache_put(c, &k[1], fill_of(20000, 65536), 0, 100);
    cache_get_stats(c, &st);
    ck_assert_uint_eq(st.entries, before);
    ck_assert_uint_eq(st.too_big, 1);
    /* A smaller cap evicts at once. */
    cache_set_max_bytes(c, 2000);
    cache_get_stats(c, &st);
    ck_assert_uint_le(st.bytes, 2000);
    cache_purge(c);
    cache_get_stats(c, &st);
    ck_assert_uint_eq(st.bytes, 0);
    ck_assert_uint_eq(st.entries, 0);
    cache_free(c);
}
END_TEST

START_TEST(test_cache__expiry_and_max_age)
{
    struct cache *c = cache_new(1 << 20);
    struct cache_key k = key_of("a", "{}", 0);
    struct cache_stats st;

    cache_put(c, &k, fill_of(10, 100), 100, 160);
    ck_assert_ptr_nonnull(cache_get(c, &k, 159.9, -1));
    ck_assert_ptr_nonnull(cache_get(c, &k, 130, 30));
    ck_assert_ptr_null(cache_get(c, &k, 130.5, 30)); /* too old for this client */
    ck_assert_ptr_nonnull(cache_get(c, &k, 130.5, -1));
    ck_assert_ptr_null(cache_get(c, &k, 160, -1)); /* expired: dropped */
    cache_get_stats(c, &st);
    ck_assert_uint_eq(st.expired, 1);
    ck_assert_uint_eq(st.entries, 0);
    cache_free(c);
}
END_TEST

START_TEST(test_cache__records_round_trip_and_fills_are_bounded)
{
    struct cache *c = cache_new(1 << 20);
    struct cache_key k = key_of("a", "{}", 0);
    struct cache_fill *f = cache_fill_new(1000);
    struct cache_rec r;
    size_t pos = 0;

    ck_assert_int_eq(cache_fill_add(f, "message_start", "{\"a\":1}", 7, "\x81", 1), 0);
    ck_assert_int_eq(cache_fill_add(f, NULL, "[DONE]", 6, NULL, 0), 0);
    cache_put(c, &k, f, 0, 10);
    const struct cache_entry *e = cache_get(c, &k, 1, -1);
    ck_assert_ptr_nonnull(e);
    ck_assert(cache_entry_next(e, &pos, &r));
    ck_assert_str_eq(r.name, "message_start");
    ck_assert_int_eq(r.a_len, 7);
    ck_assert(memcmp(r.a, "{\"a\":1}", 7) == 0);
    ck_assert_int_eq(r.b_len, 1);
    ck_assert(cache_entry_next(e, &pos, &r));
    ck_assert_ptr_null(r.name);
    ck_assert_int_eq(r.a_len, 6);
    ck_assert(!cache_entry_next(e, &pos, &r));

    /* Past its bound a fill keeps nothing and is never stored. */
    f = cache_fill_new(100);
    char big[200] = { 0 };
    ck_assert_int_eq(cache_fill_add(f, NULL, big, 50, NULL, 0), 0);
    ck_assert_int_eq(cache_fill_add(f, NULL, big, 60, NULL, 0), -1);
    ck_assert_int_eq(cache_fill_add(f, NULL, big, 1, NULL, 0), -1);
    struct cache_key k2 = key_of("b", "{}", 0);
    cache_put(c, &k2, f, 0, 10);
    ck_assert_ptr_null(cache_get(c, &k2, 1, -1));
    cache_free(c);
}
END_TEST

START_TEST(test_cache__cache_control)
{
    enum cache_mode m = CACHE_USE;
    bool has = false;
    double age = -1;

    ck_assert_int_eq(cache_parse_mode("no-store", &m, &has, &age), 0);
    ck_assert_int_eq(m, CACHE_NO_STORE);
    m = CACHE_USE;
    ck_assert_int_eq(cache_parse_mode("No-Cache, max-age=30", &m, &has, &age), 0);
    ck_assert_int_eq(m, CACHE_NO_CACHE);
    ck_assert(has);
    ck_assert(age == 30);
    m = CACHE_USE;
    has = false;
    ck_assert_int_eq(cache_parse_mode("no-storey, max-age=x", &m, &has, &age), -1);
    ck_assert_int_eq(m, CACHE_USE);
    ck_assert(!has);

    ck_assert(cache_upstream_ttl(NULL, 60) == 60);
    ck_assert(cache_upstream_ttl("", 60) == 60);
    ck_assert(cache_upstream_ttl("no-store", 60) == 0);
    ck_assert(cache_upstream_ttl("public, private", 60) == 0);
    ck_assert(cache_upstream_ttl("no-cache, must-revalidate", 60) == 60);
    ck_assert(cache_upstream_ttl("max-age=5", 60) == 5);
    ck_assert(cache_upstream_ttl("max-age=500", 60) == 60);
    ck_assert(cache_upstream_ttl("public, max-age=0", 60) == 0);
}
END_TEST

/* A 100-byte fill tagged (capability, ns). */
static struct cache_fill *tagged(const char *capability, const char *ns)
{
    struct cache_fill *f = fill_of(100, 4096);
    ck_assert_int_eq(cache_fill_tag(f, capability, ns), 0);
    return f;
}

START_TEST(test_cache__purge_by_capability_and_namespace)
{
    struct cache *c = cache_new(1 << 20);
    struct cache_key k[6];
    struct cache_stats st;
    static const char *const tags[6][2] = { { "chat", "a" },      { "chat", "b" },
                                            { "embedding", "a" }, { "embedding", "b" },
                                            { "chat", "" },       { NULL, NULL } };

    for (int i = 0; i < 6; i++) {
        char json[16];
        snprintf(json, sizeof(json), "[%d]", i);
        k[i] = key_of("a", json, 0);
        cache_put(c, &k[i], tags[i][0] ? tagged(tags[i][0], tags[i][1]) : fill_of(100, 4096), 0,
                  100);
    }
    /* Nothing matches: nothing dropped. */
    ck_assert_uint_eq(cache_purge_match(c, "nope", NULL), 0);
    ck_assert_uint_eq(cache_purge_match(c, NULL, "z"), 0);
    /* One app in one capability. */
    ck_assert_uint_eq(cache_purge_match(c, "chat", "a"), 1);
    ck_assert_ptr_null(cache_get(c, &k[0], 1, -1));
    ck_assert_ptr_nonnull(cache_get(c, &k[1], 1, -1));
    /* One app everywhere: the shared ("") and untagged entries stay. */
    ck_assert_uint_eq(cache_purge_match(c, NULL, "b"), 2);
    ck_assert_ptr_null(cache_get(c, &k[3], 1, -1));
    ck_assert_ptr_nonnull(cache_get(c, &k[2], 1, -1));
    ck_assert_ptr_nonnull(cache_get(c, &k[4], 1, -1));
    /* One capability, shared entries included; the bytes go with them. */
    ck_assert_uint_eq(cache_purge_match(c, "chat", NULL), 1);
    ck_assert_ptr_null(cache_get(c, &k[4], 1, -1));
    /* Everything, the untagged entry included. */
    ck_assert_uint_eq(cache_purge_match(c, NULL, NULL), 2);
    cache_get_stats(c, &st);
    ck_assert_uint_eq(st.entries, 0);
    ck_assert_uint_eq(st.bytes, 0);
    ck_assert_uint_eq(st.purged, 6);
    cache_free(c);
}
END_TEST

START_TEST(test_cache__fill_from_bytes_checks_them)
{
    struct cache_fill *f = fill_of(10, 4096), *g;
    struct cache_key k = key_of("a", "{}", 0), k2 = key_of("b", "{}", 0);
    struct cache *c = cache_new(1 << 20);
    struct cache_rec r;
    size_t len, pos = 0;
    char hex[2 * CACHE_KEY_BYTES + 1], bad[64];

    cache_key_hex(&k, hex);
    ck_assert_uint_eq(strlen(hex), 64);
    ck_assert_uint_eq(strspn(hex, "0123456789abcdef"), 64);
    const char *bytes = cache_fill_bytes(f, &len);
    ck_assert_uint_eq(len, 3 * 4 + 3 + 10);
    /* Every truncation, and lengths past the end, are refused. */
    for (size_t n = 0; n < len; n++)
        ck_assert_ptr_null(cache_fill_from(bytes, n, 4096));
    memcpy(bad, bytes, len);
    bad[0] = 100; /* the name's length past the end */
    ck_assert_ptr_null(cache_fill_from(bad, len, 4096));
    memcpy(bad, bytes, len);
    bad[4 + 2] = 'x'; /* the name without its NUL */
    ck_assert_ptr_null(cache_fill_from(bad, len, 4096));
    ck_assert_ptr_null(cache_fill_from(bytes, len, len - 1)); /* over the bound */
    /* The bytes as they were: the same records. */
    ck_assert_ptr_nonnull(g = cache_fill_from(bytes, len, 4096));
    cache_put(c, &k2, g, 0, 10);
    const struct cache_entry *e = cache_get(c, &k2, 1, -1);
    ck_assert_ptr_nonnull(e);
    ck_assert(cache_entry_next(e, &pos, &r));
    ck_assert_str_eq(r.name, "ev");
    ck_assert_uint_eq(r.a_len, 10);
    ck_assert(!cache_entry_next(e, &pos, &r));
    cache_fill_free(f);
    cache_free(c);
}
END_TEST

/* A shared name says its capability and namespace in hex; a purge's
 * pattern (as Redis' MATCH reads it, fnmatch here) finds exactly them. */
START_TEST(test_cache__shared_names_match_their_purge)
{
    struct cache_key k = key_of("a", "{}", 0);
    char name[CACHE_SHARED_NAME_LEN + 1], other[CACHE_SHARED_NAME_LEN + 1], hex[65], pat[65];

    cache_shared_name(&k, "chat", "app1", name);
    cache_shared_name(&k, "embedding", "", other);
    cache_key_hex(&k, hex);
    ck_assert_uint_eq(strlen(name), 64);
    ck_assert_uint_eq(strspn(name, "0123456789abcdef"), 64);
    ck_assert_mem_eq(name + 16, hex, 48);
    ck_assert_str_ne(name, other);
    static const struct {
        const char *cap, *ns;
        bool name, other;
    } cases[] = {
        { NULL, NULL, true, true },       { "chat", NULL, true, false },
        { NULL, "app1", true, false },    { "chat", "app1", true, false },
        { "chat", "app2", false, false }, { "embedding", NULL, false, true },
        { NULL, "app2", false, false },   { "embedding", "app1", false, false },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cache_shared_pattern(cases[i].cap, cases[i].ns, pat);
        ck_assert_uint_eq(strspn(pat, "0123456789abcdef?*"), strlen(pat));
        ck_assert_msg((fnmatch(pat, name, 0) == 0) == cases[i].name, "%s %s", pat, name);
        ck_assert_msg((fnmatch(pat, other, 0) == 0) == cases[i].other, "%s %s", pat, other);
    }
}
END_TEST

Suite *cache_suite(void)
{
    Suite *s = suite_create("cache");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_cache__key_is_canonical_and_scoped);
    tcase_add_test(tc, test_cache__lru_keeps_the_byte_cap);
    tcase_add_test(tc, test_cache__expiry_and_max_age);
    tcase_add_test(tc, test_cache__records_round_trip_and_fills_are_bounded);
    tcase_add_test(tc, test_cache__cache_control);
    tcase_add_test(tc, test_cache__purge_by_capability_and_namespace);
    tcase_add_test(tc, test_cache__fill_from_bytes_checks_them);
    tcase_add_test(tc, test_cache__shared_names_match_their_purge);
    suite_add_tcase(s, tc);
    return s;
}
