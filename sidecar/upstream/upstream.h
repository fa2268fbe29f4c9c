/*
 * upstream.h — the HTTP engine: one libcurl multi handle driven by the
 * libev loop, polygw's own HTTP/1.1 client (h1.h) for http:// and https://
 * to a known address, and the *attempt*, one HTTP request to one source with hard
 * deadlines enforced by our own timers, whichever client carries it.
 *
 * An attempt is the unit the governed loop drives: it is started with a
 * fully prepared request, reports stream events as they arrive, and ends
 * exactly once — either through the on_done hook with a classified outcome,
 * or silently when its owner calls attempt_cancel(). After on_done returns
 * the engine frees the attempt; the owner must drop its pointer.
 *
 * Deadlines (all relative to the attempt's phases, docs/DESIGN.md §3.3):
 *
 *   RESOLVING --opensocket--> CONNECTING --prereq--> SENT --first byte--> RECEIVING
 *   \______ connect_timeout_s ________/  \_ ttft_timeout_s _/ \_ idle_timeout_s
 *                                                               between bytes (plain)
 *                                                               or events (stream)
 *   and timeout_s over the whole attempt, and the call's own deadline.
 *
 * For a stream, TTFT runs until the first SSE event, not the first byte.
 * One ev_timer per attempt is armed at the earliest deadline of its phase.
 * curl's own timeouts are set a little later as a backstop only.
 *
 * Name resolution never blocks the loop: Debian's libcurl resolves in a
 * thread and, when a transfer is removed mid-lookup, would join that thread
 * (a hung getaddrinfo froze the loop for the whole lookup). CURLOPT_QUICK_EXIT
 * makes it detach instead; each such abandoned lookup is counted
 * (dns_abandoned). The multi handle's DNS cache (60 s) serves repeated
 * lookups, and reused connections need none, so the cap below counts real
 * lookups only (curl's resolver-start hook), never attempts:
 *
 *   at most max_dns_lookups_per_host lookups per host run at once, lookups
 *   abandoned in the last UPSTREAM_ORPHAN_TTL_S included. Over that:
 *   - if lookups of the host were abandoned recently (its resolver hangs),
 *     the attempt fails at once: transient, reason dns_failed, "too many
 *     lookups ..." (dns_busy);
 *   - else (only live lookups fill the cap, e.g. a burst of calls to a name
 *     not yet cached) it waits, without a thread, for one of them to end
 *     and then usually finds the name in the cache (dns_waits). The wait is
 *     inside connect_timeout_s (a dns_timeout when it expires).
 */
#ifndef POLYGW_UPSTREAM_H
#define POLYGW_UPSTREAM_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "outcome.h"

struct upstream;
struct attempt;

/* A byte budget shared by the attempts answering one client (its
 * connection): `held` is what the owner keeps for that client (replies
 * queued and not read yet), `received` what its attempts have buffered of
 * responses still arriving (a plain body, a stream's partial event). An
 * attempt whose next buffer would take held + received past `limit` is
 * paused — curl stops reading its socket and TCP pushes back on the
 * upstream — until the total falls again. Which attempt may go on first
 * (so that a full budget never deadlocks) is described in upstream.c.
 *
 * Embedded in its owner and set up with upstream_budget_init(); the owner
 * writes `held` and calls upstream_budget_on_drained() after lowering it.
 * Every attempt charged to a budget must have ended or been cancelled
 * before the budget goes away (cancelling uncharges at once). */
struct upstream_budget {
    size_t limit;            /* set by the owner */
    size_t held;             /* set by the owner */
    size_t received;         /* read-only: bytes charged by attempts */
    struct attempt *members; /* private: attempts charged to it */
    struct attempt *front;   /* private: the member with the most bytes */
    bool front_stale;        /* private: `front` must be looked for again */
    uint32_t blocked;        /* private: members paused by the budget */
};

struct upstream_stats {
    uint64_t attempts_started, attempts_done, attempts_cancelled;
    uint64_t attempts_active;
    uint64_t dns_lookups;   /* lookups started (DNS cache misses) */
    uint64_t dns_abandoned; /* lookups left running in a detached thread */
    uint64_t dns_busy;      /* attempts failed by the per-host lookup cap */
    uint64_t dns_waits;     /* times an attempt waited for a lookup slot */
    uint64_t timeouts[6];   /* by enum attempt_phase at expiry */
    /* The own client's connections (libcurl's are not counted): */
    uint64_t conns_opened;  /* connections it made */
    uint64_t conns_reused;  /* requests it sent on a pooled connection */
    uint64_t stale_retries; /* requests sent again: a pooled connection died as it was reused */
    uint64_t tls_done;      /* TLS handshakes it completed */
    uint64_t tls_resumed;   /* of which resumed an earlier session */
};

enum attempt_phase {
    ATTEMPT_RESOLVING = 0,
    ATTEMPT_CONNECTING,
    ATTEMPT_SENT,
    ATTEMPT_RECEIVING,
    ATTEMPT_STREAMING, /* stream: first event seen */
    ATTEMPT_DONE,
};

/* How one source reaches its upstream over TLS and proxies (its `tls`,
 * `proxy` and `no_proxy` keys, docs/CONFIG.md §7c). Every string is
 * borrowed for attempt_start() only (libcurl copies what it keeps); NULL
 * means the default: the system CA store, no client certificate, the URL's
 * own host name for SNI and verification, the environment's proxy. `id` is
 * unique to one set of values for the life of the process (0 = all
 * defaults): a pooled handle configured for the same id is not set again. */
struct upstream_route {
    uint64_t id;
    const char *ca_file;     /* PEM bundle that replaces the system store */
    const char *cert_file;   /* client certificate chain (PEM), with key_file */
    const char *key_file;    /* its private key (PEM) */
    const char *server_name; /* SNI, certificate name and Host; the connection
                                * still goes to the URL's host and port */
    const char *proxy;       /* proxy URL for this source */
    const char *no_proxy;    /* hosts that bypass the proxy (libcurl's syntax) */
};

struct attempt_spec {
    const char *url;            /* borrowed for the call only (copied by curl); may
                                    * hold a secret in its query: never logged */
    const char *const *headers; /* borrowed until the attempt ends, NULL-terminated
                                    * "Name: value" lines (the source's key among them:
                                    * never logged); NULL = none */
    char *body;                 /* takes: the JSON request body (malloc'd) */
    size_t body_len;
    bool stream;
    const char *stream_end; /* static: the stream's terminal events, named in the
                                    * detail of a stream cut before one; NULL = generic */
    double connect_timeout_s, ttft_timeout_s, idle_timeout_s, timeout_s;
    double deadline_at;                 /* absolute ev_now() time bounding the call; 0 = none */
    size_t max_response_bytes;          /* larger plain bodies / events fail the attempt */
    struct upstream_budget *budget;     /* borrowed, may be NULL: the client's byte budget */
    const struct upstream_route *route; /* borrowed for the call only; NULL = defaults */
    /* A passthrough (a `body: raw` capability): `headers` are all the
     * request's headers (its Content-Type among them: no JSON Content-Type
     * nor Accept is added), the body any bytes, the answer any content
     * type. libcurl carries it. */
    bool raw;
    const char *method; /* static: "GET" or "DELETE" (no body sent); NULL = POST */
    /* More "Name: value" lines for this attempt alone (its traceparent and
     * tracestate), separated by CRLF (none after the last), copied, at most
     * UPSTREAM_EXTRA_HEADER_MAX bytes in all (longer: not sent); NULL =
     * none. Kept out of `headers`, whose lists are cached per set of
     * lines: lines that differ on every attempt would defeat that. */
    const char *extra_header;
    /* More header lines for this attempt alone, each "Name: value\r\n"
     * (a signed request's Authorization, X-Amz-Date, X-Amz-Security-Token:
     * sigv4.h), copied; a secret, wiped when the attempt ends. NULL = none. */
    const char *attempt_headers;
    /* The stream is framed as AWS event-stream messages
     * (application/vnd.amazon.eventstream, evstream.h) instead of SSE:
     * each "chunk" event's {"bytes": base64} payload is decoded and handed
     * to on_event as one event's data, named by its JSON "type"; an
     * exception message fails the attempt (throttlingException as rate
     * limited, the service's 5xx kinds as transient). */
    bool aws_eventstream;
    /* The answer is Bedrock Converse's (codec/converse.h): a 2xx reply is
     * turned into the Messages reply it stands for before on_done sees it
     * (one that is not a Converse reply fails the attempt, a transient
     * bad_response), and with aws_eventstream each event-stream message is
     * a ConverseStream event, its `:event-type` naming it and its payload
     * the JSON, handed to on_event as the Messages events it stands for. */
    bool bedrock_converse;
    /* Set when the request cannot be made (no credentials to sign it): the
     * attempt is not sent and ends from the loop, before it sleeps, as a
     * transient connect_failed with this detail (copied). NULL = send. */
    const char *refuse;
};
#define UPSTREAM_EXTRA_HEADER_MAX 400

struct attempt_result {
    struct outcome outcome;
    enum attempt_phase phase; /* where the attempt was when it ended */
    int http_status;          /* 0 when no response */
    const char *body;         /* the response body (plain, or a non-2xx stream's body) */
    size_t body_len;
    uint32_t events;        /* stream events delivered */
    bool deadline_exceeded; /* the call's deadline (not the attempt's) ended it */
    double elapsed_s;
    double ttft_s;             /* request sent -> first byte (plain) or first event
                                    * (stream); -1 when none arrived */
    char detail[160];          /* human detail, e.g. curl's error text */
    const char *content_type;  /* the answer's Content-Type value (NUL-terminated,
                               * "" when none), borrowed for on_done */
    const char *cache_control; /* its Cache-Control value, the same way (cut to 64 bytes) */
};

/* Hooks run on the loop thread. on_event gets one SSE event's `data` (NUL-
 * terminated; the terminal "[DONE]" is not delivered); returning non-zero
 * aborts the attempt (it then ends as cancelled: on_done is NOT called).
 * on_event may pause the stream with attempt_pause(). It should return
 * non-zero rather than cancel its own attempt; if attempt_cancel() does run
 * inside it (e.g. relaying the event found the client gone, and the client's
 * calls were torn down), the cancel is deferred until curl unwinds and no
 * further event is delivered. on_done is called once, outside any libcurl
 * callback; it may start new attempts and cancel others. */
struct attempt_hooks {
    int (*on_event)(struct attempt *a, const char *data, size_t len, void *ud);
    void (*on_done)(struct attempt *a, const struct attempt_result *r, void *ud);
};

/* Creates the engine on `loop`. `own_client`: http:// and https:// to an
 * IP address, or to a host name whose address libcurl has just reached, go
 * through polygw's own HTTP/1.1 client (h1.h) unless a proxy (the source's,
 * or a variable for the scheme) is in the way; libcurl carries every other
 * attempt.
 * Returns NULL (with err) on failure. */
struct upstream *upstream_new(struct ev_loop *loop, uint32_t max_dns_lookups_per_host,
                              bool own_client, char *err, size_t errlen);
/* How long, in seconds (> 0), a host name's address is used
 * (server.dns_ttl_s, docs/CONFIG.md §3): the own client sends to the
 * address libcurl reached for that long, libcurl reuses neither a lookup
 * nor a connection to a name older than that. 60 until set. Applies to
 * addresses learnt before the call too. */
void upstream_set_dns_ttl(struct upstream *up, uint32_t ttl_s);
/* Cancels every attempt (no hooks run) and frees the engine. */
void upstream_free(struct upstream *up);

/* Replaces the user and password of every URL in the text `s` (a
 * libcurl error) with "[redacted]", within `cap` bytes. */
void upstream_scrub_userinfo(char *s, size_t cap);
const struct upstream_stats *upstream_get_stats(struct upstream *up);

/* Starts an attempt. Takes spec->body even on failure. Returns the attempt,
 * or NULL when it cannot even be set up (out of memory); every other end,
 * a lookup-cap refusal included, is reported through on_done later, never
 * synchronously. */
struct attempt *attempt_start(struct upstream *up, struct attempt_spec *spec,
                              const struct attempt_hooks *hooks, void *ud);

/* Ends the attempt now: the transfer is removed and its connection closed;
 * no hook runs afterwards. Safe from any callback except on_event. */
void attempt_cancel(struct attempt *a);

/* Flow control for streams whose client is slow: once paused (at the next
 * buffer curl delivers), no more bytes are read from the upstream. A budget
 * pauses attempts the same way by itself.
 *
 * While an attempt is paused for its client (by either), the idle and
 * first-event deadlines do not run — the upstream is not silent, we are not
 * reading it — but timeout_s and the call's deadline do: nothing waits for
 * a client for ever. An attempt that reaches one of those while paused ends
 * with REASON_CANCELLED (detail: the client did not read its replies), not
 * a timeout: it is no verdict on the source (no breaker failure, no retry).
 * Both are safe from any callback; resuming happens before the loop sleeps. */
void attempt_pause(struct attempt *a);

/* From on_event only, which then returns -1: the event is an error the
 * upstream reported inside its stream (Anthropic's `error` event, say).
 * Instead of ending as cancelled, the attempt ends through on_done with
 * `reason` (transient, or fail_fast when !transient) and `detail` (copied,
 * at most 159 bytes kept); the event is not counted in `events`. */
void attempt_fail_stream(struct attempt *a, enum outcome_reason reason, bool transient,
                         const char *detail);
void attempt_resume(struct attempt *a);

/* From on_event only: the name of the event being delivered (its SSE
 * `event:` field, not NUL-terminated) in *name, with its length; 0 when the
 * upstream named none (or named it "message", the SSE default). */
size_t attempt_event_name(const struct attempt *a, const char **name);
/* Whether the stream already sent `data: [DONE]`: nothing may follow it. */
bool attempt_done_seen(const struct attempt *a);

/* From on_event only: the stream's last event ID as of the event being
 * delivered (its SSE `id:` field, or an earlier event's: the ID persists
 * until a block sets another), not NUL-terminated, in *id, with its length;
 * 0 when the upstream set none (or set it empty). */
size_t attempt_event_id(const struct attempt *a, const char **id);

/* Sets up an empty budget of `limit` bytes. */
void upstream_budget_init(struct upstream_budget *b, size_t limit);
/* The owner lowered `held`: resumes the paused members that now fit. Cheap
 * when none is paused; safe from any callback. */
void upstream_budget_on_drained(struct upstream_budget *b);

const char *attempt_phase_name(enum attempt_phase p);

#endif /* POLYGW_UPSTREAM_H */
