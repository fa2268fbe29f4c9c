/*
 * dialect.c — the dialect table and the readers of each dialect's events
 * and token counts (contract in dialect.h).
 */
#include "dialect.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "rpc.h"

/* A count member's value (NULL: absent): the count, -1 when absent or
 * null, DIALECT_COUNT_BOGUS when it cannot be true. */
static int64_t obj_count(const msgpack_object *v)
{
    if (!v || v->type == MSGPACK_OBJECT_NIL)
        return -1;
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        return v->via.u64 <= (uint64_t)DIALECT_TOKENS_MAX ? (int64_t)v->via.u64
                                                          : DIALECT_COUNT_BOGUS;
    if (v->type == MSGPACK_OBJECT_FLOAT32 || v->type == MSGPACK_OBJECT_FLOAT64)
        return dialect_count_number(v->via.f64);
    return DIALECT_COUNT_BOGUS; /* negative, a string, a map ... */
}

int64_t dialect_count_number(double v)
{
    /* NaN fails every comparison. */
    if (v >= 0 && v <= (double)DIALECT_TOKENS_MAX && v == floor(v))
        return (int64_t)v;
    return DIALECT_COUNT_BOGUS;
}

static void usage_bogus(struct dialect_usage *u)
{
    *u = DIALECT_USAGE_NONE;
    u->bogus = true;
}

/* Sets *out to DIALECT_USAGE_NONE and reads members names[0..n) of the
 * `usage` map (borrowed, may be NULL) into c[] (obj_count). Returns true
 * when `usage` is a map whose counts can all be true; when one cannot,
 * *out is bogus. */
static bool usage_counts(const msgpack_object *usage, const char *const *names, int64_t *c,
                         size_t n, struct dialect_usage *out)
{
    *out = DIALECT_USAGE_NONE;
    if (!usage || usage->type != MSGPACK_OBJECT_MAP)
        return false;
    for (size_t i = 0; i < n; i++) {
        c[i] = obj_count(rpc_map_get(usage, names[i]));
        if (c[i] < -1) {
            usage_bogus(out);
            return false;
        }
    }
    return true;
}

static void event_init(struct dialect_event *out)
{
    memset(out, 0, sizeof(*out));
    out->usage = DIALECT_USAGE_NONE;
}

/* Marks `out` an error event of type `t` (a string that is not empty,
 * else "error"). */
static void event_error(struct dialect_event *out, const msgpack_object *t)
{
    out->error = true;
    snprintf(out->error_type, sizeof(out->error_type), "%s", "error");
    if (t && t->type == MSGPACK_OBJECT_STR && t->via.str.size > 0)
        rpc_quote_client_str(t->via.str.ptr, t->via.str.size, sizeof(out->error_type) - 1,
                             out->error_type);
}

/* --- OpenAI and Azure ------------------------------------------------ */

void dialect_openai_count(struct dialect_usage *u, const char *name, size_t len, int64_t count)
{
    static const char *const names[3] = { "prompt_tokens", "completion_tokens", "total_tokens" };
    int64_t *fields[3] = { &u->prompt, &u->completion, &u->total };

    for (int i = 0; i < 3; i++) {
        if (strlen(names[i]) != len || memcmp(names[i], name, len) != 0)
            continue;
        if (count < -1)
            usage_bogus(u);
        else if (!u->bogus)
            *fields[i] = count;
        return;
    }
}

void dialect_openai_detail(struct dialect_usage *u, const char *name, size_t len, int64_t count)
{
    int64_t *field;

    if (len == strlen("cached_tokens") && memcmp(name, "cached_tokens", len) == 0)
        field = &u->cached;
    else if (len == strlen("reasoning_tokens") && memcmp(name, "reasoning_tokens", len) == 0)
        field = &u->reasoning;
    else
        return;
    /* Admission does not need it: a count that cannot be true is dropped
     * alone, the attempt's other counts stand (its cost then prices the
     * whole class it is part of, docs/CONFIG.md §7d). */
    if (!u->bogus)
        *field = count >= 0 ? count : -1;
}

/* The members of map `m` (may be NULL) through `count_fn` (as
 * dialect_openai_count). */
static void openai_scan_map(const msgpack_object *m, struct dialect_usage *out,
                            void (*count_fn)(struct dialect_usage *, const char *, size_t, int64_t))
{
    if (!m || m->type != MSGPACK_OBJECT_MAP)
        return;
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        const msgpack_object_kv *kv = &m->via.map.ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR)
            count_fn(out, kv->key.via.str.ptr, kv->key.via.str.size, obj_count(&kv->val));
    }
}

static void openai_scan_usage(const msgpack_object *usage, struct dialect_usage *out)
{
    *out = DIALECT_USAGE_NONE;
    openai_scan_map(usage, out, dialect_openai_count);
    if (usage && usage->type == MSGPACK_OBJECT_MAP) {
        openai_scan_map(rpc_map_get(usage, "prompt_tokens_details"), out, dialect_openai_detail);
        openai_scan_map(rpc_map_get(usage, "completion_tokens_details"), out,
                        dialect_openai_detail);
    }
}

static void openai_scan_event(const msgpack_object *ev, struct dialect_event *out)
{
    const msgpack_object *choices = rpc_map_get(ev, "choices");
    const msgpack_object *usage = rpc_map_get(ev, "usage");

    event_init(out);
    openai_scan_usage(usage, &out->usage);
    if (choices && choices->type == MSGPACK_OBJECT_ARRAY) {
        for (uint32_t i = 0; i < choices->via.array.size; i++) {
            const msgpack_object *fr = rpc_map_get(&choices->via.array.ptr[i], "finish_reason");
            if (fr && fr->type != MSGPACK_OBJECT_NIL)
                out->terminal = true;
        }
        /* The extra chunk stream_options.include_usage asks for. */
        out->usage_only =
            choices->via.array.size == 0 && usage && usage->type == MSGPACK_OBJECT_MAP;
    }
    const msgpack_object *err = rpc_map_get(ev, "error");
    if (err && err->type == MSGPACK_OBJECT_MAP) {
        /* Some OpenAI-compatible servers (vLLM, OpenRouter) report a failure
         * mid-stream as {"error": {...}}: it is their 5xx. */
        event_error(out, rpc_map_get(err, "type"));
        out->transient = true;
    }
}

/* --- Anthropic ------------------------------------------------------- */

/* Input counts, cache reads and writes included: all are billed input and
 * count against the source's token limits. */
static void anthropic_scan_usage(const msgpack_object *usage, struct dialect_usage *out)
{
    static const char *const names[4] = { "input_tokens", "cache_creation_input_tokens",
                                          "cache_read_input_tokens", "output_tokens" };
    int64_t c[4];

    if (!usage_counts(usage, names, c, 4, out))
        return;
    int64_t in = c[0], cw = c[1], cr = c[2], completion = c[3];
    /* At most 3 * DIALECT_TOKENS_MAX. */
    if (in >= 0)
        out->prompt = in + (cw > 0 ? cw : 0) + (cr > 0 ? cr : 0);
    out->cached = in >= 0 ? cr : -1;
    out->cache_write = in >= 0 ? cw : -1;
    out->completion = completion;
}

/* Error types Anthropic documents as worth retrying. */
static bool anthropic_error_is_transient(const char *type)
{
    static const char *const transient[] = { "overloaded_error", "api_error", "rate_limit_error",
                                             "timeout_error" };
    for (size_t i = 0; i < sizeof(transient) / sizeof(transient[0]); i++)
        if (strcmp(type, transient[i]) == 0)
            return true;
    return false;
}

static void anthropic_scan_event(const msgpack_object *ev, struct dialect_event *out)
{
    const msgpack_object *type = rpc_map_get(ev, "type");

    event_init(out);
    if (!type || type->type != MSGPACK_OBJECT_STR)
        return;
    if (rpc_str_is(type, "message_start")) {
        anthropic_scan_usage(rpc_map_get(rpc_map_get(ev, "message"), "usage"), &out->usage);
    } else if (rpc_str_is(type, "message_delta")) {
        anthropic_scan_usage(rpc_map_get(ev, "usage"), &out->usage);
    } else if (rpc_str_is(type, "message_stop")) {
        out->terminal = true;
    } else if (rpc_str_is(type, "error")) {
        event_error(out, rpc_map_get(rpc_map_get(ev, "error"), "type"));
        out->transient = anthropic_error_is_transient(out->error_type);
    }
}

/* --- OpenAI's Responses API ------------------------------------------ */

/* {"input_tokens", "input_tokens_details": {"cached_tokens"}, "output_tokens",
 * "output_tokens_details": {"reasoning_tokens"}, "total_tokens"}: cached
 * input is part of input_tokens and reasoning part of output_tokens, as
 * in struct dialect_usage. */
static void responses_scan_usage(const msgpack_object *usage, struct dialect_usage *out)
{
    static const char *const names[3] = { "input_tokens", "output_tokens", "total_tokens" };
    int64_t c[3];

    if (!usage_counts(usage, names, c, 3, out))
        return;
    out->prompt = c[0];
    out->completion = c[1];
    out->total = c[2];
    openai_scan_map(rpc_map_get(usage, "input_tokens_details"), out, dialect_openai_detail);
    openai_scan_map(rpc_map_get(usage, "output_tokens_details"), out, dialect_openai_detail);
}

/* An error with `code` (borrowed, may be NULL): transient for
 * server_error, rate_limit_exceeded and an error without a code. */
static void responses_error(const msgpack_object *code, struct dialect_event *out)
{
    event_error(out, code);
    out->transient = strcmp(out->error_type, "server_error") == 0 ||
        strcmp(out->error_type, "rate_limit_exceeded") == 0 ||
        strcmp(out->error_type, "error") == 0;
}

/* Terminal: response.completed and response.incomplete (both carry the
 * response with its usage); response.failed also ends the stream, as a
 * failure; so does an `error` event. */
static void responses_scan_event(const msgpack_object *ev, struct dialect_event *out)
{
    const msgpack_object *type = rpc_map_get(ev, "type");

    event_init(out);
    if (!type || type->type != MSGPACK_OBJECT_STR)
        return;
    if (rpc_str_is(type, "response.completed") || rpc_str_is(type, "response.incomplete")) {
        out->terminal = true;
        responses_scan_usage(rpc_map_get(rpc_map_get(ev, "response"), "usage"), &out->usage);
    } else if (rpc_str_is(type, "response.failed")) {
        const msgpack_object *resp = rpc_map_get(ev, "response");
        out->terminal = true;
        responses_scan_usage(rpc_map_get(resp, "usage"), &out->usage);
        responses_error(rpc_map_get(rpc_map_get(resp, "error"), "code"), out);
    } else if (rpc_str_is(type, "error")) {
        responses_error(rpc_map_get(ev, "code"), out);
    }
}

/* --- Gemini ---------------------------------------------------------- */

/* usageMetadata: {"promptTokenCount", "cachedContentTokenCount",
 * "candidatesTokenCount", "toolUsePromptTokenCount", "thoughtsTokenCount",
 * "totalTokenCount"}. The prompt is promptTokenCount plus the tool-use
 * prompt (both billed input; the cached count is part of the former); the
 * completion is candidatesTokenCount plus thoughtsTokenCount (Gemini bills
 * thinking as output, and does not count it in candidatesTokenCount), so
 * `reasoning` is part of `completion` as for OpenAI. */
static void gemini_scan_usage(const msgpack_object *usage, struct dialect_usage *out)
{
    static const char *const names[6] = { "promptTokenCount",     "cachedContentTokenCount",
                                          "candidatesTokenCount", "toolUsePromptTokenCount",
                                          "thoughtsTokenCount",   "totalTokenCount" };
    int64_t c[6];

    if (!usage_counts(usage, names, c, 6, out))
        return;
    int64_t prompt = c[0], cached = c[1], cand = c[2], tool = c[3], thoughts = c[4];
    /* Each at most DIALECT_TOKENS_MAX: the sums fit. */
    if (prompt >= 0)
        out->prompt = prompt + (tool > 0 ? tool : 0);
    out->cached = prompt >= 0 ? cached : -1;
    if (cand >= 0 || thoughts >= 0)
        out->completion = (cand > 0 ? cand : 0) + (thoughts > 0 ? thoughts : 0);
    out->reasoning = thoughts;
    out->total = c[5];
}

/* Statuses (google.rpc.Code names) Gemini documents as worth retrying. */
static bool gemini_error_is_transient(const char *status, const msgpack_object *code)
{
    static const char *const transient[] = { "UNAVAILABLE", "RESOURCE_EXHAUSTED", "INTERNAL",
                                             "DEADLINE_EXCEEDED" };
    for (size_t i = 0; i < sizeof(transient) / sizeof(transient[0]); i++)
        if (strcmp(status, transient[i]) == 0)
            return true;
    int64_t c = obj_count(code);
    return c == 429 || c == 500 || c == 503 || c == 504;
}

/* An event is a GenerateContentResponse: terminal when a candidate has a
 * finishReason, or when the prompt was blocked (promptFeedback.blockReason:
 * no candidate follows); {"error": {"code", "message", "status"}} is a
 * failure inside the stream. */
static void gemini_scan_event(const msgpack_object *ev, struct dialect_event *out)
{
    const msgpack_object *cands = rpc_map_get(ev, "candidates");
    const msgpack_object *block = rpc_map_get(rpc_map_get(ev, "promptFeedback"), "blockReason");

    event_init(out);
    gemini_scan_usage(rpc_map_get(ev, "usageMetadata"), &out->usage);
    if (cands && cands->type == MSGPACK_OBJECT_ARRAY) {
        for (uint32_t i = 0; i < cands->via.array.size; i++) {
            const msgpack_object *fr = rpc_map_get(&cands->via.array.ptr[i], "finishReason");
            if (fr && fr->type != MSGPACK_OBJECT_NIL)
                out->terminal = true;
        }
    }
    if (block && block->type != MSGPACK_OBJECT_NIL)
        out->terminal = true;
    const msgpack_object *err = rpc_map_get(ev, "error");
    if (err && err->type == MSGPACK_OBJECT_MAP) {
        event_error(out, rpc_map_get(err, "status"));
        out->transient = gemini_error_is_transient(out->error_type, rpc_map_get(err, "code"));
    }
}

/* --- the table ------------------------------------------------------- */

#define CHAT_STREAM_END      "[DONE], a finish_reason"
#define RESPONSES_STREAM_END "response.completed, response.incomplete, response.failed"

/* How OpenAI and Azure take a source's key and version, whichever of
 * their APIs is called. */
#define OPENAI_KEY                                                            \
    .name = "openai", .key_header = "Authorization", .key_prefix = "Bearer ", \
    .chat_path = "/chat/completions"
#define AZURE_KEY                                                                               \
    .name = "azure", .key_header = "api-key", .key_prefix = "", .version_query = "api-version", \
    .chat_path = "/chat/completions"

static const struct dialect dialects[DIALECT_COUNT] = {
    [DIALECT_OPENAI] = {
        OPENAI_KEY,
        .stream_usage = true,
        .chat_facts = true,
        .stream_end = CHAT_STREAM_END,
        .scan_event = openai_scan_event,
        .scan_usage = openai_scan_usage,
    },
    [DIALECT_AZURE] = {
        AZURE_KEY,
        .stream_usage = true,
        .chat_facts = true,
        .stream_end = CHAT_STREAM_END,
        .scan_event = openai_scan_event,
        .scan_usage = openai_scan_usage,
    },
    [DIALECT_ANTHROPIC] = {
        .name = "anthropic",
        .key_header = "x-api-key",
        .key_prefix = "",
        .version_header = "anthropic-version",
        .chat_path = "/messages",
        .stream_usage = false,
        .stream_end = "message_stop",
        .last_is_terminal = true,
        .scan_event = anthropic_scan_event,
        .scan_usage = anthropic_scan_usage,
    },
    [DIALECT_GEMINI] = {
        .name = "gemini",
        .key_header = "x-goog-api-key",
        .key_prefix = "",
        /* Never used as written: a gemini source's path is
         * /models/{model}:{method} (call.c). */
        .chat_path = ":generateContent",
        .stream_usage = false,
        .stream_end = "a finishReason",
        .last_is_terminal = true,
        .usage_member = "usageMetadata",
        .scan_event = gemini_scan_event,
        .scan_usage = gemini_scan_usage,
    },
    [DIALECT_BEDROCK] = {
        .name = "bedrock",
        /* No key header: every request is signed (sidecar/cloud/bedrock.h).
         * Never used as written: the path is /model/{id}/invoke. */
        .chat_path = "/invoke",
        .stream_usage = false,
        .stream_end = "message_stop",
        .last_is_terminal = true,
        .scan_event = anthropic_scan_event,
        .scan_usage = anthropic_scan_usage,
    },
};

/* The Responses API, by the key conventions of OpenAI and Azure. */
static const struct dialect responses_dialects[2] = {
    {
        OPENAI_KEY,
        .stream_end = RESPONSES_STREAM_END,
        .last_is_terminal = true,
        .responses = true,
        .scan_event = responses_scan_event,
        .scan_usage = responses_scan_usage,
    },
    {
        AZURE_KEY,
        .stream_end = RESPONSES_STREAM_END,
        .last_is_terminal = true,
        .responses = true,
        .scan_event = responses_scan_event,
        .scan_usage = responses_scan_usage,
    },
};

bool dialect_path_is_responses(const char *path)
{
    static const char suffix[] = "/responses";
    size_t n = path ? strlen(path) : 0;

    return n >= sizeof(suffix) - 1 && strcmp(path + n - (sizeof(suffix) - 1), suffix) == 0;
}

const struct dialect *dialect_for(enum dialect_kind kind, const char *path)
{
    if ((kind == DIALECT_OPENAI || kind == DIALECT_AZURE) && dialect_path_is_responses(path))
        return &responses_dialects[kind == DIALECT_AZURE];
    return dialect_get(kind);
}

const struct dialect *dialect_get(enum dialect_kind kind)
{
    return (unsigned)kind < DIALECT_COUNT ? &dialects[kind] : &dialects[DIALECT_OPENAI];
}

bool dialect_is_messages(enum dialect_kind kind)
{
    return kind == DIALECT_ANTHROPIC || kind == DIALECT_BEDROCK;
}

int dialect_from_name(const char *name)
{
    for (int i = 0; name && i < DIALECT_COUNT; i++)
        if (strcmp(name, dialects[i].name) == 0)
            return i;
    return -1;
}

void dialect_usage_merge(struct dialect_usage *acc, const struct dialect_usage *ev)
{
    if (acc->bogus)
        return;
    if (ev->bogus) {
        usage_bogus(acc);
        return;
    }
    if (ev->prompt >= 0)
        acc->prompt = ev->prompt;
    if (ev->completion >= 0)
        acc->completion = ev->completion;
    if (ev->total >= 0)
        acc->total = ev->total;
    if (ev->cached >= 0)
        acc->cached = ev->cached;
    if (ev->cache_write >= 0)
        acc->cache_write = ev->cache_write;
    if (ev->reasoning >= 0)
        acc->reasoning = ev->reasoning;
}

int64_t dialect_usage_cached(const struct dialect_usage *u)
{
    if (u->bogus || u->prompt < 0 || u->cached < 0 || u->cached > u->prompt)
        return -1;
    return u->cached;
}

bool dialect_usage_classes(const struct dialect_usage *u, struct cost_tokens *t)
{
    memset(t, 0, sizeof(*t));
    if (u->bogus || u->prompt < 0)
        return false;
    int64_t rest = u->prompt;
    if (u->cached >= 0 && u->cached <= rest) {
        t->n[COST_CACHED] = u->cached;
        rest -= u->cached;
    }
    if (u->cache_write >= 0 && u->cache_write <= rest) {
        t->n[COST_CACHE_WRITE] = u->cache_write;
        rest -= u->cache_write;
    }
    t->n[COST_INPUT] = rest;
    if (u->completion > 0) {
        rest = u->completion;
        if (u->reasoning >= 0 && u->reasoning <= rest) {
            t->n[COST_REASONING] = u->reasoning;
            rest -= u->reasoning;
        }
        t->n[COST_OUTPUT] = rest;
    }
    return true;
}

int64_t dialect_usage_total(const struct dialect_usage *u)
{
    if (u->bogus)
        return -1;
    if (u->total >= 0)
        return u->total;
    if (u->prompt < 0 && u->completion < 0)
        return -1;
    /* Each at most 3 * DIALECT_TOKENS_MAX: the sum fits. */
    return (int64_t)((uint64_t)(u->prompt > 0 ? u->prompt : 0) +
                     (uint64_t)(u->completion > 0 ? u->completion : 0));
}

/* --- retry hints ----------------------------------------------------- */

int dialect_parse_duration(const char *s, double *out_s)
{
    double total = 0;
    bool any = false;

    if (!s)
        return -1;
    while (*s == ' ')
        s++;
    while (*s && *s != ' ') {
        if (!(*s >= '0' && *s <= '9'))
            return -1;
        char *end;
        double v = strtod(s, &end);
        if (end == s || !(v >= 0))
            return -1;
        s = end;
        if (s[0] == 'm' && s[1] == 's') {
            v /= 1000;
            s += 2;
        } else if (s[0] == 'h') {
            v *= 3600;
            s++;
        } else if (s[0] == 'm') {
            v *= 60;
            s++;
        } else if (s[0] == 's') {
            s++;
        } else {
            return -1;
        }
        total += v;
        any = true;
    }
    while (*s == ' ')
        s++;
    if (!any || *s)
        return -1;
    *out_s = total;
    return 0;
}

void dialect_apply_hints(struct outcome *o, const struct dialect_hints *h)
{
    double s, t;

    if (o->kind == OUTCOME_SUCCESS)
        return;
    if (h->should_retry && strcasecmp(h->should_retry, "true") == 0 &&
        o->kind == OUTCOME_FAIL_FAST && o->reason != REASON_CANCELLED)
        o->kind = OUTCOME_TRANSIENT;
    else if (h->should_retry && strcasecmp(h->should_retry, "false") == 0)
        o->kind = OUTCOME_FAIL_FAST;
    if (o->retry_after_s >= 0 || o->kind == OUTCOME_FAIL_FAST)
        return;
    if (h->retry_after_ms && h->retry_after_ms[0]) {
        char *end;
        double ms = strtod(h->retry_after_ms, &end);
        while (*end == ' ')
            end++;
        if (end != h->retry_after_ms && !*end && ms >= 0 && h->retry_after_ms[0] != '-') {
            s = ms / 1000;
            o->retry_after_s = s < OUTCOME_RETRY_AFTER_MAX_S ? s : OUTCOME_RETRY_AFTER_MAX_S;
            return;
        }
    }
    if (o->reason != REASON_HTTP_429)
        return;
    s = -1;
    if (h->reset_requests && dialect_parse_duration(h->reset_requests, &t) == 0)
        s = t;
    if (h->reset_tokens && dialect_parse_duration(h->reset_tokens, &t) == 0 && t > s)
        s = t;
    if (s >= 0)
        o->retry_after_s = s < OUTCOME_RETRY_AFTER_MAX_S ? s : OUTCOME_RETRY_AFTER_MAX_S;
}
