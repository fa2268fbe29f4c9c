/*
 * h1_contract.c — the hooks and transcript the HTTP/1.1 client's fuzz
 * targets share (h1_contract.h).
 */
#include "h1_contract.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

void transcript_put(struct transcript *t, const void *p, size_t n)
{
    if (t->len + n > t->cap) {
        size_t cap = (t->len + n) * 2 + 256;
        char *np = realloc(t->p, cap);
        if (!np)
            abort();
        t->p = np;
        t->cap = cap;
    }
    if (n > 0)
        memcpy(t->p + t->len, p, n);
    t->len += n;
}

/* A record: its kind, its length, its bytes. */
static void put_record(struct transcript *t, char kind, const void *p, size_t n)
{
    transcript_put(t, &kind, 1);
    transcript_put(t, &n, sizeof(n));
    transcript_put(t, p, n);
}

uint32_t rng_next(uint32_t *rng)
{
    *rng = *rng * 1103515245u + 12345u;
    return *rng >> 16;
}

size_t rng_piece(uint32_t *rng)
{
    uint32_t r = rng_next(rng);
    return 1 + rng_next(rng) % (16u << (r % 4 * 4));
}

static bool status_line(const char *line, size_t n, unsigned *code)
{
    if (n != 14 || memcmp(line, "HTTP/", 5) != 0 || line[6] != '.' || line[8] != ' ' ||
        memcmp(line + 12, "\r\n", 2) != 0)
        return false;
    *code = (unsigned)(line[9] - '0') * 100 + (unsigned)(line[10] - '0') * 10 +
        (unsigned)(line[11] - '0');
    return true;
}

static bool bodiless(unsigned code)
{
    return code / 100 == 1 || code == 204 || code == 304;
}

static bool interim(unsigned code)
{
    return code / 100 == 1 && code != 101;
}

static void on_connecting(void *ud)
{
    struct exchange *x = ud;
    if (x->ended)
        abort();
}

static void on_sending(void *ud)
{
    struct exchange *x = ud;
    if (x->ended || x->told->sent)
        abort(); /* after on_end, or twice */
    x->told->sent = true;
}

static int on_header(void *ud, const char *line, size_t n)
{
    struct exchange *x = ud;
    unsigned code;

    if (x->ended || *x->busy <= 0 || !x->told->sent)
        abort(); /* inside the parser, after on_sending, before on_end */
    if (n < 2 || n > H1_LINE_MAX || line[n - 2] != '\r' || line[n - 1] != '\n')
        abort();
    if (status_line(line, n, &code)) {
        /* A new set: the previous one was an interim answer. */
        if (x->lines_left > 0 && !interim(x->status))
            abort();
        x->status = code;
        x->lines_left = 1;
    } else if (x->lines_left == 0 || (!memchr(line, ':', n) && n < H1_LINE_MAX)) {
        abort(); /* before any status line, or not cut and without a colon */
    } else {
        x->lines_left++;
    }
    put_record(&x->told->lines, 'H', line, n);
    return n > 9 && strncasecmp(line, "x-refuse:", 9) == 0 ? -1 : 0;
}

static enum h1_take on_body(void *ud, const char *p, size_t n)
{
    struct exchange *x = ud;

    if (x->ended || *x->busy <= 0 || n == 0 || x->lines_left == 0 || bodiless(x->status))
        abort(); /* outside the parser, empty, without a head or after a bodiless one */
    if (x->held) {
        if (n != x->held_len || memcmp(p, x->held, n) != 0)
            abort(); /* not the buffer paused on, whole */
        free(x->held);
        x->held = NULL;
    } else if (x->pauses && rng_next(x->rng) % 2 == 0) {
        if (!(x->held = malloc(n)))
            abort();
        memcpy(x->held, p, n);
        x->held_len = n;
        x->paused = true;
        return H1_PAUSE;
    }
    if (x->refuse)
        return H1_ABORT;
    transcript_put(&x->body, p, n);
    return H1_TAKEN;
}

static void on_end(void *ud, enum h1_end end, const char *detail)
{
    struct exchange *x = ud;

    if (x->ended)
        abort(); /* twice */
    x->ended = true;
    x->told->end = (int)end;
    if (end != H1_OK && (!detail || !detail[0]))
        abort(); /* a detail with every failure */
    if (end == H1_OK && (x->lines_left == 0 || interim(x->status)))
        abort(); /* a complete answer needs a final status */
    /* H1_TLS is the handshake's failure, and only that. */
    if (end == H1_TLS ? !x->tls || x->told->sent : x->tls && !x->told->sent)
        abort();
    snprintf(x->told->detail, sizeof(x->told->detail), "%s", detail ? detail : "");
    free(x->held);
    x->held = NULL;
    put_record(&x->told->lines, 'B', x->body.p, x->body.len);
}

const struct h1_hooks exchange_hooks = {
    .on_connecting = on_connecting,
    .on_sending = on_sending,
    .on_header = on_header,
    .on_body = on_body,
    .on_end = on_end,
};

void exchange_turn(struct ev_loop *loop, struct exchange *x)
{
    ev_run(loop, EVRUN_NOWAIT);
    if (x->paused && !x->ended) {
        x->paused = false;
        h1_req_resume(&x->req);
    }
}

void exchange_free(struct exchange *x)
{
    free(x->body.p);
    free(x->held);
}

void told_compare(const struct told *a, const struct told *b)
{
    if (a->end == H1_OK || b->end == H1_OK) {
        if (a->end != b->end || a->lines.len != b->lines.len ||
            memcmp(a->lines.p, b->lines.p, a->lines.len) != 0)
            abort();
    } else if (a->end != H1_ABORTED && b->end != H1_ABORTED && a->end != b->end) {
        abort();
    }
}

void told_free(struct told t[2])
{
    for (int i = 0; i < 2; i++)
        free(t[i].lines.p);
}

int upstream_listen(const char *name, struct sockaddr_un *addr, socklen_t *len)
{
    int n, fd;

    memset(addr, 0, sizeof(*addr));
    addr->sun_family = AF_UNIX;
    n = snprintf(addr->sun_path + 1, sizeof(addr->sun_path) - 1, "%s-%d", name, (int)getpid());
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)addr, *len) != 0 || listen(fd, 64) != 0) {
        perror(name);
        abort();
    }
    return fd;
}
