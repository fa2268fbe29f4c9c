/*
 * fuzz_transcode.c — libFuzzer target for sidecar/codec/transcode.c.
 *
 *   1. The input as upstream JSON -> transcode_json_to_msgpack(), with the
 *      depth the sidecar relays (RPC_RELAYED_MAX_DEPTH). When that succeeds,
 *      the msgpack must be readable by msgpack-c's own (32-level) unpacker,
 *      is written back as JSON and parsed again: the round trip must
 *      succeed and give byte-identical msgpack (every value jansson accepts
 *      is representable, floats print round-trippably).
 *   2. The input as client msgpack: every frame a frame_reader returns (as
 *      the sidecar would decode a request) -> transcode_msgpack_to_json(),
 *      with and without the model/stream overrides.
 *   3. The input as upstream text -> utf8_repair(): the output is
 *      valid UTF-8 (repairing it again changes nothing), and valid input
 *      comes back unchanged.
 */
#include "frame.h"
#include "rpc.h"
#include "codec/transcode.h"
#include "utf8.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const struct transcode_j2m relayed = { .max_depth = RPC_RELAYED_MAX_DEPTH };

static void json_side(const uint8_t *data, size_t size)
{
    msgpack_sbuffer sb1, sb2;
    msgpack_packer pk1, pk2;
    msgpack_unpacked u;
    struct strbuf json;
    char err[256];
    size_t off = 0;
    int rc;

    msgpack_sbuffer_init(&sb1);
    msgpack_sbuffer_init(&sb2);
    msgpack_packer_init(&pk1, &sb1, msgpack_sbuffer_write);
    msgpack_packer_init(&pk2, &sb2, msgpack_sbuffer_write);
    msgpack_unpacked_init(&u);
    strbuf_init(&json);

    if (transcode_json_to_msgpack((const char *)data, size, &pk1, &relayed, err, sizeof(err)) != 0)
        goto out;
    if (msgpack_unpack_next(&u, sb1.data, sb1.size, &off) != MSGPACK_UNPACK_SUCCESS ||
        off != sb1.size)
        abort(); /* one whole value was packed */
    rc = transcode_msgpack_to_json(&u.data, &json, NULL, "body", err, sizeof(err));
    if (rc == TRANSCODE_ENOMEM)
        goto out;
    if (rc != 0)
        abort(); /* JSON -> msgpack -> JSON must always be representable */
    rc = transcode_json_to_msgpack(json.data, json.len, &pk2, &relayed, err, sizeof(err));
    if (rc == TRANSCODE_ENOMEM)
        goto out;
    if (rc != 0 || sb1.size != sb2.size || memcmp(sb1.data, sb2.data, sb1.size) != 0)
        abort(); /* round trip changed the value */
out:
    strbuf_fini(&json);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb1);
    msgpack_sbuffer_destroy(&sb2);
}

static void msgpack_side(const uint8_t *data, size_t size)
{
    static const struct transcode_override ov = { "fuzz-model", TRANSCODE_STREAM_TRUE };
    struct frame_reader r;
    msgpack_unpacked u;
    struct strbuf json;
    char err[256];

    if (frame_reader_init(&r, 1 << 16, 0) < 0)
        return;
    msgpack_unpacked_init(&u);
    strbuf_init(&json);
    if (frame_reader_feed(&r, data, size) == 0) {
        while (frame_reader_next(&r, &u, NULL) == 1) {
            size_t before;

            strbuf_reset(&json);
            (void)transcode_msgpack_to_json(&u.data, &json, NULL, NULL, err, sizeof(err));
            before = json.len;
            if (transcode_msgpack_to_json(&u.data, &json, &ov, "body", err, sizeof(err)) != 0 &&
                json.len != before)
                abort(); /* contract: nothing partial left behind */
        }
    }
    strbuf_fini(&json);
    msgpack_unpacked_destroy(&u);
    frame_reader_fini(&r);
}

static void text_side(const uint8_t *data, size_t size)
{
    struct strbuf once, twice;

    strbuf_init(&once);
    strbuf_init(&twice);
    long bad = utf8_repair((const char *)data, size, &once);
    long again = bad >= 0 ? utf8_repair(once.data, once.len, &twice) : 0;
    if (bad >= 0 && again != TRANSCODE_ENOMEM) {
        if (again != 0 || twice.len != once.len || memcmp(twice.data, once.data, once.len) != 0)
            abort(); /* the output of a repair is valid UTF-8 */
        if (bad == 0 && (once.len != size || memcmp(once.data, data, size) != 0))
            abort(); /* valid text is copied unchanged */
        if (once.len < size)
            abort(); /* a U+FFFD (3 bytes) replaces at most 3 bytes */
    }
    strbuf_fini(&once);
    strbuf_fini(&twice);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_side(data, size);
    msgpack_side(data, size);
    text_side(data, size);
    return 0;
}
