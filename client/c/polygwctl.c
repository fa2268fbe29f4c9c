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
    const char *task;
    double deadline_s;
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
        "\n"
        "Options (anywhere on the line):\n"
        "  -s, --socket PATH   sidecar socket (default: $POLYGW_SOCKET, then\n"
        "                      " PGW_DEFAULT_SOCKET ")\n"
        "  -t, --timeout S     stop waiting after S seconds (default 30; call: 3600);\n"
        "                      a timed-out call is cancelled\n"
        "  -j, --json          JSON output for ping, stats and call\n"
        "  -q, --quiet         no summary line for call\n"
        "  -h, --help          this help\n"
        "  -V, --version       print the version\n"
        "call:\n"
        "  -b, --body JSON     upstream request body, a JSON object; @FILE reads FILE,\n"
        "                      - reads stdin\n"
        "      --stream        print each chunk as one JSON line as it arrives\n"
        "      --scope S       progress scope (default: the capability's)\n"
        "      --task T        task id the call belongs to\n"
        "      --deadline S    sidecar-side deadline for the whole call, seconds\n"
        "batch:\n"
        "      --unordered     print answers as they complete, not in input order\n"
        "\n"
        "Errors are printed to stderr as\n"
        "  error: CODE: MESSAGE (retry_after_s=S attempts=N stalled_s=S status=N)\n"
        "with only the details that apply; raw, batch and --json also print the\n"
        "sidecar's error map to stdout.\n"
        "\n"
        "Exit status:\n"
        "  0  success\n"
        "  1  the sidecar answered with an error (code printed)\n"
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
    size_t n = 0, cap = 65536;
    char *buf = malloc(cap);

    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (ferror(f)) {
            free(buf);
            return NULL;
        }
        if (feof(f))
            break;
        if (cap - n - 1 == 0) {
            char *p = realloc(buf, cap * 2);
            if (!p) {
                free(buf);
                return NULL;
            }
            buf = p;
            cap *= 2;
        }
    }
    if (buf)
        buf[n] = '\0';
    return buf;
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
    int rc = pgw_connect(o->socket, NULL, c, &err);
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
        print_error(&err);
        if (o->json && res)
            print_json(pgw_result_object(res), PGW_JSON_PRETTY);
        pgw_result_free(res);
        return exit_for(rc);
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

static int print_table(const msgpack_object *o)
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

    if (rc < 0) {
        print_error(&err);
        if (o->json && res)
            print_json(pgw_result_object(res), PGW_JSON_PRETTY);
    } else if (o->json || pgw_result_object(res)->type != MSGPACK_OBJECT_MAP) {
        print_json(pgw_result_object(res), PGW_JSON_PRETTY);
    } else {
        rc = print_table(pgw_result_object(res)) == EXIT_OK ? 0 : PGW_E_NOMEM;
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
        print_error(&err);
        if (o->json && res)
            print_json(pgw_result_object(res), PGW_JSON_PRETTY);
        pgw_result_free(res);
        return exit_for(rc);
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
 * batch
 */

struct item {
    char *method;
    char *params;
    size_t plen;
    uint32_t msgid;
    bool in_flight;
    int send_rc;                /* when the send failed */
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
        it->send_rc = pgw_send_request(c, it->method, it->params, it->plen, &it->msgid,
                                       &it->send_err);
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
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ' ||
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

enum { OPT_STREAM = 256, OPT_SCOPE, OPT_TASK, OPT_DEADLINE, OPT_UNORDERED };

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
        { "task", required_argument, NULL, OPT_TASK },
        { "deadline", required_argument, NULL, OPT_DEADLINE },
        { "unordered", no_argument, NULL, OPT_UNORDERED },
        { NULL, 0, NULL, 0 },
    };
    struct ctl o = { 0 };
    bool call_opts = false;
    int ch;

    while ((ch = getopt_long(argc, argv, "s:t:jqhVb:", longopts, NULL)) != -1) {
        switch (ch) {
        case 's': o.socket = optarg; break;
        case 't':
            if (!parse_seconds(optarg, &o.timeout_s))
                return usage_error("--timeout: expected seconds > 0, got '%s'", optarg);
            break;
        case 'j': o.json = true; break;
        case 'q': o.quiet = true; break;
        case 'h': usage(stdout); return EXIT_OK;
        case 'V': printf("polygwctl %s (libpolygw %s)\n", PGW_VERSION, pgw_version()); return EXIT_OK;
        case 'b': o.body = optarg; break;
        case OPT_STREAM: o.stream = true; call_opts = true; break;
        case OPT_SCOPE: o.scope = optarg; call_opts = true; break;
        case OPT_TASK: o.task = optarg; call_opts = true; break;
        case OPT_DEADLINE:
            if (!parse_seconds(optarg, &o.deadline_s))
                return usage_error("--deadline: expected seconds > 0, got '%s'", optarg);
            call_opts = true;
            break;
        case OPT_UNORDERED: o.unordered = true; break;
        default: fputs("try 'polygwctl --help'\n", stderr); return EXIT_USAGE;
        }
    }
    if (optind >= argc)
        return usage_error("%s", "missing COMMAND");
    const char *cmd = argv[optind++];
    int nargs = argc - optind;
    char **args = argv + optind;

    if (strcmp(cmd, "call") != 0 && (call_opts || o.body))
        return usage_error("--body, --stream, --scope, --task and --deadline are for 'call', "
                           "not '%s'", cmd);
    if (strcmp(cmd, "batch") != 0 && o.unordered)
        return usage_error("--unordered is for 'batch', not '%s'", cmd);
    if (strcmp(cmd, "ping") == 0 || strcmp(cmd, "stats") == 0 || strcmp(cmd, "batch") == 0) {
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
    else if (strcmp(cmd, "call") == 0)
        rc = cmd_call(&o, c, args[0], body);
    else if (strcmp(cmd, "raw") == 0)
        rc = cmd_raw(&o, c, args[0], params, plen);
    else
        rc = cmd_batch(&o, c, &b);
    pgw_close(c);
out:
    free(body);
    free(params);
    batch_free(&b);
    return rc;
}
