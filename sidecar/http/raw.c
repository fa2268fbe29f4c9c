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

/* Is s[0..n) "." or "..", any dot percent-encoded or not? */
static bool dot_segment(const char *s, size_t n)
{
    size_t dots = 0;

    for (size_t i = 0; i < n; dots++) {
        if (s[i] == '.')
            i++;
        else if (n - i >= 3 && s[i] == '%' && s[i + 1] == '2' && (s[i + 2] | 0x20) == 'e')
            i += 3;
        else
            return false;
    }
    return dots == 1 || dots == 2;
}

bool httpraw_sub_path_ok(const char *p, size_t n)
{
    size_t start = 0;

    for (size_t i = 0; i <= n; i++) {
        if (i == n || p[i] == '/') {
            if (dot_segment(p + start, i - start))
                return false;
            start = i + 1;
        }
    }
    return true;
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
