/*
 * fuzz_convert.c — libFuzzer target for sidecar/codec/convert.c,
 * sidecar/codec/converse.c and the event readers of sidecar/codec/dialect.c:
 * whatever a client sends as an OpenAI chat or Messages body and whatever an
 * upstream sends as a Messages or Bedrock Converse reply or stream event.
 *
 * The input is parsed as JSON (as the sidecar parses bodies and events);
 * each value — and each element of a top-level array, as the events of one
 * stream — goes through convert_chat_request(), convert_chat_reply(),
 * convert_chat_event(), converse_request(), converse_reply(),
 * converse_event() (as each ConverseStream event type) and every dialect's
 * scan_event / scan_usage. A conversion that succeeds must produce exactly
 * one msgpack value (a ConverseStream event: as many as it says) that can
 * be written as JSON (what the sidecar then sends or relays).
 */
#include "codec/convert.h"
#include "codec/converse.h"
#include "codec/dialect.h"
#include "rpc.h"
#include "codec/transcode.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const struct transcode_j2m relayed = { .max_depth = RPC_RELAYED_MAX_DEPTH };

/* The packed output must be `n` values that each transcode to JSON. */
static void check_values(const msgpack_sbuffer *sb, int n)
{
    size_t off = 0;

    for (int i = 0; i < n; i++) {
        msgpack_unpacked u;
        struct strbuf json;
        msgpack_unpacked_init(&u);
        strbuf_init(&json);
        if (msgpack_unpack_next(&u, sb->data, sb->size, &off) != MSGPACK_UNPACK_SUCCESS)
            abort();
        int rc = transcode_msgpack_to_json(&u.data, &json, NULL, "out", NULL, 0);
        if (rc != 0 && rc != TRANSCODE_ENOMEM)
            abort();
        strbuf_fini(&json);
        msgpack_unpacked_destroy(&u);
    }
    if (off != sb->size)
        abort();
}

static void check_output(const msgpack_sbuffer *sb)
{
    if (sb->size != 0)
        check_values(sb, 1);
}

/* The Bedrock Converse translations of one value. */
static void converse_value(const msgpack_object *o, struct converse_stream *cv)
{
    static const char *const types[] = { "messageStart",      "contentBlockStart",
                                         "contentBlockDelta", "contentBlockStop",
                                         "messageStop",       "metadata" };
    msgpack_sbuffer sb;
    msgpack_packer pk;
    char err[256];

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (converse_request(o, &pk, err, sizeof(err)) == 0)
        check_output(&sb);
    else if (!memchr(err, '\0', sizeof(err)))
        abort();
    msgpack_sbuffer_clear(&sb);
    if (converse_reply(o, &pk) == 0)
        check_output(&sb);
    else if (sb.size != 0)
        abort();
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        msgpack_sbuffer_clear(&sb);
        int n = converse_event(cv, types[i], strlen(types[i]), o, &pk);
        if (n < 0 ? sb.size != 0 : n > 2)
            abort();
        if (n > 0)
            check_values(&sb, n);
    }
    msgpack_sbuffer_destroy(&sb);
}

static void one_value(const msgpack_object *o, struct convert_stream *st,
                      struct converse_stream *cv)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    char err[256];

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (convert_chat_request(o, &pk, err, sizeof(err)) == 0) {
        if (o->type != MSGPACK_OBJECT_MAP)
            abort();
        check_output(&sb);
    } else if (!memchr(err, '\0', sizeof(err))) {
        abort();
    }
    msgpack_sbuffer_clear(&sb);
    if (convert_chat_reply(o, 1700000000, &pk) == 0)
        check_output(&sb);
    msgpack_sbuffer_clear(&sb);
    if (convert_chat_event(st, o, &pk) == 1)
        check_output(&sb);
    else if (sb.size != 0)
        abort(); /* no chunk, nothing packed */
    msgpack_sbuffer_destroy(&sb);
    converse_value(o, cv);

    for (int k = 0; k < DIALECT_COUNT; k++) {
        const struct dialect *d = dialect_get((enum dialect_kind)k);
        struct dialect_event ev;
        struct dialect_usage u;
        d->scan_event(o, &ev);
        d->scan_usage(o, &u);
        if (!memchr(ev.error_type, '\0', sizeof(ev.error_type)))
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_unpacked u;
    struct convert_stream st;
    struct converse_stream cv;

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_unpacked_init(&u);
    convert_stream_init(&st, 1700000000, size & 1);
    converse_stream_init(&cv);
    if (transcode_json_to_msgpack((const char *)data, size, &pk, &relayed, NULL, 0) == 0 &&
        msgpack_unpack_next(&u, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS) {
        one_value(&u.data, &st, &cv);
        if (u.data.type == MSGPACK_OBJECT_ARRAY)
            for (uint32_t i = 0; i < u.data.via.array.size; i++)
                one_value(&u.data.via.array.ptr[i], &st, &cv);
    }
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    return 0;
}
