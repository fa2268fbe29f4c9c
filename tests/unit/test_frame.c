/*
 * test_frame.c — the incremental frame reader (proto/frame.c).
 *
 * The reader must give the same answer however the bytes are split, judge
 * over-limit claims from headers alone (before any payload is buffered),
 * count every nesting level, stay failed after an error, and never let
 * msgpack-c see a frame the scanner has not validated.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "suites.h"

#define MIB (1024 * 1024)

/* --- helpers --------------------------------------------------------- */

struct buf {
    msgpack_sbuffer sb;
    msgpack_packer pk;
};

static void buf_init(struct buf *b)
{
    msgpack_sbuffer_init(&b->sb);
    msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
}

static void buf_fini(struct buf *b)
{
    msgpack_sbuffer_destroy(&b->sb);
}

static void pack_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* A handful of valid frames covering every msgpack type and header width. */
enum { N_SAMPLES = 8 };

static void pack_sample(msgpack_packer *pk, int which)
{
    static char big[70000];

    switch (which) {
    case 0: /* [0, 1, "ping", []] */
        msgpack_pack_array(pk, 4);
        msgpack_pack_uint8(pk, 0);
        msgpack_pack_uint32(pk, 1);
        pack_str(pk, "ping");
        msgpack_pack_array(pk, 0);
        break;
    case 1: /* a call with a nested body */
        msgpack_pack_array(pk, 4);
        msgpack_pack_uint8(pk, 0);
        msgpack_pack_uint32(pk, 4000000000u);
        pack_str(pk, "call");
        msgpack_pack_array(pk, 1);
        msgpack_pack_map(pk, 3);
        pack_str(pk, "capability");
        pack_str(pk, "chat");
        pack_str(pk, "stream");
        msgpack_pack_true(pk);
        pack_str(pk, "body");
        msgpack_pack_map(pk, 2);
        pack_str(pk, "messages");
        msgpack_pack_array(pk, 2);
        for (int i = 0; i < 2; i++) {
            msgpack_pack_map(pk, 2);
            pack_str(pk, "role");
            pack_str(pk, i ? "assistant" : "user");
            pack_str(pk, "content");
            pack_str(pk, "héllo 世界 🌍");
        }
        pack_str(pk, "temperature");
        msgpack_pack_float(pk, 0.5f);
        break;
    case 2: /* every integer width and both float widths */
        msgpack_pack_array(pk, 16);
        msgpack_pack_uint64(pk, 0);
        msgpack_pack_uint64(pk, 200);
        msgpack_pack_uint64(pk, 60000);
        msgpack_pack_uint64(pk, 4000000000u);
        msgpack_pack_uint64(pk, UINT64_MAX);
        msgpack_pack_int64(pk, -1);
        msgpack_pack_int64(pk, -100);
        msgpack_pack_int64(pk, -30000);
        msgpack_pack_int64(pk, -2000000000);
        msgpack_pack_int64(pk, INT64_MIN);
        msgpack_pack_float(pk, 1.25f);
        msgpack_pack_double(pk, -0.1);
        msgpack_pack_nil(pk);
        msgpack_pack_true(pk);
        msgpack_pack_false(pk);
        msgpack_pack_array(pk, 0);
        break;
    case 3: /* str8, str16, bin8, bin16 (the payload holds 0xc1 bytes: not headers) */
        memset(big, 0xc1, sizeof(big));
        msgpack_pack_array(pk, 4);
        msgpack_pack_str(pk, 40);
        msgpack_pack_str_body(pk, big, 40);
        msgpack_pack_str(pk, 300);
        msgpack_pack_str_body(pk, big, 300);
        msgpack_pack_bin(pk, 3);
        msgpack_pack_bin_body(pk, big, 3);
        msgpack_pack_bin(pk, 1000);
        msgpack_pack_bin_body(pk, big, 1000);
        break;
    case 4: /* every ext form */
        msgpack_pack_array(pk, 8);
        msgpack_pack_ext(pk, 1, 1);
        msgpack_pack_ext_body(pk, "a", 1);
        msgpack_pack_ext(pk, 2, 2);
        msgpack_pack_ext_body(pk, "ab", 2);
        msgpack_pack_ext(pk, 4, 4);
        msgpack_pack_ext_body(pk, "abcd", 4);
        msgpack_pack_ext(pk, 8, 8);
        msgpack_pack_ext_body(pk, "abcdefgh", 8);
        msgpack_pack_ext(pk, 16, 16);
        msgpack_pack_ext_body(pk, "abcdefghijklmnop", 16);
        msgpack_pack_ext(pk, 3, 3);
        msgpack_pack_ext_body(pk, "abc", 3);
        msgpack_pack_ext(pk, 0, 5);
        msgpack_pack_ext(pk, 300, 6);
        msgpack_pack_ext_body(pk, big, 300);
        break;
    case 5: /* array16 and map16 headers */
        msgpack_pack_map(pk, 20);
        for (int i = 0; i < 20; i++) {
            msgpack_pack_int(pk, i);
            msgpack_pack_array(pk, 17);
            for (int k = 0; k < 17; k++)
                msgpack_pack_int(pk, -k);
        }
        break;
    case 6: /* a lone scalar is a frame too */
        msgpack_pack_uint32(pk, 7);
        break;
    default: /* str32 */
        msgpack_pack_str(pk, sizeof(big));
        msgpack_pack_str_body(pk, big, sizeof(big));
        break;
    }
}

/* Reference decoding of a complete buffer by msgpack-c alone. */
static void reference(const char *data, size_t len, msgpack_unpacked *u)
{
    size_t off = 0;

    msgpack_unpacked_init(u);
    ck_assert_int_eq(msgpack_unpack_next(u, data, len, &off), MSGPACK_UNPACK_SUCCESS);
    ck_assert_uint_eq(off, len);
}

/* Equal objects, bit for bit (msgpack_object_equal says NaN != NaN). */
static bool same_object(msgpack_object a, msgpack_object b)
{
    msgpack_sbuffer sa, sb;
    msgpack_packer pa, pb;

    msgpack_sbuffer_init(&sa);
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pa, &sa, msgpack_sbuffer_write);
    msgpack_packer_init(&pb, &sb, msgpack_sbuffer_write);
    msgpack_pack_object(&pa, a);
    msgpack_pack_object(&pb, b);
    bool same = sa.size == sb.size && memcmp(sa.data, sb.data, sa.size) == 0;
    msgpack_sbuffer_destroy(&sa);
    msgpack_sbuffer_destroy(&sb);
    return same;
}

static int next(struct frame_reader *r, msgpack_unpacked *u, size_t *fb)
{
    return frame_reader_next(r, u, fb);
}

/* Feeds `data` and expects exactly the error `want` from the next call. */
static void expect_error(size_t max_bytes, const void *data, size_t len, int want)
{
    struct frame_reader r;
    msgpack_unpacked u;

    ck_assert_int_eq(frame_reader_init(&r, max_bytes, 0), 0);
    msgpack_unpacked_init(&u);
    ck_assert_int_eq(frame_reader_feed(&r, data, len), 0);
    ck_assert_int_eq(next(&r, &u, NULL), want);
    msgpack_unpacked_destroy(&u);
    frame_reader_fini(&r);
}

/* --- tests ----------------------------------------------------------- */

START_TEST(test_frame__whole_frames)
{
    for (int s = 0; s < N_SAMPLES; s++) {
        struct buf b;
        struct frame_reader r;
        msgpack_unpacked u, ref;
        size_t fb = 0;

        buf_init(&b);
        pack_sample(&b.pk, s);
        reference(b.sb.data, b.sb.size, &ref);
        ck_assert_int_eq(frame_reader_init(&r, MIB, 0), 0);
        msgpack_unpacked_init(&u);
        ck_assert_int_eq(frame_reader_feed(&r, b.sb.data, b.sb.size), 0);
        ck_assert_int_eq(next(&r, &u, &fb), 1);
        ck_assert_uint_eq(fb, b.sb.size);
        ck_assert_msg(same_object(u.data, ref.data), "sample %d differs", s);
        ck_assert_int_eq(next(&r, &u, &fb), 0);
        ck_assert_uint_eq(frame_reader_pending(&r), 0);
        msgpack_unpacked_destroy(&u);
        msgpack_unpacked_destroy(&ref);
        frame_reader_fini(&r);
        buf_fini(&b);
    }
}
END_TEST

/* Every truncation point: the prefix yields nothing (and no error), the
 * rest completes the same frame. */
START_TEST(test_frame__every_truncation_point)
{
    for (int s = 0; s < N_SAMPLES; s++) {
        struct buf b;
        msgpack_unpacked ref;

        buf_init(&b);
        pack_sample(&b.pk, s);
        reference(b.sb.data, b.sb.size, &ref);
        size_t step = b.sb.size > 4096 ? 97 : 1; /* keep the 70 KB sample quick */
        for (size_t k = 0; k < b.sb.size; k += step) {
            struct frame_reader r;
            msgpack_unpacked u;
            size_t fb = 0;

            ck_assert_int_eq(frame_reader_init(&r, MIB, 16), 0);
            msgpack_unpacked_init(&u);
            ck_assert_int_eq(frame_reader_feed(&r, b.sb.data, k), 0);
            ck_assert_msg(next(&r, &u, &fb) == 0, "sample %d cut at %zu", s, k);
            ck_assert_uint_eq(frame_reader_pending(&r), k);
            ck_assert_int_eq(frame_reader_feed(&r, b.sb.data + k, b.sb.size - k), 0);
            ck_assert_msg(next(&r, &u, &fb) == 1, "sample %d cut at %zu", s, k);
            ck_assert_uint_eq(fb, b.sb.size);
            ck_assert(same_object(u.data, ref.data));
            msgpack_unpacked_destroy(&u);
            frame_reader_fini(&r);
        }
        msgpack_unpacked_destroy(&ref);
        buf_fini(&b);
    }
}
END_TEST

START_TEST(test_frame__byte_by_byte)
{
    for (int s = 0; s < N_SAMPLES - 1; s++) {
        struct buf b;
        struct frame_reader r;
        msgpack_unpacked u, ref;
        size_t fb = 0;
        int got = 0;

        buf_init(&b);
        pack_sample(&b.pk, s);
        reference(b.sb.data, b.sb.size, &ref);
        ck_assert_int_eq(frame_reader_init(&r, MIB, 0), 0);
        msgpack_unpacked_init(&u);
        for (size_t i = 0; i < b.sb.size; i++) {
            ck_assert_int_eq(frame_reader_feed(&r, b.sb.data + i, 1), 0);
            int rc = next(&r, &u, &fb);
            ck_assert_int_eq(rc, i + 1 == b.sb.size ? 1 : 0);
            got += rc;
        }
        ck_assert_int_eq(got, 1);
        ck_assert_uint_eq(fb, b.sb.size);
        ck_assert(same_object(u.data, ref.data));
        msgpack_unpacked_destroy(&u);
        msgpack_unpacked_destroy(&ref);
        frame_reader_fini(&r);
        buf_fini(&b);
    }
}
END_TEST

/* 3000 frames in one feed, then again in pieces of a prime size that cut
 * frames everywhere; frame_bytes always adds up. */
START_TEST(test_frame__many_frames_one_feed)
{
    struct buf b;
    size_t sizes[3000], off = 0;

    buf_init(&b);
    for (int i = 0; i < 3000; i++) {
        size_t before = b.sb.size;
        pack_sample(&b.pk, i % (N_SAMPLES - 1));
        sizes[i] = b.sb.size - before;
    }
    for (size_t piece = 0; piece < 2; piece++) {
        struct frame_reader r;
        msgpack_unpacked u;
        size_t fb, total = 0, chunk = piece ? 1009 : b.sb.size;
        int n = 0, rc;

        ck_assert_int_eq(frame_reader_init(&r, MIB, 0), 0);
        msgpack_unpacked_init(&u);
        for (off = 0; off < b.sb.size; off += chunk) {
            size_t len = b.sb.size - off < chunk ? b.sb.size - off : chunk;
            ck_assert_int_eq(frame_reader_feed(&r, b.sb.data + off, len), 0);
            while ((rc = next(&r, &u, &fb)) == 1) {
                ck_assert_uint_eq(fb, sizes[n]);
                ck_assert_int_eq(u.data.type,
                                 n % (N_SAMPLES - 1) == 6       ? MSGPACK_OBJECT_POSITIVE_INTEGER
                                     : n % (N_SAMPLES - 1) == 5 ? MSGPACK_OBJECT_MAP
                                                                : MSGPACK_OBJECT_ARRAY);
                total += fb;
                n++;
            }
            ck_assert_int_eq(rc, 0);
        }
        ck_assert_int_eq(n, 3000);
        ck_assert_uint_eq(total, b.sb.size);
        ck_assert_uint_eq(frame_reader_pending(&r), 0);
        msgpack_unpacked_destroy(&u);
        frame_reader_fini(&r);
    }
    buf_fini(&b);
}
END_TEST

/* Once failed, the reader stays failed with the same code whatever comes. */
START_TEST(test_frame__sticky_error)
{
    static const struct {
        const char *bytes;
        size_t len;
        int err;
    } cases[] = {
        { "\x94\x00\x01\xc1", 4, FRAME_EMALFORMED },
        { "\xdb\x7f\xff\xff\xff", 5, FRAME_ETOO_LARGE },
        { "\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91"
          "\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91\x91",
          33, FRAME_ETOO_DEEP },
    };
    static const char ping[] = "\x94\x00\x01\xa4ping\x90";

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct frame_reader r;
        msgpack_unpacked u;

        ck_assert_int_eq(frame_reader_init(&r, MIB, 0), 0);
        msgpack_unpacked_init(&u);
        /* A good frame first: the error is about the stream after it. */
        ck_assert_int_eq(frame_reader_feed(&r, ping, 9), 0);
        ck_assert_int_eq(next(&r, &u, NULL), 1);
        ck_assert_int_eq(frame_reader_feed(&r, cases[i].bytes, cases[i].len), 0);
        ck_assert_int_eq(next(&r, &u, NULL), cases[i].err);
        for (int k = 0; k < 3; k++) {
            ck_assert_int_eq(frame_reader_feed(&r, ping, 9), 0);
            ck_assert_int_eq(next(&r, &u, NULL), cases[i].err);
        }
        msgpack_unpacked_destroy(&u);
        frame_reader_fini(&r);
    }
}
END_TEST

START_TEST(test_frame__reserved_byte_anywhere)
{
    expect_error(MIB, "\xc1", 1, FRAME_EMALFORMED);
    expect_error(MIB, "\x81\xa1k\xc1", 4, FRAME_EMALFORMED); /* as a map value */
    expect_error(MIB, "\x81\xc1\x01", 3, FRAME_EMALFORMED);  /* as a map key */
    /* Inside a string payload 0xc1 is just a byte. */
    struct frame_reader r;
    msgpack_unpacked u;
    ck_assert_int_eq(frame_reader_init(&r, MIB, 0), 0);
    msgpack_unpacked_init(&u);
    ck_assert_int_eq(frame_reader_feed(&r, "\xa2\xc1\xc1", 3), 0);
    ck_assert_int_eq(next(&r, &u, NULL), 1);
    ck_assert_int_eq(u.data.type, MSGPACK_OBJECT_STR);
    msgpack_unpacked_destroy(&u);
    frame_reader_fini(&r);
}
END_TEST

/* A huge claim fails from the header alone: nothing of the payload has
 * arrived, and a cut inside the length bytes still waits. */
START_TEST(test_frame__huge_claim_from_header)
{
    static const struct {
        const char *hdr;
        size_t len;
    } claims[] = {
        { "\xdb\x05\xf5\xe1\x00", 5 },     /* str32 of 100,000,000 */
        { "\xc6\x05\xf5\xe1\x00", 5 },     /* bin32 */
        { "\xc9\x05\xf5\xe1\x00\x01", 6 }, /* ext32 (the type byte not needed) */
        { "\xdd\xff\xff\xff\xff", 5 },     /* array32 of 2^32-1 */
        { "\xdf\x80\x00\x00\x00", 5 },     /* map32 of 2^31 pairs */
    };

    for (size_t i = 0; i < sizeof(claims) / sizeof(claims[0]); i++) {
        struct frame_reader r;
        msgpack_unpacked u;

        ck_assert_int_eq(frame_reader_init(&r, 16 * MIB, 0), 0);
        msgpack_unpacked_init(&u);
        ck_assert_int_eq(frame_reader_feed(&r, claims[i].hdr, 3), 0);
        ck_assert_int_eq(next(&r, &u, NULL), 0);
        ck_assert_int_eq(frame_reader_feed(&r, claims[i].hdr + 3, 2), 0);
        ck_assert_msg(next(&r, &u, NULL) == FRAME_ETOO_LARGE, "claim %zu", i);
        msgpack_unpacked_destroy(&u);
        frame_reader_fini(&r);
    }
    /* The same inside a request: [0, 1, "call", [{"body": <str32 claim>. */
    static const char in_request[] = "\x94\x00\x01\xa4"
                                     "call\x91\x81\xa4"
                                     "body\xdb\x05\xf5\xe1\x00";
    expect_error(16 * MIB, in_request, sizeof(in_request) - 1, FRAME_ETOO_LARGE);
    /* Containers: each item takes at least a byte (a map pair two). */
    expect_error(64, "\xdc\x00\x40", 3, FRAME_ETOO_LARGE); /* 3 + 64 > 64 */
    expect_error(64, "\xde\x00\x20", 3, FRAME_ETOO_LARGE); /* 3 + 2*32 > 64 */
    expect_error(64, "\xda\x00\x3e", 3, FRAME_ETOO_LARGE); /* 3 + 62 > 64 */
}
END_TEST

START_TEST(test_frame__claims_within_limit_wait)
{
    struct frame_reader r;
    msgpack_unpacked u;

    /* str16 of 61 bytes in a 64-byte limit: 3 + 61 = 64 fits, so wait. */
    ck_assert_int_eq(frame_reader_init(&r, 64, 0), 0);
    msgpack_unpacked_init(&u);
    ck_assert_int_eq(frame_reader_feed(&r, "\xda\x00\x3d", 3), 0);
    ck_assert_int_eq(next(&r, &u, NULL), 0);
    msgpack_unpacked_destroy(&u);
    frame_reader_fini(&r);
}
END_TEST

/* A frame exactly max_bytes long passes; one byte more fails, both for a
 * payload and for scalars that push the running size over. */
START_TEST(test_frame__limit_boundary)
{
    char frame[200];
    struct frame_reader r;
    msgpack_unpacked u;
    size_t fb;

    frame[0] = (char)0xd9; /* str8 */
    frame[1] = (char)98;
    memset(frame + 2, 'x', 98);
    ck_assert_int_eq(frame_reader_init(&r, 100, 0), 0);
    msgpack_unpacked_init(&u);
    ck_assert_int_eq(frame_reader_feed(&r, frame, 100), 0);
    ck_assert_int_eq(next(&r, &u, &fb), 1);
    ck_assert_uint_eq(fb, 100);
    /* The limit is per frame: a second full-size frame is fine too. */
    ck_assert_int_eq(frame_reader_feed(&r, frame, 100), 0);
    ck_assert_int_eq(next(&r, &u, &fb), 1);
    msgpack_unpacked_destroy(&u);
    frame_reader_fini(&r);

    frame[1] = (char)99;
    expect_error(100, frame, 2, FRAME_ETOO_LARGE);

    /* array16 of 100 fixints: the claim alone (3 + 100) is over 102. */
    char arr[110] = { (char)0xdc, 0, 100 };
    memset(arr + 3, 0x01, 100);
    expect_error(102, arr, 103, FRAME_ETOO_LARGE);
    /* array16 of 99 whose first item is a float64: the claim (3 + 99) fits
     * in 109, the real size (3 + 9 + 98 = 110) does not. */
    arr[2] = 99;
    arr[3] = (char)0xcb;
    memset(arr + 4, 0, 8);
    memset(arr + 12, 0x01, 98);
    expect_error(109, arr, 12, 0); /* not yet over: waits */
    expect_error(109, arr, 110, FRAME_ETOO_LARGE);
    expect_error(110, arr, 110, 1); /* exactly the limit */
}
END_TEST

/* Depth counts every container on the path, empty ones included: 32 is
 * accepted, 33 rejected, for arrays and maps alike. */
static size_t nest(char *out, int depth, bool maps, bool empty_innermost)
{
    size_t n = 0;

    for (int i = 0; i < depth; i++) {
        bool last = i == depth - 1;
        if (maps) {
            out[n++] = (char)(last && empty_innermost ? 0x80 : 0x81);
            if (!(last && empty_innermost))
                out[n++] = 0x00; /* key 0 */
        } else {
            out[n++] = (char)(last && empty_innermost ? 0x90 : 0x91);
        }
    }
    if (!empty_innermost)
        out[n++] = 0x01;
    return n;
}

START_TEST(test_frame__depth_32_accepted)
{
    char buf[128];

    for (int maps = 0; maps < 2; maps++) {
        for (int empty = 0; empty < 2; empty++) {
            struct frame_reader r;
            msgpack_unpacked u;
            size_t fb, n = nest(buf, FRAME_MAX_DEPTH, maps, empty);

            ck_assert_int_eq(frame_reader_init(&r, MIB, 0), 0);
            msgpack_unpacked_init(&u);
            ck_assert_int_eq(frame_reader_feed(&r, buf, n), 0);
            ck_assert_msg(next(&r, &u, &fb) == 1, "maps %d empty %d", maps, empty);
            ck_assert_uint_eq(fb, n);
            /* Depth is per frame: the next one starts from zero. */
            ck_assert_int_eq(frame_reader_feed(&r, buf, n), 0);
            ck_assert_int_eq(next(&r, &u, &fb), 1);
            msgpack_unpacked_destroy(&u);
            frame_reader_fini(&r);
        }
    }
}
END_TEST

START_TEST(test_frame__depth_33_rejected)
{
    char buf[128];

    for (int maps = 0; maps < 2; maps++) {
        for (int empty = 0; empty < 2; empty++) {
            size_t n = nest(buf, FRAME_MAX_DEPTH + 1, maps, empty);
            struct frame_reader r;
            msgpack_unpacked u;
            int rc = 0;

            expect_error(MIB, buf, n, FRAME_ETOO_DEEP);
            /* Judged as the 33rd header arrives, not at the frame's end. */
            ck_assert_int_eq(frame_reader_init(&r, MIB, 0), 0);
            msgpack_unpacked_init(&u);
            for (size_t i = 0; i < n && rc == 0; i++) {
                ck_assert_int_eq(frame_reader_feed(&r, buf + i, 1), 0);
                rc = next(&r, &u, NULL);
            }
            ck_assert_msg(rc == FRAME_ETOO_DEEP, "maps %d empty %d: %d", maps, empty, rc);
            msgpack_unpacked_destroy(&u);
            frame_reader_fini(&r);
        }
    }
}
END_TEST

/* Siblings do not add up: depth is the longest path, not the container count. */
START_TEST(test_frame__wide_is_not_deep)
{
    struct buf b;
    struct frame_reader r;
    msgpack_unpacked u;

    buf_init(&b);
    msgpack_pack_array(&b.pk, 100);
    for (int i = 0; i < 100; i++) {
        for (int d = 0; d < 20; d++)
            msgpack_pack_array(&b.pk, 1);
        msgpack_pack_nil(&b.pk);
    }
    ck_assert_int_eq(frame_reader_init(&r, MIB, 0), 0);
    msgpack_unpacked_init(&u);
    ck_assert_int_eq(frame_reader_feed(&r, b.sb.data, b.sb.size), 0);
    ck_assert_int_eq(next(&r, &u, NULL), 1);
    msgpack_unpacked_destroy(&u);
    frame_reader_fini(&r);
    buf_fini(&b);
}
END_TEST

/* A 1 MiB frame through a 16-byte initial buffer, in 64 KiB reads via
 * reserve/commit; a frame kept from before must survive the buffer moving. */
/* A frame of many one-byte values: msgpack-c would spend 24 bytes on each,
 * so the reader caps values per frame at max(1024, max_bytes / 4) and
 * reports more as too large — a byte limit alone would let a 16 MiB frame
 * of nils cost ~400 MB decoded. */
START_TEST(test_frame__value_count_capped)
{
    struct frame_reader r;
    msgpack_unpacked u;
    const size_t max = 64 * 1024; /* cap: 16384 values */
    size_t n_ok = max / 4 - 1;    /* the array itself is one value */
    unsigned char *blob = malloc(5 + max);

    ck_assert(blob != NULL);
    msgpack_unpacked_init(&u);
    /* array32 of n_ok nils: within the cap */
    blob[0] = 0xdd;
    blob[1] = (unsigned char)(n_ok >> 24);
    blob[2] = (unsigned char)(n_ok >> 16);
    blob[3] = (unsigned char)(n_ok >> 8);
    blob[4] = (unsigned char)n_ok;
    memset(blob + 5, 0xc0, n_ok);
    ck_assert_int_eq(frame_reader_init(&r, max, 0), 0);
    ck_assert_int_eq(frame_reader_feed(&r, blob, 5 + n_ok), 0);
    ck_assert_int_eq(frame_reader_next(&r, &u, NULL), 1);
    ck_assert_uint_eq(u.data.via.array.size, n_ok);
    frame_reader_fini(&r);

    /* one more value: over the cap, though far under the byte limit */
    size_t n_bad = n_ok + 1;
    blob[1] = (unsigned char)(n_bad >> 24);
    blob[2] = (unsigned char)(n_bad >> 16);
    blob[3] = (unsigned char)(n_bad >> 8);
    blob[4] = (unsigned char)n_bad;
    memset(blob + 5, 0xc0, n_bad);
    ck_assert_int_eq(frame_reader_init(&r, max, 0), 0);
    ck_assert_int_eq(frame_reader_feed(&r, blob, 5 + n_bad), 0);
    ck_assert_int_eq(frame_reader_next(&r, &u, NULL), FRAME_ETOO_LARGE);
    frame_reader_fini(&r);
    msgpack_unpacked_destroy(&u);
    free(blob);
}
END_TEST

START_TEST(test_frame__buffer_growth_1mib)
{
    struct buf big, small;
    struct frame_reader r;
    msgpack_unpacked keep, u;
    size_t off = 0, fb = 0;
    int rc = 0;

    buf_init(&small);
    pack_str(&small.pk, "kept across growth");
    buf_init(&big);
    char *payload = malloc(MIB);
    ck_assert(payload != NULL);
    for (size_t i = 0; i < MIB; i++)
        payload[i] = (char)('a' + i % 26);
    msgpack_pack_bin(&big.pk, MIB);
    msgpack_pack_bin_body(&big.pk, payload, MIB);

    ck_assert_int_eq(frame_reader_init(&r, 2 * MIB, 16), 0);
    msgpack_unpacked_init(&keep);
    msgpack_unpacked_init(&u);
    ck_assert_int_eq(frame_reader_feed(&r, small.sb.data, small.sb.size), 0);
    ck_assert_int_eq(next(&r, &keep, NULL), 1);

    while (off < big.sb.size) {
        char *dst;
        size_t cap, n = big.sb.size - off < 65536 ? big.sb.size - off : 65536;
        ck_assert_int_eq(frame_reader_reserve(&r, n, &dst, &cap), 0);
        ck_assert_uint_ge(cap, n);
        memcpy(dst, big.sb.data + off, n);
        frame_reader_commit(&r, n);
        off += n;
        rc = next(&r, &u, &fb);
        ck_assert_int_eq(rc, off == big.sb.size ? 1 : 0);
    }
    ck_assert_uint_eq(fb, big.sb.size);
    ck_assert_int_eq(u.data.type, MSGPACK_OBJECT_BIN);
    ck_assert_uint_eq(u.data.via.bin.size, MIB);
    ck_assert(memcmp(u.data.via.bin.ptr, payload, MIB) == 0);
    ck_assert_int_eq(keep.data.type, MSGPACK_OBJECT_STR);
    ck_assert(keep.data.via.str.size == 18 &&
              memcmp(keep.data.via.str.ptr, "kept across growth", 18) == 0);

    /* And the frame outlives the reader itself. */
    frame_reader_fini(&r);
    ck_assert(memcmp(u.data.via.bin.ptr, payload, MIB) == 0);
    msgpack_unpacked_destroy(&u);
    msgpack_unpacked_destroy(&keep);
    free(payload);
    buf_fini(&big);
    buf_fini(&small);
}
END_TEST

START_TEST(test_frame__pending_and_empty_feed)
{
    struct frame_reader r;
    msgpack_unpacked u;

    ck_assert_int_eq(frame_reader_init(&r, MIB, 0), 0);
    msgpack_unpacked_init(&u);
    ck_assert_uint_eq(frame_reader_pending(&r), 0);
    ck_assert_int_eq(frame_reader_feed(&r, NULL, 0), 0);
    ck_assert_int_eq(next(&r, &u, NULL), 0);
    ck_assert_int_eq(frame_reader_feed(&r, "\x94\x00\x01\xa4ping\x90\x94\x00", 11), 0);
    ck_assert_uint_eq(frame_reader_pending(&r), 11);
    ck_assert_int_eq(next(&r, &u, NULL), 1);
    ck_assert_uint_eq(frame_reader_pending(&r), 2);
    ck_assert_int_eq(next(&r, &u, NULL), 0);
    ck_assert_uint_eq(frame_reader_pending(&r), 2);
    msgpack_unpacked_destroy(&u);
    frame_reader_fini(&r);
}
END_TEST

START_TEST(test_frame__trim_gives_back_a_grown_buffer)
{
    struct frame_reader r;
    msgpack_unpacked u;
    struct buf b;
    static char big[600000];

    memset(big, 'x', sizeof(big));
    buf_init(&b);
    msgpack_pack_array(&b.pk, 1);
    msgpack_pack_str(&b.pk, sizeof(big));
    msgpack_pack_str_body(&b.pk, big, sizeof(big));
    ck_assert_int_eq(frame_reader_init(&r, MIB, 0), 0);
    msgpack_unpacked_init(&u);
    ck_assert_int_eq(frame_reader_feed(&r, b.sb.data, b.sb.size - 1), 0);
    /* Something is pending: nothing to give back. */
    ck_assert_int_eq(frame_reader_trim(&r, 65536), 0);
    ck_assert_uint_eq(frame_reader_pending(&r), b.sb.size - 1);
    ck_assert_int_eq(frame_reader_feed(&r, b.sb.data + b.sb.size - 1, 1), 0);
    ck_assert_int_eq(next(&r, &u, NULL), 1);
    ck_assert_uint_ge(msgpack_unpacker_buffer_capacity(&r.up) + r.up.used, sizeof(big));
    ck_assert_int_eq(frame_reader_trim(&r, 65536), 0);
    ck_assert_uint_le(r.up.used + r.up.free, 65536);
    /* The frame taken before the trim is still readable, and the reader
     * goes on with the next frames. */
    ck_assert_uint_eq(u.data.via.array.ptr[0].via.str.size, sizeof(big));
    ck_assert_int_eq(memcmp(u.data.via.array.ptr[0].via.str.ptr, big, sizeof(big)), 0);
    ck_assert_int_eq(frame_reader_feed(&r, b.sb.data, b.sb.size), 0);
    ck_assert_int_eq(next(&r, &u, NULL), 1);
    ck_assert_int_eq(frame_reader_feed(&r, "\x94\x00\x01\xa4ping\x90", 9), 0);
    ck_assert_int_eq(next(&r, &u, NULL), 1);
    ck_assert_uint_eq(u.data.via.array.size, 4);
    /* A small buffer is kept. */
    size_t cap = r.up.used + r.up.free;
    ck_assert_int_eq(frame_reader_trim(&r, 4 * MIB), 0);
    ck_assert_uint_eq(r.up.used + r.up.free, cap);
    msgpack_unpacked_destroy(&u);
    frame_reader_fini(&r);
    buf_fini(&b);
}
END_TEST

START_TEST(test_frame__strerror)
{
    const int codes[] = { FRAME_EMALFORMED, FRAME_ETOO_LARGE, FRAME_ETOO_DEEP, FRAME_ENOMEM };

    for (size_t i = 0; i < 4; i++) {
        ck_assert(frame_strerror(codes[i])[0] != '\0');
        for (size_t k = 0; k < i; k++)
            ck_assert_str_ne(frame_strerror(codes[i]), frame_strerror(codes[k]));
    }
    ck_assert_str_eq(frame_strerror(-99), "unknown frame error");
    ck_assert_str_eq(frame_strerror(FRAME_ETOO_LARGE), "message exceeds max_message_bytes");
}
END_TEST

/* Differential check against msgpack-c's own one-shot decoder on random,
 * often broken, inputs: same frames and sizes when it succeeds, "need more"
 * or an over-limit verdict when it is incomplete, an error when it fails. */
static uint32_t rng_state;

static unsigned rnd(unsigned n)
{
    rng_state = rng_state * 1103515245u + 12345u;
    return (rng_state >> 16) % n;
}

static void gen(unsigned char *buf, size_t *n, size_t cap, int depth)
{
    if (*n + 16 > cap) {
        buf[(*n)++] = 0xc0;
        return;
    }
    switch (rnd(depth > 36 ? 6 : 10)) {
    case 0:
        buf[(*n)++] = (unsigned char)rnd(256);
        break;
    case 1:
        memcpy(buf + *n,
               "\xa3"
               "abc",
               4);
        *n += 4;
        break;
    case 2:
        buf[(*n)++] = 0xcb;
        for (int i = 0; i < 8; i++)
            buf[(*n)++] = (unsigned char)rnd(256);
        break;
    case 3:
        memcpy(buf + *n, "\xd9\x02xy", 4);
        *n += 4;
        break;
    case 4:
        memcpy(buf + *n, "\xc7\x01\x05\x07", 4);
        *n += 4;
        break;
    case 5:
        memcpy(buf + *n, "\xd4\x01\x02", 3);
        *n += 3;
        break;
    case 6:
    case 7: {
        unsigned c = rnd(4);
        buf[(*n)++] = (unsigned char)(0x90 | c);
        for (unsigned i = 0; i < c; i++)
            gen(buf, n, cap, depth + 1);
        break;
    }
    case 8: {
        unsigned c = rnd(3);
        buf[(*n)++] = 0xdc;
        buf[(*n)++] = 0;
        buf[(*n)++] = (unsigned char)c;
        for (unsigned i = 0; i < c; i++)
            gen(buf, n, cap, depth + 1);
        break;
    }
    default: {
        unsigned c = rnd(3);
        buf[(*n)++] = (unsigned char)(0x80 | c);
        for (unsigned i = 0; i < 2 * c; i++)
            gen(buf, n, cap, depth + 1);
        break;
    }
    }
}

START_TEST(test_frame__agrees_with_msgpack_c)
{
    static unsigned char buf[4096];

    rng_state = 12345;
    for (int it = 0; it < 20000; it++) {
        size_t n = 0, off = 0, fb = 0;
        gen(buf, &n, sizeof(buf) - 64, 0);
        if (rnd(4) == 0 && n > 1)
            buf[rnd((unsigned)n)] = (unsigned char)rnd(256);

        msgpack_unpacked ref, u;
        struct frame_reader r;
        ck_assert_int_eq(frame_reader_init(&r, MIB, 0), 0);
        msgpack_unpacked_init(&u);
        msgpack_unpacked_init(&ref);
        ck_assert_int_eq(frame_reader_feed(&r, buf, n), 0);
        int rc = next(&r, &u, &fb);
        if (rc == FRAME_ETOO_LARGE) {
            /* msgpack-c would try to allocate the claim, so it cannot be
             * the reference here. A complete input of at most 4 KB is never
             * too large for 1 MiB: without the limit it must be incomplete. */
            struct frame_reader big;
            ck_assert_int_eq(frame_reader_init(&big, SIZE_MAX / 4, 0), 0);
            ck_assert_int_eq(frame_reader_feed(&big, buf, n), 0);
            ck_assert_msg(next(&big, &ref, NULL) == 0, "iteration %d: false too_large", it);
            frame_reader_fini(&big);
            msgpack_unpacked_destroy(&u);
            msgpack_unpacked_destroy(&ref);
            frame_reader_fini(&r);
            continue;
        }
        msgpack_unpack_return want = msgpack_unpack_next(&ref, (const char *)buf, n, &off);
        if (want == MSGPACK_UNPACK_SUCCESS || want == MSGPACK_UNPACK_EXTRA_BYTES) {
            ck_assert_msg(rc == 1 && fb == off, "iteration %d: rc %d", it, rc);
            ck_assert(same_object(u.data, ref.data));
        } else if (want == MSGPACK_UNPACK_CONTINUE) {
            ck_assert_msg(rc == 0 || rc == FRAME_ETOO_DEEP,
                          "iteration %d: rc %d on an incomplete input", it, rc);
        } else {
            ck_assert_msg(rc == FRAME_EMALFORMED || rc == FRAME_ETOO_DEEP,
                          "iteration %d: rc %d where msgpack-c fails with %d", it, rc, want);
        }
        msgpack_unpacked_destroy(&u);
        msgpack_unpacked_destroy(&ref);
        frame_reader_fini(&r);
    }
}
END_TEST

Suite *frame_suite(void)
{
    Suite *s = suite_create("frame");
    TCase *tc = tcase_create("frame");

    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_frame__whole_frames);
    tcase_add_test(tc, test_frame__every_truncation_point);
    tcase_add_test(tc, test_frame__byte_by_byte);
    tcase_add_test(tc, test_frame__many_frames_one_feed);
    tcase_add_test(tc, test_frame__sticky_error);
    tcase_add_test(tc, test_frame__reserved_byte_anywhere);
    tcase_add_test(tc, test_frame__huge_claim_from_header);
    tcase_add_test(tc, test_frame__claims_within_limit_wait);
    tcase_add_test(tc, test_frame__limit_boundary);
    tcase_add_test(tc, test_frame__depth_32_accepted);
    tcase_add_test(tc, test_frame__depth_33_rejected);
    tcase_add_test(tc, test_frame__wide_is_not_deep);
    tcase_add_test(tc, test_frame__buffer_growth_1mib);
    tcase_add_test(tc, test_frame__value_count_capped);
    tcase_add_test(tc, test_frame__pending_and_empty_feed);
    tcase_add_test(tc, test_frame__trim_gives_back_a_grown_buffer);
    tcase_add_test(tc, test_frame__strerror);
    tcase_add_test(tc, test_frame__agrees_with_msgpack_c);
    suite_add_tcase(s, tc);
    return s;
}
