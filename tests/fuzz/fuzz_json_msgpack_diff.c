/*
 * fuzz_json_msgpack_diff.c — differential libFuzzer target: the single-pass
 * transcode_json_to_msgpack() against transcode_json_to_msgpack_jansson().
 *
 * For the same JSON text, with the depth the sidecar relays and with the
 * transcoder's own bound, with and without a string hook, the two must
 * return the same code and, on success, the same msgpack bytes; on
 * failure, the same error message.
 *
 * The text is the input itself, and also the input read as a program of
 * JSON tokens (one per byte, from a table of brackets, duplicated and
 * escaped keys, edge-case numbers and strings), which reaches deep
 * nesting, duplicate keys and wide containers far sooner than byte
 * mutations do.
 */
#include "rpc.h"
#include "strbuf.h"
#include "codec/transcode.h"
#include "tests/ref/transcode_jansson.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Rewrites every string that holds "sk" (as a scrubber would), in a
 * buffer that stays valid until the next call. */
static int hook(void *ud, const char **s, size_t *n)
{
    struct strbuf *b = ud;

    if (!memmem(*s, *n, "sk", 2))
        return 0;
    strbuf_reset(b);
    if (strbuf_puts(b, "[") < 0 || strbuf_put(b, *s, *n / 2) < 0 || strbuf_puts(b, "]") < 0)
        return TRANSCODE_ENOMEM;
    *s = b->data;
    *n = b->len;
    return 0;
}

static void compare(const char *json, size_t len, const struct transcode_j2m *opt)
{
    msgpack_sbuffer a, b;
    msgpack_packer pa, pb;
    char ea[256], eb[256];

    msgpack_sbuffer_init(&a);
    msgpack_sbuffer_init(&b);
    msgpack_packer_init(&pa, &a, msgpack_sbuffer_write);
    msgpack_packer_init(&pb, &b, msgpack_sbuffer_write);
    int ra = transcode_json_to_msgpack(json, len, &pa, opt, ea, sizeof(ea));
    int rb = transcode_json_to_msgpack_jansson(json, len, &pb, opt, eb, sizeof(eb));
    if (ra != rb)
        abort(); /* a different outcome */
    if (ra == 0 && (a.size != b.size || memcmp(a.data, b.data, a.size) != 0))
        abort(); /* different msgpack */
    if (ra != 0 && strcmp(ea, eb) != 0)
        abort(); /* a different message */
    if (ra != 0 && a.size != 0)
        abort(); /* contract: nothing written on failure */
    msgpack_sbuffer_destroy(&a);
    msgpack_sbuffer_destroy(&b);
}

static void compare_all(const char *json, size_t len)
{
    struct strbuf scratch;
    struct transcode_j2m opt = { .max_depth = RPC_RELAYED_MAX_DEPTH };

    compare(json, len, NULL);
    compare(json, len, &opt);
    strbuf_init(&scratch);
    opt.on_str = hook;
    opt.ud = &scratch;
    compare(json, len, &opt);
    opt.max_depth = 3;
    compare(json, len, &opt);
    strbuf_fini(&scratch);
}

static const char *const tokens[] = {
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"a\"",
    "\"b\"",
    "\"\\u0061\"",
    "\"sk-1\"",
    "1",
    "-0",
    "0.5",
    "-0.0",
    "1e400",
    "1e-400",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "true",
    "false",
    "null",
    "\"\\ud83d\\ude00\"",
    "\"\\ud800\"",
    "\"\\u0000\"",
    "\"\\n\\\"\\/\"",
    " ",
    "\n",
    "\"\xc3\xa9\"",
    "\xff",
    "x",
    "\"0123456789012345678901234567890123\"",
    "{\"a\":",
    "[[[[[[[[",
    "]]]]]]]]",
    "}}}}",
    "\"a\":1,",
    "\"b\":[],",
    "\"\\u00E9\":",
    "\"\xc3\xa9\":",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct strbuf prog;

    compare_all((const char *)data, size);
    if (size > 4096)
        return 0;
    strbuf_init(&prog);
    for (size_t i = 0; i < size; i++) {
        unsigned t = data[i] % (sizeof(tokens) / sizeof(tokens[0]));
        unsigned rep = data[i] >= 240 ? 20u : 1u; /* a wide container now and then */
        for (unsigned k = 0; k < rep; k++)
            if (strbuf_put(&prog, tokens[t], strlen(tokens[t])) < 0)
                goto out;
    }
    compare_all(prog.data ? prog.data : "", prog.len);
out:
    strbuf_fini(&prog);
    return 0;
}
