/* test_evstream.c — the AWS event-stream decoder against the framing's rules
 * and against published vectors.
 *
 * Every message is built with real CRCs (zlib's crc32, as AWS computes
 * them), so a test that expects a failure fails for the reason it names.
 * Streams are fed whole, byte by byte, split in two at every point and in
 * three at every pair of points: each way must give the same transcript of
 * messages, return code and idleness. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "evstream.h"
#include "suites.h"

/* Plain comparisons with ck_abort_msg only on a mismatch: every passing
 * ck_assert records a checkpoint through Check's pipe, which would dominate
 * the run time of thousands of splits. */
#define EXPECT(cond, ...)              \
    do {                               \
        if (!(cond))                   \
            ck_abort_msg(__VA_ARGS__); \
    } while (0)

/* A growable byte string: built messages and recorded transcripts. */
struct bytes {
    uint8_t *p;
    size_t len, cap;
};

static void put(struct bytes *b, const void *s, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = (b->len + n) * 2 + 64;
        uint8_t *np = realloc(b->p, cap);

        if (np == NULL)
            ck_abort_msg("out of memory");
        b->p = np;
        b->cap = cap;
    }
    if (n > 0)
        memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void put_u8(struct bytes *b, unsigned v)
{
    uint8_t c = (uint8_t)v;

    put(b, &c, 1);
}

static void put_u16(struct bytes *b, unsigned v)
{
    put_u8(b, v >> 8);
    put_u8(b, v);
}

static void put_u32(struct bytes *b, uint32_t v)
{
    put_u16(b, v >> 16);
    put_u16(b, v & 0xffff);
}

static uint32_t crc(const uint8_t *p, size_t n)
{
    return (uint32_t)crc32(crc32(0L, Z_NULL, 0), p, (uInt)n);
}

/* A message around an arbitrary header block, with the stated lengths (so
 * they can lie) and correct CRCs over whatever they state. */
static void put_raw(struct bytes *b, uint32_t total, uint32_t hlen, const struct bytes *hdr,
                    const void *payload, size_t plen)
{
    size_t start = b->len;

    put_u32(b, total);
    put_u32(b, hlen);
    put_u32(b, crc(b->p + start, 8));
    put(b, hdr->p, hdr->len);
    put(b, payload, plen);
    put_u32(b, crc(b->p + start, b->len - start));
}

/* A well-formed message around a header block. */
static void put_msg(struct bytes *b, const struct bytes *hdr, const char *payload)
{
    size_t plen = strlen(payload);

    put_raw(b, (uint32_t)(16 + hdr->len + plen), (uint32_t)hdr->len, hdr, payload, plen);
}

static void hdr_name(struct bytes *h, const char *name, unsigned type)
{
    put_u8(h, strlen(name));
    put(h, name, strlen(name));
    put_u8(h, type);
}

static void hdr_str(struct bytes *h, const char *name, const char *value)
{
    hdr_name(h, name, 7);
    put_u16(h, strlen(value));
    put(h, value, strlen(value));
}

/* One message through evstream_encode, appended to b. */
static void put_encoded(struct bytes *b, const char *const *names, const char *const *values,
                        size_t n, const char *payload)
{
    uint8_t *out;
    size_t out_len;

    ck_assert_int_eq(evstream_encode(names, values, n, payload, strlen(payload), &out, &out_len),
                     0);
    put(b, out, out_len);
    free(out);
}

/* The recorder: every message as a line of its fields ("-" for an absent
 * header, distinct from an empty one) and its payload. */
struct rec {
    struct bytes t;
    size_t n;
    size_t abort_after; /* return abort_rc for message #abort_after (1-based); 0: never */
    int abort_rc;
};

static void rec_str(struct rec *r, const struct evstream_str *s)
{
    char len[32];

    if (s->p == NULL) {
        put(&r->t, "-|", 2);
        return;
    }
    snprintf(len, sizeof(len), "%zu:", s->len);
    put(&r->t, len, strlen(len));
    put(&r->t, s->p, s->len);
    put(&r->t, "|", 1);
}

static int rec_cb(const struct evstream_msg *m, void *ud)
{
    struct rec *r = ud;
    struct evstream_str payload = { (const char *)m->payload, m->payload_len };

    EXPECT(m->payload != NULL && m->payload[m->payload_len] == '\0', "payload not NUL-terminated");
    rec_str(r, &m->message_type);
    rec_str(r, &m->event_type);
    rec_str(r, &m->exception_type);
    rec_str(r, &m->error_code);
    rec_str(r, &m->error_message);
    rec_str(r, &m->content_type);
    rec_str(r, &payload);
    put(&r->t, "\n", 1);
    r->n++;
    return r->abort_after != 0 && r->n == r->abort_after ? r->abort_rc : 0;
}

/* The transcript ends with the return code, idleness and bytes held. */
static void rec_end(struct rec *r, const struct evstream *d, int rc)
{
    char end[64];

    snprintf(end, sizeof(end), "rc=%d idle=%d held=%zu", rc, evstream_is_idle(d),
             evstream_buffered(d));
    put(&r->t, end, strlen(end));
    put(&r->t, "", 1); /* NUL, to print it */
}

/* Feeds s cut at the sorted points cuts[0..ncuts), stopping at the first
 * non-zero return; then one more empty feed must return the sticky code. */
static void feed_cuts(struct rec *r, size_t max, const uint8_t *s, size_t len, const size_t *cuts,
                      size_t ncuts)
{
    struct evstream d;
    size_t from = 0;
    int rc = 0, again;

    ck_assert_int_eq(evstream_init(&d, max), 0);
    for (size_t i = 0; i <= ncuts && rc == 0; i++) {
        size_t to = i < ncuts ? cuts[i] : len;

        rc = evstream_feed(&d, s + from, to - from, rec_cb, r);
        from = to;
    }
    again = evstream_feed(&d, NULL, 0, rec_cb, r);
    EXPECT(again == (rc > 0 ? EVSTREAM_EABORTED : rc), "after rc %d an empty feed gave %d", rc,
           again);
    rec_end(r, &d, rc);
    evstream_fini(&d);
}

static void feed_bytes(struct rec *r, size_t max, const uint8_t *s, size_t len)
{
    struct evstream d;
    int rc = 0;

    ck_assert_int_eq(evstream_init(&d, max), 0);
    for (size_t i = 0; i < len && rc == 0; i++)
        rc = evstream_feed(&d, s + i, 1, rec_cb, r);
    rec_end(r, &d, rc);
    evstream_fini(&d);
}

static void same(const struct rec *a, const struct rec *b, const char *how)
{
    EXPECT(a->t.len == b->t.len && memcmp(a->t.p, b->t.p, a->t.len) == 0,
           "%s differs:\n%s\nvs whole:\n%s", how, (const char *)b->t.p, (const char *)a->t.p);
}

/* Decodes s whole, byte by byte, split once at every point and (when
 * pairs) twice at every pair of points; returns the whole-feed transcript
 * (the caller frees it) after checking that every other way matches. */
static struct rec decode_all_ways(size_t max, const uint8_t *s, size_t len, bool pairs)
{
    struct rec whole = { 0 }, r = { 0 };

    feed_cuts(&whole, max, s, len, NULL, 0);
    feed_bytes(&r, max, s, len);
    same(&whole, &r, "byte by byte");
    for (size_t i = 1; i < len; i++) {
        r.t.len = 0;
        r.n = 0;
        feed_cuts(&r, max, s, len, &i, 1);
        same(&whole, &r, "split in two");
        for (size_t j = i + 1; pairs && j < len; j++) {
            size_t cuts[2] = { i, j };

            r.t.len = 0;
            r.n = 0;
            feed_cuts(&r, max, s, len, cuts, 2);
            same(&whole, &r, "split in three");
        }
    }
    free(r.t.p);
    return whole;
}

static void expect_transcript(const struct bytes *s, size_t max, bool pairs, const char *want)
{
    struct rec got = decode_all_ways(max, s->p, s->len, pairs);

    ck_assert_str_eq((const char *)got.t.p, want);
    free(got.t.p);
}

/* The fields of a transcript line, in struct evstream_msg order. */
#define NONE "-|"

/* Published vectors: awslabs/aws-c-event-stream, tests/message_deserializer_test.c
 * and tests/message_streaming_decoder_test.c (Apache-2.0), each with the
 * prelude and message CRCs those tests assert. */
static const uint8_t aws_no_op[] = { 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00,
                                     0x05, 0xc2, 0x48, 0xeb, 0x7d, 0x98, 0xc8, 0xff };
static const uint8_t aws_no_headers[] = { 0x00, 0x00, 0x00, 0x1D, 0x00, 0x00, 0x00, 0x00,
                                          0xfd, 0x52, 0x8c, 0x5a, 0x7b, 0x27, 0x66, 0x6f,
                                          0x6f, 0x27, 0x3a, 0x27, 0x62, 0x61, 0x72, 0x27,
                                          0x7d, 0xc3, 0x65, 0x39, 0x36 };
static const uint8_t aws_one_string_header[] = {
    0x00, 0x00, 0x00, 0x3D, 0x00, 0x00, 0x00, 0x20, 0x07, 0xFD, 0x83, 0x96, 0x0C, 'c',  'o',  'n',
    't',  'e',  'n',  't',  '-',  't',  'y',  'p',  'e',  0x07, 0x00, 0x10, 'a',  'p',  'p',  'l',
    'i',  'c',  'a',  't',  'i',  'o',  'n',  '/',  'j',  's',  'o',  'n',  0x7b, 0x27, 0x66, 0x6f,
    0x6f, 0x27, 0x3a, 0x27, 0x62, 0x61, 0x72, 0x27, 0x7d, 0x8D, 0x9C, 0x08, 0xB1
};
static const uint8_t aws_int32_header[] = { 0x00, 0x00, 0x00, 0x1b, 0x00, 0x00, 0x00, 0x0b, 0xe5,
                                            0xc0, 0xa0, 0x72, 0x05, 'e',  'v',  'e',  'n',  't',
                                            0x04, 0x00, 0x00, 0x00, 0x20, 0x04, 0xa1, 0xd4, 0x7c };
static const uint8_t aws_empty_bytes_and_string[] = { 0x00, 0x00, 0x00, 0x22, 0x00, 0x00, 0x00,
                                                      0x12, 0x2D, 0x9A, 0xD2, 0x45, 0x04, 'b',
                                                      'u',  'f',  'f',  0x06, 0x00, 0x00, 0x06,
                                                      's',  't',  'r',  'i',  'n',  'g',  0x07,
                                                      0x00, 0x00, 0xC8, 0x4C, 0xF8, 0x53 };
static const uint8_t aws_bool_header[] = { 0x00, 0x00, 0x00, 0x17, 0x00, 0x00, 0x00, 0x07,
                                           0x29, 0x86, 0x01, 0x58, 0x05, 'e',  'v',  'e',
                                           'n',  't',  0x00, 0x4b, 0x4d, 0x2b, 0xe7 };

static void expect_vector(const uint8_t *v, size_t len, const char *want)
{
    struct bytes b = { 0 };

    put(&b, v, len);
    expect_transcript(&b, 1024, true, want);
    free(b.p);
}

START_TEST(test_evstream__aws_vectors_decode)
{
    /* None of these headers is one of the six delivered (no colon). */
    expect_vector(aws_no_op, sizeof(aws_no_op),
                  NONE NONE NONE NONE NONE NONE "0:|\nrc=0 idle=1 held=0");
    expect_vector(aws_no_headers, sizeof(aws_no_headers),
                  NONE NONE NONE NONE NONE NONE "13:{'foo':'bar'}|\nrc=0 idle=1 held=0");
    expect_vector(aws_one_string_header, sizeof(aws_one_string_header),
                  NONE NONE NONE NONE NONE NONE "13:{'foo':'bar'}|\nrc=0 idle=1 held=0");
    expect_vector(aws_int32_header, sizeof(aws_int32_header),
                  NONE NONE NONE NONE NONE NONE "0:|\nrc=0 idle=1 held=0");
    expect_vector(aws_empty_bytes_and_string, sizeof(aws_empty_bytes_and_string),
                  NONE NONE NONE NONE NONE NONE "0:|\nrc=0 idle=1 held=0");
    expect_vector(aws_bool_header, sizeof(aws_bool_header),
                  NONE NONE NONE NONE NONE NONE "0:|\nrc=0 idle=1 held=0");
}
END_TEST

/* The encoder writes the same bytes, CRCs included, as the published
 * vectors with string headers only. */
START_TEST(test_evstream__aws_vectors_encode)
{
    static const char *const names[] = { "content-type" };
    static const char *const values[] = { "application/json" };
    struct bytes b = { 0 };

    put_encoded(&b, NULL, NULL, 0, "");
    ck_assert_uint_eq(b.len, sizeof(aws_no_op));
    ck_assert_mem_eq(b.p, aws_no_op, b.len);
    b.len = 0;
    put_encoded(&b, NULL, NULL, 0, "{'foo':'bar'}");
    ck_assert_uint_eq(b.len, sizeof(aws_no_headers));
    ck_assert_mem_eq(b.p, aws_no_headers, b.len);
    b.len = 0;
    put_encoded(&b, names, values, 1, "{'foo':'bar'}");
    ck_assert_uint_eq(b.len, sizeof(aws_one_string_header));
    ck_assert_mem_eq(b.p, aws_one_string_header, b.len);
    free(b.p);
}
END_TEST

START_TEST(test_evstream__event_message)
{
    /* What Bedrock's InvokeModelWithResponseStream sends per chunk. */
    static const char *const names[] = { ":event-type", ":content-type", ":message-type" };
    static const char *const values[] = { "chunk", "application/json", "event" };
    struct bytes b = { 0 };

    put_encoded(&b, names, values, 3, "{\"bytes\":\"eyJ0eXBlIjoibWVzc2FnZSJ9\"}");
    expect_transcript(&b, 1024, false,
                      "5:event|5:chunk|" NONE NONE NONE "16:application/json|"
                      "36:{\"bytes\":\"eyJ0eXBlIjoibWVzc2FnZSJ9\"}|\nrc=0 idle=1 held=0");
    free(b.p);
}
END_TEST

START_TEST(test_evstream__exception_and_error_messages)
{
    static const char *const xn[] = { ":exception-type", ":content-type", ":message-type" };
    static const char *const xv[] = { "throttlingException", "application/json", "exception" };
    static const char *const en[] = { ":message-type", ":error-code", ":error-message" };
    static const char *const ev[] = { "error", "InternalFailure", "try again" };
    struct bytes b = { 0 };

    put_encoded(&b, xn, xv, 3, "{\"message\":\"Too many requests\"}");
    put_encoded(&b, en, ev, 3, "");
    expect_transcript(&b, 1024, false,
                      "9:exception|" NONE "19:throttlingException|" NONE NONE
                      "16:application/json|31:{\"message\":\"Too many requests\"}|\n"
                      "5:error|" NONE NONE "15:InternalFailure|9:try again|" NONE "0:|\n"
                      "rc=0 idle=1 held=0");
    free(b.p);
}
END_TEST

/* Every header type 0..9 is read past by its own size; one of the six names
 * with a non-string type is skipped, and a repeated string header's last
 * value wins. */
START_TEST(test_evstream__every_header_type)
{
    struct bytes h = { 0 }, b = { 0 };

    hdr_name(&h, "t", 0);
    hdr_name(&h, "f", 1);
    hdr_name(&h, "byte", 2);
    put_u8(&h, 0xff);
    hdr_name(&h, "short", 3);
    put_u16(&h, 0x7fff);
    hdr_name(&h, ":content-type", 4); /* an integer: not a content type */
    put_u32(&h, 42);
    hdr_name(&h, "long", 5);
    put_u32(&h, 1);
    put_u32(&h, 2);
    hdr_name(&h, ":error-code", 6); /* bytes, not a string: skipped */
    put_u16(&h, 3);
    put(&h, "\x00\x07\xff", 3);
    hdr_str(&h, ":event-type", "first");
    hdr_name(&h, ":date", 8);
    put_u32(&h, 0x0000018c);
    put_u32(&h, 0x12345678);
    hdr_name(&h, "uuid", 9);
    put(&h, "0123456789abcdef", 16);
    hdr_str(&h, ":event-type", "contentBlockDelta");
    hdr_str(&h, ":message-type", "event");
    hdr_str(&h, "empty", "");
    put_msg(&b, &h, "{\"delta\":{\"text\":\"hi\"}}");
    expect_transcript(&b, 1024, false,
                      "5:event|17:contentBlockDelta|" NONE NONE NONE NONE
                      "23:{\"delta\":{\"text\":\"hi\"}}|\nrc=0 idle=1 held=0");
    free(h.p);
    free(b.p);
}
END_TEST

/* A payload may hold any bytes, NUL included; its length is the frame's. */
START_TEST(test_evstream__binary_payload)
{
    struct bytes h = { 0 }, b = { 0 };
    struct rec r = { 0 };
    uint8_t payload[300];

    for (size_t i = 0; i < sizeof(payload); i++)
        payload[i] = (uint8_t)i;
    put_raw(&b, 16 + sizeof(payload), 0, &h, payload, sizeof(payload));
    feed_cuts(&r, 1024, b.p, b.len, NULL, 0);
    ck_assert_uint_eq(r.n, 1);
    ck_assert_mem_eq(r.t.p + 6 * 2, "300:", 4);
    ck_assert_mem_eq(r.t.p + 6 * 2 + 4, payload, sizeof(payload));
    free(r.t.p);
    free(b.p);
}
END_TEST

/* Three messages of different shapes, every split point, and every pair of
 * split points of the first two. */
START_TEST(test_evstream__split_anywhere)
{
    static const char *const n1[] = { ":message-type", ":event-type" };
    static const char *const v1[] = { "event", "messageStart" };
    static const char *const n2[] = { ":message-type", ":exception-type" };
    static const char *const v2[] = { "exception", "validationException" };
    struct bytes b = { 0 };
    struct rec two;
    size_t first_two;
    const char *want2 = "5:event|12:messageStart|" NONE NONE NONE NONE
                        "20:{\"role\":\"assistant\"}|\n" NONE NONE NONE NONE NONE NONE "0:|\n";

    put_encoded(&b, n1, v1, 2, "{\"role\":\"assistant\"}");
    put(&b, aws_no_op, sizeof(aws_no_op));
    first_two = b.len;
    put_encoded(&b, n2, v2, 2, "bad input");
    two = decode_all_ways(1024, b.p, first_two, true);
    ck_assert_uint_eq(two.n, 2);
    ck_assert_str_eq((const char *)two.t.p,
                     "5:event|12:messageStart|" NONE NONE NONE NONE
                     "20:{\"role\":\"assistant\"}|\n" NONE NONE NONE NONE NONE NONE
                     "0:|\nrc=0 idle=1 held=0");
    free(two.t.p);
    two = decode_all_ways(1024, b.p, b.len, false);
    ck_assert_uint_eq(two.n, 3);
    ck_assert_mem_eq(two.t.p, want2, strlen(want2));
    ck_assert_str_eq((const char *)two.t.p + strlen(want2),
                     "9:exception|" NONE "19:validationException|" NONE NONE NONE
                     "9:bad input|\nrc=0 idle=1 held=0");
    free(two.t.p);
    free(b.p);
}
END_TEST

/* A long stream in random chunks gives what the whole stream gives. */
START_TEST(test_evstream__random_chunks_long_stream)
{
    enum { NMSG = 200 };
    static const char *const names[] = { ":message-type", ":event-type" };
    static const char *const values[] = { "event", "chunk" };
    struct bytes b = { 0 };
    struct rec whole = { 0 }, chunked = { 0 };
    struct evstream d;
    uint32_t seed = 12345;
    char payload[2048];

    for (int i = 0; i < NMSG; i++) {
        size_t n = (size_t)(i * 37) % (sizeof(payload) - 1);

        memset(payload, 'a' + i % 26, n);
        payload[n] = '\0';
        put_encoded(&b, names, values, 2, payload);
    }
    feed_cuts(&whole, 4096, b.p, b.len, NULL, 0);
    ck_assert_uint_eq(whole.n, NMSG);
    ck_assert_int_eq(evstream_init(&d, 4096), 0);
    for (size_t off = 0; off < b.len;) {
        size_t n;

        seed = seed * 1103515245u + 12345u;
        n = 1 + (seed >> 16) % 700;
        if (n > b.len - off)
            n = b.len - off;
        ck_assert_int_eq(evstream_feed(&d, b.p + off, n, rec_cb, &chunked), 0);
        off += n;
    }
    rec_end(&chunked, &d, 0);
    evstream_fini(&d);
    same(&whole, &chunked, "random chunks");
    free(whole.t.p);
    free(chunked.t.p);
    free(b.p);
}
END_TEST

/* Feeds s whole to a fresh decoder; checks rc, the messages delivered
 * before it, that the code sticks, and the bytes still held. */
static void expect_fail(const struct bytes *s, size_t max, int want_rc, size_t want_msgs)
{
    struct rec r = { 0 };
    struct evstream d;
    int rc;

    ck_assert_int_eq(evstream_init(&d, max), 0);
    rc = evstream_feed(&d, s->p, s->len, rec_cb, &r);
    ck_assert_int_eq(rc, want_rc);
    ck_assert_uint_eq(r.n, want_msgs);
    /* Sticky: a valid message afterwards changes nothing. */
    ck_assert_int_eq(evstream_feed(&d, aws_no_op, sizeof(aws_no_op), rec_cb, &r), want_rc);
    ck_assert_uint_eq(r.n, want_msgs);
    evstream_fini(&d);
    free(r.t.p);
    /* The same whatever the split. */
    free(decode_all_ways(max, s->p, s->len, false).t.p);
}

START_TEST(test_evstream__prelude_crc_mismatch)
{
    struct bytes b = { 0 };

    put(&b, aws_no_headers, sizeof(aws_no_headers));
    b.p[11] ^= 0x01; /* the prelude CRC itself */
    expect_fail(&b, 1024, EVSTREAM_ECRC, 0);
    b.len = 0;
    put(&b, aws_no_op, sizeof(aws_no_op));
    put(&b, aws_no_headers, sizeof(aws_no_headers));
    b.p[16 + 3] ^= 0x40; /* the second message's total_len: a damaged length */
    expect_fail(&b, 1 << 20, EVSTREAM_ECRC, 1);
    free(b.p);
}
END_TEST

START_TEST(test_evstream__message_crc_mismatch)
{
    struct bytes b = { 0 };

    put(&b, aws_no_op, sizeof(aws_no_op));
    put(&b, aws_one_string_header, sizeof(aws_one_string_header));
    b.p[16 + 50] ^= 0x20; /* a payload byte */
    expect_fail(&b, 1024, EVSTREAM_ECRC, 1);
    b.len = 0;
    put(&b, aws_one_string_header, sizeof(aws_one_string_header));
    b.p[20] ^= 0x01; /* a header name byte */
    expect_fail(&b, 1024, EVSTREAM_ECRC, 0);
    b.len = 0;
    put(&b, aws_no_op, sizeof(aws_no_op));
    b.p[15] ^= 0x80; /* the message CRC itself */
    expect_fail(&b, 1024, EVSTREAM_ECRC, 0);
    free(b.p);
}
END_TEST

/* Lengths that cannot be true fail once the 12-byte prelude is in: nothing
 * after it is needed, nor buffered. */
static void expect_prelude_fail(uint32_t total, uint32_t hlen, size_t max, int want)
{
    struct bytes h = { 0 }, b = { 0 };
    struct evstream d;
    struct rec r = { 0 };

    put_raw(&b, total, hlen, &h, NULL, 0);
    ck_assert_int_eq(evstream_init(&d, max), 0);
    ck_assert_int_eq(evstream_feed(&d, b.p, 11, rec_cb, &r), 0);
    ck_assert_uint_eq(evstream_buffered(&d), 11);
    ck_assert_int_eq(evstream_feed(&d, b.p + 11, 1, rec_cb, &r), want);
    ck_assert_uint_le(evstream_buffered(&d), 12);
    ck_assert_uint_le(d.cap, 12);
    ck_assert_int_eq(evstream_feed(&d, b.p + 12, b.len - 12, rec_cb, &r), want);
    ck_assert_uint_eq(r.n, 0);
    evstream_fini(&d);
    free(b.p);
}

START_TEST(test_evstream__impossible_lengths)
{
    expect_prelude_fail(0, 0, 1024, EVSTREAM_EMALFORMED);
    expect_prelude_fail(15, 0, 1024, EVSTREAM_EMALFORMED);
    expect_prelude_fail(16, 1, 1024, EVSTREAM_EMALFORMED);
    expect_prelude_fail(100, 85, 1024, EVSTREAM_EMALFORMED);
    expect_prelude_fail(UINT32_MAX, UINT32_MAX, 1024, EVSTREAM_EMALFORMED);
    /* Impossible beats too large: the lengths are not believed at all. */
    expect_prelude_fail(5000, 4990, 1024, EVSTREAM_EMALFORMED);
}
END_TEST

START_TEST(test_evstream__too_large_from_the_prelude)
{
    struct bytes h = { 0 }, b = { 0 };
    struct rec r = { 0 };
    char payload[64];

    expect_prelude_fail(65, 0, 64, EVSTREAM_ETOO_LARGE);
    expect_prelude_fail(UINT32_MAX, 0, 1 << 20, EVSTREAM_ETOO_LARGE);
    /* Exactly max_message_bytes is accepted, one more refused. */
    memset(payload, 'x', 48);
    payload[48] = '\0';
    put_msg(&b, &h, payload);
    ck_assert_uint_eq(b.len, 64);
    feed_cuts(&r, 64, b.p, b.len, NULL, 0);
    ck_assert_uint_eq(r.n, 1);
    b.len = 0;
    payload[48] = 'x';
    payload[49] = '\0';
    put_msg(&b, &h, payload);
    expect_fail(&b, 64, EVSTREAM_ETOO_LARGE, 0);
    free(r.t.p);
    free(b.p);
}
END_TEST

/* A header block must parse to exactly its stated length. */
static void expect_bad_headers(const struct bytes *h)
{
    struct bytes b = { 0 };

    put_msg(&b, h, "{}");
    expect_fail(&b, 1024, EVSTREAM_EMALFORMED, 0);
    free(b.p);
}

START_TEST(test_evstream__header_past_its_block)
{
    struct bytes h = { 0 };

    put_u8(&h, 10); /* a name longer than the block */
    put(&h, "abc", 3);
    expect_bad_headers(&h);
    h.len = 0;
    put_u8(&h, 3); /* a name, then no type byte */
    put(&h, "abc", 3);
    expect_bad_headers(&h);
    h.len = 0;
    hdr_name(&h, "s", 7); /* a string's length cut in half */
    put_u8(&h, 0);
    expect_bad_headers(&h);
    h.len = 0;
    hdr_name(&h, "s", 7); /* a string longer than the block */
    put_u16(&h, 5);
    put(&h, "abcd", 4);
    expect_bad_headers(&h);
    h.len = 0;
    hdr_name(&h, "b", 6); /* a byte array longer than the block */
    put_u16(&h, 0xffff);
    expect_bad_headers(&h);
    for (unsigned type = 2; type <= 9; type++) {
        static const size_t size[] = { 0, 0, 1, 2, 4, 8, 2, 2, 8, 16 };

        h.len = 0;
        hdr_str(&h, ":message-type", "event");
        hdr_name(&h, "v", type); /* one byte short of its value */
        for (size_t i = 0; i + 1 < size[type]; i++)
            put_u8(&h, 0);
        expect_bad_headers(&h);
    }
    free(h.p);
}
END_TEST

START_TEST(test_evstream__unknown_header_type)
{
    struct bytes h = { 0 };
    static const unsigned types[] = { 10, 11, 128, 255 };

    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        h.len = 0;
        hdr_str(&h, ":message-type", "event");
        hdr_name(&h, "x", types[i]);
        put_u32(&h, 0);
        expect_bad_headers(&h);
    }
    h.len = 0;
    hdr_name(&h, "x", 10);
    expect_bad_headers(&h);
    free(h.p);
}
END_TEST

START_TEST(test_evstream__zero_length_name)
{
    struct bytes h = { 0 };

    hdr_str(&h, ":message-type", "event");
    put_u8(&h, 0); /* name_len 0, then a valid bool */
    put_u8(&h, 0);
    expect_bad_headers(&h);
    free(h.p);
}
END_TEST

START_TEST(test_evstream__callback_abort)
{
    struct bytes b = { 0 };
    struct rec r = { .abort_after = 2, .abort_rc = 7 };
    struct evstream d;

    for (int i = 0; i < 3; i++)
        put(&b, aws_no_headers, sizeof(aws_no_headers));
    ck_assert_int_eq(evstream_init(&d, 1024), 0);
    ck_assert_int_eq(evstream_feed(&d, b.p, b.len, rec_cb, &r), 7);
    ck_assert_uint_eq(r.n, 2);
    ck_assert_int_eq(evstream_feed(&d, b.p, b.len, rec_cb, &r), EVSTREAM_EABORTED);
    ck_assert_uint_eq(r.n, 2);
    evstream_fini(&d);
    /* A callback's negative value is returned as it is, and aborts too. */
    r.n = 0;
    r.abort_after = 1;
    r.abort_rc = EVSTREAM_ECRC;
    ck_assert_int_eq(evstream_init(&d, 1024), 0);
    ck_assert_int_eq(evstream_feed(&d, b.p, b.len, rec_cb, &r), EVSTREAM_ECRC);
    ck_assert_int_eq(evstream_feed(&d, NULL, 0, rec_cb, &r), EVSTREAM_EABORTED);
    ck_assert_uint_eq(r.n, 1);
    evstream_fini(&d);
    free(r.t.p);
    free(b.p);
}
END_TEST

START_TEST(test_evstream__null_callback_drops_messages)
{
    struct evstream d;

    ck_assert_int_eq(evstream_init(&d, 1024), 0);
    ck_assert_int_eq(evstream_feed(&d, aws_no_headers, sizeof(aws_no_headers), NULL, NULL), 0);
    ck_assert(evstream_is_idle(&d));
    evstream_fini(&d);
}
END_TEST

START_TEST(test_evstream__idle_and_buffered)
{
    struct bytes b = { 0 };
    struct evstream d;
    struct rec r = { 0 };

    put(&b, aws_one_string_header, sizeof(aws_one_string_header));
    put(&b, aws_no_op, sizeof(aws_no_op));
    ck_assert_int_eq(evstream_init(&d, 1024), 0);
    ck_assert(evstream_is_idle(&d));
    ck_assert_uint_eq(evstream_buffered(&d), 0);
    for (size_t i = 0; i < b.len; i++) {
        ck_assert_int_eq(evstream_feed(&d, b.p + i, 1, rec_cb, &r), 0);
        if (i + 1 == sizeof(aws_one_string_header) || i + 1 == b.len) {
            ck_assert(evstream_is_idle(&d));
            ck_assert_uint_eq(evstream_buffered(&d), 0);
        } else {
            size_t into =
                i < sizeof(aws_one_string_header) ? i + 1 : i + 1 - sizeof(aws_one_string_header);

            ck_assert(!evstream_is_idle(&d));
            ck_assert_uint_eq(evstream_buffered(&d), into);
        }
    }
    ck_assert_uint_eq(r.n, 2);
    evstream_fini(&d);
    free(r.t.p);
    free(b.p);
}
END_TEST

/* The buffer grows with the bytes that arrived, not with the length the
 * prelude announced, and a large one is given back after its message. */
START_TEST(test_evstream__memory_follows_the_bytes)
{
    enum { BIG = 200 * 1024 };
    struct bytes h = { 0 }, b = { 0 };
    struct evstream d;
    struct rec r = { 0 };
    char *payload = malloc(BIG + 1);
    size_t off = 0;

    ck_assert_ptr_nonnull(payload);
    memset(payload, 'p', BIG);
    payload[BIG] = '\0';
    put_msg(&b, &h, payload);
    ck_assert_int_eq(evstream_init(&d, 1 << 20), 0);
    while (off < b.len) {
        size_t n = b.len - off < 1000 ? b.len - off : 1000;

        ck_assert_int_eq(evstream_feed(&d, b.p + off, n, rec_cb, &r), 0);
        off += n;
        if (off < b.len) {
            ck_assert_uint_le(d.cap, 2 * off + 256);
            ck_assert_uint_le(d.cap, b.len);
        }
    }
    ck_assert_uint_eq(r.n, 1);
    ck_assert_uint_eq(d.cap, 0);
    ck_assert(evstream_is_idle(&d));
    evstream_fini(&d);
    free(payload);
    free(r.t.p);
    free(b.p);
}
END_TEST

START_TEST(test_evstream__init_rejects_small_limit)
{
    struct evstream d;
    struct rec r = { 0 };

    ck_assert_int_eq(evstream_init(&d, 15), EVSTREAM_EINVAL);
    ck_assert_int_eq(evstream_feed(&d, aws_no_op, sizeof(aws_no_op), rec_cb, &r), EVSTREAM_EINVAL);
    evstream_fini(&d);
    ck_assert_int_eq(evstream_init(&d, 0), EVSTREAM_EINVAL);
    evstream_fini(&d);
    /* 16 holds the smallest message there is. */
    ck_assert_int_eq(evstream_init(&d, 16), 0);
    ck_assert_int_eq(evstream_feed(&d, aws_no_op, sizeof(aws_no_op), rec_cb, &r), 0);
    ck_assert_uint_eq(r.n, 1);
    evstream_fini(&d);
    free(r.t.p);
}
END_TEST

START_TEST(test_evstream__encode_rejects)
{
    static const char *const empty_name[] = { "" };
    static const char *const ok_value[] = { "v" };
    const char *long_name[1], *long_value[1];
    static const char *const ok_name[] = { "n" };
    char *name = malloc(257), *value = malloc(65537);
    uint8_t *out = (uint8_t *)"x";
    size_t out_len = 1;

    ck_assert_ptr_nonnull(name);
    ck_assert_ptr_nonnull(value);
    ck_assert_int_eq(evstream_encode(empty_name, ok_value, 1, "", 0, &out, &out_len),
                     EVSTREAM_EINVAL);
    ck_assert_ptr_null(out);
    ck_assert_uint_eq(out_len, 0);
    memset(name, 'n', 256);
    name[256] = '\0';
    long_name[0] = name;
    ck_assert_int_eq(evstream_encode(long_name, ok_value, 1, "", 0, &out, &out_len),
                     EVSTREAM_EINVAL);
    name[255] = '\0'; /* 255 is the most a name may have */
    ck_assert_int_eq(evstream_encode(long_name, ok_value, 1, "", 0, &out, &out_len), 0);
    free(out);
    memset(value, 'v', 65536);
    value[65536] = '\0';
    long_value[0] = value;
    ck_assert_int_eq(evstream_encode(ok_name, long_value, 1, "", 0, &out, &out_len),
                     EVSTREAM_EINVAL);
    value[65535] = '\0';
    ck_assert_int_eq(evstream_encode(ok_name, long_value, 1, "", 0, &out, &out_len), 0);
    ck_assert_uint_eq(out_len, 16 + 1 + 1 + 1 + 2 + 65535);
    free(out);
    free(name);
    free(value);
}
END_TEST

Suite *evstream_suite(void)
{
    Suite *s = suite_create("evstream");
    TCase *tc = tcase_create("core");

    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_evstream__aws_vectors_decode);
    tcase_add_test(tc, test_evstream__aws_vectors_encode);
    tcase_add_test(tc, test_evstream__event_message);
    tcase_add_test(tc, test_evstream__exception_and_error_messages);
    tcase_add_test(tc, test_evstream__every_header_type);
    tcase_add_test(tc, test_evstream__binary_payload);
    tcase_add_test(tc, test_evstream__split_anywhere);
    tcase_add_test(tc, test_evstream__random_chunks_long_stream);
    tcase_add_test(tc, test_evstream__prelude_crc_mismatch);
    tcase_add_test(tc, test_evstream__message_crc_mismatch);
    tcase_add_test(tc, test_evstream__impossible_lengths);
    tcase_add_test(tc, test_evstream__too_large_from_the_prelude);
    tcase_add_test(tc, test_evstream__header_past_its_block);
    tcase_add_test(tc, test_evstream__unknown_header_type);
    tcase_add_test(tc, test_evstream__zero_length_name);
    tcase_add_test(tc, test_evstream__callback_abort);
    tcase_add_test(tc, test_evstream__null_callback_drops_messages);
    tcase_add_test(tc, test_evstream__idle_and_buffered);
    tcase_add_test(tc, test_evstream__memory_follows_the_bytes);
    tcase_add_test(tc, test_evstream__init_rejects_small_limit);
    tcase_add_test(tc, test_evstream__encode_rejects);
    suite_add_tcase(s, tc);
    return s;
}
