/*
 * fuzz_http_request.c — libFuzzer target for sidecar/http/httpreq.c: whatever a
 * client sends to the HTTP front end.
 *
 * Byte 0 seeds the read sizes; bytes 1.. are what the client sent. They
 * are read twice, as http.c reads a connection: once in one piece, once in
 * reads of 1..64 bytes derived from the seed, each time handing the
 * reader the bytes it did not use followed by the new ones, and starting
 * the next request after each complete one. The reader promises that the
 * requests it sees do not depend on how the bytes were split, so both
 * readings must produce the same transcript: for each request its
 * method, version, target, the values of the headers it keeps, whether it
 * keeps the connection, announces a body or says JSON, what
 * httpreq_check_site() says of it (over TCP and the Unix socket), and the
 * body, then
 * how the reading ended (a refusal's status may differ: a head can be too
 * long and malformed at once, and which is seen first depends on the
 * reads). The bounds are small so that they are reached.
 */
#include "http/httpreq.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_MAX_HEADER_BYTES 2048
#define FUZZ_MAX_BODY_BYTES   4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct transcript {
    char *p;
    size_t len, cap;
};

static void put(struct transcript *t, const void *s, size_t n)
{
    if (n == 0)
        return;
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

static void put_u(struct transcript *t, unsigned long long v)
{
    put(t, &v, sizeof(v));
}

/* One reading: the requests seen whole so far, and the one being read
 * (kept only once it is complete, or stopped at its head: the pieces of a
 * request refused later depend on the reads). */
struct reading {
    struct transcript done, cur;
};

static struct transcript *current(struct httpreq *r)
{
    return &((struct reading *)r->owner)->cur;
}

static void on_begin(struct httpreq *r)
{
    current(r)->len = 0;
}

static int on_head(struct httpreq *r)
{
    struct transcript *t = current(r);

    /* Every value is NUL-terminated within its bound. */
    if (r->url_len > HTTPREQ_URL_MAX || r->url[r->url_len] != '\0')
        abort();
    put(t, "H", 1);
    put_u(t, r->parser.method);
    put_u(t, r->parser.http_major * 100u + r->parser.http_minor);
    put_u(t, r->url_len);
    put(t, r->url, r->url_len);
    for (int i = 0; i < HRQ_COUNT; i++) {
        if (r->val_len[i] > HTTPREQ_VAL_MAX || r->val[i][r->val_len[i]] != '\0' ||
            httpreq_hdr_name((enum httpreq_hdr)i)[0] == '\0')
            abort();
        put_u(t, r->present[i]);
        put_u(t, r->val_len[i]);
        put(t, r->val[i], r->val_len[i]);
    }
    put_u(t, (unsigned long long)r->over);
    put_u(t, r->auth_over);
    put_u(t, httpreq_keep_alive(r));
    put_u(t, httpreq_has_body(r));
    put_u(t, httpreq_ctype_is_json(r));
    /* Where it comes from, as a TCP listener and as the Unix socket see it. */
    static const char *const origins[] = { "http://localhost:3000", "https://app.example" };
    static const char *const hosts[] = { "polygw.internal" };
    struct httpreq_site site = { true, origins, 2, hosts, 1 };
    const char *why = NULL;
    for (int tcp = 0; tcp < 2; tcp++) {
        site.check_host = tcp;
        enum httpreq_site_rc rc = httpreq_check_site(r, &site, &why);
        if (rc == HTTPREQ_SITE_REFUSED ? !why
                                       : rc != HTTPREQ_SITE_OWN && rc != HTTPREQ_SITE_ALLOWED)
            abort();
        put_u(t, (unsigned long long)(rc + 1));
    }
    /* A request the front would refuse at its head: stop there. */
    return r->url_len >= 5 && memcmp(r->url, "/stop", 5) == 0 ? 1 : 0;
}

/* The body's bytes, whatever the pieces (its length ends the request). */
static int on_body(struct httpreq *r, const char *at, size_t n)
{
    if (r->body_len > FUZZ_MAX_BODY_BYTES)
        abort();
    put(current(r), at, n);
    return 0;
}

static const struct httpreq_ops ops = { .begin = on_begin, .head = on_head, .body = on_body };

static void commit(struct reading *g, const char *what)
{
    put(&g->done, g->cur.p, g->cur.len);
    put(&g->done, what, 1);
    g->cur.len = 0;
}

/* Reads `data` in pieces of at most `max_read` bytes (0: one piece). */
static void run(const uint8_t *data, size_t size, uint8_t seed, size_t max_read, struct reading *g)
{
    struct httpreq r;
    char *buf = malloc(size + 1);
    size_t have = 0, off = 0, in = 0;
    uint32_t x = seed | 0x100u;
    enum httpreq_rc rc = HTTPREQ_MORE;

    if (!buf)
        abort();
    httpreq_init(&r, &ops, g);
    r.max_header_bytes = FUZZ_MAX_HEADER_BYTES;
    r.max_body_bytes = FUZZ_MAX_BODY_BYTES;
    while (in < size) {
        size_t n = size - in;
        if (max_read) {
            x = x * 1103515245u + 12345u;
            size_t want = 1 + (x >> 16) % max_read;
            if (n > want)
                n = want;
        }
        memcpy(buf + have, data + in, n);
        have += n;
        in += n;
        while (off < have) { /* as http.c: never an empty read (the parser's EOF) */
            size_t used;
            rc = httpreq_execute(&r, buf + off, have - off, &used);
            if (used > have - off)
                abort();
            off += used;
            if (rc != HTTPREQ_DONE)
                break;
            put_u(&g->cur, r.body_len);
            commit(g, "E");
        }
        if (rc == HTTPREQ_FAIL || rc == HTTPREQ_STOP)
            break;
        if (off != have) /* MORE uses every byte */
            abort();
    }
    if (rc == HTTPREQ_STOP) {
        commit(g, "S");
    } else if (rc == HTTPREQ_FAIL) {
        if (r.status != 400 && r.status != 413 && r.status != 414 && r.status != 431)
            abort();
        if (r.status == 400 && !r.why)
            abort();
        g->cur.len = 0;
        commit(g, "F");
    }
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct reading whole = { 0 }, split = { 0 };

    if (size < 1)
        return 0;
    run(data + 1, size - 1, data[0], 0, &whole);
    run(data + 1, size - 1, data[0], 1 + data[0] % 64, &split);
    if (whole.done.len != split.done.len ||
        (whole.done.len && memcmp(whole.done.p, split.done.p, whole.done.len) != 0))
        abort();
    free(whole.done.p);
    free(whole.cur.p);
    free(split.done.p);
    free(split.cur.p);
    return 0;
}
