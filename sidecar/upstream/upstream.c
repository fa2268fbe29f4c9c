/*
 * upstream.c — libcurl multi on libev, and attempts with hard deadlines.
 * See upstream.h for the phases, the deadlines and the DNS rules.
 *
 * Glue: one ev_timer for CURLMOPT_TIMERFUNCTION (0 ms means
 * "soon": the timer fires on the next loop iteration, we never call back
 * into curl from its own callback), one ev_io per socket attached with
 * curl_multi_assign, and curl_multi_info_read drained after every
 * curl_multi_socket_action.
 *
 * Re-entrancy: curl forbids removing a handle from inside its callbacks.
 * `in_curl` counts how deep we are inside curl; attempt_cancel() there only
 * marks the attempt (its next write callback fails the transfer) and the
 * engine's ev_prepare pass removes and frees it before the loop sleeps.
 * A pause takes effect in the write callback itself (it refuses the next
 * buffer with CURL_WRITEFUNC_PAUSE: no byte reaches us without one);
 * resume is applied in the prepare pass, since unpausing can run the write
 * callback synchronously.
 *
 * Budgets (upstream.h). An attempt charged to a budget accounts the
 * response bytes it holds (`charged`: a plain body so far, or a stream's
 * partial event) and asks before taking each buffer. A budget full of
 * partial bodies, none of which may grow, would wait for ever even once its
 * client has read everything; so one member, the `front` (the one holding
 * the most), keeps room to finish a maximal reply:
 *
 *   front:   held + received + n <= limit, or held == 0 (the client has
 *            read everything: it may always finish)
 *   others:  held + received + n + (max_resp - front.charged) <= limit
 *
 * With limit >= max_resp (the configuration guarantees it) the front of
 * plain bodies therefore always fits once `held` drains, the limit is never
 * exceeded for them, and when the front ends the next largest member
 * inherits the room. A stream's event may outgrow that room; the held == 0
 * rule keeps it moving, at the cost of at most one event over the limit.
 * A paused member resumes when a budget change lets the buffer it was
 * refused fit; the write callback decides again (and may pause again).
 */
#include "upstream.h"
#include "dlist.h"
#include "iplit.h"
#include "strbuf.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "codec/dialect.h"
#include "h1.h"
#include "core/tls.h"
#include "evstream.h"
#include "codec/jscan.h"
#include "codec/converse.h"
#include "codec/transcode.h"
#include "rpc.h"
#include "sse.h"

#define UPSTREAM_ORPHAN_TTL_S 30.0
#define UPSTREAM_BACKSTOP_MS  2000
#define UPSTREAM_EPS          1e-4

/* Easy handles kept for reuse: creating one costs several allocations and
 * the protocol handler set-up on every attempt. */
#define UPSTREAM_POOL_MAX             256
/* Idle connections the multi handle may keep. libcurl's default (4 x the
 * handles currently added) shrinks as attempts end, closing warm keep-alive
 * connections to sources under load; we add and remove a handle per attempt. */
#define UPSTREAM_MAX_IDLE_CONNECTIONS 4096L
/* How long libcurl may hand out its parsed copy of a CA bundle before
 * reading the file again: a replaced bundle is trusted by new connections
 * within this time (a reload does not flush it). */
#define UPSTREAM_CA_CACHE_S           600L
/* How long the own client trusts the address libcurl last reached for a
 * host name (libcurl's own DNS cache keeps answers as long). */
#define UPSTREAM_NAME_TTL_S           60
/* Each transfer's receive buffer (libcurl's default: 16 KiB). It is held
 * for as long as the call is in flight and mostly unwritten while the
 * upstream thinks, so the cost that matters is its resident part: about
 * min(size, 4 KiB) per call. 2 KiB holds a typical reply's head and a
 * stream's events; a larger reply takes one read per 2 KiB. */
#define UPSTREAM_RECV_BUFFER_BYTES    2048L
/* Entries of each per-engine cache below. URLs and keys come from the
 * configuration, so a handful is the norm; the bound only keeps reloads
 * that keep changing them from growing the caches: past it, attempts build
 * their own (the slower path, same result). */
#define UPSTREAM_CACHE_MAX            64

struct dns_host {
    struct dns_host *next;
    uint32_t lookups; /* lookups started for our attempts, still running */
    uint32_t orphans; /* lookups abandoned within the orphan TTL */
    double orphans_until;
    struct attempt *waiters; /* attempts waiting for a lookup slot, FIFO */
    struct attempt **waiters_tail;
    char name[];
};

/* One URL parsed once with curl's URL API, and the host whose lookups the
 * cap counts. Its transfers get the parsed handle (CURLOPT_CURLU): curl then
 * copies it instead of parsing the URL and printing it back normalised on
 * every transfer, a dozen allocations and a tenth of a request's
 * instructions. Neither answer ever changes for a URL. */
struct url_host {
    struct url_host *next;
    struct dns_host *dns; /* NULL: an IP literal */
    CURLU *uh;            /* owned; borrowed by pooled handles until the engine goes */
    /* Own client (h1.c): the origin, and the request line with its Host
     * header (owned); NULL when libcurl carries this URL's attempts. */
    struct h1_origin *origin;
    char *h1_head;
    size_t h1_head_len;
    /* A host name (dns set) that the own client may carry: `origin` is the
     * address libcurl last connected to for it, trusted until name_until
     * (see upstream_learn_address). */
    bool by_name;
    double name_until;
    /* The route (upstream_route.id) its attempts take: entries are per URL
     * and route. For https, the route's TLS context (borrowed from
     * up->tls_routes) and the name SNI carries and the certificate must
     * hold (owned); NULL for plain http. */
    uint64_t route_id;
    struct ssl_ctx_st *tls;
    struct tls_route *tls_route;
    char *tls_name;
    char url[];
};

/* One TLS context per route the own client carries (a CA store parsed
 * once, the client certificate); ctx NULL when it could not be made: that
 * route's URLs stay with libcurl, which reports why. The store is read
 * again from ca_file (NULL: OpenSSL's default paths) after
 * UPSTREAM_CA_CACHE_S, as libcurl does with its cached one. */
struct tls_route {
    struct tls_route *next;
    uint64_t id;
    SSL_CTX *ctx;
    char *ca_file;
    double loaded_at;
};

/* Request headers for one (stream, source headers) pair, shared by every
 * attempt that sends them: building the list costs 4-5 allocations per
 * attempt and curl only reads it. Found by comparing the lines. */
struct header_set {
    struct header_set *next;
    bool stream;
    struct curl_slist *headers;
    char *h1_block; /* the same lines as the own client writes them (owned) */
    size_t h1_len;
};

struct usock {
    ev_io w;
    struct upstream *up;
};

struct upstream {
    struct ev_loop *loop;
    CURLM *multi;
    ev_timer timer_w;
    ev_prepare prepare_w;
    int in_curl;
    bool admit_pending; /* a lookup slot freed while attempts wait for one */
    uint32_t max_lookups_per_host;
    struct attempt *active;   /* doubly linked */
    struct attempt *deferred; /* attempts with pending operations (singly linked) */
    struct dns_host *hosts;
    struct url_host *urls;
    size_t n_urls;
    struct header_set *header_sets;
    size_t n_header_sets;
    struct upstream_stats stats;
    bool no_proxy_env;                      /* no proxy variable is set: handles say "no proxy" */
    struct h1_pool *h1;                     /* the own client; NULL: libcurl for every URL */
    bool own_tls;                           /* it carries https too (no https proxy variable) */
    struct tls_route *tls_routes;           /* its TLS contexts, one per route */
    size_t n_tls_routes;                    /* (bounded by UPSTREAM_CACHE_MAX) */
    CURL *pool[UPSTREAM_POOL_MAX];          /* easy handles of completed transfers, not reset */
    uint64_t pool_route[UPSTREAM_POOL_MAX]; /* the route id each was last set for */
    size_t n_pool;
    char *default_cainfo; /* libcurl's built-in CA bundle, or NULL (see upstream_new) */
    uint32_t name_ttl_s;  /* upstream_set_dns_ttl */
};

struct attempt {
    struct upstream *up;
    struct attempt *prev, *next;
    struct attempt *next_deferred;
    bool on_deferred;
    CURL *easy;
    struct url_host *url;          /* the engine's entry for its URL, or NULL */
    uint64_t route_id;             /* the route its handle is set for (upstream_route.id) */
    struct curl_slist *connect_to; /* owned: the route's server_name redirect, or NULL */
    bool recycle;                  /* the transfer completed: the handle may be reused */
    struct curl_slist *headers;    /* a cached header_set's, or owned_headers */
    struct curl_slist *owned_headers;
    char *req_body;
    struct attempt_hooks hooks;
    void *ud;
    bool stream;
    enum attempt_phase phase;
    double started, sent_at, last_activity;
    double first_at; /* first byte (plain) / event (stream); 0 = none yet */
    double connect_s, ttft_s, idle_s, total_s, deadline_at;
    ev_timer deadline_w;
    double armed_for;     /* the deadline deadline_w was armed for, while active */
    struct dns_host *dns; /* NULL for IP literals */
    bool in_lookup;       /* a lookup of ours runs for it (counted in dns->lookups) */
    bool lookup_wait;     /* the cap refused its lookup: wait for a slot */
    bool lookup_refused;  /* the cap refused its lookup: fail (resolver hangs) */
    bool dns_waiting;     /* parked on dns->waiters, out of the multi */
    struct attempt *next_waiter;

    int status;
    char retry_after[96];
    char retry_after_ms[24], should_retry[8], reset_requests[24], reset_tokens[24];
    bool is_sse;
    char content_type[128]; /* the answer's, cut to the field */
    char cache_control[64]; /* the answer's Cache-Control, cut to the field */
    struct strbuf resp;     /* the body so far, NUL-terminated */
    size_t max_resp;
    bool resp_too_large;
    struct sse_parser sse;
    bool sse_ready;
    bool aws_es;        /* attempt_spec.aws_eventstream */
    struct evstream es; /* its decoder, when es_ready */
    bool es_ready;
    struct strbuf es_data; /* the current event's decoded JSON */
    const char *es_name;   /* its "type", for attempt_event_name (borrowed) */
    size_t es_name_len;
    bool converse;             /* attempt_spec.bedrock_converse */
    struct converse_stream cv; /* its stream's state */
    char es_type[32];          /* the current translated event's "type" */
    char *attempt_hdrs;        /* attempt_spec.attempt_headers, copied (a secret) */
    char *refused;             /* attempt_spec.refuse, copied: end unsent */
    size_t attempt_hdrs_len;
    uint32_t events;
    bool terminal_seen;
    bool done_seen;                     /* the stream's `data: [DONE]` came */
    const char *stream_end;             /* attempt_spec.stream_end */
    const struct sse_event *cur_ev;     /* the event on_event is handed, else NULL */
    bool stream_failed, fail_transient; /* attempt_fail_stream() from on_event */
    enum outcome_reason fail_reason;
    char fail_detail[160];

    bool cancelled;    /* owner cancelled: no hooks, free at next safe point */
    bool owner_paused; /* attempt_pause() in effect */
    bool want_resume, curl_paused;
    double paused_at; /* when curl_paused was set */

    struct upstream_budget *budget; /* NULL: none, or left (ended, cancelled) */
    struct attempt *bprev, *bnext;  /* budget->members */
    size_t charged;                 /* bytes counted in budget->received */
    bool budget_blocked;            /* paused by the budget (counted in blocked) */
    size_t blocked_n;               /* the buffer size it was refused */
    char errbuf[CURL_ERROR_SIZE];

    bool native;                                /* carried by the own client (h1), not libcurl */
    char h1_cl[UPSTREAM_EXTRA_HEADER_MAX + 40]; /* the extra header lines,
                                                 * "Content-Length: N" and the head's end */
    struct h1_req h1; /* last: large, and only the own client's attempts use it */
};

const char *attempt_phase_name(enum attempt_phase p)
{
    static const char *const names[] = { "resolving", "connecting", "sent",
                                         "receiving", "streaming",  "done" };
    return (unsigned)p < sizeof(names) / sizeof(names[0]) ? names[p] : "unknown";
}

void upstream_set_dns_ttl(struct upstream *up, uint32_t ttl_s)
{
    up->name_ttl_s = ttl_s;
    /* An address learnt under a longer TTL is trusted no longer than this
     * one from now on. */
    double until = ev_now(up->loop) + ttl_s;
    for (struct url_host *u = up->urls; u; u = u->next)
        if (u->name_until > until)
            u->name_until = until;
}

const struct upstream_stats *upstream_get_stats(struct upstream *up)
{
    if (up->h1) {
        const struct h1_stats *hs = h1_pool_stats(up->h1);
        up->stats.conns_opened = hs->connections_opened;
        up->stats.conns_reused = hs->connections_reused;
        up->stats.stale_retries = hs->stale_retries;
        up->stats.tls_done = hs->tls_handshakes;
        up->stats.tls_resumed = hs->tls_resumed;
    }
    return &up->stats;
}

static void upstream_defer(struct attempt *a)
{
    if (!a->on_deferred) {
        a->on_deferred = true;
        a->next_deferred = a->up->deferred;
        a->up->deferred = a;
    }
    ev_prepare_start(a->up->loop, &a->up->prepare_w);
}

/* --- budgets (see the top of the file) ------------------------------ */

void upstream_budget_init(struct upstream_budget *b, size_t limit)
{
    memset(b, 0, sizeof(*b));
    b->limit = limit;
}

/* The member holding the most, or NULL when none holds anything (the next
 * one to take bytes becomes the front). */
static void budget_pick_front(struct upstream_budget *b)
{
    b->front = NULL;
    b->front_stale = false;
    for (struct attempt *m = b->members; m; m = m->bnext) {
        if (m->charged > 0 && (!b->front || m->charged > b->front->charged))
            b->front = m;
    }
}

/* Whether `n` more bytes for `a` keep the budget's rule. With `claim`, an
 * `a` that finds no front becomes it (a probe only pretends). */
static bool budget_fits(struct attempt *a, size_t n, bool claim)
{
    struct upstream_budget *b = a->budget;
    size_t used = b->held + b->received;

    /* Room for any member to finish a maximal reply besides: the common
     * case needs no front at all. */
    if (used + n + a->max_resp <= b->limit)
        return true;
    if (b->front_stale)
        budget_pick_front(b);
    if (!b->front && claim)
        b->front = a;
    const struct attempt *f = b->front;
    if (!f || f == a)
        return used + n <= b->limit || b->held == 0;
    size_t room = f->charged < f->max_resp ? f->max_resp - f->charged : 0;
    return used + n + room <= b->limit;
}

/* Resumes the members paused by the budget that now fit. */
static void budget_kick(struct upstream_budget *b)
{
    if (!b->blocked)
        return;
    for (struct attempt *m = b->members; m; m = m->bnext) {
        if (!m->budget_blocked || !budget_fits(m, m->blocked_n, false))
            continue;
        m->budget_blocked = false;
        b->blocked--;
        if (!m->owner_paused && m->curl_paused) {
            m->want_resume = true;
            upstream_defer(m);
        }
    }
}

void upstream_budget_on_drained(struct upstream_budget *b)
{
    budget_kick(b);
}

static void budget_join(struct attempt *a, struct upstream_budget *b)
{
    a->budget = b;
    DLIST_PUSH(b->members, a, bprev, bnext);
}

/* Uncharges and unlinks `a` (ended or cancelled). Idempotent. */
static void budget_leave(struct attempt *a)
{
    struct upstream_budget *b = a->budget;

    if (!b)
        return;
    b->received -= a->charged;
    a->charged = 0;
    DLIST_UNLINK(b->members, a, bprev, bnext);
    if (a->budget_blocked) {
        a->budget_blocked = false;
        b->blocked--;
    }
    a->budget = NULL;
    if (b->front == a) {
        b->front = NULL;
        b->front_stale = true;
    }
    budget_kick(b);
}

/* `a` now holds `charged` bytes. A front that shrinks (a stream's event
 * went out) is only marked stale: finding the new one is a scan, done when
 * a tight budget needs it. */
static void budget_charge(struct attempt *a, size_t charged)
{
    struct upstream_budget *b = a->budget;
    size_t old = a->charged;

    if (!b)
        return;
    b->received = b->received - old + charged;
    a->charged = charged;
    if (charged >= old) {
        if (!b->front_stale && charged > 0 && (!b->front || charged > b->front->charged))
            b->front = a;
        return;
    }
    if (b->front == a)
        b->front_stale = true;
    budget_kick(b);
}

/* --- DNS bookkeeping ------------------------------------------------- */

static struct dns_host *dns_host_get(struct upstream *up, const char *name)
{
    for (struct dns_host *h = up->hosts; h; h = h->next) {
        if (strcmp(h->name, name) == 0)
            return h;
    }
    size_t n = strlen(name);
    struct dns_host *h = calloc(1, sizeof(*h) + n + 1);
    if (!h)
        return NULL;
    memcpy(h->name, name, n + 1);
    h->waiters_tail = &h->waiters;
    h->next = up->hosts;
    up->hosts = h;
    return h;
}

union ip_addr {
    struct sockaddr sa;
    struct sockaddr_in in4;
    struct sockaddr_in6 in6;
    struct sockaddr_storage ss;
};

/* Whether `host`, as curl's URL API gives it ("10.0.0.1", "[::1]"), is an
 * IP literal; if so its socket address with `port` in *out, *len. A name,
 * or an IPv6 address with a zone id, is not. */
static bool host_literal(const char *host, uint16_t port, union ip_addr *out, socklen_t *len)
{
    return iplit_sockaddr(host, strlen(host), IPLIT_ANY | IPLIT_BRACKETS, port, &out->ss, len) == 0;
}

/* `url` parsed the way curl parses CURLOPT_URL, and in *dns the host
 * part when it is a name (NULL for an IP literal). NULL when the URL does
 * not parse (curl then reports it on the transfer) or memory ran out. */
static CURLU *url_parse(struct upstream *up, const char *url, struct dns_host **dns)
{
    char *host = NULL;
    CURLU *u = curl_url();
    union ip_addr addr;
    socklen_t alen;
    bool ok = false;

    *dns = NULL;
    if (!u)
        return NULL;
    if (curl_url_set(u, CURLUPART_URL, url, CURLU_GUESS_SCHEME | CURLU_NON_SUPPORT_SCHEME) ==
            CURLUE_OK &&
        curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK && host) {
        bool literal = host_literal(host, 0, &addr, &alen);
        if (!literal)
            *dns = dns_host_get(up, host);
        ok = literal || *dns;
    }
    curl_free(host);
    if (!ok) {
        curl_url_cleanup(u);
        return NULL;
    }
    return u;
}

/* The own client's TLS context for route `r` (NULL: the defaults), made
 * on first use with the CA set libcurl uses (the route's ca_file, else
 * libcurl's bundle); NULL when it cannot be made. */
static struct tls_route *upstream_tls_route(struct upstream *up, const struct upstream_route *r)
{
    uint64_t id = r ? r->id : 0;
    struct tls_route *t;
    char why[256];

    for (t = up->tls_routes; t; t = t->next) {
        if (t->id == id)
            return t->ctx ? t : NULL;
    }
    if (up->n_tls_routes >= UPSTREAM_CACHE_MAX || !(t = calloc(1, sizeof(*t))))
        return NULL;
    struct tls_files o = {
        .ca_file = r && r->ca_file ? r->ca_file : up->default_cainfo,
        .cert_file = r ? r->cert_file : NULL,
        .key_file = r ? r->key_file : NULL,
    };
    t->id = id;
    t->loaded_at = ev_now(up->loop);
    t->ctx = tls_ctx_new(&o, why, sizeof(why));
    if (t->ctx &&
        (h1_tls_ctx_setup(t->ctx) < 0 || (o.ca_file && !(t->ca_file = strdup(o.ca_file))))) {
        SSL_CTX_free(t->ctx);
        t->ctx = NULL;
    }
    t->next = up->tls_routes;
    up->tls_routes = t;
    up->n_tls_routes++;
    return t->ctx ? t : NULL;
}

/* Reads the route's CA store again once it is UPSTREAM_CA_CACHE_S old: a
 * replaced bundle is trusted by new connections within that time. Should
 * the file not load now, the old store stays for another period. */
static void tls_route_refresh(struct tls_route *t, double now)
{
    if (now - t->loaded_at < (double)UPSTREAM_CA_CACHE_S)
        return;
    t->loaded_at = now;
    X509_STORE *st = X509_STORE_new();
    if (st &&
        (t->ca_file ? X509_STORE_load_file(st, t->ca_file) : X509_STORE_set_default_paths(st)) == 1)
        SSL_CTX_set_cert_store(t->ctx, st); /* frees the old one */
    else
        X509_STORE_free(st);
    ERR_clear_error();
}

/* Whether the own client carries `u`'s attempts on route `r`: http, or
 * https while no https proxy variable is set; no proxy of the route's own;
 * no user name or password in the URL (libcurl would send them as Basic
 * authentication). If so, its origin (an IP literal) or by_name (a name
 * whose address libcurl is to find), the TLS context and name, and the
 * request line with the Host header, as libcurl writes them: the path and
 * query as parsed, the route's server_name in place of the host, the port
 * only when it is not the scheme's. Else the entry stays as it was, for
 * libcurl. */
static void url_own_client(struct upstream *up, struct url_host *u, const struct upstream_route *r)
{
    char *scheme = NULL, *host = NULL, *port = NULL, *path = NULL, *query = NULL, *user = NULL,
         *pw = NULL;
    union ip_addr addr;
    socklen_t alen;
    char label[64];

    if ((r && r->proxy) || curl_url_get(u->uh, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        (strcmp(scheme, "http") != 0 && (strcmp(scheme, "https") != 0 || !up->own_tls)) ||
        curl_url_get(u->uh, CURLUPART_USER, &user, 0) != CURLUE_NO_USER ||
        curl_url_get(u->uh, CURLUPART_PASSWORD, &pw, 0) != CURLUE_NO_PASSWORD ||
        curl_url_get(u->uh, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
        curl_url_get(u->uh, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) != CURLUE_OK ||
        curl_url_get(u->uh, CURLUPART_PATH, &path, 0) != CURLUE_OK)
        goto out;
    if (curl_url_get(u->uh, CURLUPART_QUERY, &query, 0) != CURLUE_OK)
        query = NULL;
    char *end;
    unsigned long pn = strtoul(port, &end, 10);
    if (*end || pn == 0 || pn > 65535)
        goto out;
    bool tls = strcmp(scheme, "https") == 0;
    const char *name = r && r->server_name ? r->server_name : host;
    size_t hn = strlen(name);
    struct h1_origin *o = NULL;
    if (strchr(host, '%'))
        goto out;
    if (tls) {
        /* The name verified: an IPv6 literal without its brackets. */
        size_t k = strlen(name);
        bool v6 = k > 2 && name[0] == '[' && name[k - 1] == ']';
        if (!(u->tls_route = upstream_tls_route(up, r)) || !(u->tls = u->tls_route->ctx) ||
            !(u->tls_name = v6 ? strndup(name + 1, k - 2) : strdup(name)))
            goto out;
    }
    if (host_literal(host, (uint16_t)pn, &addr, &alen)) {
        snprintf(label, sizeof(label), "%s port %lu", host, pn);
        if (!(o = h1_origin_get_tls(up->h1, &addr.sa, alen, label, u->tls, u->tls_name)))
            goto out;
    } else if (!u->dns) {
        goto out;
    }
    struct strbuf head = { 0 };
    if (strbuf_puts(&head, "POST ") < 0 || strbuf_put(&head, path, strlen(path)) < 0 ||
        (query && (strbuf_putc(&head, '?') < 0 || strbuf_put(&head, query, strlen(query)) < 0)) ||
        strbuf_puts(&head, " HTTP/1.1\r\nHost: ") < 0 || strbuf_put(&head, name, hn) < 0 ||
        (pn != (tls ? 443 : 80) &&
         (strbuf_putc(&head, ':') < 0 || strbuf_put(&head, port, strlen(port)) < 0)) ||
        strbuf_puts(&head, "\r\n") < 0) {
        strbuf_fini(&head);
        goto out;
    }
    u->origin = o;
    u->by_name = !o;
    u->h1_head = head.data;
    u->h1_head_len = head.len;
out:
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_free(path);
    curl_free(query);
    curl_free(user);
    curl_free(pw);
}

/* The engine's entry for `url` on route `r`, made on first use; NULL past
 * the cache bound or when it does not parse (the caller then goes without). */
static struct url_host *upstream_url(struct upstream *up, const char *url,
                                     const struct upstream_route *r)
{
    uint64_t route_id = r ? r->id : 0;

    for (struct url_host *u = up->urls; u; u = u->next) {
        if (u->route_id == route_id && strcmp(u->url, url) == 0)
            return u;
    }
    if (up->n_urls >= UPSTREAM_CACHE_MAX)
        return NULL;
    struct dns_host *h;
    CURLU *uh = url_parse(up, url, &h);
    size_t n = strlen(url);
    struct url_host *u = uh ? malloc(sizeof(*u) + n + 1) : NULL;
    if (!u) {
        curl_url_cleanup(uh);
        return NULL;
    }
    u->dns = h;
    u->uh = uh;
    u->origin = NULL;
    u->h1_head = NULL;
    u->h1_head_len = 0;
    u->by_name = false;
    u->name_until = 0;
    u->route_id = route_id;
    u->tls = NULL;
    u->tls_route = NULL;
    u->tls_name = NULL;
    if (up->h1)
        url_own_client(up, u, r);
    memcpy(u->url, url, n + 1);
    u->next = up->urls;
    up->urls = u;
    up->n_urls++;
    return u;
}

/* Lookups of `h` abandoned within the last UPSTREAM_ORPHAN_TTL_S. */
static uint32_t dns_host_orphans(struct dns_host *h, double now)
{
    if (h->orphans && now >= h->orphans_until)
        h->orphans = 0;
    return h->orphans;
}

/* The attempt's lookup ended: answered (the resolver thread is done), or
 * abandoned (torn down mid-lookup: the detached thread lingers, so it keeps
 * counting against the cap for the orphan TTL). Either way its slot is free
 * for the attempts waiting on this host; they are re-added from the prepare
 * pass, since this may run inside a curl callback. */
static void dns_lookup_end(struct attempt *a, bool abandoned)
{
    struct upstream *up = a->up;
    struct dns_host *h = a->dns;

    if (!a->in_lookup)
        return;
    a->in_lookup = false;
    h->lookups--;
    if (abandoned) {
        up->stats.dns_abandoned++;
        h->orphans = dns_host_orphans(h, ev_now(up->loop)) + 1;
        h->orphans_until = ev_now(up->loop) + UPSTREAM_ORPHAN_TTL_S;
    }
    if (h->waiters) {
        up->admit_pending = true;
        ev_prepare_start(up->loop, &up->prepare_w);
    }
}

/* Parks an attempt whose lookup the cap refused while live lookups of its
 * host run: out of the multi, deadline timer still armed. */
static void dns_wait(struct attempt *a)
{
    struct upstream *up = a->up;
    struct dns_host *h = a->dns;

    curl_multi_remove_handle(up->multi, a->easy);
    a->errbuf[0] = '\0';
    a->dns_waiting = true;
    a->next_waiter = NULL;
    *h->waiters_tail = a;
    h->waiters_tail = &a->next_waiter;
    up->stats.dns_waits++;
    /* The slot may have freed before we got here. */
    up->admit_pending = true;
    ev_prepare_start(up->loop, &up->prepare_w);
}

static void dns_unwait(struct attempt *a)
{
    struct dns_host *h = a->dns;

    if (!a->dns_waiting)
        return;
    for (struct attempt **pp = &h->waiters; *pp; pp = &(*pp)->next_waiter) {
        if (*pp == a) {
            *pp = a->next_waiter;
            if (h->waiters_tail == &a->next_waiter)
                h->waiters_tail = pp;
            break;
        }
    }
    a->next_waiter = NULL;
    a->dns_waiting = false;
}

/* --- deadlines ------------------------------------------------------- */

static double attempt_next_deadline(const struct attempt *a)
{
    double d = a->started + a->total_s;

    if (a->deadline_at > 0 && a->deadline_at < d)
        d = a->deadline_at;
    switch (a->phase) {
    case ATTEMPT_RESOLVING:
    case ATTEMPT_CONNECTING:
        if (a->started + a->connect_s < d)
            d = a->started + a->connect_s;
        break;
    case ATTEMPT_SENT:
        if (a->sent_at + a->ttft_s < d)
            d = a->sent_at + a->ttft_s;
        break;
    case ATTEMPT_RECEIVING:
        if (a->stream) {
            if (!a->curl_paused && a->sent_at + a->ttft_s < d)
                d = a->sent_at + a->ttft_s;
        } else if (!a->curl_paused && a->last_activity + a->idle_s < d) {
            d = a->last_activity + a->idle_s;
        }
        break;
    case ATTEMPT_STREAMING:
        if (!a->curl_paused && a->last_activity + a->idle_s < d)
            d = a->last_activity + a->idle_s;
        break;
    case ATTEMPT_DONE:
        break;
    }
    return d;
}

/* Arms the deadline timer for the current phase. A timer already armed to
 * fire no later than the new deadline is left alone: it re-checks when it
 * fires and re-arms for what is left (the lazy pattern of libev's
 * documentation), so activity and the phase changes of a quick attempt,
 * which mostly move the deadline later, cost no timer-heap work. A deadline
 * that moved earlier re-arms at once. */
static void attempt_arm(struct attempt *a)
{
    double now = ev_now(a->up->loop);
    double d = attempt_next_deadline(a);

    if (ev_is_active(&a->deadline_w) && a->armed_for <= d)
        return;
    double in = d - now;
    ev_timer_stop(a->up->loop, &a->deadline_w);
    ev_timer_set(&a->deadline_w, in > 0 ? in : 0., 0.);
    ev_timer_start(a->up->loop, &a->deadline_w);
    a->armed_for = d;
}

static void attempt_set_phase(struct attempt *a, enum attempt_phase p)
{
    if (p <= a->phase)
        return;
    if (a->phase == ATTEMPT_RESOLVING)
        dns_lookup_end(a, false); /* the name resolved */
    a->phase = p;
    if (p == (a->stream ? ATTEMPT_STREAMING : ATTEMPT_RECEIVING))
        a->first_at = ev_now(a->up->loop);
    attempt_arm(a);
}

/* --- lifecycle ------------------------------------------------------- */

/* Header lines carry keys: wiped before they are freed. */
static void headers_wipe(struct curl_slist *l)
{
    for (; l; l = l->next)
        explicit_bzero(l->data, strlen(l->data));
}

static void header_set_free(struct header_set *hs)
{
    headers_wipe(hs->headers);
    curl_slist_free_all(hs->headers);
    if (hs->h1_block) {
        explicit_bzero(hs->h1_block, hs->h1_len);
        free(hs->h1_block);
    }
    free(hs);
}

static void attempt_free(struct attempt *a)
{
    struct upstream *up = a->up;

    if (a->on_deferred) {
        for (struct attempt **pp = &up->deferred; *pp; pp = &(*pp)->next_deferred) {
            if (*pp == a) {
                *pp = a->next_deferred;
                break;
            }
        }
    }
    budget_leave(a);
    ev_timer_stop(up->loop, &a->deadline_w);
    if (a->native)
        h1_req_stop(&a->h1);
    if (a->easy) {
        curl_multi_remove_handle(up->multi, a->easy);
        curl_easy_cleanup(a->easy);
    }
    headers_wipe(a->owned_headers);
    curl_slist_free_all(a->owned_headers);
    curl_slist_free_all(a->connect_to);
    free(a->req_body);
    strbuf_fini(&a->resp);
    if (a->sse_ready)
        sse_parser_fini(&a->sse);
    if (a->es_ready)
        evstream_fini(&a->es);
    strbuf_fini(&a->es_data);
    if (a->attempt_hdrs) {
        explicit_bzero(a->attempt_hdrs, a->attempt_hdrs_len);
        free(a->attempt_hdrs);
    }
    free(a->refused);
    DLIST_UNLINK(up->active, a, prev, next); /* on it since attempt_start() */
    up->stats.attempts_active--;
    free(a);
}

/* Detaches the transfer, counting a lookup abandoned mid-resolution. */
static void attempt_detach(struct attempt *a)
{
    struct upstream *up = a->up;

    dns_lookup_end(a, true);
    dns_unwait(a);
    budget_leave(a);
    ev_timer_stop(up->loop, &a->deadline_w);
    if (a->native)
        h1_req_stop(&a->h1); /* closes its connection unless the answer ended */
    if (a->easy) {
        /* CURLOPT_QUICK_EXIT: a resolver thread still in getaddrinfo is
         * detached here instead of joined, so this never blocks. */
        curl_multi_remove_handle(up->multi, a->easy);
        if (a->recycle && up->n_pool < UPSTREAM_POOL_MAX) {
            /* Kept as configured (upstream_easy_new); only the error buffer,
             * which dies with the attempt, must not outlive it. */
            curl_easy_setopt(a->easy, CURLOPT_ERRORBUFFER, NULL);
            curl_easy_setopt(a->easy, CURLOPT_PRIVATE, NULL);
            up->pool_route[up->n_pool] = a->route_id;
            up->pool[up->n_pool++] = a->easy;
        } else {
            curl_easy_cleanup(a->easy);
        }
        a->easy = NULL;
    }
}

static void attempt_finish(struct attempt *a, struct attempt_result *r)
{
    struct upstream *up = a->up;

    r->phase = a->phase;
    r->events = a->events;
    r->elapsed_s = ev_now(up->loop) - a->started;
    r->ttft_s = a->first_at > 0 ? a->first_at - a->sent_at : -1;
    if (!r->body) {
        r->body = a->resp.data;
        r->body_len = a->resp.len;
    }
    r->content_type = a->content_type;
    r->cache_control = a->cache_control;
    attempt_detach(a);
    a->phase = ATTEMPT_DONE;
    up->stats.attempts_done++;
    a->hooks.on_done(a, r, a->ud);
    attempt_free(a);
}

static void result_transient(struct attempt_result *r, enum outcome_reason reason,
                             const char *detail)
{
    memset(r, 0, sizeof(*r));
    r->outcome.kind = OUTCOME_TRANSIENT;
    r->outcome.reason = reason;
    r->outcome.retry_after_s = -1;
    size_t n = strnlen(detail, sizeof(r->detail) - 1);
    memcpy(r->detail, detail, n);
    r->detail[n] = '\0';
}

static void attempt_on_deadline(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct attempt *a = w->data;
    double now = ev_now(loop);
    double d = attempt_next_deadline(a);
    struct attempt_result r;
    enum outcome_reason reason;
    char detail[160];
    (void)revents;

    if (a->cancelled)
        return; /* freed by the prepare pass; its owner is gone */
    if (now + UPSTREAM_EPS < d) {
        attempt_arm(a);
        return;
    }
    if (a->deadline_at > 0 && now + UPSTREAM_EPS >= a->deadline_at && a->deadline_at <= d) {
        reason = REASON_TOTAL_TIMEOUT;
        snprintf(detail, sizeof(detail), "call deadline reached while %s",
                 attempt_phase_name(a->phase));
    } else if (now + UPSTREAM_EPS >= a->started + a->total_s) {
        reason = REASON_TOTAL_TIMEOUT;
        snprintf(detail, sizeof(detail), "timeout_s (%gs) reached while %s", a->total_s,
                 attempt_phase_name(a->phase));
    } else {
        switch (a->phase) {
        case ATTEMPT_RESOLVING:
            reason = REASON_DNS_TIMEOUT;
            if (a->dns_waiting)
                snprintf(detail, sizeof(detail),
                         "name resolution exceeded connect_timeout_s (%gs) waiting for one of "
                         "the %u lookups in progress",
                         a->connect_s, a->up->max_lookups_per_host);
            else
                snprintf(detail, sizeof(detail), "name resolution exceeded connect_timeout_s (%gs)",
                         a->connect_s);
            break;
        case ATTEMPT_CONNECTING:
            reason = REASON_CONNECT_TIMEOUT;
            snprintf(detail, sizeof(detail), "connect exceeded connect_timeout_s (%gs)",
                     a->connect_s);
            break;
        case ATTEMPT_SENT:
            reason = REASON_TTFT_TIMEOUT;
            snprintf(detail, sizeof(detail), "no response byte within ttft_timeout_s (%gs)",
                     a->ttft_s);
            break;
        case ATTEMPT_RECEIVING:
            if (a->stream) {
                reason = REASON_TTFT_TIMEOUT;
                snprintf(detail, sizeof(detail), "no stream event within ttft_timeout_s (%gs)",
                         a->ttft_s);
                break;
            }
            /* fall through */
        default:
            reason = REASON_IDLE_TIMEOUT;
            snprintf(detail, sizeof(detail), "no %s within idle_timeout_s (%gs)",
                     a->stream ? "stream event" : "body byte", a->idle_s);
            break;
        }
    }
    if (a->curl_paused) {
        /* Only timeout_s or the call's deadline run while paused (see
         * attempt_pause): the client, not the source, held it up. */
        char why[sizeof(r.detail)];
        snprintf(why, sizeof(why), "%.80s, paused for %.1fs: the client is not reading its replies",
                 detail, now - a->paused_at);
        result_transient(&r, REASON_CANCELLED, why);
        outcome_from_reason(&r.outcome, REASON_CANCELLED);
    } else {
        a->up->stats.timeouts[a->phase]++;
        result_transient(&r, reason, detail);
    }
    r.deadline_exceeded = a->deadline_at > 0 && now + UPSTREAM_EPS >= a->deadline_at;
    r.http_status = a->status;
    r.outcome.http_status = a->status;
    attempt_finish(a, &r);
}

/* --- curl callbacks -------------------------------------------------- */

/* CURLOPT_RESOLVER_START_FUNCTION: curl is about to start a real lookup —
 * the name is not in its DNS cache — i.e. one more resolver thread. The
 * per-host cap applies here, so cache hits and reused connections are never
 * refused (a burst of calls to a healthy host must not be). Over the cap
 * the resolve is refused (the transfer ends with COULDNT_RESOLVE_HOST and
 * upstream_on_done_msg acts on the flag): the attempt waits for a slot when
 * only live lookups fill the cap — they answer or time out soon, and the
 * answer is then in the cache — and fails at once when lookups of this host
 * were abandoned recently (its resolver is known to hang). Behind a proxy
 * this counts the proxy's lookup against the URL's host: still a bound. */
static int attempt_on_resolver_start(void *resolver_state, void *reserved, void *ud)
{
    struct attempt *a = ud;
    struct dns_host *h = a->dns;
    (void)resolver_state;
    (void)reserved;

    if (a->cancelled)
        return 1;
    if (!h || a->in_lookup)
        return 0;
    uint32_t orphans = dns_host_orphans(h, ev_now(a->up->loop));
    if (h->lookups + orphans >= a->up->max_lookups_per_host) {
        if (orphans > 0)
            a->lookup_refused = true;
        else
            a->lookup_wait = true;
        return 1;
    }
    h->lookups++;
    a->in_lookup = true;
    a->up->stats.dns_lookups++;
    return 0;
}

static int attempt_on_sockopt(void *ud, curl_socket_t fd, curlsocktype purpose)
{
    (void)fd;
    (void)purpose;
    attempt_set_phase(ud, ATTEMPT_CONNECTING);
    return CURL_SOCKOPT_OK;
}

static int attempt_on_prereq(void *ud, char *conn_primary_ip, char *conn_local_ip,
                             int conn_primary_port, int conn_local_port)
{
    struct attempt *a = ud;
    (void)conn_primary_ip;
    (void)conn_local_ip;
    (void)conn_primary_port;
    (void)conn_local_port;
    a->sent_at = ev_now(a->up->loop);
    attempt_set_phase(a, ATTEMPT_SENT);
    return CURL_PREREQFUNC_OK;
}

static void attempt_on_activity(struct attempt *a)
{
    a->last_activity = ev_now(a->up->loop);
    if (a->phase < ATTEMPT_RECEIVING) {
        if (a->phase < ATTEMPT_SENT)
            a->sent_at = a->last_activity;
        attempt_set_phase(a, ATTEMPT_RECEIVING);
    }
}

/* Whether header `line` (n bytes, CRLF included) is `name` (k bytes, lower
 * case); if so, its value without the surrounding blanks. */
static bool header_is(const char *line, size_t n, const char *name, size_t k, const char **value,
                      size_t *vlen)
{
    if (n <= k || line[k] != ':' || strncasecmp(line, name, k) != 0)
        return false;
    const char *v = line + k + 1, *end = line + n;
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' '))
        end--;
    *value = v;
    *vlen = (size_t)(end - v);
    return true;
}

#define HEADER_IS(line, n, name, v, vlen) header_is(line, n, name, sizeof(name) - 1, v, vlen)

/* The headers whose values the outcome may need, kept in the attempt. */
#define KEPT_HEADER(field, name)                                 \
    {                                                            \
        name, sizeof(name) - 1, offsetof(struct attempt, field), \
            sizeof(((struct attempt *)0)->field)                 \
    }
static const struct kept_header {
    const char *name; /* lower case */
    size_t len, off, cap;
} kept_headers[] = {
    KEPT_HEADER(retry_after, "retry-after"),
    KEPT_HEADER(retry_after_ms, "retry-after-ms"),
    KEPT_HEADER(should_retry, "x-should-retry"),
    KEPT_HEADER(reset_requests, "x-ratelimit-reset-requests"),
    KEPT_HEADER(reset_tokens, "x-ratelimit-reset-tokens"),
    KEPT_HEADER(cache_control, "cache-control"),
};

/* Called by curl for each response header line. Most lines are none of
 * the few we read: their first letter rules them out. */
static size_t attempt_on_header(char *line, size_t size, size_t nitems, void *ud)
{
    struct attempt *a = ud;
    size_t n = size * nitems;
    const char *v;
    size_t vlen;

    if (a->cancelled)
        return 0;
    attempt_on_activity(a);
    if (n > 5 && memcmp(line, "HTTP/", 5) == 0) {
        /* A new status line (after 100 Continue, say) resets what we saw. */
        const char *sp = memchr(line, ' ', n);
        a->status = sp ? atoi(sp + 1) : 0;
        a->retry_after[0] = a->retry_after_ms[0] = a->should_retry[0] = '\0';
        a->reset_requests[0] = a->reset_tokens[0] = '\0';
        a->is_sse = false;
        a->content_type[0] = a->cache_control[0] = '\0';
        return n;
    }
    char first = n > 0 ? (char)(line[0] | 0x20) : '\0';
    if (first == 'c' && HEADER_IS(line, n, "content-type", &v, &vlen)) {
        a->is_sse = a->aws_es
            ? vlen >= 34 && strncasecmp(v, "application/vnd.amazon.eventstream", 34) == 0
            : vlen >= 17 && strncasecmp(v, "text/event-stream", 17) == 0;
        if (vlen >= sizeof(a->content_type))
            vlen = sizeof(a->content_type) - 1;
        memcpy(a->content_type, v, vlen);
        a->content_type[vlen] = '\0';
        return n;
    }
    for (size_t i = 0; i < sizeof(kept_headers) / sizeof(kept_headers[0]); i++) {
        const struct kept_header *k = &kept_headers[i];
        if (k->name[0] == first && header_is(line, n, k->name, k->len, &v, &vlen)) {
            /* Truncated to the field, as the values are only ever parsed. */
            if (vlen >= k->cap)
                vlen = k->cap - 1;
            memcpy((char *)a + k->off, v, vlen);
            ((char *)a)[k->off + vlen] = '\0';
            break;
        }
    }
    return n;
}

static int attempt_on_sse_event(const struct sse_event *ev, void *ud)
{
    struct attempt *a = ud;

    if (a->cancelled)
        return -1; /* cancelled by an earlier event's hook: deliver no more */
    if (sse_data_is_done(ev)) {
        a->terminal_seen = a->done_seen = true;
        return 0;
    }
    if (a->events == 0)
        attempt_set_phase(a, ATTEMPT_STREAMING);
    a->last_activity = ev_now(a->up->loop);
    a->cur_ev = ev;
    int rc = a->hooks.on_event(a, ev->data, ev->data_len, a->ud);
    a->cur_ev = NULL;
    if (a->stream_failed)
        return -1; /* an error event: not delivered, not counted */
    a->events++;
    if (rc > 0) {
        a->terminal_seen = true;
        return 0;
    }
    return rc < 0 ? -1 : 0;
}

/* What one event-stream exception means for the attempt. */
static void attempt_on_aws_exception(struct attempt *a, const struct evstream_msg *m)
{
    const struct evstream_str *t = m->exception_type.p ? &m->exception_type : &m->error_code;
    char type[64];
    size_t n = t->p ? (t->len < sizeof(type) - 1 ? t->len : sizeof(type) - 1) : 0;
    for (size_t i = 0; i < n; i++)
        type[i] = t->p[i] >= ' ' && t->p[i] <= '~' ? t->p[i] : '?';
    type[n] = '\0';
    bool throttled = strcmp(type, "throttlingException") == 0;
    bool transient = throttled || strcmp(type, "internalServerException") == 0 ||
        strcmp(type, "serviceUnavailableException") == 0 ||
        strcmp(type, "modelStreamErrorException") == 0 ||
        strcmp(type, "modelTimeoutException") == 0;
    char detail[160];
    snprintf(detail, sizeof(detail), "the upstream's stream reported %s",
             n ? type : "an exception");
    attempt_fail_stream(a,
                        throttled       ? REASON_HTTP_429
                            : transient ? REASON_HTTP_5XX
                                        : REASON_HTTP_4XX,
                        transient, detail);
}

struct aws_chunk {
    struct jscan_value bytes, type;
};

static int aws_chunk_member(void *ud, const char *key, const struct jscan_value *v)
{
    struct aws_chunk *c = ud;
    if (v->type == JSCAN_STRING && strcmp(key, "bytes") == 0)
        c->bytes = *v;
    else if (v->type == JSCAN_STRING && strcmp(key, "type") == 0)
        c->type = *v;
    return 0;
}

/* Hands the event in a->es_data, named `name` (`name_len` bytes, may be
 * NULL), to on_event. Returns as an evstream callback. */
static int attempt_deliver_aws(struct attempt *a, const char *name, size_t name_len)
{
    a->es_name = name;
    a->es_name_len = name ? name_len : 0;
    if (a->events == 0)
        attempt_set_phase(a, ATTEMPT_STREAMING);
    a->last_activity = ev_now(a->up->loop);
    int rc = a->hooks.on_event(a, a->es_data.data, a->es_data.len, a->ud);
    a->es_name = NULL;
    if (a->stream_failed)
        return -1;
    a->events++;
    if (rc > 0) {
        a->terminal_seen = true;
        return 0;
    }
    return rc < 0 || a->cancelled ? -1 : 0;
}

/* One ConverseStream message: its JSON payload, translated into the
 * Messages events it stands for (converse.h), each delivered as an event. */
static int attempt_on_converse_message(struct attempt *a, const struct evstream_msg *m)
{
    msgpack_sbuffer in, out;
    msgpack_packer pk;
    msgpack_unpacked up;
    int n = 0, rc = 0;

    if (!m->event_type.p)
        return 0;
    msgpack_sbuffer_init(&in);
    msgpack_sbuffer_init(&out);
    msgpack_unpacked_init(&up);
    msgpack_packer_init(&pk, &in, msgpack_sbuffer_write);
    if (transcode_json_to_msgpack((const char *)m->payload, m->payload_len, &pk, NULL, NULL, 0) ==
            0 &&
        msgpack_unpack_next(&up, in.data, in.size, NULL) == MSGPACK_UNPACK_SUCCESS) {
        msgpack_packer_init(&pk, &out, msgpack_sbuffer_write);
        n = converse_event(&a->cv, m->event_type.p, m->event_type.len, &up.data, &pk);
    } else {
        n = CONVERT_EREPLY;
    }
    if (n < 0) {
        attempt_fail_stream(a, REASON_BAD_RESPONSE, true,
                            "a ConverseStream event whose payload is not a JSON object");
        rc = -1;
    }
    size_t off = 0;
    for (int i = 0; i < n && rc == 0 && !a->cancelled; i++) {
        msgpack_unpacked ev;
        msgpack_unpacked_init(&ev);
        if (msgpack_unpack_next(&ev, out.data, out.size, &off) != MSGPACK_UNPACK_SUCCESS) {
            msgpack_unpacked_destroy(&ev);
            rc = -1;
            break;
        }
        const msgpack_object *t = rpc_map_get(&ev.data, "type");
        size_t tn = t && t->type == MSGPACK_OBJECT_STR && t->via.str.size < sizeof(a->es_type)
            ? t->via.str.size
            : 0;
        memcpy(a->es_type, tn ? t->via.str.ptr : "", tn);
        a->es_type[tn] = '\0';
        strbuf_reset(&a->es_data);
        if (transcode_msgpack_to_json(&ev.data, &a->es_data, NULL, "event", NULL, 0) < 0) {
            msgpack_unpacked_destroy(&ev);
            rc = -1;
            break;
        }
        strbuf_terminate(&a->es_data);
        msgpack_unpacked_destroy(&ev);
        rc = attempt_deliver_aws(a, tn ? a->es_type : NULL, tn);
    }
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&out);
    msgpack_sbuffer_destroy(&in);
    return a->cancelled ? -1 : rc;
}

/* One event-stream message: a chunk's base64 JSON is delivered as an
 * event, like an SSE event's data. */
static int attempt_on_aws_message(const struct evstream_msg *m, void *ud)
{
    struct attempt *a = ud;

    if (a->cancelled)
        return -1;
    if (m->message_type.p &&
        !(m->message_type.len == 5 && memcmp(m->message_type.p, "event", 5) == 0)) {
        attempt_on_aws_exception(a, m);
        return -1;
    }
    if (a->converse)
        return attempt_on_converse_message(a, m);
    if (!m->event_type.p || m->event_type.len != 5 || memcmp(m->event_type.p, "chunk", 5) != 0)
        return 0; /* an event of another kind (e.g. initial-response): nothing to relay */
    struct aws_chunk c = { { JSCAN_NULL, NULL, 0 }, { JSCAN_NULL, NULL, 0 } };
    if (jscan_object((const char *)m->payload, m->payload_len, aws_chunk_member, &c, NULL) != 0 ||
        !c.bytes.p || c.bytes.len < 2) {
        attempt_fail_stream(a, REASON_BAD_RESPONSE, true,
                            "an event-stream chunk without its \"bytes\"");
        return -1;
    }
    /* Base64 has no JSON escapes: the string's bytes are its value. */
    size_t b64 = c.bytes.len - 2;
    strbuf_reset(&a->es_data);
    if (b64 % 4 != 0 || strbuf_reserve(&a->es_data, b64 / 4 * 3 + 1) < 0) {
        attempt_fail_stream(a, REASON_BAD_RESPONSE, true,
                            "an event-stream chunk's bytes are not base64");
        return -1;
    }
    int n = EVP_DecodeBlock((unsigned char *)a->es_data.data, (const unsigned char *)c.bytes.p + 1,
                            (int)b64);
    if (n < 0) {
        attempt_fail_stream(a, REASON_BAD_RESPONSE, true,
                            "an event-stream chunk's bytes are not base64");
        return -1;
    }
    /* EVP_DecodeBlock counts the padding's bytes as data. */
    size_t len = (size_t)n;
    if (b64 >= 1 && c.bytes.p[b64] == '=')
        len--;
    if (b64 >= 2 && c.bytes.p[b64 - 1] == '=')
        len--;
    a->es_data.len = len;
    strbuf_terminate(&a->es_data);
    struct aws_chunk inner = { { JSCAN_NULL, NULL, 0 }, { JSCAN_NULL, NULL, 0 } };
    (void)jscan_object(a->es_data.data, len, aws_chunk_member, &inner, NULL);
    bool named = inner.type.p && inner.type.len > 2;
    return attempt_deliver_aws(a, named ? inner.type.p + 1 : NULL, named ? inner.type.len - 2 : 0);
}

bool attempt_done_seen(const struct attempt *a)
{
    return a->done_seen;
}

size_t attempt_event_name(const struct attempt *a, const char **name)
{
    const struct sse_event *ev = a->cur_ev;

    if (a->es_name) {
        *name = a->es_name;
        return a->es_name_len;
    }
    if (!ev || ev->event_len == 0 || (ev->event_len == 7 && memcmp(ev->event, "message", 7) == 0))
        return 0;
    *name = ev->event;
    return ev->event_len;
}

size_t attempt_event_id(const struct attempt *a, const char **id)
{
    const struct sse_event *ev = a->cur_ev;

    if (!ev || ev->id_len == 0)
        return 0;
    *id = ev->id;
    return ev->id_len;
}

static bool resp_append(struct attempt *a, const char *p, size_t n)
{
    if (a->resp.len + n > a->max_resp) {
        a->resp_too_large = true;
        return false;
    }
    if (strbuf_put(&a->resp, p, n) < 0)
        return false;
    strbuf_terminate(&a->resp);
    return true;
}

/* Refuses this buffer: curl keeps it and hands it back on resume. */
static size_t attempt_refuse(struct attempt *a, bool by_budget, size_t n)
{
    a->curl_paused = true;
    a->paused_at = ev_now(a->up->loop);
    if (by_budget) {
        a->budget_blocked = true;
        a->blocked_n = n;
        a->budget->blocked++;
    }
    attempt_arm(a);
    return CURL_WRITEFUNC_PAUSE;
}

static size_t attempt_on_write(char *p, size_t size, size_t nmemb, void *ud)
{
    struct attempt *a = ud;
    size_t n = size * nmemb;
    bool sse = a->stream && a->is_sse && a->status >= 200 && a->status < 300;

    if (a->cancelled)
        return CURL_WRITEFUNC_ERROR;
    /* A pause asked for by an earlier event of this same read pass applies
     * to this buffer already, instead of relaying up to a whole read pass
     * more to a client that is not reading. */
    if (a->owner_paused)
        return attempt_refuse(a, false, n);
    if (!sse && a->resp.len + n > a->max_resp) {
        /* Before the budget: a body that can never fit must fail, not wait. */
        a->resp_too_large = true;
        return CURL_WRITEFUNC_ERROR;
    }
    if (a->budget && n > 0 && !budget_fits(a, n, true))
        return attempt_refuse(a, true, n);
    attempt_on_activity(a);
    if (sse && a->aws_es) {
        if (!a->es_ready) {
            if (evstream_init(&a->es, a->max_resp) != 0)
                return CURL_WRITEFUNC_ERROR;
            a->es_ready = true;
        }
        int rc = evstream_feed(&a->es, p, n, attempt_on_aws_message, a);
        if (rc != 0 || a->cancelled) {
            if (!a->stream_failed && !a->cancelled && rc != -1)
                attempt_fail_stream(a, REASON_BAD_RESPONSE, true,
                                    rc == EVSTREAM_ECRC
                                        ? "an event-stream frame failed its CRC check"
                                        : rc == EVSTREAM_ETOO_LARGE
                                        ? "an event-stream frame larger than max_message_bytes"
                                        : "a malformed event-stream frame");
            return CURL_WRITEFUNC_ERROR;
        }
        budget_charge(a, evstream_buffered(&a->es));
        return n;
    }
    if (sse) {
        if (!a->sse_ready) {
            sse_parser_init(&a->sse, a->max_resp);
            a->sse_ready = true;
        }
        if (sse_parser_feed(&a->sse, p, n, attempt_on_sse_event, a) != 0 || a->cancelled)
            return CURL_WRITEFUNC_ERROR;
        budget_charge(a, sse_parser_buffered(&a->sse));
        return n;
    }
    if (!resp_append(a, p, n))
        return CURL_WRITEFUNC_ERROR;
    budget_charge(a, a->resp.len);
    return n;
}

/* --- multi glue ------------------------------------------------------ */

/* How a transfer ended, whichever client carried it. */
enum xfer_end {
    XFER_OK = 0,         /* a complete answer, any status */
    XFER_RESOLVE_FAILED, /* the name (or the proxy's) did not resolve */
    XFER_CONNECT_FAILED,
    XFER_TRUNCATED, /* closed before the announced body ended */
    XFER_REFUSED,   /* our write callback refused the answer */
    XFER_TIMEOUT,   /* the client's own backstop timeout */
    XFER_TLS,
    XFER_BAD_RESPONSE, /* not a valid HTTP answer */
    XFER_LOST,         /* reset, closed early, anything else */
};

/* Replaces a Converse reply in a->resp by the Messages reply it stands
 * for (converse.h). Returns 0, or -1 when it is not one (a->resp kept). */
static int attempt_converse_reply(struct attempt *a)
{
    msgpack_sbuffer in, out;
    msgpack_packer pk;
    msgpack_unpacked up;
    struct strbuf json;
    int rc = -1;

    msgpack_sbuffer_init(&in);
    msgpack_sbuffer_init(&out);
    msgpack_unpacked_init(&up);
    strbuf_init(&json);
    msgpack_packer_init(&pk, &in, msgpack_sbuffer_write);
    if (transcode_json_to_msgpack(a->resp.data ? a->resp.data : "", a->resp.len, &pk, NULL, NULL,
                                  0) == 0 &&
        msgpack_unpack_next(&up, in.data, in.size, NULL) == MSGPACK_UNPACK_SUCCESS) {
        msgpack_packer_init(&pk, &out, msgpack_sbuffer_write);
        if (converse_reply(&up.data, &pk) == 0) {
            msgpack_unpacked_destroy(&up);
            msgpack_unpacked_init(&up);
            if (msgpack_unpack_next(&up, out.data, out.size, NULL) == MSGPACK_UNPACK_SUCCESS &&
                transcode_msgpack_to_json(&up.data, &json, NULL, "reply", NULL, 0) == 0) {
                strbuf_reset(&a->resp);
                rc = strbuf_put(&a->resp, json.data, json.len) < 0 ? -1 : 0;
                strbuf_terminate(&a->resp);
            }
        }
    }
    strbuf_fini(&json);
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&out);
    msgpack_sbuffer_destroy(&in);
    return rc;
}

/* The attempt's result from how its transfer ended; `detail` describes
 * every end but XFER_OK. */
static void attempt_conclude(struct attempt *a, enum xfer_end end, const char *detail)
{
    struct attempt_result r;
    struct timespec ts;

    memset(&r, 0, sizeof(r));
    r.outcome.retry_after_s = -1;
    switch (end) {
    case XFER_OK:
        if (a->status == 407) {
            /* Only a proxy answers 407 (Proxy Authentication Required, in
             * RFC 9110): the way to the upstream failed, the upstream said
             * nothing. */
            result_transient(&r, REASON_CONNECT_FAILED,
                             "the proxy refused the request with a 407 (Proxy Authentication "
                             "Required); give its credentials in the source's proxy URL");
            a->status = 0;
        } else if (a->status < 200 || a->status >= 300) {
            clock_gettime(CLOCK_REALTIME, &ts);
            outcome_from_http(&r.outcome, a->status, a->retry_after[0] ? a->retry_after : NULL,
                              (double)ts.tv_sec + ts.tv_nsec / 1e9);
            struct dialect_hints hints = { a->retry_after_ms, a->should_retry, a->reset_requests,
                                           a->reset_tokens };
            dialect_apply_hints(&r.outcome, &hints);
            if (a->status >= 300 && a->status < 400)
                snprintf(r.detail, sizeof(r.detail),
                         "upstream answered HTTP %d, a redirect: polygw does not follow "
                         "redirects, so the source's key is never sent to another location; "
                         "fix base_url",
                         a->status);
            else
                snprintf(r.detail, sizeof(r.detail), "upstream answered HTTP %d", a->status);
        } else if (a->stream && !a->is_sse) {
            char why[sizeof(r.detail)];
            snprintf(why, sizeof(why), "expected %s",
                     a->aws_es ? "application/vnd.amazon.eventstream" : "text/event-stream");
            result_transient(&r, REASON_BAD_RESPONSE, why);
        } else if (a->stream && !a->terminal_seen) {
            char why[sizeof(r.detail)];
            snprintf(why, sizeof(why), "stream ended before its terminal event (%s)",
                     a->stream_end ? a->stream_end : "[DONE], a finish_reason, message_stop");
            result_transient(&r, REASON_TRUNCATED, why);
        } else if (a->converse && !a->stream && attempt_converse_reply(a) < 0) {
            result_transient(&r, REASON_BAD_RESPONSE,
                             "reply is not a Bedrock Converse reply (an object with "
                             "output.message.content)");
        } else {
            r.outcome.kind = OUTCOME_SUCCESS;
            r.outcome.reason = REASON_NONE;
        }
        r.outcome.http_status = a->status;
        break;
    case XFER_RESOLVE_FAILED:
        result_transient(&r, REASON_DNS_FAILED, detail);
        break;
    case XFER_CONNECT_FAILED:
        result_transient(&r, REASON_CONNECT_FAILED, detail);
        break;
    case XFER_TRUNCATED:
        result_transient(&r, REASON_TRUNCATED, detail);
        break;
    case XFER_REFUSED:
        if (a->stream_failed) {
            result_transient(&r, a->fail_reason, a->fail_detail);
            if (!a->fail_transient)
                r.outcome.kind = OUTCOME_FAIL_FAST;
            else if (a->fail_reason == REASON_HTTP_429)
                r.outcome.kind = OUTCOME_RATE_LIMITED;
        } else if (a->resp_too_large) {
            result_transient(&r, REASON_BAD_RESPONSE, "response larger than max_message_bytes");
        } else {
            result_transient(&r, REASON_BAD_RESPONSE, "malformed or oversized stream event");
        }
        break;
    case XFER_TIMEOUT:
        result_transient(
            &r, a->phase <= ATTEMPT_CONNECTING ? REASON_CONNECT_TIMEOUT : REASON_TOTAL_TIMEOUT,
            detail);
        break;
    case XFER_TLS:
        result_transient(&r, REASON_TLS, detail);
        break;
    case XFER_BAD_RESPONSE:
        result_transient(&r, REASON_BAD_RESPONSE, detail);
        break;
    case XFER_LOST:
    default:
        result_transient(&r, REASON_CONNECTION_RESET, detail);
        break;
    }
    r.http_status = a->status;
    attempt_finish(a, &r);
}

static enum xfer_end xfer_end_of_curl(CURLcode rc)
{
    switch (rc) {
    case CURLE_OK:
        return XFER_OK;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
        return XFER_RESOLVE_FAILED;
    case CURLE_COULDNT_CONNECT:
    case CURLE_PROXY: /* a proxy's handshake failed (SOCKS, say) */
        return XFER_CONNECT_FAILED;
    case CURLE_PARTIAL_FILE:
        return XFER_TRUNCATED;
    case CURLE_WRITE_ERROR:
        return XFER_REFUSED;
    case CURLE_OPERATION_TIMEDOUT:
        return XFER_TIMEOUT;
    /* Bytes that are no HTTP answer ("Received HTTP/0.9 when not allowed",
     * a broken status line or header): what the own client calls a
     * malformed answer. Schemes other than http(s) never reach libcurl. */
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_WEIRD_SERVER_REPLY:
        return XFER_BAD_RESPONSE;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
        return XFER_TLS;
    default:
        return XFER_LOST;
    }
}

/* A plain-http URL by host name: once libcurl has carried a request to it,
 * the own client takes the next ones, to the address libcurl connected to
 * (the one that answered, after libcurl's own address fallback), for
 * up->name_ttl_s. Then one request goes through libcurl again, which
 * resolves the name afresh (within the attempt's deadlines, on its resolver
 * thread) and teaches the new address. So a name costs what an address
 * costs, no lookup ever runs on the loop, and a changed address is followed
 * within the TTL. */
static void upstream_learn_address(struct upstream *up, struct url_host *u, CURL *easy)
{
    char *ip = NULL, label[128];
    long port = 0;
    union ip_addr addr;
    socklen_t alen;
    char host[INET6_ADDRSTRLEN + 3];

    if (curl_easy_getinfo(easy, CURLINFO_PRIMARY_IP, &ip) != CURLE_OK || !ip || !*ip ||
        curl_easy_getinfo(easy, CURLINFO_PRIMARY_PORT, &port) != CURLE_OK || port <= 0 ||
        port > 65535)
        return;
    snprintf(host, sizeof(host), strchr(ip, ':') ? "[%s]" : "%s", ip);
    if (!host_literal(host, (uint16_t)port, &addr, &alen))
        return;
    snprintf(label, sizeof(label), "%s (%s) port %ld", u->dns->name, ip, port);
    struct h1_origin *o = h1_origin_get_tls(up->h1, &addr.sa, alen, label, u->tls, u->tls_name);
    if (!o)
        return;
    u->origin = o;
    u->name_until = ev_now(up->loop) + up->name_ttl_s;
}

/* libcurl's error text may quote a URL whole (a proxy's it could not
 * use: "Unsupported proxy syntax in 'http://user:secret@...'"): the
 * user and password of every URL in it become "[redacted]", in place,
 * within the buffer's `cap`. */
void upstream_scrub_userinfo(char *s, size_t cap)
{
    static const char mask[] = "[redacted]";
    size_t len = strlen(s);

    for (char *p = strstr(s, "://"); p; p = strstr(p, "://")) {
        char *h = p + 3;
        size_t n = strcspn(h, "/?#'\" \t\r\n");
        char *at = NULL;
        for (char *q = h; q < h + n; q++)
            if (*q == '@')
                at = q;
        if (!at) {
            p = h;
            continue;
        }
        size_t user = (size_t)(at - h), tail = len - (size_t)(at - s) + 1; /* with the NUL */
        size_t grow = sizeof(mask) - 1 > user ? sizeof(mask) - 1 - user : 0;
        if (len + grow + 1 > cap) { /* no room for the mask: cut the text at the URL */
            *h = '\0';
            return;
        }
        memmove(h + sizeof(mask) - 1, at, tail);
        memcpy(h, mask, sizeof(mask) - 1);
        len = len + sizeof(mask) - 1 - user;
        p = h + sizeof(mask) - 1;
    }
}

static void upstream_on_done_msg(CURL *easy, CURLcode rc)
{
    struct attempt *a = NULL;
    struct attempt_result r;

    curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&a);
    if (!a)
        return;
    if (a->cancelled) {
        attempt_detach(a);
        attempt_free(a);
        return;
    }
    if (a->lookup_wait) {
        a->lookup_wait = false;
        dns_wait(a);
        return;
    }
    if (a->lookup_refused) {
        char detail[sizeof(r.detail)];
        snprintf(detail, sizeof(detail),
                 "too many lookups of %s in progress or recently abandoned "
                 "(max_dns_lookups_per_host %u)",
                 a->dns->name, a->up->max_lookups_per_host);
        a->up->stats.dns_busy++;
        result_transient(&r, REASON_DNS_FAILED, detail);
        attempt_finish(a, &r);
        return;
    }
    if (rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_RESOLVE_PROXY)
        dns_lookup_end(a, false); /* the resolver answered: its thread is done */
    a->recycle = rc == CURLE_OK;
    if (rc == CURLE_OK && a->url && a->url->by_name)
        upstream_learn_address(a->up, a->url, easy);
    enum xfer_end end = xfer_end_of_curl(rc);
    long tunnel = 0;
    if (rc != CURLE_OK && curl_easy_getinfo(easy, CURLINFO_HTTP_CONNECTCODE, &tunnel) == CURLE_OK &&
        tunnel >= 300)
        end = XFER_CONNECT_FAILED; /* the proxy refused the tunnel ("CONNECT tunnel failed") */
    upstream_scrub_userinfo(a->errbuf, sizeof(a->errbuf));
    attempt_conclude(a, end, a->errbuf[0] ? a->errbuf : curl_easy_strerror(rc));
}

/* --- the own client's hooks (h1.h) ------------------------------------ */

static void attempt_h1_on_connecting(void *ud)
{
    attempt_set_phase(ud, ATTEMPT_CONNECTING);
}

static void attempt_h1_on_sending(void *ud)
{
    attempt_on_prereq(ud, NULL, NULL, 0, 0);
}

static int attempt_h1_on_header(void *ud, const char *line, size_t n)
{
    return attempt_on_header((char *)line, 1, n, ud) == n ? 0 : -1;
}

static enum h1_take attempt_h1_on_body(void *ud, const char *p, size_t n)
{
    size_t rc = attempt_on_write((char *)p, 1, n, ud);

    if (rc == n)
        return H1_TAKEN;
    return rc == CURL_WRITEFUNC_PAUSE ? H1_PAUSE : H1_ABORT;
}

static void attempt_h1_on_end(void *ud, enum h1_end end, const char *detail)
{
    struct attempt *a = ud;
    static const enum xfer_end map[] = {
        [H1_OK] = XFER_OK,
        [H1_CONNECT_FAILED] = XFER_CONNECT_FAILED,
        [H1_CONNECTION_LOST] = XFER_LOST,
        [H1_TRUNCATED] = XFER_TRUNCATED,
        [H1_MALFORMED] = XFER_BAD_RESPONSE,
        [H1_ABORTED] = XFER_REFUSED,
        [H1_TLS] = XFER_TLS,
    };

    if (a->cancelled)
        return; /* cancelled from one of its hooks: the prepare pass frees it */
    /* A learned address that refuses connections is forgotten: the next
     * attempt resolves the name again through libcurl. */
    if (end == H1_CONNECT_FAILED && a->url && a->url->by_name)
        a->url->name_until = 0;
    attempt_conclude(a, (unsigned)end < sizeof(map) / sizeof(map[0]) ? map[end] : XFER_LOST,
                     detail ? detail : "");
}

static const struct h1_hooks attempt_h1_hooks = {
    .on_connecting = attempt_h1_on_connecting,
    .on_sending = attempt_h1_on_sending,
    .on_header = attempt_h1_on_header,
    .on_body = attempt_h1_on_body,
    .on_end = attempt_h1_on_end,
};

static void upstream_drain(struct upstream *up)
{
    CURLMsg *msg;
    int left;

    while ((msg = curl_multi_info_read(up->multi, &left))) {
        if (msg->msg == CURLMSG_DONE)
            upstream_on_done_msg(msg->easy_handle, msg->data.result);
    }
}

static void upstream_action(struct upstream *up, curl_socket_t fd, int what)
{
    int running;

    up->in_curl++;
    curl_multi_socket_action(up->multi, fd, what, &running);
    up->in_curl--;
    upstream_drain(up);
}

static void upstream_on_io(struct ev_loop *loop, ev_io *w, int revents)
{
    struct usock *s = (struct usock *)w;
    (void)loop;
    upstream_action(s->up, w->fd,
                    (revents & EV_READ ? CURL_CSELECT_IN : 0) |
                        (revents & EV_WRITE ? CURL_CSELECT_OUT : 0));
}

static void upstream_on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    upstream_action(w->data, CURL_SOCKET_TIMEOUT, 0);
}

static int upstream_socket_cb(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp)
{
    struct upstream *up = userp;
    struct usock *s = socketp;
    (void)easy;

    if (what == CURL_POLL_REMOVE) {
        if (s) {
            ev_io_stop(up->loop, &s->w);
            curl_multi_assign(up->multi, fd, NULL);
            free(s);
        }
        return 0;
    }
    int events = (what & CURL_POLL_IN ? EV_READ : 0) | (what & CURL_POLL_OUT ? EV_WRITE : 0);
    if (!s) {
        s = calloc(1, sizeof(*s));
        if (!s)
            return -1;
        s->up = up;
        ev_io_init(&s->w, upstream_on_io, fd, events);
        curl_multi_assign(up->multi, fd, s);
    } else {
        ev_io_stop(up->loop, &s->w);
        ev_io_set(&s->w, fd, events);
    }
    ev_io_start(up->loop, &s->w);
    return 0;
}

static int upstream_timer_cb(CURLM *multi, long timeout_ms, void *userp)
{
    struct upstream *up = userp;
    (void)multi;

    ev_timer_stop(up->loop, &up->timer_w);
    if (timeout_ms >= 0) {
        /* 0 means "as soon as possible": next loop iteration, not now. */
        ev_timer_set(&up->timer_w, (double)timeout_ms / 1000.0, 0.);
        ev_timer_start(up->loop, &up->timer_w);
    }
    return 0;
}

/* A lookup slot freed: hands every waiting attempt of that host back to
 * curl. Its lookup then hits the DNS cache, or passes through the cap in
 * attempt_on_resolver_start again (and waits again, or fails). One at a
 * time from the list head: a failure's on_done may cancel other waiters. */
static void upstream_admit_waiters(struct upstream *up)
{
    for (struct dns_host *h = up->hosts; h; h = h->next) {
        while (h->waiters && h->lookups < up->max_lookups_per_host) {
            struct attempt *a = h->waiters;
            dns_unwait(a);
            if (curl_multi_add_handle(up->multi, a->easy) != CURLM_OK) {
                struct attempt_result r;
                result_transient(&r, REASON_DNS_FAILED,
                                 "cannot restart the transfer after waiting for a lookup");
                attempt_finish(a, &r);
            }
        }
    }
}

/* Runs before the loop sleeps: applies cancels, pauses, resumes and
 * re-admissions that could not be applied inside curl's callbacks. */
static void upstream_on_prepare(struct ev_loop *loop, ev_prepare *w, int revents)
{
    struct upstream *up = w->data;
    (void)revents;

    ev_prepare_stop(loop, w);
    while (up->deferred) {
        struct attempt *a = up->deferred;
        up->deferred = a->next_deferred;
        a->on_deferred = false;
        if (a->cancelled) {
            attempt_detach(a);
            attempt_free(a);
            continue;
        }
        if (a->refused) {
            struct attempt_result r;
            result_transient(&r, REASON_CONNECT_FAILED, a->refused);
            attempt_finish(a, &r);
            continue;
        }
        if (a->want_resume && a->curl_paused && (a->easy || a->native) && !a->owner_paused &&
            !a->budget_blocked) {
            double now = ev_now(loop);
            a->want_resume = false;
            a->curl_paused = false;
            /* The first-event clock of a stream stood still while paused. */
            if (a->phase == ATTEMPT_RECEIVING && a->stream)
                a->sent_at += now - a->paused_at;
            a->last_activity = now;
            attempt_arm(a);
            if (a->native) {
                h1_req_resume(&a->h1); /* may end it: nothing of `a` after this */
                continue;
            }
            up->in_curl++;
            curl_easy_pause(a->easy, CURLPAUSE_CONT);
            up->in_curl--;
            upstream_drain(up);
        }
    }
    if (up->admit_pending) {
        up->admit_pending = false;
        upstream_admit_waiters(up);
    }
}

/* --- public ---------------------------------------------------------- */

/* The length of the attempt's extra header line, 0 when none (or too long
 * to send). */
static size_t extra_len(const struct attempt_spec *spec)
{
    size_t n = spec->extra_header ? strlen(spec->extra_header) : 0;
    return n <= UPSTREAM_EXTRA_HEADER_MAX ? n : 0;
}

/* Appends each line of `lines` (CRLF between them) to `l`. */
static int add_lines(struct curl_slist *l, const char *lines)
{
    char one[UPSTREAM_EXTRA_HEADER_MAX + 1];
    while (*lines) {
        size_t n = strcspn(lines, "\r");
        if (n >= sizeof(one))
            return -1;
        memcpy(one, lines, n);
        one[n] = '\0';
        if (!curl_slist_append(l, one))
            return -1;
        lines += n;
        lines += strspn(lines, "\r\n");
    }
    return 0;
}

/* Whether the environment names a proxy, or hosts not to proxy, for
 * libcurl: these are all the variables it reads. It reads them again for
 * every transfer, a scan of the whole environment per name; a running
 * sidecar's environment does not change, so when none is set the handles
 * are told once that there is no proxy (CURLOPT_PROXY ""), which is what
 * libcurl would find each time. */
static bool env_set(const char *name)
{
    const char *v = getenv(name);
    return v && *v;
}

static bool upstream_env_names_proxy(void)
{
    /* HTTP_PROXY too, which libcurl ignores: set, it only costs the shortcut. */
    static const char *const names[] = { "http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY",
                                         "all_proxy",  "ALL_PROXY",  "no_proxy",    "NO_PROXY" };

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (getenv(names[i]))
            return true;
    }
    return false;
}

struct upstream *upstream_new(struct ev_loop *loop, uint32_t max_dns_lookups_per_host,
                              bool own_client, char *err, size_t errlen)
{
    static bool global_init;
    struct upstream *up;

    if (!global_init) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
            snprintf(err, errlen, "curl_global_init failed");
            return NULL;
        }
        global_init = true;
    }
    up = calloc(1, sizeof(*up));
    if (!up || !(up->multi = curl_multi_init())) {
        free(up);
        snprintf(err, errlen, "cannot create the HTTP engine (out of memory)");
        return NULL;
    }
    up->loop = loop;
    up->name_ttl_s = UPSTREAM_NAME_TTL_S;
    up->no_proxy_env = !upstream_env_names_proxy();
    CURL *probe = curl_easy_init();
    char *cainfo = NULL;
    if (probe && curl_easy_getinfo(probe, CURLINFO_CAINFO, &cainfo) == CURLE_OK && cainfo &&
        access(cainfo, R_OK) == 0)
        up->default_cainfo = strdup(cainfo);
    curl_easy_cleanup(probe);
    up->max_lookups_per_host = max_dns_lookups_per_host ? max_dns_lookups_per_host : 1;
    /* The own client never goes through a proxy: with one named for plain
     * http (libcurl ignores HTTP_PROXY, as a CGI header could set it), every
     * attempt stays libcurl's, which applies it and no_proxy; with one named
     * for https, every https attempt does. Empty, a variable names none (as
     * for libcurl). */
    if (own_client && !env_set("http_proxy") && !env_set("all_proxy") && !env_set("ALL_PROXY") &&
        !(up->h1 = h1_pool_new(loop, &up->in_curl, (uint32_t)UPSTREAM_MAX_IDLE_CONNECTIONS))) {
        curl_multi_cleanup(up->multi);
        free(up);
        snprintf(err, errlen, "cannot create the HTTP engine (out of memory)");
        return NULL;
    }
    up->own_tls = up->h1 && !env_set("https_proxy") && !env_set("HTTPS_PROXY");
    ev_init(&up->timer_w, upstream_on_timer);
    up->timer_w.data = up;
    ev_prepare_init(&up->prepare_w, upstream_on_prepare);
    up->prepare_w.data = up;
    curl_multi_setopt(up->multi, CURLMOPT_SOCKETFUNCTION, upstream_socket_cb);
    curl_multi_setopt(up->multi, CURLMOPT_SOCKETDATA, up);
    curl_multi_setopt(up->multi, CURLMOPT_TIMERFUNCTION, upstream_timer_cb);
    curl_multi_setopt(up->multi, CURLMOPT_TIMERDATA, up);
    curl_multi_setopt(up->multi, CURLMOPT_PIPELINING, (long)CURLPIPE_MULTIPLEX);
    curl_multi_setopt(up->multi, CURLMOPT_MAXCONNECTS, UPSTREAM_MAX_IDLE_CONNECTIONS);
    return up;
}

void upstream_free(struct upstream *up)
{
    if (!up)
        return;
    while (up->active) {
        struct attempt *a = up->active;
        attempt_detach(a);
        attempt_free(a);
    }
    while (up->hosts) {
        struct dns_host *h = up->hosts;
        up->hosts = h->next;
        free(h);
    }
    ev_timer_stop(up->loop, &up->timer_w);
    ev_prepare_stop(up->loop, &up->prepare_w);
    while (up->n_pool)
        curl_easy_cleanup(up->pool[--up->n_pool]);
    free(up->default_cainfo);
    curl_multi_cleanup(up->multi);
    /* After the handles: a pooled one may still point at a header list. */
    while (up->header_sets) {
        struct header_set *hs = up->header_sets;
        up->header_sets = hs->next;
        header_set_free(hs);
    }
    while (up->urls) {
        struct url_host *u = up->urls;
        up->urls = u->next;
        curl_url_cleanup(u->uh);
        free(u->h1_head);
        free(u->tls_name);
        free(u);
    }
    h1_pool_free(up->h1);
    /* After the pool: its origins and connections borrow the contexts. */
    while (up->tls_routes) {
        struct tls_route *t = up->tls_routes;
        up->tls_routes = t->next;
        SSL_CTX_free(t->ctx);
        free(t->ca_file);
        free(t);
    }
    free(up);
}

static struct curl_slist *headers_build(bool stream, const char *const *extra)
{
    struct curl_slist *l = curl_slist_append(NULL, "Content-Type: application/json");
    struct curl_slist *t;

    if (!l)
        return NULL;
    if (!(t = curl_slist_append(
              l, stream ? "Accept: text/event-stream" : "Accept: application/json")) ||
        !(t = curl_slist_append(l, "Expect:"))) {
        curl_slist_free_all(l);
        return NULL;
    }
    for (size_t i = 0; extra && extra[i]; i++) {
        if (!curl_slist_append(l, extra[i])) {
            headers_wipe(l);
            curl_slist_free_all(l);
            return NULL;
        }
    }
    return l;
}

/* A passthrough's headers: `extra` alone (its Content-Type included),
 * without libcurl's Expect: 100-continue. */
static struct curl_slist *raw_headers_build(const char *const *extra)
{
    struct curl_slist *l = curl_slist_append(NULL, "Expect:");

    for (size_t i = 0; l && extra && extra[i]; i++) {
        if (!curl_slist_append(l, extra[i])) {
            headers_wipe(l);
            curl_slist_free_all(l);
            return NULL;
        }
    }
    return l;
}

/* True when list `l` is the one headers_build(stream, extra) makes: its
 * first 3 lines are fixed, the rest must equal `extra` line by line. */
static bool headers_match(const struct curl_slist *l, const char *const *extra)
{
    for (int i = 0; i < 3 && l; i++)
        l = l->next;
    for (size_t i = 0; extra && extra[i]; i++, l = l->next) {
        if (!l || strcmp(l->data, extra[i]) != 0)
            return false;
    }
    return l == NULL;
}

/* The lines of `l` as the own client writes them, after the request
 * line: libcurl's rules for a custom list kept ("Name:" alone removes a
 * header libcurl would add: nothing to write; "Name;" sends it empty), and
 * Content-Length, written per attempt, comes last. */
static char *headers_block(const struct curl_slist *l, size_t *len)
{
    struct strbuf b = { 0 };

    for (; l; l = l->next) {
        size_t n = strlen(l->data);
        if (n > 0 && l->data[n - 1] == ':' && !memchr(l->data, ' ', n))
            continue;
        if (n > 0 && l->data[n - 1] == ';' && !memchr(l->data, ':', n)) {
            if (strbuf_put(&b, l->data, n - 1) < 0 || strbuf_puts(&b, ":\r\n") < 0)
                goto fail;
            continue;
        }
        if (strbuf_put(&b, l->data, n) < 0 || strbuf_puts(&b, "\r\n") < 0)
            goto fail;
    }
    if (strbuf_fit(&b) < 0)
        goto fail;
    *len = b.len;
    return b.data ? b.data : strdup("");
fail:
    explicit_bzero(b.data, b.cap);
    strbuf_fini(&b);
    return NULL;
}

/* The cached header set for (stream, extra), made on first use; NULL past
 * the cache bound or when out of memory. Lives as long as the engine. */
static struct header_set *upstream_header_set(struct upstream *up, bool stream,
                                              const char *const *extra)
{
    for (struct header_set *hs = up->header_sets; hs; hs = hs->next) {
        if (hs->stream == stream && headers_match(hs->headers, extra))
            return hs;
    }
    if (up->n_header_sets >= UPSTREAM_CACHE_MAX)
        return NULL;
    struct header_set *hs = calloc(1, sizeof(*hs));
    if (!hs || !(hs->headers = headers_build(stream, extra)) ||
        !(hs->h1_block = headers_block(hs->headers, &hs->h1_len))) {
        if (hs)
            header_set_free(hs);
        return NULL;
    }
    hs->stream = stream;
    hs->next = up->header_sets;
    up->header_sets = hs;
    up->n_header_sets++;
    return hs;
}

/* The header list for (stream, extra): a cached one (borrowed: it lives
 * as long as the engine) or, past the cache bound, a new one stored in
 * *owned for the attempt to free. NULL when out of memory. */
static struct curl_slist *upstream_headers(struct upstream *up, bool stream,
                                           const char *const *extra, struct curl_slist **owned)
{
    struct header_set *hs = upstream_header_set(up, stream, extra);

    if (hs)
        return hs->headers;
    return *owned = headers_build(stream, extra);
}

/* The CA store: the bundle file alone, no CA directory. libcurl keeps the
 * parsed store of one bundle in the multi handle and hands it to every new
 * connection (CURLOPT_CA_CACHE_TIMEOUT), but only when no CA directory is
 * set, and Debian's libcurl sets one by default: every new TLS connection
 * then parsed the whole system bundle again (~140 certificates, most of a
 * handshake's CPU), which is what made a few hundred new connections at
 * once starve the loop. The bundle holds what the directory holds. Without
 * a built-in bundle the defaults stay as libcurl has them. */
static void upstream_easy_tls_defaults(const struct upstream *up, CURL *e)
{
    if (!up->default_cainfo)
        return;
    curl_easy_setopt(e, CURLOPT_CAINFO, up->default_cainfo);
    curl_easy_setopt(e, CURLOPT_CAPATH, NULL);
    curl_easy_setopt(e, CURLOPT_CA_CACHE_TIMEOUT, UPSTREAM_CA_CACHE_S);
}

/* Sets the route's TLS and proxy options on `e`, or puts back the defaults
 * (route NULL). Only when the handle was last set for another route: the
 * strings are copied by libcurl, a few allocations each. */
static void attempt_set_route(struct attempt *a, CURL *e, const struct upstream_route *r)
{
    const struct upstream *up = a->up;

    upstream_easy_tls_defaults(up, e);
    if (r && r->ca_file)
        curl_easy_setopt(e, CURLOPT_CAINFO, r->ca_file);
    curl_easy_setopt(e, CURLOPT_SSLCERT, r ? r->cert_file : NULL);
    curl_easy_setopt(e, CURLOPT_SSLKEY, r ? r->key_file : NULL);
    if (r && r->proxy)
        curl_easy_setopt(e, CURLOPT_PROXY, r->proxy);
    else
        curl_easy_setopt(e, CURLOPT_PROXY, up->no_proxy_env ? "" : NULL);
    /* A source's own proxy is bypassed for its no_proxy only: "" keeps
     * libcurl from reading the environment's no_proxy for it (a pod's
     * no_proxy=* or .svc would send it straight past its egress proxy). */
    curl_easy_setopt(e, CURLOPT_NOPROXY,
                     r && r->no_proxy    ? r->no_proxy
                         : r && r->proxy ? ""
                                         : NULL);
}

/* With a route's server_name: the URL with that name as its host (for SNI,
 * the certificate check and the Host header) and a CURLOPT_CONNECT_TO entry
 * that sends the connection to the URL's own host and port. Returns the new
 * URL (owned, curl_free) or NULL (out of memory, unparsable). */
static char *attempt_server_name(struct attempt *a, const char *url, const char *name)
{
    CURLU *u = curl_url();
    char *host = NULL, *out = NULL;
    char to[300];

    if (u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
        (size_t)snprintf(to, sizeof(to), "::%s:", host) < sizeof(to) &&
        curl_url_set(u, CURLUPART_HOST, name, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_URL, &out, 0) == CURLUE_OK &&
        !(a->connect_to = curl_slist_append(NULL, to))) {
        curl_free(out);
        out = NULL;
    }
    curl_free(host);
    curl_url_cleanup(u);
    return out;
}

/* A new easy handle with the options every attempt shares. They stay set
 * while the handle is pooled (no curl_easy_reset between attempts: the reset
 * and setting them again cost a dozen allocations per attempt, the protocol
 * list and the content-encoding list parsed again), so attempt_setup() sets
 * only what changes from one attempt to the next. */
static CURL *upstream_easy_new(const struct upstream *up)
{
    CURL *e = curl_easy_init();

    if (!e)
        return NULL;
    if (up->no_proxy_env)
        curl_easy_setopt(e, CURLOPT_PROXY, "");
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    /* Never follow a redirect. The request carries the source's key, and on
     * a redirect to another host libcurl drops only Authorization and Cookie
     * (unless CURLOPT_UNRESTRICTED_AUTH): an api-key, x-api-key or
     * x-goog-api-key line would be sent to whatever host Location names. A
     * 3xx ends the attempt instead (upstream_on_done_msg says why). */
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(e, CURLOPT_UNRESTRICTED_AUTH, 0L);
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_QUICK_EXIT, 1L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, attempt_on_write);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, attempt_on_header);
    /* A proxy's answer to CONNECT is not the upstream's: its status would
     * pass for the upstream's when the tunnel or the TLS in it fails. */
    curl_easy_setopt(e, CURLOPT_SUPPRESS_CONNECT_HEADERS, 1L);
    curl_easy_setopt(e, CURLOPT_SOCKOPTFUNCTION, attempt_on_sockopt);
    curl_easy_setopt(e, CURLOPT_PREREQFUNCTION, attempt_on_prereq);
    curl_easy_setopt(e, CURLOPT_RESOLVER_START_FUNCTION, attempt_on_resolver_start);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, "");
    curl_easy_setopt(e, CURLOPT_BUFFERSIZE, UPSTREAM_RECV_BUFFER_BYTES);
    upstream_easy_tls_defaults(up, e);
    return e;
}

/* The options of this attempt, on a pooled or new handle. Every pointer
 * the previous attempt left in a pooled handle (its body, its header list,
 * its callbacks' data) is replaced here before curl can use it. */
static int attempt_setup(struct attempt *a, const struct attempt_spec *spec,
                         const struct url_host *u)
{
    struct upstream *up = a->up;
    const struct upstream_route *r = spec->route;
    uint64_t was = 0;
    CURL *e;

    if (up->n_pool) {
        e = up->pool[--up->n_pool];
        was = up->pool_route[up->n_pool];
    } else {
        e = upstream_easy_new(up);
    }
    if (!(a->easy = e))
        return -1;
    a->route_id = r ? r->id : 0;
    if (was != a->route_id)
        attempt_set_route(a, e, r);
    if (spec->raw)
        a->headers = a->owned_headers = raw_headers_build(spec->headers);
    else if (extra_len(spec) || a->attempt_hdrs)
        a->headers = a->owned_headers = headers_build(spec->stream, spec->headers);
    else
        a->headers = upstream_headers(a->up, spec->stream, spec->headers, &a->owned_headers);
    if (!a->headers)
        return -1;
    if (extra_len(spec) && add_lines(a->owned_headers, spec->extra_header) < 0)
        return -1;
    for (char *line = a->attempt_hdrs; line && *line;) {
        char *end = strstr(line, "\r\n");
        size_t n = end ? (size_t)(end - line) : strlen(line);
        char one[8192];
        if (n >= sizeof(one))
            return -1;
        memcpy(one, line, n);
        one[n] = '\0';
        struct curl_slist *l = curl_slist_append(a->owned_headers, one);
        explicit_bzero(one, n);
        if (!l)
            return -1;
        line += n + (end ? 2 : 0);
    }
    /* Both: the parsed URL is what curl uses, the string what it reports
     * (and parses again when there is no parsed one). Always set, so that a
     * pooled handle never keeps the previous attempt's. */
    if (r && r->server_name) {
        char *url = attempt_server_name(a, spec->url, r->server_name);
        if (!url)
            return -1;
        curl_easy_setopt(e, CURLOPT_URL, url);
        curl_easy_setopt(e, CURLOPT_CURLU, NULL);
        curl_free(url);
    } else {
        curl_easy_setopt(e, CURLOPT_URL, spec->url);
        curl_easy_setopt(e, CURLOPT_CURLU, u ? u->uh : NULL);
    }
    curl_easy_setopt(e, CURLOPT_CONNECT_TO, a->connect_to);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, a->req_body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)spec->body_len);
    /* Set on every attempt: a pooled handle keeps the last one's method. */
    if (spec->method)
        curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
    else
        curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST,
                     spec->method && strcmp(spec->method, "GET") != 0 ? spec->method : NULL);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, a->headers);
    curl_easy_setopt(e, CURLOPT_PRIVATE, a);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, a->errbuf);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, a);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, a);
    curl_easy_setopt(e, CURLOPT_SOCKOPTDATA, a);
    curl_easy_setopt(e, CURLOPT_PREREQDATA, a);
    curl_easy_setopt(e, CURLOPT_RESOLVER_START_DATA, a);
    /* Backstops only: our own timers fire first. */
    /* A name's address is used for name_ttl_s, by libcurl too: its cache of
     * lookups (shared by the multi's handles) keeps none longer, and it
     * reuses no connection to a name opened longer ago, so that the next
     * request resolves the name afresh and a changed address is followed
     * (a kept-alive connection would otherwise go on to the old one). */
    curl_easy_setopt(e, CURLOPT_DNS_CACHE_TIMEOUT, (long)up->name_ttl_s);
    curl_easy_setopt(e, CURLOPT_MAXLIFETIME_CONN, a->dns ? (long)up->name_ttl_s : 0L);
    /* The request that learns a name's address again once the own client's
     * trust in it ran out (or it refused) takes no connection libcurl
     * holds: libcurl counts a connection's age in whole seconds, and an
     * old one would teach the old address once more. */
    bool relearn = u && u->origin && u->by_name && ev_now(up->loop) >= u->name_until;
    curl_easy_setopt(e, CURLOPT_FRESH_CONNECT, relearn ? 1L : 0L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
                     (long)(spec->connect_timeout_s * 1000) + UPSTREAM_BACKSTOP_MS);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(spec->timeout_s * 1000) + UPSTREAM_BACKSTOP_MS);
    return 0;
}

/* Hands the attempt to the own client: the request is the URL's request
 * line, the cached header block, its Content-Length and the body, written
 * as they are. -1 when the header set cannot be cached (libcurl then). */
static int attempt_start_own(struct attempt *a, const struct attempt_spec *spec,
                             const struct url_host *u)
{
    struct header_set *hs = upstream_header_set(a->up, spec->stream, spec->headers);

    if (!hs)
        return -1;
    if (u->tls_route)
        tls_route_refresh(u->tls_route, ev_now(a->up->loop));
    size_t x = extra_len(spec);
    if (x) {
        memcpy(a->h1_cl, spec->extra_header, x);
        memcpy(a->h1_cl + x, "\r\n", 2);
        x += 2;
    }
    memcpy(a->h1_cl + x, "Content-Length: ", 16);
    char *end = put_uint(a->h1_cl + x + 16, spec->body_len);
    memcpy(end, "\r\n\r\n", 4);
    size_t k = (size_t)(end + 4 - a->h1_cl);
    struct iovec iov[5] = {
        { u->h1_head, u->h1_head_len },
        { hs->h1_block, hs->h1_len },
    };
    int niov = 2;
    if (a->attempt_hdrs)
        iov[niov++] = (struct iovec){ a->attempt_hdrs, a->attempt_hdrs_len };
    iov[niov++] = (struct iovec){ a->h1_cl, k };
    if (spec->body_len)
        iov[niov++] = (struct iovec){ a->req_body, spec->body_len };
    a->native = true;
    attempt_arm(a);
    h1_req_start(&a->h1, a->up->h1, u->origin, iov, niov, &attempt_h1_hooks, a);
    return 0;
}

struct attempt *attempt_start(struct upstream *up, struct attempt_spec *spec,
                              const struct attempt_hooks *hooks, void *ud)
{
    struct attempt *a = calloc(1, sizeof(*a));
    double now = ev_now(up->loop);

    if (!a) {
        free(spec->body);
        spec->body = NULL;
        return NULL;
    }
    a->up = up;
    a->req_body = spec->body;
    spec->body = NULL;
    a->hooks = *hooks;
    a->ud = ud;
    a->stream = spec->stream;
    a->stream_end = spec->stream_end;
    a->phase = ATTEMPT_RESOLVING;
    a->started = a->last_activity = a->sent_at = now;
    a->connect_s = spec->connect_timeout_s;
    a->ttft_s = spec->ttft_timeout_s;
    a->idle_s = spec->idle_timeout_s;
    a->total_s = spec->timeout_s;
    a->deadline_at = spec->deadline_at;
    a->max_resp = spec->max_response_bytes;
    a->aws_es = spec->aws_eventstream;
    a->converse = spec->bedrock_converse;
    converse_stream_init(&a->cv);
    strbuf_init(&a->es_data);
    if (spec->attempt_headers) {
        a->attempt_hdrs_len = strlen(spec->attempt_headers);
        if (!(a->attempt_hdrs = strdup(spec->attempt_headers))) {
            free(a->req_body);
            free(a);
            return NULL;
        }
    }
    if (spec->budget)
        budget_join(a, spec->budget);
    ev_init(&a->deadline_w, attempt_on_deadline);
    a->deadline_w.data = a;
    DLIST_PUSH(up->active, a, prev, next);
    up->stats.attempts_active++;
    up->stats.attempts_started++;
    if (spec->refuse) {
        if (!(a->refused = strdup(spec->refuse))) {
            attempt_free(a);
            return NULL;
        }
        upstream_defer(a);
        return a;
    }

    /* The lookup cap is applied when curl actually starts a lookup
     * (attempt_on_resolver_start), not here: most attempts never need one. */
    /* A passthrough's URL varies with its path and query: not cached. */
    struct url_host *u = spec->raw ? NULL : upstream_url(up, spec->url, spec->route);
    if (u) {
        a->dns = u->dns;
        a->url = u;
        /* The own client has no proxy: a source with one stays libcurl's. */
        if (u->origin && (!u->by_name || now < u->name_until) &&
            !(spec->route && spec->route->proxy) && attempt_start_own(a, spec, u) == 0)
            return a;
    } else {
        curl_url_cleanup(url_parse(up, spec->url, &a->dns));
    }
    if (attempt_setup(a, spec, u) < 0) {
        attempt_free(a);
        return NULL;
    }
    attempt_arm(a);
    if (curl_multi_add_handle(up->multi, a->easy) != CURLM_OK) {
        attempt_detach(a);
        attempt_free(a);
        return NULL;
    }
    return a;
}

void attempt_cancel(struct attempt *a)
{
    struct upstream *up = a->up;

    if (a->cancelled)
        return;
    a->cancelled = true;
    up->stats.attempts_cancelled++;
    /* From here on no hook may run: the owner may free its state at once,
     * its budget included. */
    ev_timer_stop(up->loop, &a->deadline_w);
    budget_leave(a);
    if (up->in_curl > 0) {
        upstream_defer(a);
        return;
    }
    attempt_detach(a);
    attempt_free(a);
}

void attempt_fail_stream(struct attempt *a, enum outcome_reason reason, bool transient,
                         const char *detail)
{
    a->stream_failed = true;
    a->fail_reason = reason;
    a->fail_transient = transient;
    snprintf(a->fail_detail, sizeof(a->fail_detail), "%s", detail);
}

void attempt_pause(struct attempt *a)
{
    /* Applied by the next write callback (see attempt_on_write). */
    a->owner_paused = true;
    a->want_resume = false;
}

void attempt_resume(struct attempt *a)
{
    a->owner_paused = false;
    if (a->curl_paused && !a->budget_blocked) {
        a->want_resume = true;
        upstream_defer(a);
    }
}
