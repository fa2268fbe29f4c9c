/*
 * fuzz_evstream.c — libFuzzer target for src/evstream.c.
 *
 * Byte 0 seeds the chunk sizes; bytes 1.. are the upstream stream. The stream
 * is decoded twice: in one feed, and in chunks of 1..64 bytes derived from
 * the seed. evstream.h promises that the messages and the error do not
 * depend on the split, so both runs must produce the same transcript. Every
 * delivered message is re-encoded with evstream_encode (its string headers
 * and payload) and decoded again: it must come back the same.
 */
#include "evstream.h"
#include "strbuf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Small, so that the limit is reached by short inputs too. */
#define FUZZ_MAX_MESSAGE_BYTES 512

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Appends to a run's transcript; out of memory is fatal. */
static void put(struct strbuf *t, const void *s, size_t n)
{
    if (strbuf_put(t, s, n) != 0)
        abort();
}

static void put_str(struct strbuf *t, const struct evstream_str *s)
{
    char present = s->p != NULL;

    put(t, &present, 1);
    put(t, &s->len, sizeof(s->len));
    put(t, s->p, s->len);
}

static void put_msg(struct strbuf *t, const struct evstream_msg *m)
{
    struct evstream_str payload = { (const char *)m->payload, m->payload_len };

    put_str(t, &m->message_type);
    put_str(t, &m->event_type);
    put_str(t, &m->exception_type);
    put_str(t, &m->error_code);
    put_str(t, &m->error_message);
    put_str(t, &m->content_type);
    put_str(t, &payload);
}

static int on_copy(const struct evstream_msg *m, void *ud)
{
    put_msg(ud, m);
    return 0;
}

/* A delivered message's string headers and payload, encoded and decoded
 * again, give the same message. Header values may hold NUL bytes, which
 * evstream_encode (C strings) cannot carry: those are left out. */
static void round_trip(const struct evstream_msg *m)
{
    const struct evstream_str *f[] = { &m->message_type, &m->event_type,    &m->exception_type,
                                       &m->error_code,   &m->error_message, &m->content_type };
    static const char *const names[] = { ":message-type", ":event-type",    ":exception-type",
                                         ":error-code",   ":error-message", ":content-type" };
    const char *n[6], *v[6];
    char *copies[6];
    size_t k = 0;
    struct strbuf want = { 0 }, got = { 0 };
    struct evstream d;
    uint8_t *out;
    size_t out_len;

    for (size_t i = 0; i < 6; i++) {
        if (f[i]->p == NULL)
            continue;
        if (memchr(f[i]->p, '\0', f[i]->len) != NULL) {
            while (k > 0)
                free(copies[--k]);
            return;
        }
        copies[k] = malloc(f[i]->len + 1);
        if (!copies[k])
            abort();
        memcpy(copies[k], f[i]->p, f[i]->len);
        copies[k][f[i]->len] = '\0';
        n[k] = names[i];
        v[k] = copies[k];
        k++;
    }
    if (evstream_encode(n, v, k, m->payload, m->payload_len, &out, &out_len) != 0)
        abort();
    put_msg(&want, m);
    if (evstream_init(&d, out_len < 16 ? 16 : out_len) != 0)
        abort();
    if (evstream_feed(&d, out, out_len, on_copy, &got) != 0 || !evstream_is_idle(&d))
        abort();
    if (want.len != got.len || memcmp(want.data, got.data, want.len) != 0)
        abort(); /* encode and decode disagree */
    evstream_fini(&d);
    free(out);
    for (size_t i = 0; i < k; i++)
        free(copies[i]);
    strbuf_fini(&want);
    strbuf_fini(&got);
}

static int on_msg(const struct evstream_msg *m, void *ud)
{
    struct strbuf *t = ud;

    if (m->payload[m->payload_len] != '\0')
        abort(); /* contract: the payload is NUL-terminated at its length */
    put_msg(t, m);
    round_trip(m);
    /* A message whose event type is "abort" stops the stream. */
    return m->event_type.p != NULL && m->event_type.len == 5 &&
            memcmp(m->event_type.p, "abort", 5) == 0
        ? 7
        : 0;
}

static void finish(struct strbuf *t, struct evstream *d, int rc)
{
    char idle = evstream_is_idle(d) ? 'I' : 'B';
    size_t held = evstream_buffered(d);

    if (held > FUZZ_MAX_MESSAGE_BYTES || d->cap > FUZZ_MAX_MESSAGE_BYTES)
        abort(); /* contract: never more than one message's worth */
    put(t, &rc, sizeof(rc));
    put(t, &idle, 1);
    put(t, &held, sizeof(held));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct strbuf whole = { 0 }, split = { 0 };
    struct evstream d;
    uint32_t seed;
    size_t off;
    int rc;

    if (size < 1)
        return 0;
    seed = data[0] * 2654435761u + 1;
    data++;
    size--;

    if (evstream_init(&d, FUZZ_MAX_MESSAGE_BYTES) != 0)
        abort();
    rc = evstream_feed(&d, data, size, on_msg, &whole);
    finish(&whole, &d, rc);
    evstream_fini(&d);

    if (evstream_init(&d, FUZZ_MAX_MESSAGE_BYTES) != 0)
        abort();
    rc = 0;
    for (off = 0; off < size && rc == 0;) {
        size_t n;

        seed = seed * 1103515245u + 12345u;
        n = 1 + (seed >> 16) % 64;
        if (n > size - off)
            n = size - off;
        rc = evstream_feed(&d, data + off, n, on_msg, &split);
        off += n;
        if (d.cap > FUZZ_MAX_MESSAGE_BYTES)
            abort();
    }
    /* An empty feed must be harmless, and a failed decoder stays failed. */
    if (evstream_feed(&d, NULL, 0, on_msg, &split) != (rc > 0 ? EVSTREAM_EABORTED : rc))
        abort();
    finish(&split, &d, rc);
    evstream_fini(&d);

    if (whole.len != split.len || memcmp(whole.data, split.data, whole.len) != 0)
        abort(); /* result depends on how the stream was split */
    strbuf_fini(&whole);
    strbuf_fini(&split);
    return 0;
}
