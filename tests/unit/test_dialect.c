/* test_dialect.c — the dialect table (sidecar/dialect.c): where each
 * provider's stream events end a stream, carry usage or report an error,
 * and the retry hints beside Retry-After. Events are written as JSON and
 * parsed the way the sidecar parses them (transcode_json_to_msgpack). */
#include <math.h>
#include <string.h>

#include "dialect.h"
#include "suites.h"
#include "transcode.h"

struct parsed {
    msgpack_sbuffer sb;
    msgpack_unpacked up;
};

static const msgpack_object *parse(struct parsed *p, const char *json)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(&p->sb);
    msgpack_packer_init(&pk, &p->sb, msgpack_sbuffer_write);
    ck_assert_int_eq(transcode_json_to_msgpack(json, strlen(json), &pk, NULL, NULL, 0), 0);
    msgpack_unpacked_init(&p->up);
    ck_assert(msgpack_unpack_next(&p->up, p->sb.data, p->sb.size, NULL) == MSGPACK_UNPACK_SUCCESS);
    return &p->up.data;
}

static void parsed_fini(struct parsed *p)
{
    msgpack_unpacked_destroy(&p->up);
    msgpack_sbuffer_destroy(&p->sb);
}

static void scan(enum dialect_kind kind, const char *json, struct dialect_event *ev)
{
    struct parsed p;
    dialect_get(kind)->scan_event(parse(&p, json), ev);
    parsed_fini(&p);
}

START_TEST(test_dialect__table_rows)
{
    ck_assert_int_eq(dialect_from_name("openai"), DIALECT_OPENAI);
    ck_assert_int_eq(dialect_from_name("azure"), DIALECT_AZURE);
    ck_assert_int_eq(dialect_from_name("anthropic"), DIALECT_ANTHROPIC);
    ck_assert_int_eq(dialect_from_name("gemini"), -1);
    ck_assert_int_eq(dialect_from_name(NULL), -1);
    ck_assert_str_eq(dialect_get(DIALECT_OPENAI)->key_header, "Authorization");
    ck_assert_str_eq(dialect_get(DIALECT_AZURE)->key_header, "api-key");
    ck_assert_str_eq(dialect_get(DIALECT_AZURE)->version_query, "api-version");
    ck_assert_str_eq(dialect_get(DIALECT_ANTHROPIC)->key_header, "x-api-key");
    ck_assert_str_eq(dialect_get(DIALECT_ANTHROPIC)->version_header, "anthropic-version");
    ck_assert_str_eq(dialect_get(DIALECT_ANTHROPIC)->chat_path, "/messages");
    ck_assert(!dialect_get(DIALECT_ANTHROPIC)->stream_usage);
}
END_TEST

START_TEST(test_dialect__openai_events)
{
    struct dialect_event ev;
    scan(DIALECT_OPENAI, "{\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}",
         &ev);
    ck_assert(!ev.terminal && !ev.usage_only && !ev.error);
    ck_assert_int_eq(ev.usage.total, -1);
    scan(DIALECT_OPENAI,
         "{\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],"
         "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,"
         "\"total_tokens\":7}}",
         &ev);
    ck_assert(ev.terminal && !ev.usage_only);
    ck_assert_int_eq(ev.usage.prompt, 3);
    ck_assert_int_eq(ev.usage.total, 7);
    /* The include_usage chunk: nothing but usage. */
    scan(DIALECT_AZURE,
         "{\"choices\":[],\"usage\":{\"prompt_tokens\":5000,"
         "\"completion_tokens\":1,\"total_tokens\":5001}}",
         &ev);
    ck_assert(ev.usage_only && !ev.terminal);
    ck_assert_int_eq(ev.usage.total, 5001);
    scan(DIALECT_OPENAI, "{\"error\":{\"type\":\"server_error\",\"message\":\"x\"}}", &ev);
    ck_assert(ev.error && ev.transient);
    ck_assert_str_eq(ev.error_type, "server_error");
}
END_TEST

START_TEST(test_dialect__anthropic_events)
{
    struct dialect_event ev;
    struct dialect_usage acc = { -1, -1, -1 };

    scan(DIALECT_ANTHROPIC,
         "{\"type\":\"message_start\",\"message\":{\"usage\":"
         "{\"input_tokens\":20,\"cache_read_input_tokens\":5,"
         "\"output_tokens\":1}}}",
         &ev);
    ck_assert(!ev.terminal && !ev.error);
    ck_assert_int_eq(ev.usage.prompt, 25);
    dialect_usage_merge(&acc, &ev.usage);
    scan(DIALECT_ANTHROPIC,
         "{\"type\":\"content_block_delta\",\"index\":0,"
         "\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}",
         &ev);
    ck_assert(!ev.terminal && ev.usage.prompt == -1 && ev.usage.completion == -1);
    scan(DIALECT_ANTHROPIC,
         "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":"
         "\"end_turn\"},\"usage\":{\"output_tokens\":9}}",
         &ev);
    ck_assert(!ev.terminal);
    dialect_usage_merge(&acc, &ev.usage);
    ck_assert_int_eq(acc.prompt, 25);
    ck_assert_int_eq(acc.completion, 9);
    ck_assert_int_eq(dialect_usage_total(&acc), 34);
    scan(DIALECT_ANTHROPIC, "{\"type\":\"message_stop\"}", &ev);
    ck_assert(ev.terminal);
    scan(DIALECT_ANTHROPIC,
         "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\","
         "\"message\":\"Overloaded\"}}",
         &ev);
    ck_assert(ev.error && ev.transient);
    ck_assert_str_eq(ev.error_type, "overloaded_error");
    scan(DIALECT_ANTHROPIC, "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\"}}",
         &ev);
    ck_assert(ev.error && !ev.transient);
    /* An OpenAI finish chunk means nothing to the Anthropic reader. */
    scan(DIALECT_ANTHROPIC, "{\"choices\":[{\"finish_reason\":\"stop\"}]}", &ev);
    ck_assert(!ev.terminal);
}
END_TEST

START_TEST(test_dialect__plain_usage)
{
    struct parsed p;
    struct dialect_usage u;
    dialect_get(DIALECT_ANTHROPIC)
        ->scan_usage(parse(&p, "{\"input_tokens\":10,\"output_tokens\":4}"), &u);
    ck_assert_int_eq(dialect_usage_total(&u), 14);
    parsed_fini(&p);
    dialect_get(DIALECT_OPENAI)->scan_usage(parse(&p, "{\"prompt_tokens\":2}"), &u);
    ck_assert_int_eq(dialect_usage_total(&u), 2);
    parsed_fini(&p);
    dialect_get(DIALECT_OPENAI)->scan_usage(NULL, &u);
    ck_assert_int_eq(dialect_usage_total(&u), -1);
}
END_TEST

START_TEST(test_dialect__durations)
{
    double s = -1;
    ck_assert_int_eq(dialect_parse_duration("1s", &s), 0);
    ck_assert(fabs(s - 1) < 1e-9);
    ck_assert_int_eq(dialect_parse_duration("6m0s", &s), 0);
    ck_assert(fabs(s - 360) < 1e-9);
    ck_assert_int_eq(dialect_parse_duration("20ms", &s), 0);
    ck_assert(fabs(s - 0.02) < 1e-9);
    ck_assert_int_eq(dialect_parse_duration("1h2m3.5s", &s), 0);
    ck_assert(fabs(s - 3723.5) < 1e-9);
    s = 42;
    ck_assert_int_eq(dialect_parse_duration("", &s), -1);
    ck_assert_int_eq(dialect_parse_duration("5", &s), -1);
    ck_assert_int_eq(dialect_parse_duration("-1s", &s), -1);
    ck_assert_int_eq(dialect_parse_duration("1s x", &s), -1);
    ck_assert_int_eq(dialect_parse_duration("2025-01-01T00:00:00Z", &s), -1);
    ck_assert(s == 42);
}
END_TEST

static struct outcome http(int status)
{
    struct outcome o;
    outcome_from_http(&o, status, NULL, 0);
    return o;
}

START_TEST(test_dialect__retry_hints)
{
    struct outcome o = http(429);
    struct dialect_hints h = { "1500", "", "", "" };
    dialect_apply_hints(&o, &h);
    ck_assert(fabs(o.retry_after_s - 1.5) < 1e-9);

    o = http(429);
    h = (struct dialect_hints){ "", "", "2s", "1m0s" };
    dialect_apply_hints(&o, &h);
    ck_assert(fabs(o.retry_after_s - 60) < 1e-9);

    /* Retry-After wins over both. */
    outcome_from_http(&o, 429, "3", 0);
    h = (struct dialect_hints){ "1500", "", "9s", "" };
    dialect_apply_hints(&o, &h);
    ck_assert(fabs(o.retry_after_s - 3) < 1e-9);

    /* Reset headers are about rate limits only. */
    o = http(503);
    h = (struct dialect_hints){ "", "", "9s", "" };
    dialect_apply_hints(&o, &h);
    ck_assert(o.retry_after_s < 0);

    o = http(400);
    h = (struct dialect_hints){ "", "true", "", "" };
    dialect_apply_hints(&o, &h);
    ck_assert_int_eq(o.kind, OUTCOME_TRANSIENT);

    o = http(529);
    h = (struct dialect_hints){ "100", "false", "", "" };
    dialect_apply_hints(&o, &h);
    ck_assert_int_eq(o.kind, OUTCOME_FAIL_FAST);
    ck_assert(o.retry_after_s < 0);

    o = http(200);
    h = (struct dialect_hints){ "100", "false", "", "" };
    dialect_apply_hints(&o, &h);
    ck_assert_int_eq(o.kind, OUTCOME_SUCCESS);

    o = http(429);
    h = (struct dialect_hints){ "-5", "", "soon", "" };
    dialect_apply_hints(&o, &h);
    ck_assert(o.retry_after_s < 0);
}
END_TEST

Suite *dialect_suite(void)
{
    Suite *s = suite_create("dialect");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_dialect__table_rows);
    tcase_add_test(tc, test_dialect__openai_events);
    tcase_add_test(tc, test_dialect__anthropic_events);
    tcase_add_test(tc, test_dialect__plain_usage);
    tcase_add_test(tc, test_dialect__durations);
    tcase_add_test(tc, test_dialect__retry_hints);
    suite_add_tcase(s, tc);
    return s;
}
