/*
 * fuzz_jscan.c — libFuzzer target for sidecar/codec/jscan.c.
 *
 * The input is one candidate JSON text. Properties:
 *   - jscan_object/jscan_array agree with jscan_check, and every member or
 *     element they report lies inside the input and is itself valid JSON;
 *   - jansson (a full parser) accepting a text means jscan accepts it too,
 *     within the depth jscan allows (and without raw NUL bytes, which end
 *     jansson's input);
 *   - jscan_plain_run and its portable jscan_plain_run_swar stop where a
 *     byte-at-a-time scan stops, at each special byte of the input in turn,
 *     from several starts and ends.
 */
#include "codec/jscan.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct bounds {
    const char *lo, *hi;
};

static void check_value(const struct bounds *b, const struct jscan_value *v)
{
    if (v->p < b->lo || v->p + v->len > b->hi || v->len == 0)
        abort();
    if (jscan_check(v->p, v->len, NULL) != 0)
        abort();
    double d;
    if ((v->type == JSCAN_NUMBER) != jscan_number(v, &d) && v->len < 64)
        abort();
}

static int on_member(void *ud, const char *key, const struct jscan_value *v)
{
    if (strlen(key) > 63)
        abort();
    check_value(ud, v);
    return 0;
}

static int on_element(void *ud, const struct jscan_value *v)
{
    check_value(ud, v);
    return 0;
}

/* Deepest container nesting, outside strings (for valid JSON: exact). */
static size_t depth_of(const char *s, size_t n)
{
    size_t d = 0, max = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == '[' || c == '{') {
            if (++d > max)
                max = d;
        } else if ((c == ']' || c == '}') && d) {
            d--;
        }
    }
    return max;
}

static void check_plain_runs(const unsigned char *p, const unsigned char *end)
{
    while (p < end) {
        const unsigned char *want = p;
        while (want < end && *want >= 0x20 && *want < 0x80 && *want != '"' && *want != '\\')
            want++;
        if (jscan_plain_run(p, end) != want || jscan_plain_run_swar(p, end) != want)
            abort();
        p = want + 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (size_t k = 0; k < 8 && 2 * k <= size; k++)
        check_plain_runs(data + k, data + size - k);

    const char *s = (const char *)data;
    struct bounds b = { s, s + size };
    size_t at = 0;
    int ok = jscan_check(s, size, &at);

    if (ok < 0 && at > size)
        abort();
    int o = jscan_object(s, size, on_member, &b, NULL);
    int a = jscan_array(s, size, on_element, &b, NULL);
    if ((ok == 0) != (o != -1) || (ok == 0) != (a != -1) || (ok == 0 && o != -2 && a != -2))
        abort();

    json_error_t je;
    json_t *root = json_loadb(s, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    /* jansson's reader takes a raw NUL for the end of the input ("null\0"
     * is null to it); to RFC 8259, and to jscan, it is garbage. */
    if (root && ok != 0 && depth_of(s, size) <= JSCAN_MAX_DEPTH && !memchr(s, 0, size))
        abort(); /* jansson found JSON that jscan refused */
    json_decref(root);
    return 0;
}
