/*
 * strbuf.h — a growable byte buffer that always keeps room for a closing
 * NUL, so its text can be used as a C string once the writer puts one.
 *
 * Zero-initialised is the same as strbuf_init(). `data` is malloc'd and
 * owned by the buffer; a caller may take it (then re-init the buffer).
 * Growth is geometric, so appends are amortised O(1). Every appending call
 * returns 0 or STRBUF_ENOMEM and leaves the buffer unchanged on failure.
 * No I/O, no globals: safe from any callback and from several threads on
 * distinct buffers.
 *
 * Two uses beyond a plain string builder, after curl's dynbuf:
 * - a cap (strbuf_init_max): no append makes the live text longer than
 *   `max` bytes; one that would fails with STRBUF_ETOOBIG, `b` unchanged;
 * - a queue (strbuf_consume): the text is data[off..len), a consumer drops
 *   what it has used from the front in O(1), and growth first moves the
 *   live bytes back to the front (reclaiming the consumed prefix) before
 *   it allocates more.
 * A buffer that never consumes keeps off == 0, so data[0..len) is its text.
 */
#ifndef POLYGW_STRBUF_H
#define POLYGW_STRBUF_H

#include <stddef.h>
#include <string.h>

enum {
    STRBUF_ENOMEM = -2,
    STRBUF_ETOOBIG = -5, /* past the cap set by strbuf_init_max() */
};

struct strbuf {
    char *data;
    size_t len; /* end of the text in data */
    size_t cap; /* bytes allocated */
    size_t off; /* start of the text: bytes consumed from the front */
    size_t max; /* the most live text allowed; 0: no cap */
};

/* Makes `b` empty without allocating, with no cap. */
void strbuf_init(struct strbuf *b);

/* Makes `b` empty without allocating; its live text may never exceed
 * `max` bytes (max > 0), like curl's Curl_dyn_init(s, toobig). */
void strbuf_init_max(struct strbuf *b, size_t max);

/* Frees `b`'s memory and leaves it empty; the cap stays. */
void strbuf_fini(struct strbuf *b);

/* Empties `b` but keeps its memory and cap for reuse (the hot-path way to
 * recycle a buffer from one use to the next). */
void strbuf_reset(struct strbuf *b);

/* The live text: strbuf_live(b) bytes at strbuf_head(b). */
static inline char *strbuf_head(const struct strbuf *b)
{
    return b->data + b->off;
}

static inline size_t strbuf_live(const struct strbuf *b)
{
    return b->len - b->off;
}

/* Drops the first n (<= strbuf_live(b)) bytes of the live text in O(1):
 * no copy now; the space comes back at the next growth, or at once when
 * nothing is left. */
static inline void strbuf_consume(struct strbuf *b, size_t n)
{
    b->off += n;
    if (b->off == b->len)
        b->off = b->len = 0;
}

/* Gives back the memory past the text and its NUL (the consumed prefix
 * too), for a buffer kept long after it was written (growth leaves up to half of it unused, and at
 * least 1 KiB). Returns 0, or STRBUF_ENOMEM with `b` unchanged. */
int strbuf_fit(struct strbuf *b);

/* Makes `b` hold exactly the n bytes of p and a NUL, in memory of exactly
 * that size (for text written once and kept, where growth's spare room and
 * a strbuf_fit() afterwards would cost two reallocations). Returns 0, or
 * STRBUF_ENOMEM with `b` unchanged. */
int strbuf_set_exact(struct strbuf *b, const void *p, size_t n);

/* Slow path of strbuf_reserve(); not for direct use. */
int strbuf_grow(struct strbuf *b, size_t extra);

/* Makes room for at least `extra` more bytes after `len`, plus a NUL:
 * 0, STRBUF_ENOMEM, or STRBUF_ETOOBIG when the live text would pass the
 * cap. */
static inline int strbuf_reserve(struct strbuf *b, size_t extra)
{
    if (b->cap - b->len > extra) /* strict: keeps one byte for the NUL */
        return 0;
    return strbuf_grow(b, extra);
}

/* Appends n bytes of p (p may be NULL when n is 0). Does not write a NUL.
 * Returns 0 or a strbuf_reserve() error. */
static inline int strbuf_put(struct strbuf *b, const void *p, size_t n)
{
    int rc = strbuf_reserve(b, n);
    if (rc < 0)
        return rc;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

static inline int strbuf_putc(struct strbuf *b, char c)
{
    int rc = strbuf_reserve(b, 1);
    if (rc < 0)
        return rc;
    b->data[b->len++] = c;
    return 0;
}

/* Appends a string literal (its length known at compile time). */
#define strbuf_puts(b, lit) strbuf_put((b), (lit), sizeof(lit) - 1)

/* Copies the string `src` into `dst` (`cap` bytes, cap >= 1), cut to fit
 * and always NUL-terminated: snprintf(dst, cap, "%s", src) without the
 * printf engine, for names copied on every request. Returns the length
 * copied. */
static inline size_t str_copy(char *dst, size_t cap, const char *src)
{
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
    return n;
}

/* Formats into `dst` (`cap` bytes) like snprintf, cut to fit; does
 * nothing when dst is NULL or cap is 0 (the shape of the optional error
 * buffers `char *err, size_t errlen` that parsers and connectors fill). */
void str_setf(char *dst, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* u in decimal at p (at most 20 bytes, no terminator); returns the end.
 * For the numbers written on every request (RESP heads, script arguments,
 * Content-Length): snprintf costs some ten times more. */
static inline char *put_uint(char *p, unsigned long long u)
{
    char digits[20];
    size_t k = 0;

    do {
        digits[k++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    while (k)
        *p++ = digits[--k];
    return p;
}

/* Writes the NUL after the text (room for it is always there once the
 * buffer has memory); a buffer that never allocated stays data == NULL. */
static inline void strbuf_terminate(struct strbuf *b)
{
    if (b->data)
        b->data[b->len] = '\0';
}

#endif /* POLYGW_STRBUF_H */
