/*
 * fuzz_gemini.c — libFuzzer target: a Gemini stream event or reply (JSON)
 * through the gemini dialect's readers (scan_event on the event, scan_usage
 * on its usageMetadata), and the same bytes as a Gemini route's path
 * (gemroute_parse), checking their contracts:
 *   - every count is -1 or in [0, 3 * DIALECT_TOKENS_MAX]; bogus counts
 *     leave every count -1;
 *   - reasoning, when known with the completion, is part of it;
 *   - an error event has a NUL-terminated error_type without control
 *     characters (rpc_quote_client_str); transient only with error;
 *   - a parsed route names a model of [A-Za-z0-9._-] inside the path and
 *     one of the two capabilities.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec/dialect.h"
#include "codec/transcode.h"
#include "http/gemroute.h"
#include "rpc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_usage(const struct dialect_usage *u)
{
    const int64_t max = 3 * DIALECT_TOKENS_MAX;
    const int64_t v[6] = { u->prompt, u->completion,  u->total,
                           u->cached, u->cache_write, u->reasoning };

    for (size_t i = 0; i < 6; i++)
        if (v[i] < -1 || v[i] > max || (u->bogus && v[i] != -1))
            abort();
    if (u->reasoning >= 0 && u->completion >= 0 && u->reasoning > u->completion)
        abort();
    if (u->bogus && dialect_usage_total(u) != -1)
        abort();
}

static void check_event(const struct dialect_event *ev)
{
    check_usage(&ev->usage);
    if (ev->transient && !ev->error)
        abort();
    if (memchr(ev->error_type, '\0', sizeof(ev->error_type)) == NULL)
        abort();
    for (const unsigned char *p = (const unsigned char *)ev->error_type; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            abort();
    if (ev->error && !ev->error_type[0])
        abort();
}

static void fuzz_route(const uint8_t *data, size_t size)
{
    const char *q = memchr(data, '?', size);
    size_t plen = q ? (size_t)(q - (const char *)data) : size;
    struct gemroute g;

    if (gemroute_parse((const char *)data, plen, q ? q + 1 : NULL, q ? size - plen - 1 : 0, &g) !=
        GEMROUTE_OK)
        return;
    if (g.model < (const char *)data || g.model + g.model_len > (const char *)data + plen ||
        g.model_len == 0)
        abort();
    for (size_t i = 0; i < g.model_len; i++)
        if (g.model[i] == ':' || g.model[i] == '/' || g.model[i] == '?')
            abort();
    if (strcmp(g.capability, "gemini") != 0 && strcmp(g.capability, "count_tokens") != 0)
        abort();
    if (g.stream && strcmp(g.capability, "gemini") != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const struct dialect *d = dialect_get(DIALECT_GEMINI);
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_unpacked up;

    fuzz_route(data, size);
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (transcode_json_to_msgpack((const char *)data, size, &pk, NULL, NULL, 0) == 0) {
        msgpack_unpacked_init(&up);
        if (msgpack_unpack_next(&up, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS) {
            struct dialect_event ev;
            struct dialect_usage u, acc = DIALECT_USAGE_NONE;
            d->scan_event(&up.data, &ev);
            check_event(&ev);
            d->scan_usage(rpc_map_get(&up.data, d->usage_member), &u);
            check_usage(&u);
            /* The whole reply read as a usage map, too. */
            d->scan_usage(&up.data, &u);
            check_usage(&u);
            dialect_usage_merge(&acc, &ev.usage);
            dialect_usage_merge(&acc, &u);
            check_usage(&acc);
        }
        msgpack_unpacked_destroy(&up);
    }
    msgpack_sbuffer_destroy(&sb);
    return 0;
}
