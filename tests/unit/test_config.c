/* test_config.c — the YAML configuration loader (sidecar/core/config.c).
 *
 * Most tests feed config_parse() an inline document named "t.yaml" and check
 * either the loaded values or that the first error names the file, the line,
 * the key path and the reason; config_parse_report() tests check the whole
 * list of errors. Secrets tests use setenv() (each test runs in
 * its own fork) and mkstemp() key files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/config.h"
#include "suites.h"

/* A valid source, to which tests append keys (4-space indent). */
#define SRC0                 \
    "sources:\n"             \
    "  - name: a\n"          \
    "    capability: chat\n" \
    "    base_url: http://127.0.0.1:1/v1\n"
#define SRC1                      \
    "  - name: b\n"               \
    "    capability: embedding\n" \
    "    base_url: https://example.com/v1\n"

#define SECRET "sk-live-TOPSECRET-0123456789"

static struct config *parse(const char *yaml, char *err, size_t errlen)
{
    return config_parse(yaml, strlen(yaml), "t.yaml", err, errlen);
}

/* Asserts that `yaml` is rejected with "t.yaml:LINE: PATH: ...REASON...".
 * line 0: the line is not checked; path "": no key path expected. */
static void expect_reject(const char *yaml, int line, const char *path, const char *reason)
{
    char err[CONFIG_ERR_MAX], want[512];
    struct config *cfg = parse(yaml, err, sizeof(err));

    if (cfg)
        config_free(cfg);
    ck_assert_msg(cfg == NULL, "accepted:\n%s", yaml);
    ck_assert_msg(strncmp(err, "t.yaml", 6) == 0, "no file name in: %s", err);
    if (line > 0) {
        snprintf(want, sizeof(want), "t.yaml:%d: ", line);
        ck_assert_msg(strncmp(err, want, strlen(want)) == 0, "want '%s' in: %s", want, err);
    }
    if (*path) {
        snprintf(want, sizeof(want), " %s: ", path);
        ck_assert_msg(strstr(err, want) != NULL, "no key path '%s' in: %s", path, err);
    }
    ck_assert_msg(strstr(err, reason) != NULL, "no reason '%s' in: %s", reason, err);
    ck_assert_msg(strstr(err, SECRET) == NULL, "secret leaked: %s", err);
}

static struct config *expect_ok(const char *yaml)
{
    char err[CONFIG_ERR_MAX];
    struct config *cfg = parse(yaml, err, sizeof(err));
    ck_assert_msg(cfg != NULL, "rejected: %s\n%s", err, yaml);
    return cfg;
}

/* Writes `content` to a fresh mkstemp file; returns its path in `path`. */
static void write_temp(char *path, size_t len, const char *content)
{
    snprintf(path, len, "/tmp/polygw-test-key-XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, content, strlen(content)), (ssize_t)strlen(content));
    close(fd);
}

/* ------------------------------------------------------------------------ */
/* Accepted configurations                                                  */

START_TEST(test_config__minimal_defaults)
{
    struct config *cfg = expect_ok(SRC0);

    ck_assert_str_eq(cfg->path, "t.yaml");
    ck_assert_str_eq(cfg->socket_path, "/run/polygw/polygw.sock");
    ck_assert_uint_eq(cfg->socket_mode, 0660);
    ck_assert_uint_eq(cfg->max_message_bytes, 16777216);
    ck_assert_uint_eq(cfg->max_connections, 1024);
    ck_assert_uint_eq(cfg->max_inflight_per_connection, 1024);
    ck_assert_uint_eq(cfg->max_write_queue_bytes, 2 * 16777216);
    ck_assert_int_eq(cfg->log_level, LOG_INFO);
    ck_assert_double_eq(cfg->shutdown_grace_s, 10);
    ck_assert(cfg->access_log);
    ck_assert_int_eq(cfg->backend, BACKEND_MEMORY);
    ck_assert_ptr_null(cfg->redis_url);
    ck_assert_str_eq(cfg->redis_prefix, "polygw");

    ck_assert_uint_eq(cfg->defaults.max_attempts, 3);
    ck_assert_double_eq(cfg->defaults.stall_window_s, 300);
    ck_assert_double_eq(cfg->defaults.backoff_base_s, 2);
    ck_assert_double_eq(cfg->defaults.backoff_max_s, 60);
    ck_assert_double_eq(cfg->defaults.poll_interval_s, 1);
    ck_assert_double_eq(cfg->defaults.node_timeout_s, 600);

    ck_assert_uint_eq(cfg->n_capabilities, 4);
    ck_assert_str_eq(cfg->capabilities[0].name, "chat");
    ck_assert(cfg->capabilities[0].exempt_429);
    ck_assert_str_eq(cfg->capabilities[0].path, "/chat/completions");
    ck_assert_str_eq(cfg->capabilities[1].name, "embedding");
    ck_assert(!cfg->capabilities[1].exempt_429);
    ck_assert_str_eq(cfg->capabilities[1].path, "/embeddings");
    ck_assert_str_eq(cfg->capabilities[2].name, "ocr");
    ck_assert(!cfg->capabilities[2].exempt_429);
    ck_assert_str_eq(cfg->capabilities[2].path, "/ocr");
    ck_assert_str_eq(cfg->capabilities[3].name, "responses");
    ck_assert(cfg->capabilities[3].exempt_429);
    ck_assert_str_eq(cfg->capabilities[3].path, "/responses");
    for (size_t i = 0; i < 4; i++)
        ck_assert_mem_eq(&cfg->capabilities[i].policy, &cfg->defaults, sizeof(cfg->defaults));

    ck_assert_uint_eq(cfg->n_sources, 1);
    const struct config_source *s = &cfg->sources[0];
    ck_assert_str_eq(s->name, "a");
    ck_assert_str_eq(s->capability, "chat");
    ck_assert_uint_eq(s->capability_index, 0);
    ck_assert_str_eq(s->base_url, "http://127.0.0.1:1/v1");
    ck_assert_ptr_null(s->api_key);
    ck_assert_ptr_null(s->model);
    ck_assert_int_eq(s->priority, 0);
    ck_assert_double_eq(s->weight, 1);
    ck_assert_double_eq(s->timeout_s, 300);
    ck_assert_double_eq(s->connect_timeout_s, 10);
    ck_assert_double_eq(s->ttft_timeout_s, 60);
    ck_assert_double_eq(s->idle_timeout_s, 60);
    ck_assert_uint_eq(s->max_concurrency, 16);
    ck_assert_double_eq(s->aimd.initial, 4);
    ck_assert_double_eq(s->aimd.min, 1);
    ck_assert_double_eq(s->aimd.increase, 1);
    ck_assert_double_eq(s->aimd.decrease, 0.5);
    ck_assert_uint_eq(s->breaker.failures, 5);
    ck_assert_double_eq(s->breaker.cooldown_s, 30);
    ck_assert_double_eq(s->breaker.max_cooldown_s, 300);
    ck_assert_uint_eq(s->limits.rpm, 0);
    ck_assert_uint_eq(s->limits.tpm, 0);
    ck_assert_uint_eq(s->limits.daily_tokens, 0);
    ck_assert_uint_eq(s->pacer_min_interval_ms, 0);
    ck_assert_mem_eq(&s->policy, &cfg->defaults, sizeof(cfg->defaults));
    config_free(cfg);
}
END_TEST

START_TEST(test_config__no_sources)
{
    struct config *cfg = expect_ok("listen: {}\nsources: []\n");
    ck_assert_uint_eq(cfg->n_sources, 0);
    ck_assert_ptr_null(cfg->sources);
    ck_assert_uint_eq(cfg->n_capabilities, 4);
    config_free(cfg);
}
END_TEST

START_TEST(test_config__full_example)
{
    /* A full example configuration, with the key from a variable. */
    setenv("POLYGW_TEST_KEY", SECRET, 1);
    struct config *cfg = expect_ok(
        "listen:   { socket: /run/polygw/polygw.sock, mode: \"0660\", max_message_bytes: 16777216 "
        "}\n"
        "backend:  { kind: memory }\n"
        "defaults: { max_attempts: 3, stall_window_s: 300, backoff_base_s: 2, backoff_max_s: 60,\n"
        "            poll_interval_s: 1, node_timeout_s: 600 }\n"
        "capabilities:\n"
        "  chat:      { exempt_429: true }\n"
        "  embedding: { exempt_429: false }\n"
        "  ocr:       { exempt_429: false, path: /ocr }\n"
        "sources:\n"
        "  - name: openai-a\n"
        "    capability: chat\n"
        "    base_url: https://api.example.com/v1\n"
        "    api_key_env: POLYGW_TEST_KEY\n"
        "    model: gpt-4o-mini\n"
        "    priority: 0\n"
        "    weight: 1\n"
        "    timeout_s: 300\n"
        "    connect_timeout_s: 10\n"
        "    ttft_timeout_s: 60\n"
        "    idle_timeout_s: 60\n"
        "    max_concurrency: 16\n"
        "    aimd:    { initial: 4, min: 1, increase: 1, decrease: 0.5 }\n"
        "    breaker: { failures: 5, cooldown_s: 30, max_cooldown_s: 300 }\n"
        "    limits:  { rpm: 500, tpm: 200000, daily_tokens: 0 }\n"
        "    pacer:   { min_interval_ms: 0 }\n");
    const struct config_source *s = &cfg->sources[0];
    ck_assert_str_eq(s->name, "openai-a");
    ck_assert_str_eq(s->model, "gpt-4o-mini");
    ck_assert_str_eq(s->api_key, SECRET);
    ck_assert_uint_eq(s->limits.rpm, 500);
    ck_assert_uint_eq(s->limits.tpm, 200000);
    config_free(cfg);
}
END_TEST

START_TEST(test_config__all_values_set)
{
    struct config *cfg =
        expect_ok("listen:\n"
                  "  socket: /tmp/x.sock\n"
                  "  mode: \"0600\"\n"
                  "  max_message_bytes: 1024\n"
                  "  max_connections: 7\n"
                  "  max_inflight_per_connection: 9\n"
                  "  max_write_queue_bytes: 4096\n"
                  "server: { log_level: debug, shutdown_grace_s: 0, access_log: false }\n"
                  "backend: { kind: redis, url: \"redis://:pw@127.0.0.1:6379/0\", prefix: "
                  "\"{pgw}:a\" }\n" SRC0 "    model: m\n"
                  "    priority: -2\n"
                  "    weight: 0.25\n"
                  "    max_concurrency: 3\n"
                  "    limits: { rpm: 0x10, tpm: 1000000, daily_tokens: 9000000000000 }\n"
                  "    pacer: { min_interval_ms: 250 }\n"
                  "    timeout_s: 1.5e2\n");
    ck_assert_str_eq(cfg->socket_path, "/tmp/x.sock");
    ck_assert_uint_eq(cfg->socket_mode, 0600);
    ck_assert_uint_eq(cfg->max_message_bytes, 1024);
    ck_assert_uint_eq(cfg->max_connections, 7);
    ck_assert_uint_eq(cfg->max_inflight_per_connection, 9);
    ck_assert_uint_eq(cfg->max_write_queue_bytes, 4096);
    ck_assert_int_eq(cfg->log_level, LOG_DEBUG);
    ck_assert_double_eq(cfg->shutdown_grace_s, 0);
    ck_assert(!cfg->access_log);
    ck_assert_int_eq(cfg->backend, BACKEND_REDIS);
    ck_assert_str_eq(cfg->redis_url, "redis://:pw@127.0.0.1:6379/0");
    ck_assert_str_eq(cfg->redis_prefix, "{pgw}:a");
    const struct config_source *s = &cfg->sources[0];
    ck_assert_int_eq(s->priority, -2);
    ck_assert_double_eq(s->weight, 0.25);
    ck_assert_uint_eq(s->max_concurrency, 3);
    ck_assert_uint_eq(s->limits.rpm, 16);
    ck_assert_uint_eq(s->limits.daily_tokens, 9000000000000ULL);
    ck_assert_uint_eq(s->pacer_min_interval_ms, 250);
    ck_assert_double_eq(s->timeout_s, 150);
    config_free(cfg);
}
END_TEST

START_TEST(test_config__inheritance)
{
    struct config *cfg =
        expect_ok("defaults: { max_attempts: 5, backoff_max_s: 120 }\n"
                  "capabilities:\n"
                  "  embedding: { stall_window_s: 900, backoff_base_s: 4, max_attempts: 7,\n"
                  "               node_timeout_s: 30 }\n" SRC0 SRC1);
    int chat = config_find_capability(cfg, "chat", 4);
    int emb = config_find_capability(cfg, "embedding", 9);
    ck_assert_int_eq(chat, 0);
    ck_assert_int_eq(emb, 1);

    /* defaults */
    ck_assert_uint_eq(cfg->defaults.max_attempts, 5);
    ck_assert_double_eq(cfg->defaults.backoff_max_s, 120);
    ck_assert_double_eq(cfg->defaults.stall_window_s, 300);
    /* capability <- defaults */
    const struct config_policy *pe = &cfg->capabilities[emb].policy;
    ck_assert_uint_eq(pe->max_attempts, 7);
    ck_assert_double_eq(pe->stall_window_s, 900);
    ck_assert_double_eq(pe->backoff_base_s, 4);
    ck_assert_double_eq(pe->backoff_max_s, 120);
    ck_assert_double_eq(pe->poll_interval_s, 1);
    ck_assert_double_eq(pe->node_timeout_s, 30);
    ck_assert_mem_eq(&cfg->capabilities[chat].policy, &cfg->defaults, sizeof(cfg->defaults));
    /* source: a copy of its capability's policy, whole */
    ck_assert_uint_eq(cfg->sources[0].capability_index, (size_t)chat);
    ck_assert_mem_eq(&cfg->sources[0].policy, &cfg->capabilities[chat].policy, sizeof(*pe));
    ck_assert_uint_eq(cfg->sources[1].capability_index, (size_t)emb);
    ck_assert_mem_eq(&cfg->sources[1].policy, pe, sizeof(*pe));
    config_free(cfg);
}
END_TEST

START_TEST(test_config__inheritance_order_independent)
{
    /* Sources before capabilities before defaults: same result. */
    struct config *cfg = expect_ok(SRC0 "capabilities: { chat: { stall_window_s: 100 } }\n"
                                        "defaults: { stall_window_s: 200, max_attempts: 9 }\n");
    ck_assert_double_eq(cfg->sources[0].policy.stall_window_s, 100);
    ck_assert_uint_eq(cfg->sources[0].policy.max_attempts, 9);
    ck_assert_double_eq(cfg->capabilities[2].policy.stall_window_s, 200);
    config_free(cfg);
}
END_TEST

START_TEST(test_config__builtin_override_partial)
{
    struct config *cfg = expect_ok("capabilities:\n"
                                   "  chat: { exempt_429: false }\n"
                                   "  ocr: { path: /v2/ocr }\n"
                                   "  embedding:\n");
    ck_assert_uint_eq(cfg->n_capabilities, 4);
    ck_assert(!cfg->capabilities[0].exempt_429);
    ck_assert_str_eq(cfg->capabilities[0].path, "/chat/completions");
    ck_assert(!cfg->capabilities[2].exempt_429);
    ck_assert_str_eq(cfg->capabilities[2].path, "/v2/ocr");
    ck_assert_str_eq(cfg->capabilities[1].path, "/embeddings");
    config_free(cfg);
}
END_TEST

START_TEST(test_config__custom_capability)
{
    struct config *cfg =
        expect_ok("capabilities:\n"
                  "  vision: { path: /vision, max_attempts: 2 }\n"
                  "sources:\n"
                  "  - { name: v1, capability: vision, base_url: \"http://h/\" }\n");
    ck_assert_uint_eq(cfg->n_capabilities, 5);
    int v = config_find_capability(cfg, "vision", 6);
    ck_assert_int_eq(v, 4);
    ck_assert(!cfg->capabilities[v].exempt_429);
    ck_assert_str_eq(cfg->capabilities[v].path, "/vision");
    ck_assert_uint_eq(cfg->capabilities[v].policy.max_attempts, 2);
    ck_assert_uint_eq(cfg->sources[0].capability_index, 4);
    ck_assert_uint_eq(cfg->sources[0].policy.max_attempts, 2);
    ck_assert_str_eq(cfg->sources[0].base_url, "http://h"); /* trailing '/' dropped */
    ck_assert_int_eq(config_find_capability(cfg, "visio", 5), -1);
    ck_assert_int_eq(config_find_capability(cfg, "visions", 7), -1);
    config_free(cfg);
}
END_TEST

START_TEST(test_config__mode_forms)
{
    static const struct {
        const char *text;
        unsigned mode;
    } cases[] = {
        { "\"0660\"", 0660 }, { "0660", 0660 },   { "660", 0660 }, { "\"0o750\"", 0750 },
        { "0o600", 0600 },    { "'0700'", 0700 }, { "\"0\"", 0 },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char yaml[128];
        snprintf(yaml, sizeof(yaml), "listen: { mode: %s }\n", cases[i].text);
        struct config *cfg = expect_ok(yaml);
        ck_assert_msg(cfg->socket_mode == cases[i].mode, "%s -> %o", cases[i].text,
                      cfg->socket_mode);
        config_free(cfg);
    }
}
END_TEST

START_TEST(test_config__null_means_default)
{
    struct config *cfg = expect_ok("listen:\n"
                                   "  socket:\n"
                                   "  mode: ~\n"
                                   "server:\n"
                                   "defaults:\n"
                                   "capabilities:\n" SRC0 "    model: null\n"
                                   "    aimd:\n"
                                   "    timeout_s:\n");
    ck_assert_str_eq(cfg->socket_path, "/run/polygw/polygw.sock");
    ck_assert_uint_eq(cfg->socket_mode, 0660);
    ck_assert_ptr_null(cfg->sources[0].model);
    ck_assert_double_eq(cfg->sources[0].timeout_s, 300);
    ck_assert_double_eq(cfg->sources[0].aimd.initial, 4);
    config_free(cfg);
}
END_TEST

START_TEST(test_config__name_max_length)
{
    char yaml[512], name[CONFIG_NAME_MAX];
    memset(name, 'n', CONFIG_NAME_MAX - 1);
    name[CONFIG_NAME_MAX - 1] = '\0';
    snprintf(yaml, sizeof(yaml),
             "sources:\n  - { name: %s, capability: chat, base_url: \"http://h\" }\n", name);
    struct config *cfg = expect_ok(yaml);
    ck_assert_str_eq(cfg->sources[0].name, name);
    config_free(cfg);
}
END_TEST

START_TEST(test_config__stall_equal_ttft_ok)
{
    struct config *cfg = expect_ok("capabilities: { chat: { stall_window_s: 60 } }\n" SRC0
                                   "    ttft_timeout_s: 60\n");
    config_free(cfg);
}
END_TEST

START_TEST(test_config__api_key_env)
{
    setenv("POLYGW_TEST_KEY", SECRET " \n", 1);
    struct config *cfg = expect_ok(SRC0 "    api_key_env: POLYGW_TEST_KEY\n" SRC1);
    ck_assert_str_eq(cfg->sources[0].api_key, SECRET); /* trailing space stripped */
    ck_assert_ptr_null(cfg->sources[1].api_key);       /* no key: no header */
    config_free(cfg);
}
END_TEST

START_TEST(test_config__api_key_file)
{
    char file[64], yaml[512];
    write_temp(file, sizeof(file), SECRET "\r\n");
    snprintf(yaml, sizeof(yaml), SRC0 "    api_key_file: %s\n", file);
    struct config *cfg = expect_ok(yaml);
    ck_assert_str_eq(cfg->sources[0].api_key, SECRET);
    ck_assert_str_eq(cfg->sources[0].api_key_file, file); /* kept for the key watch */
    ck_assert(!cfg->sources[0].retired);
    config_free(cfg);
    unlink(file);
}
END_TEST

START_TEST(test_config__load_file)
{
    char file[64];
    char err[CONFIG_ERR_MAX];
    write_temp(file, sizeof(file), SRC0 "    weight: 2\n");
    struct config *cfg = config_load(file, err, sizeof(err));
    ck_assert_msg(cfg != NULL, "%s", err);
    ck_assert_str_eq(cfg->path, file);
    ck_assert_double_eq(cfg->sources[0].weight, 2);
    config_free(cfg);
    unlink(file);

    /* Error messages carry the real file name. */
    write_temp(file, sizeof(file), SRC0 "    weight: 0\n");
    cfg = config_load(file, err, sizeof(err));
    ck_assert_ptr_null(cfg);
    char want[128];
    snprintf(want, sizeof(want), "%s:5: sources[0].weight: must be > 0, got 0", file);
    ck_assert_str_eq(err, want);
    unlink(file);
}
END_TEST

START_TEST(test_config__load_missing_file)
{
    char err[CONFIG_ERR_MAX];
    struct config *cfg = config_load("/nonexistent/polygw.yaml", err, sizeof(err));
    ck_assert_ptr_null(cfg);
    ck_assert_str_eq(err, "/nonexistent/polygw.yaml: cannot open: No such file or directory");
}
END_TEST

START_TEST(test_config__deploy_demo_loads)
{
    /* The demo config of `make run` must stay valid (tests run from the repo root). */
    char err[CONFIG_ERR_MAX];
    struct config *cfg = config_load("deploy/polygw.yaml", err, sizeof(err));
    ck_assert_msg(cfg != NULL, "%s", err);
    ck_assert_int_eq(cfg->backend, BACKEND_MEMORY);
    ck_assert_uint_ge(cfg->n_sources, 3);
    for (size_t i = 0; i < cfg->n_sources; i++)
        ck_assert_ptr_null(cfg->sources[i].api_key);
    config_free(cfg);
}
END_TEST

START_TEST(test_config__small_err_buffer)
{
    char err[8];
    memset(err, 'x', sizeof(err));
    ck_assert_ptr_null(config_parse("listen: 1\n", 10, "t.yaml", err, sizeof(err)));
    ck_assert_str_eq(err, "t.yaml:");
    ck_assert_ptr_null(config_parse("listen: 1\n", 10, "t.yaml", NULL, 0));
}
END_TEST

START_TEST(test_config__not_nul_terminated)
{
    char err[CONFIG_ERR_MAX];
    const char buf[] = { 's', 'e', 'r', 'v', 'e', 'r', ':', ' ', '{', '}', '!', '!' };
    struct config *cfg = config_parse(buf, 10, "t.yaml", err, sizeof(err));
    ck_assert_msg(cfg != NULL, "%s", err);
    config_free(cfg);
}
END_TEST

/* Every prefix of a rich document either loads or fails with a message that
 * names the file: no crash, no leak on any error path (ASan/LSan build). */
START_TEST(test_config__every_truncation)
{
    setenv("POLYGW_TEST_KEY", SECRET, 1);
    static const char doc[] =
        "listen: { socket: /tmp/p.sock, mode: \"0660\", max_message_bytes: 65536 }\n"
        "server: { log_level: warn }\n"
        "backend: { kind: redis, url: \"redis://127.0.0.1:6379/0\", prefix: p }\n"
        "defaults: { max_attempts: 4, stall_window_s: 120 }\n"
        "capabilities:\n"
        "  chat: { exempt_429: true }\n"
        "  vision: { path: /vision, backoff_max_s: 30 }\n"
        "sources:\n"
        "  - name: a\n"
        "    capability: vision\n"
        "    base_url: \"http://h:1/v1/\"\n"
        "    api_key_env: POLYGW_TEST_KEY\n"
        "    model: \"m-1\"\n"
        "    aimd: { initial: 2, min: 1 }\n"
        "    breaker: { failures: 3 }\n"
        "    limits: { rpm: 10 }\n"
        "  - { name: b, capability: chat, base_url: \"https://x\", ttft_timeout_s: 5 }\n";
    char err[CONFIG_ERR_MAX];
    size_t ok = 0;

    for (size_t n = 0; n <= sizeof(doc) - 1; n++) {
        struct config *cfg = config_parse(doc, n, "t.yaml", err, sizeof(err));
        if (cfg) {
            ok++;
            config_free(cfg);
        } else {
            ck_assert_msg(strncmp(err, "t.yaml", 6) == 0, "at %zu: %s", n, err);
            ck_assert_msg(strstr(err, SECRET) == NULL, "at %zu: %s", n, err);
        }
    }
    struct config *cfg = config_parse(doc, sizeof(doc) - 1, "t.yaml", err, sizeof(err));
    ck_assert_msg(cfg != NULL, "%s", err);
    ck_assert_str_eq(cfg->sources[0].base_url, "http://h:1/v1");
    config_free(cfg);
    ck_assert_uint_gt(ok, 1);
}
END_TEST

START_TEST(test_config__helpers)
{
    ck_assert_int_eq(config_parse_log_level("debug"), LOG_DEBUG);
    ck_assert_int_eq(config_parse_log_level("info"), LOG_INFO);
    ck_assert_int_eq(config_parse_log_level("warn"), LOG_WARN);
    ck_assert_int_eq(config_parse_log_level("error"), LOG_ERROR);
    ck_assert_int_eq(config_parse_log_level("INFO"), -1);
    ck_assert_int_eq(config_parse_log_level("warning"), -1);
    ck_assert_int_eq(config_parse_log_level(NULL), -1);
    config_free(NULL);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Rejections: document level                                               */

START_TEST(test_config__empty_document)
{
    expect_reject("", 0, "", "empty configuration");
    expect_reject("# only a comment\n", 0, "", "empty configuration");
    expect_reject("---\n", 0, "", "empty configuration");
    expect_reject("~\n", 0, "", "empty configuration");
}
END_TEST

START_TEST(test_config__top_not_map)
{
    expect_reject("- a\n- b\n", 1, "", "the top level must be a map, got a list");
    expect_reject("hello\n", 1, "", "the top level must be a map, got a string");
}
END_TEST

START_TEST(test_config__yaml_syntax_error)
{
    char err[CONFIG_ERR_MAX];
    int line = 0, col = 0;
    ck_assert_ptr_null(parse("listen:\n  socket: [a\nserver: {}\n", err, sizeof(err)));
    ck_assert_msg(sscanf(err, "t.yaml:%d:%d: YAML syntax error: ", &line, &col) == 2, "%s", err);
    ck_assert_int_ge(line, 2);
    ck_assert_int_ge(col, 1);
    ck_assert_ptr_nonnull(strstr(err, "YAML syntax error"));

    ck_assert_ptr_null(parse("listen:\n  socket: a\n bad: 1\n", err, sizeof(err)));
    ck_assert_msg(sscanf(err, "t.yaml:%d:%d: YAML syntax error: ", &line, &col) == 2, "%s", err);
    ck_assert_int_eq(line, 3);

    ck_assert_ptr_null(parse("listen:\n\tsocket: a\n", err, sizeof(err)));
    ck_assert_msg(strncmp(err, "t.yaml:2:1: YAML syntax error: ", 31) == 0, "%s", err);
    ck_assert_ptr_nonnull(strstr(err, "must use spaces, not tabs"));
}
END_TEST

START_TEST(test_config__invalid_utf8)
{
    expect_reject("listen: { socket: \"\xff\xfe\" }\n", 0, "", "invalid input at byte");
}
END_TEST

START_TEST(test_config__multiple_documents)
{
    expect_reject("server: {}\n---\nserver: {}\n", 2, "", "only one YAML document");
}
END_TEST

START_TEST(test_config__duplicate_key)
{
    expect_reject("server: {}\nlisten: {}\nserver: {}\n", 3, "server",
                  "duplicate key (first set at line 1)");
    expect_reject(SRC0 "    weight: 1\n    weight: 2\n", 6, "sources[0].weight",
                  "duplicate key (first set at line 5)");
    expect_reject("capabilities:\n  chat: {}\n  chat: {}\n", 3, "capabilities.chat",
                  "duplicate key");
}
END_TEST

START_TEST(test_config__alias_rejected)
{
    expect_reject("defaults: &d { max_attempts: 2 }\n", 1, "", "anchors");
    expect_reject("server: { log_level: *x }\n", 1, "", "aliases"); /* even undefined */
    expect_reject("a: &x 1\nserver: { log_level: *x }\n", 1, "", "anchors");
}
END_TEST

START_TEST(test_config__tag_rejected)
{
    expect_reject("listen: { max_connections: !!int \"5\" }\n", 1, "", "tags");
}
END_TEST

START_TEST(test_config__non_string_key)
{
    expect_reject("? [a, b]\n: 1\n", 1, "", "map keys must be plain strings");
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Rejections: unknown keys and types                                       */

START_TEST(test_config__unknown_key_top)
{
    expect_reject("server: {}\nlistne: {}\n", 2, "listne", "unknown key");
}
END_TEST

START_TEST(test_config__unknown_key_nested)
{
    expect_reject("listen:\n  sockett: /x\n", 2, "listen.sockett", "unknown key");
    expect_reject("defaults: { timeout_s: 3 }\n", 1, "defaults.timeout_s", "unknown key");
    expect_reject("capabilities: { chat: { model: x } }\n", 1, "capabilities.chat.model",
                  "unknown key");
    expect_reject(SRC0 "    aimd: { initial: 4, maximum: 9 }\n", 5, "sources[0].aimd.maximum",
                  "unknown key");
    expect_reject(SRC0 SRC1 "    limit: { rpm: 1 }\n", 8, "sources[1].limit", "unknown key");
}
END_TEST

START_TEST(test_config__type_string_for_number)
{
    expect_reject(SRC0 "    timeout_s: \"300\"\n", 5, "sources[0].timeout_s",
                  "expected a number, got a string");
    expect_reject(SRC0 "    timeout_s: fast\n", 5, "sources[0].timeout_s",
                  "expected a number, got a string");
    expect_reject("defaults: { max_attempts: '3' }\n", 1, "defaults.max_attempts",
                  "expected an integer, got a string");
}
END_TEST

START_TEST(test_config__type_float_for_integer)
{
    expect_reject("defaults: { max_attempts: 2.5 }\n", 1, "defaults.max_attempts",
                  "expected an integer, got a number");
}
END_TEST

START_TEST(test_config__type_map_for_list)
{
    expect_reject("sources: { name: a }\n", 1, "sources", "expected a list of sources, got a map");
}
END_TEST

START_TEST(test_config__type_list_for_map)
{
    expect_reject("listen: [a, b]\n", 1, "listen", "expected a map, got a list");
    expect_reject("capabilities: [chat]\n", 1, "capabilities",
                  "expected a map of capability names, got a list");
    expect_reject("capabilities: { chat: [1] }\n", 1, "capabilities.chat",
                  "expected a map, got a list");
    expect_reject(SRC0 "    aimd: 4\n", 5, "sources[0].aimd", "expected a map, got a number");
}
END_TEST

START_TEST(test_config__type_source_not_map)
{
    expect_reject(SRC0 "  - just-a-name\n", 5, "sources[1]", "expected a map, got a string");
}
END_TEST

START_TEST(test_config__type_bool)
{
    expect_reject("capabilities: { chat: { exempt_429: yes } }\n", 1,
                  "capabilities.chat.exempt_429",
                  "expected a boolean (true or false), got a string");
    expect_reject("capabilities: { chat: { exempt_429: \"true\" } }\n", 1,
                  "capabilities.chat.exempt_429", "expected a boolean");
}
END_TEST

START_TEST(test_config__type_map_for_string)
{
    expect_reject(SRC0 "    model: { a: 1 }\n", 5, "sources[0].model",
                  "expected a string, got a map");
}
END_TEST

START_TEST(test_config__nul_in_string)
{
    expect_reject("listen: { socket: \"/a\\0b\" }\n", 1, "listen.socket", "must not contain NUL");
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Rejections: values                                                       */

START_TEST(test_config__max_attempts_zero)
{
    expect_reject("defaults: { max_attempts: 0 }\n", 1, "defaults.max_attempts",
                  "must be in [1, 1000], got 0");
    expect_reject("capabilities:\n  chat: { max_attempts: -1 }\n", 2,
                  "capabilities.chat.max_attempts", "must be in [1, 1000], got -1");
}
END_TEST

START_TEST(test_config__integer_overflow)
{
    expect_reject("defaults: { max_attempts: 99999999999999999999999 }\n", 1,
                  "defaults.max_attempts", "must be in [1, 1000], got 99999999999999999999999");
    expect_reject("listen: { max_connections: 4294967297 }\n", 1, "listen.max_connections",
                  "must be <= 1048576, got 4294967297");
}
END_TEST

START_TEST(test_config__not_finite)
{
    expect_reject(SRC0 "    timeout_s: .inf\n", 5, "sources[0].timeout_s",
                  "must be a finite number");
    expect_reject(SRC0 "    weight: .nan\n", 5, "sources[0].weight", "must be a finite number");
}
END_TEST

START_TEST(test_config__weight_not_positive)
{
    expect_reject(SRC0 "    weight: 0\n", 5, "sources[0].weight", "must be > 0, got 0");
    expect_reject(SRC0 "    weight: -1.5\n", 5, "sources[0].weight", "must be > 0, got -1.5");
}
END_TEST

START_TEST(test_config__timeouts_not_positive)
{
    static const struct {
        const char *key, *zero, *neg;
    } cases[] = {
        { "timeout_s", "must be > 0, got 0", "must be > 0, got -3" },
        { "connect_timeout_s", "must be > 0, got 0", "must be > 0, got -3" },
        { "ttft_timeout_s", "must be > 0, got 0", "must be > 0, got -3" },
        { "idle_timeout_s", "must be > 0, got 0", "must be > 0, got -3" },
    };
    /* Policy keys live in defaults and capabilities (never in a source). */
    static const struct {
        const char *key, *zero, *neg;
    } policy[] = {
        { "stall_window_s", "must be > 0, got 0", "must be > 0, got -3" },
        { "backoff_base_s", "must be > 0, got 0", "must be > 0, got -3" },
        { "backoff_max_s", "must be > 0, got 0", "must be > 0, got -3" },
        { "node_timeout_s", "must be > 0, got 0", "must be > 0, got -3" },
        { "poll_interval_s", "must be in (0, 3600], got 0", "must be in (0, 3600], got -3" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char yaml[512], path[64];
        snprintf(yaml, sizeof(yaml), SRC0 "    %s: 0\n", cases[i].key);
        snprintf(path, sizeof(path), "sources[0].%s", cases[i].key);
        expect_reject(yaml, 5, path, cases[i].zero);
        snprintf(yaml, sizeof(yaml), SRC0 "    %s: -3\n", cases[i].key);
        expect_reject(yaml, 5, path, cases[i].neg);
    }
    for (size_t i = 0; i < sizeof(policy) / sizeof(policy[0]); i++) {
        char yaml[512], path[64];
        snprintf(yaml, sizeof(yaml), "defaults:\n  %s: 0\n", policy[i].key);
        snprintf(path, sizeof(path), "defaults.%s", policy[i].key);
        expect_reject(yaml, 2, path, policy[i].zero);
        snprintf(yaml, sizeof(yaml), "capabilities:\n  ocr:\n    %s: -3\n", policy[i].key);
        snprintf(path, sizeof(path), "capabilities.ocr.%s", policy[i].key);
        expect_reject(yaml, 3, path, policy[i].neg);
    }
    expect_reject(SRC0 "    timeout_s: 31536001\n", 5, "sources[0].timeout_s",
                  "must be <= 31536000, got 31536001");
    expect_reject("server: { shutdown_grace_s: -1 }\n", 1, "server.shutdown_grace_s",
                  "must be in [0, 3600], got -1");
    expect_reject("server: { access_log: 1 }\n", 1, "server.access_log", "expected a boolean");
}
END_TEST

START_TEST(test_config__aimd_decrease_range)
{
    expect_reject(SRC0 "    aimd: { decrease: 1.5 }\n", 5, "sources[0].aimd.decrease",
                  "must be in (0, 1), got 1.5");
    expect_reject(SRC0 "    aimd: { decrease: 1 }\n", 5, "sources[0].aimd.decrease",
                  "must be in (0, 1), got 1");
    expect_reject(SRC0 "    aimd: { decrease: 0 }\n", 5, "sources[0].aimd.decrease",
                  "must be in (0, 1), got 0");
}
END_TEST

START_TEST(test_config__aimd_values)
{
    expect_reject(SRC0 "    aimd: { increase: 0 }\n", 5, "sources[0].aimd.increase",
                  "must be > 0, got 0");
    expect_reject(SRC0 "    aimd: { min: 0.5 }\n", 5, "sources[0].aimd.min",
                  "must be >= 1, got 0.5");
}
END_TEST

START_TEST(test_config__aimd_min_above_initial)
{
    expect_reject(SRC0 "    aimd: { initial: 2, min: 3 }\n", 5, "sources[0].aimd.initial",
                  "must be >= min (3), got 2");
    expect_reject(SRC0 "    aimd:\n      min: 8\n", 6, "sources[0].aimd.min",
                  "must be <= initial (4, default), got 8");
}
END_TEST

START_TEST(test_config__backoff_max_below_base)
{
    expect_reject("defaults: { backoff_base_s: 10, backoff_max_s: 5 }\n", 1,
                  "defaults.backoff_max_s", "must be >= backoff_base_s (10), got 5");
    /* Inherited: the capability raises base above the defaults' max. */
    expect_reject("capabilities:\n  chat:\n    backoff_base_s: 100\n", 3,
                  "capabilities.chat.backoff_base_s",
                  "must be <= backoff_max_s (60, inherited), got 100");
    expect_reject("capabilities:\n  vision:\n    path: /v\n    backoff_max_s: 1\n", 4,
                  "capabilities.vision.backoff_max_s",
                  "must be >= backoff_base_s (2, inherited), got 1");
}
END_TEST

START_TEST(test_config__breaker_values)
{
    expect_reject(SRC0 "    breaker: { cooldown_s: 60, max_cooldown_s: 30 }\n", 5,
                  "sources[0].breaker.max_cooldown_s", "must be >= cooldown_s (60), got 30");
    expect_reject(SRC0 "    breaker: { cooldown_s: 600 }\n", 5, "sources[0].breaker.cooldown_s",
                  "must be <= max_cooldown_s (300, default), got 600");
    expect_reject(SRC0 "    breaker: { failures: 0 }\n", 5, "sources[0].breaker.failures",
                  "must be >= 1, got 0");
}
END_TEST

START_TEST(test_config__limits_negative)
{
    expect_reject(SRC0 "    limits: { tpm: -5 }\n", 5, "sources[0].limits.tpm",
                  "must be >= 0, got -5");
    expect_reject(SRC0 "    pacer: { min_interval_ms: -1 }\n", 5,
                  "sources[0].pacer.min_interval_ms", "must be >= 0, got -1");
}
END_TEST

START_TEST(test_config__concurrency_zero)
{
    expect_reject(SRC0 "    max_concurrency: 0\n", 5, "sources[0].max_concurrency",
                  "must be >= 1, got 0");
    expect_reject("listen: { max_connections: 0 }\n", 1, "listen.max_connections",
                  "must be >= 1, got 0");
    expect_reject("listen: { max_inflight_per_connection: 0 }\n", 1,
                  "listen.max_inflight_per_connection", "must be >= 1, got 0");
}
END_TEST

START_TEST(test_config__max_message_bytes_range)
{
    expect_reject("listen: { max_message_bytes: 1023 }\n", 1, "listen.max_message_bytes",
                  "must be >= 1024, got 1023");
    expect_reject("listen: { max_message_bytes: 1073741825 }\n", 1, "listen.max_message_bytes",
                  "must be <= 1073741824, got 1073741825");
}
END_TEST

START_TEST(test_config__write_queue_below_message)
{
    expect_reject("listen:\n  max_message_bytes: 4096\n  max_write_queue_bytes: 2048\n", 3,
                  "listen.max_write_queue_bytes",
                  "must be >= listen.max_message_bytes (4096), got 2048");
}
END_TEST

START_TEST(test_config__connection_bounds)
{
    /* Defaults: a cap on partial input of four maximal messages; no idle
     * timeout (long-lived clients keep one connection between calls). */
    struct config *cfg = expect_ok(SRC0);
    ck_assert_uint_eq(cfg->max_buffered_input_bytes, 4 * 16777216);
    ck_assert_double_eq(cfg->idle_timeout_s, 0);
    config_free(cfg);
    cfg = expect_ok("listen: { max_message_bytes: 4096 }\n" SRC0);
    ck_assert_uint_eq(cfg->max_buffered_input_bytes, 16384);
    config_free(cfg);
    cfg = expect_ok("listen:\n  max_message_bytes: 4096\n  max_buffered_input_bytes: 4096\n"
                    "  idle_timeout_s: 2.5\n" SRC0);
    ck_assert_uint_eq(cfg->max_buffered_input_bytes, 4096);
    ck_assert_double_eq(cfg->idle_timeout_s, 2.5);
    config_free(cfg);

    expect_reject("listen:\n  max_message_bytes: 4096\n  max_buffered_input_bytes: 4095\n", 3,
                  "listen.max_buffered_input_bytes",
                  "must be >= listen.max_message_bytes (4096), got 4095");
    expect_reject("listen: { max_buffered_input_bytes: 1.5 }\n", 1,
                  "listen.max_buffered_input_bytes", "integer");
    expect_reject("listen: { idle_timeout_s: -1 }\n", 1, "listen.idle_timeout_s",
                  "must be >= 0, got -1");
    expect_reject("listen: { idle_timeout_s: 31536001 }\n", 1, "listen.idle_timeout_s",
                  "must be <= 31536000");
    expect_reject("listen: { idle_timeout_s: \"30\" }\n", 1, "listen.idle_timeout_s",
                  "expected a number");
}
END_TEST

START_TEST(test_config__mode_invalid_octal)
{
    expect_reject("listen: { mode: \"0689\" }\n", 1, "listen.mode",
                  "must be an octal permission mode");
    expect_reject("listen: { mode: rw-rw---- }\n", 1, "listen.mode",
                  "must be an octal permission mode");
    expect_reject("listen: { mode: [1] }\n", 1, "listen.mode", "expected a string, got a list");
}
END_TEST

START_TEST(test_config__mode_too_large)
{
    expect_reject("listen: { mode: \"1777\" }\n", 1, "listen.mode", "must be at most 0777");
    expect_reject("listen: { mode: \"00660\" }\n", 1, "listen.mode",
                  "must be an octal permission mode");
}
END_TEST

START_TEST(test_config__mode_other_writable)
{
    expect_reject("listen: { mode: \"0666\" }\n", 1, "listen.mode",
                  "must not be writable by others");
    expect_reject("listen: { mode: \"0662\" }\n", 1, "listen.mode",
                  "must not be writable by others");
}
END_TEST

START_TEST(test_config__socket_path)
{
    char yaml[256];
    char path[120];
    memset(path, 'a', sizeof(path) - 1);
    path[0] = '/';
    path[sizeof(path) - 1] = '\0';
    snprintf(yaml, sizeof(yaml), "listen: { socket: %s }\n", path);
    expect_reject(yaml, 1, "listen.socket", "longer than 107 bytes");
    expect_reject("listen: { socket: \"\" }\n", 1, "listen.socket", "must not be empty");
}
END_TEST

START_TEST(test_config__log_level_invalid)
{
    expect_reject("server:\n  log_level: verbose\n", 2, "server.log_level",
                  "must be one of debug, info, warn, error");
}
END_TEST

START_TEST(test_config__tasks_section)
{
    struct config *cfg = expect_ok("listen: { mode: \"0660\" }\n");
    ck_assert_double_eq(cfg->task_ttl_s, 86400);
    ck_assert_uint_eq(cfg->max_tasks, 65536);
    config_free(cfg);
    cfg = expect_ok("tasks: { ttl_s: 3600, max_tasks: 100 }\n");
    ck_assert_double_eq(cfg->task_ttl_s, 3600);
    ck_assert_uint_eq(cfg->max_tasks, 100);
    config_free(cfg);
    expect_reject("tasks:\n  ttl_s: 0\n", 2, "tasks.ttl_s", "must be > 0");
    expect_reject("tasks:\n  max_tasks: 0\n", 2, "tasks.max_tasks", "must be >= 1");
    expect_reject("tasks:\n  ttl: 5\n", 2, "tasks.ttl", "unknown key");
}
END_TEST

START_TEST(test_config__backend_kind_invalid)
{
    expect_reject("backend: { kind: etcd }\n", 1, "backend.kind", "must be memory or redis");
}
END_TEST

START_TEST(test_config__backend_redis_without_url)
{
    expect_reject("backend:\n  kind: redis\n", 2, "backend.url", "is required when kind is redis");
}
END_TEST

START_TEST(test_config__backend_memory_with_url)
{
    expect_reject("backend:\n  kind: memory\n  url: redis://h\n", 3, "backend.url",
                  "only valid with kind: redis");
    expect_reject("backend: { url: redis://h }\n", 1, "backend.url", "only valid with kind: redis");
    expect_reject("backend: { prefix: p }\n", 1, "backend.prefix", "only valid with kind: redis");
    expect_reject("backend: { command_timeout_s: 1 }\n", 1, "backend.command_timeout_s",
                  "only valid with kind: redis");
    expect_reject("backend: { lease_ttl_s: 9 }\n", 1, "backend.lease_ttl_s",
                  "only valid with kind: redis");
}
END_TEST

START_TEST(test_config__backend_redis_url_and_timeouts)
{
    expect_reject("backend: { kind: redis, url: \"redis://:" SECRET "@h:99999\" }\n", 1,
                  "backend.url", "bad port");
    expect_reject("backend: { kind: redis, url: \"redis://:" SECRET "@:6379\" }\n", 1,
                  "backend.url", "host");
    expect_reject("backend:\n  kind: redis\n  url: redis://h\n  command_timeout_s: 2\n"
                  "  lease_ttl_s: 5\n",
                  5, "backend.lease_ttl_s", "must be >= 3 x backend.command_timeout_s (6), got 5");
    expect_reject("backend: { kind: redis, url: redis://h, command_timeout_s: 0 }\n", 1,
                  "backend.command_timeout_s", "");
    expect_reject("sources:\n  - { name: a, capability: chat, base_url: \"http://h\",\n"
                  "      limits: { window_s: 0 } }\n",
                  3, "sources[0].limits.window_s", "");
}
END_TEST

/* backend.url_env: the URL (it may hold a password) from the environment,
 * like the API keys; exactly one of url and url_env. */
START_TEST(test_config__backend_redis_url_from_env)
{
    setenv("POLYGW_TEST_REDIS", "redis://:" SECRET "@127.0.0.1:6390/2", 1);
    struct config *cfg = expect_ok("backend: { kind: redis, url_env: POLYGW_TEST_REDIS }\n");
    ck_assert_str_eq(cfg->redis_url, "redis://:" SECRET "@127.0.0.1:6390/2");
    config_free(cfg);
    expect_reject("backend: { kind: redis, url: redis://h, url_env: POLYGW_TEST_REDIS }\n", 1,
                  "backend.url_env", "cannot be combined with backend.url");
    expect_reject("backend: { url_env: POLYGW_TEST_REDIS }\n", 1, "backend.url_env",
                  "only valid with kind: redis");
    setenv("POLYGW_TEST_REDIS", "redis://:" SECRET "@127.0.0.1:0", 1);
    expect_reject("backend:\n  kind: redis\n  url_env: POLYGW_TEST_REDIS\n", 3, "backend.url_env",
                  "the URL in the environment: bad port");
    unsetenv("POLYGW_TEST_REDIS");
    expect_reject("backend: { kind: redis, url_env: POLYGW_TEST_REDIS }\n", 1, "backend.url_env",
                  "not set or is empty");
    expect_reject("backend: { kind: redis, url_env: \"redis://h\" }\n", 1, "backend.url_env",
                  "must be the name of an environment variable");
}
END_TEST

START_TEST(test_config__backend_url_scheme)
{
    expect_reject("backend: { kind: redis, url: \"http://:" SECRET "@h\" }\n", 1, "backend.url",
                  "must start with redis://, rediss:// or unix://");
    expect_reject("backend: { kind: redis, url: redis://h, prefix: \"a b\" }\n", 1,
                  "backend.prefix", "may contain only");
}
END_TEST

/* http.allowed_origins and http.allowed_hosts: origins exactly as
 * browsers send them, host names without a port, no repeats. */
START_TEST(test_config__http_allowed_origins_and_hosts)
{
    struct config *cfg =
        expect_ok("http:\n  allowed_origins: [\"http://localhost:5173\", \"https://app.example\",\n"
                  "                    \"http://[::1]:8080\", \"http://10.0.0.7\"]\n"
                  "  allowed_hosts: [polygw.internal, gw-1.example.com]\n");
    ck_assert_uint_eq(cfg->n_http_allowed_origins, 4);
    ck_assert_str_eq(cfg->http_allowed_origins[2], "http://[::1]:8080");
    ck_assert_uint_eq(cfg->n_http_allowed_hosts, 2);
    ck_assert_str_eq(cfg->http_allowed_hosts[1], "gw-1.example.com");
    config_free(cfg);

    static const char *const bad_origins[] = {
        "null",          "localhost:3000", "http://",        "http://h/",  "http://h/app",
        "ftp://h",       "http://h:0",     "http://h:65536", "http://h:x", "http://[::1",
        "http://[zz]:1", "http://a b",     "http://h?q",
    };
    for (size_t i = 0; i < sizeof(bad_origins) / sizeof(bad_origins[0]); i++) {
        char text[200];
        snprintf(text, sizeof(text), "http:\n  allowed_origins: [\"%s\"]\n", bad_origins[i]);
        expect_reject(text, 2, "http.allowed_origins[0]", "must be an origin");
    }
    expect_reject("http:\n  allowed_origins: [\"http://h\", \"HTTP://H\"]\n", 2,
                  "http.allowed_origins[1]", "repeats origin 0");
    expect_reject("http:\n  allowed_origins: []\n", 2, "http.allowed_origins", "a list of 1 to 64");
    expect_reject("http:\n  allowed_hosts: [\"h:80\"]\n", 2, "http.allowed_hosts[0]",
                  "must be a host name");
    expect_reject("http:\n  allowed_hosts: [\"a b\"]\n", 2, "http.allowed_hosts[0]",
                  "must be a host name");
    expect_reject("http:\n  allowed_hosts: h\n", 2, "http.allowed_hosts", "a list of 1 to 64");
}
END_TEST

/* Sentinels instead of a URL, credentials apart from it, TLS: the rules
 * between them (each with the key at fault and its line). */
START_TEST(test_config__backend_sentinels_auth_tls)
{
    struct config *cfg =
        expect_ok("backend:\n  kind: redis\n  sentinels: [\"10.0.0.1:26379\", \"s2:26379\"]\n"
                  "  master_name: mymaster\n  db: 2\n  tls: { ca_file: /etc/ca.pem }\n");
    ck_assert_uint_eq(cfg->n_redis_sentinels, 2);
    ck_assert_str_eq(cfg->redis_sentinels[1], "s2:26379");
    ck_assert_str_eq(cfg->redis_master_name, "mymaster");
    ck_assert_uint_eq(cfg->redis_db, 2);
    ck_assert(cfg->redis_tls);
    ck_assert_str_eq(cfg->redis_tls_ca_file, "/etc/ca.pem");
    ck_assert_ptr_null(cfg->redis_url);
    config_free(cfg);

    expect_reject("backend: { kind: redis, url: redis://h, sentinels: [\"h:1\"], "
                  "master_name: m }\n",
                  1, "backend.sentinels", "cannot be combined");
    expect_reject("backend: { kind: redis, sentinels: [\"h:1\"] }\n", 1, "backend.master_name",
                  "is required with backend.sentinels");
    expect_reject("backend: { kind: redis, sentinels: [\"h\"], master_name: m }\n", 1,
                  "backend.sentinels[0]", "port is required");
    expect_reject("backend: { kind: redis, sentinels: [\"h:1\", \"h:1\"], master_name: m }\n", 1,
                  "backend.sentinels[1]", "repeats sentinel 0");
    expect_reject("backend: { kind: redis, sentinels: [], master_name: m }\n", 1,
                  "backend.sentinels", "a list of 1 to 16");
    expect_reject("backend: { kind: redis, url: redis://h, master_name: m }\n", 1,
                  "backend.master_name", "only valid with backend.sentinels");
    expect_reject("backend: { kind: redis, url: redis://h, db: 1 }\n", 1, "backend.db",
                  "a URL carries its db");
    expect_reject("backend: { kind: redis, url: redis://h, password_env: A, "
                  "password_file: /p }\n",
                  1, "backend.password_file", "cannot be combined");
    expect_reject("backend: { kind: redis, url: redis://h, username: bob }\n", 1,
                  "backend.username", "needs backend.password_env");
    expect_reject("backend: { kind: redis, url: redis://h, tls: { cert_file: /c } }\n", 1,
                  "backend.tls.key_file", "a client certificate needs both");
    expect_reject("backend: { kind: redis, url: redis://h, tls: { ca_file: ca.pem } }\n", 1,
                  "backend.tls.ca_file", "absolute path");
    expect_reject("backend: { kind: redis, url: redis://h, tls: {} }\n", 1, "backend.tls",
                  "needs a rediss:// URL");
    expect_reject("backend: { kind: memory, tls: {} }\n", 1, "backend.tls",
                  "only valid with kind: redis");
}
END_TEST

/* The password from the environment: a URL that holds one too is refused,
 * and neither message shows it. */
START_TEST(test_config__backend_password_env)
{
    setenv("PGW_TEST_REDIS_PW", SECRET, 1);
    struct config *cfg = expect_ok("backend: { kind: redis, url: rediss://h, username: bob, "
                                   "password_env: PGW_TEST_REDIS_PW }\n");
    ck_assert_str_eq(cfg->redis_password, SECRET);
    ck_assert_str_eq(cfg->redis_username, "bob");
    ck_assert(!cfg->redis_tls);
    config_free(cfg);
    expect_reject("backend: { kind: redis, url: \"redis://:x@h\", "
                  "password_env: PGW_TEST_REDIS_PW }\n",
                  1, "backend.password_env", "the URL holds a password too");
    char longpw[300];
    memset(longpw, 'p', sizeof(longpw) - 1);
    longpw[sizeof(longpw) - 1] = '\0';
    setenv("PGW_TEST_REDIS_PW", longpw, 1);
    expect_reject("backend: { kind: redis, url: redis://h, password_env: PGW_TEST_REDIS_PW }\n", 1,
                  "backend.password_env", "longer than 255 bytes");
    unsetenv("PGW_TEST_REDIS_PW");
    expect_reject("backend: { kind: redis, url: redis://h, password_env: PGW_TEST_REDIS_PW }\n", 1,
                  "backend.password_env", "not set or is empty");
}
END_TEST

START_TEST(test_config__custom_capability_without_path)
{
    expect_reject("capabilities:\n  vision: { exempt_429: true }\n", 2, "capabilities.vision",
                  "path: is required for a custom capability");
    expect_reject("capabilities:\n  vision:\n", 2, "capabilities.vision",
                  "path: is required for a custom capability");
}
END_TEST

START_TEST(test_config__capability_path_invalid)
{
    expect_reject("capabilities: { chat: { path: chat/completions } }\n", 1,
                  "capabilities.chat.path", "must start with '/'");
    expect_reject("capabilities: { chat: { path: \"/a b\" } }\n", 1, "capabilities.chat.path",
                  "must not contain spaces");
}
END_TEST

START_TEST(test_config__capability_name_invalid)
{
    char yaml[256], path[128], name[CONFIG_NAME_MAX + 1];
    memset(name, 'c', CONFIG_NAME_MAX);
    name[CONFIG_NAME_MAX] = '\0';
    snprintf(yaml, sizeof(yaml), "capabilities:\n  %s: { path: /x }\n", name);
    snprintf(path, sizeof(path), "capabilities.%s", name);
    expect_reject(yaml, 2, path, "longer than 63 characters");
    expect_reject("capabilities: { \"a b\": { path: /x } }\n", 1, "capabilities.a b",
                  "may contain only letters, digits");
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Rejections: sources                                                      */

START_TEST(test_config__unknown_capability)
{
    expect_reject("sources:\n  - name: a\n    capability: vision\n    base_url: http://h\n", 3,
                  "sources[0].capability", "unknown capability 'vision'");
}
END_TEST

START_TEST(test_config__duplicate_source_name)
{
    expect_reject(SRC0 "  - name: a\n    capability: ocr\n    base_url: http://h\n", 5,
                  "sources[1].name", "duplicate source name 'a' (first used by sources[0])");
}
END_TEST

START_TEST(test_config__source_no_name)
{
    expect_reject("sources:\n  - capability: chat\n    base_url: http://h\n", 2, "sources[0].name",
                  "is required");
    expect_reject("sources:\n  - name: \"\"\n    capability: chat\n", 2, "sources[0].name",
                  "must not be empty");
}
END_TEST

START_TEST(test_config__source_no_capability)
{
    expect_reject(SRC0 "  - name: b\n    base_url: http://h\n", 5, "sources[1].capability",
                  "is required");
}
END_TEST

START_TEST(test_config__source_no_base_url)
{
    expect_reject("sources:\n  - name: a\n    capability: chat\n", 2, "sources[0].base_url",
                  "is required");
}
END_TEST

START_TEST(test_config__base_url_not_http)
{
    expect_reject("sources:\n  - { name: a, capability: chat, base_url: ftp://h/v1 }\n", 2,
                  "sources[0].base_url", "must start with http:// or https://");
    expect_reject("sources:\n  - { name: a, capability: chat, base_url: \"https:///v1\" }\n", 2,
                  "sources[0].base_url", "has no host");
    expect_reject("sources:\n  - { name: a, capability: chat, base_url: \"http://h/ v1\" }\n", 2,
                  "sources[0].base_url", "must not contain spaces");
    char yaml[CONFIG_URL_MAX + 128], host[CONFIG_URL_MAX];
    memset(host, 'h', sizeof(host) - 8);
    host[sizeof(host) - 8] = '\0'; /* "http://" + host = CONFIG_URL_MAX - 1 */
    snprintf(yaml, sizeof(yaml),
             "sources:\n  - { name: a, capability: chat, base_url: http://%s }\n", host);
    config_free(expect_ok(yaml));
    snprintf(yaml, sizeof(yaml),
             "sources:\n  - { name: a, capability: chat, base_url: http://%sh }\n", host);
    expect_reject(yaml, 2, "sources[0].base_url", "longer than 1023 characters");
}
END_TEST

START_TEST(test_config__name_too_long)
{
    char yaml[512], name[CONFIG_NAME_MAX + 1];
    memset(name, 'n', CONFIG_NAME_MAX);
    name[CONFIG_NAME_MAX] = '\0';
    snprintf(yaml, sizeof(yaml),
             "sources:\n  - name: %s\n    capability: chat\n    base_url: http://h\n", name);
    expect_reject(yaml, 2, "sources[0].name", "longer than 63 characters");
}
END_TEST

START_TEST(test_config__name_bad_chars)
{
    expect_reject("sources:\n  - name: \"a/b\"\n", 2, "sources[0].name",
                  "may contain only letters, digits, '_', '.' and '-'");
}
END_TEST

START_TEST(test_config__stall_below_ttft)
{
    /* The source's ttft against its capability's window, wherever that is set. */
    expect_reject(
        "capabilities: { chat: { stall_window_s: 30 } }\n" SRC0 "    ttft_timeout_s: 45\n", 6,
        "sources[0].ttft_timeout_s", "must be <= stall_window_s (30, capabilities.chat), got 45");
    expect_reject(SRC0 "    ttft_timeout_s: 400\n", 5, "sources[0].ttft_timeout_s",
                  "must be <= stall_window_s (300, capabilities.chat, default), got 400");
    /* Only the source's own capability counts: chat's large window does not
     * cover an embedding source. */
    expect_reject("capabilities: { chat: { stall_window_s: 900 } }\n" SRC0 SRC1
                  "    ttft_timeout_s: 400\n",
                  9, "sources[1].ttft_timeout_s",
                  "must be <= stall_window_s (300, capabilities.embedding, default), got 400");
    config_free(expect_ok("capabilities: { chat: { stall_window_s: 900 } }\n" SRC0
                          "    ttft_timeout_s: 400\n"));
}
END_TEST

START_TEST(test_config__stall_below_ttft_inherited)
{
    /* Default ttft (60) against a window from defaults, or from the capability. */
    expect_reject("defaults: { stall_window_s: 30 }\n" SRC0, 3, "sources[0].ttft_timeout_s",
                  "must be <= stall_window_s (30, capabilities.chat, inherited from "
                  "defaults), got 60 (default)");
    expect_reject("capabilities: { embedding: { stall_window_s: 50 } }\n" SRC0 SRC1, 6,
                  "sources[1].ttft_timeout_s",
                  "must be <= stall_window_s (50, capabilities.embedding), got 60 (default)");
    /* A capability's own window beats a smaller one in defaults. */
    config_free(expect_ok("defaults: { stall_window_s: 30 }\n"
                          "capabilities: { chat: { stall_window_s: 60 } }\n" SRC0));
}
END_TEST

/* Every policy key is refused in a source, whatever its value (even empty,
 * even out of range), with a hint naming the source's own capability. */
START_TEST(test_config__source_policy_key_rejected)
{
    static const char *const keys[] = { "max_attempts",  "stall_window_s",  "backoff_base_s",
                                        "backoff_max_s", "poll_interval_s", "node_timeout_s" };
    static const char *const values[] = { "2", "0", "-1", "", "fast", "{ a: 1 }" };

    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        char yaml[512], path[64], reason[256];
        snprintf(path, sizeof(path), "sources[1].%s", keys[i]);
        snprintf(reason, sizeof(reason),
                 "not a per-source key: a call's budgets span every "
                 "source of its capability; set it under defaults or capabilities.embedding");
        for (size_t j = 0; j < sizeof(values) / sizeof(values[0]); j++) {
            snprintf(yaml, sizeof(yaml), SRC0 SRC1 "    %s: %s\n", keys[i], values[j]);
            expect_reject(yaml, 8, path, reason);
        }
        /* The key may come before the capability in the source's map. */
        snprintf(yaml, sizeof(yaml),
                 "capabilities: { vision: { path: /v } }\n"
                 "sources:\n  - { %s: 5, name: v, capability: vision, base_url: \"http://h\" }\n",
                 keys[i]);
        snprintf(path, sizeof(path), "sources[0].%s", keys[i]);
        expect_reject(yaml, 3, path, "set it under defaults or capabilities.vision");
    }
    /* Full message; with several, the first in file order is reported. */
    char err[CONFIG_ERR_MAX];
    ck_assert_ptr_null(
        parse(SRC0 "    node_timeout_s: 30\n    max_attempts: 2\n", err, sizeof(err)));
    ck_assert_str_eq(err,
                     "t.yaml:5: sources[0].node_timeout_s: not a per-source key: a "
                     "call's budgets span every source of its capability; set it under "
                     "defaults or capabilities.chat");
}
END_TEST

START_TEST(test_config__api_key_inline)
{
    expect_reject(SRC0 "    api_key: " SECRET "\n", 5, "sources[0].api_key",
                  "inline API keys are not accepted; name an environment variable with "
                  "api_key_env or a file with api_key_file");
}
END_TEST

START_TEST(test_config__api_key_env_and_file)
{
    setenv("POLYGW_TEST_KEY", SECRET, 1);
    expect_reject(SRC0 "    api_key_env: POLYGW_TEST_KEY\n    api_key_file: /etc/hostname\n", 6,
                  "sources[0].api_key_file", "cannot be combined with api_key_env");
}
END_TEST

START_TEST(test_config__api_key_env_unset)
{
    unsetenv("POLYGW_TEST_UNSET");
    expect_reject(SRC0 "    api_key_env: POLYGW_TEST_UNSET\n", 5, "sources[0].api_key_env",
                  "the environment variable named here is not set or is empty");
    setenv("POLYGW_TEST_EMPTY", "", 1);
    expect_reject(SRC0 "    api_key_env: POLYGW_TEST_EMPTY\n", 5, "sources[0].api_key_env",
                  "not set or is empty");
    setenv("POLYGW_TEST_BLANK", " \n", 1);
    expect_reject(SRC0 "    api_key_env: POLYGW_TEST_BLANK\n", 5, "sources[0].api_key_env",
                  "the key in the environment is empty");
}
END_TEST

START_TEST(test_config__api_key_env_invalid_name)
{
    expect_reject(SRC0 "    api_key_env: " SECRET "\n", 5, "sources[0].api_key_env",
                  "must be the name of an environment variable");
}
END_TEST

START_TEST(test_config__api_key_file_unreadable)
{
    expect_reject(SRC0 "    api_key_file: /nonexistent/polygw.key\n", 5, "sources[0].api_key_file",
                  "cannot open '/nonexistent/polygw.key': No such file or directory");
    expect_reject(SRC0 "    api_key_file: /tmp\n", 5, "sources[0].api_key_file",
                  "'/tmp' is not a regular file");
}
END_TEST

START_TEST(test_config__api_key_too_long)
{
    char *key = malloc(CONFIG_API_KEY_MAX + 2);
    memset(key, 'k', CONFIG_API_KEY_MAX + 1);
    key[CONFIG_API_KEY_MAX + 1] = '\0';
    setenv("POLYGW_TEST_KEY", key, 1);
    expect_reject(SRC0 "    api_key_env: POLYGW_TEST_KEY\n", 5, "sources[0].api_key_env",
                  "the key in the environment is longer than 4096 bytes");
    key[CONFIG_API_KEY_MAX] = '\n'; /* exactly the maximum + newline */
    setenv("POLYGW_TEST_KEY", key, 1);
    struct config *cfg = expect_ok(SRC0 "    api_key_env: POLYGW_TEST_KEY\n");
    ck_assert_uint_eq(strlen(cfg->sources[0].api_key), CONFIG_API_KEY_MAX);
    config_free(cfg);
    free(key);
}
END_TEST

START_TEST(test_config__api_key_file_relative)
{
    expect_reject(SRC0 "    api_key_file: secrets/key\n", 5, "sources[0].api_key_file",
                  "must be an absolute path");
}
END_TEST

START_TEST(test_config__api_key_file_empty)
{
    char file[64], yaml[512];
    write_temp(file, sizeof(file), "\n\n");
    snprintf(yaml, sizeof(yaml), SRC0 "    api_key_file: %s\n", file);
    expect_reject(yaml, 5, "sources[0].api_key_file", "the key in this file is empty");
    unlink(file);
}
END_TEST

START_TEST(test_config__api_key_file_unreadable_permissions)
{
    char file[64], yaml[512];
    if (geteuid() == 0)
        return; /* root reads anything */
    write_temp(file, sizeof(file), SECRET);
    chmod(file, 0);
    snprintf(yaml, sizeof(yaml), SRC0 "    api_key_file: %s\n", file);
    expect_reject(yaml, 5, "sources[0].api_key_file", "Permission denied");
    unlink(file);
}
END_TEST

/* The key text never reaches an error message, whatever goes wrong. */
START_TEST(test_config__error_never_contains_key)
{
    char file[64], yaml[1024];

    /* A key loaded for source 0, then source 1's key file fails. */
    setenv("POLYGW_TEST_KEY", SECRET, 1);
    snprintf(yaml, sizeof(yaml),
             SRC0 "    api_key_env: POLYGW_TEST_KEY\n" SRC1 "    api_key_file: /nonexistent/key\n");
    expect_reject(yaml, 9, "sources[1].api_key_file", "cannot open");

    /* A key file whose content is unusable. */
    write_temp(file, sizeof(file), SECRET "\nsecond line\n");
    snprintf(yaml, sizeof(yaml), SRC0 "    api_key_file: %s\n", file);
    expect_reject(yaml, 5, "sources[0].api_key_file", "contains control characters");
    unlink(file);

    /* Keys pasted where a name, path, number or URL belongs. */
    expect_reject(SRC0 "    api_key_env: TOPSECRET0123456789\n", 5, "sources[0].api_key_env",
                  "not set");
    char err[CONFIG_ERR_MAX];
    ck_assert_ptr_null(parse(SRC0 "    api_key_env: TOPSECRET0123456789\n", err, sizeof(err)));
    ck_assert_ptr_null(strstr(err, "TOPSECRET0123456789"));
    expect_reject(SRC0 "    api_key_file: " SECRET "\n", 5, "sources[0].api_key_file",
                  "must be an absolute path");
    expect_reject(SRC0 "    timeout_s: " SECRET "\n", 5, "sources[0].timeout_s",
                  "expected a number");
    expect_reject("sources:\n  - { name: a, capability: chat, base_url: " SECRET " }\n", 2,
                  "sources[0].base_url", "must start with http");
    expect_reject(SRC0 "    apikey: " SECRET "\n", 5, "sources[0].apikey", "unknown key");
    expect_reject("listen: { mode: " SECRET " }\n", 1, "listen.mode", "octal");
    expect_reject("server: { log_level: " SECRET " }\n", 1, "server.log_level", "one of");
}
END_TEST

/* ---------------------------------------------------------------- providers */

START_TEST(test_config__kind_defaults_to_openai_bearer)
{
    setenv("PGW_T_KEY", SECRET, 1);
    struct config *cfg = expect_ok(SRC0 "    api_key_env: PGW_T_KEY\n");
    const struct config_source *s = &cfg->sources[0];
    ck_assert_int_eq(s->kind, DIALECT_OPENAI);
    ck_assert(s->stream_usage);
    ck_assert_str_eq(s->req_headers[0], "Authorization: Bearer " SECRET);
    ck_assert_ptr_null(s->req_headers[1]);
    ck_assert_str_eq(s->req_query, "");
    config_free(cfg);
}
END_TEST

START_TEST(test_config__azure_key_header_and_api_version)
{
    setenv("PGW_T_KEY", SECRET, 1);
    struct config *cfg = expect_ok(SRC0 "    kind: azure\n"
                                        "    api_version: \"2024-10-21\"\n"
                                        "    api_key_env: PGW_T_KEY\n"
                                        "    query: {a b: \"x&y\"}\n");
    const struct config_source *s = &cfg->sources[0];
    ck_assert_int_eq(s->kind, DIALECT_AZURE);
    ck_assert_str_eq(s->req_headers[0], "api-key: " SECRET);
    ck_assert_str_eq(s->req_query, "?api-version=2024-10-21&a%20b=x%26y");
    config_free(cfg);
}
END_TEST

START_TEST(test_config__azure_requires_api_version)
{
    expect_reject(SRC0 "    kind: azure\n", 5, "sources[0].api_version",
                  "is required with kind: azure");
    expect_reject(SRC0 "    api_version: \"1\"\n", 5, "sources[0].api_version",
                  "only valid with kind: azure");
}
END_TEST

START_TEST(test_config__anthropic_version_default_and_headers)
{
    setenv("PGW_T_KEY", SECRET, 1);
    setenv("PGW_T_ORG", "org-7", 1);
    struct config *cfg = expect_ok(SRC0 "    kind: anthropic\n"
                                        "    api_key_env: PGW_T_KEY\n"
                                        "    accepts: openai\n"
                                        "    headers:\n"
                                        "      - {name: X-Org, value_env: PGW_T_ORG}\n"
                                        "      - {name: anthropic-beta, value: tools-1}\n");
    const struct config_source *s = &cfg->sources[0];
    ck_assert_int_eq(s->kind, DIALECT_ANTHROPIC);
    ck_assert(s->accepts_openai);
    ck_assert_str_eq(s->req_headers[0], "x-api-key: " SECRET);
    ck_assert_str_eq(s->req_headers[1], "anthropic-version: 2023-06-01");
    ck_assert_str_eq(s->req_headers[2], "X-Org: org-7");
    ck_assert_str_eq(s->req_headers[3], "anthropic-beta: tools-1");
    ck_assert_ptr_null(s->req_headers[4]);
    config_free(cfg);
    expect_reject(SRC0 "    anthropic_version: \"2023-06-01\"\n", 5, "sources[0].anthropic_version",
                  "only valid with kind: anthropic");
    expect_reject(SRC0 "    kind: anthropic\n    stream_usage: false\n", 6,
                  "sources[0].stream_usage", "only valid with kind: openai or azure");
}
END_TEST

START_TEST(test_config__auth_header_and_auth_query)
{
    setenv("PGW_T_KEY", SECRET, 1);
    struct config *cfg = expect_ok(SRC0 "    auth_header: x-goog-api-key\n"
                                        "    api_key_env: PGW_T_KEY\n");
    ck_assert_str_eq(cfg->sources[0].req_headers[0], "x-goog-api-key: " SECRET);
    config_free(cfg);
    setenv("PGW_T_KEY", "a+b/c", 1);
    cfg = expect_ok(SRC0 "    auth_query: key\n    api_key_env: PGW_T_KEY\n");
    ck_assert_ptr_null(cfg->sources[0].req_headers[0]);
    ck_assert_str_eq(cfg->sources[0].req_query, "?key=a%2Bb%2Fc");
    config_free(cfg);
    expect_reject(SRC0 "    auth_header: x-k\n    auth_query: k\n", 6, "sources[0].auth_query",
                  "cannot be combined with auth_header");
    expect_reject(SRC0 "    auth_header: \"bad header\"\n", 5, "sources[0].auth_header",
                  "must be an HTTP header name");
    expect_reject(SRC0 "    auth_header: Content-Type\n", 5, "sources[0].auth_header",
                  "is a header polygw sets itself");
}
END_TEST

START_TEST(test_config__bad_kind_accepts_and_headers)
{
    expect_reject(SRC0 "    kind: sagemaker\n", 5, "sources[0].kind",
                  "must be openai, azure, anthropic, gemini, bedrock or vertex");
    expect_reject(SRC0 "    accepts: openai\n", 5, "sources[0].accepts",
                  "only valid with kind: anthropic");
    expect_reject(SRC0 "    kind: anthropic\n    accepts: gemini\n", 6, "sources[0].accepts",
                  "must be openai");
    expect_reject(SRC0 "    headers: [{name: X-A}]\n", 5, "sources[0].headers[0]",
                  "needs exactly one of value, value_env, value_file");
    expect_reject(SRC0 "    headers: [{name: X-A, value: a, value_env: B}]\n", 5,
                  "sources[0].headers[0]", "needs exactly one of");
    expect_reject(SRC0 "    headers: [{name: Host, value: a}]\n", 5, "sources[0].headers[0].name",
                  "is a header polygw sets itself");
    expect_reject(SRC0 "    headers: [{name: X-A, value: a}, {name: x-a, value: b}]\n", 5,
                  "sources[0].headers[1]", "header x-a repeated");
    expect_reject(SRC0 "    headers: [{name: X-A, valu: a}]\n", 5, "sources[0].headers[0].valu",
                  "unknown key");
    expect_reject(SRC0 "    headers: {X-A: a}\n", 5, "sources[0].headers", "expected a list");
    expect_reject(SRC0 "    query: [a]\n", 5, "sources[0].query", "expected a map");
}
END_TEST

START_TEST(test_config__header_value_env_unset_never_quoted)
{
    unsetenv("PGW_T_NOPE");
    expect_reject(SRC0 "    headers: [{name: X-A, value_env: PGW_T_NOPE}]\n", 5,
                  "sources[0].headers[0].value_env", "is not set or is empty");
}
END_TEST

START_TEST(test_config__http_section)
{
    struct config *cfg = expect_ok("listen: {}\n");
    ck_assert_ptr_null(cfg->http_socket);
    ck_assert_ptr_null(cfg->http_listen);
    ck_assert(!cfg->http_allow_remote);
    ck_assert_uint_eq(cfg->http_max_body_bytes, 16777216);
    ck_assert_uint_eq(cfg->http_max_header_bytes, 32768);
    ck_assert_uint_eq(cfg->http_max_connections, 1024);
    ck_assert(cfg->http_header_timeout_s == 10 && cfg->http_body_timeout_s == 60);
    ck_assert(cfg->http_keepalive_timeout_s == 75 && cfg->http_send_timeout_s == 60);
    config_free(cfg);

    cfg = expect_ok("http:\n  socket: /run/p/http.sock\n  listen: \"[::1]:8088\"\n"
                    "  max_body_bytes: 4096\n  header_timeout_s: 0.5\n");
    ck_assert_str_eq(cfg->http_socket, "/run/p/http.sock");
    ck_assert_str_eq(cfg->http_listen, "[::1]:8088");
    ck_assert_uint_eq(cfg->http_max_body_bytes, 4096);
    config_free(cfg);
    cfg = expect_ok("http: { listen: \"localhost:0\" }\n");
    config_free(cfg);
    cfg = expect_ok("http: { listen: \"10.0.0.5:80\", allow_remote: true }\n");
    config_free(cfg);

    expect_reject("http:\n  listen: \"0.0.0.0:8088\"\n", 2, "http.listen",
                  "not a loopback address");
    expect_reject("http:\n  listen: \"[::]:8088\"\n", 2, "http.listen", "allow_remote");
    expect_reject("http:\n  listen: \"8088\"\n", 2, "http.listen", "expected HOST:PORT");
    expect_reject("http:\n  listen: \"127.0.0.1:99999\"\n", 2, "http.listen",
                  "port must be a number");
    expect_reject("http:\n  listen: \"127.0.0.1:\"\n", 2, "http.listen", "port must be");
    expect_reject("http:\n  listen: \"api.example.com:80\"\n", 2, "http.listen",
                  "numeric IP address");
    expect_reject("http:\n  listen: \"::1:80\"\n", 2, "http.listen", "[ADDR]:PORT");
    expect_reject("http: { max_body_bytes: 10 }\n", 1, "http.max_body_bytes", "1024");
    expect_reject("http: { header_timeout_s: 0 }\n", 1, "http.header_timeout_s", "");
    expect_reject("http: { allow_remote: yes }\n", 1, "http.allow_remote", "boolean");
    expect_reject("http: { sockett: /x }\n", 1, "http.sockett", "unknown key");
}
END_TEST

START_TEST(test_config__http_listen_check)
{
    struct config_addr a;
    char why[200];
    ck_assert_int_eq(config_parse_addr("127.1.2.3:1", &a, why, sizeof(why)), 0);
    ck_assert(a.loopback && !a.ipv6 && a.port == 1);
    ck_assert_int_eq(config_parse_addr("[::1]:65535", &a, why, sizeof(why)), 0);
    ck_assert(a.loopback && a.ipv6 && a.port == 65535);
    ck_assert_int_eq(config_parse_addr("[fe80::1]:5", &a, why, sizeof(why)), 0);
    ck_assert(!a.loopback);
    ck_assert_int_eq(config_parse_addr("128.0.0.1:5", &a, why, sizeof(why)), 0);
    ck_assert(!a.loopback);
    ck_assert_int_eq(config_parse_addr("[::1]5", &a, why, sizeof(why)), -1);
    ck_assert_int_eq(config_parse_addr("1.2.3.4:-1", &a, why, sizeof(why)), -1);

    /* What --http-listen does after the file is loaded. */
    struct config *cfg = expect_ok("listen: {}\n");
    cfg->http_listen = strdup("192.168.1.1:80");
    ck_assert_int_eq(config_check_http_listen(cfg, why, sizeof(why)), -1);
    ck_assert_ptr_nonnull(strstr(why, "allow_remote"));
    cfg->http_allow_remote = true;
    ck_assert_int_eq(config_check_http_listen(cfg, why, sizeof(why)), 0);
    config_free(cfg);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Every error, hints, no cascades, scale                                   */

/* The messages config_parse_report() handed out, one per line. */
struct report {
    char text[16384];
    size_t used;
    unsigned n;
};

static void collect(void *arg, const char *msg)
{
    struct report *r = arg;
    int k = snprintf(r->text + r->used, sizeof(r->text) - r->used, "%s\n", msg);

    ck_assert_int_gt(k, 0);
    ck_assert_uint_lt(r->used + (size_t)k, sizeof(r->text));
    r->used += (size_t)k;
    r->n++;
}

/* Parses `yaml` with a report hook; asserts it is rejected and that `err`
 * holds the first reported message. */
static void report_all(const char *yaml, struct report *r)
{
    char err[CONFIG_ERR_MAX];

    memset(r, 0, sizeof(*r));
    struct config *cfg =
        config_parse_report(yaml, strlen(yaml), "t.yaml", collect, r, err, sizeof(err));
    if (cfg)
        config_free(cfg);
    ck_assert_msg(cfg == NULL, "accepted:\n%s", yaml);
    ck_assert_uint_ge(r->n, 1);
    ck_assert_msg(strncmp(r->text, err, strlen(err)) == 0 && r->text[strlen(err)] == '\n',
                  "err '%s' is not the first report:\n%s", err, r->text);
}

START_TEST(test_config__reports_every_error)
{
    static const char doc[] = "listen:\n"                                           /* 1 */
                              "  mode: \"0660\"\n"                                  /* 2 */
                              "  sokcet: /tmp/x\n"                                  /* 3 */
                              "server:\n"                                           /* 4 */
                              "  log_level: loud\n"                                 /* 5 */
                              "defaults: { max_attempts: 0, backoff_base_s: 90 }\n" /* 6 */
                              "sources:\n"                                          /* 7 */
                              "  - name: a\n"                                       /* 8 */
                              "    capability: chat\n"                              /* 9 */
                              "    base_url: http://h\n"                            /* 10 */
                              "    weight: 0\n"                                     /* 11 */
                              "    max_attempts: 2\n"                               /* 12 */
                              "  - name: a\n"                                       /* 13 */
                              "    capability: vision\n"                            /* 14 */
                              "    base_url: ftp://h\n"                             /* 15 */
                              "    weight: 1\n"                                     /* 16 */
                              "    weight: 2\n";                                    /* 17 */
    struct report r;

    report_all(doc, &r);
    ck_assert_str_eq(
        r.text,
        "t.yaml:3: listen.sokcet: unknown key; did you mean socket?\n"
        "t.yaml:5: server.log_level: must be one of debug, info, warn, error\n"
        "t.yaml:6: defaults.max_attempts: must be in [1, 1000], got 0\n"
        "t.yaml:11: sources[0].weight: must be > 0, got 0\n"
        "t.yaml:15: sources[1].base_url: must start with http:// or https://\n"
        "t.yaml:17: sources[1].weight: duplicate key (first set at line 16)\n"
        "t.yaml:6: defaults.backoff_base_s: must be <= backoff_max_s (60, inherited), got 90\n"
        "t.yaml:12: sources[0].max_attempts: not a per-source key: a call's budgets span "
        "every source of its capability; set it under defaults or capabilities.chat\n"
        "t.yaml:13: sources[1].name: duplicate source name 'a' (first used by sources[0])\n"
        "t.yaml:14: sources[1].capability: unknown capability 'vision' (not chat, embedding, "
        "ocr, responses, nor listed under capabilities:)\n");
    ck_assert_uint_eq(r.n, 10);

    /* A YAML syntax error ends the load: nothing after it can be read. */
    report_all("server: { log_level: loud }\nlisten: [a\n", &r);
    ck_assert_uint_eq(r.n, 1);
    ck_assert_ptr_nonnull(strstr(r.text, "YAML syntax error"));
}
END_TEST

START_TEST(test_config__unknown_key_hints)
{
    /* A key of another section: where it belongs. */
    expect_reject("server:\n  socket: /tmp/s\n", 2, "server.socket",
                  "unknown key; did you mean listen.socket or http.socket?");
    expect_reject("listen: { kind: redis }\n", 1, "listen.kind",
                  "unknown key; did you mean backend.kind or sources[i].kind?");
    expect_reject("max_attempts: 3\n", 1, "max_attempts",
                  "unknown key; did you mean "
                  "defaults.max_attempts or capabilities.NAME.max_attempts?");
    expect_reject("defaults: { path: /x }\n", 1, "defaults.path",
                  "unknown key; did you mean capabilities.NAME.path?");
    expect_reject("timeout_s: 3\n", 1, "timeout_s", "did you mean sources[i].timeout_s?");
    /* ... inside the element being walked: its own index or name. */
    expect_reject(SRC0 SRC1 "    aimd: { failures: 3 }\n", 8, "sources[1].aimd.failures",
                  "unknown key; did you mean sources[1].breaker.failures?");
    expect_reject("capabilities: { vision: { path: /v, tasks: {} } }\n", 1,
                  "capabilities.vision.tasks", "unknown key; did you mean tasks?");
    expect_reject("listen: { ttl_s: 5 }\n", 1, "listen.ttl_s",
                  "did you mean tasks.ttl_s or capabilities.NAME.cache.ttl_s?");
    /* A typo: the nearest key of the same map (case, swaps, a missing suffix). */
    expect_reject("listen:\n  sokcet: /x\n", 2, "listen.sokcet",
                  "unknown key; did you mean socket?");
    expect_reject("listen: { Mode: \"0600\" }\n", 1, "listen.Mode", "did you mean mode?");
    expect_reject(SRC0 "    timeout: 5\n", 5, "sources[0].timeout",
                  "unknown key; did you mean timeout_s?");
    expect_reject(SRC0 "    breker: {}\n", 5, "sources[0].breker", "did you mean breaker?");
    expect_reject("capabilities: { chat: { max_attempt: 2 } }\n", 1,
                  "capabilities.chat.max_attempt", "did you mean max_attempts?");
    expect_reject("source:\n  - {}\n", 1, "source", "unknown key; did you mean sources?");
    /* Nothing near: no hint; forbidden or misplaced keys are never suggested. */
    char err[CONFIG_ERR_MAX];
    ck_assert_ptr_null(parse("listen:\n  colour: blue\n", err, sizeof(err)));
    ck_assert_str_eq(err, "t.yaml:2: listen.colour: unknown key");
    ck_assert_ptr_null(parse(SRC0 "    apikey: x\n", err, sizeof(err)));
    ck_assert_str_eq(err, "t.yaml:5: sources[0].apikey: unknown key");
    ck_assert_ptr_null(parse(SRC0 "    max_attempt: 2\n", err, sizeof(err)));
    ck_assert_str_eq(err, "t.yaml:5: sources[0].max_attempt: unknown key");
}
END_TEST

/* A rejected value is one error: no "is required", no rule comparing it
 * (or what inherits it) with other values follows. */
START_TEST(test_config__rejected_value_one_error)
{
    static const char *const docs[] = {
        /* the name is rejected: not also "is required" nor a duplicate */
        "sources:\n  - { name: \"bad name\", capability: chat, base_url: \"http://h\" }\n",
        /* the capability is rejected: not also "unknown capability" */
        "sources:\n  - { name: a, capability: \"x y\", base_url: \"http://h\" }\n",
        /* a rejected kind: the Redis keys are not "only valid with kind: redis" */
        "backend: { kind: redsi, url: \"redis://h:1/0\", prefix: p }\n",
        /* a rejected aimd.min is not compared with initial */
        SRC0 "    aimd: { min: -1 }\n",
        /* a rejected backoff_max_s, inherited by every capability */
        "defaults: { backoff_max_s: -1, backoff_base_s: 5 }\n",
        /* a rejected stall window is not compared with the sources' ttft */
        "defaults: { stall_window_s: fast }\n" SRC0 "    ttft_timeout_s: 100\n",
        "capabilities: { chat: { stall_window_s: 0 } }\n" SRC0,
        /* a source that is not a map: no "is required" */
        "sources:\n  - 5\n",
        /* a base_url of the wrong type still counts as written */
        "sources:\n  - { name: a, capability: chat, base_url: [x] }\n",
    };
    struct report r;

    for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++) {
        report_all(docs[i], &r);
        ck_assert_msg(r.n == 1, "doc %zu: %u errors:\n%s", i, r.n, r.text);
    }
}
END_TEST

START_TEST(test_config__load_fifo_refused)
{
    char dir[] = "/tmp/polygw-test-fifo-XXXXXX", fifo[64], err[CONFIG_ERR_MAX], want[128];

    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(fifo, sizeof(fifo), "%s/polygw.yaml", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    /* Nobody writes: opening it for reading must not wait for a writer. */
    struct config *cfg = config_load(fifo, err, sizeof(err));
    ck_assert_ptr_null(cfg);
    snprintf(want, sizeof(want), "%s: not a regular file (a FIFO)", fifo);
    ck_assert_str_eq(err, want);
    unlink(fifo);
    rmdir(dir);

    ck_assert_ptr_null(config_load("/dev/null", err, sizeof(err)));
    ck_assert_str_eq(err, "/dev/null: not a regular file (a character device)");
    ck_assert_ptr_null(config_load("/tmp", err, sizeof(err)));
    ck_assert_str_eq(err, "/tmp: not a regular file (a directory)");
}
END_TEST

/* Many capabilities and sources: the indexes find every duplicate and every
 * capability across their resizes (the scaling itself is measured by
 * tests/bench/config_load.py, not asserted). */
START_TEST(test_config__many_entries)
{
    enum { N = 3000 };
    size_t cap = (size_t)N * 160 + 512, used = 0;
    char *doc = malloc(cap);
    struct report r;

    ck_assert_ptr_nonnull(doc);
#define PUT(...) (used += (size_t)snprintf(doc + used, cap - used, __VA_ARGS__))
    PUT("capabilities:\n");
    for (int i = 0; i < N; i++)
        PUT("  c%d: { path: /c%d }\n", i, i);
    PUT("sources:\n");
    for (int i = 0; i < N; i++)
        PUT("  - { name: s%d, capability: c%d, base_url: \"http://h\" }\n", i, N - 1 - i);
    ck_assert_uint_lt(used, cap);
    struct config *cfg = expect_ok(doc);
    ck_assert_uint_eq(cfg->n_capabilities, N + 4);
    ck_assert_uint_eq(cfg->n_sources, N);
    for (size_t i = 0; i < N; i++) {
        const struct config_source *s = &cfg->sources[i];
        ck_assert_str_eq(cfg->capabilities[s->capability_index].name, s->capability);
        ck_assert_uint_eq(s->capability_index, 4 + (N - 1 - i));
    }
    config_free(cfg);

    /* One repeated capability key, one repeated source name, one unknown
     * capability, at the far ends. */
    PUT("  - { name: s7, capability: c0, base_url: \"http://h\" }\n");
    PUT("  - { name: t, capability: c%d, base_url: \"http://h\" }\n", N);
    PUT("  - { name: u, capability: c1, base_url: \"http://h\" }\n");
    char *dup = malloc(used + 64);
    ck_assert_ptr_nonnull(dup);
    int k = snprintf(dup, used + 64, "capabilities:\n  c1: { path: /x }\n%s",
                     doc + strlen("capabilities:\n"));
    ck_assert_int_gt(k, 0);
    report_all(dup, &r);
    char want[512];
    snprintf(want, sizeof(want),
             "t.yaml:%d: capabilities.c1: duplicate key (first set at line 2)\n"
             "t.yaml:%d: sources[%d].name: duplicate source name 's7' (first used by sources[7])\n"
             "t.yaml:%d: sources[%d].capability: unknown capability 'c%d' (not chat, "
             "embedding, ocr, responses, nor listed under capabilities:)\n",
             4, 2 * N + 4, N, 2 * N + 5, N + 1, N);
    ck_assert_str_eq(r.text, want);
#undef PUT
    free(dup);
    free(doc);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Apps                                                                     */

START_TEST(test_config__apps_default_is_implicit)
{
    struct config *cfg = expect_ok(SRC0);
    ck_assert_uint_eq(cfg->n_apps, 1);
    ck_assert_str_eq(cfg->apps[0].name, "default");
    ck_assert_str_eq(config_app_for_peer(cfg, 1000, 1000)->name, "default");
    config_free(cfg);
}
END_TEST

START_TEST(test_config__apps_resolve_uid_then_gid)
{
    struct config *cfg = expect_ok("apps:\n"
                                   "  - {name: web, uids: [1001, 1002], weight: 3}\n"
                                   "  - {name: batch, gids: [2000], allow_declared: true}\n"
                                   "  - {name: ops, uids: [0], admin: true}\n" SRC0);
    ck_assert_uint_eq(cfg->n_apps, 4);
    ck_assert_str_eq(config_app_for_peer(cfg, 1002, 2000)->name, "web"); /* uid wins */
    ck_assert_str_eq(config_app_for_peer(cfg, 1500, 2000)->name, "batch");
    ck_assert_str_eq(config_app_for_peer(cfg, 1500, 2001)->name, "default");
    ck_assert(config_find_app(cfg, "ops")->admin);
    ck_assert(config_find_app(cfg, "batch")->allow_declared);
    ck_assert(!config_find_app(cfg, "web")->allow_declared);
    ck_assert_double_eq(config_find_app(cfg, "web")->weight, 3);
    ck_assert_double_eq(config_find_app(cfg, "default")->weight, 1);
    ck_assert_ptr_null(config_find_app(cfg, "nope"));
    ck_assert_ptr_null(config_find_app(cfg, "web")->capabilities);
    ck_assert_uint_eq(config_find_app(cfg, "web")->max_concurrency, 0);
    config_free(cfg);

    cfg = expect_ok("apps:\n"
                    "  - name: web\n"
                    "    max_concurrency: 4\n"
                    "    limits: {rpm: 60, daily_tokens: 1000000}\n"
                    "    capabilities: [embedding]\n" SRC0);
    const struct config_app *w = config_find_app(cfg, "web");
    ck_assert_uint_eq(w->max_concurrency, 4);
    ck_assert_uint_eq(w->limits.rpm, 60);
    ck_assert_uint_eq(w->limits.tpm, 0);
    ck_assert_uint_eq(w->limits.daily_tokens, 1000000);
    ck_assert_double_eq(w->limits.window_s, 60);
    ck_assert(w->capabilities[config_find_capability(cfg, "embedding", 9)]);
    ck_assert(!w->capabilities[config_find_capability(cfg, "chat", 4)]);
    config_free(cfg);

    /* Task shares: an equal part of tasks.max_tasks (default included),
     * unless set; the whole pool for `default` alone. */
    cfg = expect_ok("tasks: {max_tasks: 10}\n"
                    "apps:\n"
                    "  - {name: web, max_tasks: 7}\n"
                    "  - {name: batch}\n"
                    "  - {name: ops, admin: true}\n" SRC0);
    ck_assert_uint_eq(config_find_app(cfg, "web")->max_tasks, 7);
    ck_assert_uint_eq(config_find_app(cfg, "batch")->max_tasks, 2);
    ck_assert_uint_eq(config_find_app(cfg, "default")->max_tasks, 2);
    config_free(cfg);
    cfg = expect_ok("tasks: {max_tasks: 3}\n"
                    "apps: [{name: a}, {name: b}, {name: c}, {name: d}]\n" SRC0);
    ck_assert_uint_eq(config_find_app(cfg, "a")->max_tasks, 1); /* never 0 */
    config_free(cfg);
    cfg = expect_ok(SRC0);
    ck_assert_uint_eq(config_find_app(cfg, "default")->max_tasks, 65536);
    config_free(cfg);
}
END_TEST

START_TEST(test_config__apps_rejected)
{
    expect_reject("apps:\n  - {name: a, uids: [1]}\n  - {name: b, uids: [2, 1]}\n" SRC0, 3,
                  "apps[1].uids", "uid 1 is already listed by app 'a'");
    expect_reject("apps:\n  - {name: a, gids: [5, 5]}\n" SRC0, 2, "apps[0].gids",
                  "gid 5 is already listed by app 'a'");
    expect_reject("apps:\n  - {name: a}\n  - {name: a}\n" SRC0, 3, "apps[1].name",
                  "duplicate app name 'a'");
    expect_reject("apps:\n  - {uids: [1]}\n" SRC0, 2, "apps[0]", "name: is required");
    expect_reject("apps:\n  - {name: a, uids: [-1]}\n" SRC0, 2, "apps[0].uids[0]",
                  "expected a numeric uid or gid");
    expect_reject("apps:\n  - {name: a, uids: 7}\n" SRC0, 2, "apps[0].uids",
                  "expected a list of numeric ids");
    expect_reject("apps:\n  - {name: default, uids: [7]}\n" SRC0, 2, "apps[0]",
                  "takes no uids or gids");
    expect_reject("apps:\n  - {name: a, weight: 0}\n" SRC0, 2, "apps[0].weight", "must be > 0");
    expect_reject("apps:\n  - {name: a, token: " SECRET "}\n" SRC0, 2, "apps[0].token",
                  "name an environment variable with token_env or a file with token_file");
    expect_reject("apps:\n  - {name: a, capabilities: [chat, vision]}\n" SRC0, 2,
                  "apps[0].capabilities[1]", "not a configured capability");
    expect_reject("apps:\n  - {name: a, capabilities: chat}\n" SRC0, 2, "apps[0].capabilities",
                  "expected a list of capability names");
    expect_reject("apps:\n  - {name: a, max_concurrency: 0}\n" SRC0, 2, "apps[0].max_concurrency",
                  "must be");
    expect_reject("tasks: {max_tasks: 100}\napps:\n  - {name: a, max_tasks: 101}\n" SRC0, 3,
                  "apps[0].max_tasks", "must be <= tasks.max_tasks (100), got 101");
    expect_reject("apps:\n  - {name: a, max_tasks: 0}\n" SRC0, 2, "apps[0].max_tasks", "must be");
}
END_TEST

START_TEST(test_config__apps_tokens)
{
    char file[64];
    setenv("POLYGW_TEST_TOKEN", SECRET " \n", 1);
    write_temp(file, sizeof(file), "tok-from-a-file-0123456789\n");
    char yaml[512];
    snprintf(yaml, sizeof(yaml),
             "apps:\n  - {name: a, token_env: POLYGW_TEST_TOKEN}\n"
             "  - {name: b, token_file: %s}\n  - {name: c, uids: [7]}\n" SRC0,
             file);
    struct config *cfg = expect_ok(yaml);
    ck_assert(config_apps_have_tokens(cfg));
    ck_assert_str_eq(config_find_app(cfg, "a")->token, SECRET); /* whitespace stripped */
    ck_assert_ptr_null(config_find_app(cfg, "a")->token_file);
    ck_assert_str_eq(config_find_app(cfg, "b")->token_file, file);
    ck_assert_ptr_eq(config_app_for_token(cfg, SECRET, strlen(SECRET)), config_find_app(cfg, "a"));
    ck_assert_ptr_eq(config_app_for_token(cfg, "tok-from-a-file-0123456789", 26),
                     config_find_app(cfg, "b"));
    ck_assert_ptr_null(config_app_for_token(cfg, SECRET, strlen(SECRET) - 1)); /* a prefix */
    ck_assert_ptr_null(config_app_for_token(cfg, SECRET "x", strlen(SECRET) + 1));
    ck_assert_ptr_null(config_app_for_token(cfg, "", 0));
    config_free(cfg);
    cfg = expect_ok("apps:\n  - {name: c, uids: [7]}\n" SRC0);
    ck_assert(!config_apps_have_tokens(cfg));
    ck_assert_ptr_null(config_app_for_token(cfg, "", 0));
    config_free(cfg);

    snprintf(yaml, sizeof(yaml),
             "apps:\n  - {name: a, token_env: POLYGW_TEST_TOKEN, token_file: %s}\n" SRC0, file);
    expect_reject(yaml, 2, "apps[0].token_file", "cannot be combined with token_env");
    expect_reject("apps:\n  - {name: default, token_env: POLYGW_TEST_TOKEN}\n" SRC0, 2, "apps[0]",
                  "takes no token");
    expect_reject("apps:\n  - {name: a, token_env: POLYGW_TEST_UNSET}\n" SRC0, 2,
                  "apps[0].token_env", "not set or is empty");
    expect_reject("apps:\n  - {name: a, token_env: POLYGW_TEST_TOKEN}\n"
                  "  - {name: b, token_env: POLYGW_TEST_TOKEN}\n" SRC0,
                  3, "apps[1].token_env", "the same token as app 'a'");
    setenv("POLYGW_TEST_TOKEN", "short-1234", 1);
    expect_reject("apps:\n  - {name: a, token_env: POLYGW_TEST_TOKEN}\n" SRC0, 2,
                  "apps[0].token_env", "must be 16 to 200 bytes");
    unlink(file);
    snprintf(yaml, sizeof(yaml), "apps:\n  - {name: a, token_file: %s}\n" SRC0, file);
    expect_reject(yaml, 2, "apps[0].token_file", "cannot open");
}
END_TEST

START_TEST(test_config__apps_per_capability)
{
    struct config *cfg = expect_ok("apps:\n"
                                   "  - name: web\n"
                                   "    limits: {rpm: 100}\n"
                                   "    per_capability:\n"
                                   "      chat: {max_concurrency: 2, rpm: 10, window_s: 30}\n"
                                   "      embedding: {daily_tokens: 5000}\n"
                                   "  - name: batch\n" SRC0);
    const struct config_app *w = config_find_app(cfg, "web");
    int chat = config_find_capability(cfg, "chat", 4);
    int emb = config_find_capability(cfg, "embedding", 9);
    ck_assert_ptr_nonnull(w->per_capability);
    ck_assert(w->per_capability[chat].set);
    ck_assert_uint_eq(w->per_capability[chat].max_concurrency, 2);
    ck_assert_uint_eq(w->per_capability[chat].limits.rpm, 10);
    ck_assert_double_eq(w->per_capability[chat].limits.window_s, 30);
    ck_assert_uint_eq(w->per_capability[emb].max_concurrency, 0);
    ck_assert_uint_eq(w->per_capability[emb].limits.daily_tokens, 5000);
    ck_assert_double_eq(w->per_capability[emb].limits.window_s, 60);
    ck_assert_uint_eq(w->limits.rpm, 100);
    ck_assert_ptr_null(config_find_app(cfg, "batch")->per_capability);
    config_free(cfg);

    expect_reject("apps:\n  - {name: a, per_capability: {vision: {rpm: 1}}}\n" SRC0, 2,
                  "apps[0].per_capability.vision", "not a configured capability");
    expect_reject("apps:\n  - {name: a, per_capability: [chat]}\n" SRC0, 2,
                  "apps[0].per_capability", "expected a map of capability names to limits");
    expect_reject("apps:\n  - {name: a, per_capability: {chat: 3}}\n" SRC0, 2,
                  "apps[0].per_capability.chat", "expected a map");
    expect_reject("apps:\n  - {name: a, per_capability: {chat: {max_concurrency: 0}}}\n" SRC0, 2,
                  "apps[0].per_capability.chat.max_concurrency", "must be");
    expect_reject("apps:\n  - {name: a, per_capability: {chat: {rpn: 3}}}\n" SRC0, 2,
                  "apps[0].per_capability.chat.rpn", "unknown key; did you mean rpm?");
}
END_TEST

/* Passthrough capabilities: body, methods and max_body_bytes. */
START_TEST(test_config__raw_capabilities)
{
    struct config *cfg =
        expect_ok("capabilities:\n"
                  "  files: { path: /files, body: raw, methods: [GET, POST, DELETE] }\n"
                  "  speech: { path: /audio/speech, body: raw, max_body_bytes: 4096 }\n"
                  "  ask: { path: /ask, body: json }\n");
    const struct config_capability *chat = &cfg->capabilities[0];
    const struct config_capability *files = &cfg->capabilities[4];
    const struct config_capability *speech = &cfg->capabilities[5];
    const struct config_capability *ask = &cfg->capabilities[6];

    ck_assert(!chat->raw);
    ck_assert_uint_eq(chat->methods, CONFIG_METHOD_POST);
    ck_assert(files->raw);
    ck_assert_uint_eq(files->methods,
                      CONFIG_METHOD_GET | CONFIG_METHOD_POST | CONFIG_METHOD_DELETE);
    ck_assert_uint_eq(files->max_body_bytes, CONFIG_RAW_MAX_BODY_DEFAULT);
    ck_assert(speech->raw);
    ck_assert_uint_eq(speech->methods, CONFIG_METHOD_POST);
    ck_assert_uint_eq(speech->max_body_bytes, 4096);
    ck_assert(!ask->raw);
    config_free(cfg);

    expect_reject("capabilities:\n  f: { path: /f, body: binary }\n", 2, "capabilities.f.body",
                  "must be json or raw");
    expect_reject("capabilities:\n  f: { path: /f, body: raw, methods: [GET, PUT] }\n", 2,
                  "capabilities.f.methods[1]", "must be GET, POST or DELETE");
    expect_reject("capabilities:\n  f: { path: /f, body: raw, methods: [get] }\n", 2,
                  "capabilities.f.methods[0]", "upper case");
    expect_reject("capabilities:\n  f: { path: /f, body: raw, methods: [GET, GET] }\n", 2,
                  "capabilities.f.methods[1]", "repeats GET");
    expect_reject("capabilities:\n  f: { path: /f, body: raw, methods: [] }\n", 2,
                  "capabilities.f.methods", "a list of 1 to 3 methods");
    expect_reject("capabilities:\n  f: { path: /f, methods: [GET] }\n", 2, "capabilities.f.methods",
                  "GET and DELETE need body: raw");
    expect_reject("capabilities:\n  chat: { methods: [POST, DELETE] }\n", 2,
                  "capabilities.chat.methods", "need body: raw");
    expect_reject("capabilities:\n  f: { path: /f, max_body_bytes: 100 }\n", 2,
                  "capabilities.f.max_body_bytes", "only for body: raw");
}
END_TEST

/* Prices per million tokens of each class: input and output required,
 * the cache classes default to input, reasoning to output; the currency
 * is one label for the deployment. */
START_TEST(test_config__prices_and_currency)
{
    struct config *cfg = expect_ok(SRC0 "    prices: {input: 3, output: 15, cached_input: 0.3}\n");
    const struct cost_prices *p = &cfg->sources[0].prices;
    ck_assert(p->set);
    ck_assert_double_eq(p->per_mtok[COST_INPUT], 3);
    ck_assert_double_eq(p->per_mtok[COST_CACHED], 0.3);
    ck_assert_double_eq(p->per_mtok[COST_CACHE_WRITE], 3);
    ck_assert_double_eq(p->per_mtok[COST_OUTPUT], 15);
    ck_assert_double_eq(p->per_mtok[COST_REASONING], 15);
    ck_assert_str_eq(cfg->currency, "USD");
    config_free(cfg);

    cfg = expect_ok("server: {currency: EUR}\n" SRC0);
    ck_assert(!cfg->sources[0].prices.set);
    ck_assert_str_eq(cfg->currency, "EUR");
    config_free(cfg);

    expect_reject(SRC0 "    prices: {input: 3}\n", 5, "sources[0].prices.output", "is required");
    expect_reject(SRC0 "    prices: {output: 3}\n", 5, "sources[0].prices.input", "is required");
    expect_reject(SRC0 "    prices: {input: -1, output: 2}\n", 5, "sources[0].prices.input",
                  "must be");
    expect_reject(SRC0 "    prices: {input: 1, output: 2, reasoning: \"x\"}\n", 5,
                  "sources[0].prices.reasoning", "a number");
    expect_reject(SRC0 "    prices: {input: 1, output: 2, audio: 1}\n", 5,
                  "sources[0].prices.audio", "unknown key");
    expect_reject("server: {currency: \"US $\"}\n", 1, "server.currency", "letters, digits");
    expect_reject("server: {currency: \"\"}\n", 1, "server.currency", "1 to 16");
}
END_TEST

/* Budgets: per app and per source, daily/monthly/total in the currency,
 * midnight in UTC or a fixed offset; a budget that an unpriced source (or
 * a passthrough) could charge is refused, and so is one with Redis. */
START_TEST(test_config__budgets)
{
    struct config *cfg = expect_ok(SRC0 "    prices: {input: 1, output: 2}\n"
                                        "    budget: {daily: 5, total: 100, timezone: \"-08:00\"}\n"
                                        "apps:\n"
                                        "  - name: web\n"
                                        "    budget: {monthly: 50}\n");
    const struct budget_limits *b = &cfg->sources[0].budget;
    ck_assert_double_eq(b->limit[BUDGET_DAILY], 5);
    ck_assert_double_eq(b->limit[BUDGET_MONTHLY], 0);
    ck_assert_double_eq(b->limit[BUDGET_TOTAL], 100);
    ck_assert_int_eq(b->utc_offset_s, -8 * 3600);
    ck_assert_double_eq(cfg->apps[0].budget.limit[BUDGET_MONTHLY], 50);
    ck_assert_int_eq(cfg->apps[0].budget.utc_offset_s, 0);
    ck_assert_int_eq(cfg->capabilities[0].budget_output_tokens, 4096);
    config_free(cfg);
    cfg = expect_ok("capabilities:\n  chat: {budget_output_tokens: 512}\n" SRC0);
    ck_assert_int_eq(cfg->capabilities[0].budget_output_tokens, 512);
    config_free(cfg);

    expect_reject(SRC0 "    budget: {total: 1}\n", 5, "sources[0].budget", "needs prices");
    expect_reject(SRC0 "apps:\n  - name: web\n    budget: {total: 1}\n", 7, "apps[0].budget",
                  "source a, which the app may use, has no prices");
    expect_reject(SRC0 "    prices: {input: 1, output: 2}\n    budget: {daily: 0}\n", 6,
                  "sources[0].budget.daily", "must be");
    expect_reject(SRC0 "    prices: {input: 1, output: 2}\n    budget: {daily: 1, timezone: CET}\n",
                  6, "sources[0].budget.timezone", "+HH:MM");
    expect_reject(SRC0 "    prices: {input: 1, output: 2}\n"
                       "    budget: {daily: 1, timezone: \"+24:00\"}\n",
                  6, "sources[0].budget.timezone", "UTC or an offset");
    cfg = expect_ok("backend: {kind: redis, url: \"redis://127.0.0.1:6379\"}\n" SRC0
                    "    prices: {input: 1, output: 2}\n    budget: {daily: 1}\n");
    ck_assert_double_eq(cfg->sources[0].budget.limit[BUDGET_DAILY], 1); /* the fleet's */
    config_free(cfg);
}
END_TEST

/* itpm / otpm and whether cache reads count against them: per source;
 * by default not for kind anthropic (as it documents), yes otherwise. */
START_TEST(test_config__input_output_limits)
{
    struct config *cfg = expect_ok(SRC0 "    limits: {itpm: 1000, otpm: 200}\n"
                                        "  - name: b\n"
                                        "    capability: chat\n"
                                        "    base_url: http://127.0.0.1:1/v1\n"
                                        "    kind: anthropic\n"
                                        "    limits: {itpm: 50}\n"
                                        "  - name: c\n"
                                        "    capability: chat\n"
                                        "    base_url: http://127.0.0.1:1/v1\n"
                                        "    kind: anthropic\n"
                                        "    limits: {cached_input_counts: true}\n");
    ck_assert_int_eq(cfg->sources[0].limits.itpm, 1000);
    ck_assert_int_eq(cfg->sources[0].limits.otpm, 200);
    ck_assert(cfg->sources[0].limits.cached_input_counts);
    ck_assert(!cfg->sources[1].limits.cached_input_counts);
    ck_assert(cfg->sources[2].limits.cached_input_counts);
    config_free(cfg);
    expect_reject(SRC0 "    limits: {itpm: -1}\n", 5, "sources[0].limits.itpm", "must be");
    /* An app's own: itpm and otpm, but the cache rule is its sources'. */
    cfg = expect_ok(SRC0 "apps:\n  - name: web\n    limits: {itpm: 5, otpm: 7}\n");
    ck_assert_int_eq(cfg->apps[0].limits.itpm, 5);
    ck_assert_int_eq(cfg->apps[0].limits.otpm, 7);
    config_free(cfg);
    expect_reject(SRC0 "apps:\n  - name: web\n    limits: {cached_input_counts: true}\n", 7,
                  "apps[0].limits.cached_input_counts", "unknown key");
    /* The Redis backend keeps them for the fleet too (admit.lua's io keys). */
    cfg = expect_ok("backend: {kind: redis, url: \"redis://127.0.0.1:6379\"}\n" SRC0
                    "    limits: {otpm: 5}\n"
                    "apps:\n  - name: web\n    limits: {itpm: 5}\n");
    ck_assert_int_eq(cfg->sources[0].limits.otpm, 5);
    ck_assert_int_eq(cfg->apps[0].limits.itpm, 5);
    config_free(cfg);
}
END_TEST

/* A capability's fleet lock life: 15 s by default, any positive number
 * of seconds up to an hour; zero, negative or not a number is refused
 * with its key path. */
START_TEST(test_config__cache_lock_s)
{
    struct config *cfg = expect_ok(SRC0 "capabilities:\n"
                                        "  chat: { cache: { ttl_s: 60, lock_s: 0.25 } }\n");
    ck_assert_double_eq(cfg->capabilities[0].cache.lock_s, 0.25);
    ck_assert_double_eq(cfg->capabilities[1].cache.lock_s, CONFIG_CACHE_LOCK_DEFAULT_S);
    config_free(cfg);
    static const char *const bad[] = { "0", "-1", "3601", "soon", "[1]" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char yaml[512];
        snprintf(yaml, sizeof(yaml), SRC0 "capabilities:\n  chat: { cache: { lock_s: %s } }\n",
                 bad[i]);
        expect_reject(yaml, 6, "capabilities.chat.cache.lock_s", "");
    }
}
END_TEST

Suite *config_suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("config");

    /* Accepted */
    tcase_add_test(tc, test_config__minimal_defaults);
    tcase_add_test(tc, test_config__no_sources);
    tcase_add_test(tc, test_config__full_example);
    tcase_add_test(tc, test_config__all_values_set);
    tcase_add_test(tc, test_config__inheritance);
    tcase_add_test(tc, test_config__inheritance_order_independent);
    tcase_add_test(tc, test_config__builtin_override_partial);
    tcase_add_test(tc, test_config__custom_capability);
    tcase_add_test(tc, test_config__mode_forms);
    tcase_add_test(tc, test_config__null_means_default);
    tcase_add_test(tc, test_config__name_max_length);
    tcase_add_test(tc, test_config__stall_equal_ttft_ok);
    tcase_add_test(tc, test_config__api_key_env);
    tcase_add_test(tc, test_config__api_key_file);
    tcase_add_test(tc, test_config__load_file);
    tcase_add_test(tc, test_config__load_missing_file);
    tcase_add_test(tc, test_config__deploy_demo_loads);
    tcase_add_test(tc, test_config__small_err_buffer);
    tcase_add_test(tc, test_config__not_nul_terminated);
    tcase_add_test(tc, test_config__every_truncation);
    tcase_add_test(tc, test_config__helpers);
    /* Document */
    tcase_add_test(tc, test_config__empty_document);
    tcase_add_test(tc, test_config__top_not_map);
    tcase_add_test(tc, test_config__yaml_syntax_error);
    tcase_add_test(tc, test_config__invalid_utf8);
    tcase_add_test(tc, test_config__multiple_documents);
    tcase_add_test(tc, test_config__duplicate_key);
    tcase_add_test(tc, test_config__alias_rejected);
    tcase_add_test(tc, test_config__tag_rejected);
    tcase_add_test(tc, test_config__non_string_key);
    /* Keys and types */
    tcase_add_test(tc, test_config__unknown_key_top);
    tcase_add_test(tc, test_config__unknown_key_nested);
    tcase_add_test(tc, test_config__type_string_for_number);
    tcase_add_test(tc, test_config__type_float_for_integer);
    tcase_add_test(tc, test_config__type_map_for_list);
    tcase_add_test(tc, test_config__type_list_for_map);
    tcase_add_test(tc, test_config__type_source_not_map);
    tcase_add_test(tc, test_config__type_bool);
    tcase_add_test(tc, test_config__type_map_for_string);
    tcase_add_test(tc, test_config__nul_in_string);
    /* Values */
    tcase_add_test(tc, test_config__max_attempts_zero);
    tcase_add_test(tc, test_config__integer_overflow);
    tcase_add_test(tc, test_config__not_finite);
    tcase_add_test(tc, test_config__weight_not_positive);
    tcase_add_test(tc, test_config__timeouts_not_positive);
    tcase_add_test(tc, test_config__aimd_decrease_range);
    tcase_add_test(tc, test_config__aimd_values);
    tcase_add_test(tc, test_config__aimd_min_above_initial);
    tcase_add_test(tc, test_config__backoff_max_below_base);
    tcase_add_test(tc, test_config__breaker_values);
    tcase_add_test(tc, test_config__limits_negative);
    tcase_add_test(tc, test_config__concurrency_zero);
    tcase_add_test(tc, test_config__max_message_bytes_range);
    tcase_add_test(tc, test_config__write_queue_below_message);
    tcase_add_test(tc, test_config__connection_bounds);
    tcase_add_test(tc, test_config__mode_invalid_octal);
    tcase_add_test(tc, test_config__mode_too_large);
    tcase_add_test(tc, test_config__mode_other_writable);
    tcase_add_test(tc, test_config__socket_path);
    tcase_add_test(tc, test_config__log_level_invalid);
    tcase_add_test(tc, test_config__backend_kind_invalid);
    tcase_add_test(tc, test_config__tasks_section);
    tcase_add_test(tc, test_config__backend_redis_without_url);
    tcase_add_test(tc, test_config__backend_memory_with_url);
    tcase_add_test(tc, test_config__backend_url_scheme);
    tcase_add_test(tc, test_config__backend_sentinels_auth_tls);
    tcase_add_test(tc, test_config__http_allowed_origins_and_hosts);
    tcase_add_test(tc, test_config__backend_password_env);
    tcase_add_test(tc, test_config__backend_redis_url_and_timeouts);
    tcase_add_test(tc, test_config__backend_redis_url_from_env);
    tcase_add_test(tc, test_config__custom_capability_without_path);
    tcase_add_test(tc, test_config__capability_path_invalid);
    tcase_add_test(tc, test_config__capability_name_invalid);
    /* Sources */
    tcase_add_test(tc, test_config__unknown_capability);
    tcase_add_test(tc, test_config__duplicate_source_name);
    tcase_add_test(tc, test_config__source_no_name);
    tcase_add_test(tc, test_config__source_no_capability);
    tcase_add_test(tc, test_config__source_no_base_url);
    tcase_add_test(tc, test_config__base_url_not_http);
    tcase_add_test(tc, test_config__name_too_long);
    tcase_add_test(tc, test_config__name_bad_chars);
    tcase_add_test(tc, test_config__stall_below_ttft);
    tcase_add_test(tc, test_config__stall_below_ttft_inherited);
    tcase_add_test(tc, test_config__source_policy_key_rejected);
    /* Secrets */
    tcase_add_test(tc, test_config__api_key_inline);
    tcase_add_test(tc, test_config__api_key_env_and_file);
    tcase_add_test(tc, test_config__api_key_env_unset);
    tcase_add_test(tc, test_config__api_key_env_invalid_name);
    tcase_add_test(tc, test_config__api_key_file_unreadable);
    tcase_add_test(tc, test_config__api_key_too_long);
    tcase_add_test(tc, test_config__api_key_file_relative);
    tcase_add_test(tc, test_config__api_key_file_empty);
    tcase_add_test(tc, test_config__api_key_file_unreadable_permissions);
    tcase_add_test(tc, test_config__error_never_contains_key);
    tcase_add_test(tc, test_config__http_section);
    tcase_add_test(tc, test_config__http_listen_check);
    /* Every error, hints, scale */
    tcase_add_test(tc, test_config__reports_every_error);
    tcase_add_test(tc, test_config__unknown_key_hints);
    tcase_add_test(tc, test_config__rejected_value_one_error);
    tcase_add_test(tc, test_config__load_fifo_refused);
    tcase_add_test(tc, test_config__many_entries);
    /* Apps */
    tcase_add_test(tc, test_config__apps_default_is_implicit);
    tcase_add_test(tc, test_config__apps_resolve_uid_then_gid);
    tcase_add_test(tc, test_config__apps_rejected);
    tcase_add_test(tc, test_config__apps_tokens);
    tcase_add_test(tc, test_config__apps_per_capability);
    /* Providers */
    tcase_add_test(tc, test_config__kind_defaults_to_openai_bearer);
    tcase_add_test(tc, test_config__azure_key_header_and_api_version);
    tcase_add_test(tc, test_config__azure_requires_api_version);
    tcase_add_test(tc, test_config__anthropic_version_default_and_headers);
    tcase_add_test(tc, test_config__auth_header_and_auth_query);
    tcase_add_test(tc, test_config__bad_kind_accepts_and_headers);
    tcase_add_test(tc, test_config__header_value_env_unset_never_quoted);
    tcase_add_test(tc, test_config__raw_capabilities);
    tcase_add_test(tc, test_config__prices_and_currency);
    tcase_add_test(tc, test_config__budgets);
    tcase_add_test(tc, test_config__input_output_limits);
    tcase_add_test(tc, test_config__cache_lock_s);
    suite_add_tcase(s, tc);
    return s;
}
