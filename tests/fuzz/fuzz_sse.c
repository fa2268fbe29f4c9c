/*
 * fuzz_sse.c — libFuzzer target for src/sse.c.
 *
 * Byte 0 seeds the chunk sizes; bytes 1.. are the upstream stream. The stream
 * is parsed twice: in chunks of 1..64 bytes derived from the seed, and in one
 * feed. sse.h promises that the events and the error do not depend on the
 * split, so both runs must produce the same transcript.
 */
#include "sse.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_MAX_EVENT_BYTES 256

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct transcript {
    char *p;
    size_t len;
    size_t cap;
};

static void put(struct transcript *t, const void *s, size_t n)
{
    if (t->len + n > t->cap) {
        size_t cap = (t->len + n) * 2 + 64;
        char *np = realloc(t->p, cap);

        if (!np)
            abort();
        t->p = np;
        t->cap = cap;
    }
    memcpy(t->p + t->len, s, n);
    t->len += n;
}

static void put_field(struct transcript *t, const char *s, size_t n)
{
    put(t, &n, sizeof(n));
    put(t, s, n);
}

static int on_event(const struct sse_event *ev, void *ud)
{
    struct transcript *t = ud;

    if (ev->event[ev->event_len] != '\0' || ev->data[ev->data_len] != '\0' ||
        ev->id[ev->id_len] != '\0')
        abort(); /* contract: NUL-terminated at their lengths */
    put_field(t, ev->event, ev->event_len);
    put_field(t, ev->data, ev->data_len);
    put_field(t, ev->id, ev->id_len);
    put(t, &ev->retry_ms, sizeof(ev->retry_ms));
    (void)sse_data_is_done(ev);
    /* An event named "abort" stops the stream (callback abort path). */
    return ev->event_len == 5 && memcmp(ev->event, "abort", 5) == 0 ? 7 : 0;
}

static void finish(struct transcript *t, struct sse_parser *p, int rc)
{
    char idle = sse_parser_is_idle(p) ? 'I' : 'B';

    put(t, &rc, sizeof(rc));
    if (rc == 0)
        put(t, &idle, 1);
    (void)sse_strerror(rc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct transcript whole = { 0 }, split = { 0 };
    struct sse_parser p;
    uint32_t seed;
    size_t off;
    int rc;

    if (size < 1)
        return 0;
    seed = data[0] * 2654435761u + 1;
    data++;
    size--;

    if (sse_parser_init(&p, FUZZ_MAX_EVENT_BYTES) != 0)
        abort();
    rc = sse_parser_feed(&p, (const char *)data, size, on_event, &whole);
    finish(&whole, &p, rc);
    sse_parser_fini(&p);

    if (sse_parser_init(&p, FUZZ_MAX_EVENT_BYTES) != 0)
        abort();
    rc = 0;
    for (off = 0; off < size && rc == 0;) {
        size_t n;

        seed = seed * 1103515245u + 12345u;
        n = 1 + (seed >> 16) % 64;
        if (n > size - off)
            n = size - off;
        rc = sse_parser_feed(&p, (const char *)data + off, n, on_event, &split);
        off += n;
    }
    /* An empty feed must be harmless, and a failed parser stays failed. */
    if (sse_parser_feed(&p, NULL, 0, on_event, &split) != (rc > 0 ? SSE_EABORTED : rc))
        abort();
    finish(&split, &p, rc);
    sse_parser_fini(&p);

    if (whole.len != split.len || memcmp(whole.p, split.p, whole.len) != 0)
        abort(); /* result depends on how the stream was split */
    free(whole.p);
    free(split.p);
    return 0;
}
