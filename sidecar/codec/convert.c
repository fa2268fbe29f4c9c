/*
 * convert.c — OpenAI chat <-> Anthropic Messages (contract in convert.h).
 */
#include "convert.h"

#include <stdio.h>
#include <string.h>

#include "dialect.h"
#include "rpc.h"

static bool key_is(const msgpack_object *k, const char *s)
{
    return rpc_str_is(k, s);
}

/* A member that is there and not null (null stands for absent, as the
 * OpenAI SDKs send it). */
static bool present(const msgpack_object *v)
{
    return v && v->type != MSGPACK_OBJECT_NIL;
}

static int fail(char *err, size_t errlen, const char *fmt, const char *what)
{
    if (err && errlen)
        snprintf(err, errlen, fmt, what);
    return CONVERT_EUNSUPPORTED;
}

/* --- request --------------------------------------------------------- */

/* Keys refused: they change what the reply is, and a Messages upstream
 * would answer something else. */
static const char *const refused_keys[] = { "tools",         "functions",       "tool_choice",
                                            "function_call", "response_format", "audio",
                                            "modalities",    "prediction" };
/* OpenAI-only knobs that Messages has no word for and that do not change
 * what a plain text reply means. */
static const char *const dropped_keys[] = { "n",
                                            "user",
                                            "seed",
                                            "presence_penalty",
                                            "frequency_penalty",
                                            "logit_bias",
                                            "logprobs",
                                            "top_logprobs",
                                            "stream_options",
                                            "store",
                                            "parallel_tool_calls",
                                            "service_tier",
                                            "max_completion_tokens",
                                            "max_tokens",
                                            "messages",
                                            "stop" };

static bool in_list(const msgpack_object *k, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (key_is(k, list[i]))
            return true;
    return false;
}

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* msgpack_sbuffer_write without the empty write, which msgpack-c turns
 * into pointer arithmetic on NULL when the buffer is still empty. */
static void sb_put(msgpack_sbuffer *out, const char *p, size_t n)
{
    if (n > 0)
        msgpack_sbuffer_write(out, p, n);
}

/* Appends the text of an OpenAI message content (a string, or an array of
 * {type: "text", text} parts) to `out`, parts joined by "\n". Returns 0, or
 * -1 for anything else (image parts, audio, ...). */
static int content_text(const msgpack_object *c, msgpack_sbuffer *out)
{
    if (c->type == MSGPACK_OBJECT_STR) {
        sb_put(out, c->via.str.ptr, c->via.str.size);
        return 0;
    }
    if (c->type == MSGPACK_OBJECT_NIL)
        return 0;
    if (c->type != MSGPACK_OBJECT_ARRAY)
        return -1;
    for (uint32_t i = 0; i < c->via.array.size; i++) {
        const msgpack_object *part = &c->via.array.ptr[i];
        const msgpack_object *t = rpc_map_get(part, "text");
        if (!rpc_str_is(rpc_map_get(part, "type"), "text") || !t || t->type != MSGPACK_OBJECT_STR)
            return -1;
        if (i > 0)
            sb_put(out, "\n", 1);
        sb_put(out, t->via.str.ptr, t->via.str.size);
    }
    return 0;
}

/* Checks the messages and collects the system prompt; counts the turns. */
static int scan_messages(const msgpack_object *msgs, msgpack_sbuffer *system, uint32_t *turns,
                         char *err, size_t errlen)
{
    if (!msgs || msgs->type != MSGPACK_OBJECT_ARRAY)
        return fail(err, errlen, "%s", "body.messages: expected a list of messages");
    *turns = 0;
    for (uint32_t i = 0; i < msgs->via.array.size; i++) {
        const msgpack_object *m = &msgs->via.array.ptr[i];
        const msgpack_object *role = rpc_map_get(m, "role");
        const msgpack_object *content = rpc_map_get(m, "content");
        msgpack_sbuffer scratch;

        if (present(rpc_map_get(m, "tool_calls")) || present(rpc_map_get(m, "function_call")))
            return fail(err, errlen, "%s",
                        "body.messages: tool calls cannot be converted for "
                        "an Anthropic source (send them to an OpenAI-dialect source)");
        if (rpc_str_is(role, "system") || rpc_str_is(role, "developer")) {
            if (system->size > 0)
                sb_put(system, "\n\n", 2);
            if (!content || content_text(content, system) < 0)
                return fail(err, errlen, "%s", "body.messages: a system message must be text");
            continue;
        }
        if (!rpc_str_is(role, "user") && !rpc_str_is(role, "assistant"))
            return fail(err, errlen, "%s",
                        "body.messages: only system, developer, user and "
                        "assistant messages can be converted for an Anthropic source");
        msgpack_sbuffer_init(&scratch);
        int rc = content ? content_text(content, &scratch) : -1;
        msgpack_sbuffer_destroy(&scratch);
        if (rc < 0)
            return fail(err, errlen, "%s",
                        "body.messages: only text content can be converted "
                        "for an Anthropic source");
        (*turns)++;
    }
    if (*turns == 0)
        return fail(err, errlen, "%s", "body.messages: no user or assistant message");
    return 0;
}

static void pack_strn(msgpack_packer *pk, const char *s, size_t n)
{
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_messages(const msgpack_object *msgs, uint32_t turns, msgpack_packer *pk)
{
    msgpack_pack_array(pk, turns);
    for (uint32_t i = 0; i < msgs->via.array.size; i++) {
        const msgpack_object *m = &msgs->via.array.ptr[i];
        const msgpack_object *role = rpc_map_get(m, "role");
        msgpack_sbuffer text;

        if (!rpc_str_is(role, "user") && !rpc_str_is(role, "assistant"))
            continue;
        msgpack_sbuffer_init(&text);
        content_text(rpc_map_get(m, "content"), &text);
        msgpack_pack_map(pk, 2);
        rpc_pack_str(pk, "role");
        msgpack_pack_object(pk, *role);
        rpc_pack_str(pk, "content");
        pack_strn(pk, text.data ? text.data : "", text.size);
        msgpack_sbuffer_destroy(&text);
    }
}

int convert_chat_request(const msgpack_object *body, msgpack_packer *pk, char *err, size_t errlen)
{
    msgpack_sbuffer system;
    uint32_t turns, n = 0;
    int rc;

    if (body->type != MSGPACK_OBJECT_MAP)
        return fail(err, errlen, "%s", "body: expected a map");
    for (uint32_t i = 0; i < body->via.map.size; i++) {
        const msgpack_object *k = &body->via.map.ptr[i].key;
        const msgpack_object *v = &body->via.map.ptr[i].val;
        char name[40];
        if (in_list(k, refused_keys, N_OF(refused_keys)) && v->type != MSGPACK_OBJECT_NIL) {
            rpc_quote_client_str(k->via.str.ptr, k->via.str.size, sizeof(name) - 1, name);
            return fail(err, errlen,
                        "body.%s: cannot be converted for an Anthropic source "
                        "(send it to a source of its own dialect)",
                        name);
        }
        if (key_is(k, "n") && !(v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 == 1) &&
            v->type != MSGPACK_OBJECT_NIL)
            return fail(err, errlen, "%s", "body.n: only one choice can be converted");
        if (key_is(k, "logprobs") && v->type == MSGPACK_OBJECT_BOOLEAN && v->via.boolean)
            return fail(err, errlen, "%s", "body.logprobs: cannot be converted");
        if ((key_is(k, "max_tokens") || key_is(k, "max_completion_tokens")) &&
            v->type != MSGPACK_OBJECT_NIL &&
            !(v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 > 0)) {
            rpc_quote_client_str(k->via.str.ptr, k->via.str.size, sizeof(name) - 1, name);
            return fail(err, errlen, "body.%s: must be a positive integer", name);
        }
    }
    msgpack_sbuffer_init(&system);
    if ((rc = scan_messages(rpc_map_get(body, "messages"), &system, &turns, err, errlen)) < 0) {
        msgpack_sbuffer_destroy(&system);
        return rc;
    }

    const msgpack_object *maxt = rpc_map_get(body, "max_completion_tokens");
    if (!maxt || maxt->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        maxt = rpc_map_get(body, "max_tokens");
    const msgpack_object *stop = rpc_map_get(body, "stop");
    bool has_stop = stop &&
        (stop->type == MSGPACK_OBJECT_STR ||
         (stop->type == MSGPACK_OBJECT_ARRAY && stop->via.array.size > 0));

    for (uint32_t i = 0; i < body->via.map.size; i++)
        n += !in_list(&body->via.map.ptr[i].key, dropped_keys, N_OF(dropped_keys)) &&
            !in_list(&body->via.map.ptr[i].key, refused_keys, N_OF(refused_keys));
    n += 2 + (system.size > 0) + has_stop; /* messages, max_tokens */

    msgpack_pack_map(pk, n);
    for (uint32_t i = 0; i < body->via.map.size; i++) {
        const msgpack_object_kv *kv = &body->via.map.ptr[i];
        if (in_list(&kv->key, dropped_keys, N_OF(dropped_keys)) ||
            in_list(&kv->key, refused_keys, N_OF(refused_keys)))
            continue;
        msgpack_pack_object(pk, kv->key);
        msgpack_pack_object(pk, kv->val);
    }
    if (system.size > 0) {
        rpc_pack_str(pk, "system");
        pack_strn(pk, system.data, system.size);
    }
    rpc_pack_str(pk, "messages");
    pack_messages(rpc_map_get(body, "messages"), turns, pk);
    rpc_pack_str(pk, "max_tokens");
    if (maxt && maxt->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        msgpack_pack_uint64(pk, maxt->via.u64);
    else
        msgpack_pack_uint32(pk, CONVERT_DEFAULT_MAX_TOKENS);
    if (has_stop) {
        rpc_pack_str(pk, "stop_sequences");
        if (stop->type == MSGPACK_OBJECT_STR) {
            msgpack_pack_array(pk, 1);
            msgpack_pack_object(pk, *stop);
        } else {
            msgpack_pack_object(pk, *stop);
        }
    }
    msgpack_sbuffer_destroy(&system);
    return 0;
}

/* --- reply and stream ------------------------------------------------ */

static const char *finish_reason(const msgpack_object *stop_reason)
{
    if (rpc_str_is(stop_reason, "max_tokens"))
        return "length";
    if (rpc_str_is(stop_reason, "tool_use"))
        return "tool_calls";
    if (rpc_str_is(stop_reason, "refusal"))
        return "content_filter";
    return "stop";
}

/* The counts of Anthropic `usage` map `u` (borrowed, may be NULL), read as
 * the sidecar counts them (dialect.h: cache reads and writes are input). */
static struct dialect_usage anthropic_usage(const msgpack_object *u)
{
    struct dialect_usage c;
    dialect_get(DIALECT_ANTHROPIC)->scan_usage(u, &c);
    return c;
}

/* OpenAI's usage map for counts `c` (unknown ones as 0). */
static void pack_usage(msgpack_packer *pk, const struct dialect_usage *c)
{
    /* Each count at most 3 * DIALECT_TOKENS_MAX (dialect.h): the sum fits. */
    uint64_t prompt = c->prompt > 0 ? (uint64_t)c->prompt : 0;
    uint64_t completion = c->completion > 0 ? (uint64_t)c->completion : 0;
    msgpack_pack_map(pk, 3);
    rpc_pack_kv_u64(pk, "prompt_tokens", prompt);
    rpc_pack_kv_u64(pk, "completion_tokens", completion);
    rpc_pack_kv_u64(pk, "total_tokens", prompt + completion);
}

static void pack_str_or(msgpack_packer *pk, const msgpack_object *s, const char *dflt)
{
    if (s && s->type == MSGPACK_OBJECT_STR)
        msgpack_pack_object(pk, *s);
    else
        rpc_pack_str(pk, dflt);
}

int convert_chat_reply(const msgpack_object *msg, int64_t created, msgpack_packer *pk)
{
    const msgpack_object *content = rpc_map_get(msg, "content");
    struct dialect_usage usage = anthropic_usage(rpc_map_get(msg, "usage"));
    msgpack_sbuffer text;

    const msgpack_object *type = rpc_map_get(msg, "type");
    if (msg->type != MSGPACK_OBJECT_MAP || !content || content->type != MSGPACK_OBJECT_ARRAY ||
        (type && !rpc_str_is(type, "message")))
        return CONVERT_EREPLY;
    msgpack_sbuffer_init(&text);
    for (uint32_t i = 0; i < content->via.array.size; i++) {
        const msgpack_object *b = &content->via.array.ptr[i];
        const msgpack_object *t = rpc_map_get(b, "text");
        if (rpc_str_is(rpc_map_get(b, "type"), "text") && t && t->type == MSGPACK_OBJECT_STR)
            sb_put(&text, t->via.str.ptr, t->via.str.size);
    }
    msgpack_pack_map(pk, usage.bogus ? 5 : 6);
    rpc_pack_str(pk, "id");
    pack_str_or(pk, rpc_map_get(msg, "id"), "msg");
    rpc_pack_kv_str(pk, "object", "chat.completion");
    rpc_pack_str(pk, "created");
    msgpack_pack_int64(pk, created);
    rpc_pack_str(pk, "model");
    pack_str_or(pk, rpc_map_get(msg, "model"), "");
    rpc_pack_str(pk, "choices");
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 3);
    rpc_pack_kv_u64(pk, "index", 0);
    rpc_pack_str(pk, "message");
    msgpack_pack_map(pk, 2);
    rpc_pack_kv_str(pk, "role", "assistant");
    rpc_pack_str(pk, "content");
    pack_strn(pk, text.data ? text.data : "", text.size);
    rpc_pack_kv_str(pk, "finish_reason", finish_reason(rpc_map_get(msg, "stop_reason")));
    if (!usage.bogus) {
        rpc_pack_str(pk, "usage");
        pack_usage(pk, &usage);
    }
    msgpack_sbuffer_destroy(&text);
    return 0;
}

void convert_stream_init(struct convert_stream *st, int64_t created, bool include_usage)
{
    memset(st, 0, sizeof(*st));
    st->created = created;
    st->include_usage = include_usage;
    st->usage = DIALECT_USAGE_NONE;
}

static void copy_str(char *dst, size_t cap, const msgpack_object *s)
{
    size_t n = 0;
    if (s && s->type == MSGPACK_OBJECT_STR) {
        n = s->via.str.size < cap - 1 ? s->via.str.size : cap - 1;
        memcpy(dst, s->via.str.ptr, n);
    }
    dst[n] = '\0';
}

/* {"id", "object", "created", "model", "choices": [...] (the caller packs
 * the choices array's content) [, "usage": ...]} */
static void chunk_begin(const struct convert_stream *st, msgpack_packer *pk, bool with_usage)
{
    msgpack_pack_map(pk, 5 + with_usage);
    rpc_pack_kv_str(pk, "id", st->id);
    rpc_pack_kv_str(pk, "object", "chat.completion.chunk");
    rpc_pack_str(pk, "created");
    msgpack_pack_int64(pk, st->created);
    rpc_pack_kv_str(pk, "model", st->model);
    rpc_pack_str(pk, "choices");
}

/* One choice: {"index": 0, "delta": {<role?>, <content?>}, "finish_reason"}. */
static void pack_choice(msgpack_packer *pk, bool role, const char *text, size_t len,
                        const char *finish)
{
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 3);
    rpc_pack_kv_u64(pk, "index", 0);
    rpc_pack_str(pk, "delta");
    msgpack_pack_map(pk, (role ? 1 : 0) + (text ? 1 : 0));
    if (role)
        rpc_pack_kv_str(pk, "role", "assistant");
    if (text) {
        rpc_pack_str(pk, "content");
        pack_strn(pk, text, len);
    }
    rpc_pack_str(pk, "finish_reason");
    if (finish)
        rpc_pack_str(pk, finish);
    else
        msgpack_pack_nil(pk);
}

int convert_chat_event(struct convert_stream *st, const msgpack_object *ev, msgpack_packer *pk)
{
    const msgpack_object *type = rpc_map_get(ev, "type");

    if (rpc_str_is(type, "message_start")) {
        const msgpack_object *m = rpc_map_get(ev, "message");
        copy_str(st->id, sizeof(st->id), rpc_map_get(m, "id"));
        copy_str(st->model, sizeof(st->model), rpc_map_get(m, "model"));
        struct dialect_usage u = anthropic_usage(rpc_map_get(m, "usage"));
        dialect_usage_merge(&st->usage, &u);
        chunk_begin(st, pk, false);
        pack_choice(pk, true, "", 0, NULL);
        return 1;
    }
    if (rpc_str_is(type, "content_block_delta")) {
        const msgpack_object *d = rpc_map_get(ev, "delta");
        const msgpack_object *t = rpc_map_get(d, "text");
        if (!rpc_str_is(rpc_map_get(d, "type"), "text_delta") || !t ||
            t->type != MSGPACK_OBJECT_STR)
            return 0;
        chunk_begin(st, pk, false);
        pack_choice(pk, false, t->via.str.ptr, t->via.str.size, NULL);
        return 1;
    }
    if (rpc_str_is(type, "message_delta")) {
        struct dialect_usage u = anthropic_usage(rpc_map_get(ev, "usage"));
        dialect_usage_merge(&st->usage, &u);
        chunk_begin(st, pk, false);
        pack_choice(pk, false, NULL, 0,
                    finish_reason(rpc_map_get(rpc_map_get(ev, "delta"), "stop_reason")));
        return 1;
    }
    if (rpc_str_is(type, "message_stop") && st->include_usage && !st->usage.bogus) {
        chunk_begin(st, pk, true);
        msgpack_pack_array(pk, 0);
        rpc_pack_str(pk, "usage");
        pack_usage(pk, &st->usage);
        return 1;
    }
    return 0;
}
