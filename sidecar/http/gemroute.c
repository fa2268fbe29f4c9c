/*
 * gemroute.c — the Gemini API's routes (see gemroute.h).
 */
#include "gemroute.h"

#include <string.h>

#include "call/upath.h"

/* Whether query `q` (`n` bytes) has the parameter alt=sse. */
static bool query_has_alt_sse(const char *q, size_t n)
{
    static const char want[] = "alt=sse";
    size_t w = sizeof(want) - 1;

    for (size_t i = 0; q && i < n;) {
        const char *amp = memchr(q + i, '&', n - i);
        size_t end = amp ? (size_t)(amp - q) : n;
        if (end - i == w && memcmp(q + i, want, w) == 0)
            return true;
        i = end + 1;
    }
    return false;
}

enum gemroute_rc gemroute_parse(const char *path, size_t len, const char *query, size_t qlen,
                                struct gemroute *out)
{
    static const struct {
        const char *name;
        const char *capability;
        bool stream;
    } methods[] = {
        { "generateContent", "gemini", false },
        { "streamGenerateContent", "gemini", true },
        { "countTokens", "count_tokens", false },
    };
    size_t np = sizeof(GEMROUTE_PREFIX) - 1;

    if (len <= np || memcmp(path, GEMROUTE_PREFIX, np) != 0)
        return GEMROUTE_NOT_FOUND;
    const char *m = path + np;
    size_t n = len - np;
    const char *colon = memchr(m, ':', n);
    if (!colon || !upath_model_ok(m, (size_t)(colon - m)))
        return GEMROUTE_NOT_FOUND;
    const char *meth = colon + 1;
    size_t nm = n - (size_t)(meth - m);
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
        if (strlen(methods[i].name) != nm || memcmp(methods[i].name, meth, nm) != 0)
            continue;
        out->model = m;
        out->model_len = (size_t)(colon - m);
        out->capability = methods[i].capability;
        out->stream = methods[i].stream;
        if (out->stream && !query_has_alt_sse(query, qlen))
            return GEMROUTE_NOT_SSE;
        return GEMROUTE_OK;
    }
    return GEMROUTE_NOT_FOUND;
}
