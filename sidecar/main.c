/*
 * main.c — polygw, the governance sidecar: option parsing, start-up and
 * the event loop. Everything stateful lives in struct server and below.
 */
#include <errno.h>
#include <getopt.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "core/log.h"
#include "backend/backend.h"

#define DEFAULT_CONFIG "/etc/polygw/polygw.yaml"

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: polygw [--config FILE] [--socket PATH] [--log-level LEVEL]\n"
            "              [--http-socket PATH] [--http-listen HOST:PORT]\n"
            "       polygw --check-config FILE\n"
            "       polygw --version | --help\n"
            "\n"
            "polygw is a per-host governance sidecar for LLM API calls. Applications send\n"
            "msgpack-RPC requests over a Unix socket; polygw owns the upstream connections\n"
            "and all governance state, and answers with a result, a stream of chunks, or a\n"
            "typed error. See polygw(8), docs/CONFIG.md and proto/PROTOCOL.md.\n"
            "\n"
            "With an http section it also serves the providers' own HTTP APIs to their\n"
            "SDKs: OpenAI chat, embeddings and Responses (/v1/responses), Anthropic\n"
            "Messages (/v1/messages, /v1/messages/count_tokens), Gemini\n"
            "(/v1beta/models/M:generateContent, :streamGenerateContent, :countTokens) and\n"
            "raw passthrough such as audio (body: raw); see docs/HTTP.md. Per source,\n"
            "tls: {ca_file, cert_file, key_file, server_name}, proxy and no_proxy set how\n"
            "it is reached; certificates are always verified (docs/CONFIG.md 7c).\n"
            "\n"
            "Options:\n"
            "  -c, --config FILE       configuration file (default " DEFAULT_CONFIG ")\n"
            "  -s, --socket PATH       listen on PATH instead of listen.socket\n"
            "  -l, --log-level LEVEL   debug, info, warn or error (overrides server.log_level)\n"
            "      --http-socket PATH  serve the HTTP front end on PATH (overrides http.socket)\n"
            "      --http-listen HOST:PORT\n"
            "                          serve it on TCP too (overrides http.listen; loopback\n"
            "                          unless http.allow_remote is true)\n"
            "      --check-config FILE validate FILE, print every error (FILE:LINE: KEY: REASON)\n"
            "                          or the verdict; exit 0 if valid, 1 if not\n"
            "  -V, --version           print the version and exit\n"
            "  -h, --help              print this help and exit\n"
            "\n"
            "Signals: SIGTERM/SIGINT stop accepting, let in-flight requests finish within\n"
            "server.shutdown_grace_s, answer the rest `shutting_down`, remove the socket\n"
            "file and exit 0. SIGHUP reloads the configuration file (nothing changes if\n"
            "it is invalid; see polygw(8)). Logs are JSON lines on stderr.\n"
            "\n"
            "Environment: with tracing: {enabled: true}, spans are exported over OTLP/HTTP\n"
            "to OTEL_EXPORTER_OTLP_ENDPOINT (+ /v1/traces) or\n"
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, with OTEL_EXPORTER_OTLP_HEADERS,\n"
            "OTEL_SERVICE_NAME and OTEL_TRACES_SAMPLER (docs/CONFIG.md 3d); http_proxy,\n"
            "https_proxy and no_proxy apply to sources without a proxy of their own.\n"
            "\n"
            "Exit status: 0 clean exit or valid config; 1 bad config or start-up failure;\n"
            "2 usage error.\n");
}

/* Each configuration error on its own line, FILE:LINE: KEY: REASON first
 * (the form editors and CI annotate), counted in *arg. */
static void print_config_error(void *arg, const char *msg)
{
    size_t *n = arg;

    (*n)++;
    fprintf(stderr, "%s\n", msg);
}

/* Loads `path`, printing every error and then one verdict line when it is
 * invalid. */
static struct config *load_config(const char *path)
{
    char err[CONFIG_ERR_MAX];
    size_t n = 0;
    struct config *cfg = config_load_report(path, print_config_error, &n, err, sizeof(err));

    if (!cfg)
        fprintf(stderr, "polygw: %s: invalid configuration (%zu error%s)\n", path, n,
                n == 1 ? "" : "s");
    return cfg;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "config", required_argument, NULL, 'c' },
        { "socket", required_argument, NULL, 's' },
        { "log-level", required_argument, NULL, 'l' },
        { "check-config", required_argument, NULL, 'C' },
        { "http-socket", required_argument, NULL, 'H' },
        { "http-listen", required_argument, NULL, 'T' },
        { "version", no_argument, NULL, 'V' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    const char *config_path = DEFAULT_CONFIG, *socket_path = NULL, *check_path = NULL;
    const char *http_socket = NULL, *http_listen = NULL;
    int log_level = -1, opt;
    char err[1024];

    /* The loader checks the backend's addresses with the backend's own
     * syntax (core/ does not know it), here and at every reload. */
    config_set_backend_syntax(backend_config_syntax());
    while ((opt = getopt_long(argc, argv, "c:s:l:Vh", opts, NULL)) != -1) {
        switch (opt) {
        case 'c':
            config_path = optarg;
            break;
        case 's':
            socket_path = optarg;
            break;
        case 'C':
            check_path = optarg;
            break;
        case 'H':
            http_socket = optarg;
            break;
        case 'T':
            http_listen = optarg;
            break;
        case 'l':
            log_level = config_parse_log_level(optarg);
            if (log_level < 0) {
                fprintf(stderr,
                        "polygw: --log-level: expected debug, info, warn or error, got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'V':
            printf("polygw %s\n", PGW_VERSION);
            return 0;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "polygw: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }

    if (check_path) {
        struct config *cfg = load_config(check_path);
        if (!cfg)
            return 1;
        char backend[512];
        backend_describe(cfg, backend, sizeof(backend));
        printf("%s: ok (%zu capabilities, %zu sources, %s)\n", check_path, cfg->n_capabilities,
               cfg->n_sources, backend);
        config_free(cfg);
        return 0;
    }

    struct config *cfg = load_config(config_path);
    if (!cfg)
        return 1;
    if (socket_path) {
        char *p = strdup(socket_path);
        if (!p) {
            config_free(cfg);
            return 1;
        }
        free(cfg->socket_path);
        cfg->socket_path = p;
    }
    if (http_socket || http_listen) {
        char *ps = http_socket ? strdup(http_socket) : NULL;
        char *pl = http_listen ? strdup(http_listen) : NULL;
        if ((http_socket && !ps) || (http_listen && !pl)) {
            free(ps);
            free(pl);
            config_free(cfg);
            return 1;
        }
        if (ps) {
            free(cfg->http_socket);
            cfg->http_socket = ps;
        }
        if (pl) {
            free(cfg->http_listen);
            cfg->http_listen = pl;
            if (config_check_http_listen(cfg, err, sizeof(err)) < 0) {
                fprintf(stderr, "polygw: --http-listen: %s\n", err);
                config_free(cfg);
                return 1;
            }
        }
    }
    log_threshold = log_level >= 0 ? (enum log_level)log_level : cfg->log_level;

    /* Writes to a vanished peer must fail with EPIPE, not kill us. */
    signal(SIGPIPE, SIG_IGN);
    /* Replies and frames of megabytes come and go: give such buffers back
     * to the system when freed. glibc would otherwise raise its mmap
     * threshold to the largest block freed so far and serve them from a
     * heap that fragments and rarely shrinks (a third more resident memory
     * for a client that does not read, measured in test_bounds.py). */
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);

    struct ev_loop *loop = ev_default_loop(EVFLAG_AUTO);
    if (!loop) {
        fprintf(stderr, "polygw: cannot initialise the event loop (libev)\n");
        config_free(cfg);
        return 1;
    }
    struct server srv;
    if (server_init(&srv, loop, cfg, err, sizeof(err)) < 0) {
        log_at(LOG_ERROR, "cannot start", "error", LOG_S, err, NULL);
        fprintf(stderr, "polygw: %s\n", err);
        config_free(cfg);
        ev_loop_destroy(loop);
        return 1;
    }
    log_at(LOG_INFO, "starting", "version", LOG_S, PGW_VERSION, "config", LOG_S, config_path,
           "backend", LOG_S, srv.backend->ops->name, "sources", LOG_U,
           (unsigned long long)cfg->n_sources, NULL);
    srv.config_path = config_path;
    srv.socket_override = socket_path;
    srv.http_socket_override = http_socket;
    srv.http_listen_override = http_listen;
    srv.log_level_override = log_level >= 0;
    server_start(&srv);
    ev_run(loop, 0);
    server_fini(&srv);
    log_at(LOG_INFO, "exited cleanly", NULL);
    config_free(srv.cfg); /* a reload may have replaced `cfg` */
    ev_loop_destroy(loop);
    return 0;
}
