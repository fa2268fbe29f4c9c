/* temporary local decoder for integration testing; replaced by the real one */
#include "evstream.h"
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
int evstream_init(struct evstream *d, size_t max)
{
    memset(d, 0, sizeof(*d));
    if (max < 16)
        return EVSTREAM_EINVAL;
    d->max_message_bytes = max;
    return 0;
}
void evstream_fini(struct evstream *d)
{
    free(d->buf);
    d->buf = NULL;
}
size_t evstream_buffered(const struct evstream *d)
{
    return d->len;
}
bool evstream_is_idle(const struct evstream *d)
{
    return d->len == 0;
}
static int put(struct evstream *d, const uint8_t *p, size_t n)
{
    if (d->len + n + 1 > d->cap) {
        size_t c = d->cap ? d->cap : 256;
        while (c < d->len + n + 1)
            c *= 2;
        uint8_t *b = realloc(d->buf, c);
        if (!b)
            return -1;
        d->buf = b;
        d->cap = c;
    }
    memcpy(d->buf + d->len, p, n);
    d->len += n;
    return 0;
}
static int msg(struct evstream *d, evstream_msg_fn *fn, void *ud)
{
    uint8_t *m = d->buf;
    uint32_t total = be32(m), hl = be32(m + 4);
    if ((uint32_t)crc32(0, m, 8) != be32(m + 8))
        return EVSTREAM_ECRC;
    if ((uint32_t)crc32(0, m, total - 4) != be32(m + total - 4))
        return EVSTREAM_ECRC;
    struct evstream_msg e;
    memset(&e, 0, sizeof(e));
    const uint8_t *h = m + 12, *end = h + hl;
    while (h < end) {
        uint8_t nl = *h++;
        if (!nl || h + nl + 1 > end)
            return EVSTREAM_EMALFORMED;
        const char *name = (const char *)h;
        h += nl;
        uint8_t t = *h++;
        size_t vl;
        static const int fixed[] = { 0, 0, 1, 2, 4, 8, -1, -1, 8, 16 };
        if (t > 9)
            return EVSTREAM_EMALFORMED;
        if (t == 6 || t == 7) {
            if (h + 2 > end)
                return EVSTREAM_EMALFORMED;
            vl = (size_t)h[0] << 8 | h[1];
            h += 2;
        } else
            vl = (size_t)fixed[t];
        if (h + vl > end)
            return EVSTREAM_EMALFORMED;
        if (t == 7) {
            struct evstream_str s = { (const char *)h, vl };
#define H(n, f)                                          \
    if (nl == sizeof(n) - 1 && memcmp(name, n, nl) == 0) \
        e.f = s;
            H(":message-type", message_type)
            H(":event-type", event_type)
            H(":exception-type", exception_type)
            H(":error-code", error_code)
            H(":error-message", error_message) H(":content-type", content_type)
        }
        h += vl;
    }
    e.payload = end;
    e.payload_len = total - 16 - hl;
    uint8_t save = m[total - 4];
    m[total - 4] = 0;
    int rc = fn(&e, ud);
    m[total - 4] = save;
    return rc;
}
int evstream_feed(struct evstream *d, const void *p, size_t n, evstream_msg_fn *fn, void *ud)
{
    const uint8_t *s = p;
    if (d->error)
        return d->error;
    while (n) {
        size_t want = d->need ? d->need : 12;
        size_t take = want - d->len < n ? want - d->len : n;
        if (put(d, s, take) < 0)
            return d->error = EVSTREAM_ENOMEM;
        s += take;
        n -= take;
        if (d->len < want)
            break;
        if (!d->need) {
            uint32_t t = be32(d->buf), hl = be32(d->buf + 4);
            if ((uint32_t)crc32(0, d->buf, 8) != be32(d->buf + 8))
                return d->error = EVSTREAM_ECRC;
            if (t < 16 || hl > t - 16)
                return d->error = EVSTREAM_EMALFORMED;
            if (t > d->max_message_bytes)
                return d->error = EVSTREAM_ETOO_LARGE;
            d->need = t;
            continue;
        }
        int rc = msg(d, fn, ud);
        d->len = 0;
        d->need = 0;
        if (rc) {
            d->error = rc < 0 && rc >= EVSTREAM_EMALFORMED ? rc : EVSTREAM_EABORTED;
            return rc;
        }
    }
    return 0;
}
