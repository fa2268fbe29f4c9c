/*
 * config.h — the sidecar's YAML configuration (docs/DESIGN.md §5,
 * docs/CONFIG.md is the reference).
 *
 * config_load() parses a file into a fresh, fully-owned struct config and
 * runs the validation pass; nothing global is touched, so a reload can parse
 * a new struct and swap it in only when it is valid. Every rejection names
 * the file, the line (when known), the key path and the reason, e.g.
 *   "deploy/polygw.yaml:23: sources[1].aimd.decrease: must be in (0, 1), got 1.5"
 *   "deploy/polygw.yaml:7:3: YAML syntax error: did not find expected key (...)"
 * Unknown keys (with a hint: where else the key is known, or the nearest
 * key of that map), wrong types, negative or impossible values, unknown
 * capabilities, duplicate source names, policy keys written in a source
 * (see struct config_policy), and a source's ttft_timeout_s above its
 * capability's stall_window_s are rejected. Every error in the file is
 * found in one load (a YAML syntax error ends it: the parser cannot go on);
 * a rule that compares a rejected value is skipped, so one mistake makes one
 * message. Time is linear in the size of the file.
 *
 * Secrets: a source's API key is read from the environment variable named by
 * `api_key_env` or from the file named by `api_key_file` at load time. The key
 * is held only in source.api_key and must never be logged, returned by
 * `stats`, or quoted in an error message. The loader itself never quotes a
 * string value in a message (only numbers, key names, source/capability
 * names and the absolute path of a key file), so a key pasted into the wrong
 * field cannot leak either.
 *
 * YAML dialect: one document, YAML 1.2 core scalars (plain `true`/`false`,
 * integers, floats; a quoted "300" is a string and is rejected where a number
 * is expected); an empty value (`key:` or `~`) means "not set"; anchors,
 * aliases, tags and duplicate keys are rejected.
 */
#ifndef POLYGW_CONFIG_H
#define POLYGW_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "awscreds.h"
#include "gcpcreds.h"
#include "codec/dialect.h"
#include "budget.h"
#include "cost.h"
#include "log.h"

#define CONFIG_NAME_MAX 64 /* names: [A-Za-z0-9_.-]{1,63} */

/* An `err` buffer of this size never truncates a message (unless the file
 * name itself is very long). */
#define CONFIG_ERR_MAX 1024

/* Longest API key accepted, in bytes (after trailing whitespace is stripped).
 * Big enough for JWT-style tokens; code that formats the key into a header
 * must hold "Authorization: Bearer " + CONFIG_API_KEY_MAX + 1 bytes. */
#define CONFIG_API_KEY_MAX 4096

/* base_url is shorter than this, capability paths shorter than 256, so
 * base_url + path always fits in CONFIG_URL_MAX + 256 bytes. */
#define CONFIG_URL_MAX 1024

/* Entries of http.allowed_origins and of http.allowed_hosts, at most. */
#define CONFIG_HTTP_ALLOWED_MAX 64

enum backend_kind { BACKEND_MEMORY = 0, BACKEND_REDIS };

/* Which HTTP client carries attempts upstream (docs/CONFIG.md §3): auto =
 * polygw's own HTTP/1.1 client where it applies (plain http:// to an IP
 * address, no proxy), libcurl for the rest; libcurl = libcurl for all. */
enum upstream_client { UPSTREAM_CLIENT_AUTO = 0, UPSTREAM_CLIENT_LIBCURL };

/* Governance knobs that `defaults:` sets and that each capability may
 * override (a capability inherits what it does not set). They are per call,
 * and one call may try every source of its capability, so a source cannot
 * set them: a policy key in a source is rejected ("not a per-source key"),
 * and the governed loop reads config_capability.policy only. */
struct config_policy {
    uint32_t max_attempts;  /* >= 1 */
    double stall_window_s;  /* > 0 */
    double backoff_base_s;  /* > 0 */
    double backoff_max_s;   /* >= backoff_base_s */
    double poll_interval_s; /* > 0 */
    double node_timeout_s;  /* > 0 */
};

struct config_aimd {
    double initial, min, increase, decrease; /* min >= 1, initial >= min, 0 < decrease < 1 */
};

struct config_breaker {
    uint32_t failures;     /* >= 1 */
    double cooldown_s;     /* > 0 */
    double max_cooldown_s; /* >= cooldown_s */
};

struct config_limits {
    uint64_t rpm, tpm, daily_tokens; /* 0 = unlimited */
    double window_s;                 /* rpm/tpm window; default 60 */
    /* Sources and apps' own limits (docs/CONFIG.md §7, §12): input and
     * output tokens per window, 0 = unlimited. Sources only: whether prompt
     * tokens read from the provider's cache count against itpm (default:
     * not for kind anthropic, as it documents; yes otherwise); an app's
     * itpm counts input as the source that served the call does. */
    uint64_t itpm, otpm;
    bool cached_input_counts;
};

/* Prompt-cache affinity of a capability (docs/CONFIG.md §6): the key whose calls
 * stay on one source (gov_call_set_affinity). */
enum config_affinity { AFFINITY_NONE = 0, AFFINITY_TASK, AFFINITY_SCOPE };

/* A capability's response cache (docs/CONFIG.md, "cache"): off unless
 * ttl_s > 0. */
struct config_cache {
    double ttl_s;           /* an entry's life; 0 = the capability is not cached */
    size_t max_entry_bytes; /* an answer larger than this is not stored; default 1 MiB */
    bool shared;            /* one entry for every app, not one per app */
    /* With Redis: the life of the fleet lock a call going upstream holds
     * for its entry (> 0; default 15 s). A call longer than this lets an
     * identical one on another sidecar go upstream too. */
    double lock_s;
};
#define CONFIG_CACHE_ENTRY_DEFAULT  (1024u * 1024)
#define CONFIG_CACHE_LOCK_DEFAULT_S 15.0
#define CONFIG_CACHE_LOCK_MAX_S     3600.0

struct config_capability {
    char name[CONFIG_NAME_MAX];
    enum config_affinity affinity; /* default none */
    bool exempt_429;
    char path[256];              /* upstream path, e.g. "/chat/completions" */
    struct config_policy policy; /* defaults <- capability: what every call of
                                  * this capability is governed by */
    /* Passthrough (`body: raw`, docs/CONFIG.md §6b): the request body and
     * the answer are relayed as bytes, never parsed. */
    bool raw;
    unsigned methods;      /* CONFIG_METHOD_* bits it is served with; default POST */
    size_t max_body_bytes; /* raw: the request body's bound (default 25 MiB) */
    /* The output a call that names no max_tokens is assumed to produce,
     * for the worst case a budget reserves (docs/CONFIG.md §12a); 4096 */
    uint32_t budget_output_tokens;
    struct config_cache cache;
};

/* The HTTP methods a capability may be served with (`methods:`). */
#define CONFIG_METHOD_GET           1u
#define CONFIG_METHOD_POST          2u
#define CONFIG_METHOD_DELETE        4u
#define CONFIG_RAW_MAX_BODY_DEFAULT (25u * 1024 * 1024)

/* One extra request header of a source (`headers:`). */
struct config_header {
    char *name;       /* owned; an HTTP token, not one polygw sets itself */
    char *value;      /* owned; the literal `value`, or read from value_env /
                                * value_file in the secrets pass: may be a secret,
                                * never print; wiped by config_free */
    char *value_env;  /* owned or NULL */
    char *value_file; /* owned or NULL */
    unsigned line;
};

/* One extra query parameter of a source (`query:`). */
struct config_param {
    char *name, *value; /* owned; printable, percent-encoded when sent */
};

struct config_source {
    char name[CONFIG_NAME_MAX];
    char capability[CONFIG_NAME_MAX];
    size_t capability_index; /* into config.capabilities */
    char *base_url;          /* owned; http:// or https://, trailing '/' removed,
                                * shorter than CONFIG_URL_MAX */
    char *api_key;           /* owned secret, may be NULL (no key: send no
                                * Authorization header); trailing whitespace
                                * stripped, no control characters, at most
                                * CONFIG_API_KEY_MAX bytes; never print;
                                * wiped by config_free */
    char *api_key_file;      /* owned: the absolute path api_key was read from,
                                * or NULL (watched for rotation, reload.h) */
    bool retired;            /* never set by the loader: a source a reload
                                * removed while it was in use (reload.h) */
    char *model;             /* owned, NULL = keep body.model: the upstream name sent,
                                * and one of its public names (models.h); no '*' */
    char **serves;           /* owned: more public names and globs (models.h), or NULL */
    size_t n_serves;
    int32_t priority; /* lower tier is tried first */
    double weight;    /* > 0 */
    double timeout_s, connect_timeout_s, ttft_timeout_s, idle_timeout_s; /* > 0 */
    uint32_t max_concurrency;                                            /* >= 1 */
    struct config_aimd aimd;
    struct config_breaker breaker;
    struct config_limits limits;
    uint32_t pacer_min_interval_ms;
    struct cost_prices prices;   /* per million tokens of each class (docs/CONFIG.md
                                  * §7d); !set: unpriced, its calls have no cost */
    struct budget_limits budget; /* in currency (docs/CONFIG.md §12a); none set: no budget;
                                  * set: the source is priced */
    struct config_policy policy; /* copy of capabilities[capability_index].policy
                                  * (never set per source); kept for readers
                                  * that have only the source at hand */

    /* The upstream's dialect and how to authenticate (docs/CONFIG.md,
     * "Providers"). */
    enum dialect_kind kind;  /* default openai */
    char *api_version;       /* owned; azure only, required there */
    char *anthropic_version; /* owned; anthropic only, default "2023-06-01" */
    struct aws_creds aws;    /* bedrock only: region and credentials (awscreds.h) */
    struct {
        bool on;                /* kind: vertex (kind is then gemini or anthropic) */
        char *project;          /* owned, required */
        char *location;         /* owned, required: a region or "global" */
        struct gcp_creds creds; /* where its tokens come from (gcpcreds.h) */
    } vertex;
    char *auth_header;             /* owned or NULL: send the key verbatim in this header */
    char *auth_query;              /* owned or NULL: send the key as this query parameter */
    bool stream_usage;             /* openai/azure streams ask for usage; default true */
    bool accepts_openai;           /* anthropic: takes OpenAI chat bodies, converted */
    bool bedrock_converse;         /* bedrock: `api: converse`, the Converse API (bodies,
                                    * replies and events translated: codec/converse.h) */
    struct config_header *headers; /* owned array */
    size_t n_headers;
    struct config_param *query; /* owned array */
    size_t n_query;
    /* Built once everything is loaded, from the above and the key: */
    char **req_headers; /* owned, NULL-terminated "Name: value" lines sent with
                                * every request (key, version, headers:); secret:
                                * never print; wiped by config_free */
    char *req_query;    /* owned; "" or "?name=value&..." appended to every
                                * URL; holds the key with auth_query: never print */

    /* How the upstream is reached (docs/CONFIG.md §7c); each owned or NULL
     * (the default). The files were loaded once at load time, so a path
     * here names a readable PEM file of the right kind. */
    struct {
        char *ca_file;   /* replaces the system CA store */
        char *cert_file; /* client certificate chain; set with key_file */
        char *key_file;
        char *server_name; /* SNI / certificate name; https base_url only */
    } tls;
    char *proxy;       /* http://, https://, socks4(a):// or socks5(h):// URL */
    char *no_proxy;    /* comma-separated hosts that bypass the proxy */
    uint64_t route_id; /* 0 when all of the above are NULL, else unique */
};

/* An application (docs/APPS.md): who is calling. A connection is this app
 * when the peer's uid (SO_PEERCRED, vouched for by the kernel) is in `uids`,
 * else when its gid is in `gids`; a uid or gid names at most one app. */
struct config_ids {
    uint32_t *v; /* owned */
    size_t n;
};

/* An app's own limits on one capability (apps[i].per_capability.NAME). */
struct config_app_limits {
    bool set;                    /* listed (else every figure is 0 = unlimited) */
    uint32_t max_concurrency;    /* 0 = unlimited */
    struct config_limits limits; /* rpm/tpm/daily_tokens, window_s (default 60) */
};

struct config_app {
    char name[CONFIG_NAME_MAX];
    struct config_ids uids, gids;
    bool allow_declared;         /* its callers may name another (non-admin) app in
                                * `hello` or a call's `app` */
    bool admin;                  /* may read and stop every app's tasks, sees every
                                * app in `stats` */
    double weight;               /* > 0, default 1 */
    uint32_t max_concurrency;    /* its attempts in flight at most; 0 (default) = unlimited */
    uint32_t max_tasks;          /* task states held for it at most, 1..tasks.max_tasks;
                                  * default (resolved at load): an equal share,
                                  * tasks.max_tasks / n_apps, at least 1 */
    struct config_limits limits; /* its own rpm/tpm/daily_tokens on top of the sources' */
    struct budget_limits budget; /* in currency (docs/CONFIG.md §12a); set: every source
                                  * it may use is priced */
    bool *capabilities;          /* owned, n_capabilities flags, or NULL = every capability */
    char *token;                 /* owned secret or NULL: an HTTP client over TCP sending
                                  * `Authorization: Bearer <token>` is this app; read from
                                  * token_env / token_file, CONFIG_APP_TOKEN_MIN..MAX bytes,
                                  * unique among apps; never print; wiped by config_free */
    char *token_file;            /* owned: the absolute path token was read from, or NULL
                                  * (watched for rotation, keywatch.h) */
    char **models;               /* owned: the model names and globs its requests may
                                  * name (models.h), or NULL = any */
    size_t n_models;
    /* owned, n_capabilities entries (parallel to cfg->capabilities), or NULL
     * when the app sets no per_capability limits */
    struct config_app_limits *per_capability;
};

/* An app token's length bounds, in bytes. */
#define CONFIG_APP_TOKEN_MIN 16
#define CONFIG_APP_TOKEN_MAX 200

/* The app every caller no entry claims is. Always present in cfg->apps
 * (implicitly, with the defaults, when the file does not list it). */
#define CONFIG_DEFAULT_APP "default"

/* tracing: OpenTelemetry spans exported over OTLP/HTTP. */
struct config_tracing {
    bool enabled;             /* default false */
    char *endpoint;           /* owned; the traces URL (…/v1/traces), NULL: from the
                                  * environment, else http://localhost:4318/v1/traces */
    double sampler_ratio;     /* 0 .. 1; < 0: not given (environment, else 1) */
    char *parent;             /* owned: "child" (default) or "link"; NULL: not given */
    char *service_name;       /* owned; NULL: OTEL_SERVICE_NAME, else "polygw" */
    uint32_t max_queue_spans; /* ended spans held for export; default 2048 */
    uint32_t max_batch_spans; /* spans per export request; default 512 */
    double export_interval_s; /* a batch leaves at least this often; default 5 */
    double timeout_s;         /* export_timeout_s: one export request; 0: not given
                               * (OTEL_EXPORTER_OTLP_TIMEOUT, else 10) */
    uint32_t max_retries;     /* of one batch (429, 5xx, no answer); default 3 */
};

struct config {
    char *path; /* owned copy of the file name, for messages */

    /* listen: */
    char *socket_path;        /* owned; shorter than sun_path */
    uint32_t socket_mode;     /* e.g. 0660; given in YAML as octal digits, like chmod(1):
                                * "0660" (recommended), 0660, 660, 0o660 all mean 0660;
                                * at most 0777 and never writable by others */
    size_t max_message_bytes; /* 1 KiB .. 1 GiB, default 16 MiB */
    uint32_t max_connections; /* default 1024 */
    uint32_t max_inflight_per_connection; /* default 1024 */
    size_t max_write_queue_bytes;         /* per connection; default 2 x max_message_bytes */
    size_t max_buffered_input_bytes;      /* partial frames, all connections; default
                                           * 4 x max_message_bytes, >= max_message_bytes */
    double idle_timeout_s; /* close connections idle this long; 0 (default) = never */

    /* http: (docs/HTTP.md) */
    char *http_socket; /* owned; HTTP over this Unix socket (mode: socket_mode), or NULL */
    char *http_listen; /* owned; "HOST:PORT" for TCP, or NULL; loopback unless
                                * http_allow_remote (config_check_http_listen) */
    bool http_allow_remote;
    bool http_allow_status_remote;   /* the status page (status.h) to TCP peers off loopback */
    size_t http_max_body_bytes;      /* request bodies larger get 413; default 16 MiB */
    size_t http_max_header_bytes;    /* request line + headers larger get 431; default 32 KiB */
    uint32_t http_max_connections;   /* default 1024 */
    double http_header_timeout_s;    /* request line + headers must arrive within; default 10 */
    double http_body_timeout_s;      /* the body must arrive within; default 60 */
    double http_keepalive_timeout_s; /* an idle connection is closed after; default 75 */
    double http_send_timeout_s;      /* an answer's queued bytes not taken for this long close
                                    * the connection (and cancel its call); default 60 */
    /* Browsers (docs/HTTP.md section 8): origins whose pages may call the
     * front ("http://localhost:3000"), and host names a TCP request's Host
     * may carry besides IP addresses and `localhost`. Owned arrays of at
     * most CONFIG_HTTP_ALLOWED_MAX, or NULL. */
    char **http_allowed_origins;
    size_t n_http_allowed_origins;
    char **http_allowed_hosts;
    size_t n_http_allowed_hosts;

    /* server: */
    enum log_level log_level;             /* default info */
    double shutdown_grace_s;              /* default 10 */
    bool access_log;                      /* one info line per finished call; default true */
    enum upstream_client upstream_client; /* default auto */
    uint32_t dns_ttl_s;                   /* how long an upstream host name's address
                                           * is used; default 60 */
    char *currency;                       /* owned; the label of every price and cost,
                                           * [A-Za-z0-9_]{1,16}, default "USD" */

    /* tasks: */
    double
        task_ttl_s; /* finished (or idle running) tasks are forgotten after this; default 86400 */
    uint32_t max_tasks; /* task states held at most; default 65536 */

    /* responses: which source produced each Responses API response, for
     * its follow-ups (docs/CONFIG.md, "responses") */
    double responses_remember_s;       /* 0 = not remembered; default 30 days */
    uint32_t responses_max_remembered; /* memory backend; default 100000 */
    size_t cache_max_bytes;            /* the response cache's memory cap; default 64 MiB */

    /* backend: */
    enum backend_kind backend;
    char *redis_url;                /* owned, backend redis only: redis://... or unix://...;
                                * may hold a password: never print, wiped on free */
    char *redis_url_env;            /* owned: the variable redis_url was read from, or NULL */
    char *redis_prefix;             /* owned, default "polygw", [A-Za-z0-9_.:{}-]{1,63} */
    double redis_command_timeout_s; /* bounds every Redis round trip; default 1 */
    double redis_lease_ttl_s;       /* a dead sidecar's permits return after this; default 30 */
    char **redis_sentinels;         /* owned array of "host:port" (instead of a URL), or NULL */
    size_t n_redis_sentinels;
    char **redis_cluster; /* owned array of Redis Cluster seed "host:port" (instead of a URL) */
    size_t n_redis_cluster;
    char *redis_master_name; /* owned; required with sentinels */
    uint32_t redis_db;       /* with sentinels (a URL carries its own); default 0 */
    char *redis_username;    /* owned ACL user, or NULL (the default user) */
    char *redis_password;    /* owned, from password_env / password_file; wiped on free */
    char *redis_password_env, *redis_password_file; /* owned: where it was read from */
    char *redis_sentinel_username;                  /* owned; the sentinels' own credentials */
    char *redis_sentinel_password;                  /* owned, wiped on free */
    char *redis_sentinel_password_env, *redis_sentinel_password_file;
    bool redis_tls; /* backend.tls given: TLS to the sentinels (with a URL,
                                * rediss:// decides and backend.tls configures it) */
    char *redis_tls_ca_file, *redis_tls_cert_file, *redis_tls_key_file; /* owned or NULL */
    char *redis_tls_server_name; /* owned or NULL: the name to verify */

    /* tracing: (docs/OPERATIONS.md, Tracing); the environment's
     * OTEL_* variables fill what it leaves unset (sidecar/trace/trace.h). */
    struct config_tracing tracing;

    struct config_policy defaults;

    struct config_capability *capabilities; /* owned array; chat, embedding, ocr
                                             * first (always present), then custom
                                             * ones in file order */
    size_t n_capabilities;
    struct config_source *sources; /* owned array */
    size_t n_sources;
    struct config_app *apps; /* owned array, file order; `default`
                                             * last when not listed */
    size_t n_apps;           /* >= 1 */
};

/* Receives each error of a load, in the order found (the walk in file
 * order, then the cross-field rules, then the secrets), as one line
 * "FILE[:LINE]: [KEY.PATH: ]REASON" without a newline. `msg` is borrowed:
 * valid only during the call. Called synchronously from inside the load;
 * must not call the loader again. */
typedef void config_report_fn(void *arg, const char *msg);

/* The syntax of the addresses in the backend section (backend.url, the URL
 * backend.url_env names, backend.sentinels) and the longest password it
 * takes: the state backend's to know (backend.h), handed to the loader by
 * the process owner before its first load. Until then those values are
 * only checked to be present. */
struct config_backend_syntax {
    /* NULL when `url` is usable; else why (in `why`, or a static text),
     * never quoting the password. */
    const char *(*url_problem)(const char *url, char *why, size_t whylen);
    /* NULL when `s` is a usable "host:port"; else why. */
    const char *(*hostport_problem)(const char *s, char *why, size_t whylen);
    /* Does `url` (a usable one) carry a password? */
    bool (*url_has_password)(const char *url);
    size_t password_max; /* bytes */
};
void config_set_backend_syntax(const struct config_backend_syntax *syntax);

/* Parses and validates `path` (borrowed; a regular file of at most 16 MiB:
 * a FIFO, device or directory is refused at once, never read). Returns a
 * new config (owned by the caller, who frees it with config_free), or NULL
 * with the first reason in `err` (always NUL-terminated when errlen > 0;
 * `err` may be NULL). Reads environment variables and key files for API
 * keys, only once everything else validated. Touches no global state except
 * reading the environment and the backend syntax; never prints, never
 * exits; safe to call again for a reload while the old config is in use. */
struct config *config_load(const char *path, char *err, size_t errlen);

/* config_load that also hands every error to `report` (may be NULL), with
 * `arg` (borrowed). */
struct config *config_load_report(const char *path, config_report_fn *report, void *arg, char *err,
                                  size_t errlen);

/* Same, from an in-memory YAML document of `len` bytes (borrowed, need not
 * be NUL-terminated); `name` (borrowed, NULL = "<config>") is used in messages
 * and in cfg->path in place of the file name. Key files are still read from
 * disk. */
struct config *config_parse(const char *yaml, size_t len, const char *name, char *err,
                            size_t errlen);
struct config *config_parse_report(const char *yaml, size_t len, const char *name,
                                   config_report_fn *report, void *arg, char *err, size_t errlen);

/* Frees everything, wiping the API keys (and the Redis URL) first. NULL is
 * a no-op. */
void config_free(struct config *cfg);

/* Index into cfg->capabilities of the capability named `name` (`len` bytes,
 * exact match, need not be NUL-terminated), or -1. */
int config_find_capability(const struct config *cfg, const char *name, size_t len);

/* The app named `name` (NUL-terminated), or NULL. */
const struct config_app *config_find_app(const struct config *cfg, const char *name);

/* The app of a peer with credentials `uid`, `gid`: the entry listing the
 * uid, else the one listing the gid, else `default`. Never NULL. */
const struct config_app *config_app_for_peer(const struct config *cfg, uint32_t uid, uint32_t gid);

/* The app whose token is the `len` bytes at `tok` (borrowed, client
 * input), or NULL. Compares every token, each in constant time. */
const struct config_app *config_app_for_token(const struct config *cfg, const char *tok,
                                              size_t len);
/* True when some app has a token (then TCP HTTP callers must send one). */
bool config_apps_have_tokens(const struct config *cfg);

/* A TCP listen address, "HOST:PORT" or "[ADDR]:PORT": HOST is a numeric
 * IPv4/IPv6 address or "localhost" (which becomes 127.0.0.1). */
struct config_addr {
    char host[64];
    uint16_t port; /* 0 = any free port */
    bool ipv6;
    bool loopback; /* 127.0.0.0/8 or ::1 */
};

/* Parses `s` (borrowed). Returns 0, or -1 with a reason in `why`. */
int config_parse_addr(const char *s, struct config_addr *a, char *why, size_t whylen);

/* Checks cfg->http_listen (set): parses, and refuses a non-loopback
 * address unless http_allow_remote. Returns 0, or -1 with `why`. For a
 * value set after config_load (--http-listen). */
int config_check_http_listen(const struct config *cfg, char *why, size_t whylen);

/* "debug", "info", "warn", "error" -> level; returns -1 for anything else. */
int config_parse_log_level(const char *s);

#endif /* POLYGW_CONFIG_H */
