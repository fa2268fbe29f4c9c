/* raw.c — see raw.h. */
#include "raw.h"

#include <http_parser.h>
#include <string.h>
#include <strings.h>

#include "backend/respids.h"
#include "codec/dialect.h"
#include "core/config.h"

int httpraw_followup(const struct config_capability *cap, const char *p, size_t n, int method,
                     size_t *id_off, size_t *id_len)
{
    size_t k = strlen(cap->path);

    if (cap->raw || !dialect_path_is_responses(cap->path) || n <= k + 1 ||
        memcmp(p, cap->path, k) != 0 || p[k] != '/')
        return 0;
    const char *id = p + k + 1, *end = p + n;
    const char *slash = memchr(id, '/', (size_t)(end - id));
    size_t len = (size_t)((slash ? slash : end) - id);
    if (!respids_id_ok(id, len))
        return -1;
    size_t rest = (size_t)(end - (id + len));
    int want;
    if (rest == 0)
        want = method == HTTP_GET || method == HTTP_DELETE ? method : HTTP_GET;
    else if (rest == 7 && memcmp(id + len, "/cancel", 7) == 0)
        want = HTTP_POST;
    else if (rest == 12 && memcmp(id + len, "/input_items", 12) == 0)
        want = HTTP_GET;
    else
        return -1;
    if (method != want)
        return -2;
    *id_off = (size_t)(id - p);
    *id_len = len;
    return rest == 0 ? 1 : 2;
}

bool httpraw_stream_query(const char *q, size_t n)
{
    if (!q)
        return false;
    for (const char *p = q, *end = q + n; p < end;) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        size_t len = (size_t)((amp ? amp : end) - p);
        if (len == 11 && memcmp(p, "stream=true", 11) == 0)
            return true;
        if (!amp)
            break;
        p = amp + 1;
    }
    return false;
}

bool httpraw_sub_path(const struct config_capability *cap, const char *p, size_t n)
{
    size_t k = strlen(cap->path);

    return cap->raw && n > k && memcmp(p, cap->path, k) == 0 && p[k] == '/';
}

size_t httpraw_max_body(const struct config *cfg)
{
    size_t most = cfg->http_max_body_bytes;

    for (size_t i = 0; i < cfg->n_capabilities; i++)
        if (cfg->capabilities[i].raw && cfg->capabilities[i].max_body_bytes > most)
            most = cfg->capabilities[i].max_body_bytes;
    return most;
}

unsigned httpraw_method_bit(int m, const char **name)
{
    switch (m) {
    case HTTP_GET:
        *name = "GET";
        return CONFIG_METHOD_GET;
    case HTTP_POST:
        *name = "POST";
        return CONFIG_METHOD_POST;
    case HTTP_DELETE:
        *name = "DELETE";
        return CONFIG_METHOD_DELETE;
    default:
        *name = NULL;
        return 0;
    }
}

const char *httpraw_ctype(const char *ct)
{
    if (!ct || !*ct)
        return "application/octet-stream";
    for (const char *s = ct; *s; s++)
        if (*s < ' ' || *s > '~')
            return "application/octet-stream";
    return ct;
}
