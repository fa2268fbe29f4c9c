/*
 * converse.c — Anthropic Messages <-> Bedrock Converse (contract in converse.h).
 */
#include "converse.h"

#include <stdio.h>
#include <string.h>

#include "rpc.h"

static bool present(const msgpack_object *v)
{
    return v && v->type != MSGPACK_OBJECT_NIL;
}

static bool is_number(const msgpack_object *v)
{
    return v->type == MSGPACK_OBJECT_POSITIVE_INTEGER ||
        v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER || v->type == MSGPACK_OBJECT_FLOAT32 ||
        v->type == MSGPACK_OBJECT_FLOAT64;
}

static int refuse(char *err, size_t errlen, const char *fmt, const char *what)
{
    if (err && errlen)
        snprintf(err, errlen, fmt, what);
    return CONVERT_EUNSUPPORTED;
}

/* --- request --------------------------------------------------------- */

/* The Messages keys and where each goes; any other is refused. */
enum key_role { K_DROP, K_MESSAGES, K_SYSTEM, K_INFERENCE, K_ADDITIONAL };
static const struct {
    const char *messages_key, *converse_key;
    enum key_role role;
} keys[] = {
    { "model", NULL, K_DROP },
    { "stream", NULL, K_DROP },
    { "anthropic_version", NULL, K_DROP },
    { "metadata", NULL, K_DROP },
    { "messages", "messages", K_MESSAGES },
    { "system", "system", K_SYSTEM },
    { "max_tokens", "maxTokens", K_INFERENCE },
    { "temperature", "temperature", K_INFERENCE },
    { "top_p", "topP", K_INFERENCE },
    { "stop_sequences", "stopSequences", K_INFERENCE },
    { "top_k", "top_k", K_ADDITIONAL },
};
#define N_KEYS (sizeof(keys) / sizeof(keys[0]))

static int key_index(const msgpack_object *k)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (rpc_str_is(k, keys[i].messages_key))
            return (int)i;
    return -1;
}

/* Is `c` Messages content the Converse body can carry: a string, or a
 * list of {type: "text", text} blocks? */
static bool content_is_text(const msgpack_object *c)
{
    if (c->type == MSGPACK_OBJECT_STR)
        return true;
    if (c->type != MSGPACK_OBJECT_ARRAY)
        return false;
    for (uint32_t i = 0; i < c->via.array.size; i++) {
        const msgpack_object *b = &c->via.array.ptr[i];
        const msgpack_object *t = rpc_map_get(b, "text");
        if (!rpc_str_is(rpc_map_get(b, "type"), "text") || !t || t->type != MSGPACK_OBJECT_STR)
            return false;
    }
    return true;
}

/* Content `c` (checked by content_is_text) as Converse blocks [{text}]. */
static void pack_blocks(const msgpack_object *c, msgpack_packer *pk)
{
    if (c->type == MSGPACK_OBJECT_STR) {
        msgpack_pack_array(pk, 1);
        msgpack_pack_map(pk, 1);
        rpc_pack_str(pk, "text");
        msgpack_pack_object(pk, *c);
        return;
    }
    msgpack_pack_array(pk, c->via.array.size);
    for (uint32_t i = 0; i < c->via.array.size; i++) {
        msgpack_pack_map(pk, 1);
        rpc_pack_str(pk, "text");
        msgpack_pack_object(pk, *rpc_map_get(&c->via.array.ptr[i], "text"));
    }
}

static int check_value(int ki, const msgpack_object *v, char *err, size_t errlen)
{
    const char *name = keys[ki].messages_key;

    switch (keys[ki].role) {
    case K_MESSAGES:
        if (v->type != MSGPACK_OBJECT_ARRAY || v->via.array.size == 0)
            return refuse(err, errlen, "%s", "body.messages: expected a list of messages");
        for (uint32_t i = 0; i < v->via.array.size; i++) {
            const msgpack_object *m = &v->via.array.ptr[i];
            const msgpack_object *role = rpc_map_get(m, "role");
            const msgpack_object *content = rpc_map_get(m, "content");
            if (!rpc_str_is(role, "user") && !rpc_str_is(role, "assistant"))
                return refuse(err, errlen, "%s",
                              "body.messages: only user and assistant messages can be "
                              "sent to the Bedrock Converse API");
            if (!content || !content_is_text(content))
                return refuse(err, errlen, "%s",
                              "body.messages: only text content can be sent to the "
                              "Bedrock Converse API");
        }
        return 0;
    case K_SYSTEM:
        if (!content_is_text(v))
            return refuse(err, errlen, "%s", "body.system: must be text");
        return 0;
    case K_INFERENCE:
        if (strcmp(name, "max_tokens") == 0 &&
            !(v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 > 0 &&
              v->via.u64 <= INT32_MAX))
            return refuse(err, errlen, "%s", "body.max_tokens: must be a positive integer");
        if (strcmp(name, "stop_sequences") == 0) {
            bool ok = v->type == MSGPACK_OBJECT_ARRAY;
            for (uint32_t i = 0; ok && i < v->via.array.size; i++)
                ok = v->via.array.ptr[i].type == MSGPACK_OBJECT_STR;
            if (!ok)
                return refuse(err, errlen, "%s", "body.stop_sequences: must be a list of strings");
            return 0;
        }
        if (!is_number(v))
            return refuse(err, errlen, "body.%s: must be a number", name);
        return 0;
    case K_ADDITIONAL:
        if (!is_number(v))
            return refuse(err, errlen, "body.%s: must be a number", name);
        return 0;
    case K_DROP:
        break;
    }
    return 0;
}

/* Packs the members of `body` whose key has role `role`, renamed. */
static void pack_group(const msgpack_object *body, enum key_role role, msgpack_packer *pk)
{
    for (uint32_t i = 0; i < body->via.map.size; i++) {
        const msgpack_object_kv *kv = &body->via.map.ptr[i];
        int ki = key_index(&kv->key);
        if (ki >= 0 && keys[ki].role == role && present(&kv->val)) {
            rpc_pack_str(pk, keys[ki].converse_key);
            msgpack_pack_object(pk, kv->val);
        }
    }
}

int converse_request(const msgpack_object *body, msgpack_packer *pk, char *err, size_t errlen)
{
    uint32_t count[K_ADDITIONAL + 1] = { 0 };

    if (body->type != MSGPACK_OBJECT_MAP)
        return refuse(err, errlen, "%s", "body: expected a map");
    for (uint32_t i = 0; i < body->via.map.size; i++) {
        const msgpack_object_kv *kv = &body->via.map.ptr[i];
        int ki = key_index(&kv->key);
        if (!present(&kv->val))
            continue;
        if (ki < 0) {
            char name[40];
            if (kv->key.type == MSGPACK_OBJECT_STR)
                rpc_quote_client_str(kv->key.via.str.ptr, kv->key.via.str.size, sizeof(name) - 1,
                                     name);
            else
                snprintf(name, sizeof(name), "%s", "?");
            return refuse(err, errlen,
                          "body.%s: cannot be sent to the Bedrock Converse API (send it to a "
                          "source of its own dialect)",
                          name);
        }
        int rc = check_value(ki, &kv->val, err, errlen);
        if (rc < 0)
            return rc;
        count[keys[ki].role]++;
    }
    if (count[K_MESSAGES] == 0)
        return refuse(err, errlen, "%s", "body.messages: no user or assistant message");

    const msgpack_object *msgs = rpc_map_get(body, "messages");
    const msgpack_object *system = rpc_map_get(body, "system");
    msgpack_pack_map(
        pk, 1 + (count[K_SYSTEM] > 0) + (count[K_INFERENCE] > 0) + (count[K_ADDITIONAL] > 0));
    rpc_pack_str(pk, "messages");
    msgpack_pack_array(pk, msgs->via.array.size);
    for (uint32_t i = 0; i < msgs->via.array.size; i++) {
        const msgpack_object *m = &msgs->via.array.ptr[i];
        msgpack_pack_map(pk, 2);
        rpc_pack_str(pk, "role");
        msgpack_pack_object(pk, *rpc_map_get(m, "role"));
        rpc_pack_str(pk, "content");
        pack_blocks(rpc_map_get(m, "content"), pk);
    }
    if (count[K_SYSTEM] > 0) {
        rpc_pack_str(pk, "system");
        pack_blocks(system, pk);
    }
    if (count[K_INFERENCE] > 0) {
        rpc_pack_str(pk, "inferenceConfig");
        msgpack_pack_map(pk, count[K_INFERENCE]);
        pack_group(body, K_INFERENCE, pk);
    }
    if (count[K_ADDITIONAL] > 0) {
        rpc_pack_str(pk, "additionalModelRequestFields");
        msgpack_pack_map(pk, count[K_ADDITIONAL]);
        pack_group(body, K_ADDITIONAL, pk);
    }
    return 0;
}

/* --- reply ----------------------------------------------------------- */

/* Converse's stopReason as Messages names it (`n` bytes of `s`), in `buf`
 * (`cap` bytes): a longer reason is cut at a character boundary, so that
 * it stays valid UTF-8, as the JSON it came from was. */
static const char *stop_reason_of(const char *s, size_t n, char *buf, size_t cap)
{
    static const struct {
        const char *converse, *messages;
    } map[] = {
        { "guardrail_intervened", "refusal" },
        { "content_filtered", "refusal" },
        { "model_context_window_exceeded", "max_tokens" },
    };
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (strlen(map[i].converse) == n && memcmp(map[i].converse, s, n) == 0)
            return map[i].messages;
    if (n > cap - 1) {
        n = cap - 1;
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
            n--; /* s[n] continues the character before it: cut that one too */
    }
    memcpy(buf, s, n);
    buf[n] = '\0';
    return buf;
}

static void pack_stop_reason(msgpack_packer *pk, const char *reason)
{
    if (reason && *reason)
        rpc_pack_str(pk, reason);
    else
        msgpack_pack_nil(pk);
}

/* Converse `usage` (a map) as Messages' `usage`: the counts copied as they
 * came, renamed. */
static void pack_usage(const msgpack_object *u, msgpack_packer *pk)
{
    static const char *const names[][2] = {
        { "inputTokens", "input_tokens" },
        { "outputTokens", "output_tokens" },
        { "cacheReadInputTokens", "cache_read_input_tokens" },
        { "cacheWriteInputTokens", "cache_creation_input_tokens" },
    };
    uint32_t n = 0;

    for (size_t i = 0; i < 4; i++)
        n += rpc_map_get(u, names[i][0]) != NULL;
    msgpack_pack_map(pk, n);
    for (size_t i = 0; i < 4; i++) {
        const msgpack_object *v = rpc_map_get(u, names[i][0]);
        if (v) {
            rpc_pack_str(pk, names[i][1]);
            msgpack_pack_object(pk, *v);
        }
    }
}

int converse_reply(const msgpack_object *reply, msgpack_packer *pk)
{
    const msgpack_object *msg = rpc_map_get(rpc_map_get(reply, "output"), "message");
    const msgpack_object *content = rpc_map_get(msg, "content");
    const msgpack_object *stop = rpc_map_get(reply, "stopReason");
    const msgpack_object *usage = rpc_map_get(reply, "usage");
    bool has_usage = usage && usage->type == MSGPACK_OBJECT_MAP;
    char buf[40];
    uint32_t texts = 0;

    if (reply->type != MSGPACK_OBJECT_MAP || !content || content->type != MSGPACK_OBJECT_ARRAY)
        return CONVERT_EREPLY;
    for (uint32_t i = 0; i < content->via.array.size; i++) {
        const msgpack_object *t = rpc_map_get(&content->via.array.ptr[i], "text");
        texts += t && t->type == MSGPACK_OBJECT_STR;
    }
    msgpack_pack_map(pk, 6 + has_usage);
    rpc_pack_kv_str(pk, "id", "msg_converse");
    rpc_pack_kv_str(pk, "type", "message");
    rpc_pack_kv_str(pk, "role", "assistant");
    rpc_pack_str(pk, "content");
    msgpack_pack_array(pk, texts);
    for (uint32_t i = 0; i < content->via.array.size; i++) {
        const msgpack_object *t = rpc_map_get(&content->via.array.ptr[i], "text");
        if (!t || t->type != MSGPACK_OBJECT_STR)
            continue;
        msgpack_pack_map(pk, 2);
        rpc_pack_kv_str(pk, "type", "text");
        rpc_pack_str(pk, "text");
        msgpack_pack_object(pk, *t);
    }
    rpc_pack_str(pk, "stop_reason");
    pack_stop_reason(pk,
                     stop && stop->type == MSGPACK_OBJECT_STR
                         ? stop_reason_of(stop->via.str.ptr, stop->via.str.size, buf, sizeof(buf))
                         : NULL);
    rpc_pack_str(pk, "stop_sequence");
    msgpack_pack_nil(pk);
    if (has_usage) {
        rpc_pack_str(pk, "usage");
        pack_usage(usage, pk);
    }
    return 0;
}

/* --- stream ---------------------------------------------------------- */

void converse_stream_init(struct converse_stream *st)
{
    memset(st, 0, sizeof(*st));
}

static bool type_is(const char *type, size_t len, const char *s)
{
    return strlen(s) == len && memcmp(type, s, len) == 0;
}

/* The block index of a contentBlock* event: its contentBlockIndex when a
 * count, else 0. */
static uint64_t block_index(const msgpack_object *ev)
{
    const msgpack_object *i = rpc_map_get(ev, "contentBlockIndex");
    return i && i->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? i->via.u64 : 0;
}

/* {"type": type, "index": index, member: {"type": inner, "text": ...}}:
 * the caller packs the text. */
static void pack_block_event(msgpack_packer *pk, const char *type, uint64_t index,
                             const char *member, const char *inner)
{
    msgpack_pack_map(pk, 3);
    rpc_pack_kv_str(pk, "type", type);
    rpc_pack_kv_u64(pk, "index", index);
    rpc_pack_str(pk, member);
    msgpack_pack_map(pk, 2);
    rpc_pack_kv_str(pk, "type", inner);
    rpc_pack_str(pk, "text");
}

/* A content_block_start for block `index` unless it had one; 1 when packed. */
static int block_start(struct converse_stream *st, uint64_t index, msgpack_packer *pk)
{
    if (index < st->next_block)
        return 0;
    st->next_block = index + 1;
    pack_block_event(pk, "content_block_start", index, "content_block", "text");
    rpc_pack_str(pk, "");
    return 1;
}

int converse_event(struct converse_stream *st, const char *type, size_t type_len,
                   const msgpack_object *ev, msgpack_packer *pk)
{
    bool known = type_is(type, type_len, "messageStart") ||
        type_is(type, type_len, "contentBlockStart") ||
        type_is(type, type_len, "contentBlockDelta") ||
        type_is(type, type_len, "contentBlockStop") || type_is(type, type_len, "messageStop") ||
        type_is(type, type_len, "metadata");

    if (!known)
        return 0;
    if (ev->type != MSGPACK_OBJECT_MAP)
        return CONVERT_EREPLY;
    if (type_is(type, type_len, "messageStart")) {
        msgpack_pack_map(pk, 2);
        rpc_pack_kv_str(pk, "type", "message_start");
        rpc_pack_str(pk, "message");
        msgpack_pack_map(pk, 6);
        rpc_pack_kv_str(pk, "id", "msg_converse");
        rpc_pack_kv_str(pk, "type", "message");
        rpc_pack_kv_str(pk, "role", "assistant");
        rpc_pack_str(pk, "content");
        msgpack_pack_array(pk, 0);
        rpc_pack_str(pk, "stop_reason");
        msgpack_pack_nil(pk);
        rpc_pack_str(pk, "stop_sequence");
        msgpack_pack_nil(pk);
        return 1;
    }
    if (type_is(type, type_len, "contentBlockStart"))
        return block_start(st, block_index(ev), pk);
    if (type_is(type, type_len, "contentBlockDelta")) {
        const msgpack_object *t = rpc_map_get(rpc_map_get(ev, "delta"), "text");
        uint64_t index = block_index(ev);
        if (!t || t->type != MSGPACK_OBJECT_STR)
            return 0;
        int n = block_start(st, index, pk);
        pack_block_event(pk, "content_block_delta", index, "delta", "text_delta");
        msgpack_pack_object(pk, *t);
        return n + 1;
    }
    if (type_is(type, type_len, "contentBlockStop")) {
        msgpack_pack_map(pk, 2);
        rpc_pack_kv_str(pk, "type", "content_block_stop");
        rpc_pack_kv_u64(pk, "index", block_index(ev));
        return 1;
    }
    if (type_is(type, type_len, "messageStop")) {
        const msgpack_object *s = rpc_map_get(ev, "stopReason");
        char buf[sizeof(st->stop_reason)];
        const char *r = s && s->type == MSGPACK_OBJECT_STR
            ? stop_reason_of(s->via.str.ptr, s->via.str.size, buf, sizeof(buf))
            : "";
        snprintf(st->stop_reason, sizeof(st->stop_reason), "%s", r);
        return 0;
    }
    /* metadata: the last event, with the usage. */
    const msgpack_object *usage = rpc_map_get(ev, "usage");
    bool has_usage = usage && usage->type == MSGPACK_OBJECT_MAP;
    msgpack_pack_map(pk, 2 + has_usage);
    rpc_pack_kv_str(pk, "type", "message_delta");
    rpc_pack_str(pk, "delta");
    msgpack_pack_map(pk, 2);
    rpc_pack_str(pk, "stop_reason");
    pack_stop_reason(pk, st->stop_reason);
    rpc_pack_str(pk, "stop_sequence");
    msgpack_pack_nil(pk);
    if (has_usage) {
        rpc_pack_str(pk, "usage");
        pack_usage(usage, pk);
    }
    msgpack_pack_map(pk, 1);
    rpc_pack_kv_str(pk, "type", "message_stop");
    return 2;
}
