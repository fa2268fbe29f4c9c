/*
 * polygwctl.c — the command-line client of the polygw sidecar.
 *
 * A thin shell over libpolygw: every command is one connection, one or a
 * few requests, and a printer. Data goes to stdout, diagnostics to stderr,
 * and the exit status says which kind of failure happened (see usage()).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "polygw.h"
#include "strbuf.h"

#ifndef PGW_VERSION
#define PGW_VERSION "0.0.0"
#endif

enum {
    EXIT_OK = 0,
    EXIT_REMOTE = 1,    /* the sidecar answered with an error */
    EXIT_USAGE = 2,     /* bad option, argument or JSON */
    EXIT_TRANSPORT = 3, /* cannot connect, I/O, protocol, timeout */
};

struct ctl {
    const char *socket;
    double timeout_s; /* 0: the library's default */
    bool json;
    bool quiet;
    bool stream;
    bool unordered;
    const char *body;
    const char *scope;
    const char *model;
    const char *traceparent;
    const char *task;
    double deadline_s;
    const char *state;      /* tasks --state */
    const char *reason;     /* task stop/finish --reason */
    int finish_ok;          /* task finish: 1 --ok, 0 --failed, -1 unset */
    const char *capability; /* cache purge --capability */
    const char *app;        /* cache purge --app */
};

static void usage(FILE *f)
{
    fputs(
        "usage: polygwctl [OPTIONS] COMMAND [ARGS]\n"
        "\n"
        "Talk to the polygw sidecar over its Unix socket.\n"
        "\n"
        "Commands:\n"
        "  ping                      check the sidecar: pong version=X uptime=Ys rtt=Zus\n"
        "  stats                     the sidecar's statistics, nested keys flattened\n"
        "                            (connections.open  3)\n"
        "  metrics                   the Prometheus text exposition of the sidecar's\n"
        "                            counters, gauges and histograms, as is (pipe it to\n"
        "                            promtool, or serve it to a scraper)\n"
        "  call CAPABILITY --body JSON\n"
        "                            one governed call; prints the upstream body as JSON\n"
        "                            (stdout) and a summary line (stderr)\n"
        "  raw METHOD [PARAMS_JSON]  any method: a JSON object is sent as [object], an\n"
        "                            array as-is, nothing as []; prints the result (or the\n"
        "                            error map) as JSON, stream chunks as JSON lines\n"
        "  batch                     reads one request per line from stdin, [\"METHOD\",\n"
        "                            PARAMS?] with PARAMS as for raw, sends them all on one\n"
        "                            connection, then prints one JSON line per answer:\n"
        "                            {\"index\":I,\"method\":M,\"result\":R} or {...\"error\":E}\n"
        "  tasks [--state S]         the sidecar's tasks as a table, most recently updated\n"
        "                            first: TASK_ID STATE REASON_KIND NODE AGE REASON\n"
        "                            (S: running, succeeded or failed)\n"
        "  task start ID [--traceparent TP]\n"
        "                            start (or restart) task ID; prints the task; with\n"
        "                            TP the run's trace joins TP's\n"
        "  task stop ID --reason TEXT\n"
        "                            stop task ID: its calls in flight end at once with\n"
        "                            task_stopped; prints the task\n"
        "  task finish ID --ok|--failed [--reason TEXT]\n"
        "                            mark task ID succeeded or failed; prints the task\n"
        "  task get ID               print task ID (times as UTC with their age)\n"
        "  task guard ID             print 'running' and exit 0 when task ID is running,\n"
        "                            else exit 1 with the error (task_stopped: REASON)\n"
        "  log-level [LEVEL]         print the sidecar's log level, or set it (debug,\n"
        "                            info, warn, error) until the next restart or reload\n"
        "  cache purge [--capability C] [--app A]\n"
        "                            drop the response cache's entries (of capability C,\n"
        "                            of app A; both: the two at once); admin apps only;\n"
        "                            prints purged=N (with Redis also purged_shared=M:\n"
        "                            the fleet's entries)\n"
        "  reload                    reload the sidecar's configuration file (as SIGHUP);\n"
        "                            an invalid file changes nothing: its errors are\n"
        "                            printed and the exit status is 1\n"
        "\n"
        "Options (anywhere on the line):\n"
        "  -s, --socket PATH   sidecar socket (default: $POLYGW_SOCKET, then\n"
        "                      " PGW_DEFAULT_SOCKET ")\n"
        "  -t, --timeout S     stop waiting after S seconds (default 30; call: 3600);\n"
        "                      a timed-out call is cancelled\n"
        "  -j, --json          JSON output for ping, stats, metrics, call, tasks and\n"
        "                      task: the sidecar's result as it came\n"
        "  -q, --quiet         no summary line for call\n"
        "  -h, --help          this help\n"
        "  -V, --version       print the version\n"
        "call:\n"
        "  -b, --body JSON     upstream request body, a JSON object; @FILE reads FILE,\n"
        "                      - reads stdin\n"
        "      --stream        print each chunk as one JSON line as it arrives\n"
        "      --scope S       progress scope (default: the capability's)\n"
        "      --model M       the model to ask for (default: the body's model)\n"
        "      --task T        task id the call belongs to\n"
        "      --traceparent TP  W3C trace context: the call's span (task start: the\n"
        "                      run's trace) joins TP's trace\n"
        "      --deadline S    sidecar-side deadline for the whole call, seconds\n"
        "batch:\n"
        "      --unordered     print answers as they complete, not in input order\n"
        "tasks, task:\n"
        "      --state S       tasks: only those in state S\n"
        "      --reason TEXT   task stop (required), task finish: why\n"
        "      --ok, --failed  task finish: how the task ended (one is required)\n"
        "cache purge:\n"
        "      --capability C  only the entries of capability C\n"
        "      --app A         only the entries of app A\n"
        "\n"
        "Errors are printed to stderr as\n"
        "  error: CODE: MESSAGE (retry_after_s=S attempts=N stalled_s=S status=N)\n"
        "with only the details that apply; raw, batch and --json also print the\n"
        "sidecar's error map to stdout.\n"
        "\n"
        "Exit status:\n"
        "  0  success\n"
        "  1  the sidecar answered with an error (code printed), e.g. task_stopped,\n"
        "     or unknown_method from a sidecar without tasks\n"
        "  2  usage error: bad command, option, argument or JSON\n"
        "  3  cannot connect, I/O or protocol error, or timeout\n",
        f);
}

static int usage_error(const char *fmt, const char *arg)
{
    fputs("polygwctl: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs("\ntry 'polygwctl --help'\n", stderr);
    return EXIT_USAGE;
}

static int exit_for(int rc)
{
    if (rc == 0)
        return EXIT_OK;
    if (rc == PGW_E_REMOTE)
        return EXIT_REMOTE;
    if (rc == PGW_E_INVALID)
        return EXIT_USAGE;
    return EXIT_TRANSPORT;
}

static void print_error(const struct pgw_error *e)
{
    char d[256];
    size_t n = 0;

    d[0] = '\0';
    if (e->retry_after_s >= 0)
        n += (size_t)snprintf(d + n, sizeof(d) - n, " retry_after_s=%g", e->retry_after_s);
    if (e->attempts > 0 && n < sizeof(d))
        n += (size_t)snprintf(d + n, sizeof(d) - n, " attempts=%d", e->attempts);
    if (e->stalled_s >= 0 && n < sizeof(d))
        n += (size_t)snprintf(d + n, sizeof(d) - n, " stalled_s=%g", e->stalled_s);
    if (e->status > 0 && n < sizeof(d))
        snprintf(d + n, sizeof(d) - n, " status=%d", e->status);
    if (d[0])
        fprintf(stderr, "error: %s: %s (%s)\n", e->code_name, e->message, d + 1);
    else
        fprintf(stderr, "error: %s: %s\n", e->code_name, e->message);
}

static void print_json(const msgpack_object *o, int flags)
{
    char *s = pgw_object_to_json(o, flags);
    if (!s) {
        fputs("polygwctl: out of memory\n", stderr);
        return;
    }
    puts(s);
    free(s);
}

/* JSON text of a C string (owned). */
static char *json_of_str(const char *s)
{
    msgpack_object o = { .type = MSGPACK_OBJECT_STR };
    o.via.str.ptr = s;
    o.via.str.size = (uint32_t)strlen(s);
    return pgw_object_to_json(&o, 0);
}

static bool parse_seconds(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v <= 0)
        return false;
    *out = v;
    return true;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Reads a whole stream into an owned NUL-terminated string. */
static char *read_all(FILE *f)
{
    struct strbuf b = { 0 };
    char chunk[65536];
    size_t n;

    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        if (strbuf_put(&b, chunk, n) < 0)
            break;
    }
    if (n > 0 || ferror(f) || strbuf_reserve(&b, 0) < 0) {
        strbuf_fini(&b);
        return NULL;
    }
    strbuf_terminate(&b);
    return b.data;
}

/* --body: literal JSON, @FILE, or - (stdin). Owned, or NULL with a message. */
static char *load_body(const char *arg)
{
    if (strcmp(arg, "-") == 0 || strcmp(arg, "@-") == 0) {
        char *s = read_all(stdin);
        if (!s)
            fprintf(stderr, "polygwctl: cannot read the body from stdin: %s\n", strerror(errno));
        return s;
    }
    if (arg[0] == '@') {
        FILE *f = fopen(arg + 1, "rb");
        if (!f) {
            fprintf(stderr, "polygwctl: %s: %s\n", arg + 1, strerror(errno));
            return NULL;
        }
        char *s = read_all(f);
        if (!s)
            fprintf(stderr, "polygwctl: cannot read %s\n", arg + 1);
        fclose(f);
        return s;
    }
    char *s = strdup(arg);
    if (!s)
        fputs("polygwctl: out of memory\n", stderr);
    return s;
}

/* Loads --body and checks that it is a JSON object. Returns 0 or an exit
 * status after saying why; *out owned. */
static int prepare_body(const char *arg, char **out)
{
    struct pgw_error err;
    void *mp;
    size_t mlen;

    char *body = load_body(arg);
    if (!body)
        return EXIT_USAGE;
    if (pgw_json_to_msgpack(body, strlen(body), &mp, &mlen, &err) < 0) {
        fprintf(stderr, "polygwctl: --body: %s\n", err.message);
        free(body);
        return err.code == PGW_E_INVALID ? EXIT_USAGE : EXIT_TRANSPORT;
    }
    unsigned char t = *(unsigned char *)mp;
    free(mp);
    if (!((t >= 0x80 && t <= 0x8f) || t == 0xde || t == 0xdf)) {
        fputs("polygwctl: --body must be a JSON object\n", stderr);
        free(body);
        return EXIT_USAGE;
    }
    *out = body;
    return 0;
}

static int connect_or_report(const struct ctl *o, struct pgw_client **c)
{
    struct pgw_error err;
    /* --timeout also bounds the helpers that take no timeout (task.*). */
    struct pgw_options opt = { .request_timeout_s = o->timeout_s };
    int rc = pgw_connect(o->socket, &opt, c, &err);
    if (rc < 0)
        print_error(&err);
    return rc;
}

/* Packed params from PARAMS_JSON: an object → [object], an array as-is.
 * *out owned. Returns 0, or an exit code after printing why. */
static int params_from_json(const char *json, size_t len, char **out, size_t *out_len)
{
    struct pgw_error err;
    void *mp;
    size_t mlen;

    if (pgw_json_to_msgpack(json, len, &mp, &mlen, &err) < 0) {
        fprintf(stderr, "polygwctl: params: %s\n", err.message);
        return err.code == PGW_E_INVALID ? EXIT_USAGE : EXIT_TRANSPORT;
    }
    unsigned char b = *(unsigned char *)mp;
    bool is_map = (b >= 0x80 && b <= 0x8f) || b == 0xde || b == 0xdf;
    bool is_array = (b >= 0x90 && b <= 0x9f) || b == 0xdc || b == 0xdd;
    if (is_array) {
        *out = mp;
        *out_len = mlen;
        return 0;
    }
    if (!is_map) {
        free(mp);
        fputs("polygwctl: params must be a JSON object or array\n", stderr);
        return EXIT_USAGE;
    }
    char *p = malloc(mlen + 1);
    if (!p) {
        free(mp);
        fputs("polygwctl: out of memory\n", stderr);
        return EXIT_TRANSPORT;
    }
    p[0] = (char)0x91; /* fixarray of 1 */
    memcpy(p + 1, mp, mlen);
    free(mp);
    *out = p;
    *out_len = mlen + 1;
    return 0;
}

/* The error of a failed request: the message on stderr, and with --json
 * the sidecar's error map (when one came) on stdout. Frees `res`; returns
 * the exit status. */
static int request_failed(const struct ctl *o, int rc, const struct pgw_error *err,
                          struct pgw_result *res)
{
    print_error(err);
    if (o->json && res)
        print_json(pgw_result_object(res), PGW_JSON_PRETTY);
    pgw_result_free(res);
    return exit_for(rc);
}

/* ---------------------------------------------------------------------
 * ping
 */

static int cmd_ping(const struct ctl *o, struct pgw_client *c)
{
    struct pgw_error err;
    struct pgw_result *res = NULL;
    char version[128];
    double uptime_s;
    int rc;

    double t0 = mono_s();
    if (o->json)
        rc = pgw_request(c, "ping", NULL, 0, o->timeout_s, &res, &err);
    else
        rc = pgw_ping(c, o->timeout_s, version, sizeof(version), &uptime_s, &err);
    long long rtt_us = llround((mono_s() - t0) * 1e6);
    if (rc < 0) {
        return request_failed(o, rc, &err, res);
    }
    if (!o->json) {
        printf("pong version=%s uptime=%.1fs rtt=%lldus\n", version[0] ? version : "?", uptime_s,
               rtt_us);
        return EXIT_OK;
    }
    /* The result map plus rtt_us. */
    const msgpack_object *r = pgw_result_object(res);
    uint32_t n = r->type == MSGPACK_OBJECT_MAP ? r->via.map.size : 0;
    msgpack_object_kv *kv = calloc(n + 1, sizeof(*kv));
    if (!kv) {
        pgw_result_free(res);
        fputs("polygwctl: out of memory\n", stderr);
        return EXIT_TRANSPORT;
    }
    if (n)
        memcpy(kv, r->via.map.ptr, n * sizeof(*kv));
    kv[n].key.type = MSGPACK_OBJECT_STR;
    kv[n].key.via.str.ptr = "rtt_us";
    kv[n].key.via.str.size = 6;
    kv[n].val.type = MSGPACK_OBJECT_POSITIVE_INTEGER;
    kv[n].val.via.u64 = rtt_us > 0 ? (uint64_t)rtt_us : 0;
    msgpack_object m = { .type = MSGPACK_OBJECT_MAP };
    m.via.map.size = n + 1;
    m.via.map.ptr = kv;
    print_json(&m, PGW_JSON_PRETTY);
    free(kv);
    pgw_result_free(res);
    return EXIT_OK;
}

/* ---------------------------------------------------------------------
 * stats
 */

struct row {
    char *key;
    char *val;
};

struct rows {
    struct row *v;
    size_t n, cap;
    bool oom;
};

static void rows_add(struct rows *rs, char *key, char *val)
{
    if (!key || !val || rs->oom)
        goto oom;
    if (rs->n == rs->cap) {
        size_t cap = rs->cap ? rs->cap * 2 : 32;
        struct row *v = realloc(rs->v, cap * sizeof(*v));
        if (!v)
            goto oom;
        rs->v = v;
        rs->cap = cap;
    }
    rs->v[rs->n].key = key;
    rs->v[rs->n].val = val;
    rs->n++;
    return;
oom:
    rs->oom = true;
    free(key);
    free(val);
}

static char *str_dup_n(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

static char *join_key(const char *prefix, const char *part, size_t plen, bool index)
{
    size_t a = prefix ? strlen(prefix) : 0;
    char *k = malloc(a + plen + 3);
    if (!k)
        return NULL;
    if (index)
        snprintf(k, a + plen + 3, "%s[%.*s]", prefix ? prefix : "", (int)plen, part);
    else if (prefix)
        snprintf(k, a + plen + 3, "%s.%.*s", prefix, (int)plen, part);
    else
        snprintf(k, a + plen + 3, "%.*s", (int)plen, part);
    return k;
}

static bool has_containers(const msgpack_object *a)
{
    for (uint32_t i = 0; i < a->via.array.size; i++) {
        msgpack_object_type t = a->via.array.ptr[i].type;
        if (t == MSGPACK_OBJECT_MAP || t == MSGPACK_OBJECT_ARRAY)
            return true;
    }
    return false;
}

/* Flattens nested maps into "a.b.c" rows; arrays of containers become
 * "a[0].b"; arrays of scalars and scalars print as compact JSON, strings
 * as themselves, nil as "-". */
static void flatten(struct rows *rs, const char *prefix, const msgpack_object *o)
{
    if (o->type == MSGPACK_OBJECT_MAP && o->via.map.size > 0) {
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            char *key;
            if (k->type == MSGPACK_OBJECT_STR) {
                key = join_key(prefix, k->via.str.ptr, k->via.str.size, false);
            } else {
                char *kt = pgw_object_to_json(k, 0);
                key = kt ? join_key(prefix, kt, strlen(kt), false) : NULL;
                free(kt);
            }
            if (!key) {
                rs->oom = true;
                return;
            }
            flatten(rs, key, &o->via.map.ptr[i].val);
            free(key);
        }
        return;
    }
    if (o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size > 0 && has_containers(o)) {
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            char idx[16];
            snprintf(idx, sizeof(idx), "%" PRIu32, i);
            char *key = join_key(prefix, idx, strlen(idx), true);
            if (!key) {
                rs->oom = true;
                return;
            }
            flatten(rs, key, &o->via.array.ptr[i]);
            free(key);
        }
        return;
    }
    char *val;
    if (o->type == MSGPACK_OBJECT_STR)
        val = str_dup_n(o->via.str.ptr, o->via.str.size);
    else if (o->type == MSGPACK_OBJECT_NIL)
        val = strdup("-");
    else
        val = pgw_object_to_json(o, 0);
    rows_add(rs, strdup(prefix ? prefix : "(value)"), val);
}

/* Control characters (a newline in a reason, an escape sequence) would
 * break a table or the terminal: show them as '?'. */
static void sanitize(char *s)
{
    for (; *s; s++) {
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            *s = '?';
    }
}

/* Display width of UTF-8 text, in code points (good enough for alignment). */
static size_t text_width(const char *s)
{
    size_t w = 0;
    for (; *s; s++)
        w += ((unsigned char)*s & 0xc0) != 0x80;
    return w;
}

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* "45s", "4m05s", "3h07m", "2d03h": how long ago `at` (Unix s) was. */
static void format_age(double at, char *buf, size_t cap)
{
    double a = wall_s() - at;
    long long s = a > 0 ? (long long)a : 0;

    if (s < 60)
        snprintf(buf, cap, "%llds", s);
    else if (s < 3600)
        snprintf(buf, cap, "%lldm%02llds", s / 60, s % 60);
    else if (s < 86400)
        snprintf(buf, cap, "%lldh%02lldm", s / 3600, s % 3600 / 60);
    else
        snprintf(buf, cap, "%lldd%02lldh", s / 86400, s % 86400 / 3600);
}

/* A "*_at" row's number (Unix s) as "2024-11-30T05:50:01Z (12s ago)". */
static char *format_time(const char *val)
{
    char *end, age[32], iso[32];
    struct tm tm;
    double at = strtod(val, &end);

    if (end == val || *end || !isfinite(at) || at < 0 || at > 253402300799.0)
        return NULL;
    time_t t = (time_t)at;
    if (!gmtime_r(&t, &tm) || !strftime(iso, sizeof(iso), "%Y-%m-%dT%H:%M:%SZ", &tm))
        return NULL;
    format_age(at, age, sizeof(age));
    char *s = malloc(strlen(iso) + strlen(age) + 8);
    if (s)
        sprintf(s, "%s (%s ago)", iso, age);
    return s;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Two columns, key and value, values aligned. With `times`, numeric
 * "*_at" values are Unix times shown as UTC with their age. */
static int print_table(const msgpack_object *o, bool times)
{
    struct rows rs = { 0 };
    size_t w = 0;
    int rc = EXIT_OK;

    flatten(&rs, NULL, o);
    if (rs.oom) {
        fputs("polygwctl: out of memory\n", stderr);
        rc = EXIT_TRANSPORT;
    } else {
        for (size_t i = 0; i < rs.n; i++) {
            size_t l = strlen(rs.v[i].key);
            w = l > w ? l : w;
            char *t = times && ends_with(rs.v[i].key, "_at") ? format_time(rs.v[i].val) : NULL;
            if (t) {
                free(rs.v[i].val);
                rs.v[i].val = t;
            }
            sanitize(rs.v[i].key);
            sanitize(rs.v[i].val);
        }
        for (size_t i = 0; i < rs.n; i++)
            printf("%-*s  %s\n", (int)w, rs.v[i].key, rs.v[i].val);
    }
    for (size_t i = 0; i < rs.n; i++) {
        free(rs.v[i].key);
        free(rs.v[i].val);
    }
    free(rs.v);
    return rc;
}

static int cmd_stats(const struct ctl *o, struct pgw_client *c)
{
    struct pgw_error err;
    struct pgw_result *res;
    int rc = pgw_stats(c, o->timeout_s, &res, &err);

    if (rc < 0)
        return request_failed(o, rc, &err, res);
    if (o->json || pgw_result_object(res)->type != MSGPACK_OBJECT_MAP)
        print_json(pgw_result_object(res), PGW_JSON_PRETTY);
    else
        rc = print_table(pgw_result_object(res), false) == EXIT_OK ? 0 : PGW_E_NOMEM;
    pgw_result_free(res);
    return exit_for(rc);
}

/* The `metrics` result's `text`, written out unchanged. */
static int cmd_metrics(const struct ctl *o, struct pgw_client *c)
{
    struct pgw_error err;
    struct pgw_result *res;
    int rc = pgw_request(c, "metrics", NULL, 0, o->timeout_s, &res, &err);

    if (rc < 0)
        return request_failed(o, rc, &err, res);
    const msgpack_object *text = pgw_object_get(pgw_result_object(res), "text");
    if (o->json) {
        print_json(pgw_result_object(res), PGW_JSON_PRETTY);
    } else if (text && text->type == MSGPACK_OBJECT_STR) {
        fwrite(text->via.str.ptr, 1, text->via.str.size, stdout);
    } else {
        fputs("polygwctl: the sidecar's metrics result has no text\n", stderr);
        rc = PGW_E_PROTOCOL;
    }
    pgw_result_free(res);
    return exit_for(rc);
}

/* ---------------------------------------------------------------------
 * call, raw
 */

struct chunk_ctx {
    size_t chunks;
};

static int print_chunk(const msgpack_object *event, void *ud)
{
    struct chunk_ctx *x = ud;
    print_json(event, 0);
    fflush(stdout); /* as it arrives, also into a pipe */
    x->chunks++;
    return 0;
}

/* "source=a attempts=1 elapsed_s=0.25 stalled_s=0 usage={...}" from a
 * call's result map, on stderr. */
static void print_summary(const msgpack_object *r, const struct chunk_ctx *x, bool stream)
{
    static const char *const keys[] = { "source", "attempts", "elapsed_s", "stalled_s", "usage" };

    fputs("ok:", stderr);
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        const msgpack_object *v = pgw_object_get(r, keys[i]);
        if (!v)
            continue;
        if (v->type == MSGPACK_OBJECT_STR) {
            fprintf(stderr, " %s=%.*s", keys[i], (int)v->via.str.size, v->via.str.ptr);
        } else {
            char *s = pgw_object_to_json(v, 0);
            fprintf(stderr, " %s=%s", keys[i], s ? s : "?");
            free(s);
        }
    }
    if (stream)
        fprintf(stderr, " chunks=%zu", x->chunks);
    fputc('\n', stderr);
}

static int cmd_call(const struct ctl *o, struct pgw_client *c, const char *capability,
                    const char *body)
{
    struct chunk_ctx x = { 0 };
    struct pgw_call_options opt = {
        .stream = o->stream,
        .scope = o->scope,
        .model = o->model,
        .traceparent = o->traceparent,
        .task_id = o->task,
        .deadline_s = o->deadline_s,
        .timeout_s = o->timeout_s,
        .on_chunk = print_chunk,
        .ud = &x,
    };
    struct pgw_error err;
    struct pgw_result *res;

    int rc = pgw_call(c, capability, body, &opt, &res, &err);
    if (rc < 0) {
        return request_failed(o, rc, &err, res);
    }
    const msgpack_object *r = pgw_result_object(res);
    if (o->json) {
        print_json(r, o->stream ? 0 : PGW_JSON_PRETTY);
    } else {
        const msgpack_object *b = pgw_object_get(r, "body");
        if (b)
            print_json(b, PGW_JSON_PRETTY);
        else if (!o->stream)
            print_json(r, PGW_JSON_PRETTY); /* no body: show what came */
        fflush(stdout);
        if (!o->quiet)
            print_summary(r, &x, o->stream);
    }
    pgw_result_free(res);
    return EXIT_OK;
}

/* After a timed-out wait: a call is cancelled (the sidecar then releases
 * its permits), anything else just forgotten. */
static void give_up(struct pgw_client *c, const char *method, uint32_t msgid)
{
    if (strcmp(method, "call") == 0)
        pgw_cancel(c, msgid, NULL);
    pgw_forget(c, msgid);
}

static int cmd_raw(const struct ctl *o, struct pgw_client *c, const char *method,
                   const char *params, size_t plen)
{
    struct chunk_ctx x = { 0 };
    struct pgw_error err;
    struct pgw_result *res = NULL;
    uint32_t id;

    int rc = pgw_send_request(c, method, params, plen, &id, &err);
    if (rc == 0) {
        pgw_set_chunk_handler(c, id, print_chunk, &x);
        rc = pgw_wait_response(c, id, o->timeout_s, &res, &err);
        if (rc == PGW_E_TIMEOUT)
            give_up(c, method, id);
    }
    if (res)
        print_json(pgw_result_object(res), PGW_JSON_PRETTY);
    if (rc < 0)
        print_error(&err);
    pgw_result_free(res);
    return exit_for(rc);
}

/* ---------------------------------------------------------------------
 * log-level
 */

/* A flat result map as one line "k=v k=v" (strings and numbers; nested
 * values are skipped: --json shows everything). */
static void print_kv_line(const msgpack_object *r)
{
    const char *sep = "";

    for (uint32_t i = 0; r->type == MSGPACK_OBJECT_MAP && i < r->via.map.size; i++) {
        const msgpack_object *k = &r->via.map.ptr[i].key, *v = &r->via.map.ptr[i].val;
        if (k->type != MSGPACK_OBJECT_STR)
            continue;
        if (v->type == MSGPACK_OBJECT_STR)
            printf("%s%.*s=%.*s", sep, (int)k->via.str.size, k->via.str.ptr, (int)v->via.str.size,
                   v->via.str.ptr);
        else if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
            printf("%s%.*s=%" PRIu64, sep, (int)k->via.str.size, k->via.str.ptr, v->via.u64);
        else if (v->type == MSGPACK_OBJECT_BOOLEAN)
            printf("%s%.*s=%s", sep, (int)k->via.str.size, k->via.str.ptr,
                   v->via.boolean ? "true" : "false");
        else
            continue;
        sep = " ";
    }
    putchar('\n');
}

/* A request whose result is a flat map: printed as "k=v ..." (or as JSON);
 * an error also prints the `errors` list it may carry, one a line (the
 * errors of an invalid configuration file). */
static int cmd_flat(const struct ctl *o, struct pgw_client *c, const char *method,
                    const char *params, size_t plen)
{
    struct pgw_error err;
    struct pgw_result *res = NULL;
    int rc = pgw_request(c, method, params, plen, o->timeout_s, &res, &err);

    if (rc < 0) {
        const msgpack_object *v = res ? pgw_object_get(pgw_result_object(res), "errors") : NULL;
        for (uint32_t j = 0;
             !o->json && v && v->type == MSGPACK_OBJECT_ARRAY && j < v->via.array.size; j++)
            if (v->via.array.ptr[j].type == MSGPACK_OBJECT_STR)
                fprintf(stderr, "%.*s\n", (int)v->via.array.ptr[j].via.str.size,
                        v->via.array.ptr[j].via.str.ptr);
        return request_failed(o, rc, &err, res);
    }
    if (o->json)
        print_json(pgw_result_object(res), PGW_JSON_PRETTY);
    else
        print_kv_line(pgw_result_object(res));
    pgw_result_free(res);
    return EXIT_OK;
}

/* `log.level`: prints "level=L previous=P". */
static int cmd_log_level(const struct ctl *o, struct pgw_client *c, const char *level)
{
    char json[64], *params = NULL;
    size_t plen = 0;
    int rc;

    if (level) {
        snprintf(json, sizeof(json), "{\"level\":\"%s\"}", level); /* checked by main */
        if ((rc = params_from_json(json, strlen(json), &params, &plen)) != EXIT_OK)
            return rc;
    }
    rc = cmd_flat(o, c, "log.level", params, plen);
    free(params);
    return rc;
}

/* `cache.purge`: prints "purged=N". The names go as msgpack strings, as
 * typed (the sidecar checks them). */
static int cmd_cache_purge(const struct ctl *o, struct pgw_client *c)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    const char *k[2] = { "capability", "app" }, *v[2] = { o->capability, o->app };
    uint32_t n = (v[0] != NULL) + (v[1] != NULL);

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, n);
    for (int i = 0; i < 2; i++) {
        if (!v[i])
            continue;
        msgpack_pack_str_with_body(&pk, k[i], strlen(k[i]));
        msgpack_pack_str_with_body(&pk, v[i], strlen(v[i]));
    }
    int rc = cmd_flat(o, c, "cache.purge", sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

/* ---------------------------------------------------------------------
 * tasks, task
 */

/* One row of the tasks table: the parsed task, sanitised for printing. */
struct task_row {
    struct pgw_task t;
    char age[32];
};

static int task_row_cmp(const void *a, const void *b)
{
    const struct pgw_task *x = &((const struct task_row *)a)->t;
    const struct pgw_task *y = &((const struct task_row *)b)->t;
    if (x->updated_at != y->updated_at)
        return x->updated_at < y->updated_at ? 1 : -1; /* most recent first */
    return strcmp(x->task_id, y->task_id);
}

static const char *or_dash(const char *s)
{
    return s[0] ? s : "-";
}

/* Prints `s` left-aligned in a column of `w` code points, then two spaces. */
static void print_cell(const char *s, size_t w)
{
    size_t n = text_width(s);
    fputs(s, stdout);
    for (; n < w + 2; n++)
        putchar(' ');
}

static int print_tasks(const msgpack_object *r)
{
    static const char *const head[] = {
        "TASK_ID", "STATE", "REASON_KIND", "NODE", "AGE", "REASON"
    };
    const msgpack_object *a = pgw_object_get(r, "tasks");
    size_t n = 0, bad = 0, w[5];

    if (!a || a->type != MSGPACK_OBJECT_ARRAY) {
        fputs("polygwctl: task.list answered without a 'tasks' array\n", stderr);
        return EXIT_TRANSPORT;
    }
    struct task_row *rows = calloc(a->via.array.size ? a->via.array.size : 1, sizeof(*rows));
    if (!rows) {
        fputs("polygwctl: out of memory\n", stderr);
        return EXIT_TRANSPORT;
    }
    for (uint32_t i = 0; i < a->via.array.size; i++) {
        struct task_row *row = &rows[n];
        if (!pgw_task_from_object(&a->via.array.ptr[i], &row->t)) {
            bad++;
            continue;
        }
        if (row->t.updated_at >= 0)
            format_age(row->t.updated_at, row->age, sizeof(row->age));
        sanitize(row->t.task_id);
        sanitize(row->t.state_name);
        sanitize(row->t.reason_kind);
        sanitize(row->t.node);
        sanitize(row->t.reason);
        n++;
    }
    qsort(rows, n, sizeof(*rows), task_row_cmp);
    for (int k = 0; k < 5; k++)
        w[k] = strlen(head[k]);
    for (size_t i = 0; i < n; i++) {
        const char *cell[5] = { rows[i].t.task_id, rows[i].t.state_name,
                                or_dash(rows[i].t.reason_kind), or_dash(rows[i].t.node),
                                or_dash(rows[i].age) };
        for (int k = 0; k < 5; k++) {
            size_t l = text_width(cell[k]);
            w[k] = l > w[k] ? l : w[k];
        }
    }
    for (int k = 0; k < 5; k++)
        print_cell(head[k], w[k]);
    puts(head[5]);
    for (size_t i = 0; i < n; i++) {
        print_cell(rows[i].t.task_id, w[0]);
        print_cell(rows[i].t.state_name, w[1]);
        print_cell(or_dash(rows[i].t.reason_kind), w[2]);
        print_cell(or_dash(rows[i].t.node), w[3]);
        print_cell(or_dash(rows[i].age), w[4]);
        puts(or_dash(rows[i].t.reason));
    }
    free(rows);
    if (bad)
        fprintf(stderr, "polygwctl: %zu malformed task entr%s skipped\n", bad,
                bad == 1 ? "y" : "ies");
    return EXIT_OK;
}

static int cmd_tasks(const struct ctl *o, struct pgw_client *c)
{
    struct pgw_error err;
    struct pgw_result *res;
    int rc = pgw_task_list(c, o->state, &res, &err);

    if (rc < 0) {
        return request_failed(o, rc, &err, res);
    }
    int ex = EXIT_OK;
    if (o->json)
        print_json(pgw_result_object(res), PGW_JSON_PRETTY);
    else
        ex = print_tasks(pgw_result_object(res));
    pgw_result_free(res);
    return ex;
}

/* Prints a task map: as JSON, or as key/value rows with readable times. */
static int print_task(const struct ctl *o, const struct pgw_result *res)
{
    if (o->json) {
        print_json(pgw_result_object(res), PGW_JSON_PRETTY);
        return EXIT_OK;
    }
    return print_table(pgw_result_object(res), true);
}

/* The error of a failed task request: the message, and with --json the
 * sidecar's error map on stdout (guard, stop and finish do not keep it:
 * then {code, message}). Frees `res`. */
static int task_failed(const struct ctl *o, int rc, const struct pgw_error *err,
                       struct pgw_result *res)
{
    if (!o->json || res || rc != PGW_E_REMOTE)
        return request_failed(o, rc, err, res);
    print_error(err);
    char *code = json_of_str(err->code_name), *msg = json_of_str(err->message);
    if (code && msg)
        printf("{\n  \"code\": %s,\n  \"message\": %s\n}\n", code, msg);
    free(code);
    free(msg);
    return exit_for(rc);
}

static int cmd_task(const struct ctl *o, struct pgw_client *c, const char *sub, const char *id)
{
    struct pgw_error err;
    struct pgw_result *res = NULL;
    int rc;

    if (strcmp(sub, "guard") == 0) {
        if ((rc = pgw_task_guard(c, id, &err)) < 0)
            return task_failed(o, rc, &err, NULL);
        puts(o->json ? "{}" : "running");
        return EXIT_OK;
    }
    if (strcmp(sub, "start") == 0)
        rc = pgw_task_start_traced(c, id, o->traceparent, &res, &err);
    else if (strcmp(sub, "get") == 0)
        rc = pgw_task_get(c, id, &res, &err);
    else if (strcmp(sub, "stop") == 0)
        rc = pgw_task_stop(c, id, o->reason, &err);
    else
        rc = pgw_task_finish(c, id, o->finish_ok == 1, o->reason, &err);
    if (rc < 0)
        return task_failed(o, rc, &err, res);
    if (!res) {
        /* stop and finish report success only: read the task back to show
         * what the sidecar now holds (after a race, the winner's reason). */
        if ((rc = pgw_task_get(c, id, &res, &err)) < 0) {
            fprintf(stderr, "polygwctl: task %s: %s done, but reading it back failed:\n", id, sub);
            print_error(&err);
            pgw_result_free(res);
            return EXIT_OK; /* the action itself succeeded */
        }
    }
    int ex = print_task(o, res);
    pgw_result_free(res);
    return ex;
}

/* ---------------------------------------------------------------------
 * batch
 */

struct item {
    char *method;
    char *params;
    size_t plen;
    uint32_t msgid;
    bool in_flight;
    int send_rc; /* when the send failed */
    struct pgw_error send_err;
};

struct batch {
    struct item *v;
    size_t n, cap;
    int worst; /* exit status so far */
};

static void batch_free(struct batch *b)
{
    for (size_t i = 0; i < b->n; i++) {
        free(b->v[i].method);
        free(b->v[i].params);
    }
    free(b->v);
}

/* One input line: ["METHOD", PARAMS?]. Returns 0 or an exit status. */
static int batch_parse_line(struct batch *b, const char *line, size_t len, size_t lineno)
{
    struct pgw_error err;
    msgpack_unpacked u;
    void *mp;
    size_t mlen, off = 0;
    int rc = 0;

    if (pgw_json_to_msgpack(line, len, &mp, &mlen, &err) < 0) {
        fprintf(stderr, "polygwctl: stdin line %zu: %s\n", lineno, err.message);
        return EXIT_USAGE;
    }
    msgpack_unpacked_init(&u);
    if (msgpack_unpack_next(&u, mp, mlen, &off) != MSGPACK_UNPACK_SUCCESS) {
        rc = EXIT_TRANSPORT;
        goto out;
    }
    const msgpack_object *a = &u.data;
    if (a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size < 1 || a->via.array.size > 2 ||
        a->via.array.ptr[0].type != MSGPACK_OBJECT_STR || a->via.array.ptr[0].via.str.size == 0) {
        fprintf(stderr, "polygwctl: stdin line %zu: expected [\"METHOD\", PARAMS?]\n", lineno);
        rc = EXIT_USAGE;
        goto out;
    }
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 16;
        struct item *v = realloc(b->v, cap * sizeof(*v));
        if (!v) {
            rc = EXIT_TRANSPORT;
            goto out;
        }
        b->v = v;
        b->cap = cap;
    }
    struct item *it = &b->v[b->n];
    memset(it, 0, sizeof(*it));
    it->method = str_dup_n(a->via.array.ptr[0].via.str.ptr, a->via.array.ptr[0].via.str.size);
    if (!it->method) {
        rc = EXIT_TRANSPORT;
        goto out;
    }
    b->n++;
    if (a->via.array.size == 2 && a->via.array.ptr[1].type != MSGPACK_OBJECT_NIL) {
        const msgpack_object *p = &a->via.array.ptr[1];
        msgpack_sbuffer sb;
        msgpack_packer pk;
        if (p->type != MSGPACK_OBJECT_MAP && p->type != MSGPACK_OBJECT_ARRAY) {
            fprintf(stderr, "polygwctl: stdin line %zu: PARAMS must be an object or array\n",
                    lineno);
            rc = EXIT_USAGE;
            goto out;
        }
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        if (p->type == MSGPACK_OBJECT_MAP)
            msgpack_pack_array(&pk, 1);
        if (msgpack_pack_object(&pk, *p) != 0) {
            msgpack_sbuffer_destroy(&sb);
            rc = EXIT_TRANSPORT;
            goto out;
        }
        it->plen = sb.size;
        it->params = msgpack_sbuffer_release(&sb);
    }
out:
    if (rc == EXIT_TRANSPORT)
        fputs("polygwctl: out of memory\n", stderr);
    msgpack_unpacked_destroy(&u);
    free(mp);
    return rc;
}

static void batch_note(struct batch *b, int rc)
{
    int e = exit_for(rc);
    if (e == EXIT_TRANSPORT || (e == EXIT_REMOTE && b->worst == EXIT_OK))
        b->worst = e;
}

/* {"index":I,"method":M,"result":R} or {...,"error":E}; E is the sidecar's
 * error map when there is one, else {"code","message"} from `err`. */
static void batch_print(struct batch *b, size_t i, int rc, const struct pgw_result *res,
                        const struct pgw_error *err)
{
    char *m = json_of_str(b->v[i].method);
    char *v = NULL;

    if (res) {
        v = pgw_object_to_json(pgw_result_object(res), 0);
    } else {
        char *code = json_of_str(err->code_name), *msg = json_of_str(err->message);
        if (code && msg && (v = malloc(strlen(code) + strlen(msg) + 32)))
            sprintf(v, "{\"code\":%s,\"message\":%s}", code, msg);
        free(code);
        free(msg);
    }
    printf("{\"index\":%zu,\"method\":%s,\"%s\":%s}\n", i, m ? m : "null",
           rc == 0 ? "result" : "error", v ? v : "null");
    fflush(stdout);
    free(m);
    free(v);
    batch_note(b, rc);
}

static int cmd_batch(const struct ctl *o, struct pgw_client *c, struct batch *b)
{
    struct pgw_error err;
    struct pgw_result *res;
    int rc;

    for (size_t i = 0; i < b->n; i++) {
        struct item *it = &b->v[i];
        it->send_rc =
            pgw_send_request(c, it->method, it->params, it->plen, &it->msgid, &it->send_err);
        it->in_flight = it->send_rc == 0;
        if (!it->in_flight && o->unordered)
            batch_print(b, i, it->send_rc, NULL, &it->send_err);
    }
    if (!o->unordered) {
        for (size_t i = 0; i < b->n; i++) {
            struct item *it = &b->v[i];
            if (!it->in_flight) {
                batch_print(b, i, it->send_rc, NULL, &it->send_err);
                continue;
            }
            rc = pgw_wait_response(c, it->msgid, o->timeout_s, &res, &err);
            if (rc == PGW_E_TIMEOUT)
                give_up(c, it->method, it->msgid);
            batch_print(b, i, rc, res, &err);
            pgw_result_free(res);
        }
        return b->worst;
    }
    while (pgw_in_flight(c) > 0) {
        uint32_t id;
        rc = pgw_wait_any(c, o->timeout_s, &id, &res, &err);
        if (rc == PGW_E_TIMEOUT) {
            for (size_t i = 0; i < b->n; i++) {
                if (b->v[i].in_flight) {
                    give_up(c, b->v[i].method, b->v[i].msgid);
                    b->v[i].in_flight = false;
                    batch_print(b, i, rc, NULL, &err);
                }
            }
            break;
        }
        for (size_t i = 0; i < b->n; i++) {
            if (b->v[i].in_flight && b->v[i].msgid == id) {
                b->v[i].in_flight = false;
                batch_print(b, i, rc, res, &err);
                break;
            }
        }
        pgw_result_free(res);
    }
    return b->worst;
}

static int read_batch(struct batch *b)
{
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t n;
    int rc = 0;

    while (rc == 0 && (n = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        size_t len = (size_t)n;
        while (len &&
               (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ' ||
                line[len - 1] == '\t'))
            len--;
        size_t start = strspn(line, " \t");
        if (start >= len || line[start] == '#')
            continue;
        rc = batch_parse_line(b, line + start, len - start, lineno);
    }
    free(line);
    return rc;
}

/* ---------------------------------------------------------------------
 * main
 */

enum {
    OPT_STREAM = 256,
    OPT_SCOPE,
    OPT_MODEL,
    OPT_TASK,
    OPT_TRACEPARENT,
    OPT_DEADLINE,
    OPT_UNORDERED,
    OPT_STATE,
    OPT_REASON,
    OPT_OK,
    OPT_FAILED,
    OPT_CAPABILITY,
    OPT_APP
};

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "socket", required_argument, NULL, 's' },
        { "timeout", required_argument, NULL, 't' },
        { "json", no_argument, NULL, 'j' },
        { "quiet", no_argument, NULL, 'q' },
        { "help", no_argument, NULL, 'h' },
        { "version", no_argument, NULL, 'V' },
        { "body", required_argument, NULL, 'b' },
        { "stream", no_argument, NULL, OPT_STREAM },
        { "scope", required_argument, NULL, OPT_SCOPE },
        { "model", required_argument, NULL, OPT_MODEL },
        { "task", required_argument, NULL, OPT_TASK },
        { "traceparent", required_argument, NULL, OPT_TRACEPARENT },
        { "deadline", required_argument, NULL, OPT_DEADLINE },
        { "unordered", no_argument, NULL, OPT_UNORDERED },
        { "state", required_argument, NULL, OPT_STATE },
        { "reason", required_argument, NULL, OPT_REASON },
        { "ok", no_argument, NULL, OPT_OK },
        { "failed", no_argument, NULL, OPT_FAILED },
        { "capability", required_argument, NULL, OPT_CAPABILITY },
        { "app", required_argument, NULL, OPT_APP },
        { NULL, 0, NULL, 0 },
    };
    struct ctl o = { .finish_ok = -1 };
    bool call_opts = false, finish_twice = false;
    int ch;

    while ((ch = getopt_long(argc, argv, "s:t:jqhVb:", longopts, NULL)) != -1) {
        switch (ch) {
        case 's':
            o.socket = optarg;
            break;
        case 't':
            if (!parse_seconds(optarg, &o.timeout_s))
                return usage_error("--timeout: expected seconds > 0, got '%s'", optarg);
            break;
        case 'j':
            o.json = true;
            break;
        case 'q':
            o.quiet = true;
            break;
        case 'h':
            usage(stdout);
            return EXIT_OK;
        case 'V':
            printf("polygwctl %s (libpolygw %s)\n", PGW_VERSION, pgw_version());
            return EXIT_OK;
        case 'b':
            o.body = optarg;
            break;
        case OPT_STREAM:
            o.stream = true;
            call_opts = true;
            break;
        case OPT_SCOPE:
            o.scope = optarg;
            call_opts = true;
            break;
        case OPT_MODEL:
            o.model = optarg;
            call_opts = true;
            break;
        case OPT_TASK:
            o.task = optarg;
            call_opts = true;
            break;
        case OPT_TRACEPARENT:
            o.traceparent = optarg; /* 'call', 'task start' */
            break;
        case OPT_DEADLINE:
            if (!parse_seconds(optarg, &o.deadline_s))
                return usage_error("--deadline: expected seconds > 0, got '%s'", optarg);
            call_opts = true;
            break;
        case OPT_UNORDERED:
            o.unordered = true;
            break;
        case OPT_STATE:
            if (strcmp(optarg, "running") != 0 && strcmp(optarg, "succeeded") != 0 &&
                strcmp(optarg, "failed") != 0)
                return usage_error("--state: expected running, succeeded or failed, got '%s'",
                                   optarg);
            o.state = optarg;
            break;
        case OPT_REASON:
            o.reason = optarg;
            break;
        case OPT_CAPABILITY:
            o.capability = optarg;
            break;
        case OPT_APP:
            o.app = optarg;
            break;
        case OPT_OK:
        case OPT_FAILED:
            finish_twice |= o.finish_ok != -1 && o.finish_ok != (ch == OPT_OK);
            o.finish_ok = ch == OPT_OK;
            break;
        default:
            fputs("try 'polygwctl --help'\n", stderr);
            return EXIT_USAGE;
        }
    }
    if (optind >= argc)
        return usage_error("%s", "missing COMMAND");
    const char *cmd = argv[optind++];
    int nargs = argc - optind;
    char **args = argv + optind;

    if (strcmp(cmd, "call") != 0 && (call_opts || o.body))
        return usage_error("--body, --stream, --scope, --model, --task and --deadline are for "
                           "'call', "
                           "not '%s'",
                           cmd);
    if (strcmp(cmd, "batch") != 0 && o.unordered)
        return usage_error("--unordered is for 'batch', not '%s'", cmd);
    if (strcmp(cmd, "tasks") != 0 && o.state)
        return usage_error("--state is for 'tasks', not '%s'", cmd);
    const char *sub =
        (strcmp(cmd, "task") == 0 || strcmp(cmd, "cache") == 0) && nargs >= 1 ? args[0] : "";
    char what[64]; /* "task stop", "ping": for messages */
    snprintf(what, sizeof(what), "%s%s%.40s", cmd, sub[0] ? " " : "", sub);
    if (o.traceparent && strcmp(cmd, "call") != 0 && strcmp(sub, "start") != 0)
        return usage_error("--traceparent is for 'call' and 'task start', not '%s'", what);
    if (o.reason && strcmp(sub, "stop") != 0 && strcmp(sub, "finish") != 0)
        return usage_error("--reason is for 'task stop' and 'task finish', not '%s'", what);
    if ((o.capability || o.app) && strcmp(cmd, "cache") != 0)
        return usage_error("--capability and --app are for 'cache purge', not '%s'", what);
    if (o.finish_ok != -1 && strcmp(sub, "finish") != 0)
        return usage_error("--ok and --failed are for 'task finish', not '%s'", what);
    if (strcmp(cmd, "ping") == 0 || strcmp(cmd, "stats") == 0 || strcmp(cmd, "metrics") == 0 ||
        strcmp(cmd, "batch") == 0) {
        if (nargs != 0)
            return usage_error("'%s' takes no arguments", cmd);
    } else if (strcmp(cmd, "call") == 0) {
        if (nargs != 1)
            return usage_error("%s", "usage: call CAPABILITY --body JSON [--stream] ...");
        if (!o.body)
            return usage_error("%s", "call: --body JSON is required");
    } else if (strcmp(cmd, "raw") == 0) {
        if (nargs < 1 || nargs > 2)
            return usage_error("%s", "usage: raw METHOD [PARAMS_JSON]");
    } else if (strcmp(cmd, "tasks") == 0) {
        if (nargs != 0)
            return usage_error("%s", "usage: tasks [--state running|succeeded|failed] [--json]");
    } else if (strcmp(cmd, "task") == 0) {
        if (strcmp(sub, "start") != 0 && strcmp(sub, "stop") != 0 && strcmp(sub, "get") != 0 &&
            strcmp(sub, "finish") != 0 && strcmp(sub, "guard") != 0)
            return usage_error("%s", "usage: task start|stop|finish|get|guard ID ...");
        if (nargs != 2 || !args[1][0])
            return usage_error("usage: task %s ID (one non-empty task id)", sub);
        if (strcmp(sub, "stop") == 0 && !o.reason)
            return usage_error("%s", "task stop: --reason TEXT is required");
        if (strcmp(sub, "finish") == 0 && (o.finish_ok == -1 || finish_twice))
            return usage_error("%s", "task finish: exactly one of --ok and --failed is required");
    } else if (strcmp(cmd, "cache") == 0) {
        if (nargs != 1 || strcmp(sub, "purge") != 0)
            return usage_error("%s", "usage: cache purge [--capability C] [--app A]");
        if ((o.capability && !o.capability[0]) || (o.app && !o.app[0]))
            return usage_error("%s", "cache purge: --capability and --app take a non-empty name");
    } else if (strcmp(cmd, "reload") == 0) {
        if (nargs != 0)
            return usage_error("%s", "'reload' takes no arguments");
    } else if (strcmp(cmd, "log-level") == 0) {
        if (nargs > 1)
            return usage_error("%s", "usage: log-level [debug|info|warn|error]");
        if (nargs == 1 && strcmp(args[0], "debug") != 0 && strcmp(args[0], "info") != 0 &&
            strcmp(args[0], "warn") != 0 && strcmp(args[0], "error") != 0)
            return usage_error("log-level: expected debug, info, warn or error, got '%s'", args[0]);
    } else {
        return usage_error("unknown command '%s'", cmd);
    }

    /* Everything local is checked before connecting, so that a usage
     * error is reported as one even when the sidecar is down. */
    struct batch b = { 0 };
    char *body = NULL, *params = NULL;
    size_t plen = 0;
    int rc = EXIT_OK;
    if (strcmp(cmd, "batch") == 0)
        rc = read_batch(&b);
    else if (strcmp(cmd, "call") == 0)
        rc = prepare_body(o.body, &body);
    else if (strcmp(cmd, "raw") == 0 && nargs == 2)
        rc = params_from_json(args[1], strlen(args[1]), &params, &plen);
    if (rc != EXIT_OK || (strcmp(cmd, "batch") == 0 && b.n == 0))
        goto out;

    struct pgw_client *c;
    if (connect_or_report(&o, &c) < 0) {
        rc = EXIT_TRANSPORT;
        goto out;
    }
    if (strcmp(cmd, "ping") == 0)
        rc = cmd_ping(&o, c);
    else if (strcmp(cmd, "stats") == 0)
        rc = cmd_stats(&o, c);
    else if (strcmp(cmd, "metrics") == 0)
        rc = cmd_metrics(&o, c);
    else if (strcmp(cmd, "call") == 0)
        rc = cmd_call(&o, c, args[0], body);
    else if (strcmp(cmd, "raw") == 0)
        rc = cmd_raw(&o, c, args[0], params, plen);
    else if (strcmp(cmd, "tasks") == 0)
        rc = cmd_tasks(&o, c);
    else if (strcmp(cmd, "task") == 0)
        rc = cmd_task(&o, c, sub, args[1]);
    else if (strcmp(cmd, "cache") == 0)
        rc = cmd_cache_purge(&o, c);
    else if (strcmp(cmd, "reload") == 0)
        rc = cmd_flat(&o, c, "config.reload", NULL, 0);
    else if (strcmp(cmd, "log-level") == 0)
        rc = cmd_log_level(&o, c, nargs == 1 ? args[0] : NULL);
    else
        rc = cmd_batch(&o, c, &b);
    pgw_close(c);
out:
    free(body);
    free(params);
    batch_free(&b);
    return rc;
}
