/*
 * config.c — YAML configuration loader (contract in config.h, reference in
 * docs/CONFIG.md).
 *
 * Three passes:
 *
 *   1. tree:     libyaml events -> a small owned node tree (struct ynode).
 *                Syntax errors, anchors/aliases, tags, several documents and
 *                excessive nesting are rejected here, and end the load: the
 *                tree is incomplete. Repeated keys are marked (dup_line).
 *   2. walk:     the tree is matched against static tables of `struct field`
 *                (key, type, bounds, destination offset). Unknown keys (with
 *                a suggestion), duplicate keys, wrong types and out-of-range
 *                values are rejected here; every key that is set records its
 *                line, which is how later passes know "set here" from
 *                "inherited". A rejected value is recorded as set but bad
 *                (LINE_BAD), and the walk goes on with the next key.
 *   3. validate: cross-field rules and inheritance (defaults <- capability;
 *                a source takes its capability's policy whole), skipping
 *                every rule that involves a bad value (its error is already
 *                reported); then, only if nothing was rejected, the secrets
 *                pass (environment / key files), so that an invalid file
 *                never causes I/O.
 *
 * Every error is reported (config_report_fn), in the order found; the first
 * also goes to the caller's `err`. Lookups by name (duplicate keys, duplicate
 * source names, a source's capability) go through hash indexes, so a load
 * costs time linear in the size of the file.
 *
 * Secret hygiene: the loader never quotes a string value in a message, only
 * numbers, key names, source/capability names and the key file's path (which
 * must be absolute, so a pasted key is rejected before it could be echoed).
 */
#include "config.h"
#include "iplit.h"
#include "modelmatch.h"
#include "name_index.h"
#include "tls.h"
#include "yamltree.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <openssl/ssl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define CONFIG_FILE_MAX  (16u << 20) /* bytes of YAML accepted by config_load */
#define CONFIG_DEPTH_MAX 32u         /* nesting; the schema itself needs 4 */
#define CONFIG_KEY_MAX   65536u      /* bytes read from a key file (before trimming) */
#define CONFIG_PATH_MAX  256u        /* key path buffer for messages */
#define DURATION_MAX_S   31536000.0  /* one year: upper bound of every duration */
#define SUN_PATH_MAX     (sizeof(((struct sockaddr_un *)0)->sun_path))

/* ------------------------------------------------------------------------ */
/* Field table                                                              */

/* Field ids: index of the per-entity `line[]` arrays (0 = not set here). */
enum fid {
    FID_NONE = 0,
    FID_LISTEN,
    FID_SERVER,
    FID_BACKEND,
    FID_DEFAULTS,
    FID_CAPABILITIES,
    FID_SOURCES,
    FID_TASKS,
    FID_TASK_TTL,
    FID_TRACING,
    FID_TRACING_ENABLED,
    FID_TRACING_ENDPOINT,
    FID_TRACING_RATIO,
    FID_TRACING_PARENT,
    FID_TRACING_SERVICE,
    FID_TRACING_QUEUE,
    FID_TRACING_BATCH,
    FID_TRACING_INTERVAL,
    FID_TRACING_TIMEOUT,
    FID_TRACING_RETRIES,
    FID_MAX_TASKS,
    FID_RESPONSES,
    FID_RESP_REMEMBER,
    FID_CACHE,
    FID_CACHE_MAX_BYTES,
    FID_CACHE_TTL,
    FID_CACHE_MAX_ENTRY,
    FID_CACHE_SHARED,
    FID_CACHE_LOCK,
    FID_RESP_MAX,
    FID_SOCKET,
    FID_MODE,
    FID_MAX_MESSAGE_BYTES,
    FID_MAX_CONNECTIONS,
    FID_MAX_INFLIGHT,
    FID_MAX_WRITE_QUEUE,
    FID_MAX_BUFFERED_INPUT,
    FID_LISTEN_IDLE_TIMEOUT,
    FID_LOG_LEVEL,
    FID_SHUTDOWN_GRACE,
    FID_KIND,
    FID_URL,
    FID_URL_ENV,
    FID_PREFIX,
    FID_COMMAND_TIMEOUT,
    FID_LEASE_TTL,
    FID_SENTINELS,
    FID_CLUSTER,
    FID_MASTER_NAME,
    FID_DB,
    FID_USERNAME,
    FID_PASSWORD_ENV,
    FID_PASSWORD_FILE,
    FID_SENTINEL_USERNAME,
    FID_SENTINEL_PASSWORD_ENV,
    FID_SENTINEL_PASSWORD_FILE,
    FID_TLS,
    FID_TLS_CA_FILE,
    FID_TLS_CERT_FILE,
    FID_TLS_KEY_FILE,
    FID_TLS_SERVER_NAME,
    FID_MAX_ATTEMPTS,
    FID_STALL_WINDOW,
    FID_BACKOFF_BASE,
    FID_BACKOFF_MAX,
    FID_POLL_INTERVAL,
    FID_NODE_TIMEOUT,
    FID_EXEMPT_429,
    FID_PATH,
    FID_NAME,
    FID_CAPABILITY,
    FID_BASE_URL,
    FID_API_KEY,
    FID_API_KEY_ENV,
    FID_API_KEY_FILE,
    FID_MODEL,
    FID_SERVES,
    FID_AFFINITY,
    FID_CAP_BODY,
    FID_CAP_METHODS,
    FID_CAP_MAX_BODY,
    FID_APP_MODELS,
    FID_PRIORITY,
    FID_WEIGHT,
    FID_TIMEOUT,
    FID_CONNECT_TIMEOUT,
    FID_TTFT_TIMEOUT,
    FID_IDLE_TIMEOUT,
    FID_MAX_CONCURRENCY,
    FID_AIMD,
    FID_AIMD_INITIAL,
    FID_AIMD_MIN,
    FID_AIMD_INCREASE,
    FID_AIMD_DECREASE,
    FID_BREAKER,
    FID_BREAKER_FAILURES,
    FID_BREAKER_COOLDOWN,
    FID_BREAKER_MAX_COOLDOWN,
    FID_LIMITS,
    FID_RPM,
    FID_TPM,
    FID_DAILY_TOKENS,
    FID_WINDOW,
    FID_PACER,
    FID_PACER_MIN_INTERVAL,
    FID_ACCESS_LOG,
    FID_SRC_KIND,
    FID_API_VERSION,
    FID_ANTHROPIC_VERSION,
    FID_REGION,
    FID_BEDROCK_API,
    FID_PROJECT,
    FID_LOCATION,
    FID_TOKEN_COMMAND,
    FID_TOKEN_FILE,
    FID_AUTH_HEADER,
    FID_AUTH_QUERY,
    FID_HEADERS,
    FID_QUERY,
    FID_STREAM_USAGE,
    FID_ACCEPTS,
    FID_PROXY,
    FID_NO_PROXY,
    FID_HTTP,
    FID_HTTP_SOCKET,
    FID_HTTP_LISTEN,
    FID_HTTP_ALLOW_REMOTE,
    FID_HTTP_ALLOW_STATUS_REMOTE,
    FID_HTTP_MAX_BODY,
    FID_HTTP_MAX_HEADER,
    FID_HTTP_MAX_CONNECTIONS,
    FID_HTTP_HEADER_TIMEOUT,
    FID_HTTP_BODY_TIMEOUT,
    FID_HTTP_KEEPALIVE_TIMEOUT,
    FID_HTTP_SEND_TIMEOUT,
    FID_HTTP_ALLOWED_ORIGINS,
    FID_HTTP_ALLOWED_HOSTS,
    FID_APPS,
    FID_UIDS,
    FID_GIDS,
    FID_ALLOW_DECLARED,
    FID_ADMIN,
    FID_APP_CAPS,
    FID_APP_TOKEN,
    FID_APP_TOKEN_ENV,
    FID_APP_TOKEN_FILE,
    FID_APP_PER_CAP,
    FID_UPSTREAM_CLIENT,
    FID_DNS_TTL,
    FID_CURRENCY,
    FID_PRICES,
    FID_PRICE_INPUT,
    FID_PRICE_CACHED,
    FID_PRICE_CACHE_WRITE,
    FID_PRICE_OUTPUT,
    FID_PRICE_REASONING,
    FID_BUDGET,
    FID_BUDGET_DAILY,
    FID_BUDGET_MONTHLY,
    FID_BUDGET_TOTAL,
    FID_BUDGET_TZ,
    FID_BUDGET_OUTPUT,
    FID_ITPM,
    FID_OTPM,
    FID_CACHED_INPUT,
    FID_COUNT
};

enum field_type {
    FT_BOOL,      /* bool */
    FT_U32,       /* uint32_t, integer text only */
    FT_I32,       /* int32_t */
    FT_U64,       /* uint64_t */
    FT_SIZE,      /* size_t */
    FT_DOUBLE,    /* double, integer or float text, finite */
    FT_STR,       /* char *, owned, then `check` */
    FT_NAME,      /* char[CONFIG_NAME_MAX], [A-Za-z0-9_.-]{1,63} */
    FT_UPATH,     /* char[256] upstream path, "/..." */
    FT_MODE,      /* uint32_t permission bits, octal digits */
    FT_LOGLEVEL,  /* enum log_level */
    FT_BACKEND,   /* enum backend_kind */
    FT_UPCLIENT,  /* enum upstream_client */
    FT_IDS,       /* struct config_ids: a list of uids/gids (integers) */
    FT_NODE,      /* const struct ynode *: kept for the validation pass */
    FT_DIALECT,   /* enum dialect_kind */
    FT_SECTION,   /* nested map described by `sub`, same base + off */
    FT_INCLUDE,   /* `sub`'s keys belong to this map too, at base + off; its
                   * `key` is only a label (never matched), non-NULL because
                   * a NULL key ends a table */
    FT_CUSTOM,    /* `walk` handles the value */
    FT_REJECT,    /* key is known but forbidden: `why` */
    FT_MISPLACED, /* key is known but belongs at another level: the walk only
                   * records its line (whatever the value, even null), and the
                   * validation pass rejects it with a hint that needs context
                   * the walk does not have yet (e.g. the source's capability) */
};

#define F_MIN_OPEN 1u /* bound is exclusive: value > min */
#define F_MAX_OPEN 2u /* value < max */

struct loader;

struct field {
    const char *key;
    const char *each; /* FT_CUSTOM with `sub`: how one element's key
                                * path reads in a hint ("[i]", ".NAME") */
    enum field_type type;
    enum fid fid;
    size_t off;
    double min, max;
    unsigned flags;
    const struct field *sub;
    int (*check)(struct loader *l, const struct ynode *v, char *s);
    int (*walk)(struct loader *l, const struct ynode *v);
    const char *why;
};

/* lines[fid] of a key whose value was rejected: it counts as written (no
 * "is required", no inheritance follows), but the rules that compare it with
 * other values skip it. Line numbers stay far below this bit (a file is at
 * most CONFIG_FILE_MAX bytes). */
#define LINE_BAD 0x80000000u

static bool line_is_bad(unsigned line)
{
    return (line & LINE_BAD) != 0;
}

/* ------------------------------------------------------------------------ */
/* Loader state (one per config_parse call, on its stack)                   */

struct cap_stage {
    struct config_capability cap;
    char *affinity; /* owned; `affinity:` as written */
    char *body;     /* owned; `body:` as written */
    bool builtin;
    unsigned map_line;
    unsigned line[FID_COUNT];
};

struct src_stage {
    struct config_source src;
    bool bad;       /* not a map: no rule applies to it */
    char *key_env;  /* owned; name of the variable holding the key */
    char *key_file; /* owned; absolute path of the key file */
    char *accepts;  /* owned; `accepts:` as written */
    char *api;      /* owned; `api:` as written (kind: bedrock) */
    unsigned map_line;
    unsigned line[FID_COUNT];
};

struct app_stage {
    struct config_app app;
    const struct ynode *caps;    /* `capabilities` (the tree outlives validation) */
    const struct ynode *per_cap; /* `per_capability`, resolved once capabilities are known */
    char *token_env;             /* owned; name of the variable holding the token */
    char *token_file;            /* owned; absolute path of the token file */
    bool bad;                    /* not a map: no rule applies to it */
    unsigned map_line;
    unsigned line[FID_COUNT];
};

struct loader {
    const char *name;         /* file name for messages */
    config_report_fn *report; /* may be NULL */
    void *report_arg;
    size_t n_errors;
    char *err;
    size_t errlen;
    struct config *cfg;
    unsigned line[FID_COUNT]; /* top level: listen, server, backend, defaults */
    struct cap_stage *caps;
    size_t n_caps, cap_caps;
    struct src_stage *srcs;
    size_t n_srcs;
    struct app_stage *apps;
    size_t n_apps;
    char path[CONFIG_PATH_MAX];
    size_t path_len;
    /* The list element being walked, for hints: FID_SOURCES with "[3]",
     * FID_CAPABILITIES with ".vision", or FID_NONE. */
    enum fid elem_fid;
    char elem[CONFIG_NAME_MAX + 8];
    struct name_index cap_ix;  /* over caps (validate) */
    struct name_index src_ix;  /* over srcs (validate) */
    struct cap_stage *cur_cap; /* the capability being walked */
};

/* ------------------------------------------------------------------------ */
/* Messages                                                                 */

/* One message being formatted; CONFIG_ERR_MAX bytes hold any of them. */
struct msg {
    char text[CONFIG_ERR_MAX];
    size_t used;
};

static void msg_vappend(struct msg *m, const char *fmt, va_list ap)
{
    if (m->used >= sizeof(m->text) - 1)
        return;
    int k = vsnprintf(m->text + m->used, sizeof(m->text) - m->used, fmt, ap);
    if (k > 0)
        m->used += (size_t)k;
    if (m->used > sizeof(m->text) - 1)
        m->used = sizeof(m->text) - 1;
}

__attribute__((format(printf, 2, 3))) static void msg_append(struct msg *m, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    msg_vappend(m, fmt, ap);
    va_end(ap);
}

/* Reports a finished message: to the report hook, and the first one of the
 * load into the caller's `err`. Returns -EINVAL. */
static int emit(struct loader *l, const struct msg *m)
{
    if (l->n_errors++ == 0 && l->err && l->errlen)
        snprintf(l->err, l->errlen, "%s", m->text);
    if (l->report)
        l->report(l->report_arg, m->text);
    return -EINVAL;
}

/* "NAME[:LINE]: [PATH: ]reason" (LINE_BAD is ignored). Returns -EINVAL so
 * callers can `return fail_at(...)`; the load goes on where it can. */
__attribute__((format(printf, 4, 5))) static int fail_at(struct loader *l, unsigned line,
                                                         const char *path, const char *fmt, ...)
{
    struct msg m = { .used = 0 };
    va_list ap;

    line &= ~LINE_BAD;
    if (line)
        msg_append(&m, "%s:%u: ", l->name, line);
    else
        msg_append(&m, "%s: ", l->name);
    if (path && *path)
        msg_append(&m, "%s: ", path);
    va_start(ap, fmt);
    msg_vappend(&m, fmt, ap);
    va_end(ap);
    return emit(l, &m);
}

/* Same, at the current key path of the walk. */
#define fail_here(l, line, ...) fail_at((l), (line), (l)->path, __VA_ARGS__)

static int fail_nomem(struct loader *l)
{
    fail_at(l, 0, NULL, "out of memory");
    return -ENOMEM;
}

/* Appends ".key" (or "key" at the root) to the key path; returns the length
 * to restore with path_pop. Overlong paths are truncated, never overflowed. */
static size_t path_push_key(struct loader *l, const char *key, size_t len)
{
    size_t old = l->path_len;
    int k = snprintf(l->path + old, sizeof(l->path) - old, "%s%.*s", old ? "." : "",
                     (int)(len > 64 ? 64 : len), key);
    l->path_len = k < 0 ? old : old + (size_t)k;
    if (l->path_len >= sizeof(l->path))
        l->path_len = sizeof(l->path) - 1;
    return old;
}

static size_t path_push_index(struct loader *l, size_t i)
{
    size_t old = l->path_len;
    int k = snprintf(l->path + old, sizeof(l->path) - old, "[%zu]", i);
    l->path_len = k < 0 ? old : old + (size_t)k;
    if (l->path_len >= sizeof(l->path))
        l->path_len = sizeof(l->path) - 1;
    return old;
}

static void path_pop(struct loader *l, size_t old)
{
    l->path_len = old;
    l->path[old] = '\0';
}

/* Prints integral values exactly (1073741824, not 1.07374e+09). */
static const char *fmt_num(char *buf, size_t len, double v)
{
    if (v == floor(v) && fabs(v) < 1e15)
        snprintf(buf, len, "%.0f", v);
    else
        snprintf(buf, len, "%g", v);
    return buf;
}

/* ------------------------------------------------------------------------ */
/* String checks (FT_STR `check` hooks and helpers)                         */

static bool has_ctl(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return true;
    return false;
}

static bool has_space_or_ctl(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s <= 0x20 || *s == 0x7f)
            return true;
    return false;
}

static int check_socket(struct loader *l, const struct ynode *v, char *s)
{
    if (!*s)
        return fail_here(l, v->line, "must not be empty");
    if (strlen(s) >= SUN_PATH_MAX)
        return fail_here(l, v->line, "longer than %zu bytes (the sun_path limit)",
                         SUN_PATH_MAX - 1);
    if (has_ctl(s, strlen(s)))
        return fail_here(l, v->line, "must not contain control characters");
    return 0;
}

/* http:// or https:// followed by a host; trailing '/' are dropped so that
 * base_url + capability path never doubles the slash. */
static int check_http_url(struct loader *l, const struct ynode *v, char *s)
{
    size_t skip = strncasecmp(s, "http://", 7) == 0 ? 7
        : strncasecmp(s, "https://", 8) == 0        ? 8
                                                    : 0;
    if (!skip)
        return fail_here(l, v->line, "must start with http:// or https://");
    if (has_space_or_ctl(s))
        return fail_here(l, v->line, "must not contain spaces or control characters");
    if (s[skip] == '\0' || s[skip] == '/')
        return fail_here(l, v->line, "has no host");
    size_t len = strlen(s);
    if (len >= CONFIG_URL_MAX)
        return fail_here(l, v->line, "longer than %d characters", CONFIG_URL_MAX - 1);
    while (len > skip && s[len - 1] == '/')
        s[--len] = '\0';
    return 0;
}

/* The backend's address syntax (config.h), or NULL until the owner sets
 * it. */
static const struct config_backend_syntax *backend_syntax;

void config_set_backend_syntax(const struct config_backend_syntax *syntax)
{
    backend_syntax = syntax;
}

/* Why `s` is not a usable Redis URL, or NULL. The URL may carry a
 * password: the reason never echoes it. */
static const char *redis_url_problem(const char *s, char *why, size_t whylen)
{
    if (strncmp(s, "redis://", 8) != 0 && strncmp(s, "rediss://", 9) != 0 &&
        strncmp(s, "unix://", 7) != 0)
        return "must start with redis://, rediss:// or unix://";
    if (has_space_or_ctl(s))
        return "must not contain spaces or control characters";
    return backend_syntax ? backend_syntax->url_problem(s, why, whylen) : NULL;
}

static int check_redis_url(struct loader *l, const struct ynode *v, char *s)
{
    char why[200];
    const char *problem = redis_url_problem(s, why, sizeof(why));
    return problem ? fail_here(l, v->line, "%s", problem) : 0;
}

/* An ACL user name, a sentinel master name, a TLS server name: one word. */
static int check_word(struct loader *l, const struct ynode *v, char *s)
{
    if (!*s || strlen(s) > 127)
        return fail_here(l, v->line, "must be 1 to 127 characters");
    if (has_space_or_ctl(s))
        return fail_here(l, v->line, "must not contain spaces or control characters");
    return 0;
}

/* A DNS name as TLS sends it in SNI: letters, digits, '-' and '.', at most
 * 253 characters (an IP address is no SNI: use the URL's host for it). */
static int check_host_name(struct loader *l, const struct ynode *v, char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 253)
        return fail_here(l, v->line, "must be a host name of 1 to 253 characters");
    for (const char *p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '-' && *p != '.')
            return fail_here(l, v->line, "must be a DNS host name (letters, digits, '-', '.')");
    return 0;
}

/* A proxy URL: a scheme libcurl speaks to proxies, a host, no spaces. */
static int check_proxy_url(struct loader *l, const struct ynode *v, char *s)
{
    static const char *const schemes[] = { "http://",    "https://",  "socks4://",
                                           "socks4a://", "socks5://", "socks5h://" };
    size_t skip = 0;
    for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]) && !skip; i++)
        if (strncasecmp(s, schemes[i], strlen(schemes[i])) == 0)
            skip = strlen(schemes[i]);
    if (!skip)
        return fail_here(l, v->line,
                         "must start with http://, https://, socks4://, socks4a://, socks5:// "
                         "or socks5h://");
    if (has_space_or_ctl(s))
        return fail_here(l, v->line, "must not contain spaces or control characters");
    if (strlen(s) >= CONFIG_URL_MAX)
        return fail_here(l, v->line, "longer than %d characters", CONFIG_URL_MAX - 1);
    /* scheme://[user[:password]@]host:port[/]: libcurl would take the
     * rest at the first request only, and then as a failed lookup, with the
     * URL (its credentials too) in the error. */
    const char *a = s + skip;
    size_t alen = strcspn(a, "/?#");
    if (a[alen] != '\0' && strcmp(a + alen, "/") != 0)
        return fail_here(l, v->line,
                         "must be scheme://[user:password@]host:port, without a path or query");
    const char *host = a;
    for (const char *p = a; p < a + alen; p++)
        if (*p == '@')
            host = p + 1;
    size_t hlen = (size_t)(a + alen - host);
    const char *colon = NULL;
    if (hlen > 0 && host[0] == '[') {
        const char *close = memchr(host, ']', hlen);
        if (!close || close == host + 1)
            return fail_here(l, v->line, "has a malformed [IPv6] host");
        colon = close + 1 < host + hlen ? close + 1 : NULL;
        if (colon && *colon != ':')
            return fail_here(l, v->line, "has a malformed [IPv6] host");
    } else {
        for (const char *p = host; p < host + hlen; p++)
            if (*p == ':')
                colon = p;
    }
    if (hlen == 0 || colon == host)
        return fail_here(l, v->line, "has no host");
    if (!colon)
        return fail_here(l, v->line,
                         "needs its port (host:port): without one libcurl would use 1080");
    size_t plen = (size_t)(host + hlen - colon - 1);
    unsigned long port = 0;
    for (size_t i = 1; i <= plen; i++)
        port = isdigit((unsigned char)colon[i]) && port <= 65535
            ? port * 10 + (unsigned)(colon[i] - '0')
            : 65536;
    if (plen == 0 || port == 0 || port > 65535)
        return fail_here(l, v->line, "port must be 1 to 65535");
    return 0;
}

/* A comma-separated list of host names or addresses ("*" = every host). */
static int check_word_list(struct loader *l, const struct ynode *v, char *s)
{
    if (!*s || strlen(s) >= CONFIG_URL_MAX)
        return fail_here(l, v->line, "must be 1 to %d characters", CONFIG_URL_MAX - 1);
    if (has_ctl(s, strlen(s)))
        return fail_here(l, v->line, "must not contain control characters");
    return 0;
}

static int check_prefix(struct loader *l, const struct ynode *v, char *s)
{
    size_t len = strlen(s);
    if (len == 0 || len >= CONFIG_NAME_MAX)
        return fail_here(l, v->line, "must be 1 to %d characters", CONFIG_NAME_MAX - 1);
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("_.:-{}", *s))
            return fail_here(l, v->line, "may contain only letters, digits and _ . : - { }");
    return 0;
}

/* The value is deliberately never quoted: a key pasted here by mistake
 * must not end up in a log. */
static int check_env_name(struct loader *l, const struct ynode *v, char *s)
{
    if (!*s || isdigit((unsigned char)*s) || strlen(s) > 255)
        return fail_here(l, v->line,
                         "must be the name of an environment variable "
                         "([A-Za-z_][A-Za-z0-9_]*), not the key itself");
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_')
            return fail_here(l, v->line,
                             "must be the name of an environment variable "
                             "([A-Za-z_][A-Za-z0-9_]*), not the key itself");
    return 0;
}

static int check_key_path(struct loader *l, const struct ynode *v, char *s)
{
    if (s[0] != '/')
        return fail_here(l, v->line,
                         "must be an absolute path (the daemon's working "
                         "directory is not meaningful)");
    if (has_ctl(s, strlen(s)) || strlen(s) >= PATH_MAX)
        return fail_here(l, v->line, "is not a usable path");
    return 0;
}

static int check_text(struct loader *l, const struct ynode *v, char *s)
{
    if (!*s)
        return fail_here(l, v->line, "must not be empty");
    if (has_ctl(s, strlen(s)))
        return fail_here(l, v->line, "must not contain control characters");
    return 0;
}

/* sources[i].region: an AWS region name ("us-east-1"), part of the host
 * name and of every signature. */
static int check_region(struct loader *l, const struct ynode *v, char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 32 || strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789-") != n)
        return fail_here(l, v->line, "must be an AWS region name (e.g. us-east-1)");
    return 0;
}

/* sources[i].project / location: a Google Cloud project id or location,
 * both parts of the Vertex AI URL. */
static int check_gcp_name(struct loader *l, const struct ynode *v, char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 63 || strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789-") != n)
        return fail_here(l, v->line,
                         "must be lowercase letters, digits and '-' (e.g. my-project, "
                         "us-east5, global)");
    return 0;
}

/* server.currency: a label printed beside every cost, never converted. */
static int check_currency(struct loader *l, const struct ynode *v, char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 16)
        return fail_here(l, v->line, "must be 1 to 16 characters (e.g. USD, EUR)");
    for (const char *p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '_')
            return fail_here(l, v->line, "must be letters, digits or '_' (e.g. USD, EUR)");
    return 0;
}

/* A model name or glob as configured (models.h): printable ASCII without
 * spaces, 1 to MODELS_NAME_MAX - 1 bytes; `*` only in a glob. */
static const char *model_problem(const char *s, char *why, size_t whylen)
{
    size_t n = strlen(s);

    (void)why;
    (void)whylen;
    if (n == 0 || n >= MODELS_NAME_MAX)
        return "must be 1 to 255 bytes";
    for (size_t i = 0; i < n; i++)
        if (s[i] <= ' ' || s[i] > '~')
            return "must be printable ASCII without spaces";
    return NULL;
}

static int check_model(struct loader *l, const struct ynode *v, char *s)
{
    const char *p = model_problem(s, NULL, 0);

    if (!p && models_is_glob(s))
        p = "is the upstream name sent, not a pattern: put globs in serves";
    return p ? fail_here(l, v->line, "%s", p) : 0;
}

static int check_affinity(struct loader *l, const struct ynode *v, char *s)
{
    if (strcmp(s, "task") && strcmp(s, "scope") && strcmp(s, "none"))
        return fail_here(l, v->line, "must be task, scope or none");
    return 0;
}

static int check_body(struct loader *l, const struct ynode *v, char *s)
{
    if (strcmp(s, "json") && strcmp(s, "raw"))
        return fail_here(l, v->line, "must be json or raw");
    return 0;
}

static int walk_methods(struct loader *l, const struct ynode *v);

/* An HTTP field name (RFC 9110 token). */
static bool is_header_name(const char *s)
{
    if (!*s)
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("!#$%&'*+-.^_`|~", *s))
            return false;
    return true;
}

static int check_header_name(struct loader *l, const struct ynode *v, char *s)
{
    if (!is_header_name(s))
        return fail_here(l, v->line,
                         "must be an HTTP header name (letters, digits and "
                         "!#$%%&'*+-.^_`|~)");
    return 0;
}

/* A query parameter name or value, percent-encoded when sent: any
 * printable text. */
static int check_query_text(struct loader *l, const struct ynode *v, char *s)
{
    if (!*s || strlen(s) > 1024)
        return fail_here(l, v->line, "must be 1 to 1024 characters");
    if (has_ctl(s, strlen(s)))
        return fail_here(l, v->line, "must not contain control characters");
    return 0;
}

static int check_name(struct loader *l, unsigned line, const char *s, size_t len)
{
    if (len == 0)
        return fail_here(l, line, "must not be empty");
    if (len >= CONFIG_NAME_MAX)
        return fail_here(l, line, "longer than %d characters", CONFIG_NAME_MAX - 1);
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("_.-", s[i]))
            return fail_here(l, line, "may contain only letters, digits, '_', '.' and '-'");
    return 0;
}

static int check_hostport(struct loader *l, const struct ynode *v, char *s)
{
    char why[160];
    struct config_addr a;

    if (config_parse_addr(s, &a, why, sizeof(why)) < 0)
        return fail_here(l, v->line, "%s", why);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Tables                                                                   */

#define OFF(type, member) offsetof(type, member)
#define END         \
    {               \
        .key = NULL \
    }

#define NUM(k, t, id, o, lo, hi, fl)                                                              \
    {                                                                                             \
        .key = (k), .type = (t), .fid = (id), .off = (o), .min = (lo), .max = (hi), .flags = (fl) \
    }
#define STR(k, id, o, chk)                                                  \
    {                                                                       \
        .key = (k), .type = FT_STR, .fid = (id), .off = (o), .check = (chk) \
    }
#define TYPED(k, t, id, o)                               \
    {                                                    \
        .key = (k), .type = (t), .fid = (id), .off = (o) \
    }
/* A key that is known but forbidden, `text` saying what to write instead. */
#define REJECT(k, id, text)                                       \
    {                                                             \
        .key = (k), .type = FT_REJECT, .fid = (id), .why = (text) \
    }
#define SECTION(k, id, o, table)                                                \
    {                                                                           \
        .key = (k), .type = FT_SECTION, .fid = (id), .off = (o), .sub = (table) \
    }

static const struct field listen_table[] = {
    STR("socket", FID_SOCKET, OFF(struct config, socket_path), check_socket),
    TYPED("mode", FT_MODE, FID_MODE, OFF(struct config, socket_mode)),
    NUM("max_message_bytes", FT_SIZE, FID_MAX_MESSAGE_BYTES, OFF(struct config, max_message_bytes),
        1024, 1073741824.0, 0),
    NUM("max_connections", FT_U32, FID_MAX_CONNECTIONS, OFF(struct config, max_connections), 1,
        1048576, 0),
    NUM("max_inflight_per_connection", FT_U32, FID_MAX_INFLIGHT,
        OFF(struct config, max_inflight_per_connection), 1, 1048576, 0),
    NUM("max_write_queue_bytes", FT_SIZE, FID_MAX_WRITE_QUEUE,
        OFF(struct config, max_write_queue_bytes), 1024, 68719476736.0, 0),
    NUM("max_buffered_input_bytes", FT_SIZE, FID_MAX_BUFFERED_INPUT,
        OFF(struct config, max_buffered_input_bytes), 1024, 68719476736.0, 0),
    NUM("idle_timeout_s", FT_DOUBLE, FID_LISTEN_IDLE_TIMEOUT, OFF(struct config, idle_timeout_s), 0,
        DURATION_MAX_S, 0),
    END
};

static int walk_allowed_origins(struct loader *l, const struct ynode *v);
static int walk_allowed_hosts(struct loader *l, const struct ynode *v);

static const struct field http_table[] = {
    STR("socket", FID_HTTP_SOCKET, OFF(struct config, http_socket), check_socket),
    STR("listen", FID_HTTP_LISTEN, OFF(struct config, http_listen), check_hostport),
    TYPED("allow_remote", FT_BOOL, FID_HTTP_ALLOW_REMOTE, OFF(struct config, http_allow_remote)),
    TYPED("allow_status_remote", FT_BOOL, FID_HTTP_ALLOW_STATUS_REMOTE,
          OFF(struct config, http_allow_status_remote)),
    NUM("max_body_bytes", FT_SIZE, FID_HTTP_MAX_BODY, OFF(struct config, http_max_body_bytes), 1024,
        1073741824.0, 0),
    NUM("max_header_bytes", FT_SIZE, FID_HTTP_MAX_HEADER, OFF(struct config, http_max_header_bytes),
        1024, 1048576, 0),
    NUM("max_connections", FT_U32, FID_HTTP_MAX_CONNECTIONS,
        OFF(struct config, http_max_connections), 1, 1048576, 0),
    NUM("header_timeout_s", FT_DOUBLE, FID_HTTP_HEADER_TIMEOUT,
        OFF(struct config, http_header_timeout_s), 0, 3600, F_MIN_OPEN),
    NUM("body_timeout_s", FT_DOUBLE, FID_HTTP_BODY_TIMEOUT, OFF(struct config, http_body_timeout_s),
        0, 3600, F_MIN_OPEN),
    NUM("keepalive_timeout_s", FT_DOUBLE, FID_HTTP_KEEPALIVE_TIMEOUT,
        OFF(struct config, http_keepalive_timeout_s), 0, 86400, F_MIN_OPEN),
    NUM("send_timeout_s", FT_DOUBLE, FID_HTTP_SEND_TIMEOUT, OFF(struct config, http_send_timeout_s),
        0, 3600, F_MIN_OPEN),
    { .key = "allowed_origins",
      .type = FT_CUSTOM,
      .fid = FID_HTTP_ALLOWED_ORIGINS,
      .walk = walk_allowed_origins },
    { .key = "allowed_hosts",
      .type = FT_CUSTOM,
      .fid = FID_HTTP_ALLOWED_HOSTS,
      .walk = walk_allowed_hosts },
    END
};

static const struct field server_table[] = {
    TYPED("log_level", FT_LOGLEVEL, FID_LOG_LEVEL, OFF(struct config, log_level)),
    NUM("shutdown_grace_s", FT_DOUBLE, FID_SHUTDOWN_GRACE, OFF(struct config, shutdown_grace_s), 0,
        3600, 0),
    TYPED("access_log", FT_BOOL, FID_ACCESS_LOG, OFF(struct config, access_log)),
    TYPED("upstream_client", FT_UPCLIENT, FID_UPSTREAM_CLIENT, OFF(struct config, upstream_client)),
    NUM("dns_ttl_s", FT_U32, FID_DNS_TTL, OFF(struct config, dns_ttl_s), 1, 86400, 0),
    STR("currency", FID_CURRENCY, OFF(struct config, currency), check_currency),
    END
};

static const struct field tasks_table[] = {
    NUM("ttl_s", FT_DOUBLE, FID_TASK_TTL, OFF(struct config, task_ttl_s), 0, DURATION_MAX_S,
        F_MIN_OPEN),
    NUM("max_tasks", FT_U32, FID_MAX_TASKS, OFF(struct config, max_tasks), 1, 10000000, 0), END
};

/* tracing.parent: what a caller's traceparent makes of the call span. */
static int check_trace_parent(struct loader *l, const struct ynode *v, char *s)
{
    if (strcmp(s, "child") != 0 && strcmp(s, "link") != 0)
        return fail_here(l, v->line, "must be child or link");
    return 0;
}

#define TR(member) OFF(struct config, tracing.member)
static const struct field tracing_table[] = {
    TYPED("enabled", FT_BOOL, FID_TRACING_ENABLED, TR(enabled)),
    STR("endpoint", FID_TRACING_ENDPOINT, TR(endpoint), check_http_url),
    NUM("sampler_ratio", FT_DOUBLE, FID_TRACING_RATIO, TR(sampler_ratio), 0, 1, 0),
    STR("parent", FID_TRACING_PARENT, TR(parent), check_trace_parent),
    STR("service_name", FID_TRACING_SERVICE, TR(service_name), check_word),
    NUM("max_queue_spans", FT_U32, FID_TRACING_QUEUE, TR(max_queue_spans), 1, 1048576, 0),
    NUM("max_batch_spans", FT_U32, FID_TRACING_BATCH, TR(max_batch_spans), 1, 65536, 0),
    NUM("export_interval_s", FT_DOUBLE, FID_TRACING_INTERVAL, TR(export_interval_s), 0, 3600,
        F_MIN_OPEN),
    NUM("export_timeout_s", FT_DOUBLE, FID_TRACING_TIMEOUT, TR(timeout_s), 0, 3600, F_MIN_OPEN),
    NUM("max_retries", FT_U32, FID_TRACING_RETRIES, TR(max_retries), 0, 100, 0),
    END
};
#undef TR
static const struct field responses_table[] = {
    NUM("remember_s", FT_DOUBLE, FID_RESP_REMEMBER, OFF(struct config, responses_remember_s), 0,
        DURATION_MAX_S, 0),
    NUM("max_remembered", FT_U32, FID_RESP_MAX, OFF(struct config, responses_max_remembered), 1,
        100000000, 0),
    END
};

/* The response cache (docs/CONFIG.md, "cache"): the memory tier's cap. */
static const struct field cache_table[] = { NUM("max_bytes", FT_SIZE, FID_CACHE_MAX_BYTES,
                                                OFF(struct config, cache_max_bytes), 0,
                                                68719476736.0, 0),
                                            END };

/* A capability's cache: on when ttl_s > 0 (relative to struct config_cache). */
static const struct field cap_cache_table[] = {
    NUM("ttl_s", FT_DOUBLE, FID_CACHE_TTL, OFF(struct config_cache, ttl_s), 0, DURATION_MAX_S, 0),
    NUM("max_entry_bytes", FT_SIZE, FID_CACHE_MAX_ENTRY, OFF(struct config_cache, max_entry_bytes),
        1, 1073741824.0, 0),
    TYPED("shared", FT_BOOL, FID_CACHE_SHARED, OFF(struct config_cache, shared)),
    NUM("lock_s", FT_DOUBLE, FID_CACHE_LOCK, OFF(struct config_cache, lock_s), 0,
        CONFIG_CACHE_LOCK_MAX_S, F_MIN_OPEN),
    END
};

static int walk_sentinels(struct loader *l, const struct ynode *v);
static int walk_cluster(struct loader *l, const struct ynode *v);

static const struct field backend_tls_table[] = {
    STR("ca_file", FID_TLS_CA_FILE, OFF(struct config, redis_tls_ca_file), check_key_path),
    STR("cert_file", FID_TLS_CERT_FILE, OFF(struct config, redis_tls_cert_file), check_key_path),
    STR("key_file", FID_TLS_KEY_FILE, OFF(struct config, redis_tls_key_file), check_key_path),
    STR("server_name", FID_TLS_SERVER_NAME, OFF(struct config, redis_tls_server_name), check_word),
    END
};

static const struct field backend_table[] = {
    TYPED("kind", FT_BACKEND, FID_KIND, OFF(struct config, backend)),
    STR("url", FID_URL, OFF(struct config, redis_url), check_redis_url),
    STR("url_env", FID_URL_ENV, OFF(struct config, redis_url_env), check_env_name),
    STR("prefix", FID_PREFIX, OFF(struct config, redis_prefix), check_prefix),
    NUM("command_timeout_s", FT_DOUBLE, FID_COMMAND_TIMEOUT,
        OFF(struct config, redis_command_timeout_s), 0, 60, F_MIN_OPEN),
    NUM("lease_ttl_s", FT_DOUBLE, FID_LEASE_TTL, OFF(struct config, redis_lease_ttl_s), 0, 86400,
        F_MIN_OPEN),
    { .key = "sentinels", .type = FT_CUSTOM, .fid = FID_SENTINELS, .walk = walk_sentinels },
    { .key = "cluster", .type = FT_CUSTOM, .fid = FID_CLUSTER, .walk = walk_cluster },
    STR("master_name", FID_MASTER_NAME, OFF(struct config, redis_master_name), check_word),
    NUM("db", FT_U32, FID_DB, OFF(struct config, redis_db), 0, INT32_MAX, 0),
    STR("username", FID_USERNAME, OFF(struct config, redis_username), check_word),
    STR("password_env", FID_PASSWORD_ENV, OFF(struct config, redis_password_env), check_env_name),
    STR("password_file", FID_PASSWORD_FILE, OFF(struct config, redis_password_file),
        check_key_path),
    STR("sentinel_username", FID_SENTINEL_USERNAME, OFF(struct config, redis_sentinel_username),
        check_word),
    STR("sentinel_password_env", FID_SENTINEL_PASSWORD_ENV,
        OFF(struct config, redis_sentinel_password_env), check_env_name),
    STR("sentinel_password_file", FID_SENTINEL_PASSWORD_FILE,
        OFF(struct config, redis_sentinel_password_file), check_key_path),
    SECTION("tls", FID_TLS, 0, backend_tls_table),
    END
};


/* Offsets relative to struct config_policy; included by defaults and
 * capabilities. policy_inherit() and check_source_policy() iterate this
 * table. */
static const struct field policy_table[] = {
    NUM("max_attempts", FT_U32, FID_MAX_ATTEMPTS, OFF(struct config_policy, max_attempts), 1, 1000,
        0),
    NUM("stall_window_s", FT_DOUBLE, FID_STALL_WINDOW, OFF(struct config_policy, stall_window_s), 0,
        DURATION_MAX_S, F_MIN_OPEN),
    NUM("backoff_base_s", FT_DOUBLE, FID_BACKOFF_BASE, OFF(struct config_policy, backoff_base_s), 0,
        DURATION_MAX_S, F_MIN_OPEN),
    NUM("backoff_max_s", FT_DOUBLE, FID_BACKOFF_MAX, OFF(struct config_policy, backoff_max_s), 0,
        DURATION_MAX_S, F_MIN_OPEN),
    NUM("poll_interval_s", FT_DOUBLE, FID_POLL_INTERVAL, OFF(struct config_policy, poll_interval_s),
        0, 3600, F_MIN_OPEN),
    NUM("node_timeout_s", FT_DOUBLE, FID_NODE_TIMEOUT, OFF(struct config_policy, node_timeout_s), 0,
        DURATION_MAX_S, F_MIN_OPEN),
    END
};

static const struct field capability_table[] = {
    TYPED("exempt_429", FT_BOOL, FID_EXEMPT_429, OFF(struct cap_stage, cap.exempt_429)),
    TYPED("path", FT_UPATH, FID_PATH, OFF(struct cap_stage, cap.path)),
    STR("affinity", FID_AFFINITY, OFF(struct cap_stage, affinity), check_affinity),
    STR("body", FID_CAP_BODY, OFF(struct cap_stage, body), check_body),
    { .key = "methods", .type = FT_CUSTOM, .fid = FID_CAP_METHODS, .walk = walk_methods },
    NUM("max_body_bytes", FT_SIZE, FID_CAP_MAX_BODY, OFF(struct cap_stage, cap.max_body_bytes), 1,
        1073741824.0, 0),
    NUM("budget_output_tokens", FT_U32, FID_BUDGET_OUTPUT,
        OFF(struct cap_stage, cap.budget_output_tokens), 0, 1e9, 0),
    SECTION("cache", FID_CACHE, OFF(struct cap_stage, cap.cache), cap_cache_table),
    { .key = "policy",
      .type = FT_INCLUDE,
      .off = OFF(struct cap_stage, cap.policy),
      .sub = policy_table },
    END
};

static const struct field aimd_table[] = {
    NUM("initial", FT_DOUBLE, FID_AIMD_INITIAL, OFF(struct config_aimd, initial), 1, 1e6, 0),
    NUM("min", FT_DOUBLE, FID_AIMD_MIN, OFF(struct config_aimd, min), 1, 1e6, 0),
    NUM("increase", FT_DOUBLE, FID_AIMD_INCREASE, OFF(struct config_aimd, increase), 0, 1e6,
        F_MIN_OPEN),
    NUM("decrease", FT_DOUBLE, FID_AIMD_DECREASE, OFF(struct config_aimd, decrease), 0, 1,
        F_MIN_OPEN | F_MAX_OPEN),
    END
};

static const struct field breaker_table[] = {
    NUM("failures", FT_U32, FID_BREAKER_FAILURES, OFF(struct config_breaker, failures), 1, 1e6, 0),
    NUM("cooldown_s", FT_DOUBLE, FID_BREAKER_COOLDOWN, OFF(struct config_breaker, cooldown_s), 0,
        DURATION_MAX_S, F_MIN_OPEN),
    NUM("max_cooldown_s", FT_DOUBLE, FID_BREAKER_MAX_COOLDOWN,
        OFF(struct config_breaker, max_cooldown_s), 0, DURATION_MAX_S, F_MIN_OPEN),
    END
};

static const struct field limits_table[] = {
    NUM("rpm", FT_U64, FID_RPM, OFF(struct config_limits, rpm), 0, (double)INT64_MAX, 0),
    NUM("tpm", FT_U64, FID_TPM, OFF(struct config_limits, tpm), 0, (double)INT64_MAX, 0),
    NUM("daily_tokens", FT_U64, FID_DAILY_TOKENS, OFF(struct config_limits, daily_tokens), 0,
        (double)INT64_MAX, 0),
    NUM("window_s", FT_DOUBLE, FID_WINDOW, OFF(struct config_limits, window_s), 0, 86400,
        F_MIN_OPEN),
    END
};

/* sources[i].prices, per million tokens of each class (cost.h). */
#define PRICE(k, id, c) \
    NUM(k, FT_DOUBLE, id, OFF(struct cost_prices, per_mtok) + (c) * sizeof(double), 0, 1e6, 0)
static const struct field prices_table[] = {
    PRICE("input", FID_PRICE_INPUT, COST_INPUT),
    PRICE("cached_input", FID_PRICE_CACHED, COST_CACHED),
    PRICE("cache_write", FID_PRICE_CACHE_WRITE, COST_CACHE_WRITE),
    PRICE("output", FID_PRICE_OUTPUT, COST_OUTPUT),
    PRICE("reasoning", FID_PRICE_REASONING, COST_REASONING),
    END
};
#undef PRICE

static int walk_budget_tz(struct loader *l, const struct ynode *v);

/* sources[i].budget and apps[i].budget, in currency (budget.h). */
#define BUDGET(k, id, w)                                                                    \
    NUM(k, FT_DOUBLE, id, OFF(struct budget_limits, limit) + (w) * sizeof(double), 0, 1e12, \
        F_MIN_OPEN)
static const struct field budget_table[] = {
    BUDGET("daily", FID_BUDGET_DAILY, BUDGET_DAILY),
    BUDGET("monthly", FID_BUDGET_MONTHLY, BUDGET_MONTHLY),
    BUDGET("total", FID_BUDGET_TOTAL, BUDGET_TOTAL),
    { .key = "timezone", .type = FT_CUSTOM, .fid = FID_BUDGET_TZ, .walk = walk_budget_tz },
    END
};
#undef BUDGET

/* A source's limits: the shared ones, and the input / output split. */
static const struct field source_limits_table[] = {
    { .key = "limits", .type = FT_INCLUDE, .sub = limits_table },
    NUM("itpm", FT_U64, FID_ITPM, OFF(struct config_limits, itpm), 0, (double)INT64_MAX, 0),
    NUM("otpm", FT_U64, FID_OTPM, OFF(struct config_limits, otpm), 0, (double)INT64_MAX, 0),
    TYPED("cached_input_counts", FT_BOOL, FID_CACHED_INPUT,
          OFF(struct config_limits, cached_input_counts)),
    END
};

/* An app's own limits: the shared ones, and the input / output split
 * (whether cache reads count is the source's rule). */
static const struct field app_own_limits_table[] = {
    { .key = "limits", .type = FT_INCLUDE, .sub = limits_table },
    NUM("itpm", FT_U64, FID_ITPM, OFF(struct config_limits, itpm), 0, (double)INT64_MAX, 0),
    NUM("otpm", FT_U64, FID_OTPM, OFF(struct config_limits, otpm), 0, (double)INT64_MAX, 0),
    END
};

static const struct field pacer_table[] = {
    NUM("min_interval_ms", FT_U32, FID_PACER_MIN_INTERVAL, 0, 0, 86400000, 0), END
};

/* The policy keys again, as they appear in a source: known (so the message
 * is not "unknown key") but refused by check_source_policy(). A call's
 * budgets are taken from its capability only (governor_policy()), because one
 * call may try every source of its capability; a per-source value would be
 * silently ignored. Keep in step with policy_table (test_config checks every
 * key). */
#define MISPLACED(k, id)                              \
    {                                                 \
        .key = (k), .type = FT_MISPLACED, .fid = (id) \
    }
static const struct field source_policy_table[] = { MISPLACED("max_attempts", FID_MAX_ATTEMPTS),
                                                    MISPLACED("stall_window_s", FID_STALL_WINDOW),
                                                    MISPLACED("backoff_base_s", FID_BACKOFF_BASE),
                                                    MISPLACED("backoff_max_s", FID_BACKOFF_MAX),
                                                    MISPLACED("poll_interval_s", FID_POLL_INTERVAL),
                                                    MISPLACED("node_timeout_s", FID_NODE_TIMEOUT),
                                                    END };
#undef MISPLACED

static int walk_headers(struct loader *l, const struct ynode *v);
static int walk_query(struct loader *l, const struct ynode *v);
static int walk_serves(struct loader *l, const struct ynode *v);
static int walk_token_command(struct loader *l, const struct ynode *v);
static int walk_app_models(struct loader *l, const struct ynode *v);

#define SRC(m) OFF(struct src_stage, src.m)
static const struct field source_tls_table[] = {
    STR("ca_file", FID_TLS_CA_FILE, SRC(tls.ca_file), check_key_path),
    STR("cert_file", FID_TLS_CERT_FILE, SRC(tls.cert_file), check_key_path),
    STR("key_file", FID_TLS_KEY_FILE, SRC(tls.key_file), check_key_path),
    STR("server_name", FID_TLS_SERVER_NAME, SRC(tls.server_name), check_host_name), END
};

static const struct field source_table[] = {
    TYPED("name", FT_NAME, FID_NAME, SRC(name)),
    TYPED("capability", FT_NAME, FID_CAPABILITY, SRC(capability)),
    STR("base_url", FID_BASE_URL, SRC(base_url), check_http_url),
    REJECT("api_key", FID_API_KEY,
           "inline API keys are not accepted; name an environment variable "
           "with api_key_env or a file with api_key_file"),
    STR("api_key_env", FID_API_KEY_ENV, OFF(struct src_stage, key_env), check_env_name),
    STR("api_key_file", FID_API_KEY_FILE, OFF(struct src_stage, key_file), check_key_path),
    STR("model", FID_MODEL, SRC(model), check_model),
    { .key = "serves", .type = FT_CUSTOM, .fid = FID_SERVES, .walk = walk_serves },
    NUM("priority", FT_I32, FID_PRIORITY, SRC(priority), -1e6, 1e6, 0),
    NUM("weight", FT_DOUBLE, FID_WEIGHT, SRC(weight), 0, 1e6, F_MIN_OPEN),
    NUM("timeout_s", FT_DOUBLE, FID_TIMEOUT, SRC(timeout_s), 0, DURATION_MAX_S, F_MIN_OPEN),
    NUM("connect_timeout_s", FT_DOUBLE, FID_CONNECT_TIMEOUT, SRC(connect_timeout_s), 0,
        DURATION_MAX_S, F_MIN_OPEN),
    NUM("ttft_timeout_s", FT_DOUBLE, FID_TTFT_TIMEOUT, SRC(ttft_timeout_s), 0, DURATION_MAX_S,
        F_MIN_OPEN),
    NUM("idle_timeout_s", FT_DOUBLE, FID_IDLE_TIMEOUT, SRC(idle_timeout_s), 0, DURATION_MAX_S,
        F_MIN_OPEN),
    NUM("max_concurrency", FT_U32, FID_MAX_CONCURRENCY, SRC(max_concurrency), 1, 1e6, 0),
    SECTION("aimd", FID_AIMD, SRC(aimd), aimd_table),
    SECTION("breaker", FID_BREAKER, SRC(breaker), breaker_table),
    SECTION("limits", FID_LIMITS, SRC(limits), source_limits_table),
    SECTION("pacer", FID_PACER, SRC(pacer_min_interval_ms), pacer_table),
    SECTION("prices", FID_PRICES, SRC(prices), prices_table),
    SECTION("budget", FID_BUDGET, SRC(budget), budget_table),
    { .key = "policy", .type = FT_INCLUDE, .sub = source_policy_table },
    TYPED("kind", FT_DIALECT, FID_SRC_KIND, SRC(kind)),
    STR("api_version", FID_API_VERSION, SRC(api_version), check_query_text),
    STR("anthropic_version", FID_ANTHROPIC_VERSION, SRC(anthropic_version), check_text),
    STR("region", FID_REGION, SRC(aws.region), check_region),
    STR("api", FID_BEDROCK_API, OFF(struct src_stage, api), check_text),
    STR("project", FID_PROJECT, SRC(vertex.project), check_gcp_name),
    STR("location", FID_LOCATION, SRC(vertex.location), check_gcp_name),
    { .key = "token_command",
      .type = FT_CUSTOM,
      .fid = FID_TOKEN_COMMAND,
      .walk = walk_token_command },
    STR("token_file", FID_TOKEN_FILE, SRC(vertex.creds.token_file), check_key_path),
    STR("auth_header", FID_AUTH_HEADER, SRC(auth_header), check_header_name),
    STR("auth_query", FID_AUTH_QUERY, SRC(auth_query), check_query_text),
    { .key = "headers", .type = FT_CUSTOM, .fid = FID_HEADERS, .walk = walk_headers },
    { .key = "query", .type = FT_CUSTOM, .fid = FID_QUERY, .walk = walk_query },
    TYPED("stream_usage", FT_BOOL, FID_STREAM_USAGE, SRC(stream_usage)),
    STR("accepts", FID_ACCEPTS, OFF(struct src_stage, accepts), check_text),
    SECTION("tls", FID_TLS, 0, source_tls_table),
    STR("proxy", FID_PROXY, SRC(proxy), check_proxy_url),
    STR("no_proxy", FID_NO_PROXY, SRC(no_proxy), check_word_list),
    END
};
#undef SRC

#define APP(m) OFF(struct app_stage, app.m)
static const struct field app_table[] = {
    TYPED("name", FT_NAME, FID_NAME, APP(name)),
    TYPED("uids", FT_IDS, FID_UIDS, APP(uids)),
    TYPED("gids", FT_IDS, FID_GIDS, APP(gids)),
    TYPED("allow_declared", FT_BOOL, FID_ALLOW_DECLARED, APP(allow_declared)),
    TYPED("admin", FT_BOOL, FID_ADMIN, APP(admin)),
    NUM("weight", FT_DOUBLE, FID_WEIGHT, APP(weight), 0, 1e6, F_MIN_OPEN),
    NUM("max_concurrency", FT_U32, FID_MAX_CONCURRENCY, APP(max_concurrency), 1, 1e6, 0),
    NUM("max_tasks", FT_U32, FID_MAX_TASKS, APP(max_tasks), 1, 10000000, 0),
    SECTION("limits", FID_LIMITS, APP(limits), app_own_limits_table),
    SECTION("budget", FID_BUDGET, APP(budget), budget_table),
    TYPED("capabilities", FT_NODE, FID_APP_CAPS, OFF(struct app_stage, caps)),
    REJECT("token", FID_APP_TOKEN,
           "a token in the configuration file is readable by whoever reads the file; name "
           "an environment variable with token_env or a file with token_file"),
    STR("token_env", FID_APP_TOKEN_ENV, OFF(struct app_stage, token_env), check_env_name),
    STR("token_file", FID_APP_TOKEN_FILE, OFF(struct app_stage, token_file), check_key_path),
    TYPED("per_capability", FT_NODE, FID_APP_PER_CAP, OFF(struct app_stage, per_cap)),
    { .key = "models", .type = FT_CUSTOM, .fid = FID_APP_MODELS, .walk = walk_app_models },
    END
};
#undef APP

/* apps[i].per_capability.NAME */
static const struct field app_limits_table[] = { NUM("max_concurrency", FT_U32, FID_MAX_CONCURRENCY,
                                                     OFF(struct config_app_limits, max_concurrency),
                                                     1, 1e6, 0),
                                                 { .key = "limits",
                                                   .type = FT_INCLUDE,
                                                   .off = OFF(struct config_app_limits, limits),
                                                   .sub = limits_table },
                                                 END };

static int walk_capabilities(struct loader *l, const struct ynode *v);
static int walk_sources(struct loader *l, const struct ynode *v);
static int walk_apps(struct loader *l, const struct ynode *v);

static const struct field top_table[] = { SECTION("listen", FID_LISTEN, 0, listen_table),
                                          SECTION("server", FID_SERVER, 0, server_table),
                                          SECTION("backend", FID_BACKEND, 0, backend_table),
                                          SECTION("tasks", FID_TASKS, 0, tasks_table),
                                          SECTION("tracing", FID_TRACING, 0, tracing_table),
                                          SECTION("responses", FID_RESPONSES, 0, responses_table),
                                          SECTION("cache", FID_CACHE, 0, cache_table),
                                          SECTION("http", FID_HTTP, 0, http_table),
                                          SECTION("defaults", FID_DEFAULTS,
                                                  OFF(struct config, defaults), policy_table),
                                          { .key = "capabilities",
                                            .type = FT_CUSTOM,
                                            .fid = FID_CAPABILITIES,
                                            .walk = walk_capabilities,
                                            .sub = capability_table,
                                            .each = ".NAME" },
                                          { .key = "sources",
                                            .type = FT_CUSTOM,
                                            .fid = FID_SOURCES,
                                            .walk = walk_sources,
                                            .sub = source_table,
                                            .each = "[i]" },
                                          { .key = "apps",
                                            .type = FT_CUSTOM,
                                            .fid = FID_APPS,
                                            .walk = walk_apps,
                                            .sub = app_table,
                                            .each = "[i]" },
                                          END };

/* ------------------------------------------------------------------------ */
/* Defaults                                                                 */

static const struct {
    const char *name;
    bool exempt_429;
    const char *path;
} builtin_caps[] = {
    { "chat", true, "/chat/completions" },
    { "embedding", false, "/embeddings" },
    { "ocr", false, "/ocr" },
    { "responses", true, "/responses" },
};
#define N_BUILTIN_CAPS (sizeof(builtin_caps) / sizeof(builtin_caps[0]))

static int config_set_defaults(struct config *cfg)
{
    cfg->socket_path = strdup("/run/polygw/polygw.sock");
    cfg->redis_prefix = strdup("polygw");
    cfg->currency = strdup("USD");
    if (!cfg->socket_path || !cfg->redis_prefix || !cfg->currency)
        return -ENOMEM;
    cfg->socket_mode = 0660;
    cfg->max_message_bytes = 16777216;
    cfg->max_connections = 1024;
    cfg->max_inflight_per_connection = 1024;
    cfg->max_write_queue_bytes = 0;    /* 2 x max_message_bytes, in validate */
    cfg->max_buffered_input_bytes = 0; /* 4 x max_message_bytes, in validate */
    cfg->idle_timeout_s = 0;           /* off */
    cfg->log_level = LOG_INFO;
    cfg->shutdown_grace_s = 10;
    cfg->dns_ttl_s = 60;
    cfg->access_log = true;
    cfg->task_ttl_s = 86400;
    cfg->max_tasks = 65536;
    cfg->responses_remember_s = 30 * 86400.0;
    cfg->cache_max_bytes = 64u * 1024 * 1024;
    cfg->responses_max_remembered = 100000;
    cfg->backend = BACKEND_MEMORY;
    cfg->redis_command_timeout_s = 1;
    cfg->redis_lease_ttl_s = 30;
    cfg->http_max_body_bytes = 16777216;
    cfg->http_max_header_bytes = 32768;
    cfg->http_max_connections = 1024;
    cfg->http_header_timeout_s = 10;
    cfg->http_body_timeout_s = 60;
    cfg->http_keepalive_timeout_s = 75;
    cfg->http_send_timeout_s = 60;
    cfg->tracing = (struct config_tracing){
        .sampler_ratio = -1,
        .max_queue_spans = 2048,
        .max_batch_spans = 512,
        .export_interval_s = 5,
        .timeout_s = 0, /* not given: the environment's, else 10 */
        .max_retries = 3,
    };
    cfg->defaults = (struct config_policy){
        .max_attempts = 3,
        .stall_window_s = 300,
        .backoff_base_s = 2,
        .backoff_max_s = 60,
        .poll_interval_s = 1,
        .node_timeout_s = 600,
    };
    return 0;
}

static void source_set_defaults(struct config_source *s)
{
    s->priority = 0;
    s->weight = 1;
    s->timeout_s = 300;
    s->connect_timeout_s = 10;
    s->ttft_timeout_s = 60;
    s->idle_timeout_s = 60;
    s->max_concurrency = 16;
    s->aimd = (struct config_aimd){ .initial = 4, .min = 1, .increase = 1, .decrease = 0.5 };
    s->breaker = (struct config_breaker){ .failures = 5, .cooldown_s = 30, .max_cooldown_s = 300 };
    s->limits.window_s = 60;
    s->kind = DIALECT_OPENAI;
    s->stream_usage = true;
}

static void source_fini(struct config_source *s)
{
    if (s->api_key) {
        explicit_bzero(s->api_key, strlen(s->api_key));
        free(s->api_key);
    }
    free(s->base_url);
    free(s->model);
    for (size_t i = 0; i < s->n_serves; i++)
        free(s->serves[i]);
    free(s->serves);
    free(s->api_key_file);
    free(s->api_version);
    free(s->anthropic_version);
    aws_creds_clear(&s->aws);
    free(s->aws.region);
    gcp_creds_clear(&s->vertex.creds);
    free(s->vertex.project);
    free(s->vertex.location);
    free(s->auth_header);
    free(s->auth_query);
    free(s->tls.ca_file);
    free(s->tls.cert_file);
    free(s->tls.key_file);
    free(s->tls.server_name);
    free(s->proxy);
    free(s->no_proxy);
    for (size_t i = 0; i < s->n_headers; i++) {
        struct config_header *h = &s->headers[i];
        if (h->value)
            explicit_bzero(h->value, strlen(h->value));
        free(h->name);
        free(h->value);
        free(h->value_env);
        free(h->value_file);
    }
    free(s->headers);
    for (size_t i = 0; i < s->n_query; i++) {
        free(s->query[i].name);
        free(s->query[i].value);
    }
    free(s->query);
    for (size_t i = 0; s->req_headers && s->req_headers[i]; i++) {
        explicit_bzero(s->req_headers[i], strlen(s->req_headers[i]));
        free(s->req_headers[i]);
    }
    free(s->req_headers);
    if (s->req_query) {
        explicit_bzero(s->req_query, strlen(s->req_query));
        free(s->req_query);
    }
    memset(s, 0, sizeof(*s));
}

/* ------------------------------------------------------------------------ */
/* Walk                                                                     */

static const struct field *field_find(const struct field *t, const char *key, size_t len,
                                      size_t *off)
{
    for (; t->key; t++) {
        if (t->type == FT_INCLUDE) {
            size_t sub_off = 0;
            const struct field *f = field_find(t->sub, key, len, &sub_off);
            if (f) {
                *off = t->off + sub_off;
                return f;
            }
        } else if (strlen(t->key) == len && memcmp(t->key, key, len) == 0) {
            *off = t->off;
            return t;
        }
    }
    return NULL;
}

static int fail_type(struct loader *l, const struct ynode *v, const char *expected)
{
    return fail_here(l, v->line, "expected %s, got %s", expected, ynode_what(v));
}

static int fail_range(struct loader *l, const struct ynode *v, const struct field *f)
{
    char lo[32], hi[32];
    fmt_num(lo, sizeof(lo), f->min);
    fmt_num(hi, sizeof(hi), f->max);
    /* Small bounded ranges read best as an interval; large upper bounds are
     * sanity caps, so name only the side that was crossed. */
    if (f->max < 1e6)
        return fail_here(l, v->line, "must be in %c%s, %s%c, got %s",
                         f->flags & F_MIN_OPEN ? '(' : '[', lo, hi,
                         f->flags & F_MAX_OPEN ? ')' : ']', v->text);
    double d = 0;
    ynode_float(v, &d);
    if (d < f->min || ((f->flags & F_MIN_OPEN) && d == f->min))
        return fail_here(l, v->line, "must be %s %s, got %s",
                         f->flags & F_MIN_OPEN ? ">" : ">=", lo, v->text);
    return fail_here(l, v->line, "must be %s %s, got %s", f->flags & F_MAX_OPEN ? "<" : "<=", hi,
                     v->text);
}

static bool in_range(const struct field *f, double d)
{
    if (d < f->min || d > f->max)
        return false;
    if ((f->flags & F_MIN_OPEN) && d == f->min)
        return false;
    if ((f->flags & F_MAX_OPEN) && d == f->max)
        return false;
    return true;
}

/* A string-typed value: any non-null scalar, taken as written. */
static int get_string(struct loader *l, const struct ynode *v, const char **s)
{
    if (v->kind != YN_SCALAR)
        return fail_type(l, v, "a string");
    if (strlen(v->text) != v->len)
        return fail_here(l, v->line, "must not contain NUL characters");
    *s = v->text;
    return 0;
}

static int parse_mode(struct loader *l, const struct ynode *v, uint32_t *out)
{
    const char *s;
    int rc;

    /* Always octal digits, like chmod(1): "0660", 0660, 660 and 0o660 are
     * the same mode. Quoting is recommended (YAML 1.1 tools read a plain
     * 0660 as octal, YAML 1.2 tools as decimal 660). */
    if ((rc = get_string(l, v, &s)) < 0)
        return rc;
    if (strncmp(s, "0o", 2) == 0)
        s += 2;
    size_t len = strlen(s);
    if (len == 0 || len > 4 || strspn(s, "01234567") != len)
        return fail_here(l, v->line, "must be an octal permission mode such as \"0660\"");
    unsigned long m = strtoul(s, NULL, 8);
    if (m > 0777)
        return fail_here(l, v->line,
                         "must be at most 0777 (no setuid, setgid or sticky bits), "
                         "got %s",
                         v->text);
    if (m & 0002)
        return fail_here(l, v->line,
                         "must not be writable by others (%s would let any local "
                         "user spend this host's API keys); use group permissions",
                         v->text);
    *out = (uint32_t)m;
    return 0;
}

static int walk_map(struct loader *l, const struct ynode *map, const struct field *table,
                    char *base, unsigned *lines);

static int set_field(struct loader *l, const struct field *f, char *slot, const struct ynode *key,
                     const struct ynode *v, unsigned *lines)
{
    const char *s;
    int64_t i;
    double d;
    int b, rc;

    if (f->type == FT_REJECT)
        return fail_here(l, key->line, "%s", f->why);
    if (f->type == FT_MISPLACED) {
        lines[f->fid] = key->line;
        return 0;
    }
    if (f->type == FT_CUSTOM) {
        if ((rc = f->walk(l, v)) == 0)
            lines[f->fid] = v->line;
        return rc;
    }
    /* An empty value (null) means "not set": the default or the inherited
     * value stays. Documented in CONFIG.md. */
    if (ynode_is_null(v))
        return 0;

    switch (f->type) {
    case FT_SECTION:
        if (v->kind != YN_MAP)
            return fail_type(l, v, "a map");
        if ((rc = walk_map(l, v, f->sub, slot, lines)) < 0)
            return rc;
        break;
    case FT_BOOL:
        if ((b = ynode_bool(v)) < 0)
            return fail_type(l, v, "a boolean (true or false)");
        *(bool *)slot = b;
        break;
    case FT_U32:
    case FT_I32:
    case FT_U64:
    case FT_SIZE:
        rc = ynode_int(v, &i);
        if (rc == 0)
            return fail_type(l, v, "an integer");
        if (rc < 0 || !in_range(f, (double)i))
            return fail_range(l, v, f);
        if (f->type == FT_U32)
            *(uint32_t *)slot = (uint32_t)i;
        else if (f->type == FT_I32)
            *(int32_t *)slot = (int32_t)i;
        else if (f->type == FT_U64)
            *(uint64_t *)slot = (uint64_t)i;
        else
            *(size_t *)slot = (size_t)i;
        break;
    case FT_DOUBLE:
        if (!ynode_float(v, &d))
            return fail_type(l, v, "a number");
        if (!isfinite(d))
            return fail_here(l, v->line, "must be a finite number");
        if (!in_range(f, d))
            return fail_range(l, v, f);
        *(double *)slot = d;
        break;
    case FT_STR: {
        char **dst = (char **)slot;
        if ((rc = get_string(l, v, &s)) < 0)
            return rc;
        char *copy = strdup(s);
        if (!copy)
            return fail_nomem(l);
        free(*dst);
        *dst = copy;
        if (f->check && (rc = f->check(l, v, copy)) < 0)
            return rc;
        break;
    }
    case FT_NAME:
        if ((rc = get_string(l, v, &s)) < 0)
            return rc;
        if ((rc = check_name(l, v->line, s, v->len)) < 0)
            return rc;
        memcpy(slot, s, v->len + 1);
        break;
    case FT_UPATH:
        if ((rc = get_string(l, v, &s)) < 0)
            return rc;
        if (s[0] != '/')
            return fail_here(l, v->line, "must start with '/'");
        if (v->len >= sizeof(((struct config_capability *)0)->path))
            return fail_here(l, v->line, "longer than %zu characters",
                             sizeof(((struct config_capability *)0)->path) - 1);
        if (has_space_or_ctl(s))
            return fail_here(l, v->line, "must not contain spaces or control characters");
        memcpy(slot, s, v->len + 1);
        break;
    case FT_MODE:
        if ((rc = parse_mode(l, v, (uint32_t *)slot)) < 0)
            return rc;
        break;
    case FT_LOGLEVEL: {
        if ((rc = get_string(l, v, &s)) < 0)
            return rc;
        int lv = config_parse_log_level(s);
        if (lv < 0)
            return fail_here(l, v->line, "must be one of debug, info, warn, error");
        *(enum log_level *)slot = (enum log_level)lv;
        break;
    }
    case FT_BACKEND:
        if ((rc = get_string(l, v, &s)) < 0)
            return rc;
        if (strcmp(s, "memory") == 0)
            *(enum backend_kind *)slot = BACKEND_MEMORY;
        else if (strcmp(s, "redis") == 0)
            *(enum backend_kind *)slot = BACKEND_REDIS;
        else
            return fail_here(l, v->line, "must be memory or redis");
        break;
    case FT_UPCLIENT:
        if ((rc = get_string(l, v, &s)) < 0)
            return rc;
        if (strcmp(s, "auto") == 0)
            *(enum upstream_client *)slot = UPSTREAM_CLIENT_AUTO;
        else if (strcmp(s, "libcurl") == 0)
            *(enum upstream_client *)slot = UPSTREAM_CLIENT_LIBCURL;
        else
            return fail_here(l, v->line, "must be auto or libcurl");
        break;
    case FT_IDS: {
        struct config_ids *ids = (struct config_ids *)slot;
        if (v->kind != YN_SEQ)
            return fail_type(l, v, "a list of numeric ids");
        uint32_t *arr = calloc(v->n_kids ? v->n_kids : 1, sizeof(*arr));
        if (!arr)
            return fail_nomem(l);
        for (size_t k = 0; k < v->n_kids; k++) {
            const struct ynode *e = v->kids[k];
            if (e->kind != YN_SCALAR || ynode_int(e, &i) <= 0 || i < 0 || i >= 4294967295LL) {
                free(arr);
                size_t old = path_push_index(l, k);
                rc = fail_here(l, e->line, "expected a numeric uid or gid (0 .. 4294967294)");
                path_pop(l, old);
                return rc;
            }
            arr[k] = (uint32_t)i;
        }
        free(ids->v);
        ids->v = arr;
        ids->n = v->n_kids;
        break;
    }
    case FT_NODE:
        if (f->fid == FID_APP_PER_CAP) {
            if (v->kind != YN_MAP)
                return fail_type(l, v, "a map of capability names to limits");
        } else if (v->kind != YN_SEQ) {
            return fail_type(l, v, "a list of capability names");
        }
        *(const struct ynode **)slot = v;
        break;
    case FT_DIALECT: {
        if ((rc = get_string(l, v, &s)) < 0)
            return rc;
        int k = dialect_from_name(s);
        if (k < 0 && strcmp(s, "vertex") == 0) {
            /* Vertex AI speaks Gemini's or Anthropic's API by its model;
             * the loader settles which (validate_dialect). */
            struct config_source *src =
                (struct config_source *)((char *)slot - offsetof(struct config_source, kind));
            src->vertex.on = true;
            k = DIALECT_GEMINI;
        }
        if (k < 0)
            return fail_here(l, v->line,
                             "must be openai, azure, anthropic, gemini, bedrock or vertex");
        *(enum dialect_kind *)slot = (enum dialect_kind)k;
        break;
    }
    case FT_INCLUDE:
    case FT_CUSTOM:
    case FT_REJECT:
    case FT_MISPLACED:
        break; /* handled above / by field_find */
    }
    lines[f->fid] = v->line;
    return 0;
}

/* Key of pair `i` of `map`: must be a string, must not repeat. */
static int map_key(struct loader *l, const struct ynode *map, size_t i, const struct ynode **key)
{
    const struct ynode *k = map->kids[2 * i];

    if (k->kind != YN_SCALAR || strlen(k->text) != k->len)
        return fail_here(l, k->line, "map keys must be plain strings");
    if (k->dup_line) {
        size_t old = path_push_key(l, k->text, k->len);
        int rc = fail_here(l, k->line, "duplicate key (first set at line %u)", k->dup_line);
        path_pop(l, old);
        return rc;
    }
    *key = k;
    return 0;
}

/* Optimal string alignment distance between two keys, ignoring case
 * (insertions, deletions, substitutions and swaps of neighbours each count
 * 1); SIZE_MAX when either is longer than a name may be. */
static size_t edit_distance(const char *a, size_t la, const char *b, size_t lb)
{
    unsigned char d[CONFIG_NAME_MAX + 1][CONFIG_NAME_MAX + 1];

    if (la > CONFIG_NAME_MAX || lb > CONFIG_NAME_MAX)
        return SIZE_MAX;
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (unsigned char)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (unsigned char)j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
            unsigned v = d[i - 1][j - 1] + (ca != cb);
            if (d[i - 1][j] + 1u < v)
                v = d[i - 1][j] + 1u;
            if (d[i][j - 1] + 1u < v)
                v = d[i][j - 1] + 1u;
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == cb && d[i - 2][j - 2] + 1u < v)
                v = d[i - 2][j - 2] + 1u;
            d[i][j] = (unsigned char)v;
        }
    }
    return d[la][lb];
}

/* The key of table `t` (or of a table it includes) nearest to `key`, if it
 * is near enough to be a typo of it: 1 edit for short keys, 2 up to 8
 * characters, 3 beyond. Forbidden and misplaced keys are never suggested. */
static const char *near_key(const struct field *t, const char *key, size_t len, size_t *best_d)
{
    const char *best = NULL;

    for (; t->key; t++) {
        if (t->type == FT_INCLUDE) {
            const char *k = near_key(t->sub, key, len, best_d);
            if (k)
                best = k;
            continue;
        }
        if (t->type == FT_REJECT || t->type == FT_MISPLACED)
            continue;
        size_t kl = strlen(t->key), most = kl <= 4 ? 1 : kl <= 8 ? 2 : 3;
        if (len > kl + most || kl > len + most)
            continue; /* the length alone is too far off */
        size_t d = edit_distance(key, len, t->key, kl);
        if (d <= most && d < *best_d) {
            *best_d = d;
            best = t->key;
        }
    }
    return best;
}

/* Appends to `m`, joined by " or ", the key path of every place other than
 * the table `here` where `key` is a key: "listen.socket",
 * "sources[0].breaker.failures" (the element being walked stands in for
 * "[i]" / ".NAME" when the place is inside it). `at` is the path of table
 * `t`, `in_here` whether `t` belongs to `here`. Returns how many. */
static unsigned key_elsewhere(const struct loader *l, const struct field *t, const char *at,
                              const struct field *here, bool in_here, const char *key, size_t len,
                              struct msg *m, unsigned found)
{
    char sub[CONFIG_PATH_MAX];

    for (; t->key; t++) {
        const char *each = t->fid == l->elem_fid && l->elem_fid ? l->elem : t->each;

        switch (t->type) {
        case FT_INCLUDE:
            found = key_elsewhere(l, t->sub, at, here, in_here, key, len, m, found);
            continue;
        case FT_SECTION:
            snprintf(sub, sizeof(sub), "%s%s%s", at, *at ? "." : "", t->key);
            found = key_elsewhere(l, t->sub, sub, here, t->sub == here, key, len, m, found);
            break;
        case FT_CUSTOM:
            if (!t->sub)
                break;
            snprintf(sub, sizeof(sub), "%s%s%s%s", at, *at ? "." : "", t->key, each);
            found = key_elsewhere(l, t->sub, sub, here, t->sub == here, key, len, m, found);
            break;
        case FT_REJECT:
        case FT_MISPLACED:
            continue;
        default:
            break;
        }
        if (in_here || strlen(t->key) != len || memcmp(t->key, key, len) != 0)
            continue;
        msg_append(m, "%s%s%s%s", found ? " or " : "", at, *at ? "." : "", t->key);
        found++;
    }
    return found;
}

/* "unknown key", and a hint: where else the key is known (a misplaced key,
 * e.g. server.socket for listen.socket), or else the nearest key of this
 * map (a typo). */
static int fail_unknown(struct loader *l, const struct field *table, const struct ynode *key)
{
    struct msg hint = { .used = 0 };
    size_t d = SIZE_MAX;
    const char *near;

    if (key_elsewhere(l, top_table, "", table, table == top_table, key->text, key->len, &hint, 0))
        return fail_here(l, key->line, "unknown key; did you mean %s?", hint.text);
    if ((near = near_key(table, key->text, key->len, &d)))
        return fail_here(l, key->line, "unknown key; did you mean %s?", near);
    return fail_here(l, key->line, "unknown key");
}

/* Walks every pair of `map`; a pair that fails is reported and the walk goes
 * on. Returns 0, or -ENOMEM (which ends the load). */
static int walk_map(struct loader *l, const struct ynode *map, const struct field *table,
                    char *base, unsigned *lines)
{
    for (size_t i = 0; i < map->n_kids / 2; i++) {
        const struct ynode *key, *v = map->kids[2 * i + 1];
        const struct field *f;
        size_t off = 0, old;
        int rc;

        if (map_key(l, map, i, &key) < 0)
            continue;
        old = path_push_key(l, key->text, key->len);
        f = field_find(table, key->text, key->len, &off);
        if (!f) {
            rc = fail_unknown(l, table, key);
        } else if ((rc = set_field(l, f, base + off, key, v, lines)) == -EINVAL && f->fid) {
            lines[f->fid] = v->line | LINE_BAD;
        }
        path_pop(l, old);
        if (rc == -ENOMEM)
            return rc;
    }
    return 0;
}

/* Why the list item `s` is not acceptable (in `why`), or NULL. */
typedef const char *item_problem_fn(const char *s, char *why, size_t whylen);

/* A list of 1 to `max` distinct strings (`what`, for messages; one of them
 * is `one`), each checked by `problem`, into *list (owned) and *n. */
static int walk_strings(struct loader *l, const struct ynode *v, size_t max, const char *what,
                        const char *one, item_problem_fn *problem, char ***list, size_t *n)
{
    char why[200];

    if (ynode_is_null(v))
        return 0;
    if (v->kind != YN_SEQ || v->n_kids == 0 || v->n_kids > max) {
        snprintf(why, sizeof(why), "a list of 1 to %zu %s", max, what);
        return fail_type(l, v, why);
    }
    *list = calloc(v->n_kids, sizeof(**list));
    if (!*list)
        return fail_nomem(l);
    for (size_t i = 0; i < v->n_kids; i++) {
        const struct ynode *item = v->kids[i];
        const char *s, *p;
        size_t old = path_push_index(l, i);
        int rc = get_string(l, item, &s);
        if (rc == 0 && (p = problem(s, why, sizeof(why))))
            rc = fail_here(l, item->line, "%s", p);
        for (size_t j = 0; rc == 0 && j < *n; j++)
            if (strcasecmp((*list)[j], s) == 0)
                rc = fail_here(l, item->line, "repeats %s %zu", one, j);
        if (rc == 0 && !((*list)[*n] = strdup(s)))
            rc = fail_nomem(l);
        path_pop(l, old);
        if (rc < 0)
            return rc;
        (*n)++;
    }
    return 0;
}

static const char *sentinel_problem(const char *s, char *why, size_t whylen)
{
    return backend_syntax ? backend_syntax->hostport_problem(s, why, whylen) : NULL;
}

/* capabilities.NAME.methods: [GET, POST, DELETE], 1 to 3 of them. */
static int walk_methods(struct loader *l, const struct ynode *v)
{
    static const struct {
        const char *name;
        unsigned bit;
    } known[] = { { "GET", CONFIG_METHOD_GET },
                  { "POST", CONFIG_METHOD_POST },
                  { "DELETE", CONFIG_METHOD_DELETE } };
    struct cap_stage *c = l->cur_cap;
    unsigned bits = 0;

    if (ynode_is_null(v) || !c)
        return 0;
    if (v->kind != YN_SEQ || v->n_kids == 0 || v->n_kids > 3)
        return fail_type(l, v, "a list of 1 to 3 methods (GET, POST, DELETE)");
    for (size_t i = 0; i < v->n_kids; i++) {
        const char *s;
        size_t old = path_push_index(l, i);
        int rc = get_string(l, v->kids[i], &s);
        size_t k = 0;
        while (rc == 0 && k < sizeof(known) / sizeof(known[0]) && strcmp(known[k].name, s) != 0)
            k++;
        if (rc == 0 && k == sizeof(known) / sizeof(known[0]))
            rc = fail_here(l, v->kids[i]->line, "must be GET, POST or DELETE (upper case)");
        else if (rc == 0 && (bits & known[k].bit))
            rc = fail_here(l, v->kids[i]->line, "repeats %s", s);
        else if (rc == 0)
            bits |= known[k].bit;
        path_pop(l, old);
        if (rc < 0)
            return rc;
    }
    c->cap.methods = bits;
    return 0;
}

/* backend.sentinels: ["host:port", ...], 1 to 16 of them. */
static int walk_sentinels(struct loader *l, const struct ynode *v)
{
    return walk_strings(l, v, 16, "\"host:port\" strings", "sentinel", sentinel_problem,
                        &l->cfg->redis_sentinels, &l->cfg->n_redis_sentinels);
}

/* backend.cluster: ["host:port", ...], 1 to 16 seed nodes of a Redis Cluster. */
static int walk_cluster(struct loader *l, const struct ynode *v)
{
    return walk_strings(l, v, 16, "\"host:port\" strings", "cluster seed", sentinel_problem,
                        &l->cfg->redis_cluster, &l->cfg->n_redis_cluster);
}

/* A DNS name as a Host header or an origin carries it: letters, digits,
 * '-' and '.', 1 to 253 of them; `n` bytes of `s`. */
static bool is_host_name(const char *s, size_t n)
{
    if (n == 0 || n > 253)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '-' && s[i] != '.')
            return false;
    return true;
}

/* An origin as browsers send it: http:// or https://, a host (a name, an
 * IPv4 address or a bracketed IPv6 one) and an optional port, nothing
 * after. */
static const char *origin_problem(const char *s, char *why, size_t whylen)
{
    static const char shape[] = "must be an origin: http:// or https://, a host and an optional "
                                ":port, nothing after (e.g. http://localhost:3000)";
    size_t skip = strncasecmp(s, "http://", 7) == 0 ? 7
        : strncasecmp(s, "https://", 8) == 0        ? 8
                                                    : 0;
    const char *h = s + skip, *end;

    (void)why;
    (void)whylen;
    if (!skip)
        return shape;
    if (*h == '[') {
        end = strchr(h, ']');
        if (!end || !iplit_parse(h, (size_t)(end - h + 1), IPLIT_V6 | IPLIT_BRACKETS, NULL))
            return shape;
        end++;
    } else {
        end = h + strcspn(h, ":");
        if (!is_host_name(h, (size_t)(end - h)))
            return shape;
    }
    if (*end == ':') {
        char *stop;
        long port = strtol(end + 1, &stop, 10);
        if (!isdigit((unsigned char)end[1]) || *stop || port < 1 || port > 65535)
            return shape;
        end = stop;
    }
    return *end ? shape : NULL;
}

static const char *host_problem(const char *s, char *why, size_t whylen)
{
    (void)why;
    (void)whylen;
    return is_host_name(s, strlen(s)) ? NULL
                                      : "must be a host name (letters, digits, '-' and '.'), "
                                        "without a port";
}

/* http.allowed_origins, http.allowed_hosts (docs/HTTP.md section 8). */
static int walk_allowed_origins(struct loader *l, const struct ynode *v)
{
    return walk_strings(l, v, CONFIG_HTTP_ALLOWED_MAX, "origins", "origin", origin_problem,
                        &l->cfg->http_allowed_origins, &l->cfg->n_http_allowed_origins);
}

static int walk_allowed_hosts(struct loader *l, const struct ynode *v)
{
    return walk_strings(l, v, CONFIG_HTTP_ALLOWED_MAX, "host names", "host", host_problem,
                        &l->cfg->http_allowed_hosts, &l->cfg->n_http_allowed_hosts);
}

static struct cap_stage *cap_add(struct loader *l, const char *name, size_t len)
{
    if (l->n_caps == l->cap_caps) {
        size_t cap = l->cap_caps ? l->cap_caps * 2 : 8;
        struct cap_stage *c = realloc(l->caps, cap * sizeof(*c));
        if (!c)
            return NULL;
        l->caps = c;
        l->cap_caps = cap;
    }
    struct cap_stage *c = &l->caps[l->n_caps++];
    memset(c, 0, sizeof(*c));
    memcpy(c->cap.name, name, len);
    c->cap.name[len] = '\0';
    c->cap.methods = CONFIG_METHOD_POST;
    c->cap.max_body_bytes = CONFIG_RAW_MAX_BODY_DEFAULT;
    c->cap.budget_output_tokens = 4096;
    c->cap.cache.max_entry_bytes = CONFIG_CACHE_ENTRY_DEFAULT;
    c->cap.cache.lock_s = CONFIG_CACHE_LOCK_DEFAULT_S;
    return c;
}

/* capabilities: { NAME: { exempt_429, path, <policy keys> } | null, ... }
 * A name is either a built-in (its entry is updated) or new: a repeated key
 * never reaches here (map_key), so only the built-ins need a lookup. */
static int walk_capabilities(struct loader *l, const struct ynode *v)
{
    if (ynode_is_null(v))
        return 0;
    if (v->kind != YN_MAP)
        return fail_type(l, v, "a map of capability names");
    for (size_t i = 0; i < v->n_kids / 2; i++) {
        const struct ynode *key, *body = v->kids[2 * i + 1];
        struct cap_stage *c = NULL;
        int rc = 0;

        if (map_key(l, v, i, &key) < 0)
            continue;
        size_t old = path_push_key(l, key->text, key->len);
        if (check_name(l, key->line, key->text, key->len) < 0)
            goto next;
        for (size_t b = 0; b < N_BUILTIN_CAPS && !c; b++)
            if (strlen(l->caps[b].cap.name) == key->len &&
                memcmp(l->caps[b].cap.name, key->text, key->len) == 0)
                c = &l->caps[b];
        if (!c && !(c = cap_add(l, key->text, key->len))) {
            rc = fail_nomem(l);
            goto next;
        }
        c->map_line = key->line;
        if (ynode_is_null(body))
            goto next;
        if (body->kind != YN_MAP) {
            fail_type(l, body, "a map");
            goto next;
        }
        l->elem_fid = FID_CAPABILITIES;
        snprintf(l->elem, sizeof(l->elem), ".%s", c->cap.name);
        l->cur_cap = c;
        rc = walk_map(l, body, capability_table, (char *)c, c->line);
        l->cur_cap = NULL;
        l->elem_fid = FID_NONE;
    next:
        path_pop(l, old);
        if (rc == -ENOMEM)
            return rc;
    }
    return 0;
}

/* sources: [ { name, capability, base_url, ... }, ... ] */
static int walk_sources(struct loader *l, const struct ynode *v)
{
    if (ynode_is_null(v))
        return 0;
    if (v->kind != YN_SEQ)
        return fail_type(l, v, "a list of sources");
    if (v->n_kids == 0)
        return 0;
    l->srcs = calloc(v->n_kids, sizeof(*l->srcs));
    if (!l->srcs)
        return fail_nomem(l);
    for (size_t i = 0; i < v->n_kids; i++) {
        const struct ynode *item = v->kids[i];
        struct src_stage *s = &l->srcs[i];
        int rc = 0;

        l->n_srcs = i + 1;
        source_set_defaults(&s->src);
        s->map_line = item->line;
        size_t old = path_push_index(l, i);
        if (item->kind != YN_MAP) {
            fail_type(l, item, "a map");
            s->bad = true;
        } else {
            l->elem_fid = FID_SOURCES;
            snprintf(l->elem, sizeof(l->elem), "[%zu]", i);
            rc = walk_map(l, item, source_table, (char *)s, s->line);
            l->elem_fid = FID_NONE;
        }
        path_pop(l, old);
        if (rc == -ENOMEM)
            return rc;
    }
    return 0;
}

/* apps: [ { name, uids, gids, allow_declared, admin, weight }, ... ] */
static int walk_apps(struct loader *l, const struct ynode *v)
{
    if (ynode_is_null(v))
        return 0;
    if (v->kind != YN_SEQ)
        return fail_type(l, v, "a list of apps");
    if (v->n_kids == 0)
        return 0;
    l->apps = calloc(v->n_kids, sizeof(*l->apps));
    if (!l->apps)
        return fail_nomem(l);
    for (size_t i = 0; i < v->n_kids; i++) {
        const struct ynode *item = v->kids[i];
        struct app_stage *a = &l->apps[i];
        int rc = 0;

        l->n_apps = i + 1;
        a->app.weight = 1;
        a->app.limits.window_s = 60;
        a->map_line = item->line;
        size_t old = path_push_index(l, i);
        if (item->kind != YN_MAP) {
            fail_type(l, item, "a map");
            a->bad = true;
        } else {
            l->elem_fid = FID_APPS;
            snprintf(l->elem, sizeof(l->elem), "[%zu]", i);
            rc = walk_map(l, item, app_table, (char *)a, a->line);
            l->elem_fid = FID_NONE;
        }
        path_pop(l, old);
        if (rc == -ENOMEM)
            return rc;
    }
    return 0;
}

#define CONFIG_EXTRAS_MAX 32u  /* headers: and query: entries per source */
#define CONFIG_MODELS_MAX 256u /* serves: entries per source, models: per app */

/* Headers polygw writes itself, or that would break the request framing. */
static bool header_is_reserved(const char *name)
{
    static const char *const reserved[] = { "content-type",      "content-length", "host",
                                            "transfer-encoding", "expect",         "accept",
                                            "connection",        "accept-encoding" };
    for (size_t i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++)
        if (strcasecmp(name, reserved[i]) == 0)
            return true;
    return false;
}

/* One `headers:` item: {name, value | value_env | value_file}. */
static int walk_header(struct loader *l, const struct ynode *item, struct config_header *h)
{
    char **slots[4] = { &h->name, &h->value, &h->value_env, &h->value_file };
    static const char *const keys[4] = { "name", "value", "value_env", "value_file" };
    int rc;

    h->line = item->line;
    if (item->kind != YN_MAP)
        return fail_type(l, item, "a map with name and value, value_env or value_file");
    for (size_t i = 0; i < item->n_kids / 2; i++) {
        const struct ynode *key, *v = item->kids[2 * i + 1];
        const char *str;
        size_t k;

        if ((rc = map_key(l, item, i, &key)) < 0)
            return rc;
        size_t old = path_push_key(l, key->text, key->len);
        for (k = 0; k < 4 && strcmp(key->text, keys[k]) != 0; k++)
            ;
        if (k == 4)
            rc = fail_here(l, key->line, "unknown key (name, value, value_env, value_file)");
        else if ((rc = get_string(l, v, &str)) == 0 && !(*slots[k] = strdup(str)))
            rc = fail_nomem(l);
        /* The value is never quoted: it may be a secret. */
        if (rc == 0 && k == 0 && (!is_header_name(str) || header_is_reserved(str)))
            rc = fail_here(l, v->line,
                           is_header_name(str) ? "is a header polygw sets itself"
                                               : "must be an HTTP header name");
        if (rc == 0 && k == 1 && has_ctl(str, strlen(str)))
            rc = fail_here(l, v->line, "must not contain control characters");
        if (rc == 0 && k == 2)
            rc = check_env_name(l, v, *slots[k]);
        if (rc == 0 && k == 3)
            rc = check_key_path(l, v, *slots[k]);
        path_pop(l, old);
        if (rc < 0)
            return rc;
    }
    int given = !!h->value + !!h->value_env + !!h->value_file;
    if (!h->name)
        return fail_here(l, item->line, "name: is required");
    if (given != 1)
        return fail_here(l, item->line, "needs exactly one of value, value_env, value_file");
    return 0;
}

/* sources[i].headers: [ {name, value | value_env | value_file}, ... ] */
static int walk_headers(struct loader *l, const struct ynode *v)
{
    struct config_source *s = &l->srcs[l->n_srcs - 1].src;
    int rc;

    if (ynode_is_null(v))
        return 0;
    if (v->kind != YN_SEQ)
        return fail_type(l, v, "a list of {name, value} maps");
    if (v->n_kids > CONFIG_EXTRAS_MAX)
        return fail_here(l, v->line, "at most %u headers", CONFIG_EXTRAS_MAX);
    if (v->n_kids == 0)
        return 0;
    if (!(s->headers = calloc(v->n_kids, sizeof(*s->headers))))
        return fail_nomem(l);
    for (size_t i = 0; i < v->n_kids; i++) {
        s->n_headers = i + 1;
        size_t old = path_push_index(l, i);
        rc = walk_header(l, v->kids[i], &s->headers[i]);
        for (size_t j = 0; rc == 0 && j < i; j++)
            if (strcasecmp(s->headers[j].name, s->headers[i].name) == 0)
                rc = fail_here(l, v->kids[i]->line, "header %s repeated (first at line %u)",
                               s->headers[i].name, s->headers[j].line);
        path_pop(l, old);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* sources[i].serves: [NAME | GLOB, ...] (models.h). */
/* budget.timezone: UTC, or a fixed offset from it, +HH:MM / -HH:MM (a
 * zone with daylight saving time moves its offset: name the one to keep). */
static int walk_budget_tz(struct loader *l, const struct ynode *v)
{
    struct budget_limits *b = l->elem_fid == FID_APPS ? &l->apps[l->n_apps - 1].app.budget
                                                      : &l->srcs[l->n_srcs - 1].src.budget;
    const char *s;
    int rc;
    unsigned hh, mm;
    char sign, end;

    if ((rc = get_string(l, v, &s)) < 0)
        return rc;
    if (strncmp(s, "UTC", 3) == 0)
        s += 3;
    if (!*s) {
        b->utc_offset_s = 0;
        return 0;
    }
    if (sscanf(s, "%c%2u:%2u%c", &sign, &hh, &mm, &end) != 3 || (sign != '+' && sign != '-') ||
        strlen(s) != 6 || hh > 23 || mm > 59)
        return fail_here(l, v->line,
                         "must be UTC or an offset from it, +HH:MM or -HH:MM (e.g. +02:00)");
    b->utc_offset_s = (int32_t)((sign == '-' ? -1 : 1) * (int)(hh * 3600 + mm * 60));
    return 0;
}

static int walk_serves(struct loader *l, const struct ynode *v)
{
    struct config_source *s = &l->srcs[l->n_srcs - 1].src;
    return walk_strings(l, v, CONFIG_MODELS_MAX, "model names or globs", "name", model_problem,
                        &s->serves, &s->n_serves);
}

/* sources[i].token_command: [PROGRAM, ARG, ...], the argv of a program
 * that prints a Google Cloud access token: 1 to 64 strings, the first
 * not empty, none with a control character. */
static int walk_token_command(struct loader *l, const struct ynode *v)
{
    struct gcp_creds *g = &l->srcs[l->n_srcs - 1].src.vertex.creds;

    if (v->kind != YN_SEQ || v->n_kids == 0 || v->n_kids > 64)
        return fail_type(l, v, "a list of 1 to 64 strings: the program and its arguments");
    if (!(g->token_command = calloc(v->n_kids + 1, sizeof(*g->token_command))))
        return fail_nomem(l);
    for (size_t i = 0; i < v->n_kids; i++) {
        const char *arg;
        size_t old = path_push_index(l, i);
        int rc = get_string(l, v->kids[i], &arg);
        if (rc == 0 && ((i == 0 && !*arg) || has_ctl(arg, strlen(arg))))
            rc = fail_here(l, v->kids[i]->line,
                           i == 0 ? "must name a program" : "must not hold control characters");
        if (rc == 0 && !(g->token_command[i] = strdup(arg)))
            rc = fail_nomem(l);
        path_pop(l, old);
        if (rc < 0)
            return rc;
        g->n_token_command++;
    }
    return 0;
}

/* apps[i].models: [NAME | GLOB, ...] (models.h). */
static int walk_app_models(struct loader *l, const struct ynode *v)
{
    struct config_app *a = &l->apps[l->n_apps - 1].app;
    return walk_strings(l, v, CONFIG_MODELS_MAX, "model names or globs", "name", model_problem,
                        &a->models, &a->n_models);
}

/* sources[i].query: { name: value, ... } (strings, sent percent-encoded). */
static int walk_query(struct loader *l, const struct ynode *v)
{
    struct config_source *s = &l->srcs[l->n_srcs - 1].src;
    int rc;

    if (ynode_is_null(v))
        return 0;
    if (v->kind != YN_MAP)
        return fail_type(l, v, "a map of parameter names to values");
    size_t n = v->n_kids / 2;
    if (n > CONFIG_EXTRAS_MAX)
        return fail_here(l, v->line, "at most %u parameters", CONFIG_EXTRAS_MAX);
    if (n == 0)
        return 0;
    if (!(s->query = calloc(n, sizeof(*s->query))))
        return fail_nomem(l);
    for (size_t i = 0; i < n; i++) {
        const struct ynode *key, *val = v->kids[2 * i + 1];
        const char *str;

        if ((rc = map_key(l, v, i, &key)) < 0)
            return rc;
        size_t old = path_push_key(l, key->text, key->len);
        s->n_query = i + 1;
        if (has_ctl(key->text, key->len) || key->len == 0)
            rc = fail_here(l, key->line, "parameter names must be printable text");
        else if ((rc = get_string(l, val, &str)) == 0 &&
                 (!(s->query[i].name = strdup(key->text)) || !(s->query[i].value = strdup(str))))
            rc = fail_nomem(l);
        else if (rc == 0 && has_ctl(str, strlen(str)))
            rc = fail_here(l, val->line, "must not contain control characters");
        path_pop(l, old);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Validation pass                                                          */

static size_t policy_field_size(const struct field *f)
{
    return f->type == FT_U32 ? sizeof(uint32_t) : sizeof(double);
}

/* Every policy key not set at this level (lines[] == 0) takes the parent's
 * effective value, and its badness: a value inherited from a rejected one
 * is not compared with anything either. */
static void policy_inherit(struct config_policy *dst, unsigned *lines,
                           const struct config_policy *parent, const unsigned *parent_lines)
{
    for (const struct field *f = policy_table; f->key; f++)
        if (!lines[f->fid]) {
            memcpy((char *)dst + f->off, (const char *)parent + f->off, policy_field_size(f));
            lines[f->fid] = parent_lines[f->fid] & LINE_BAD;
        }
}

/* Enforces lo <= hi for two keys of one entity. The message points at the
 * key that was set here (hi first, it is usually the one being tuned) and
 * says where the other value came from when it was not set here:
 * `lo_note` / `hi_note` ("default", "inherited"). Skipped when either value
 * was rejected. */
static int check_order(struct loader *l, const char *prefix, unsigned entity_line,
                       const unsigned *lines, enum fid lo_fid, const char *lo_key, double lo,
                       const char *lo_note, enum fid hi_fid, const char *hi_key, double hi,
                       const char *hi_note)
{
    char path[CONFIG_PATH_MAX], a[32], b[32];

    if (lo <= hi || line_is_bad(lines[lo_fid] | lines[hi_fid]))
        return 0;
    fmt_num(a, sizeof(a), lo);
    fmt_num(b, sizeof(b), hi);
    if (lines[hi_fid]) {
        snprintf(path, sizeof(path), "%s%s%s", prefix, *prefix ? "." : "", hi_key);
        return fail_at(l, lines[hi_fid], path, "must be >= %s (%s%s%s), got %s", lo_key, a,
                       lines[lo_fid] ? "" : ", ", lines[lo_fid] ? "" : lo_note, b);
    }
    snprintf(path, sizeof(path), "%s%s%s", prefix, *prefix ? "." : "", lo_key);
    return fail_at(l, lines[lo_fid] ? lines[lo_fid] : entity_line, path,
                   "must be <= %s (%s, %s), got %s", hi_key, b, hi_note, a);
}

static int check_policy(struct loader *l, const char *prefix, unsigned entity_line,
                        const unsigned *lines, const struct config_policy *p)
{
    return check_order(l, prefix, entity_line, lines, FID_BACKOFF_BASE, "backoff_base_s",
                       p->backoff_base_s, "inherited", FID_BACKOFF_MAX, "backoff_max_s",
                       p->backoff_max_s, "inherited");
}

/* Refuses every policy key written in source `i` (recorded by the walk as
 * FT_MISPLACED), in file order, naming the levels where it takes effect. */
static void check_source_policy(struct loader *l, size_t i)
{
    const struct src_stage *st = &l->srcs[i];
    char path[CONFIG_PATH_MAX];
    unsigned after = 0;

    for (;;) {
        const struct field *next = NULL;
        for (const struct field *f = policy_table; f->key; f++)
            if (st->line[f->fid] > after && (!next || st->line[f->fid] < st->line[next->fid]))
                next = f;
        if (!next)
            return;
        after = st->line[next->fid];
        snprintf(path, sizeof(path), "sources[%zu].%s", i, next->key);
        fail_at(l, after, path,
                "not a per-source key: a call's budgets span every source "
                "of its capability; set it under defaults or capabilities.%s",
                st->src.capability);
    }
}

/* The sentinel, credential and TLS keys of the backend section. */
static void validate_redis_auth(struct loader *l)
{
    static const struct {
        int fid;
        const char *key;
    } sentinel_only[] = {
        { FID_MASTER_NAME, "backend.master_name" },
        { FID_DB, "backend.db" },
        { FID_SENTINEL_USERNAME, "backend.sentinel_username" },
        { FID_SENTINEL_PASSWORD_ENV, "backend.sentinel_password_env" },
        { FID_SENTINEL_PASSWORD_FILE, "backend.sentinel_password_file" },
    };
    const unsigned *line = l->line;

    if (line[FID_SENTINELS] && !line[FID_MASTER_NAME])
        fail_at(l, line[FID_SENTINELS], "backend.master_name",
                "is required with backend.sentinels (the name the sentinels monitor)");
    for (size_t i = 0; !line[FID_SENTINELS] && i < sizeof(sentinel_only) / sizeof(*sentinel_only);
         i++)
        if (line[sentinel_only[i].fid])
            fail_at(l, line[sentinel_only[i].fid], sentinel_only[i].key,
                    "only valid with backend.sentinels%s",
                    sentinel_only[i].fid == FID_DB ? " (a URL carries its db: redis://host/N)"
                                                   : "");
    if (line[FID_PASSWORD_ENV] && line[FID_PASSWORD_FILE])
        fail_at(l, line[FID_PASSWORD_FILE], "backend.password_file",
                "cannot be combined with backend.password_env; choose one");
    if (line[FID_SENTINEL_PASSWORD_ENV] && line[FID_SENTINEL_PASSWORD_FILE])
        fail_at(l, line[FID_SENTINEL_PASSWORD_FILE], "backend.sentinel_password_file",
                "cannot be combined with backend.sentinel_password_env; choose one");
    if (line[FID_USERNAME] && !line[FID_PASSWORD_ENV] && !line[FID_PASSWORD_FILE])
        fail_at(l, line[FID_USERNAME], "backend.username",
                "needs backend.password_env or backend.password_file (a user in the URL "
                "goes with the URL's password)");
    if (line[FID_SENTINEL_USERNAME] && !line[FID_SENTINEL_PASSWORD_ENV] &&
        !line[FID_SENTINEL_PASSWORD_FILE])
        fail_at(l, line[FID_SENTINEL_USERNAME], "backend.sentinel_username",
                "needs backend.sentinel_password_env or backend.sentinel_password_file");
    if (!line[FID_TLS_CERT_FILE] != !line[FID_TLS_KEY_FILE])
        fail_at(l, line[FID_TLS_CERT_FILE] ? line[FID_TLS_CERT_FILE] : line[FID_TLS_KEY_FILE],
                line[FID_TLS_CERT_FILE] ? "backend.tls.key_file" : "backend.tls.cert_file",
                "is required with backend.tls.%s (a client certificate needs both)",
                line[FID_TLS_CERT_FILE] ? "cert_file" : "key_file");
    l->cfg->redis_tls = line[FID_TLS] != 0;
}

static void validate_top(struct loader *l)
{
    struct config *cfg = l->cfg;
    const unsigned *line = l->line;
    char a[32], b[32];

    if (!line[FID_MAX_WRITE_QUEUE]) {
        cfg->max_write_queue_bytes = 2 * cfg->max_message_bytes;
    } else if (cfg->max_write_queue_bytes < cfg->max_message_bytes &&
               !line_is_bad(line[FID_MAX_WRITE_QUEUE] | line[FID_MAX_MESSAGE_BYTES])) {
        fail_at(l, line[FID_MAX_WRITE_QUEUE], "listen.max_write_queue_bytes",
                "must be >= listen.max_message_bytes (%s), got %s",
                fmt_num(a, sizeof(a), (double)cfg->max_message_bytes),
                fmt_num(b, sizeof(b), (double)cfg->max_write_queue_bytes));
    }
    if (!line[FID_MAX_BUFFERED_INPUT]) {
        cfg->max_buffered_input_bytes = 4 * cfg->max_message_bytes;
    } else if (cfg->max_buffered_input_bytes < cfg->max_message_bytes &&
               !line_is_bad(line[FID_MAX_BUFFERED_INPUT] | line[FID_MAX_MESSAGE_BYTES])) {
        fail_at(l, line[FID_MAX_BUFFERED_INPUT], "listen.max_buffered_input_bytes",
                "must be >= listen.max_message_bytes (%s), got %s",
                fmt_num(a, sizeof(a), (double)cfg->max_message_bytes),
                fmt_num(b, sizeof(b), (double)cfg->max_buffered_input_bytes));
    }
    if (cfg->http_listen && !line_is_bad(line[FID_HTTP_LISTEN] | line[FID_HTTP_ALLOW_REMOTE])) {
        char why[200];
        if (config_check_http_listen(cfg, why, sizeof(why)) < 0)
            fail_at(l, line[FID_HTTP_LISTEN], "http.listen", "%s", why);
    }
    if (cfg->backend == BACKEND_REDIS && !line[FID_URL] && !line[FID_URL_ENV] &&
        !line[FID_SENTINELS] && !line[FID_CLUSTER])
        fail_at(l, line[FID_KIND], "backend.url",
                "is required when kind is redis (or backend.url_env, backend.sentinels or "
                "backend.cluster)");
    if (line[FID_URL] && line[FID_URL_ENV])
        fail_at(l, line[FID_URL_ENV], "backend.url_env",
                "cannot be combined with backend.url; choose one");
    if (line[FID_SENTINELS] && (line[FID_URL] || line[FID_URL_ENV]))
        fail_at(l, line[FID_SENTINELS], "backend.sentinels",
                "cannot be combined with backend.%s; choose one (the sentinels name the "
                "primary)",
                line[FID_URL] ? "url" : "url_env");
    if (line[FID_CLUSTER] && (line[FID_URL] || line[FID_URL_ENV] || line[FID_SENTINELS]))
        fail_at(l, line[FID_CLUSTER], "backend.cluster",
                "cannot be combined with backend.%s; choose one (a cluster's nodes are "
                "found from its seeds)",
                line[FID_URL]           ? "url"
                    : line[FID_URL_ENV] ? "url_env"
                                        : "sentinels");
    validate_redis_auth(l);
    static const struct {
        int fid;
        const char *key;
    } redis_only[] = {
        { FID_URL, "backend.url" },
        { FID_URL_ENV, "backend.url_env" },
        { FID_PREFIX, "backend.prefix" },
        { FID_COMMAND_TIMEOUT, "backend.command_timeout_s" },
        { FID_LEASE_TTL, "backend.lease_ttl_s" },
        { FID_SENTINELS, "backend.sentinels" },
        { FID_CLUSTER, "backend.cluster" },
        { FID_USERNAME, "backend.username" },
        { FID_PASSWORD_ENV, "backend.password_env" },
        { FID_PASSWORD_FILE, "backend.password_file" },
        { FID_TLS, "backend.tls" },
    };
    /* With a rejected kind, nobody knows which backend was meant. */
    for (size_t i = 0; cfg->backend == BACKEND_MEMORY && !line_is_bad(line[FID_KIND]) &&
         i < sizeof(redis_only) / sizeof(*redis_only);
         i++) {
        if (line[redis_only[i].fid])
            fail_at(l, line[redis_only[i].fid], redis_only[i].key, "only valid with kind: redis");
    }
    if (cfg->redis_lease_ttl_s < 3 * cfg->redis_command_timeout_s &&
        !line_is_bad(line[FID_LEASE_TTL] | line[FID_COMMAND_TIMEOUT]))
        fail_at(l, line[FID_LEASE_TTL] ? line[FID_LEASE_TTL] : line[FID_KIND],
                "backend.lease_ttl_s",
                "must be >= 3 x backend.command_timeout_s (%s), got %s: leases are "
                "renewed every lease_ttl_s / 3",
                fmt_num(a, sizeof(a), 3 * cfg->redis_command_timeout_s),
                fmt_num(b, sizeof(b), cfg->redis_lease_ttl_s));
    check_policy(l, "defaults", line[FID_DEFAULTS], line, &cfg->defaults);
}


static const char *cap_name_at(const void *set, size_t pos, size_t *len)
{
    const char *name = ((const struct cap_stage *)set)[pos].cap.name;
    *len = strlen(name);
    return name;
}

static const char *src_name_at(const void *set, size_t pos, size_t *len)
{
    const char *name = ((const struct src_stage *)set)[pos].src.name;
    *len = strlen(name);
    return name;
}

/* body, methods and max_body_bytes together: only a raw capability takes
 * another method than POST or a body bound of its own. */
static void check_passthrough(struct loader *l, struct cap_stage *c, const char *prefix)
{
    char key[48 + CONFIG_NAME_MAX];

    c->cap.raw = c->body && strcmp(c->body, "raw") == 0;
    if (c->cap.raw)
        return;
    if (c->line[FID_CAP_METHODS] && c->cap.methods != CONFIG_METHOD_POST) {
        snprintf(key, sizeof(key), "%s.methods", prefix);
        fail_at(l, c->line[FID_CAP_METHODS], key,
                "GET and DELETE need body: raw (a JSON capability is called with POST only)");
    }
    if (c->line[FID_CAP_MAX_BODY]) {
        snprintf(key, sizeof(key), "%s.max_body_bytes", prefix);
        fail_at(l, c->line[FID_CAP_MAX_BODY], key,
                "only for body: raw (JSON bodies are bounded by http.max_body_bytes)");
    }
}

static int validate_capabilities(struct loader *l)
{
    char prefix[16 + CONFIG_NAME_MAX]; /* "capabilities.NAME" */

    if (name_index_reset(&l->cap_ix, l->n_caps) < 0)
        return fail_nomem(l);
    for (size_t i = 0; i < l->n_caps; i++) {
        struct cap_stage *c = &l->caps[i];
        snprintf(prefix, sizeof(prefix), "capabilities.%s", c->cap.name);
        policy_inherit(&c->cap.policy, c->line, &l->cfg->defaults, l->line);
        /* Values both inherited were checked (and reported) under defaults. */
        if (c->line[FID_BACKOFF_BASE] || c->line[FID_BACKOFF_MAX])
            check_policy(l, prefix, c->map_line, c->line, &c->cap.policy);
        if (!c->builtin && !c->line[FID_PATH])
            fail_at(l, c->map_line, prefix,
                    "path: is required for a custom "
                    "capability (built-ins are chat, embedding, ocr)");
        (void)name_index_add(&l->cap_ix, i, cap_name_at, l->caps); /* names are unique */
        check_passthrough(l, c, prefix);
        if (c->affinity)
            c->cap.affinity = strcmp(c->affinity, "task") == 0 ? AFFINITY_TASK
                : strcmp(c->affinity, "scope") == 0            ? AFFINITY_SCOPE
                                                               : AFFINITY_NONE;
    }
    l->cfg->capabilities = calloc(l->n_caps, sizeof(*l->cfg->capabilities));
    if (!l->cfg->capabilities)
        return fail_nomem(l);
    for (size_t i = 0; i < l->n_caps; i++)
        l->cfg->capabilities[i] = l->caps[i].cap;
    l->cfg->n_capabilities = l->n_caps;
    return 0;
}

/* kind, its version keys, auth_header / auth_query and accepts; the first
 * failure among them is reported. Skipped when `kind` itself was rejected:
 * every rule here depends on it. */
static int validate_dialect(struct loader *l, size_t i, const char *prefix)
{
    struct src_stage *st = &l->srcs[i];
    struct config_source *s = &st->src;
    const char *kind = dialect_get(s->kind)->name;
    char path[CONFIG_PATH_MAX];

    if (line_is_bad(st->line[FID_SRC_KIND]))
        return 0;
    if (s->kind == DIALECT_AZURE && !st->line[FID_API_VERSION]) {
        snprintf(path, sizeof(path), "%s.api_version", prefix);
        return fail_at(l, st->line[FID_SRC_KIND], path,
                       "is required with kind: azure "
                       "(e.g. \"2024-10-21\"; sent as the api-version query parameter)");
    }
    if (s->kind != DIALECT_AZURE && st->line[FID_API_VERSION]) {
        snprintf(path, sizeof(path), "%s.api_version", prefix);
        return fail_at(l, st->line[FID_API_VERSION], path, "only valid with kind: azure");
    }
    if (s->kind != DIALECT_ANTHROPIC && st->line[FID_ANTHROPIC_VERSION]) {
        snprintf(path, sizeof(path), "%s.anthropic_version", prefix);
        return fail_at(l, st->line[FID_ANTHROPIC_VERSION], path, "only valid with kind: anthropic");
    }
    if (s->vertex.on) {
        static const struct {
            enum fid fid;
            const char *key;
        } not_here[] = {
            { FID_API_KEY, "api_key" },           { FID_API_KEY_ENV, "api_key_env" },
            { FID_API_KEY_FILE, "api_key_file" }, { FID_AUTH_HEADER, "auth_header" },
            { FID_AUTH_QUERY, "auth_query" },     { FID_ANTHROPIC_VERSION, "anthropic_version" }
        };
        for (size_t k = 0; k < sizeof(not_here) / sizeof(not_here[0]); k++)
            if (st->line[not_here[k].fid]) {
                snprintf(path, sizeof(path), "%s.%s", prefix, not_here[k].key);
                return fail_at(l, st->line[not_here[k].fid], path,
                               "not valid with kind: vertex (it authenticates with Google "
                               "Cloud access tokens, docs/CONFIG.md)");
            }
        const char *missing = !s->vertex.project ? "project"
            : !s->vertex.location                ? "location"
            : !s->model                          ? "model"
                                                 : NULL;
        if (missing) {
            snprintf(path, sizeof(path), "%s.%s", prefix, missing);
            return fail_at(l, st->line[FID_SRC_KIND], path,
                           "is required with kind: vertex (project and location name the "
                           "endpoint; model is the publisher's model, e.g. gemini-2.5-flash or "
                           "claude-3-5-haiku@20241022)");
        }
        /* Anthropic's models on Vertex speak Messages (rawPredict); every
         * other publisher model here is Google's, speaking Gemini's API. */
        if (strncmp(s->model, "claude", 6) == 0)
            s->kind = DIALECT_ANTHROPIC;
        if (st->line[FID_TOKEN_COMMAND] && st->line[FID_TOKEN_FILE]) {
            snprintf(path, sizeof(path), "%s.token_file", prefix);
            return fail_at(l, st->line[FID_TOKEN_FILE], path,
                           "cannot be combined with token_command; choose one");
        }
    } else if (st->line[FID_PROJECT] || st->line[FID_LOCATION] || st->line[FID_TOKEN_COMMAND] ||
               st->line[FID_TOKEN_FILE]) {
        static const struct {
            enum fid fid;
            const char *key;
        } vertex_only[] = { { FID_PROJECT, "project" },
                            { FID_LOCATION, "location" },
                            { FID_TOKEN_COMMAND, "token_command" },
                            { FID_TOKEN_FILE, "token_file" } };
        size_t k = 0;
        while (!st->line[vertex_only[k].fid])
            k++;
        snprintf(path, sizeof(path), "%s.%s", prefix, vertex_only[k].key);
        return fail_at(l, st->line[vertex_only[k].fid], path, "only valid with kind: vertex");
    }
    if (s->kind == DIALECT_BEDROCK) {
        static const struct {
            enum fid fid;
            const char *key;
        } not_here[] = { { FID_API_KEY, "api_key" },
                         { FID_API_KEY_ENV, "api_key_env" },
                         { FID_API_KEY_FILE, "api_key_file" },
                         { FID_AUTH_HEADER, "auth_header" },
                         { FID_AUTH_QUERY, "auth_query" } };
        for (size_t k = 0; k < sizeof(not_here) / sizeof(not_here[0]); k++)
            if (st->line[not_here[k].fid]) {
                snprintf(path, sizeof(path), "%s.%s", prefix, not_here[k].key);
                return fail_at(l, st->line[not_here[k].fid], path,
                               "not valid with kind: bedrock (its requests are signed with the "
                               "AWS credentials of the environment, docs/CONFIG.md)");
            }
        if (!s->aws.region) {
            snprintf(path, sizeof(path), "%s.region", prefix);
            return fail_at(l, st->line[FID_SRC_KIND], path,
                           "is required with kind: bedrock (e.g. us-east-1)");
        }
        if (!s->model) {
            snprintf(path, sizeof(path), "%s.model", prefix);
            return fail_at(l, st->line[FID_SRC_KIND], path,
                           "is required with kind: bedrock (the Bedrock model id, e.g. "
                           "anthropic.claude-3-5-haiku-20241022-v1:0)");
        }
        if (strcmp(s->capability, "chat") != 0) {
            snprintf(path, sizeof(path), "%s.capability", prefix);
            return fail_at(l, st->line[FID_SRC_KIND], path,
                           "kind: bedrock serves chat only (capability is %s)", s->capability);
        }
        if (st->api) {
            snprintf(path, sizeof(path), "%s.api", prefix);
            if (strcmp(st->api, "converse") != 0 && strcmp(st->api, "invoke") != 0)
                return fail_at(l, st->line[FID_BEDROCK_API], path,
                               "must be invoke (InvokeModel, Anthropic models) or converse "
                               "(the Converse API, any model)");
            s->bedrock_converse = strcmp(st->api, "converse") == 0;
        }
    } else if (st->line[FID_REGION] || st->line[FID_BEDROCK_API]) {
        enum fid f = st->line[FID_REGION] ? FID_REGION : FID_BEDROCK_API;
        snprintf(path, sizeof(path), "%s.%s", prefix, f == FID_REGION ? "region" : "api");
        return fail_at(l, st->line[f], path, "only valid with kind: bedrock");
    }
    if (s->kind == DIALECT_ANTHROPIC && !s->vertex.on && !s->anthropic_version &&
        !(s->anthropic_version = strdup("2023-06-01")))
        return fail_nomem(l);
    if (s->auth_header && s->auth_query) {
        snprintf(path, sizeof(path), "%s.auth_query", prefix);
        return fail_at(l, st->line[FID_AUTH_QUERY], path,
                       "cannot be combined with auth_header; choose one");
    }
    if (s->auth_header && header_is_reserved(s->auth_header)) {
        snprintf(path, sizeof(path), "%s.auth_header", prefix);
        return fail_at(l, st->line[FID_AUTH_HEADER], path, "is a header polygw sets itself");
    }
    if (dialect_is_messages(s->kind) && st->line[FID_STREAM_USAGE]) {
        snprintf(path, sizeof(path), "%s.stream_usage", prefix);
        return fail_at(l, st->line[FID_STREAM_USAGE], path,
                       "only valid with kind: openai or "
                       "azure (Anthropic streams always carry usage)");
    }
    if (st->accepts) {
        snprintf(path, sizeof(path), "%s.accepts", prefix);
        if (strcmp(st->accepts, "openai") != 0)
            return fail_at(l, st->line[FID_ACCEPTS], path, "must be openai");
        if (!dialect_is_messages(s->kind))
            return fail_at(l, st->line[FID_ACCEPTS], path,
                           "only valid with kind: anthropic or bedrock "
                           "(kind %s already takes OpenAI bodies)",
                           kind);
        if (strcmp(s->capability, "chat") != 0)
            return fail_at(l, st->line[FID_ACCEPTS], path,
                           "converts chat bodies only "
                           "(capability is %s)",
                           s->capability);
        s->accepts_openai = true;
    }
    return 0;
}

/* tls: and proxy: of one source. The files are loaded now, with the same
 * code the Redis backend's TLS uses, so a missing, unreadable or mismatched
 * file is a load error with its path, not a failure of the first request. */
static void validate_route(struct loader *l, size_t i, const char *prefix)
{
    static uint64_t next_id;
    struct src_stage *st = &l->srcs[i];
    struct config_source *s = &st->src;
    char path[CONFIG_PATH_MAX], why[256];
    bool any_tls = s->tls.ca_file || s->tls.cert_file || s->tls.key_file || s->tls.server_name;

    if (any_tls && s->base_url && strncasecmp(s->base_url, "https://", 8) != 0) {
        snprintf(path, sizeof(path), "%s.tls", prefix);
        fail_at(l, st->line[FID_TLS], path, "only valid with an https:// base_url");
        return;
    }
    if (!s->tls.cert_file != !s->tls.key_file) {
        snprintf(path, sizeof(path), "%s.tls.%s", prefix,
                 s->tls.cert_file ? "key_file" : "cert_file");
        fail_at(l, st->line[s->tls.cert_file ? FID_TLS_CERT_FILE : FID_TLS_KEY_FILE], path,
                "is required with %s (a client certificate needs both)",
                s->tls.cert_file ? "cert_file" : "key_file");
        return;
    }
    const char *const files[] = { s->tls.ca_file, s->tls.cert_file, s->tls.key_file };
    const enum fid fids[] = { FID_TLS_CA_FILE, FID_TLS_CERT_FILE, FID_TLS_KEY_FILE };
    const char *const keys[] = { "ca_file", "cert_file", "key_file" };
    for (size_t k = 0; k < 3; k++) {
        struct stat sb;
        if (files[k] && access(files[k], R_OK) != 0) {
            int e = errno;
            snprintf(path, sizeof(path), "%s.tls.%s", prefix, keys[k]);
            fail_at(l, st->line[fids[k]], path, "cannot read %s: %s", files[k], strerror(e));
            return;
        }
        /* A FIFO would hang the load below (and a reload, the loop). */
        if (files[k] && (stat(files[k], &sb) != 0 || !S_ISREG(sb.st_mode))) {
            snprintf(path, sizeof(path), "%s.tls.%s", prefix, keys[k]);
            fail_at(l, st->line[fids[k]], path, "%s is not a regular file", files[k]);
            return;
        }
    }
    if (s->tls.ca_file || s->tls.cert_file) {
        struct tls_files f = { .ca_file = s->tls.ca_file,
                               .cert_file = s->tls.cert_file,
                               .key_file = s->tls.key_file };
        SSL_CTX *ctx = tls_ctx_new(&f, why, sizeof(why));
        if (!ctx) {
            snprintf(path, sizeof(path), "%s.tls", prefix);
            fail_at(l, st->line[FID_TLS], path, "%s", why);
            return;
        }
        SSL_CTX_free(ctx);
    }
    if (any_tls || s->proxy || s->no_proxy)
        s->route_id = ++next_id;
}

/* prices: input and output are required (a price left out would price
 * its tokens at 0 without a word); cached_input and cache_write default
 * to input, reasoning to output, as providers bill them when they name no
 * price of their own. */
static void validate_prices(struct loader *l, size_t i, const char *prefix)
{
    struct src_stage *st = &l->srcs[i];
    struct cost_prices *p = &st->src.prices;
    char path[CONFIG_PATH_MAX];

    if (!st->line[FID_PRICES])
        return;
    static const struct {
        enum fid fid;
        const char *key;
        enum cost_class c;
    } required[] = { { FID_PRICE_INPUT, "input", COST_INPUT },
                     { FID_PRICE_OUTPUT, "output", COST_OUTPUT } };
    for (size_t k = 0; k < 2; k++) {
        if (st->line[required[k].fid])
            continue;
        snprintf(path, sizeof(path), "%s.prices.%s", prefix, required[k].key);
        fail_at(l, st->line[FID_PRICES], path,
                "is required with prices: (per million tokens; write 0 for a class that is "
                "free)");
        return;
    }
    if (!st->line[FID_PRICE_CACHED])
        p->per_mtok[COST_CACHED] = p->per_mtok[COST_INPUT];
    if (!st->line[FID_PRICE_CACHE_WRITE])
        p->per_mtok[COST_CACHE_WRITE] = p->per_mtok[COST_INPUT];
    if (!st->line[FID_PRICE_REASONING])
        p->per_mtok[COST_REASONING] = p->per_mtok[COST_OUTPUT];
    p->set = true;
}

/* The rules of one source; each failure is reported, and the rules that
 * need a value that is missing or was rejected are skipped. */
static void validate_source(struct loader *l, size_t i)
{
    struct src_stage *st = &l->srcs[i];
    struct config_source *s = &st->src;
    const unsigned *line = st->line;
    char prefix[32], path[CONFIG_PATH_MAX]; /* "sources[N]" */
    const struct cap_stage *c = NULL;

    if (st->bad)
        return;
    snprintf(prefix, sizeof(prefix), "sources[%zu]", i);
    if (s->vertex.on && !line[FID_BASE_URL] && s->vertex.location) {
        /* Vertex AI's endpoint for the location ("global" has no prefix). */
        char url[128];
        if (strcmp(s->vertex.location, "global") == 0)
            snprintf(url, sizeof(url), "https://aiplatform.googleapis.com/v1");
        else
            snprintf(url, sizeof(url), "https://%s-aiplatform.googleapis.com/v1",
                     s->vertex.location);
        if (!(s->base_url = strdup(url))) {
            fail_nomem(l);
            return;
        }
        st->line[FID_BASE_URL] = line[FID_LOCATION];
    }
    if (s->kind == DIALECT_BEDROCK && !line[FID_BASE_URL] && s->aws.region) {
        /* The service's own endpoint in the source's region. */
        char url[128];
        snprintf(url, sizeof(url), "https://bedrock-runtime.%s.amazonaws.com", s->aws.region);
        if (!(s->base_url = strdup(url))) {
            fail_nomem(l);
            return;
        }
        st->line[FID_BASE_URL] = line[FID_REGION];
    }
    static const struct {
        enum fid fid;
        const char *key;
    } required[] = {
        { FID_NAME, "name" },
        { FID_CAPABILITY, "capability" },
        { FID_BASE_URL, "base_url" },
    };
    for (size_t k = 0; k < sizeof(required) / sizeof(required[0]); k++)
        if (!line[required[k].fid]) {
            snprintf(path, sizeof(path), "%s.%s", prefix, required[k].key);
            fail_at(l, st->map_line, path, "is required");
        }

    if (line[FID_NAME] && !line_is_bad(line[FID_NAME])) {
        size_t j = name_index_add(&l->src_ix, i, src_name_at, l->srcs);
        if (j != SIZE_MAX) {
            snprintf(path, sizeof(path), "%s.name", prefix);
            fail_at(l, line[FID_NAME], path,
                    "duplicate source name '%s' (first used by sources[%zu])", s->name, j);
        }
    }

    if (line[FID_CAPABILITY] && !line_is_bad(line[FID_CAPABILITY])) {
        size_t idx = name_index_find(&l->cap_ix, s->capability, strlen(s->capability), cap_name_at,
                                     l->caps, NULL);
        if (idx == SIZE_MAX) {
            snprintf(path, sizeof(path), "%s.capability", prefix);
            fail_at(l, line[FID_CAPABILITY], path,
                    "unknown capability '%s' (not chat, embedding, ocr, responses, nor listed "
                    "under capabilities:)",
                    s->capability);
        } else {
            s->capability_index = idx;
            c = &l->caps[idx];         /* parallel to cfg->capabilities */
            s->policy = c->cap.policy; /* a copy, for readers of sources */
        }
    }

    check_source_policy(l, i);

    snprintf(path, sizeof(path), "%s.aimd", prefix);
    check_order(l, path, st->map_line, line, FID_AIMD_MIN, "min", s->aimd.min, "default",
                FID_AIMD_INITIAL, "initial", s->aimd.initial, "default");
    snprintf(path, sizeof(path), "%s.breaker", prefix);
    check_order(l, path, st->map_line, line, FID_BREAKER_COOLDOWN, "cooldown_s",
                s->breaker.cooldown_s, "default", FID_BREAKER_MAX_COOLDOWN, "max_cooldown_s",
                s->breaker.max_cooldown_s, "default");
    /* docs/DESIGN.md §3.1: kept as a conservative guard under the two-budget model.
     * The window is the capability's, so the message says which capability
     * and where its value comes from: that is where a fix may go. */
    if (c && s->ttft_timeout_s > s->policy.stall_window_s &&
        !line_is_bad(line[FID_TTFT_TIMEOUT] | c->line[FID_STALL_WINDOW])) {
        unsigned at = line[FID_TTFT_TIMEOUT] ? line[FID_TTFT_TIMEOUT] : st->map_line;
        const char *origin = c->line[FID_STALL_WINDOW] ? ""
            : l->line[FID_STALL_WINDOW]                ? ", inherited from defaults"
                                                       : ", default";
        char a[32], b[32];

        snprintf(path, sizeof(path), "%s.ttft_timeout_s", prefix);
        fail_at(l, at, path, "must be <= stall_window_s (%s, capabilities.%s%s), got %s%s",
                fmt_num(b, sizeof(b), s->policy.stall_window_s), c->cap.name, origin,
                fmt_num(a, sizeof(a), s->ttft_timeout_s),
                line[FID_TTFT_TIMEOUT] ? "" : " (default)");
    }

    if (line[FID_API_KEY_ENV] && line[FID_API_KEY_FILE]) {
        snprintf(path, sizeof(path), "%s.api_key_file", prefix);
        fail_at(l, line[FID_API_KEY_FILE], path, "cannot be combined with api_key_env; choose one");
    }
    validate_dialect(l, i, prefix);
    validate_route(l, i, prefix);
    validate_prices(l, i, prefix);
    if (!line[FID_CACHED_INPUT])
        s->limits.cached_input_counts = !dialect_is_messages(s->kind);
    if (budget_is_set(&s->budget) && !line_is_bad(line[FID_BUDGET])) {
        snprintf(path, sizeof(path), "%s.budget", prefix);
        if (!s->prices.set && !line[FID_PRICES])
            fail_at(l, line[FID_BUDGET], path,
                    "needs prices: on the source (a budget cannot be charged by an "
                    "unpriced source)");
    }
}

/* Checks a key just read (env or file), after trailing whitespace was
 * stripped in place. Never quotes it. */
static int check_key_text(struct loader *l, unsigned line, const char *path, char *key,
                          const char *what)
{
    size_t len = strlen(key);
    while (len > 0 && isspace((unsigned char)key[len - 1]))
        key[--len] = '\0';
    if (len == 0)
        return fail_at(l, line, path, "%s is empty", what);
    if (len > CONFIG_API_KEY_MAX)
        return fail_at(l, line, path, "%s is longer than %d bytes", what, CONFIG_API_KEY_MAX);
    if (has_ctl(key, len))
        return fail_at(l, line, path,
                       "%s contains control characters (not usable in an "
                       "HTTP header)",
                       what);
    return 0;
}

/* Reads a secret from `file`; `what` names it in messages ("key", "value"). */
static int read_secret_file(struct loader *l, const char *file, unsigned line, const char *path,
                            const char *what, char **out)
{
    char what_in[48];
    char ebuf[128];
    struct stat sb;
    char *buf = NULL;
    size_t got = 0;
    int fd, rc;

    *out = NULL;
    /* O_NONBLOCK: a FIFO must not hang start-up; it is rejected below. */
    fd = open(file, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return fail_at(l, line, path, "cannot open '%s': %s", file,
                       strerror_r(errno, ebuf, sizeof(ebuf)));
    if (fstat(fd, &sb) < 0) {
        rc = fail_at(l, line, path, "cannot stat '%s': %s", file,
                     strerror_r(errno, ebuf, sizeof(ebuf)));
        goto out;
    }
    if (!S_ISREG(sb.st_mode)) {
        rc = fail_at(l, line, path, "'%s' is not a regular file", file);
        goto out;
    }
    if (sb.st_size > (off_t)CONFIG_KEY_MAX) {
        rc = fail_at(l, line, path, "'%s' is larger than %u bytes", file, CONFIG_KEY_MAX);
        goto out;
    }
    buf = malloc(CONFIG_KEY_MAX + 1);
    if (!buf) {
        rc = fail_nomem(l);
        goto out;
    }
    for (;;) {
        ssize_t k = read(fd, buf + got, CONFIG_KEY_MAX + 1 - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            rc = fail_at(l, line, path, "cannot read '%s': %s", file,
                         strerror_r(errno, ebuf, sizeof(ebuf)));
            goto out;
        }
        if (k == 0)
            break;
        got += (size_t)k;
        if (got > CONFIG_KEY_MAX) {
            rc = fail_at(l, line, path, "'%s' is larger than %u bytes", file, CONFIG_KEY_MAX);
            goto out;
        }
    }
    buf[got] = '\0';
    if (strlen(buf) != got) {
        rc = fail_at(l, line, path, "'%s' contains NUL bytes", file);
        goto out;
    }
    snprintf(what_in, sizeof(what_in), "the %s in this file", what);
    if ((rc = check_key_text(l, line, path, buf, what_in)) < 0)
        goto out;
    *out = strdup(buf);
    rc = *out ? 0 : fail_nomem(l);
out:
    if (buf) {
        explicit_bzero(buf, CONFIG_KEY_MAX + 1);
        free(buf);
    }
    close(fd);
    return rc;
}

/* An environment variable holding a secret (the key, a header value). */
static int read_secret_env(struct loader *l, const char *name, unsigned line, const char *path,
                           const char *what, char **out)
{
    const char *val = getenv(name);
    char what_in[48];
    /* The variable's name is not quoted either (see check_env_name). */
    if (!val || !*val)
        return fail_at(l, line, path, "the environment variable named here is not set or is empty");
    if (!(*out = strdup(val)))
        return fail_nomem(l);
    snprintf(what_in, sizeof(what_in), "the %s in the environment", what);
    return check_key_text(l, line, path, *out, what_in);
}

/* A growing query string; it may hold the key, so it is wiped whenever it
 * moves or is dropped. */
struct qbuf {
    char *p;
    size_t len, cap;
    int rc;
};

/* Appends s, percent-encoded (RFC 3986 unreserved characters pass) unless
 * `raw`. */
static void qbuf_add(struct qbuf *q, const char *s, bool raw)
{
    static const char hex[] = "0123456789ABCDEF";
    for (; *s && q->rc == 0; s++) {
        if (q->len + 4 > q->cap) {
            size_t ncap = q->cap ? q->cap * 2 : 128;
            char *nb = malloc(ncap);
            if (!nb) {
                q->rc = -1;
                return;
            }
            if (q->p) {
                memcpy(nb, q->p, q->len);
                explicit_bzero(q->p, q->cap);
                free(q->p);
            }
            q->p = nb;
            q->cap = ncap;
        }
        unsigned char c = (unsigned char)*s;
        if (raw || isalnum(c) || strchr("-._~", c)) {
            q->p[q->len++] = (char)c;
        } else {
            q->p[q->len++] = '%';
            q->p[q->len++] = hex[c >> 4];
            q->p[q->len++] = hex[c & 15];
        }
        q->p[q->len] = '\0';
    }
}

static void qbuf_pair(struct qbuf *q, const char *name, const char *value)
{
    qbuf_add(q, q->len ? "&" : "?", true);
    qbuf_add(q, name, false);
    qbuf_add(q, "=", true);
    qbuf_add(q, value, false);
}

/* The query string every request of source `s` carries: api-version (azure),
 * query:, then the key with auth_query. */
static int build_query(struct config_source *s)
{
    const struct dialect *d = dialect_get(s->kind);
    struct qbuf q = { 0 };

    if (d->version_query && s->api_version)
        qbuf_pair(&q, d->version_query, s->api_version);
    for (size_t i = 0; i < s->n_query; i++)
        qbuf_pair(&q, s->query[i].name, s->query[i].value);
    if (s->auth_query && s->api_key)
        qbuf_pair(&q, s->auth_query, s->api_key);
    if (q.rc == 0 && !q.p)
        q.p = strdup("");
    if (q.rc < 0 || !q.p) {
        if (q.p) {
            explicit_bzero(q.p, q.cap);
            free(q.p);
        }
        return -1;
    }
    s->req_query = q.p;
    return 0;
}

/* "Name: value"; returns owned (a secret when value is one). */
static char *header_line(const char *name, const char *prefix, const char *value)
{
    size_t n = strlen(name) + strlen(prefix) + strlen(value) + 3;
    char *line = malloc(n);
    if (line)
        snprintf(line, n, "%s: %s%s", name, prefix, value);
    return line;
}

/* The header lines every request of source `s` carries. */
static int build_headers(struct config_source *s)
{
    const struct dialect *d = dialect_get(s->kind);
    size_t n = 0, max = s->n_headers + 3;

    if (!(s->req_headers = calloc(max, sizeof(*s->req_headers))))
        return -1;
    if (s->api_key && !s->auth_query) {
        if (s->auth_header)
            s->req_headers[n++] = header_line(s->auth_header, "", s->api_key);
        else
            s->req_headers[n++] = header_line(d->key_header, d->key_prefix, s->api_key);
        if (!s->req_headers[n - 1])
            return -1;
    }
    if (d->version_header && s->anthropic_version &&
        !(s->req_headers[n++] = header_line(d->version_header, "", s->anthropic_version)))
        return -1;
    for (size_t i = 0; i < s->n_headers; i++)
        if (!(s->req_headers[n++] = header_line(s->headers[i].name, "", s->headers[i].value)))
            return -1;
    return 0;
}

/* Header values from value_env / value_file, then the request parts. */
static int load_source_extras(struct loader *l, size_t i)
{
    struct config_source *s = &l->srcs[i].src;
    char path[CONFIG_PATH_MAX];
    int rc = 0;

    for (size_t j = 0; j < s->n_headers && rc == 0; j++) {
        struct config_header *h = &s->headers[j];
        if (h->value_env) {
            snprintf(path, sizeof(path), "sources[%zu].headers[%zu].value_env", i, j);
            rc = read_secret_env(l, h->value_env, h->line, path, "value", &h->value);
        } else if (h->value_file) {
            snprintf(path, sizeof(path), "sources[%zu].headers[%zu].value_file", i, j);
            rc = read_secret_file(l, h->value_file, h->line, path, "value", &h->value);
        }
    }
    /* Built only for a load that will succeed: a header whose value did
     * not load has none to send. */
    if (rc == 0 && l->n_errors == 0 && (build_query(s) < 0 || build_headers(s) < 0))
        rc = fail_nomem(l);
    return rc;
}

/* The secrets pass: runs only once everything else is valid. */
static int load_key(struct loader *l, size_t i)
{
    struct src_stage *st = &l->srcs[i];
    char path[CONFIG_PATH_MAX];

    if (st->src.vertex.on) {
        char why[256];
        /* One token serves every Vertex source (upstream/cloudauth.h). */
        for (size_t j = 0; j < i; j++) {
            if (!l->srcs[j].src.vertex.on)
                continue;
            if (gcp_creds_same_external(&l->srcs[j].src.vertex.creds, &st->src.vertex.creds))
                break;
            enum fid f = st->line[FID_TOKEN_COMMAND] ? FID_TOKEN_COMMAND
                : st->line[FID_TOKEN_FILE]           ? FID_TOKEN_FILE
                                                     : FID_SRC_KIND;
            snprintf(path, sizeof(path), "sources[%zu].%s", i,
                     f == FID_TOKEN_COMMAND    ? "token_command"
                         : f == FID_TOKEN_FILE ? "token_file"
                                               : "kind");
            return fail_at(l, st->line[f], path,
                           "every kind: vertex source must get its token the same way (the "
                           "same token_command or token_file, or neither): one token serves "
                           "them all; sources[%zu] differs",
                           j);
        }
        snprintf(path, sizeof(path), "sources[%zu].kind", i);
        if (gcp_creds_load(&st->src.vertex.creds, why, sizeof(why)) < 0)
            return fail_at(l, st->line[FID_SRC_KIND], path, "%s", why);
        return 0;
    }
    if (st->src.kind == DIALECT_BEDROCK) {
        char why[256];
        snprintf(path, sizeof(path), "sources[%zu].kind", i);
        if (aws_creds_load(&st->src.aws, why, sizeof(why)) < 0)
            return fail_at(l, st->line[FID_SRC_KIND], path, "%s", why);
        return 0;
    }

    if (st->key_file) {
        snprintf(path, sizeof(path), "sources[%zu].api_key_file", i);
        return read_secret_file(l, st->key_file, st->line[FID_API_KEY_FILE], path, "key",
                                &st->src.api_key);
    }
    if (!st->key_env)
        return 0; /* no key: no Authorization header */
    snprintf(path, sizeof(path), "sources[%zu].api_key_env", i);
    return read_secret_env(l, st->key_env, st->line[FID_API_KEY_ENV], path, "key",
                           &st->src.api_key);
}

/* apps[i].token_env / token_file, in the secrets pass (cfg->apps[i] is
 * the staged app i by then); a token two apps share is refused, since it
 * could not say which of them calls. The token is never quoted. */
static int load_app_token(struct loader *l, size_t i)
{
    struct app_stage *st = &l->apps[i];
    struct config_app *a = &l->cfg->apps[i];
    unsigned line = st->line[FID_APP_TOKEN_FILE] | st->line[FID_APP_TOKEN_ENV];
    char path[CONFIG_PATH_MAX];
    int rc;

    if (st->token_file) {
        snprintf(path, sizeof(path), "apps[%zu].token_file", i);
        rc = read_secret_file(l, st->token_file, line, path, "token", &a->token);
    } else if (st->token_env) {
        snprintf(path, sizeof(path), "apps[%zu].token_env", i);
        rc = read_secret_env(l, st->token_env, line, path, "token", &a->token);
    } else {
        return 0;
    }
    if (rc < 0)
        return rc;
    if (strlen(a->token) < CONFIG_APP_TOKEN_MIN || strlen(a->token) > CONFIG_APP_TOKEN_MAX)
        return fail_at(l, line, path, "the token must be %d to %d bytes (a short one is guessable)",
                       CONFIG_APP_TOKEN_MIN, CONFIG_APP_TOKEN_MAX);
    for (size_t j = 0; j < i; j++)
        if (l->cfg->apps[j].token && strcmp(l->cfg->apps[j].token, a->token) == 0)
            return fail_at(l, line, path, "the same token as app '%s': a token names one app",
                           l->cfg->apps[j].name);
    a->token_file = st->token_file; /* watched for rotation */
    st->token_file = NULL;
    return 0;
}

/* backend.url_env: the URL (it may hold a password) from the environment,
 * in the secrets pass like the API keys. */
static int load_redis_url(struct loader *l)
{
    struct config *cfg = l->cfg;
    char why[200];

    if (!cfg->redis_url_env)
        return 0;
    const char *val = getenv(cfg->redis_url_env);
    if (!val || !*val)
        return fail_at(l, l->line[FID_URL_ENV], "backend.url_env",
                       "the environment variable named here is not set or is empty");
    const char *problem = redis_url_problem(val, why, sizeof(why));
    if (problem)
        return fail_at(l, l->line[FID_URL_ENV], "backend.url_env", "the URL in the environment: %s",
                       problem);
    if (strlen(val) >= CONFIG_URL_MAX)
        return fail_at(l, l->line[FID_URL_ENV], "backend.url_env",
                       "the URL in the environment is longer than %d characters",
                       CONFIG_URL_MAX - 1);
    cfg->redis_url = strdup(val);
    return cfg->redis_url ? 0 : fail_nomem(l);
}

static void app_fini(struct config_app *a)
{
    if (a->token) {
        explicit_bzero(a->token, strlen(a->token));
        free(a->token);
    }
    free(a->token_file);
    free(a->uids.v);
    free(a->gids.v);
    free(a->capabilities);
    free(a->per_capability);
    for (size_t i = 0; i < a->n_models; i++)
        free(a->models[i]);
    free(a->models);
    memset(a, 0, sizeof(*a));
}

/* An id of `ids` (of app i) already claimed by an earlier app, reported. */
static void check_ids_unique(struct loader *l, size_t i, bool gids)
{
    const struct app_stage *a = &l->apps[i];
    const struct config_ids *ids = gids ? &a->app.gids : &a->app.uids;
    char path[64];

    for (size_t k = 0; k < ids->n; k++) {
        for (size_t j = 0; j <= i; j++) {
            const struct config_ids *o = gids ? &l->apps[j].app.gids : &l->apps[j].app.uids;
            size_t end = j == i ? k : o->n;
            size_t m = 0;
            while (m < end && o->v[m] != ids->v[k])
                m++;
            if (m == end)
                continue;
            snprintf(path, sizeof(path), "apps[%zu].%s", i, gids ? "gids" : "uids");
            fail_at(l, a->line[gids ? FID_GIDS : FID_UIDS], path,
                    "%s %u is already listed by app '%s'", gids ? "gid" : "uid",
                    (unsigned)ids->v[k], l->apps[j].app.name);
            return;
        }
    }
}

/* apps[i].capabilities: each a known capability. Returns -1 only when out
 * of memory (a bad name is reported). */
static int app_resolve_caps(struct loader *l, size_t i)
{
    struct app_stage *a = &l->apps[i];
    char path[64];

    a->app.capabilities = calloc(l->cfg->n_capabilities, sizeof(bool));
    if (!a->app.capabilities)
        return -1;
    for (size_t k = 0; k < a->caps->n_kids; k++) {
        const struct ynode *e = a->caps->kids[k];
        int ci = e->kind == YN_SCALAR ? config_find_capability(l->cfg, e->text, e->len) : -1;
        if (ci < 0) {
            snprintf(path, sizeof(path), "apps[%zu].capabilities[%zu]", i, k);
            fail_at(l, e->line, path, "not a configured capability");
            continue;
        }
        a->app.capabilities[ci] = true;
    }
    return 0;
}

/* apps[i].per_capability: { CAPABILITY: {max_concurrency, rpm, tpm,
 * daily_tokens, window_s}, ... }, each a known capability. Returns -1 only
 * when out of memory (a bad entry is reported). */
static int app_resolve_per_cap(struct loader *l, size_t i)
{
    struct app_stage *a = &l->apps[i];
    const struct ynode *m = a->per_cap;

    if (ynode_is_null(m) || m->kind != YN_MAP) /* the walk reported another kind */
        return 0;
    char prefix[48];
    int n = snprintf(prefix, sizeof(prefix), "apps[%zu].per_capability", i);
    size_t old = path_push_key(l, prefix, n > 0 ? (size_t)n : 0);
    a->app.per_capability =
        calloc(l->cfg->n_capabilities ? l->cfg->n_capabilities : 1, sizeof(*a->app.per_capability));
    if (!a->app.per_capability) {
        path_pop(l, old);
        return -1;
    }
    int rc = 0;
    for (size_t k = 0; rc == 0 && k < m->n_kids / 2; k++) {
        const struct ynode *key, *v = m->kids[2 * k + 1];
        unsigned lines[FID_COUNT] = { 0 };
        if (map_key(l, m, k, &key) < 0)
            continue;
        size_t at = path_push_key(l, key->text, key->len);
        int ci = config_find_capability(l->cfg, key->text, key->len);
        if (ci < 0) {
            fail_here(l, key->line, "not a configured capability");
        } else if (!ynode_is_null(v) && v->kind != YN_MAP) {
            fail_type(l, v, "a map (max_concurrency, rpm, tpm, daily_tokens, window_s)");
        } else {
            struct config_app_limits *c = &a->app.per_capability[ci];
            *c = (struct config_app_limits){ .set = true, .limits.window_s = 60 };
            if (!ynode_is_null(v))
                rc = walk_map(l, v, app_limits_table, (char *)c, lines);
        }
        path_pop(l, at);
    }
    path_pop(l, old);
    return rc == -ENOMEM ? -1 : 0;
}

/* Names present and unique; a uid or gid in one app only. Linear in the
 * number of ids per pair of apps: the table is small (one entry per
 * application of the host). */
/* An app's budget may be charged by every source of every capability it
 * may use: each must be priced, and none may be a passthrough (its usage
 * is never read). */
static void check_app_budget(struct loader *l, size_t i)
{
    struct app_stage *a = &l->apps[i];
    char path[64];

    if (!budget_is_set(&a->app.budget) || line_is_bad(a->line[FID_BUDGET]))
        return;
    snprintf(path, sizeof(path), "apps[%zu].budget", i);
    for (size_t j = 0; j < l->n_srcs; j++) {
        const struct config_source *s = &l->srcs[j].src;
        size_t ci = s->capability_index;
        if (l->srcs[j].bad || ci >= l->n_caps || (a->app.capabilities && !a->app.capabilities[ci]))
            continue;
        if (l->caps[ci].cap.raw) {
            fail_at(l, a->line[FID_BUDGET], path,
                    "the app may use capability %s, a passthrough whose usage is never read: "
                    "list the capabilities it may use",
                    l->caps[ci].cap.name);
            return;
        }
        if (!s->prices.set && !l->srcs[j].line[FID_PRICES]) {
            fail_at(l, a->line[FID_BUDGET], path,
                    "source %s, which the app may use, has no prices: a budget cannot be "
                    "charged by an unpriced source",
                    s->name);
            return;
        }
    }
}

static int validate_apps(struct loader *l)
{
    bool have_default = false;
    char path[64];

    for (size_t i = 0; i < l->n_apps; i++) {
        struct app_stage *a = &l->apps[i];
        if (a->bad)
            continue;
        snprintf(path, sizeof(path), "apps[%zu]", i);
        if (!a->line[FID_NAME]) {
            fail_at(l, a->map_line, path, "name: is required");
            continue;
        }
        if (line_is_bad(a->line[FID_NAME]))
            continue;
        for (size_t j = 0; j < i; j++)
            if (strcmp(l->apps[j].app.name, a->app.name) == 0) {
                snprintf(path, sizeof(path), "apps[%zu].name", i);
                fail_at(l, a->line[FID_NAME], path, "duplicate app name '%s' (first at line %u)",
                        a->app.name, l->apps[j].line[FID_NAME] & ~LINE_BAD);
                break;
            }
        if (a->line[FID_APP_TOKEN_ENV] && a->line[FID_APP_TOKEN_FILE]) {
            snprintf(path, sizeof(path), "apps[%zu].token_file", i);
            fail_at(l, a->line[FID_APP_TOKEN_FILE], path,
                    "cannot be combined with token_env; choose one");
        }
        if (strcmp(a->app.name, CONFIG_DEFAULT_APP) == 0) {
            have_default = true;
            if (a->token_env || a->token_file)
                fail_at(l, a->line[FID_APP_TOKEN_ENV] | a->line[FID_APP_TOKEN_FILE], path,
                        "the default app is every caller no other app claims: it takes no "
                        "token");
            if (a->app.uids.n || a->app.gids.n)
                fail_at(l, a->line[FID_UIDS] ? a->line[FID_UIDS] : a->line[FID_GIDS], path,
                        "the default app is every caller no other app claims: it "
                        "takes no uids or gids");
        }
        if (a->app.max_tasks > l->cfg->max_tasks) {
            snprintf(path, sizeof(path), "apps[%zu].max_tasks", i);
            fail_at(l, a->line[FID_MAX_TASKS], path, "must be <= tasks.max_tasks (%u), got %u",
                    l->cfg->max_tasks, a->app.max_tasks);
        }
        check_ids_unique(l, i, false);
        check_ids_unique(l, i, true);
        if (a->caps && app_resolve_caps(l, i) < 0)
            return fail_nomem(l);
        check_app_budget(l, i);
        if (a->per_cap && app_resolve_per_cap(l, i) < 0)
            return fail_nomem(l);
    }
    if (l->n_errors)
        return 0;
    size_t n = l->n_apps + (have_default ? 0 : 1);
    l->cfg->apps = calloc(n, sizeof(*l->cfg->apps));
    if (!l->cfg->apps)
        return fail_nomem(l);
    for (size_t i = 0; i < l->n_apps; i++) {
        l->cfg->apps[i] = l->apps[i].app; /* ownership moves */
        memset(&l->apps[i].app, 0, sizeof(l->apps[i].app));
    }
    if (!have_default) {
        struct config_app *d = &l->cfg->apps[n - 1];
        snprintf(d->name, sizeof(d->name), "%s", CONFIG_DEFAULT_APP);
        d->weight = 1;
        d->limits.window_s = 60;
    }
    l->cfg->n_apps = n;
    /* One app must not take every task slot: unless set, each holds an
     * equal share of tasks.max_tasks. */
    for (size_t i = 0; i < n; i++)
        if (l->cfg->apps[i].max_tasks == 0)
            l->cfg->apps[i].max_tasks =
                l->cfg->max_tasks / n ? (uint32_t)(l->cfg->max_tasks / n) : 1;
    return 0;
}

/* A Redis password from the environment or a file, in the secrets pass;
 * and, with the URL known, the rule that TLS with a URL means rediss://. */
static int load_redis_secret(struct loader *l, int fid_env, int fid_file, const char *env,
                             const char *file, const char *key, char **out)
{
    char path[64];

    if (file) {
        snprintf(path, sizeof(path), "backend.%s_file", key);
        return read_secret_file(l, file, l->line[fid_file], path, "password", out);
    }
    if (!env)
        return 0;
    snprintf(path, sizeof(path), "backend.%s_env", key);
    const char *val = getenv(env);
    if (!val || !*val)
        return fail_at(l, l->line[fid_env], path,
                       "the environment variable named here is not set or is empty");
    if (!(*out = strdup(val)))
        return fail_nomem(l);
    return check_key_text(l, l->line[fid_env], path, *out, "the password in the environment");
}

static int load_redis_secrets(struct loader *l)
{
    struct config *cfg = l->cfg;
    int rc;
    const size_t pw_max = backend_syntax ? backend_syntax->password_max : SIZE_MAX;

    if ((rc = load_redis_secret(l, FID_PASSWORD_ENV, FID_PASSWORD_FILE, cfg->redis_password_env,
                                cfg->redis_password_file, "password", &cfg->redis_password)) ==
        -ENOMEM)
        return rc;
    if ((rc = load_redis_secret(l, FID_SENTINEL_PASSWORD_ENV, FID_SENTINEL_PASSWORD_FILE,
                                cfg->redis_sentinel_password_env, cfg->redis_sentinel_password_file,
                                "sentinel_password", &cfg->redis_sentinel_password)) == -ENOMEM)
        return rc;
    if (cfg->redis_password && strlen(cfg->redis_password) > pw_max)
        return fail_at(l, l->line[FID_PASSWORD_ENV] | l->line[FID_PASSWORD_FILE],
                       cfg->redis_password_env ? "backend.password_env" : "backend.password_file",
                       "the password is longer than %zu bytes", pw_max);
    if (cfg->redis_sentinel_password && strlen(cfg->redis_sentinel_password) > pw_max)
        return fail_at(l, l->line[FID_SENTINEL_PASSWORD_ENV] | l->line[FID_SENTINEL_PASSWORD_FILE],
                       cfg->redis_sentinel_password_env ? "backend.sentinel_password_env"
                                                        : "backend.sentinel_password_file",
                       "the password is longer than %zu bytes", pw_max);
    if (cfg->redis_tls && cfg->redis_url && strncasecmp(cfg->redis_url, "rediss://", 9) != 0)
        return fail_at(l, l->line[FID_TLS], "backend.tls",
                       "needs a rediss:// URL (TLS is what the scheme asks for)");
    if (cfg->redis_password && cfg->redis_url && backend_syntax &&
        backend_syntax->url_has_password(cfg->redis_url))
        return fail_at(l, l->line[FID_PASSWORD_ENV] | l->line[FID_PASSWORD_FILE],
                       cfg->redis_password_env ? "backend.password_env" : "backend.password_file",
                       "the URL holds a password too; keep one of them");
    return 0;
}

/* Source i's exact public names: its model, then its serves entries
 * without a '*'; name k of them (NULL past the last). */
static const char *src_exact_name(const struct config_source *s, size_t k)
{
    if (s->model) {
        if (k == 0)
            return s->model;
        k--;
    }
    for (size_t i = 0; i < s->n_serves; i++)
        if (!models_is_glob(s->serves[i]) && k-- == 0)
            return s->serves[i];
    return NULL;
}

/* The key path and line of source i's public name `name` (its model or a
 * serves entry), for messages. */
static unsigned src_name_where(const struct loader *l, size_t i, const char *name, char *path,
                               size_t len)
{
    const struct src_stage *st = &l->srcs[i];

    if (name == st->src.model) {
        snprintf(path, len, "sources[%zu].model", i);
        return st->line[FID_MODEL];
    }
    for (size_t k = 0; k < st->src.n_serves; k++)
        if (st->src.serves[k] == name)
            snprintf(path, len, "sources[%zu].serves[%zu]", i, k);
    return st->line[FID_SERVES];
}

/* A source whose capability resolved (the rules below compare them). */
static bool src_usable(const struct loader *l, size_t i)
{
    const struct src_stage *st = &l->srcs[i];
    return !st->bad && st->line[FID_CAPABILITY] && !line_is_bad(st->line[FID_CAPABILITY]) &&
        l->caps && st->src.capability_index < l->n_caps &&
        strcmp(l->caps[st->src.capability_index].cap.name, st->src.capability) == 0;
}

/* Model routing (models.h): an exact public name selects within one
 * capability, so it may be served by one capability only; and a glob (with
 * literal characters) that matches another source's exact name at another
 * priority would never serve that name (an exact name wins), which is
 * never what a fallback tier means. Quadratic in the number of sources
 * times names: a configuration has tens of them. */
static void validate_models(struct loader *l)
{
    char path[64], other[64];

    for (size_t i = 0; i < l->n_srcs; i++) {
        if (!src_usable(l, i))
            continue;
        const struct config_source *s = &l->srcs[i].src;
        for (size_t k = 0; src_exact_name(s, k); k++) {
            const char *name = src_exact_name(s, k);
            for (size_t j = 0; j < i; j++) {
                const struct config_source *o = &l->srcs[j].src;
                if (!src_usable(l, j) || o->capability_index == s->capability_index)
                    continue;
                const char *on = NULL;
                for (size_t m = 0; !on && src_exact_name(o, m); m++)
                    if (strcmp(src_exact_name(o, m), name) == 0)
                        on = src_exact_name(o, m);
                if (!on)
                    continue;
                unsigned at = src_name_where(l, i, name, path, sizeof(path));
                src_name_where(l, j, on, other, sizeof(other));
                fail_at(l, at, path,
                        "this model name is served by capability '%s' too (%s); a model "
                        "name selects sources within one capability",
                        o->capability, other);
                break;
            }
        }
        for (size_t g = 0; g < s->n_serves; g++) {
            const char *glob = s->serves[g];
            if (!models_is_glob(glob) || strspn(glob, "*") == strlen(glob))
                continue; /* a name, or a glob of '*' only (serves anything left) */
            for (size_t j = 0; j < l->n_srcs; j++) {
                const struct config_source *o = &l->srcs[j].src;
                if (j == i || !src_usable(l, j) || o->capability_index != s->capability_index ||
                    o->priority == s->priority)
                    continue;
                const char *hit = NULL;
                for (size_t m = 0; !hit && src_exact_name(o, m); m++) {
                    const char *e = src_exact_name(o, m);
                    if (models_match(glob, e, strlen(e)) >= 0 &&
                        models_rank(s->model, s->serves, s->n_serves, e, strlen(e), NULL) !=
                            MODELS_EXACT)
                        hit = e;
                }
                if (!hit)
                    continue;
                snprintf(path, sizeof(path), "sources[%zu].serves[%zu]", i, g);
                src_name_where(l, j, hit, other, sizeof(other));
                fail_at(l, l->srcs[i].line[FID_SERVES], path,
                        "this glob matches the name %s serves (priority %d): an exact name "
                        "wins over a glob, so this source (priority %d) would never serve it; "
                        "list that name in this source's serves too to make it a fallback",
                        other, (int)o->priority, (int)s->priority);
                break;
            }
        }
    }
}

static int validate(struct loader *l)
{
    int rc;

    validate_top(l);
    if ((rc = validate_capabilities(l)) < 0)
        return rc;
    if (name_index_reset(&l->src_ix, l->n_srcs) < 0)
        return fail_nomem(l);
    for (size_t i = 0; i < l->n_srcs; i++)
        validate_source(l, i);
    validate_models(l);
    if ((rc = validate_apps(l)) < 0)
        return rc;
    if (l->n_errors)
        return -EINVAL; /* no I/O for a file that is invalid */
    for (size_t i = 0; i < l->n_srcs; i++)
        if ((rc = load_key(l, i)) == -ENOMEM || (rc = load_source_extras(l, i)) == -ENOMEM)
            return rc;
    for (size_t i = 0; i < l->n_apps; i++)
        if ((rc = load_app_token(l, i)) == -ENOMEM)
            return rc;
    if ((rc = load_redis_url(l)) == -ENOMEM)
        return rc;
    if ((rc = load_redis_secrets(l)) == -ENOMEM)
        return rc;
    if (l->n_errors)
        return -EINVAL;
    if (l->n_srcs) {
        l->cfg->sources = calloc(l->n_srcs, sizeof(*l->cfg->sources));
        if (!l->cfg->sources)
            return fail_nomem(l);
        for (size_t i = 0; i < l->n_srcs; i++) {
            l->cfg->sources[i] = l->srcs[i].src; /* ownership moves */
            memset(&l->srcs[i].src, 0, sizeof(l->srcs[i].src));
            l->cfg->sources[i].api_key_file = l->srcs[i].key_file;
            l->srcs[i].key_file = NULL;
        }
        l->cfg->n_sources = l->n_srcs;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Public API                                                               */

static void loader_fini(struct loader *l)
{
    for (size_t i = 0; i < l->n_srcs; i++) {
        source_fini(&l->srcs[i].src);
        free(l->srcs[i].key_env);
        free(l->srcs[i].key_file);
        free(l->srcs[i].accepts);
        free(l->srcs[i].api);
    }
    free(l->srcs);
    for (size_t i = 0; i < l->n_apps; i++) {
        app_fini(&l->apps[i].app);
        free(l->apps[i].token_env);
        free(l->apps[i].token_file);
    }
    free(l->apps);
    for (size_t i = 0; i < l->n_caps; i++) {
        free(l->caps[i].affinity);
        free(l->caps[i].body);
    }
    free(l->caps);
    name_index_fini(&l->cap_ix);
    name_index_fini(&l->src_ix);
}

struct config *config_parse_report(const char *yaml, size_t len, const char *name,
                                   config_report_fn *report, void *arg, char *err, size_t errlen)
{
    struct loader l;
    struct ynode *root = NULL;
    int rc;

    memset(&l, 0, sizeof(l));
    l.name = name ? name : "<config>";
    l.report = report;
    l.report_arg = arg;
    l.err = err;
    l.errlen = errlen;
    if (err && errlen)
        err[0] = '\0';

    l.cfg = calloc(1, sizeof(*l.cfg));
    if (!l.cfg || !(l.cfg->path = strdup(l.name)) || config_set_defaults(l.cfg) < 0) {
        fail_nomem(&l);
        goto fail;
    }
    for (size_t i = 0; i < N_BUILTIN_CAPS; i++) {
        struct cap_stage *c = cap_add(&l, builtin_caps[i].name, strlen(builtin_caps[i].name));
        if (!c) {
            fail_nomem(&l);
            goto fail;
        }
        c->builtin = true;
        c->cap.exempt_429 = builtin_caps[i].exempt_429;
        snprintf(c->cap.path, sizeof(c->cap.path), "%s", builtin_caps[i].path);
    }

    struct yamltree_error ye;
    if ((rc = yamltree_parse(yaml ? yaml : "", yaml ? len : 0, CONFIG_DEPTH_MAX, &root, &ye)) < 0) {
        if (ye.nomem)
            fail_nomem(&l);
        else if (ye.col) {
            struct msg m = { .used = 0 };
            msg_append(&m, "%s:%u:%u: %s", l.name, ye.line, ye.col, ye.text);
            emit(&l, &m);
        } else
            fail_at(&l, ye.line, NULL, "%s", ye.text);
        goto fail;
    }
    if (!root) {
        fail_at(&l, 0, NULL,
                "empty configuration (expected a map with listen, server, "
                "backend, defaults, capabilities, sources)");
        goto fail;
    }
    if (root->kind != YN_MAP) {
        fail_at(&l, root->line, NULL, "the top level must be a map, got %s", ynode_what(root));
        goto fail;
    }
    if ((rc = walk_map(&l, root, top_table, (char *)l.cfg, l.line)) < 0)
        goto fail;
    if ((rc = validate(&l)) < 0 || l.n_errors)
        goto fail;
    ynode_free(root);
    loader_fini(&l);
    return l.cfg;
fail:
    ynode_free(root);
    loader_fini(&l);
    config_free(l.cfg);
    return NULL;
}

struct config *config_parse(const char *yaml, size_t len, const char *name, char *err,
                            size_t errlen)
{
    return config_parse_report(yaml, len, name, NULL, NULL, err, errlen);
}

static const char *file_kind(mode_t mode)
{
    return S_ISDIR(mode) ? "a directory"
        : S_ISFIFO(mode) ? "a FIFO"
        : S_ISSOCK(mode) ? "a socket"
        : S_ISCHR(mode)  ? "a character device"
        : S_ISBLK(mode)  ? "a block device"
                         : "not a regular file";
}

struct config *config_load_report(const char *path, config_report_fn *report, void *arg, char *err,
                                  size_t errlen)
{
    struct loader l = { .name = path ? path : "<null>",
                        .report = report,
                        .report_arg = arg,
                        .err = err,
                        .errlen = errlen };
    struct config *cfg = NULL;
    char ebuf[128];
    struct stat sb;
    char *buf = NULL;
    size_t got = 0;
    int fd;

    if (!path) {
        fail_at(&l, 0, NULL, "no configuration file given");
        return NULL;
    }
    if (err && errlen)
        err[0] = '\0';
    /* O_NONBLOCK: opening a FIFO must not wait for a writer (it would hang
     * start-up and --check-config); it is refused below. Reads of a regular
     * file ignore the flag. */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        fail_at(&l, 0, NULL, "cannot open: %s", strerror_r(errno, ebuf, sizeof(ebuf)));
        return NULL;
    }
    if (fstat(fd, &sb) < 0) {
        fail_at(&l, 0, NULL, "cannot stat: %s", strerror_r(errno, ebuf, sizeof(ebuf)));
        goto out;
    }
    if (!S_ISREG(sb.st_mode)) {
        fail_at(&l, 0, NULL, "not a regular file (%s)", file_kind(sb.st_mode));
        goto out;
    }
    if (sb.st_size > (off_t)CONFIG_FILE_MAX) {
        fail_at(&l, 0, NULL, "larger than %u bytes", CONFIG_FILE_MAX);
        goto out;
    }
    buf = malloc((size_t)sb.st_size + 1);
    if (!buf) {
        fail_nomem(&l);
        goto out;
    }
    while (got < (size_t)sb.st_size) {
        ssize_t k = read(fd, buf + got, (size_t)sb.st_size - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            fail_at(&l, 0, NULL, "cannot read: %s", strerror_r(errno, ebuf, sizeof(ebuf)));
            goto out;
        }
        if (k == 0)
            break; /* file shrank: parse what is there */
        got += (size_t)k;
    }
    buf[got] = '\0';
    cfg = config_parse_report(buf, got, path, report, arg, err, errlen);
out:
    if (buf) {
        explicit_bzero(buf, got);
        free(buf);
    }
    close(fd);
    return cfg;
}

struct config *config_load(const char *path, char *err, size_t errlen)
{
    return config_load_report(path, NULL, NULL, err, errlen);
}

void config_free(struct config *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; i < cfg->n_sources; i++)
        source_fini(&cfg->sources[i]);
    free(cfg->sources);
    for (size_t i = 0; i < cfg->n_apps; i++)
        app_fini(&cfg->apps[i]);
    free(cfg->apps);
    free(cfg->capabilities);
    if (cfg->redis_url) {
        explicit_bzero(cfg->redis_url, strlen(cfg->redis_url)); /* may hold a password */
        free(cfg->redis_url);
    }
    free(cfg->redis_url_env);
    free(cfg->redis_prefix);
    free(cfg->currency);
    for (size_t i = 0; i < cfg->n_redis_sentinels; i++)
        free(cfg->redis_sentinels[i]);
    free(cfg->redis_sentinels);
    for (size_t i = 0; i < cfg->n_redis_cluster; i++)
        free(cfg->redis_cluster[i]);
    free(cfg->redis_cluster);
    free(cfg->redis_master_name);
    free(cfg->redis_username);
    char *const secrets[] = { cfg->redis_password, cfg->redis_sentinel_password };
    for (size_t i = 0; i < sizeof(secrets) / sizeof(secrets[0]); i++) {
        if (secrets[i]) {
            explicit_bzero(secrets[i], strlen(secrets[i]));
            free(secrets[i]);
        }
    }
    free(cfg->redis_password_env);
    free(cfg->redis_password_file);
    free(cfg->redis_sentinel_username);
    free(cfg->redis_sentinel_password_env);
    free(cfg->redis_sentinel_password_file);
    free(cfg->redis_tls_ca_file);
    free(cfg->redis_tls_cert_file);
    free(cfg->redis_tls_key_file);
    free(cfg->redis_tls_server_name);
    free(cfg->socket_path);
    free(cfg->http_socket);
    free(cfg->http_listen);
    free(cfg->tracing.endpoint);
    free(cfg->tracing.parent);
    free(cfg->tracing.service_name);
    for (size_t i = 0; i < cfg->n_http_allowed_origins; i++)
        free(cfg->http_allowed_origins[i]);
    free(cfg->http_allowed_origins);
    for (size_t i = 0; i < cfg->n_http_allowed_hosts; i++)
        free(cfg->http_allowed_hosts[i]);
    free(cfg->http_allowed_hosts);
    free(cfg->path);
    free(cfg);
}

int config_parse_addr(const char *s, struct config_addr *a, char *why, size_t whylen)
{
    const char *colon;
    size_t hlen;

    memset(a, 0, sizeof(*a));
    if (s[0] == '[') {
        const char *end = strchr(s, ']');
        if (!end || end[1] != ':') {
            snprintf(why, whylen, "expected HOST:PORT ([ADDR]:PORT for IPv6)");
            return -1;
        }
        hlen = (size_t)(end - s - 1);
        colon = end + 1;
        if (hlen >= sizeof(a->host)) {
            snprintf(why, whylen, "host longer than %zu characters", sizeof(a->host) - 1);
            return -1;
        }
        memcpy(a->host, s + 1, hlen);
        a->ipv6 = true;
    } else {
        colon = strrchr(s, ':');
        if (!colon || colon == s || memchr(s, ':', (size_t)(colon - s))) {
            snprintf(why, whylen, "expected HOST:PORT ([ADDR]:PORT for IPv6)");
            return -1;
        }
        hlen = (size_t)(colon - s);
        if (hlen >= sizeof(a->host)) {
            snprintf(why, whylen, "host longer than %zu characters", sizeof(a->host) - 1);
            return -1;
        }
        memcpy(a->host, s, hlen);
    }
    char *end;
    errno = 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (!colon[1] || *end || errno || port > 65535 || !isdigit((unsigned char)colon[1])) {
        snprintf(why, whylen, "port must be a number from 0 to 65535");
        return -1;
    }
    a->port = (uint16_t)port;
    unsigned char buf[16];
    if (strcmp(a->host, "localhost") == 0) {
        snprintf(a->host, sizeof(a->host), "127.0.0.1");
        a->loopback = true;
    } else if (iplit_parse(a->host, strlen(a->host), a->ipv6 ? IPLIT_V6 : IPLIT_V4, buf)) {
        static const unsigned char lo6[16] = { [15] = 1 };
        a->loopback = a->ipv6 ? memcmp(buf, lo6, 16) == 0 : buf[0] == 127;
    } else {
        snprintf(why, whylen,
                 "host must be a numeric IP address or localhost (no name lookup "
                 "at start-up)");
        return -1;
    }
    return 0;
}

int config_check_http_listen(const struct config *cfg, char *why, size_t whylen)
{
    struct config_addr a;

    if (config_parse_addr(cfg->http_listen, &a, why, whylen) < 0)
        return -1;
    if (!a.loopback && !cfg->http_allow_remote) {
        snprintf(why, whylen,
                 "%s is not a loopback address: any host that reaches it spends "
                 "this host's API keys; set http.allow_remote: true to mean it",
                 cfg->http_listen);
        return -1;
    }
    return 0;
}

int config_find_capability(const struct config *cfg, const char *name, size_t len)
{
    if (!cfg || !name)
        return -1;
    for (size_t i = 0; i < cfg->n_capabilities; i++)
        if (strlen(cfg->capabilities[i].name) == len &&
            memcmp(cfg->capabilities[i].name, name, len) == 0)
            return i > (size_t)INT_MAX ? -1 : (int)i;
    return -1;
}

int config_parse_log_level(const char *s)
{
    static const char *const names[] = { "debug", "info", "warn", "error" };
    static const enum log_level levels[] = { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR };

    if (!s)
        return -1;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(s, names[i]) == 0)
            return (int)levels[i];
    return -1;
}

const struct config_app *config_find_app(const struct config *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->n_apps; i++)
        if (strcmp(cfg->apps[i].name, name) == 0)
            return &cfg->apps[i];
    return NULL;
}

static bool ids_have(const struct config_ids *ids, uint32_t id)
{
    for (size_t i = 0; i < ids->n; i++)
        if (ids->v[i] == id)
            return true;
    return false;
}

const struct config_app *config_app_for_peer(const struct config *cfg, uint32_t uid, uint32_t gid)
{
    const struct config_app *by_gid = NULL, *dflt = NULL;

    for (size_t i = 0; i < cfg->n_apps; i++) {
        const struct config_app *a = &cfg->apps[i];
        if (ids_have(&a->uids, uid))
            return a;
        if (!by_gid && ids_have(&a->gids, gid))
            by_gid = a;
        if (strcmp(a->name, CONFIG_DEFAULT_APP) == 0)
            dflt = a;
    }
    return by_gid ? by_gid : dflt;
}

/* Equal in a time that depends on the lengths only, not on where the bytes
 * differ: a caller cannot find a token byte by byte. */
static bool token_equal(const char *a, size_t alen, const char *b, size_t blen)
{
    unsigned char d = alen != blen;
    for (size_t i = 0; i < blen; i++)
        d |= (unsigned char)(b[i] ^ a[alen ? i % alen : 0]);
    return d == 0;
}

const struct config_app *config_app_for_token(const struct config *cfg, const char *tok, size_t len)
{
    const struct config_app *found = NULL;

    for (size_t i = 0; i < cfg->n_apps; i++) {
        const struct config_app *a = &cfg->apps[i];
        if (a->token && token_equal(a->token, strlen(a->token), tok, len) && !found)
            found = a; /* no early exit: every token is compared */
    }
    return found;
}

bool config_apps_have_tokens(const struct config *cfg)
{
    for (size_t i = 0; i < cfg->n_apps; i++)
        if (cfg->apps[i].token)
            return true;
    return false;
}
