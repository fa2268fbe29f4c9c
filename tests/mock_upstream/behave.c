/*
 * behave.c — behaviour objects: strict validation (a typo in a test's script
 * must fail loudly, not silently behave normally), the per-request queue and
 * the default.
 *
 * Resolution for one API request (see README.md):
 *   1. the queue head, consumed (even when 2. applies, so that "the N-th
 *      request" keeps counting API requests), else the default, else normal;
 *   2. a "mock" object in the request body replaces that choice entirely.
 */
#include "internal.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#define MS_MAX (24LL * 3600 * 1000) /* one day: any longer is a test bug */

void behave_init(struct behave *b)
{
    memset(b, 0, sizeof *b);
    b->trickle_bytes = 1;
    b->close_after_bytes = -1;
    b->stream_events = -1;
    b->dims = -1;
}

/* A non-negative integer (or integral real) no larger than max. */
static int get_int(json_t *v, long long max, long long *out)
{
    double d;
    if (json_is_integer(v))
        d = (double)json_integer_value(v);
    else if (json_is_real(v))
        d = json_real_value(v);
    else
        return -1;
    if (!(d >= 0) || d > (double)max)
        return -1;
    *out = (long long)d;
    return 0;
}

/* Header-safe text: no CR, LF or NUL (a value goes into a header line). */
static bool is_header_text(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] == '\r' || s[i] == '\n' || s[i] == '\0')
            return false;
    return true;
}

static bool is_hex_pairs(json_t *v)
{
    const char *h = json_string_value(v);
    size_t hn = json_string_length(v);
    return h && hn % 2 == 0 && strspn(h, "0123456789abcdefABCDEF") == hn;
}

static bool is_token(const char *s)
{
    if (!*s)
        return false;
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch <= 32 || ch >= 127 || strchr("()<>@,;:\\\"/[]?={}", ch))
            return false;
    }
    return true;
}

/* The boolean field named `key`, or NULL when it is not one. */
static bool *bool_field(struct behave *b, const char *key)
{
    static const struct {
        const char *name;
        size_t off;
    } fields[] = {
        { "no_length", offsetof(struct behave, no_length) },
        { "no_done", offsetof(struct behave, no_done) },
        { "usage_if_asked", offsetof(struct behave, usage_if_asked) },
        { "chunked", offsetof(struct behave, chunked) },
        { "connection_close", offsetof(struct behave, connection_close) },
        { "raw_keep", offsetof(struct behave, raw_keep) },
        { "trickle_headers", offsetof(struct behave, trickle_headers) },
        { "sse_ids", offsetof(struct behave, sse_ids) },
        { "stamp", offsetof(struct behave, stamp) },
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (!strcmp(key, fields[i].name))
            return (bool *)((char *)b + fields[i].off);
    return NULL;
}

static int fail(struct behave *b, char *err, size_t errlen, const char *key, const char *why)
{
    snprintf(err, errlen, "mock: \"%s\": %s", key, why);
    behave_init(b);
    return -1;
}

int behave_parse(struct behave *b, json_t *obj, char *err, size_t errlen)
{
    const char *key;
    json_t *v;
    long long n;
    bool *flag;

    behave_init(b);
    if (!json_is_object(obj)) {
        snprintf(err, errlen, "mock: a behaviour must be a JSON object");
        return -1;
    }
    json_object_foreach(obj, key, v)
    {
        if (!strcmp(key, "delay_ms")) {
            if (get_int(v, MS_MAX, &b->delay_ms))
                return fail(b, err, errlen, key, "must be a number of ms in [0, 86400000]");
        } else if (!strcmp(key, "hang")) {
            const char *s = json_string_value(v);
            if (json_is_true(v))
                b->hang = BEHAVE_HANG_BEFORE_HEADERS;
            else if (json_is_false(v) || json_is_null(v) || (s && !strcmp(s, "none")))
                b->hang = BEHAVE_HANG_NONE;
            else if (s && !strcmp(s, "before_headers"))
                b->hang = BEHAVE_HANG_BEFORE_HEADERS;
            else if (s && !strcmp(s, "after_headers"))
                b->hang = BEHAVE_HANG_AFTER_HEADERS;
            else if (s && !strcmp(s, "accept"))
                b->hang = BEHAVE_HANG_ACCEPT;
            else
                return fail(
                    b, err, errlen, key,
                    "must be \"before_headers\", \"after_headers\", \"accept\" or \"none\"");
        } else if (!strcmp(key, "hang_ms")) {
            if (get_int(v, MS_MAX, &b->hang_ms))
                return fail(b, err, errlen, key, "must be a number of ms in [0, 86400000]");
        } else if (!strcmp(key, "trickle_ms")) {
            if (get_int(v, MS_MAX, &b->trickle_ms))
                return fail(b, err, errlen, key, "must be a number of ms in [0, 86400000]");
        } else if (!strcmp(key, "trickle_bytes")) {
            if (get_int(v, 1LL << 30, &b->trickle_bytes) || b->trickle_bytes < 1)
                return fail(b, err, errlen, key, "must be an integer >= 1");
        } else if (!strcmp(key, "status")) {
            if (get_int(v, 599, &n) || n < 200 || n == 204 || n == 304)
                return fail(b, err, errlen, key,
                            "must be an HTTP status in [200, 599] (not 204/304)");
            b->status = (int)n;
        } else if (!strcmp(key, "retry_after")) {
            if (json_is_string(v)) {
                if (!is_header_text(json_string_value(v), json_string_length(v)))
                    return fail(b, err, errlen, key, "must not contain CR/LF/NUL");
                b->retry_after = json_string_value(v);
            } else if (json_is_integer(v) && json_integer_value(v) >= 0) {
                snprintf(b->retry_after_buf, sizeof b->retry_after_buf, "%lld",
                         (long long)json_integer_value(v));
                b->retry_after = b->retry_after_buf;
            } else if (json_is_real(v) && json_real_value(v) >= 0 && isfinite(json_real_value(v))) {
                snprintf(b->retry_after_buf, sizeof b->retry_after_buf, "%g", json_real_value(v));
                b->retry_after = b->retry_after_buf;
            } else {
                return fail(b, err, errlen, key, "must be a number >= 0 or a string");
            }
        } else if (!strcmp(key, "close_after_bytes")) {
            if (get_int(v, 1LL << 40, &b->close_after_bytes))
                return fail(b, err, errlen, key, "must be an integer >= 0");
        } else if (!strcmp(key, "stream_events")) {
            if (get_int(v, 1000000, &b->stream_events))
                return fail(b, err, errlen, key, "must be an integer in [0, 1000000]");
        } else if (!strcmp(key, "stream_interval_ms")) {
            if (get_int(v, MS_MAX, &b->stream_interval_ms))
                return fail(b, err, errlen, key, "must be a number of ms in [0, 86400000]");
        } else if (!strcmp(key, "body")) {
            if (!json_is_string(v))
                return fail(b, err, errlen, key, "must be a string");
            b->body = json_string_value(v);
            b->body_len = json_string_length(v);
        } else if (!strcmp(key, "body_hex")) {
            if (!is_hex_pairs(v))
                return fail(b, err, errlen, key, "must be a string of hex digit pairs");
            b->body = json_string_value(v);
            b->body_len = json_string_length(v);
            b->body_hex = true;
        } else if (!strcmp(key, "content_type")) {
            if (!json_is_string(v) || !is_header_text(json_string_value(v), json_string_length(v)))
                return fail(b, err, errlen, key, "must be a string without CR/LF/NUL");
            b->content_type = json_string_value(v);
        } else if (!strcmp(key, "content")) {
            if (!json_is_string(v))
                return fail(b, err, errlen, key, "must be a string");
            b->content = json_string_value(v);
            b->content_len = json_string_length(v);
        } else if (!strcmp(key, "content_repeat")) {
            if (get_int(v, 1LL << 30, &b->content_repeat))
                return fail(b, err, errlen, key, "must be an integer in [0, 1073741824]");
        } else if (!strcmp(key, "error_message")) {
            if (!json_is_string(v))
                return fail(b, err, errlen, key, "must be a string");
            b->error_message = json_string_value(v);
        } else if (!strcmp(key, "error_type")) {
            if (!json_is_string(v))
                return fail(b, err, errlen, key, "must be a string");
            b->error_type = json_string_value(v);
        } else if (!strcmp(key, "usage")) {
            const char *uk;
            json_t *uv;
            if (!json_is_object(v))
                return fail(b, err, errlen, key, "must be an object");
            json_object_foreach(v, uk, uv)
            {
                if (strcmp(uk, "prompt_tokens") && strcmp(uk, "completion_tokens") &&
                    strcmp(uk, "total_tokens"))
                    return fail(b, err, errlen, key,
                                "keys are prompt_tokens, completion_tokens, total_tokens");
                if (get_int(uv, 1LL << 50, &n))
                    return fail(b, err, errlen, key, "token counts must be integers >= 0");
            }
            b->usage = v;
        } else if (!strcmp(key, "headers")) {
            const char *hk;
            json_t *hv;
            if (!json_is_object(v))
                return fail(b, err, errlen, key, "must be an object of strings");
            json_object_foreach(v, hk, hv)
            {
                if (!is_token(hk) || !json_is_string(hv) ||
                    !is_header_text(json_string_value(hv), json_string_length(hv)))
                    return fail(b, err, errlen, key,
                                "names must be tokens and values strings without CR/LF/NUL");
            }
            b->headers = v;
        } else if (!strcmp(key, "stream_error")) {
            if (!json_is_string(v) || !is_token(json_string_value(v)))
                return fail(b, err, errlen, key, "must be an error type such as overloaded_error");
            b->stream_error = json_string_value(v);
        } else if ((flag = bool_field(b, key))) {
            if (!json_is_boolean(v))
                return fail(b, err, errlen, key, "must be a boolean");
            *flag = json_is_true(v);
        } else if (!strcmp(key, "interim")) {
            size_t i;
            json_t *s;
            if (!json_is_array(v) || json_array_size(v) > MOCK_MAX_INTERIM)
                return fail(b, err, errlen, key, "must be an array of at most 8 statuses");
            json_array_foreach(v, i, s)
            {
                if (get_int(s, 199, &n) || n < 100 || n == 101)
                    return fail(b, err, errlen, key,
                                "statuses must be in [100, 199], not 101 (no upgrades)");
                b->interim[i] = (int)n;
            }
            b->n_interim = json_array_size(v);
        } else if (!strcmp(key, "raw_hex")) {
            if (!is_hex_pairs(v) || json_string_length(v) == 0)
                return fail(b, err, errlen, key, "must be a non-empty string of hex digit pairs");
            b->raw = json_string_value(v);
            b->raw_len = json_string_length(v);
        } else if (!strcmp(key, "dims")) {
            if (get_int(v, 65536, &b->dims) || b->dims < 1)
                return fail(b, err, errlen, key, "must be an integer in [1, 65536]");
        } else {
            return fail(b, err, errlen, key, "unknown key (see tests/mock_upstream/README.md)");
        }
    }
    if (b->trickle_headers && b->trickle_ms == 0)
        return fail(b, err, errlen, "trickle_headers", "needs trickle_ms");
    return 0;
}

json_t *behave_take(struct mock *m)
{
    if (json_array_size(m->queue) > 0) {
        json_t *b = json_incref(json_array_get(m->queue, 0));
        json_array_remove(m->queue, 0);
        return b;
    }
    return m->dflt ? json_incref(m->dflt) : NULL;
}

bool behave_accept_pending(const struct mock *m)
{
    json_t *next = json_array_size(m->queue) ? json_array_get(m->queue, 0) : m->dflt;
    const char *h = next ? json_string_value(json_object_get(next, "hang")) : NULL;
    return h && !strcmp(h, "accept");
}
