/* test_dialect.c — the dialect table (sidecar/codec/dialect.c): where each
 * provider's stream events end a stream, carry usage or report an error,
 * and the retry hints beside Retry-After. Events are written as JSON and
 * parsed the way the sidecar parses them (transcode_json_to_msgpack). */
#include <math.h>
#include <string.h>

#include "codec/dialect.h"
#include "suites.h"
#include "codec/transcode.h"

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

/* The counts of a plain reply's `usage` map, written as JSON. */
static struct dialect_usage scan_usage(enum dialect_kind kind, const char *json)
{
    struct parsed p;
    struct dialect_usage u;
    dialect_get(kind)->scan_usage(parse(&p, json), &u);
    parsed_fini(&p);
    return u;
}

START_TEST(test_dialect__table_rows)
{
    ck_assert_int_eq(dialect_from_name("openai"), DIALECT_OPENAI);
    ck_assert_int_eq(dialect_from_name("azure"), DIALECT_AZURE);
    ck_assert_int_eq(dialect_from_name("anthropic"), DIALECT_ANTHROPIC);
    ck_assert_int_eq(dialect_from_name("gemini"), DIALECT_GEMINI);
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
    struct dialect_usage acc = DIALECT_USAGE_NONE;

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

static void scan_responses(const char *json, struct dialect_event *ev)
{
    struct parsed p;
    dialect_for(DIALECT_OPENAI, "/responses")->scan_event(parse(&p, json), ev);
    parsed_fini(&p);
}

START_TEST(test_dialect__responses_rows)
{
    const struct dialect *r = dialect_for(DIALECT_OPENAI, "/responses");
    const struct dialect *az = dialect_for(DIALECT_AZURE, "/openai/v1/responses");

    ck_assert_ptr_ne(r, dialect_get(DIALECT_OPENAI));
    ck_assert(!r->stream_usage && !r->chat_facts);
    ck_assert_str_eq(r->key_header, "Authorization");
    ck_assert_str_eq(r->key_prefix, "Bearer ");
    ck_assert_str_eq(az->key_header, "api-key");
    ck_assert_str_eq(az->version_query, "api-version");
    ck_assert(!az->stream_usage && !az->chat_facts);
    ck_assert_ptr_eq(dialect_for(DIALECT_OPENAI, "/chat/completions"), dialect_get(DIALECT_OPENAI));
    ck_assert_ptr_eq(dialect_for(DIALECT_OPENAI, "/responsesx"), dialect_get(DIALECT_OPENAI));
    ck_assert_ptr_eq(dialect_for(DIALECT_OPENAI, "responses"), dialect_get(DIALECT_OPENAI));
    ck_assert_ptr_eq(dialect_for(DIALECT_ANTHROPIC, "/responses"), dialect_get(DIALECT_ANTHROPIC));
    ck_assert(dialect_get(DIALECT_OPENAI)->chat_facts && dialect_get(DIALECT_OPENAI)->stream_usage);
}
END_TEST

START_TEST(test_dialect__responses_events)
{
    struct dialect_event ev;
    struct dialect_usage u;
    struct parsed p;

    scan_responses("{\"type\":\"response.created\",\"response\":{\"usage\":null}}", &ev);
    ck_assert(!ev.terminal && !ev.error && ev.usage.total == -1);
    scan_responses("{\"type\":\"response.output_text.delta\",\"delta\":\"a\"}", &ev);
    ck_assert(!ev.terminal && !ev.error);
    /* A Chat finish chunk or [DONE]-like data means nothing here. */
    scan_responses("{\"choices\":[{\"finish_reason\":\"stop\"}]}", &ev);
    ck_assert(!ev.terminal);
    scan_responses("{\"type\":\"response.completed\",\"response\":{\"usage\":"
                   "{\"input_tokens\":30,\"input_tokens_details\":{\"cached_tokens\":10},"
                   "\"output_tokens\":7,\"total_tokens\":37}}}",
                   &ev);
    ck_assert(ev.terminal && !ev.error);
    ck_assert_int_eq(ev.usage.prompt, 30);
    ck_assert_int_eq(ev.usage.completion, 7);
    ck_assert_int_eq(dialect_usage_total(&ev.usage), 37);
    scan_responses("{\"type\":\"response.incomplete\",\"response\":{\"usage\":"
                   "{\"input_tokens\":3,\"output_tokens\":2}}}",
                   &ev);
    ck_assert(ev.terminal && !ev.error);
    ck_assert_int_eq(dialect_usage_total(&ev.usage), 5);
    scan_responses("{\"type\":\"response.failed\",\"response\":{\"error\":"
                   "{\"code\":\"server_error\"},\"usage\":null}}",
                   &ev);
    ck_assert(ev.terminal && ev.error && ev.transient);
    ck_assert_str_eq(ev.error_type, "server_error");
    scan_responses("{\"type\":\"error\",\"code\":\"invalid_prompt\",\"message\":\"x\"}", &ev);
    ck_assert(ev.error && !ev.transient);
    ck_assert_str_eq(ev.error_type, "invalid_prompt");
    scan_responses("{\"type\":\"error\",\"code\":null,\"message\":\"x\"}", &ev);
    ck_assert(ev.error && ev.transient);
    ck_assert_str_eq(ev.error_type, "error");
    /* A count that cannot be true makes the usage unknown. */
    scan_responses("{\"type\":\"response.completed\",\"response\":{\"usage\":"
                   "{\"input_tokens\":-1,\"output_tokens\":7}}}",
                   &ev);
    ck_assert(ev.terminal && ev.usage.bogus);
    ck_assert_int_eq(dialect_usage_total(&ev.usage), -1);
    dialect_for(DIALECT_OPENAI, "/responses")
        ->scan_usage(parse(&p, "{\"input_tokens\":1.5,\"output_tokens\":1}"), &u);
    parsed_fini(&p);
    ck_assert(u.bogus);
    dialect_for(DIALECT_OPENAI, "/responses")
        ->scan_usage(parse(&p, "{\"input_tokens\":1099511627776,\"output_tokens\":1}"), &u);
    parsed_fini(&p);
    ck_assert(!u.bogus && u.prompt == DIALECT_TOKENS_MAX);
}
END_TEST

START_TEST(test_dialect__plain_usage)
{
    struct dialect_usage u =
        scan_usage(DIALECT_ANTHROPIC, "{\"input_tokens\":10,\"output_tokens\":4}");
    ck_assert_int_eq(dialect_usage_total(&u), 14);
    u = scan_usage(DIALECT_OPENAI, "{\"prompt_tokens\":2}");
    ck_assert_int_eq(dialect_usage_total(&u), 2);
    dialect_get(DIALECT_OPENAI)->scan_usage(NULL, &u);
    ck_assert_int_eq(dialect_usage_total(&u), -1);
}
END_TEST

/* --- counts that cannot be true ------------------------------------- */

/* Counts no upstream can mean, as msgpack values (2^64 - 1 has no JSON
 * form the sidecar parses, so the objects are built directly). */
static const msgpack_object hostile[] = {
    { .type = MSGPACK_OBJECT_POSITIVE_INTEGER, .via.u64 = INT64_MAX },
    { .type = MSGPACK_OBJECT_POSITIVE_INTEGER, .via.u64 = UINT64_MAX },
    { .type = MSGPACK_OBJECT_POSITIVE_INTEGER, .via.u64 = (UINT64_C(1) << 40) + 1 },
    { .type = MSGPACK_OBJECT_NEGATIVE_INTEGER, .via.i64 = -1 },
    { .type = MSGPACK_OBJECT_NEGATIVE_INTEGER, .via.i64 = INT64_MIN },
    { .type = MSGPACK_OBJECT_FLOAT64, .via.f64 = 1.5 },
    { .type = MSGPACK_OBJECT_FLOAT64, .via.f64 = 9.3e18 },
    { .type = MSGPACK_OBJECT_FLOAT64, .via.f64 = NAN },
    { .type = MSGPACK_OBJECT_STR, .via.str = { 2, "12" } },
    { .type = MSGPACK_OBJECT_BOOLEAN, .via.boolean = true },
};
#define N_HOSTILE (sizeof(hostile) / sizeof(hostile[0]))

static msgpack_object str_obj(const char *s)
{
    msgpack_object o = { .type = MSGPACK_OBJECT_STR };
    o.via.str.ptr = s;
    o.via.str.size = (uint32_t)strlen(s);
    return o;
}

static msgpack_object u64_obj(uint64_t v)
{
    return (msgpack_object){ .type = MSGPACK_OBJECT_POSITIVE_INTEGER, .via.u64 = v };
}

static msgpack_object map_obj(msgpack_object_kv *kv, uint32_t n)
{
    msgpack_object o = { .type = MSGPACK_OBJECT_MAP };
    o.via.map.size = n;
    o.via.map.ptr = kv;
    return o;
}

/* A usage map of up to four counts: names[i] = vals[i] (names NULL-ended). */
struct usage_map {
    msgpack_object_kv kv[4];
    msgpack_object map;
};

static const msgpack_object *usage_map(struct usage_map *u, const char *const *names,
                                       const msgpack_object *vals)
{
    uint32_t n = 0;
    for (; names[n]; n++) {
        u->kv[n].key = str_obj(names[n]);
        u->kv[n].val = vals[n];
    }
    u->map = map_obj(u->kv, n);
    return &u->map;
}

static void assert_bogus(const struct dialect_usage *u, const char *what, size_t i)
{
    ck_assert_msg(u->bogus, "%s: hostile value %zu believed", what, i);
    ck_assert_msg(u->prompt == -1 && u->completion == -1 && u->total == -1,
                  "%s: hostile value %zu left counts", what, i);
    ck_assert_int_eq(dialect_usage_total(u), -1);
}

START_TEST(test_dialect__count_number)
{
    ck_assert_int_eq(dialect_count_number(0), 0);
    ck_assert_int_eq(dialect_count_number(3.0), 3);
    ck_assert_int_eq(dialect_count_number((double)DIALECT_TOKENS_MAX), DIALECT_TOKENS_MAX);
    const double bad[] = { (double)DIALECT_TOKENS_MAX + 1,
                           9223372036854775807.0,
                           18446744073709551615.0,
                           -1,
                           -0.5,
                           1.5,
                           1e300,
                           INFINITY,
                           -INFINITY,
                           NAN };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(dialect_count_number(bad[i]) == DIALECT_COUNT_BOGUS, "%g believed", bad[i]);
}
END_TEST

/* The classes of `json` (a `usage` map of `kind`) priced at 1, 2, 3, 4, 5
 * per million tokens of input, cached, cache write, output, reasoning:
 * the cost is then the dot product, which shows every class at once. */
static double classes_cost(enum dialect_kind kind, const char *json, struct cost_tokens *t)
{
    const struct cost_prices p = { true, { 1, 2, 3, 4, 5 } };
    struct dialect_usage u = scan_usage(kind, json);
    ck_assert_msg(dialect_usage_classes(&u, t), "no classes: %s", json);
    return cost_of(&p, t) * 1e6;
}

static void expect_classes(const struct cost_tokens *t, int64_t in, int64_t cached, int64_t cw,
                           int64_t out, int64_t reasoning)
{
    const int64_t want[COST_CLASSES] = { in, cached, cw, out, reasoning };
    for (int c = 0; c < COST_CLASSES; c++)
        ck_assert_msg(t->n[c] == want[c], "%s: %lld, want %lld",
                      cost_class_name((enum cost_class)c), (long long)t->n[c], (long long)want[c]);
}

/* Every dialect's usage shape split into the disjoint classes, cached and
 * reasoning tokens included, and what each costs. */
START_TEST(test_dialect__usage_classes_and_cost)
{
    struct cost_tokens t;

    /* Chat Completions: cached part of prompt, reasoning part of completion. */
    double c = classes_cost(DIALECT_OPENAI,
                            "{\"prompt_tokens\":100,\"completion_tokens\":50,\"total_tokens\":150,"
                            "\"prompt_tokens_details\":{\"cached_tokens\":80},"
                            "\"completion_tokens_details\":{\"reasoning_tokens\":30}}",
                            &t);
    expect_classes(&t, 20, 80, 0, 20, 30);
    ck_assert_double_eq_tol(c, 20 * 1 + 80 * 2 + 20 * 4 + 30 * 5, 1e-6);
    /* Zero tokens of a priced source cost 0, known. */
    c = classes_cost(DIALECT_OPENAI, "{\"prompt_tokens\":0}", &t);
    ck_assert_double_eq(c, 0);
    /* Responses. */
    struct dialect_usage u;
    {
        struct parsed p;
        dialect_for(DIALECT_OPENAI, "/responses")
            ->scan_usage(parse(&p,
                               "{\"input_tokens\":40,\"input_tokens_details\":{\"cached_tokens\":"
                               "10},\"output_tokens\":25,\"output_tokens_details\":{"
                               "\"reasoning_tokens\":5},\"total_tokens\":65}"),
                         &u);
        parsed_fini(&p);
    }
    ck_assert(dialect_usage_classes(&u, &t));
    expect_classes(&t, 30, 10, 0, 20, 5);
    /* Anthropic: reads and writes beside input_tokens, folded into prompt. */
    c = classes_cost(DIALECT_ANTHROPIC,
                     "{\"input_tokens\":20,\"cache_creation_input_tokens\":10,"
                     "\"cache_read_input_tokens\":70,\"output_tokens\":5}",
                     &t);
    expect_classes(&t, 20, 70, 10, 5, 0);
    ck_assert_double_eq_tol(c, 20 + 140 + 30 + 20, 1e-6);
    /* Anthropic's stream: message_start has the input side, message_delta
     * the output; merged, they make the same classes. */
    struct dialect_event ev;
    struct dialect_usage acc = DIALECT_USAGE_NONE;
    scan(DIALECT_ANTHROPIC,
         "{\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,"
         "\"cache_creation_input_tokens\":10,\"cache_read_input_tokens\":70,\"output_tokens\":1}}}",
         &ev);
    dialect_usage_merge(&acc, &ev.usage);
    scan(DIALECT_ANTHROPIC, "{\"type\":\"message_delta\",\"usage\":{\"output_tokens\":5}}", &ev);
    dialect_usage_merge(&acc, &ev.usage);
    ck_assert(dialect_usage_classes(&acc, &t));
    expect_classes(&t, 20, 70, 10, 5, 0);
    /* Gemini: thoughts beside candidates, cached content part of prompt. */
    c = classes_cost(DIALECT_GEMINI,
                     "{\"promptTokenCount\":100,\"cachedContentTokenCount\":60,"
                     "\"candidatesTokenCount\":10,\"thoughtsTokenCount\":40,"
                     "\"totalTokenCount\":150}",
                     &t);
    expect_classes(&t, 40, 60, 0, 10, 40);
    ck_assert_double_eq_tol(c, 40 + 120 + 40 + 200, 1e-6);
    /* Embeddings: no completion count is no output. */
    classes_cost(DIALECT_OPENAI, "{\"prompt_tokens\":7,\"total_tokens\":7}", &t);
    expect_classes(&t, 7, 0, 0, 0, 0);
    /* A class above its total is not split off: nothing priced twice. */
    classes_cost(DIALECT_OPENAI,
                 "{\"prompt_tokens\":10,\"completion_tokens\":3,"
                 "\"prompt_tokens_details\":{\"cached_tokens\":11},"
                 "\"completion_tokens_details\":{\"reasoning_tokens\":4}}",
                 &t);
    expect_classes(&t, 10, 0, 0, 3, 0);
    /* Nothing to price: no prompt count, or counts that cannot be true. */
    u = scan_usage(DIALECT_OPENAI, "{\"completion_tokens\":3}");
    ck_assert(!dialect_usage_classes(&u, &t));
    u = scan_usage(DIALECT_OPENAI, "{\"prompt_tokens\":-3,\"completion_tokens\":3}");
    ck_assert(u.bogus && !dialect_usage_classes(&u, &t));
    /* The same reasoning count member by member (the tree-free reader). */
    u = DIALECT_USAGE_NONE;
    dialect_openai_count(&u, "completion_tokens", 17, 9);
    dialect_openai_detail(&u, "reasoning_tokens", 16, 4);
    ck_assert_int_eq(u.reasoning, 4);
    /* An unpriced source: no cost, never 0. */
    const struct cost_prices none = { 0 };
    ck_assert(isnan(cost_of(&none, &t)) && !cost_is_known(cost_of(&none, &t)));
}
END_TEST

/* OpenAI's plain reply usage, and the members read without a tree. */
/* The cached share of a prompt: OpenAI's prompt_tokens_details.cached_tokens
 * (and the Responses API's input_tokens_details), Anthropic's
 * cache_read_input_tokens (part of its prompt count); a cached count that
 * cannot be true is dropped alone; one above the prompt is not counted. */
START_TEST(test_dialect__cached_prompt_tokens)
{
    struct dialect_usage u = scan_usage(DIALECT_OPENAI,
                                        "{\"prompt_tokens\":100,\"completion_tokens\":5,"
                                        "\"prompt_tokens_details\":{\"cached_tokens\":80}}");
    ck_assert(!u.bogus && u.prompt == 100 && u.cached == 80);
    ck_assert_int_eq(dialect_usage_cached(&u), 80);
    u = scan_usage(DIALECT_ANTHROPIC,
                   "{\"input_tokens\":20,\"cache_creation_input_tokens\":10,"
                   "\"cache_read_input_tokens\":70,\"output_tokens\":5}");
    ck_assert(!u.bogus && u.prompt == 100 && u.cached == 70);
    u = scan_usage(DIALECT_ANTHROPIC, "{\"input_tokens\":20,\"output_tokens\":5}");
    ck_assert(u.prompt == 20 && dialect_usage_cached(&u) == -1);
    u = scan_usage(DIALECT_OPENAI,
                   "{\"prompt_tokens\":10,"
                   "\"prompt_tokens_details\":{\"cached_tokens\":\"7\"}}");
    ck_assert(!u.bogus && u.prompt == 10 && u.cached == -1);
    u = scan_usage(DIALECT_OPENAI,
                   "{\"prompt_tokens\":10,"
                   "\"prompt_tokens_details\":{\"cached_tokens\":11}}");
    ck_assert(!u.bogus && u.cached == 11 && dialect_usage_cached(&u) == -1);
    /* Member by member, as the HTTP front's reader records them. */
    u = DIALECT_USAGE_NONE;
    dialect_openai_count(&u, "prompt_tokens", 13, 9);
    dialect_openai_detail(&u, "cached_tokens", 13, 4);
    dialect_openai_detail(&u, "audio_tokens", 12, 3);
    ck_assert_int_eq(dialect_usage_cached(&u), 4);
    dialect_openai_detail(&u, "cached_tokens", 13, DIALECT_COUNT_BOGUS);
    ck_assert(!u.bogus && u.prompt == 9 && u.cached == -1);
    /* An event's cached count replaces the running one. */
    struct dialect_usage acc = DIALECT_USAGE_NONE, ev = DIALECT_USAGE_NONE;
    ev.prompt = 50;
    ev.cached = 20;
    dialect_usage_merge(&acc, &ev);
    ck_assert_int_eq(dialect_usage_cached(&acc), 20);
}
END_TEST

START_TEST(test_dialect__openai_plain_usage_hostile)
{
    static const char *const fields[3] = { "prompt_tokens", "completion_tokens", "total_tokens" };
    for (size_t i = 0; i < N_HOSTILE; i++) {
        for (int f = 0; f < 3; f++) {
            const char *names[] = { fields[f], fields[(f + 1) % 3], NULL };
            const msgpack_object vals[] = { hostile[i], u64_obj(5) };
            struct usage_map m;
            struct dialect_usage u;
            dialect_get(DIALECT_OPENAI)->scan_usage(usage_map(&m, names, vals), &u);
            assert_bogus(&u, fields[f], i);
            /* The hostile member last: the earlier count is dropped too. */
            const char *rev[] = { fields[(f + 1) % 3], fields[f], NULL };
            const msgpack_object rvals[] = { u64_obj(5), hostile[i] };
            dialect_get(DIALECT_AZURE)->scan_usage(usage_map(&m, rev, rvals), &u);
            assert_bogus(&u, fields[f], i);
        }
    }
    /* The largest believed counts, summed without overflow. */
    const char *names[] = { "prompt_tokens", "completion_tokens", NULL };
    const msgpack_object vals[] = { u64_obj(DIALECT_TOKENS_MAX), u64_obj(DIALECT_TOKENS_MAX) };
    struct usage_map m;
    struct dialect_usage u;
    dialect_get(DIALECT_OPENAI)->scan_usage(usage_map(&m, names, vals), &u);
    ck_assert(!u.bogus);
    ck_assert_int_eq(dialect_usage_total(&u), 2 * DIALECT_TOKENS_MAX);
    /* Null is absent, other members are not counts. */
    u = scan_usage(DIALECT_OPENAI,
                   "{\"prompt_tokens\":4,\"completion_tokens\":null,"
                   "\"total_tokens\":null,\"prompt_tokens_details\":"
                   "{\"cached_tokens\":-7},\"note\":\"x\"}");
    ck_assert(!u.bogus);
    ck_assert_int_eq(dialect_usage_total(&u), 4);
    /* The same rules member by member (the HTTP front's jscan path). */
    u = DIALECT_USAGE_NONE;
    dialect_openai_count(&u, "prompt_tokens", 13, 3);
    dialect_openai_count(&u, "cached_tokens", 13, DIALECT_COUNT_BOGUS);
    ck_assert(!u.bogus && u.prompt == 3);
    dialect_openai_count(&u, "total_tokens", 12, dialect_count_number(1.5));
    ck_assert(u.bogus && u.prompt == -1);
    dialect_openai_count(&u, "completion_tokens", 17, 4);
    ck_assert(u.bogus && u.completion == -1);
}
END_TEST

/* OpenAI's stream usage chunk ("choices": [], stream_options.include_usage). */
START_TEST(test_dialect__openai_stream_usage_chunk_hostile)
{
    for (size_t i = 0; i < N_HOSTILE; i++) {
        const char *names[] = { "prompt_tokens", "completion_tokens", "total_tokens", NULL };
        const msgpack_object vals[] = { u64_obj(5), hostile[i], u64_obj(10) };
        struct usage_map m;
        msgpack_object_kv kv[2] = { { str_obj("choices"), { .type = MSGPACK_OBJECT_ARRAY } },
                                    { str_obj("usage"), *usage_map(&m, names, vals) } };
        msgpack_object chunk = map_obj(kv, 2);
        struct dialect_event ev;
        struct dialect_usage acc = DIALECT_USAGE_NONE;

        /* An earlier chunk's believable counts ... */
        scan(DIALECT_OPENAI,
             "{\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],"
             "\"usage\":{\"prompt_tokens\":3,\"total_tokens\":7}}",
             &ev);
        dialect_usage_merge(&acc, &ev.usage);
        ck_assert_int_eq(dialect_usage_total(&acc), 7);
        /* ... are dropped with the hostile one, and nothing revives them. */
        dialect_get(DIALECT_OPENAI)->scan_event(&chunk, &ev);
        ck_assert(ev.usage_only);
        assert_bogus(&ev.usage, "usage chunk", i);
        dialect_usage_merge(&acc, &ev.usage);
        assert_bogus(&acc, "merged", i);
        scan(DIALECT_OPENAI, "{\"choices\":[],\"usage\":{\"total_tokens\":9}}", &ev);
        dialect_usage_merge(&acc, &ev.usage);
        assert_bogus(&acc, "merged after", i);
    }
}
END_TEST

/* Anthropic's message usage: input, both cache counts and output. */
START_TEST(test_dialect__anthropic_message_usage_hostile)
{
    static const char *const fields[4] = { "input_tokens", "cache_creation_input_tokens",
                                           "cache_read_input_tokens", "output_tokens" };
    for (size_t i = 0; i < N_HOSTILE; i++) {
        for (int f = 0; f < 4; f++) {
            const char *names[] = { fields[0], fields[1], fields[2], fields[3], NULL };
            msgpack_object vals[4] = { u64_obj(5), u64_obj(5), u64_obj(5), u64_obj(5) };
            struct usage_map m;
            struct dialect_usage u;
            vals[f] = hostile[i];
            dialect_get(DIALECT_ANTHROPIC)->scan_usage(usage_map(&m, names, vals), &u);
            assert_bogus(&u, fields[f], i);
        }
    }
    /* The largest believed counts: the input sum and the total fit. */
    const char *names[] = { "input_tokens", "cache_creation_input_tokens",
                            "cache_read_input_tokens", "output_tokens", NULL };
    const msgpack_object vals[] = { u64_obj(DIALECT_TOKENS_MAX), u64_obj(DIALECT_TOKENS_MAX),
                                    u64_obj(DIALECT_TOKENS_MAX), u64_obj(DIALECT_TOKENS_MAX) };
    struct usage_map m;
    struct dialect_usage u;
    dialect_get(DIALECT_ANTHROPIC)->scan_usage(usage_map(&m, names, vals), &u);
    ck_assert(!u.bogus);
    ck_assert_int_eq(u.prompt, 3 * DIALECT_TOKENS_MAX);
    ck_assert_int_eq(dialect_usage_total(&u), 4 * DIALECT_TOKENS_MAX);
    /* Anthropic's nested cache breakdown is not a count. */
    u = scan_usage(DIALECT_ANTHROPIC,
                   "{\"input_tokens\":4,\"output_tokens\":2,\"cache_creation\":"
                   "{\"ephemeral_5m_input_tokens\":0},\"service_tier\":\"standard\"}");
    ck_assert(!u.bogus);
    ck_assert_int_eq(dialect_usage_total(&u), 6);
}
END_TEST

/* Anthropic's stream: message_start's message.usage, message_delta's usage. */
START_TEST(test_dialect__anthropic_stream_usage_hostile)
{
    for (size_t i = 0; i < N_HOSTILE; i++) {
        for (int at_start = 0; at_start < 2; at_start++) {
            const char *names[] = { at_start ? "input_tokens" : "output_tokens", NULL };
            struct usage_map m;
            const msgpack_object *usage = usage_map(&m, names, &hostile[i]);
            msgpack_object_kv msg_kv[1] = { { str_obj("usage"), *usage } };
            msgpack_object_kv kv[2] = {
                { str_obj("type"), str_obj(at_start ? "message_start" : "message_delta") },
                { str_obj(at_start ? "message" : "usage"), at_start ? map_obj(msg_kv, 1) : *usage },
            };
            msgpack_object event = map_obj(kv, 2);
            struct dialect_event ev;
            struct dialect_usage acc = DIALECT_USAGE_NONE;

            if (!at_start) {
                scan(DIALECT_ANTHROPIC,
                     "{\"type\":\"message_start\",\"message\":{\"usage\":"
                     "{\"input_tokens\":20,\"output_tokens\":1}}}",
                     &ev);
                dialect_usage_merge(&acc, &ev.usage);
            }
            dialect_get(DIALECT_ANTHROPIC)->scan_event(&event, &ev);
            assert_bogus(&ev.usage, at_start ? "message_start" : "message_delta", i);
            dialect_usage_merge(&acc, &ev.usage);
            assert_bogus(&acc, "merged", i);
            scan(DIALECT_ANTHROPIC,
                 "{\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":9}}", &ev);
            dialect_usage_merge(&acc, &ev.usage);
            assert_bogus(&acc, "merged after", i);
        }
    }
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

/* Gemini: usageMetadata's shapes (thinking billed as output and counted in
 * the completion, cached and tool-use prompts), its terminal events and
 * its errors inside a stream. */
START_TEST(test_dialect__gemini_usage_and_events)
{
    const struct dialect *d = dialect_get(DIALECT_GEMINI);
    ck_assert_str_eq(d->key_header, "x-goog-api-key");
    ck_assert_str_eq(d->key_prefix, "");
    ck_assert_ptr_null(d->version_header);
    ck_assert_ptr_null(d->version_query);
    ck_assert(!d->stream_usage && !d->chat_facts);
    ck_assert_str_eq(d->usage_member, "usageMetadata");
    ck_assert_ptr_eq(dialect_for(DIALECT_GEMINI, "/responses"), d);

    struct dialect_usage u = scan_usage(DIALECT_GEMINI,
                                        "{\"promptTokenCount\":100,\"cachedContentTokenCount\":60,"
                                        "\"candidatesTokenCount\":20,\"thoughtsTokenCount\":30,"
                                        "\"toolUsePromptTokenCount\":5,\"totalTokenCount\":155}");
    ck_assert_int_eq(u.prompt, 105);
    ck_assert_int_eq(u.cached, 60);
    ck_assert_int_eq(u.completion, 50);
    ck_assert_int_eq(u.reasoning, 30);
    ck_assert_int_eq(u.total, 155);
    ck_assert_int_eq(u.cache_write, -1);
    ck_assert(!u.bogus);
    ck_assert_int_eq(dialect_usage_cached(&u), 60);

    /* No thinking, no total: the total is the sum. */
    u = scan_usage(DIALECT_GEMINI, "{\"promptTokenCount\":7,\"candidatesTokenCount\":3}");
    ck_assert_int_eq(u.prompt, 7);
    ck_assert_int_eq(u.completion, 3);
    ck_assert_int_eq(u.reasoning, -1);
    ck_assert_int_eq(u.cached, -1);
    ck_assert_int_eq(dialect_usage_total(&u), 10);

    /* The prompt alone (a stream's first chunks). */
    u = scan_usage(DIALECT_GEMINI, "{\"promptTokenCount\":7,\"totalTokenCount\":7}");
    ck_assert_int_eq(u.completion, -1);
    ck_assert_int_eq(u.total, 7);

    /* Counts that cannot be true. */
    static const char *const bad[] = {
        "{\"promptTokenCount\":-1}",        "{\"candidatesTokenCount\":\"12\"}",
        "{\"thoughtsTokenCount\":1.5}",     "{\"totalTokenCount\":2199023255553}",
        "{\"cachedContentTokenCount\":{}}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        u = scan_usage(DIALECT_GEMINI, bad[i]);
        ck_assert_msg(u.bogus && dialect_usage_total(&u) == -1, "%s believed", bad[i]);
    }
    u = scan_usage(DIALECT_GEMINI, "[1]");
    ck_assert(!u.bogus && u.prompt == -1 && u.total == -1);

    struct dialect_event ev;
    scan(DIALECT_GEMINI,
         "{\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"a\"}]},\"index\":0}],"
         "\"usageMetadata\":{\"promptTokenCount\":4,\"totalTokenCount\":4}}",
         &ev);
    ck_assert(!ev.terminal && !ev.error);
    ck_assert_int_eq(ev.usage.prompt, 4);
    scan(DIALECT_GEMINI,
         "{\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"b\"}]},\"finishReason\":\"STOP\"}],"
         "\"usageMetadata\":{\"promptTokenCount\":4,\"candidatesTokenCount\":2,"
         "\"thoughtsTokenCount\":3,\"totalTokenCount\":9}}",
         &ev);
    ck_assert(ev.terminal && !ev.error);
    ck_assert_int_eq(ev.usage.completion, 5);
    ck_assert_int_eq(ev.usage.reasoning, 3);
    ck_assert_int_eq(ev.usage.total, 9);
    scan(DIALECT_GEMINI, "{\"candidates\":[{\"finishReason\":null}]}", &ev);
    ck_assert(!ev.terminal);
    scan(DIALECT_GEMINI, "{\"candidates\":[{\"index\":0},{\"finishReason\":\"MAX_TOKENS\"}]}", &ev);
    ck_assert(ev.terminal);
    scan(DIALECT_GEMINI, "{\"promptFeedback\":{\"blockReason\":\"SAFETY\"}}", &ev);
    ck_assert(ev.terminal && !ev.error);
    scan(DIALECT_GEMINI, "{\"candidates\":{\"finishReason\":\"STOP\"}}", &ev);
    ck_assert(!ev.terminal);

    scan(DIALECT_GEMINI,
         "{\"error\":{\"code\":503,\"message\":\"overloaded\",\"status\":\"UNAVAILABLE\"}}", &ev);
    ck_assert(ev.error && ev.transient);
    ck_assert_str_eq(ev.error_type, "UNAVAILABLE");
    scan(DIALECT_GEMINI, "{\"error\":{\"code\":429,\"status\":\"RESOURCE_EXHAUSTED\"}}", &ev);
    ck_assert(ev.error && ev.transient);
    scan(DIALECT_GEMINI, "{\"error\":{\"code\":400,\"status\":\"INVALID_ARGUMENT\"}}", &ev);
    ck_assert(ev.error && !ev.transient);
    ck_assert_str_eq(ev.error_type, "INVALID_ARGUMENT");
    scan(DIALECT_GEMINI, "{\"error\":{\"code\":500}}", &ev);
    ck_assert(ev.error && ev.transient);
    ck_assert_str_eq(ev.error_type, "error");
    /* An empty status names no type: "error", as none (found by fuzzing). */
    scan(DIALECT_GEMINI, "{\"error\":{\"code\":503,\"message\":\"overloaded\",\"status\":\"\"}}",
         &ev);
    ck_assert(ev.error && ev.transient);
    ck_assert_str_eq(ev.error_type, "error");
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
    tcase_add_test(tc, test_dialect__responses_rows);
    tcase_add_test(tc, test_dialect__responses_events);
    tcase_add_test(tc, test_dialect__plain_usage);
    tcase_add_test(tc, test_dialect__count_number);
    tcase_add_test(tc, test_dialect__openai_plain_usage_hostile);
    tcase_add_test(tc, test_dialect__cached_prompt_tokens);
    tcase_add_test(tc, test_dialect__openai_stream_usage_chunk_hostile);
    tcase_add_test(tc, test_dialect__anthropic_message_usage_hostile);
    tcase_add_test(tc, test_dialect__anthropic_stream_usage_hostile);
    tcase_add_test(tc, test_dialect__durations);
    tcase_add_test(tc, test_dialect__retry_hints);
    tcase_add_test(tc, test_dialect__gemini_usage_and_events);
    tcase_add_test(tc, test_dialect__usage_classes_and_cost);
    suite_add_tcase(s, tc);
    return s;
}
