/*
 * gemini.c — the mock's Gemini API answers (models/{model}:generateContent,
 * :streamGenerateContent, :countTokens) and token counts for Anthropic's
 * /messages/count_tokens. The reply text echoes the last `text` part of
 * the body's `contents` (else the behaviour's `content`, else "mock
 * reply"); counts are ceil(bytes / 4) as elsewhere, `usage` overriding
 * prompt_tokens / completion_tokens / total_tokens.
 */
#include "internal.h"

#include <string.h>

/* The last text part of `contents` (borrowed), or NULL. */
static const char *last_text(json_t *req, size_t *len)
{
    json_t *contents = json_object_get(req, "contents");
    const char *text = NULL;
    size_t i, j;
    json_t *msg, *part;

    json_array_foreach(contents, i, msg)
    {
        json_array_foreach(json_object_get(msg, "parts"), j, part)
        {
            json_t *t = json_object_get(part, "text");
            if (json_is_string(t)) {
                text = json_string_value(t);
                *len = json_string_length(t);
            }
        }
    }
    return text;
}

static long long count_of(size_t bytes)
{
    long long t = (long long)((bytes + 3) / 4);
    return t < 1 ? 1 : t;
}

static long long usage_or(const struct behave *b, const char *name, long long dflt)
{
    json_t *v = b->usage ? json_object_get(b->usage, name) : NULL;
    return v ? (long long)json_number_value(v) : dflt;
}

/* One GenerateContentResponse: `text` (`n` bytes); with `finish`, the
 * finishReason and the final usage. */
static void response(struct buf *sc, const char *text, size_t n, bool finish, long long pt,
                     long long ct, long long tt)
{
    buf_adds(sc, "{\"candidates\":[{\"content\":{\"parts\":[{\"text\":");
    buf_add_json_str(sc, text, n);
    buf_adds(sc, "}],\"role\":\"model\"},");
    if (finish)
        buf_adds(sc, "\"finishReason\":\"STOP\",");
    buf_adds(sc, "\"index\":0}],\"usageMetadata\":{");
    if (finish)
        buf_addf(sc,
                 "\"promptTokenCount\":%lld,\"candidatesTokenCount\":%lld,"
                 "\"totalTokenCount\":%lld",
                 pt, ct, tt);
    else
        buf_addf(sc, "\"promptTokenCount\":%lld,\"totalTokenCount\":%lld", pt, pt);
    buf_adds(sc, "},\"modelVersion\":\"mock-gemini\"}");
}

void reply_gemini(struct conn *c, json_t *req, int status, size_t body_len)
{
    struct buf *sc = &c->m->scratch;
    const char *text = "mock reply";
    size_t tlen = strlen(text);

    sc->len = 0;
    if (c->ep == EP_COUNT_TOKENS) {
        long long n = usage_or(&c->b, "prompt_tokens", count_of(body_len));
        if (json_object_get(req, "messages")) /* Anthropic's */
            buf_addf(sc, "{\"input_tokens\":%lld}", n);
        else
            buf_addf(sc,
                     "{\"totalTokens\":%lld,\"promptTokensDetails\":[{\"modality\":\"TEXT\","
                     "\"tokenCount\":%lld}]}",
                     n, n);
        reply_simple(c, status, "application/json", sc->p, sc->len);
        return;
    }
    if (c->b.content) {
        text = c->b.content;
        tlen = c->b.content_len;
    } else {
        size_t n = 0;
        const char *t = last_text(req, &n);
        if (t) {
            text = t;
            tlen = n;
        }
    }
    long long pt = usage_or(&c->b, "prompt_tokens", count_of(body_len));
    long long ct = usage_or(&c->b, "completion_tokens", count_of(tlen));
    long long tt = usage_or(&c->b, "total_tokens", pt + ct);
    if (c->ep == EP_GEMINI) {
        response(sc, text, tlen, true, pt, ct, tt);
        reply_simple(c, status, "application/json", sc->p, sc->len);
        return;
    }
    /* SSE: the first half, then the second with finishReason and usage
     * (no_done: without them; stream_error: an error event instead). */
    size_t half = tlen / 2;
    while (half > 0 && half < tlen && ((unsigned char)text[half] & 0xC0) == 0x80)
        half--;
    buf_adds(sc, "data: ");
    response(sc, text, half, false, pt, ct, tt);
    buf_adds(sc, "\r\n\r\ndata: ");
    if (c->b.stream_error)
        buf_addf(sc,
                 "{\"error\":{\"code\":503,\"message\":\"mock stream error\",\"status\":\"%s\"}}",
                 c->b.stream_error);
    else
        response(sc, text + half, tlen - half, !c->b.no_done, pt, ct, tt);
    buf_adds(sc, "\r\n\r\n");
    reply_simple(c, status, "text/event-stream", sc->p, sc->len);
}
