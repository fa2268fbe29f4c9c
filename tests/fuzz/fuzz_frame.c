/*
 * fuzz_frame.c — libFuzzer target: client bytes -> frame_reader -> rpc_parse
 * -> rpc_bind with the "call" method's parameter spec (sidecar/call/call.c).
 *
 * Input: byte 0 picks where the rest is split into two feeds (so frames and
 * headers straddle a read boundary); bytes 1.. are the stream. The reader's
 * limit is small so the size/item/depth guards are reached quickly.
 */
#include "frame.h"
#include "rpc.h"

#include <stddef.h>
#include <stdint.h>

#define FUZZ_MAX_MESSAGE_BYTES 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Mirrors call_start()'s spec. */
static const struct rpc_param call_spec[] = {
    { "capability", RPC_T_STR, true },           { "body", RPC_T_MAP, true },
    { "stream", RPC_T_BOOL | RPC_T_NIL, false }, { "scope", RPC_T_STR | RPC_T_NIL, false },
    { "task_id", RPC_T_STR | RPC_T_NIL, false }, { "deadline_s", RPC_T_NUMBER | RPC_T_NIL, false },
};
#define CALL_SPEC_N (sizeof(call_spec) / sizeof(call_spec[0]))

static void handle_frame(const msgpack_object *o)
{
    const msgpack_object *p[CALL_SPEC_N];
    struct rpc_msg m;
    const char *why = NULL;
    char bwhy[300], quoted[64 * 4 + 1];
    double d;

    if (rpc_parse(o, &m, &why) < 0)
        return;
    if (m.type == RPC_RESPONSE)
        return;
    rpc_quote_client_str(m.method, m.method_len, 64, quoted);
    (void)rpc_method_is(&m, "call");
    if (rpc_bind(m.params, call_spec, CALL_SPEC_N, p, bwhy, sizeof(bwhy)) < 0)
        return;
    if (p[5])
        (void)rpc_as_double(p[5], &d);
    (void)rpc_map_get(p[1], "model");
}

static int drain(struct frame_reader *r, msgpack_unpacked *u)
{
    size_t n;
    int rc;

    while ((rc = frame_reader_next(r, u, &n)) == 1)
        handle_frame(&u->data);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct frame_reader r;
    msgpack_unpacked u;
    size_t split;

    if (size < 1)
        return 0;
    split = size > 1 ? (size_t)data[0] * (size - 1) / 255 : 0;
    data++;
    size--;
    if (frame_reader_init(&r, FUZZ_MAX_MESSAGE_BYTES, 64) < 0)
        return 0;
    msgpack_unpacked_init(&u);
    if (frame_reader_feed(&r, data, split) == 0 && drain(&r, &u) == 0 &&
        frame_reader_feed(&r, data + split, size - split) == 0)
        (void)drain(&r, &u);
    (void)frame_reader_pending(&r);
    msgpack_unpacked_destroy(&u);
    frame_reader_fini(&r);
    return 0;
}
