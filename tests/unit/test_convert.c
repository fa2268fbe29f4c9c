/* test_convert.c — OpenAI chat <-> Anthropic Messages (sidecar/codec/convert.c),
 * replaying tests/unit/vectors/convert.json (relative to the working
 * directory, or $POLYGW_CONVERT_VECTORS): every request, reply and stream
 * case goes JSON -> msgpack (as the sidecar parses it) -> conversion ->
 * JSON, and must equal the expected document. Plus the cases a vector
 * cannot state (a stream's state across events, a non-map reply). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "codec/convert.h"
#include "rpc.h"
#include "suites.h"
#include "codec/transcode.h"

#define CREATED 1700000000

static json_t *vectors(void)
{
    const char *p = getenv("POLYGW_CONVERT_VECTORS");
    json_error_t e;
    json_t *v = json_load_file(p && *p ? p : "tests/unit/vectors/convert.json", 0, &e);
    ck_assert_msg(v != NULL, "cannot load the vectors: %s (line %d)", e.text, e.line);
    return v;
}

/* A JSON value as msgpack, unpacked into `up` (which the caller destroys
 * along with `sb`). */
static const msgpack_object *to_msgpack(json_t *j, msgpack_sbuffer *sb, msgpack_unpacked *up)
{
    char *text = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    ck_assert_int_eq(transcode_json_to_msgpack(text, strlen(text), &pk, NULL, NULL, 0), 0);
    free(text);
    msgpack_unpacked_init(up);
    ck_assert(msgpack_unpack_next(up, sb->data, sb->size, NULL) == MSGPACK_UNPACK_SUCCESS);
    return &up->data;
}

/* Asserts that the msgpack in `sb` is the JSON `want`. */
static void expect_json(const char *name, const msgpack_sbuffer *sb, json_t *want)
{
    msgpack_unpacked up;
    struct strbuf out;
    char err[200];

    msgpack_unpacked_init(&up);
    strbuf_init(&out);
    ck_assert(msgpack_unpack_next(&up, sb->data, sb->size, NULL) == MSGPACK_UNPACK_SUCCESS);
    ck_assert_int_eq(transcode_msgpack_to_json(&up.data, &out, NULL, "out", err, sizeof(err)), 0);
    json_t *got = json_loads(out.data, 0, NULL);
    char *w = json_dumps(want, JSON_COMPACT | JSON_SORT_KEYS);
    char *g = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS);
    ck_assert_msg(json_equal(got, want), "%s:\n got %s\nwant %s", name, g, w);
    free(w);
    free(g);
    json_decref(got);
    strbuf_fini(&out);
    msgpack_unpacked_destroy(&up);
}

/* One conversion: its input as msgpack and a packer for its output. */
struct io {
    msgpack_sbuffer in, out;
    msgpack_unpacked up;
    msgpack_packer pk;
    const msgpack_object *obj; /* the input */
};

static void io_begin(struct io *io, json_t *in)
{
    io->obj = to_msgpack(in, &io->in, &io->up);
    msgpack_sbuffer_init(&io->out);
    msgpack_packer_init(&io->pk, &io->out, msgpack_sbuffer_write);
}

static void io_end(struct io *io)
{
    msgpack_sbuffer_destroy(&io->out);
    msgpack_unpacked_destroy(&io->up);
    msgpack_sbuffer_destroy(&io->in);
}

START_TEST(test_convert__request_vectors)
{
    json_t *v = vectors(), *c;
    size_t i;
    json_array_foreach(json_object_get(v, "request"), i, c)
    {
        const char *name = json_string_value(json_object_get(c, "name"));
        struct io io;
        char err[256] = "";
        io_begin(&io, json_object_get(c, "in"));
        int rc = convert_chat_request(io.obj, &io.pk, err, sizeof(err));
        json_t *want_err = json_object_get(c, "error");
        if (want_err) {
            ck_assert_msg(rc == CONVERT_EUNSUPPORTED, "%s: accepted", name);
            ck_assert_msg(strstr(err, json_string_value(want_err)) != NULL, "%s: reason '%s'", name,
                          err);
        } else {
            ck_assert_msg(rc == 0, "%s: refused: %s", name, err);
            expect_json(name, &io.out, json_object_get(c, "out"));
        }
        io_end(&io);
    }
    ck_assert_uint_ge(i, 8);
    json_decref(v);
}
END_TEST

START_TEST(test_convert__reply_vectors)
{
    json_t *v = vectors(), *c;
    size_t i;
    json_array_foreach(json_object_get(v, "reply"), i, c)
    {
        const char *name = json_string_value(json_object_get(c, "name"));
        struct io io;
        io_begin(&io, json_object_get(c, "in"));
        int rc = convert_chat_reply(io.obj, CREATED, &io.pk);
        if (json_is_true(json_object_get(c, "refused"))) {
            ck_assert_msg(rc == CONVERT_EREPLY, "%s: converted", name);
            ck_assert_msg(io.out.size == 0, "%s: packed", name);
        } else {
            ck_assert_msg(rc == 0, "%s: refused", name);
            expect_json(name, &io.out, json_object_get(c, "out"));
        }
        io_end(&io);
    }
    ck_assert_uint_ge(i, 2);
    json_decref(v);
}
END_TEST

START_TEST(test_convert__stream_vectors)
{
    json_t *v = vectors(), *c;
    size_t i;
    json_array_foreach(json_object_get(v, "stream"), i, c)
    {
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *outs = json_object_get(c, "out"), *ev;
        struct convert_stream st;
        size_t j, made = 0;
        convert_stream_init(&st, CREATED, json_is_true(json_object_get(c, "include_usage")));
        json_array_foreach(json_object_get(c, "in"), j, ev)
        {
            struct io io;
            io_begin(&io, ev);
            if (convert_chat_event(&st, io.obj, &io.pk)) {
                ck_assert_msg(made < json_array_size(outs), "%s: too many chunks", name);
                expect_json(name, &io.out, json_array_get(outs, made));
                made++;
            } else {
                ck_assert_msg(io.out.size == 0, "%s: event %zu packed without a chunk", name, j);
            }
            io_end(&io);
        }
        ck_assert_msg(made == json_array_size(outs), "%s: %zu chunks, want %zu", name, made,
                      json_array_size(outs));
    }
    json_decref(v);
}
END_TEST

START_TEST(test_convert__reply_not_a_map)
{
    msgpack_sbuffer out;
    msgpack_packer pk;
    msgpack_object nil = { .type = MSGPACK_OBJECT_NIL };
    msgpack_sbuffer_init(&out);
    msgpack_packer_init(&pk, &out, msgpack_sbuffer_write);
    ck_assert_int_eq(convert_chat_reply(&nil, CREATED, &pk), CONVERT_EREPLY);
    ck_assert_uint_eq(out.size, 0);
    ck_assert_int_eq(convert_chat_request(&nil, &pk, NULL, 0), CONVERT_EUNSUPPORTED);
    msgpack_sbuffer_destroy(&out);
}
END_TEST

/* 2^64 - 1 has no JSON form the sidecar parses (integers must fit in
 * int64), so these events are packed directly: a reply's usage is left
 * out, a stream has no usage chunk. */
static void pack_usage_u64(msgpack_packer *pk, const char *name, uint64_t v)
{
    msgpack_pack_map(pk, 1);
    rpc_pack_str(pk, name);
    msgpack_pack_uint64(pk, v);
}

START_TEST(test_convert__usage_of_uint64_max_left_out)
{
    msgpack_sbuffer in, out;
    msgpack_packer pk, opk;
    msgpack_unpacked up;
    struct convert_stream st;

    msgpack_sbuffer_init(&in);
    msgpack_sbuffer_init(&out);
    msgpack_packer_init(&pk, &in, msgpack_sbuffer_write);
    msgpack_packer_init(&opk, &out, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    rpc_pack_kv_str(&pk, "type", "message");
    rpc_pack_str(&pk, "content");
    msgpack_pack_array(&pk, 0);
    rpc_pack_str(&pk, "usage");
    pack_usage_u64(&pk, "input_tokens", UINT64_MAX);
    msgpack_unpacked_init(&up);
    ck_assert(msgpack_unpack_next(&up, in.data, in.size, NULL) == MSGPACK_UNPACK_SUCCESS);
    ck_assert_int_eq(convert_chat_reply(&up.data, CREATED, &opk), 0);
    msgpack_unpacked_destroy(&up);
    msgpack_unpacked_init(&up);
    ck_assert(msgpack_unpack_next(&up, out.data, out.size, NULL) == MSGPACK_UNPACK_SUCCESS);
    ck_assert(rpc_map_get(&up.data, "choices") != NULL);
    ck_assert(rpc_map_get(&up.data, "usage") == NULL);
    msgpack_unpacked_destroy(&up);

    convert_stream_init(&st, CREATED, true);
    msgpack_sbuffer_clear(&in);
    msgpack_pack_map(&pk, 2);
    rpc_pack_kv_str(&pk, "type", "message_delta");
    rpc_pack_str(&pk, "usage");
    pack_usage_u64(&pk, "output_tokens", UINT64_MAX);
    msgpack_unpacked_init(&up);
    ck_assert(msgpack_unpack_next(&up, in.data, in.size, NULL) == MSGPACK_UNPACK_SUCCESS);
    ck_assert_int_eq(convert_chat_event(&st, &up.data, &opk), 1);
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_clear(&out);
    msgpack_sbuffer_clear(&in);
    msgpack_pack_map(&pk, 1);
    rpc_pack_kv_str(&pk, "type", "message_stop");
    msgpack_unpacked_init(&up);
    ck_assert(msgpack_unpack_next(&up, in.data, in.size, NULL) == MSGPACK_UNPACK_SUCCESS);
    ck_assert_int_eq(convert_chat_event(&st, &up.data, &opk), 0);
    ck_assert_uint_eq(out.size, 0);
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&in);
    msgpack_sbuffer_destroy(&out);
}
END_TEST

START_TEST(test_convert__long_id_and_model_truncated_safely)
{
    char big[600];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    json_t *ev =
        json_pack("{s:s,s:{s:s,s:s}}", "type", "message_start", "message", "id", big, "model", big);
    struct io io;
    struct convert_stream st;
    convert_stream_init(&st, CREATED, false);
    io_begin(&io, ev);
    ck_assert_int_eq(convert_chat_event(&st, io.obj, &io.pk), 1);
    ck_assert_uint_eq(strlen(st.id), sizeof(st.id) - 1);
    ck_assert_uint_eq(strlen(st.model), sizeof(st.model) - 1);
    io_end(&io);
    json_decref(ev);
}
END_TEST

Suite *convert_suite(void)
{
    Suite *s = suite_create("convert");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_convert__request_vectors);
    tcase_add_test(tc, test_convert__reply_vectors);
    tcase_add_test(tc, test_convert__stream_vectors);
    tcase_add_test(tc, test_convert__reply_not_a_map);
    tcase_add_test(tc, test_convert__long_id_and_model_truncated_safely);
    tcase_add_test(tc, test_convert__usage_of_uint64_max_left_out);
    suite_add_tcase(s, tc);
    return s;
}
