/* test_writer.c — the reply writer (sidecar/codec/writer.h): the same
 * writes through the msgpack and the JSON writer give the same value (the
 * JSON read back by the transcoder), counts close containers, and errors
 * are sticky. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "codec/transcode.h"
#include "codec/writer.h"
#include "suites.h"

typedef void write_fn(struct writer *w);

/* Writes through both writers; the JSON, read back into msgpack, equals
 * the msgpack writer's value. Returns the JSON writer's text in `json`. */
static void check_same(write_fn *fn, struct strbuf *json)
{
    msgpack_sbuffer a, b;
    msgpack_packer pa, pb;
    struct writer w;
    char why[200] = "";

    msgpack_sbuffer_init(&a);
    msgpack_sbuffer_init(&b);
    msgpack_packer_init(&pa, &a, msgpack_sbuffer_write);
    msgpack_packer_init(&pb, &b, msgpack_sbuffer_write);
    writer_init_msgpack(&w, &pa);
    fn(&w);
    ck_assert_int_eq(w.err, 0);
    writer_init_json(&w, json);
    fn(&w);
    ck_assert_int_eq(w.err, 0);
    ck_assert_int_eq(w.depth, 0);
    ck_assert_msg(transcode_json_to_msgpack(json->data, json->len, &pb, NULL, why, sizeof(why)) ==
                      0,
                  "%s: %.*s", why, (int)json->len, json->data);

    msgpack_unpacked ua, ub;
    msgpack_unpacked_init(&ua);
    msgpack_unpacked_init(&ub);
    ck_assert(msgpack_unpack_next(&ua, a.data, a.size, NULL) == MSGPACK_UNPACK_SUCCESS);
    ck_assert(msgpack_unpack_next(&ub, b.data, b.size, NULL) == MSGPACK_UNPACK_SUCCESS);
    ck_assert_msg(msgpack_object_equal(ua.data, ub.data), "differs: %.*s", (int)json->len,
                  json->data);
    msgpack_unpacked_destroy(&ua);
    msgpack_unpacked_destroy(&ub);
    msgpack_sbuffer_destroy(&a);
    msgpack_sbuffer_destroy(&b);
}

static void write_nested(struct writer *w)
{
    writer_map(w, 9);
    writer_kv_str(w, "code", "task_stopped");
    writer_kv_text(w, "quoted", "a\"b\\c\n\x01 \xc3\xa9");
    writer_kv_u64(w, "big", (uint64_t)INT64_MAX); /* the transcoder reads int64 */
    writer_kv_i64(w, "neg", INT64_MIN);
    writer_kv_double(w, "half", 0.5);
    writer_kv_bool(w, "yes", true);
    writer_str(w, "none");
    writer_nil(w);
    writer_str(w, "list");
    writer_array(w, 4);
    writer_map(w, 0);
    writer_array(w, 0);
    writer_array(w, 2);
    writer_u64(w, 1);
    writer_map(w, 1);
    writer_kv_double(w, "x", 1.0);
    writer_i64(w, -3);
    writer_str(w, "raw");
    writer_raw_json(w, "{\"usage\": {\"total_tokens\": 7}, \"s\": [true, null, 1e3]}", 54);
}

START_TEST(test_same_value)
{
    struct strbuf json;
    strbuf_init(&json);
    check_same(write_nested, &json);
    static const char head[] = "{\"code\":\"task_stopped\",\"quoted\":\"a\\\"b\\\\c\\n\\u0001 ";
    ck_assert(strncmp(json.data, head, sizeof(head) - 1) == 0);
    strbuf_fini(&json);
}
END_TEST

static void write_scalar(struct writer *w)
{
    writer_str(w, "alone");
}

static void write_empty(struct writer *w)
{
    writer_map(w, 0);
}

START_TEST(test_top_level)
{
    struct strbuf json;
    strbuf_init(&json);
    check_same(write_scalar, &json);
    ck_assert_str_eq(json.data ? (json.data[json.len] = 0, json.data) : "", "\"alone\"");
    strbuf_reset(&json);
    check_same(write_empty, &json);
    json.data[json.len] = 0;
    ck_assert_str_eq(json.data, "{}");
    strbuf_fini(&json);
}
END_TEST

/* Invalid UTF-8 in a client's text comes out repaired, alike in both. */
static void write_bad_text(struct writer *w)
{
    writer_map(w, 1);
    writer_kv_text(w, "reason", "ok\xff\xc3");
}

START_TEST(test_text_repaired)
{
    struct strbuf json;
    strbuf_init(&json);
    check_same(write_bad_text, &json);
    json.data[json.len] = 0;
    ck_assert_str_eq(json.data, "{\"reason\":\"ok\xef\xbf\xbd\xef\xbf\xbd\"}");
    strbuf_fini(&json);
}
END_TEST

START_TEST(test_errors_sticky)
{
    struct strbuf json;
    struct writer w;
    strbuf_init(&json);

    writer_init_json(&w, &json);
    writer_array(&w, 2);
    writer_double(&w, NAN);
    writer_u64(&w, 1);
    ck_assert_int_eq(w.err, WRITER_EINVALID);

    writer_init_json(&w, &json);
    writer_array(&w, 1);
    writer_u64(&w, 1);
    writer_u64(&w, 2); /* past the count: a second top-level value */
    ck_assert_int_eq(w.err, WRITER_EINVALID);

    writer_init_json(&w, &json);
    for (int i = 0; i <= WRITER_MAX_DEPTH; i++)
        writer_array(&w, 1);
    ck_assert_int_eq(w.err, WRITER_ETOO_DEEP);

    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    writer_init_msgpack(&w, &pk);
    writer_array(&w, 2);
    writer_raw_json(&w, "{not json", 9); /* travels as a string */
    ck_assert_int_eq(w.err, 0);
    writer_double(&w, INFINITY);
    ck_assert_int_eq(w.err, WRITER_EINVALID);
    msgpack_sbuffer_destroy(&sb);
    strbuf_fini(&json);
}
END_TEST

/* Members spliced from another object's JSON text (the backend's stats). */
START_TEST(test_raw_members)
{
    struct strbuf json;
    struct writer w;
    strbuf_init(&json);

    writer_init_json(&w, &json);
    writer_map(&w, 3);
    writer_kv_u64(&w, "a", 1);
    writer_raw_json_members(&w, "{\"b\":[2],\"c\":{}}", 16, 2);
    ck_assert_int_eq(w.err, 0);
    ck_assert_int_eq(w.depth, 0);
    json.data[json.len] = 0;
    ck_assert_str_eq(json.data, "{\"a\":1,\"b\":[2],\"c\":{}}");

    writer_init_json(&w, &json);
    writer_map(&w, 1);
    writer_raw_json_members(&w, "{\"b\":1,\"c\":2}", 13, 2); /* more than the map holds */
    ck_assert_int_eq(w.err, WRITER_EINVALID);
    strbuf_fini(&json);
}
END_TEST

Suite *writer_suite(void)
{
    Suite *s = suite_create("writer");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_same_value);
    tcase_add_test(tc, test_top_level);
    tcase_add_test(tc, test_text_repaired);
    tcase_add_test(tc, test_errors_sticky);
    tcase_add_test(tc, test_raw_members);
    suite_add_tcase(s, tc);
    return s;
}
