/*
 * control.c — the /_mock/... endpoints (never counted as API requests), the
 * per-path counters and the history of recent API requests.
 *
 *   GET  /_mock/stats     counters, see README.md
 *   GET  /_mock/last      the newest API request, or null
 *   GET  /_mock/requests  up to MOCK_HISTORY API requests, oldest first
 *   POST /_mock/script    [behaviour, ...] | {"queue":[...], "append":[...], "default":{...}|null}
 *   POST /_mock/reset     optional {"drop_connections": true}
 *
 * Recording an API request costs one memcpy into a reused slot; the JSON
 * for /_mock/last is built only when asked for.
 */
#include "internal.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void control_count_path(struct mock *m, const char *path, size_t plen)
{
    for (size_t i = 0; i < m->npaths; i++) {
        if (strlen(m->paths[i].path) == plen && !memcmp(m->paths[i].path, path, plen)) {
            m->paths[i].n++;
            return;
        }
    }
    if (m->npaths == MOCK_MAX_PATHS || plen > 1024) {
        m->paths_overflow++;
        return;
    }
    m->paths[m->npaths].path = mock_xstrndup(path, plen);
    m->paths[m->npaths].n = 1;
    m->npaths++;
}

void control_record(struct mock *m, const char *head, size_t hlen, const char *body, size_t blen)
{
    struct mock_record *r = &m->hist[m->hist_next];
    size_t keep = blen < MOCK_HISTORY_BODY_MAX ? blen : MOCK_HISTORY_BODY_MAX;
    m->hist_next = (m->hist_next + 1) % MOCK_HISTORY;
    if (m->hist_count < MOCK_HISTORY)
        m->hist_count++;
    buf_trim(&r->data, 256u * 1024u);
    buf_add(&r->data, head, hlen);
    buf_add(&r->data, body, keep);
    r->head_len = hlen;
    r->body_len = keep;
    r->body_total = blen;
}

static void history_clear(struct mock *m)
{
    for (size_t i = 0; i < MOCK_HISTORY; i++)
        buf_fini(&m->hist[i].data);
    m->hist_next = m->hist_count = 0;
}

static void paths_clear(struct mock *m)
{
    for (size_t i = 0; i < m->npaths; i++)
        free(m->paths[i].path);
    m->npaths = 0;
    m->paths_overflow = 0;
}

void control_fini(struct mock *m)
{
    history_clear(m);
    paths_clear(m);
}

/* A JSON string from bytes that may not be UTF-8 (bytes >= 0x80 become '?'
 * then). */
static json_t *lossy_string(const char *p, size_t n)
{
    json_t *s = json_stringn(p, n);
    if (s)
        return s;
    char *t = mock_xstrndup(p, n);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)t[i] >= 0x80 || t[i] == '\0')
            t[i] = '?';
    s = json_stringn(t, n);
    free(t);
    return s;
}

static json_t *record_json(const struct mock_record *r)
{
    const char *p = r->data.p;
    const char *end = p + r->head_len - 2;
    const char *eol = memmem(p, r->head_len, "\r\n", 2);
    const char *sp1 = memchr(p, ' ', (size_t)(eol - p));
    const char *t = sp1 + 1;
    const char *sp2 = memchr(t, ' ', (size_t)(eol - t));
    const char *q = memchr(t, '?', (size_t)(sp2 - t));
    json_t *o = json_object();
    json_t *h = json_object();

    json_object_set_new(o, "method", lossy_string(p, (size_t)(sp1 - p)));
    json_object_set_new(o, "target", lossy_string(t, (size_t)(sp2 - t)));
    json_object_set_new(o, "path", lossy_string(t, (size_t)((q ? q : sp2) - t)));
    json_object_set_new(o, "head", lossy_string(p, r->head_len));
    for (const char *line = eol + 2; line < end;) {
        const char *le = memmem(line, (size_t)(end + 2 - line), "\r\n", 2);
        const char *colon = memchr(line, ':', (size_t)(le - line));
        const char *v = colon + 1, *ve = le;
        while (v < ve && (*v == ' ' || *v == '\t'))
            v++;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        char *name = mock_xstrndup(line, (size_t)(colon - line));
        for (char *s = name; *s; s++)
            *s = (char)tolower((unsigned char)*s);
        json_t *val = lossy_string(v, (size_t)(ve - v));
        json_t *prev = json_object_get(h, name);
        if (prev && val) { /* repeated field: join as HTTP allows */
            char *joined;
            if (asprintf(&joined, "%s, %s", json_string_value(prev), json_string_value(val)) >= 0) {
                json_decref(val);
                val = json_string(joined);
                free(joined);
            }
        }
        if (val)
            json_object_set_new(h, name, val);
        free(name);
        line = le + 2;
    }
    json_t *auth = json_object_get(h, "authorization");
    json_object_set(o, "authorization", auth ? auth : json_null());
    json_object_set_new(o, "headers", h);
    const char *body = p + r->head_len;
    json_object_set_new(o, "body", lossy_string(body, r->body_len));
    json_object_set_new(o, "body_bytes", json_integer((json_int_t)r->body_total));
    json_object_set_new(o, "body_truncated", json_boolean(r->body_len < r->body_total));
    json_t *parsed = r->body_len ? json_loadb(body, r->body_len, 0, NULL) : NULL;
    json_object_set_new(o, "json", parsed ? parsed : json_null());
    return o;
}

/* Takes `doc` (any JSON value) and answers with it. */
static void reply_json(struct conn *c, int status, json_t *doc)
{
    char *s = json_dumps(doc, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(doc);
    reply_simple(c, status, "application/json", s ? s : "null", s ? strlen(s) : 4);
    free(s);
}

static void control_error(struct conn *c, int status, const char *msg)
{
    reply_json(c, status,
               json_pack("{s:{s:s,s:s}}", "error", "message", msg, "type", "mock_error"));
}

static void control_stats(struct conn *c)
{
    struct mock *m = c->m;
    json_t *paths = json_object();
    json_t *status = json_object();
    for (size_t i = 0; i < m->npaths; i++)
        json_object_set_new(paths, m->paths[i].path, json_integer((json_int_t)m->paths[i].n));
    if (m->paths_overflow)
        json_object_set_new(paths, "(other)", json_integer((json_int_t)m->paths_overflow));
    for (int i = 0; i < MOCK_MAX_STATUS; i++) {
        if (m->by_status[i]) {
            char k[16];
            snprintf(k, sizeof k, "%d", i);
            json_object_set_new(status, k, json_integer((json_int_t)m->by_status[i]));
        }
    }
    json_t *o = json_object();
    json_object_set_new(o, "requests", json_integer((json_int_t)m->st.requests));
    json_object_set_new(o, "by_path", paths);
    json_object_set_new(o, "by_status", status);
    json_object_set_new(o, "open_connections", json_integer((json_int_t)m->st.open));
    json_object_set_new(o, "accepted_connections", json_integer((json_int_t)m->st.accepted));
    json_object_set_new(o, "closed_connections", json_integer((json_int_t)m->st.closed));
    json_object_set_new(o, "closed_by_peer", json_integer((json_int_t)m->st.closed_by_peer));
    json_object_set_new(o, "aborted_by_peer", json_integer((json_int_t)m->st.aborted_by_peer));
    json_object_set_new(o, "last_abort_at_ms", json_real(m->st.last_abort_s * 1000.0));
    json_object_set_new(o, "in_progress", json_integer((json_int_t)m->st.in_progress));
    json_object_set_new(o, "queue_len", json_integer((json_int_t)json_array_size(m->queue)));
    json_object_set_new(o, "has_default", json_boolean(m->dflt != NULL));
    /* the connection asking is not counted */
    json_object_set_new(o, "tcp_open", json_integer((json_int_t)m->st.tcp_open - 1));
    json_object_set_new(o, "tcp_accepted", json_integer((json_int_t)m->st.tcp_accepted));
    json_object_set_new(o, "control_requests", json_integer((json_int_t)m->st.control_requests));
    reply_json(c, 200, o);
}

static int validate_list(json_t *list, const char *what, char *err, size_t errlen)
{
    size_t i;
    json_t *v;
    struct behave tmp;
    if (!json_is_array(list)) {
        snprintf(err, errlen, "%s must be an array of behaviour objects", what);
        return -1;
    }
    json_array_foreach(list, i, v)
    {
        char why[200];
        if (behave_parse(&tmp, v, why, sizeof why) != 0) {
            snprintf(err, errlen, "%s[%zu]: %s", what, i, why);
            return -1;
        }
    }
    return 0;
}

int control_auth_check(json_t *auth, char *err, size_t errlen)
{
    static const char *const dialects[] = { "openai", "azure", "anthropic", "gemini", "query" };
    const char *k;
    json_t *v;
    bool known = false;

    if (!json_is_object(auth)) {
        snprintf(err, errlen, "must be an object {dialect, key, name?} or null");
        return -1;
    }
    json_object_foreach(auth, k, v)
    {
        if (strcmp(k, "dialect") && strcmp(k, "key") && strcmp(k, "name")) {
            snprintf(err, errlen, "unknown key \"%s\" (dialect, key, name)", k);
            return -1;
        }
        if (!json_is_string(v)) {
            snprintf(err, errlen, "%s must be a string", k);
            return -1;
        }
    }
    const char *d = json_string_value(json_object_get(auth, "dialect"));
    for (size_t i = 0; d && i < sizeof(dialects) / sizeof(dialects[0]); i++)
        known = known || !strcmp(d, dialects[i]);
    if (!known || !json_object_get(auth, "key")) {
        snprintf(err, errlen, "needs dialect (openai, azure, anthropic, gemini, query) and key");
        return -1;
    }
    return 0;
}

static void control_script(struct conn *c, const char *body, size_t blen)
{
    struct mock *m = c->m;
    json_error_t jerr;
    char err[300];
    json_t *doc = json_loadb(body, blen, 0, &jerr);
    json_t *queue = NULL, *append = NULL, *dflt = NULL, *auth = NULL;
    bool set_dflt = false, set_auth = false;
    if (!doc) {
        snprintf(err, sizeof err, "invalid JSON: %s", jerr.text);
        control_error(c, 400, err);
        return;
    }
    if (json_is_array(doc)) {
        queue = doc;
    } else if (json_is_object(doc)) {
        const char *k;
        json_t *v;
        json_object_foreach(doc, k, v)
        {
            if (!strcmp(k, "queue")) {
                queue = v;
            } else if (!strcmp(k, "append")) {
                append = v;
            } else if (!strcmp(k, "default")) {
                set_dflt = true;
                dflt = json_is_null(v) ? NULL : v;
                if (!dflt)
                    continue;
                char why[200];
                struct behave tmp;
                if (behave_parse(&tmp, v, why, sizeof why) != 0) {
                    snprintf(err, sizeof err, "default: %s", why);
                    goto bad;
                }
            } else if (!strcmp(k, "auth")) {
                set_auth = true;
                auth = json_is_null(v) ? NULL : v;
                char why[200];
                if (auth && control_auth_check(auth, why, sizeof why) != 0) {
                    snprintf(err, sizeof err, "auth: %s", why);
                    goto bad;
                }
            } else {
                snprintf(err, sizeof err, "unknown key \"%s\" (queue, append, default, auth)", k);
                goto bad;
            }
        }
    } else {
        snprintf(err, sizeof err, "expected an array or an object");
        goto bad;
    }
    if ((queue && validate_list(queue, "queue", err, sizeof err)) ||
        (append && validate_list(append, "append", err, sizeof err)))
        goto bad;
    if (queue) {
        json_array_clear(m->queue);
        json_array_extend(m->queue, queue);
    }
    if (append)
        json_array_extend(m->queue, append);
    if (set_dflt) {
        json_decref(m->dflt);
        m->dflt = dflt ? json_incref(dflt) : NULL;
    }
    if (set_auth) {
        json_decref(m->auth);
        m->auth = auth ? json_incref(auth) : NULL;
    }
    json_decref(doc);
    reply_json(c, 200,
               json_pack("{s:b,s:I,s:b}", "ok", 1, "queue_len",
                         (json_int_t)json_array_size(m->queue), "has_default", m->dflt != NULL));
    return;
bad:
    json_decref(doc);
    control_error(c, 400, err);
}

static void control_reset(struct conn *c, const char *body, size_t blen)
{
    struct mock *m = c->m;
    json_t *doc = blen ? json_loadb(body, blen, 0, NULL) : NULL;
    if (blen && !json_is_object(doc)) {
        json_decref(doc);
        control_error(c, 400, "expected {} or {\"drop_connections\": true}");
        return;
    }
    if (json_is_true(json_object_get(doc, "drop_connections"))) {
        for (struct conn *o = m->conns, *next; o; o = next) {
            next = o->next;
            if (o != c)
                conn_close(o, false);
        }
    }
    json_decref(doc);
    json_array_clear(m->queue);
    json_decref(m->dflt);
    m->dflt = NULL;
    json_decref(m->auth);
    m->auth = NULL;
    m->st.requests = m->st.accepted = m->st.closed = 0;
    m->st.closed_by_peer = m->st.aborted_by_peer = 0;
    m->st.last_abort_s = 0;
    m->st.tcp_accepted = m->st.control_requests = 0;
    memset(m->by_status, 0, sizeof m->by_status);
    paths_clear(m);
    history_clear(m);
    reply_json(c, 200, json_pack("{s:b}", "ok", 1));
}

static bool is(const char *s, size_t n, const char *lit)
{
    return strlen(lit) == n && !memcmp(s, lit, n);
}

void control_handle(struct conn *c, const char *method, size_t mlen, const char *path, size_t plen,
                    const char *body, size_t blen)
{
    struct mock *m = c->m;
    bool get = is(method, mlen, "GET"), post = is(method, mlen, "POST");
    if (get && is(path, plen, "/_mock/stats")) {
        control_stats(c);
    } else if (get && is(path, plen, "/_mock/last")) {
        if (!m->hist_count) {
            reply_json(c, 200, json_null());
            return;
        }
        size_t newest = (m->hist_next + MOCK_HISTORY - 1) % MOCK_HISTORY;
        reply_json(c, 200, record_json(&m->hist[newest]));
    } else if (get && is(path, plen, "/_mock/requests")) {
        json_t *a = json_array();
        size_t first = (m->hist_next + MOCK_HISTORY - m->hist_count) % MOCK_HISTORY;
        for (size_t i = 0; i < m->hist_count; i++)
            json_array_append_new(a, record_json(&m->hist[(first + i) % MOCK_HISTORY]));
        reply_json(c, 200, a);
    } else if (post && is(path, plen, "/_mock/script")) {
        control_script(c, body, blen);
    } else if (post && is(path, plen, "/_mock/reset")) {
        control_reset(c, body, blen);
    } else {
        control_error(c, 404,
                      "unknown control endpoint (GET stats|last|requests, POST script|reset)");
    }
}
