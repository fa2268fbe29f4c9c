/*
 * frame.h — incremental reader of msgpack-RPC frames from a byte stream.
 *
 * The wire has no framing of its own: one message is one msgpack value, and
 * a value may arrive split over any number of reads, or several values in
 * one read. The reader is msgpack-c's streaming unpacker (it owns the buffer
 * and parses zero-copy) guarded by a small structural scanner of our own.
 *
 * Why the scanner: msgpack-c allocates an array's or a map's element storage
 * as soon as it sees the container header, so a 5-byte "array32 of 2^32-1"
 * header would ask for ~100 GB; and a str32 header claiming 100 MB would make
 * it buffer 100 MB before failing. The scanner walks each frame's headers as
 * bytes arrive, rejects claims over the limits at once (FRAME_ETOO_LARGE,
 * FRAME_ETOO_DEEP, FRAME_EMALFORMED for the reserved byte 0xc1), and hands the
 * frame to msgpack-c only when all of it is buffered — so msgpack-c never
 * allocates more than a small multiple of bytes we actually received.
 *
 * Limits: a frame is at most `max_bytes` long (its claimed size counts, not
 * only what arrived), nests at most FRAME_MAX_DEPTH containers, and holds
 * at most max(1024, max_bytes / 4) values: msgpack-c spends 24 bytes per
 * decoded value, so this bounds a frame's decoded size to about 6 times its
 * encoded limit (a 16 MiB array of one-byte nils would otherwise cost
 * ~400 MB). Too many values is reported as FRAME_ETOO_LARGE.
 *
 * Usage (one reader per connection; not thread-safe):
 *
 *     frame_reader_reserve(r, 16384, &buf, &cap);
 *     n = read(fd, buf, cap);
 *     frame_reader_commit(r, n);
 *     while ((rc = frame_reader_next(r, &msg)) == 1) { ... msg.data ... }
 *     if (rc < 0) { error: answer and close }
 *
 * After an error the reader stays failed: every later call returns the same
 * error. The stream cannot be resynchronised (msgpack has no markers), so the
 * connection must be closed.
 */
#ifndef POLYGW_FRAME_H
#define POLYGW_FRAME_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FRAME_MAX_DEPTH 32 /* msgpack-c's own parser stack is 32 deep */

enum {
    FRAME_EMALFORMED = -1, /* not msgpack (e.g. the reserved byte 0xc1) */
    FRAME_ETOO_LARGE = -2, /* frame longer than max_bytes, or claims to be */
    FRAME_ETOO_DEEP = -3,  /* more than FRAME_MAX_DEPTH nested containers */
    FRAME_ENOMEM = -4,     /* allocation failed */
};

struct frame_reader {
    msgpack_unpacker up;
    size_t max_bytes;
    size_t scanned;                 /* validated bytes of the pending frame, from up.off */
    uint64_t skip;                  /* payload bytes still to pass over */
    unsigned depth;                 /* open containers */
    uint64_t left[FRAME_MAX_DEPTH]; /* items still expected in each open container */
    uint64_t items;                 /* values seen in the pending frame */
    uint64_t max_items;             /* max_bytes / 4, at least 1024 */
    bool done;                      /* a whole frame of `scanned` bytes is buffered */
    int error;                      /* sticky FRAME_E* once failed, else 0 */
};

/* Initialises `r` for frames of at most `max_bytes` (> 0). The unpacker
 * starts with `initial_bytes` of buffer (0: 4 KiB) and grows on demand.
 * Returns 0, or FRAME_ENOMEM (nothing to fini then). */
int frame_reader_init(struct frame_reader *r, size_t max_bytes, size_t initial_bytes);

/* Releases the buffer. Objects from earlier frame_reader_next() calls stay
 * valid until their msgpack_unpacked is destroyed (they own their zone). */
void frame_reader_fini(struct frame_reader *r);

/* Makes room for at least `want` bytes and returns where to write them in
 * *buf and how many may be written in *cap (>= want). Returns 0 or
 * FRAME_ENOMEM. The pointer is valid until the next reserve/next call. */
int frame_reader_reserve(struct frame_reader *r, size_t want, char **buf, size_t *cap);

/* Declares that `n` bytes were written at the reserved buffer. */
void frame_reader_commit(struct frame_reader *r, size_t n);

/* Copies `len` bytes in (reserve + memcpy + commit). Returns 0 or FRAME_ENOMEM. */
int frame_reader_feed(struct frame_reader *r, const void *data, size_t len);

/* Extracts the next whole frame into `out` (which must have been set up with
 * msgpack_unpacked_init; its previous content is destroyed first — the
 * caller destroys the last one). Returns 1 with a frame, 0 when more bytes
 * are needed, or a FRAME_E* code (sticky). `*frame_bytes`, when not NULL,
 * receives the frame's encoded size on success. */
int frame_reader_next(struct frame_reader *r, msgpack_unpacked *out, size_t *frame_bytes);

/* Bytes buffered but not yet returned as frames. */
size_t frame_reader_pending(const struct frame_reader *r);

/* Gives back a buffer that grew past `keep_bytes` (for a large frame) once
 * nothing is pending, so a reader does not hold its largest frame's size
 * for ever. Objects of earlier frames stay valid (they hold a reference).
 * Returns 0 (also when there was nothing to do) or FRAME_ENOMEM: the reader
 * is then failed (every later call returns FRAME_ENOMEM) but still safe to
 * fini. */
int frame_reader_trim(struct frame_reader *r, size_t keep_bytes);

/* A short static description of a FRAME_E* code. */
const char *frame_strerror(int err);

#endif /* POLYGW_FRAME_H */
