/* evstream.c — incremental AWS event-stream decoder (see evstream.h for the
 * framing and the rules). */
#include "evstream.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define EVSTREAM_PRELUDE  12 /* total_len, headers_len, prelude_crc */
#define EVSTREAM_MIN      16 /* a prelude and a message CRC, nothing else */
#define EVSTREAM_BUF_MIN  256
/* An empty buffer larger than this is freed rather than kept: one large
 * message must not cost its size for the rest of a long stream. */
#define EVSTREAM_BUF_KEEP (64 * 1024)

int evstream_init(struct evstream *d, size_t max_message_bytes)
{
    memset(d, 0, sizeof(*d));
    if (max_message_bytes < EVSTREAM_MIN) {
        d->error = EVSTREAM_EINVAL;
        return EVSTREAM_EINVAL;
    }
    d->max_message_bytes = max_message_bytes;
    return 0;
}

void evstream_fini(struct evstream *d)
{
    free(d->buf);
    d->buf = NULL;
    d->len = d->cap = d->need = 0;
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint32_t crc_of(const uint8_t *p, size_t n)
{
    return (uint32_t)crc32(crc32(0L, Z_NULL, 0), p, (uInt)n);
}

/* Makes room for `want` bytes in all, doubling, never past `limit` (the
 * message's total_len once known, else the prelude's 12 bytes): a peer that
 * announces a large message and sends it slowly costs what it sent, not
 * what it announced. */
static int reserve(struct evstream *d, size_t want, size_t limit)
{
    size_t cap;
    uint8_t *np;

    if (want <= d->cap)
        return 0;
    cap = d->cap ? d->cap : EVSTREAM_BUF_MIN;
    while (cap < want)
        cap *= 2;
    if (cap > limit)
        cap = limit;
    np = realloc(d->buf, cap);
    if (np == NULL)
        return EVSTREAM_ENOMEM;
    d->buf = np;
    d->cap = cap;
    return 0;
}

/* The prelude is complete: check its CRC first (a corrupted length is a
 * transmission error, not a lie), then the lengths it states. */
static int read_prelude(struct evstream *d)
{
    uint32_t total = get_u32(d->buf), hlen = get_u32(d->buf + 4);

    if (crc_of(d->buf, 8) != get_u32(d->buf + 8))
        return EVSTREAM_ECRC;
    if (total < EVSTREAM_MIN || hlen > total - EVSTREAM_MIN)
        return EVSTREAM_EMALFORMED;
    if (total > d->max_message_bytes)
        return EVSTREAM_ETOO_LARGE;
    d->need = total;
    return 0;
}

/* The header block must parse to exactly its length; the six string headers
 * the caller is told about are picked out (a repeated one: the last wins),
 * any other header is checked and skipped. */
static int parse_headers(const uint8_t *p, size_t n, struct evstream_msg *m)
{
#define KNOWN(name, field)                                           \
    {                                                                \
        name, sizeof(name) - 1, offsetof(struct evstream_msg, field) \
    }
    static const struct {
        const char *name;
        size_t len, off;
    } known[] = {
        KNOWN(":message-type", message_type),     KNOWN(":event-type", event_type),
        KNOWN(":exception-type", exception_type), KNOWN(":error-code", error_code),
        KNOWN(":error-message", error_message),   KNOWN(":content-type", content_type),
    };
#undef KNOWN
    /* Value bytes of the fixed-size types 0..9; -1: a u16 length follows. */
    static const int fixed[] = { 0, 0, 1, 2, 4, 8, -1, -1, 8, 16 };
    size_t i = 0;

    while (i < n) {
        size_t nlen = p[i], vlen;
        const uint8_t *name = p + i + 1, *value;
        unsigned type;

        if (nlen == 0 || n - i - 1 < nlen + 1)
            return EVSTREAM_EMALFORMED;
        i += 1 + nlen;
        type = p[i++];
        if (type >= sizeof(fixed) / sizeof(fixed[0]))
            return EVSTREAM_EMALFORMED;
        if (fixed[type] >= 0) {
            vlen = (size_t)fixed[type];
        } else {
            if (n - i < 2)
                return EVSTREAM_EMALFORMED;
            vlen = (size_t)p[i] << 8 | p[i + 1];
            i += 2;
        }
        if (n - i < vlen)
            return EVSTREAM_EMALFORMED;
        value = p + i;
        i += vlen;
        if (type != 7)
            continue;
        for (size_t k = 0; k < sizeof(known) / sizeof(known[0]); k++) {
            if (nlen == known[k].len && memcmp(name, known[k].name, nlen) == 0) {
                struct evstream_str *s = (struct evstream_str *)((char *)m + known[k].off);

                s->p = (const char *)value;
                s->len = vlen;
                break;
            }
        }
    }
    return 0;
}

/* The whole message is in d->buf: check it, deliver it, empty the buffer.
 * Returns 0, EVSTREAM_E*, or the callback's non-zero value. */
static int deliver(struct evstream *d, evstream_msg_fn *fn, void *ud)
{
    size_t total = d->need, hlen = get_u32(d->buf + 4);
    struct evstream_msg m;
    int rc;

    if (crc_of(d->buf, total - 4) != get_u32(d->buf + total - 4))
        return EVSTREAM_ECRC;
    memset(&m, 0, sizeof(m));
    rc = parse_headers(d->buf + EVSTREAM_PRELUDE, hlen, &m);
    if (rc != 0)
        return rc;
    m.payload = d->buf + EVSTREAM_PRELUDE + hlen;
    m.payload_len = total - EVSTREAM_MIN - hlen;
    /* The checked CRC's first byte becomes the payload's terminator, so the
     * buffer never needs more than total_len bytes. */
    d->buf[total - 4] = '\0';
    rc = fn != NULL ? fn(&m, ud) : 0;
    if (rc != 0)
        d->error = EVSTREAM_EABORTED;
    d->len = 0;
    d->need = 0;
    if (d->cap > EVSTREAM_BUF_KEEP) {
        free(d->buf);
        d->buf = NULL;
        d->cap = 0;
    }
    return rc;
}

static int decode(struct evstream *d, const uint8_t *s, size_t n, evstream_msg_fn *fn, void *ud)
{
    while (n > 0) {
        size_t target = d->need ? d->need : EVSTREAM_PRELUDE;
        size_t take = target - d->len;
        int rc;

        if (take > n)
            take = n;
        rc = reserve(d, d->len + take, target);
        if (rc != 0)
            return rc;
        memcpy(d->buf + d->len, s, take);
        d->len += take;
        s += take;
        n -= take;
        if (d->len < target)
            return 0;
        if (d->need == 0) {
            rc = read_prelude(d);
            if (rc != 0)
                return rc;
            continue; /* at least the message CRC is still to come */
        }
        rc = deliver(d, fn, ud);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int evstream_feed(struct evstream *d, const void *p, size_t len, evstream_msg_fn *fn, void *ud)
{
    int rc;

    if (d->error != 0)
        return d->error;
    rc = decode(d, p, len, fn, ud);
    if (rc == 0)
        return 0;
    /* Our own codes stick as themselves; a callback's value is returned
     * once and EVSTREAM_EABORTED (set by deliver()) sticks. */
    if (d->error == 0)
        d->error = rc;
    return rc;
}

size_t evstream_buffered(const struct evstream *d)
{
    return d->len;
}

bool evstream_is_idle(const struct evstream *d)
{
    return d->len == 0;
}

int evstream_encode(const char *const *names, const char *const *values, size_t n,
                    const void *payload, size_t payload_len, uint8_t **out, size_t *out_len)
{
    size_t hlen = 0, total, i, off;
    uint8_t *b;

    *out = NULL;
    *out_len = 0;
    for (i = 0; i < n; i++) {
        size_t nl = strlen(names[i]), vl = strlen(values[i]);

        if (nl == 0 || nl > 255 || vl > 65535)
            return EVSTREAM_EINVAL;
        hlen += 1 + nl + 1 + 2 + vl;
        if (hlen > UINT32_MAX)
            return EVSTREAM_EINVAL;
    }
    if (hlen > UINT32_MAX - EVSTREAM_MIN || payload_len > UINT32_MAX - EVSTREAM_MIN - hlen)
        return EVSTREAM_EINVAL;
    total = EVSTREAM_MIN + hlen + payload_len;
    b = malloc(total);
    if (b == NULL)
        return EVSTREAM_ENOMEM;
    put_u32(b, (uint32_t)total);
    put_u32(b + 4, (uint32_t)hlen);
    put_u32(b + 8, crc_of(b, 8));
    off = EVSTREAM_PRELUDE;
    for (i = 0; i < n; i++) {
        size_t nl = strlen(names[i]), vl = strlen(values[i]);

        b[off++] = (uint8_t)nl;
        memcpy(b + off, names[i], nl);
        off += nl;
        b[off++] = 7;
        b[off++] = (uint8_t)(vl >> 8);
        b[off++] = (uint8_t)vl;
        memcpy(b + off, values[i], vl);
        off += vl;
    }
    if (payload_len > 0)
        memcpy(b + off, payload, payload_len);
    off += payload_len;
    put_u32(b + off, crc_of(b, off));
    *out = b;
    *out_len = total;
    return 0;
}
