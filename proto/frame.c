/* frame.c — incremental msgpack frame reader (see frame.h for the why). */
#include "frame.h"

#include <string.h>

#define FRAME_DEFAULT_INITIAL 4096

int frame_reader_init(struct frame_reader *r, size_t max_bytes, size_t initial_bytes)
{
    memset(r, 0, sizeof(*r));
    if (!msgpack_unpacker_init(&r->up, initial_bytes ? initial_bytes : FRAME_DEFAULT_INITIAL))
        return FRAME_ENOMEM;
    r->max_bytes = max_bytes;
    r->max_items = max_bytes / 4 > 1024 ? max_bytes / 4 : 1024;
    return 0;
}

void frame_reader_fini(struct frame_reader *r)
{
    if (r->up.buffer) /* NULL after a failed frame_reader_trim() */
        msgpack_unpacker_destroy(&r->up);
}

int frame_reader_trim(struct frame_reader *r, size_t keep_bytes)
{
    if (!r->up.buffer || r->up.used != r->up.off || r->up.used + r->up.free <= keep_bytes)
        return 0;
    /* msgpack-c's unpacker points into itself, so it is rebuilt in place. */
    msgpack_unpacker_destroy(&r->up);
    memset(&r->up, 0, sizeof(r->up));
    if (!msgpack_unpacker_init(&r->up, FRAME_DEFAULT_INITIAL)) {
        memset(&r->up, 0, sizeof(r->up));
        r->error = FRAME_ENOMEM;
        return FRAME_ENOMEM;
    }
    return 0;
}

int frame_reader_reserve(struct frame_reader *r, size_t want, char **buf, size_t *cap)
{
    if (!r->up.buffer || !msgpack_unpacker_reserve_buffer(&r->up, want))
        return FRAME_ENOMEM;
    *buf = msgpack_unpacker_buffer(&r->up);
    *cap = msgpack_unpacker_buffer_capacity(&r->up);
    return 0;
}

void frame_reader_commit(struct frame_reader *r, size_t n)
{
    msgpack_unpacker_buffer_consumed(&r->up, n);
}

int frame_reader_feed(struct frame_reader *r, const void *data, size_t len)
{
    char *buf;
    size_t cap;

    if (len == 0)
        return 0;
    if (frame_reader_reserve(r, len, &buf, &cap) < 0)
        return FRAME_ENOMEM;
    memcpy(buf, data, len);
    frame_reader_commit(r, len);
    return 0;
}

size_t frame_reader_pending(const struct frame_reader *r)
{
    return r->up.buffer ? r->up.used - r->up.off : 0;
}

const char *frame_strerror(int err)
{
    switch (err) {
    case FRAME_EMALFORMED:
        return "malformed msgpack";
    case FRAME_ETOO_LARGE:
        return "message exceeds max_message_bytes";
    case FRAME_ETOO_DEEP:
        return "message nests containers too deeply";
    case FRAME_ENOMEM:
        return "out of memory";
    default:
        return "unknown frame error";
    }
}

/* One item (scalar, string, or a whole container) has ended: count it
 * against the enclosing containers, closing every container it completes. */
static void scan_item_done(struct frame_reader *r)
{
    for (;;) {
        if (r->depth == 0) {
            r->done = true;
            return;
        }
        if (--r->left[r->depth - 1] > 0)
            return;
        r->depth--;
    }
}

static uint64_t be_read(const unsigned char *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* Header layout of the msgpack type starting with byte `b`:
 * *hl = header bytes, *lenb = bytes of big-endian length/count after the
 * type byte (0 when fixed), *kind: 's' scalar of fixed size, 'p' payload of
 * `len` bytes follows, 'a' array of `len`, 'm' map of `len`, 'x' invalid.
 * For fixed-size scalars *hl is the whole encoded size; ext types have one
 * extra type byte inside the header. */
static void scan_header(unsigned char b, unsigned *hl, unsigned *lenb, char *kind, uint64_t *fixlen)
{
    *lenb = 0;
    *fixlen = 0;
    *hl = 1;
    *kind = 's';
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
        return;
    if (b >= 0x80 && b <= 0x8f) {
        *kind = 'm';
        *fixlen = b & 0x0f;
        return;
    }
    if (b >= 0x90 && b <= 0x9f) {
        *kind = 'a';
        *fixlen = b & 0x0f;
        return;
    }
    if (b >= 0xa0 && b <= 0xbf) {
        *kind = 'p';
        *fixlen = b & 0x1f;
        return;
    }
    switch (b) {
    case 0xc4:
        *kind = 'p';
        *lenb = 1;
        break; /* bin 8 */
    case 0xc5:
        *kind = 'p';
        *lenb = 2;
        break; /* bin 16 */
    case 0xc6:
        *kind = 'p';
        *lenb = 4;
        break; /* bin 32 */
    case 0xc7:
        *kind = 'p';
        *lenb = 1;
        *hl = 1;
        break; /* ext 8 (+type byte) */
    case 0xc8:
        *kind = 'p';
        *lenb = 2;
        *hl = 1;
        break; /* ext 16 */
    case 0xc9:
        *kind = 'p';
        *lenb = 4;
        *hl = 1;
        break; /* ext 32 */
    case 0xca:
        *hl = 5;
        break; /* float 32 */
    case 0xcb:
        *hl = 9;
        break; /* float 64 */
    case 0xcc:
    case 0xd0:
        *hl = 2;
        break; /* (u)int 8 */
    case 0xcd:
    case 0xd1:
        *hl = 3;
        break; /* (u)int 16 */
    case 0xce:
    case 0xd2:
        *hl = 5;
        break; /* (u)int 32 */
    case 0xcf:
    case 0xd3:
        *hl = 9;
        break; /* (u)int 64 */
    case 0xd4:
        *hl = 3;
        break; /* fixext 1 */
    case 0xd5:
        *hl = 4;
        break; /* fixext 2 */
    case 0xd6:
        *hl = 6;
        break; /* fixext 4 */
    case 0xd7:
        *hl = 10;
        break; /* fixext 8 */
    case 0xd8:
        *hl = 18;
        break; /* fixext 16 */
    case 0xd9:
        *kind = 'p';
        *lenb = 1;
        break; /* str 8 */
    case 0xda:
        *kind = 'p';
        *lenb = 2;
        break; /* str 16 */
    case 0xdb:
        *kind = 'p';
        *lenb = 4;
        break; /* str 32 */
    case 0xdc:
        *kind = 'a';
        *lenb = 2;
        break; /* array 16 */
    case 0xdd:
        *kind = 'a';
        *lenb = 4;
        break; /* array 32 */
    case 0xde:
        *kind = 'm';
        *lenb = 2;
        break; /* map 16 */
    case 0xdf:
        *kind = 'm';
        *lenb = 4;
        break; /* map 32 */
    default:
        *kind = 'x';
        break; /* 0xc1: never used */
    }
    if (*lenb)
        *hl = 1 + *lenb + (b >= 0xc7 && b <= 0xc9 ? 1 : 0);
}

/* Advances the scanner over the buffered bytes. Returns 1 when a whole
 * frame is buffered, 0 when more bytes are needed, or FRAME_E*. */
static int scan(struct frame_reader *r)
{
    const unsigned char *base = (const unsigned char *)r->up.buffer + r->up.off;
    size_t avail_total = r->up.used - r->up.off;

    while (!r->done) {
        size_t avail = avail_total - r->scanned;

        if (r->skip > 0) {
            uint64_t n = r->skip < avail ? r->skip : avail;
            r->scanned += (size_t)n;
            r->skip -= n;
            if (r->skip > 0)
                return 0;
            scan_item_done(r);
            continue;
        }
        if (avail == 0)
            return 0;

        const unsigned char *p = base + r->scanned;
        unsigned hl, lenb;
        char kind;
        uint64_t len;
        scan_header(p[0], &hl, &lenb, &kind, &len);
        if (kind == 'x')
            return FRAME_EMALFORMED;
        /* A claim is judged as soon as the length bytes are in, even before
         * the rest of the header, so a huge claim fails without waiting. */
        if (avail < 1 + (size_t)lenb)
            return 0;
        if (lenb)
            len = be_read(p + 1, lenb);
        if (kind == 'm')
            len *= 2;
        /* Every contained item takes at least one byte, so a container of
         * `len` items needs at least `len` more bytes. */
        if ((uint64_t)r->scanned + hl + len > r->max_bytes ||
            (kind == 's' && r->scanned + hl > r->max_bytes))
            return FRAME_ETOO_LARGE;
        if (avail < hl)
            return 0;
        r->scanned += hl;
        if (++r->items > r->max_items)
            return FRAME_ETOO_LARGE;

        switch (kind) {
        case 's':
            scan_item_done(r);
            break;
        case 'p':
            r->skip = len;
            if (len == 0)
                scan_item_done(r);
            break;
        default: /* 'a', 'm' */
            /* An empty container is a nesting level too: msgpack-c's parser
             * stack refuses any container header once 32 are open, so
             * judging only non-empty ones would let an empty 33rd level
             * through to fail later as FRAME_ENOMEM. */
            if (r->depth == FRAME_MAX_DEPTH)
                return FRAME_ETOO_DEEP;
            if (len == 0)
                scan_item_done(r);
            else
                r->left[r->depth++] = len;
            break;
        }
    }
    return 1;
}

int frame_reader_next(struct frame_reader *r, msgpack_unpacked *out, size_t *frame_bytes)
{
    if (r->error)
        return r->error;

    int rc = scan(r);
    if (rc <= 0) {
        if (rc < 0)
            r->error = rc;
        return rc;
    }

    size_t parsed = 0;
    msgpack_unpack_return ret = msgpack_unpacker_next_with_size(&r->up, out, &parsed);
    if (ret != MSGPACK_UNPACK_SUCCESS || parsed != r->scanned) {
        /* The scanner and msgpack-c disagree: treat the stream as broken. */
        r->error = ret == MSGPACK_UNPACK_NOMEM_ERROR ? FRAME_ENOMEM : FRAME_EMALFORMED;
        return r->error;
    }
    if (frame_bytes)
        *frame_bytes = parsed;
    r->scanned = 0;
    r->items = 0;
    r->done = false;
    return 1;
}
