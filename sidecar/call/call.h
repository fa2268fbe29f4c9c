/*
 * call.h — a `call`: one request to a capability, run by the governed loop
 * over attempts on the upstream engine, whichever front end it came from.
 *
 * The front ends (the msgpack-RPC connection in callrpc.c, the HTTP
 * connection in http.c) each embed a `struct call_sink` and implement its
 * ops; this module never knows which one it answers. A sink owns the list
 * of its calls in flight: the front end tears them down when its client
 * goes away (call_abort_all) and resumes paused streams when its write
 * queue drains (call_on_drained).
 */
#ifndef POLYGW_CALL_H
#define POLYGW_CALL_H

#include "codec/reply.h"
#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codes.h"
#include "gov.h"
#include "codec/jscan.h"
#include "backend/cache.h"

struct server;
struct call;
struct call_sink;
struct upstream_budget;

/* What an answer says about its call (all borrowed for the hook only). */
struct call_info {
    const char *source; /* the current or last attempt's source, "-" before any */
    uint32_t attempts;
    double cost; /* on_result: what the answer cost (cost.h); NAN: unknown or
                  * unpriced, and for a stream until its end */
    double elapsed_s, stalled_s;
    bool anthropic;       /* the answer is in Anthropic's Messages format (a
                                    * kind: anthropic source, not converted): its stream
                                    * events are named and it has no [DONE] */
    bool done_marker;     /* an SSE relay of the stream ends with `data: [DONE]`
                                    * (Chat Completions; not Messages nor Responses) */
    const char *event;    /* on_chunk: the event's name as the upstream's `event:`
                                    * line gave it (Anthropic: else its "type"), or NULL */
    const char *cache;    /* the response cache's verdict, "hit" | "miss" | "bypass",
                                    * NULL: the capability is not cached */
    bool event_names;     /* on_chunk: the caller asked for `event` beside each
                                    * event (call_req.event_names) */
    const char *event_id; /* on_chunk of a resumed Responses stream (call_req's
                                    * `response_id` with `stream`): the upstream's last
                                    * event ID (`id:`) as of this event, or NULL */
};


/* A success. For a plain call, a sink that wants msgpack gets the reply as
 * msgpack in `mp` (and `usage`, the reply's or the stream's last usage
 * map, packed, or NULL); a JSON-only sink gets it as JSON text in `json`:
 * the upstream's bytes, with any secret scrubbed (not NUL-terminated).
 * Both are NULL for a stream, whose events went through on_chunk. */
struct call_body {
    const char *json;
    size_t json_len;
    const char *mp;
    size_t mp_len;
    const char *usage;
    size_t usage_len;
    /* A passthrough's answer (rawcall.h): `json` holds its bytes, whatever
     * they are (secrets scrubbed), `content_type` its Content-Type ("" =
     * none) and `status` its 2xx status. */
    bool raw;
    const char *content_type;
    int status;
};

/* Every hook runs on the loop thread and answers call `id` of sink `s`.
 *   on_chunk   one stream event: `json` is its data as the upstream sent it,
 *              secrets scrubbed (not NUL-terminated), `mp` its msgpack form (a map; an event
 *              that is not JSON comes as {"data": text}; NULL/0 unless
 *              wants_msgpack). Returns 0 to go
 *              on, 1 when the sink's write queue is full (the upstream is
 *              paused until call_on_drained()), or -1 when relaying found
 *              the client gone: the sink then has aborted all its calls,
 *              this one included.
 *   on_result  the call succeeded; exactly once, then no other hook.
 *   on_error   the call failed (or was refused before it started: then
 *              possibly before call_begin returns); `map` is the packed
 *              error object {code, message, ...} of proto/PROTOCOL.md;
 *              exactly once, then no other hook.
 *   flush      the call ended after its answer was queued: write it out.
 *              May find the client gone and abort the sink's other calls.
 * on_result / on_error must only queue: they run while the call is still
 * linked. */
struct call_sink_ops {
    int (*on_chunk)(struct call_sink *s, uint32_t id, const struct call_info *ci, const char *json,
                    size_t json_len, const char *mp, size_t mp_len);
    void (*on_result)(struct call_sink *s, uint32_t id, const struct call_info *ci,
                      const struct call_body *b);
    /* `e` and everything it points to are borrowed for the call. */
    void (*on_error)(struct call_sink *s, uint32_t id, const struct reply_error *e);
    void (*flush)(struct call_sink *s);
    /* The sink writes msgpack: transcode replies and events for it. A
     * JSON-only sink is spared that (governance reads what it needs from
     * the JSON text, sidecar/codec/jscan.h). */
    bool wants_msgpack;
};

/* Embedded in a front end's connection; zero it, then set ops, srv and
 * budget. */
struct call_sink {
    const struct call_sink_ops *ops;
    struct server *srv;
    struct upstream_budget *budget; /* the client's byte budget for its attempts
                                     * (upstream.h), or NULL */
    struct call *calls;             /* in flight (owned by call.c) */
    uint32_t n_calls;
    uint32_t paused_calls; /* of which streams paused for back-pressure */
    /* For the access log (access.h), set by the front end (zero: unknown). */
    uint64_t conn_id;             /* the connection's id in other log lines */
    long long peer_pid, peer_uid; /* the peer as the kernel reports it (SO_PEERCRED);
                                    * pid <= 0: unknown */
};

/* A request, as a front end parsed it. The body is either a msgpack map
 * (`mp`: transcoded to JSON per source, the msgpack-RPC front end) or JSON
 * text (`json`: sent upstream as it is unless a source overrides `model`,
 * the HTTP front end; it must be a JSON object). All borrowed for the call
 * to call_begin only. */
struct call_req {
    const char *capability;
    size_t capability_len;
    const msgpack_object *mp;
    const char *json;
    size_t json_len;
    bool stream;
    const char *scope;            /* NUL-terminated, NULL = the capability's */
    const char *task_id;          /* NUL-terminated, NULL = none */
    double deadline_s;            /* > 0, or 0 = none */
    uint64_t max_tokens;          /* the body's max_(completion_)tokens, 0 = absent */
    const struct config_app *app; /* who is calling (borrowed from the server's config),
                                    * NULL = `default` */
    /* The model asked for (models.h): `model_len` bytes, NULL = none. It
     * selects the capability's sources that serve it; none: the call is
     * refused model_not_found. With `model_param` (the msgpack `model`
     * parameter) it is also written into the body sent to a source that
     * names no model of its own. */
    const char *model;
    size_t model_len;
    bool model_param;
    /* json only: the caller already walked the body's members, and
     * `stream_options` is the span of its stream_options member (p NULL:
     * none), so call_begin need not walk them again. */
    bool members_scanned;
    struct jscan_value stream_options;
    /* The HTTP request's query string, without '?' (`query_len` bytes;
     * NULL: none): passed on to an anthropic source (upath.h). */
    const char *query;
    size_t query_len;
    /* The HTTP request's anthropic-beta header value (NUL-terminated,
     * NULL: none): sent to a kind: anthropic source beside its own
     * headers, as Anthropic's SDKs and Claude Code name the betas a
     * request uses there, not in its body. */
    const char *anthropic_beta;
    /* msgpack: each chunk carries the event's name beside it (the
     * `event_names` parameter; callrpc.h). */
    bool event_names;
    /* Only the capability's kind: gemini sources serve it (the HTTP
     * front's Gemini routes); none: unknown_capability. */
    bool gemini_only;
    /* Its kind: gemini sources do not serve it (the HTTP front's other
     * routes: an OpenAI or Anthropic body is no Gemini request); none
     * left: model_not_found, or unknown_capability without a model. */
    bool gemini_never;
    /* A passthrough, for a capability with body: raw (rawcall.h), from
     * either front: `raw_body` sent as it is with `content_type`
     * (NUL-terminated, NULL = none), by `method` (static "GET", "POST" or
     * "DELETE"; NULL = POST), to the capability's path + `path_suffix`
     * (NUL-terminated: the sub-path and the query, NULL = none). */
    bool raw;
    const char *raw_body;
    size_t raw_len;
    const char *content_type;
    const char *method;
    const char *path_suffix;
    /* The caller's W3C trace context (NUL-terminated, NULL = none): the
     * HTTP front's traceparent / tracestate headers, the msgpack `trace`
     * parameter (calltrace.h). */
    const char *traceparent;
    const char *tracestate;
    /* A Responses API follow-up (over HTTP: GET or DELETE of a response,
     * its cancel and its input_items): routed to the source that produced
     * response `response_id` (NUL-terminated, NULL = none) and sent as a
     * passthrough (`raw`, `method`, `path_suffix`) although the capability
     * takes JSON. A JSON call's previous_response_id is read by call_begin
     * itself. With `stream` (a GET of the response itself, ?stream=true)
     * it resumes the response's event stream: relayed event by event
     * through the Responses dialect, ended as a POST stream is, its usage
     * never counted (docs/HTTP.md §4a). Another passthrough's `stream` is
     * ignored. */
    const char *response_id;
    /* The response cache: the client's mode, and with `cache_max_age` an
     * entry older than cache_max_age_s seconds is not used. */
    enum cache_mode cache;
    bool cache_max_age;
    double cache_max_age_s;
};

/* Starts call `id` of sink `s` (an id unique among the sink's calls in
 * flight: call_find() and call_cancel() use it). When it cannot start
 * (unknown capability, a task that does not run, a body that cannot be
 * sent) it answers through on_error before returning. */
void call_begin(struct call_sink *s, uint32_t id, const struct call_req *r);

/* True when call `id` is in flight on `s`. */
bool call_is_in_flight(struct call_sink *s, uint32_t id);

/* The client cancelled call `id`: answers it `cancelled` and tears its
 * attempt down at once. Returns -1 when no such call is in flight. */
int call_cancel(struct call_sink *s, uint32_t id);

/* Answers every call of `s` with `code` and tears them down (shutdown). */
void call_fail_all(struct call_sink *s, enum pgw_code code, const char *message);

/* The client is gone: tear every call of `s` down without answering. */
void call_abort_all(struct call_sink *s);

/* gov hooks (see gov.h): a released permit wakes a waiting call (scheduled,
 * never stepped synchronously); breaker transitions are logged. */
void call_on_gov_wake(struct gov_call *g, void *ud);
void call_on_breaker(const struct gov *g, size_t source, enum breaker_state from,
                     enum breaker_state to, double now, void *ud);

/* The task layer's hooks (tasks.h's struct tasks_calls, registered by the
 * process owner). A task stop or watchdog expiry: answers every call of
 * task `t` with `code` (task_stopped / watchdog_timeout) and tears them
 * down at once. */
struct task;
void call_fail_task(struct task *t, enum pgw_code code, const char *message);

/* Task `t` is being freed: its calls forget it. */
void call_forget_task(struct task *t);

/* The sink's write queue drained: resume its paused streams. */
void call_on_drained(struct call_sink *s);

/* Reload (reload.c): every live call moves to the new configuration at
 * one point of the loop. call_uses_source: does some call still name
 * cfg->sources[i] as its last source? call_reconf_prepare allocates each
 * call's notes in the new source order (-1: out of memory, nothing kept);
 * call_reconf_abort undoes it; call_reconf_commit (after gov_reconf_commit,
 * cannot fail) installs them and repoints each call's capability and
 * source into `cfg` (the new one, not yet srv->cfg) by `r`'s index map.
 * Capabilities keep their indices across a reload. */
bool call_uses_source(const struct server *srv, size_t i);
struct gov_reconf;
struct config;
int call_reconf_prepare(struct server *srv, const struct gov_reconf *r);
void call_reconf_abort(struct server *srv);
void call_reconf_commit(struct server *srv, const struct gov_reconf *r, const struct config *cfg);

#endif /* POLYGW_CALL_H */
