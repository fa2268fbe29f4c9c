/*
 * transcode.c — JSON -> msgpack cost per input byte: the single-pass
 * transcoder the sidecar uses (transcode_json_to_msgpack) against the
 * jansson tree it replaced (transcode_json_to_msgpack_jansson), on the
 * shapes the msgpack `call` path transcodes: a ~1 KB chat reply, a
 * ~200-byte stream chunk and a ~64 KB reply (long content, many choices),
 * plus the short chat request the per-request bench sends, each packed
 * into a reused msgpack_sbuffer as the sidecar does, through the scrubbing
 * string hook's shape (a no-op hook).
 *
 *   build/bench/transcode [--iterations N]
 *
 * Checks first that both give the same bytes, then prints a Markdown table
 * of ns per input byte and µs per document (best of 7 runs of N each), and
 * beside them the validating scan the HTTP front end runs over the same
 * text (jscan_object, a callback per top-level member as sidecar/call/call.c's).
 * When built with libyajl-dev installed (not a dependency of polygw), it
 * also times yajl's parser with callbacks that do nothing: the floor of any
 * yajl-based transcoder, which would still have to count members and pack.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec/jscan.h"
#include "strbuf.h"
#include "codec/transcode.h"
#include "tests/ref/transcode_jansson.h"

#if __has_include(<yajl/yajl_parse.h>)
#include <yajl/yajl_parse.h>
#define BENCH_YAJL 1

static int y_null(void *ctx)
{
    (void)ctx;
    return 1;
}

static int y_bool(void *ctx, int b)
{
    (void)ctx;
    (void)b;
    return 1;
}

static int y_int(void *ctx, long long v)
{
    (void)ctx;
    (void)v;
    return 1;
}

static int y_double(void *ctx, double v)
{
    (void)ctx;
    (void)v;
    return 1;
}

static int y_str(void *ctx, const unsigned char *s, size_t n)
{
    (void)ctx;
    (void)s;
    (void)n;
    return 1;
}

static const yajl_callbacks y_cbs = { y_null, y_bool, y_int,  y_double, NULL,  y_str,
                                      y_null, y_str,  y_null, y_null,   y_null };

/* yajl_parse + yajl_complete_parse with no-op callbacks (0 on success). */
static int yajl_floor(const char *json, size_t len, msgpack_packer *pk,
                      const struct transcode_j2m *opt, char *err, size_t errlen)
{
    (void)pk;
    (void)opt;
    (void)err;
    (void)errlen;
    yajl_handle h = yajl_alloc(&y_cbs, NULL, NULL);
    int rc = yajl_parse(h, (const unsigned char *)json, len) == yajl_status_ok &&
            yajl_complete_parse(h) == yajl_status_ok
        ? 0
        : -1;
    yajl_free(h);
    return rc;
}
#endif

#ifndef BENCH_YAJL
#define BENCH_YAJL 0
#endif

typedef int j2m_fn(const char *, size_t, msgpack_packer *, const struct transcode_j2m *, char *,
                   size_t);

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The shape of the sidecar's scrubber when nothing matches. */
static int noop_hook(void *ud, const char **s, size_t *n)
{
    (void)ud;
    (void)s;
    (void)n;
    return 0;
}

static int count_member(void *ud, const char *key, const struct jscan_value *v)
{
    (void)v;
    *(unsigned *)ud += strcmp(key, "usage") == 0;
    return 0;
}

/* jscan_object in best_of's shape (pk, opt and err unused). */
static int jscan_walk(const char *json, size_t len, msgpack_packer *pk,
                      const struct transcode_j2m *opt, char *err, size_t errlen)
{
    unsigned n = 0;
    (void)pk;
    (void)opt;
    (void)err;
    (void)errlen;
    return jscan_object(json, len, count_member, &n, NULL);
}

/* The chat request tests/bench/per_request.py sends. */
static const char request[] =
    "{\"model\":\"gpt-4o-mini\",\"messages\":[{\"role\":\"system\",\"content\":\"You are a "
    "helpful assistant.\"},{\"role\":\"user\",\"content\":\"Hello, how are you today?\"}]}";

static const char chunk[] =
    "{\"id\":\"chatcmpl-9x8y7z\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
    "\"model\":\"gpt-4o-mini-2024-07-18\",\"system_fingerprint\":\"fp_0ba0d124f1\",\"choices\":"
    "[{\"index\":0,\"delta\":{\"content\":\" world\"},\"logprobs\":null,\"finish_reason\":null}]}";

/* A chat.completion with `choices` choices of `content_len` bytes each. */
static void make_reply(struct strbuf *b, unsigned choices, size_t content_len)
{
    static const char words[] = "The quick brown fox jumps over the lazy dog; \\\"quoted\\\" "
                                "caf\xc3\xa9 \\u00e9 \\n 12345 ";
    strbuf_reset(b);
    strbuf_puts(b,
                "{\"id\":\"chatcmpl-AbCdEf0123456789\",\"object\":\"chat.completion\","
                "\"created\":1700000000,\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[");
    for (unsigned c = 0; c < choices; c++) {
        char head[96];
        snprintf(head, sizeof(head),
                 "%s{\"index\":%u,\"message\":{\"role\":\"assistant\",\"content\":\"", c ? "," : "",
                 c);
        strbuf_put(b, head, strlen(head));
        size_t start = b->len;
        while (b->len - start < content_len)
            strbuf_puts(b, words);
        strbuf_puts(b, "\",\"refusal\":null},\"logprobs\":null,\"finish_reason\":\"stop\"}");
    }
    strbuf_puts(b,
                "],\"usage\":{\"prompt_tokens\":19,\"completion_tokens\":212,\"total_tokens\":"
                "231,\"prompt_tokens_details\":{\"cached_tokens\":0,\"audio_tokens\":0},"
                "\"completion_tokens_details\":{\"reasoning_tokens\":0,\"accepted_prediction_"
                "tokens\":0,\"rejected_prediction_tokens\":0}},\"system_fingerprint\":"
                "\"fp_0ba0d124f1\",\"service_tier\":\"default\",\"temperature\":0.7}");
}

/* Best seconds per document over 7 runs of n. */
static double best_of(j2m_fn *fn, const char *json, size_t len, unsigned long n)
{
    const struct transcode_j2m opt = { .max_depth = 30, .on_str = noop_hook };
    msgpack_sbuffer sb;
    msgpack_packer pk;
    double best = 1e9;

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    for (int run = 0; run < 7; run++) {
        double t0 = mono();
        for (unsigned long i = 0; i < n; i++) {
            msgpack_sbuffer_clear(&sb);
            if (fn(json, len, &pk, &opt, NULL, 0) != 0) {
                fprintf(stderr, "transcode failed\n");
                exit(1);
            }
        }
        double t = (mono() - t0) / (double)n;
        if (t < best)
            best = t;
    }
    msgpack_sbuffer_destroy(&sb);
    return best;
}

static void same_bytes(const char *json, size_t len)
{
    msgpack_sbuffer a, b;
    msgpack_packer pa, pb;

    msgpack_sbuffer_init(&a);
    msgpack_sbuffer_init(&b);
    msgpack_packer_init(&pa, &a, msgpack_sbuffer_write);
    msgpack_packer_init(&pb, &b, msgpack_sbuffer_write);
    if (transcode_json_to_msgpack(json, len, &pa, NULL, NULL, 0) != 0 ||
        transcode_json_to_msgpack_jansson(json, len, &pb, NULL, NULL, 0) != 0 || a.size != b.size ||
        memcmp(a.data, b.data, a.size) != 0) {
        fprintf(stderr, "the two transcoders disagree\n");
        exit(1);
    }
    msgpack_sbuffer_destroy(&a);
    msgpack_sbuffer_destroy(&b);
}

int main(int argc, char **argv)
{
    unsigned long iters = 20000;
    struct strbuf reply1k, reply64k;

    if (argc == 3 && strcmp(argv[1], "--iterations") == 0)
        iters = strtoul(argv[2], NULL, 10);
    else if (argc != 1) {
        fprintf(stderr, "usage: %s [--iterations N]\n", argv[0]);
        return 2;
    }
    if (iters == 0)
        iters = 1;
    strbuf_init(&reply1k);
    strbuf_init(&reply64k);
    make_reply(&reply1k, 1, 560);
    make_reply(&reply64k, 16, 4000);
    const struct {
        const char *name;
        const char *json;
        size_t len;
        unsigned long n;
    } docs[] = {
        { "chat request", request, sizeof(request) - 1, iters * 4 },
        { "SSE chunk", chunk, sizeof(chunk) - 1, iters * 4 },
        { "chat reply", reply1k.data, reply1k.len, iters },
        { "large reply", reply64k.data, reply64k.len, iters / 40 + 1 },
    };

    printf(
        "| input | bytes | jansson ns/B | single-pass ns/B | jansson µs | single-pass µs | "
        "speed-up | jscan ns/B | jscan µs |%s\n|---|---:|---:|---:|---:|---:|---:|---:|---:|%s\n",
        BENCH_YAJL ? " yajl parse alone ns/B |" : "", BENCH_YAJL ? "---:|" : "");
    for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++) {
        same_bytes(docs[i].json, docs[i].len);
        double old =
            best_of(transcode_json_to_msgpack_jansson, docs[i].json, docs[i].len, docs[i].n);
        double cur = best_of(transcode_json_to_msgpack, docs[i].json, docs[i].len, docs[i].n);
        printf("| %s | %zu | %.2f | %.2f | %.2f | %.2f | %.1fx |", docs[i].name, docs[i].len,
               old * 1e9 / (double)docs[i].len, cur * 1e9 / (double)docs[i].len, old * 1e6,
               cur * 1e6, old / cur);
        double scan = best_of(jscan_walk, docs[i].json, docs[i].len, docs[i].n);
        printf(" %.2f | %.3f |", scan * 1e9 / (double)docs[i].len, scan * 1e6);
#if BENCH_YAJL
        double y = best_of(yajl_floor, docs[i].json, docs[i].len, docs[i].n);
        printf(" %.2f |", y * 1e9 / (double)docs[i].len);
#endif
        printf("\n");
    }
    strbuf_fini(&reply1k);
    strbuf_fini(&reply64k);
    return 0;
}
