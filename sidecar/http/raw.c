/* raw.c — see raw.h. */
#include "raw.h"

#include <http_parser.h>
#include <string.h>
#include <strings.h>

#include "core/config.h"

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
