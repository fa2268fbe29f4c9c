/*
 * evstream.c — the cost of decoding Bedrock's AWS event-stream framing
 * (src/evstream.c) against its floor and its peer, on the same payloads:
 *
 *   - the floor: zlib's crc32() over the same bytes, which the decoder
 *     cannot avoid (every byte is under the message CRC);
 *   - the peer: the SSE parser (src/sse.c) over the same payloads framed as
 *     `event: chunk` / `data: ...` blocks, what the other dialects stream.
 *
 * 100000 messages of a 120-byte JSON payload with the three string headers
 * Bedrock sends (`:event-type`, `:content-type`, `:message-type`), fed in
 * 1400-byte chunks (one TCP segment's worth).
 *
 *   build/bench/evstream [--messages N]
 *
 * Prints a Markdown table of ns per message and MB/s (best of 5 runs).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#include "evstream.h"
#include "sse.h"

#define CHUNK 1400

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t delivered;

static int on_msg(const struct evstream_msg *m, void *ud)
{
    (void)ud;
    delivered += m->payload_len;
    return 0;
}

static int on_event(const struct sse_event *ev, void *ud)
{
    (void)ud;
    delivered += ev->data_len;
    return 0;
}

static double run_evstream(const uint8_t *s, size_t len)
{
    struct evstream d;
    double t0;

    if (evstream_init(&d, 1 << 20) != 0)
        exit(1);
    t0 = mono();
    for (size_t off = 0; off < len; off += CHUNK)
        if (evstream_feed(&d, s + off, len - off < CHUNK ? len - off : CHUNK, on_msg, NULL) != 0)
            exit(1);
    t0 = mono() - t0;
    evstream_fini(&d);
    return t0;
}

static double run_crc(const uint8_t *s, size_t len)
{
    uLong crc = crc32(0L, Z_NULL, 0);
    double t0 = mono();

    for (size_t off = 0; off < len; off += CHUNK)
        crc = crc32(crc, s + off, (uInt)(len - off < CHUNK ? len - off : CHUNK));
    t0 = mono() - t0;
    delivered += crc & 1;
    return t0;
}

static double run_sse(const uint8_t *s, size_t len)
{
    struct sse_parser p;
    double t0;

    if (sse_parser_init(&p, 1 << 20) != 0)
        exit(1);
    t0 = mono();
    for (size_t off = 0; off < len; off += CHUNK)
        if (sse_parser_feed(&p, (const char *)s + off, len - off < CHUNK ? len - off : CHUNK,
                            on_event, NULL) != 0)
            exit(1);
    t0 = mono() - t0;
    sse_parser_fini(&p);
    return t0;
}

static double best_of_5(double (*run)(const uint8_t *, size_t), const uint8_t *s, size_t len)
{
    double best = 1e30;

    for (int r = 0; r < 5; r++) {
        double t = run(s, len);

        if (t < best)
            best = t;
    }
    return best;
}

int main(int argc, char **argv)
{
    static const char *const names[] = { ":event-type", ":content-type", ":message-type" };
    static const char *const values[] = { "chunk", "application/json", "event" };
    size_t nmsg = 100000, one_len, es_len, sse_len = 0;
    char payload[121];
    uint8_t *one, *es, *sse;
    double t_es, t_crc, t_sse;

    if (argc == 3 && strcmp(argv[1], "--messages") == 0)
        nmsg = strtoul(argv[2], NULL, 10);
    if (nmsg == 0)
        return 1;
    memset(payload, 'a', sizeof(payload) - 1);
    memcpy(payload, "{\"bytes\":\"", 10);
    memcpy(payload + sizeof(payload) - 3, "\"}", 2);
    payload[sizeof(payload) - 1] = '\0';
    if (evstream_encode(names, values, 3, payload, strlen(payload), &one, &one_len) != 0)
        return 1;
    es_len = nmsg * one_len;
    es = malloc(es_len);
    sse = malloc(nmsg * (strlen(payload) + 32));
    if (es == NULL || sse == NULL)
        return 1;
    for (size_t i = 0; i < nmsg; i++) {
        memcpy(es + i * one_len, one, one_len);
        sse_len += (size_t)sprintf((char *)sse + sse_len, "event: chunk\ndata: %s\n\n", payload);
    }
    t_es = best_of_5(run_evstream, es, es_len);
    t_crc = best_of_5(run_crc, es, es_len);
    t_sse = best_of_5(run_sse, sse, sse_len);

    printf("%zu messages, %zu-byte payloads (%zu bytes a message; %zu as SSE), %d-byte feeds, "
           "best of 5\n\n",
           nmsg, strlen(payload), one_len, sse_len / nmsg, CHUNK);
    printf("| decoder | ns/message | MB/s | ratio to evstream |\n|---|---:|---:|---:|\n");
    printf("| evstream_feed (src/evstream.c) | %.0f | %.0f | 1.00 |\n", t_es * 1e9 / nmsg,
           es_len / t_es / 1e6);
    printf("| floor: zlib crc32() over the same bytes | %.0f | %.0f | %.2f |\n", t_crc * 1e9 / nmsg,
           es_len / t_crc / 1e6, t_crc / t_es);
    printf("| peer: sse_parser_feed (src/sse.c), same payloads | %.0f | %.0f | %.2f |\n",
           t_sse * 1e9 / nmsg, sse_len / t_sse / 1e6, t_sse / t_es);
    free(one);
    free(es);
    free(sse);
    return delivered == 0;
}
