/* test_converse.c — Anthropic Messages <-> Bedrock Converse
 * (sidecar/codec/converse.c): each case goes JSON -> msgpack (as the
 * sidecar parses it) -> translation -> JSON, compared with the expected
 * document; a stream's events are translated in order through one state. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "codec/converse.h"
#include "rpc.h"
#include "suites.h"
#include "codec/transcode.h"

/* One translation: its input as msgpack and a packer for its output. */
struct io {
    msgpack_sbuffer in, out;
    msgpack_unpacked up;
    msgpack_packer pk;
    const msgpack_object *obj;
};

static void io_begin(struct io *io, const char *json)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(&io->in);
    msgpack_packer_init(&pk, &io->in, msgpack_sbuffer_write);
    ck_assert_int_eq(transcode_json_to_msgpack(json, strlen(json), &pk, NULL, NULL, 0), 0);
    msgpack_unpacked_init(&io->up);
    ck_assert(msgpack_unpack_next(&io->up, io->in.data, io->in.size, NULL) ==
              MSGPACK_UNPACK_SUCCESS);
    io->obj = &io->up.data;
    msgpack_sbuffer_init(&io->out);
    msgpack_packer_init(&io->pk, &io->out, msgpack_sbuffer_write);
}

static void io_end(struct io *io)
{
    msgpack_unpacked_destroy(&io->up);
    msgpack_sbuffer_destroy(&io->in);
    msgpack_sbuffer_destroy(&io->out);
}

/* Asserts that the `n` msgpack values in io->out are the JSON array `want`. */
static void expect_values(struct io *io, int n, const char *want_json)
{
    json_t *want = json_loads(want_json, 0, NULL);
    json_t *got = json_array();
    size_t off = 0;

    ck_assert_msg(want != NULL, "bad expected JSON: %s", want_json);
    for (int i = 0; i < n; i++) {
        msgpack_unpacked up;
        struct strbuf out;
        msgpack_unpacked_init(&up);
        strbuf_init(&out);
        ck_assert(msgpack_unpack_next(&up, io->out.data, io->out.size, &off) ==
                  MSGPACK_UNPACK_SUCCESS);
        ck_assert_int_eq(transcode_msgpack_to_json(&up.data, &out, NULL, "out", NULL, 0), 0);
        json_array_append_new(got, json_loads(out.data, 0, NULL));
        strbuf_fini(&out);
        msgpack_unpacked_destroy(&up);
    }
    ck_assert_uint_eq(off, io->out.size); /* nothing more was packed */
    char *w = json_dumps(want, JSON_COMPACT | JSON_SORT_KEYS);
    char *g = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS);
    ck_assert_msg(json_equal(got, want), "\n got %s\nwant %s", g, w);
    free(w);
    free(g);
    json_decref(want);
    json_decref(got);
}

START_TEST(test_converse__request_translated)
{
    struct io io;
    char err[200];
    io_begin(&io,
             "{\"model\":\"m\",\"stream\":true,\"anthropic_version\":\"x\","
             "\"metadata\":{\"user_id\":\"u\"},\"max_tokens\":100,\"temperature\":0.2,"
             "\"top_p\":1,\"top_k\":5,\"stop_sequences\":[\"a\",\"b\"],"
             "\"system\":[{\"type\":\"text\",\"text\":\"s1\"},{\"type\":\"text\",\"text\":"
             "\"s2\"}],\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
             "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"yo\"}]},"
             "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
             "{\"type\":\"text\",\"text\":\"b\"}]}],\"tools\":null}");
    ck_assert_int_eq(converse_request(io.obj, &io.pk, err, sizeof(err)), 0);
    expect_values(&io, 1,
                  "[{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"hi\"}]},"
                  "{\"role\":\"assistant\",\"content\":[{\"text\":\"yo\"}]},"
                  "{\"role\":\"user\",\"content\":[{\"text\":\"a\"},{\"text\":\"b\"}]}],"
                  "\"system\":[{\"text\":\"s1\"},{\"text\":\"s2\"}],"
                  "\"inferenceConfig\":{\"maxTokens\":100,\"temperature\":0.2,\"topP\":1,"
                  "\"stopSequences\":[\"a\",\"b\"]},"
                  "\"additionalModelRequestFields\":{\"top_k\":5}}]");
    io_end(&io);

    /* The least: messages only. */
    io_begin(&io, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}");
    ck_assert_int_eq(converse_request(io.obj, &io.pk, err, sizeof(err)), 0);
    expect_values(&io, 1, "[{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]}]");
    io_end(&io);
}
END_TEST

START_TEST(test_converse__request_refusals_name_the_key)
{
    static const struct {
        const char *body, *want;
    } cases[] = {
        { "[1]", "body: expected a map" },
        { "{}", "body.messages: no user or assistant message" },
        { "{\"messages\":[]}", "body.messages: expected a list" },
        { "{\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", "only user and assistant" },
        { "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\"}]}]}",
          "only text content" },
        { "{\"messages\":[{\"role\":\"user\"}]}", "only text content" },
        { "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[]}",
          "body.tools: cannot be sent" },
        { "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{}}",
          "body.thinking: cannot be sent" },
        { "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}",
          "body.max_tokens: must be a positive integer" },
        { "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1.5}",
          "body.max_tokens: must be a positive integer" },
        { "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"hot\"}",
          "body.temperature: must be a number" },
        { "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop_sequences\":\"a\"}",
          "body.stop_sequences: must be a list of strings" },
        { "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"system\":5}",
          "body.system: must be text" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct io io;
        char err[200] = "";
        io_begin(&io, cases[i].body);
        ck_assert_int_eq(converse_request(io.obj, &io.pk, err, sizeof(err)), CONVERT_EUNSUPPORTED);
        ck_assert_msg(strstr(err, cases[i].want) != NULL, "%s: got '%s', want '%s'", cases[i].body,
                      err, cases[i].want);
        io_end(&io);
    }
}
END_TEST

START_TEST(test_converse__reply_translated)
{
    struct io io;
    io_begin(&io,
             "{\"output\":{\"message\":{\"role\":\"assistant\",\"content\":["
             "{\"reasoningContent\":{}},{\"text\":\"he\"},{\"text\":\"llo\"}]}},"
             "\"stopReason\":\"guardrail_intervened\",\"usage\":{\"inputTokens\":3,"
             "\"outputTokens\":4,\"totalTokens\":9,\"cacheReadInputTokens\":2},"
             "\"metrics\":{\"latencyMs\":1}}");
    ck_assert_int_eq(converse_reply(io.obj, &io.pk), 0);
    expect_values(&io, 1,
                  "[{\"id\":\"msg_converse\",\"type\":\"message\",\"role\":\"assistant\","
                  "\"content\":[{\"type\":\"text\",\"text\":\"he\"},{\"type\":\"text\","
                  "\"text\":\"llo\"}],\"stop_reason\":\"refusal\",\"stop_sequence\":null,"
                  "\"usage\":{\"input_tokens\":3,\"output_tokens\":4,"
                  "\"cache_read_input_tokens\":2}}]");
    io_end(&io);

    /* No usage, a stop reason passed as it is. */
    io_begin(&io, "{\"output\":{\"message\":{\"content\":[]}},\"stopReason\":\"max_tokens\"}");
    ck_assert_int_eq(converse_reply(io.obj, &io.pk), 0);
    expect_values(&io, 1,
                  "[{\"id\":\"msg_converse\",\"type\":\"message\",\"role\":\"assistant\","
                  "\"content\":[],\"stop_reason\":\"max_tokens\",\"stop_sequence\":null}]");
    io_end(&io);

    /* A long reason of multibyte characters is cut between two of them
     * (each "\u00e9" is 2 bytes: 19 fit in 39). */
    io_begin(&io,
             "{\"output\":{\"message\":{\"content\":[]}},\"stopReason\":"
             "\"\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9"
             "\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\"}");
    ck_assert_int_eq(converse_reply(io.obj, &io.pk), 0);
    expect_values(&io, 1,
                  "[{\"id\":\"msg_converse\",\"type\":\"message\",\"role\":\"assistant\","
                  "\"content\":[],\"stop_reason\":\"\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9"
                  "\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9"
                  "\u00e9\",\"stop_sequence\":null}]");
    io_end(&io);

    static const char *const not_converse[] = {
        "[]",
        "\"x\"",
        "{}",
        "{\"output\":{}}",
        "{\"output\":{\"message\":{\"content\":5}}}",
        "{\"type\":\"message\",\"content\":[]}",
    };
    for (size_t i = 0; i < sizeof(not_converse) / sizeof(not_converse[0]); i++) {
        io_begin(&io, not_converse[i]);
        ck_assert_int_eq(converse_reply(io.obj, &io.pk), CONVERT_EREPLY);
        ck_assert_uint_eq(io.out.size, 0);
        io_end(&io);
    }
}
END_TEST

static int event(struct converse_stream *st, const char *type, const char *payload,
                 const char *want)
{
    struct io io;
    io_begin(&io, payload);
    int n = converse_event(st, type, strlen(type), io.obj, &io.pk);
    if (n >= 0)
        expect_values(&io, n, want);
    io_end(&io);
    return n;
}

START_TEST(test_converse__stream_translated_in_order)
{
    struct converse_stream st;
    converse_stream_init(&st);
    ck_assert_int_eq(event(&st, "messageStart", "{\"role\":\"assistant\"}",
                           "[{\"type\":\"message_start\",\"message\":{\"id\":\"msg_converse\","
                           "\"type\":\"message\",\"role\":\"assistant\",\"content\":[],"
                           "\"stop_reason\":null,\"stop_sequence\":null}}]"),
                     1);
    /* The first delta of a block opens it; the next does not. */
    ck_assert_int_eq(event(&st, "contentBlockDelta",
                           "{\"contentBlockIndex\":0,\"delta\":{\"text\":\"a\"},\"p\":\"xyz\"}",
                           "[{\"type\":\"content_block_start\",\"index\":0,\"content_block\":"
                           "{\"type\":\"text\",\"text\":\"\"}},{\"type\":\"content_block_delta\","
                           "\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}]"),
                     2);
    ck_assert_int_eq(event(&st, "contentBlockDelta",
                           "{\"contentBlockIndex\":0,\"delta\":{\"text\":\"b\"}}",
                           "[{\"type\":\"content_block_delta\",\"index\":0,\"delta\":"
                           "{\"type\":\"text_delta\",\"text\":\"b\"}}]"),
                     1);
    /* Deltas that are not text, unknown events: nothing. */
    ck_assert_int_eq(event(&st, "contentBlockDelta",
                           "{\"contentBlockIndex\":0,\"delta\":{\"toolUse\":{}}}", "[]"),
                     0);
    ck_assert_int_eq(event(&st, "somethingNew", "[1]", "[]"), 0);
    ck_assert_int_eq(event(&st, "contentBlockStop", "{\"contentBlockIndex\":0}",
                           "[{\"type\":\"content_block_stop\",\"index\":0}]"),
                     1);
    /* A block started explicitly is not started again by its delta. */
    ck_assert_int_eq(event(&st, "contentBlockStart", "{\"contentBlockIndex\":1,\"start\":{}}",
                           "[{\"type\":\"content_block_start\",\"index\":1,\"content_block\":"
                           "{\"type\":\"text\",\"text\":\"\"}}]"),
                     1);
    ck_assert_int_eq(event(&st, "contentBlockDelta",
                           "{\"contentBlockIndex\":1,\"delta\":{\"text\":\"c\"}}",
                           "[{\"type\":\"content_block_delta\",\"index\":1,\"delta\":"
                           "{\"type\":\"text_delta\",\"text\":\"c\"}}]"),
                     1);
    ck_assert_int_eq(event(&st, "messageStop", "{\"stopReason\":\"content_filtered\"}", "[]"), 0);
    ck_assert_int_eq(
        event(&st, "metadata",
              "{\"usage\":{\"inputTokens\":5,\"outputTokens\":6,\"totalTokens\":11,"
              "\"cacheWriteInputTokens\":1},\"metrics\":{\"latencyMs\":9}}",
              "[{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"refusal\","
              "\"stop_sequence\":null},\"usage\":{\"input_tokens\":5,\"output_tokens\":6,"
              "\"cache_creation_input_tokens\":1}},{\"type\":\"message_stop\"}]"),
        2);
}
END_TEST

START_TEST(test_converse__payload_not_a_map_is_refused)
{
    static const char *const types[] = { "messageStart",      "contentBlockStart",
                                         "contentBlockDelta", "contentBlockStop",
                                         "messageStop",       "metadata" };
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        struct converse_stream st;
        converse_stream_init(&st);
        ck_assert_int_eq(event(&st, types[i], "[\"x\"]", "[]"), CONVERT_EREPLY);
        ck_assert_int_eq(event(&st, types[i], "null", "[]"), CONVERT_EREPLY);
    }
}
END_TEST

/* The whole chain an OpenAI client's stream takes: ConverseStream ->
 * Messages events -> chat.completion.chunk. */
START_TEST(test_converse__stream_converts_on_to_chat_chunks)
{
    static const char *const evs[][2] = {
        { "messageStart", "{\"role\":\"assistant\"}" },
        { "contentBlockDelta", "{\"contentBlockIndex\":0,\"delta\":{\"text\":\"hi\"}}" },
        { "contentBlockStop", "{\"contentBlockIndex\":0}" },
        { "messageStop", "{\"stopReason\":\"max_tokens\"}" },
        { "metadata", "{\"usage\":{\"inputTokens\":5,\"outputTokens\":6}}" },
    };
    struct converse_stream st;
    struct convert_stream cs;
    int chunks = 0;
    bool length = false, usage = false;

    converse_stream_init(&st);
    convert_stream_init(&cs, 1, true);
    for (size_t i = 0; i < sizeof(evs) / sizeof(evs[0]); i++) {
        struct io io;
        io_begin(&io, evs[i][1]);
        int n = converse_event(&st, evs[i][0], strlen(evs[i][0]), io.obj, &io.pk);
        size_t off = 0;
        for (int k = 0; k < n; k++) {
            msgpack_unpacked up;
            msgpack_sbuffer sb;
            msgpack_packer pk;
            struct strbuf out;
            msgpack_unpacked_init(&up);
            msgpack_sbuffer_init(&sb);
            msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
            strbuf_init(&out);
            ck_assert(msgpack_unpack_next(&up, io.out.data, io.out.size, &off) ==
                      MSGPACK_UNPACK_SUCCESS);
            if (convert_chat_event(&cs, &up.data, &pk) == 1) {
                msgpack_unpacked c;
                msgpack_unpacked_init(&c);
                ck_assert(msgpack_unpack_next(&c, sb.data, sb.size, NULL) ==
                          MSGPACK_UNPACK_SUCCESS);
                ck_assert_int_eq(transcode_msgpack_to_json(&c.data, &out, NULL, "c", NULL, 0), 0);
                length |= strstr(out.data, "\"finish_reason\":\"length\"") != NULL;
                usage |= strstr(out.data, "\"total_tokens\":11") != NULL;
                chunks++;
                msgpack_unpacked_destroy(&c);
            }
            strbuf_fini(&out);
            msgpack_sbuffer_destroy(&sb);
            msgpack_unpacked_destroy(&up);
        }
        io_end(&io);
    }
    /* role, "hi", finish_reason, usage */
    ck_assert_int_eq(chunks, 4);
    ck_assert(length && usage);
}
END_TEST

Suite *converse_suite(void)
{
    Suite *s = suite_create("converse");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_converse__request_translated);
    tcase_add_test(tc, test_converse__request_refusals_name_the_key);
    tcase_add_test(tc, test_converse__reply_translated);
    tcase_add_test(tc, test_converse__stream_translated_in_order);
    tcase_add_test(tc, test_converse__payload_not_a_map_is_refused);
    tcase_add_test(tc, test_converse__stream_converts_on_to_chat_chunks);
    suite_add_tcase(s, tc);
    return s;
}
