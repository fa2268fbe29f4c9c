/*
 * polygw.h — libpolygw, the C client of the polygw sidecar.
 *
 * The sidecar speaks msgpack-RPC over a Unix stream socket (docs/DESIGN.md §4,
 * proto/PROTOCOL.md). This library connects, sends requests, relays stream
 * chunks, and turns every failure into a typed `struct pgw_error`.
 *
 * Model
 *   - One `struct pgw_client` = one connection. It is NOT thread-safe: use it
 *     from one thread at a time. The single exception is pgw_cancel(), which
 *     may be called from any thread while the owning thread is blocked in a
 *     call on the same client (that is what it is for).
 *   - Every function that can block does so only on this client's socket,
 *     only inside the call, and always with a finite timeout (poll()). Zero
 *     timeouts mean "the default from struct pgw_options".
 *   - The library never prints, never exits, installs no signal handler and
 *     never raises SIGPIPE (every send uses MSG_NOSIGNAL). It does not retry:
 *     retry policy belongs to the sidecar, and to the caller when the sidecar
 *     says "retry later" (pgw_error_is_retry_later()).
 *   - Several requests may be in flight on one connection (pgw_send_request /
 *     pgw_wait_response). Responses that arrive for other requests while one
 *     is awaited are buffered; chunk notifications are delivered as they
 *     arrive to the chunk handler of the request they belong to.
 *
 * Callbacks (pgw_chunk_fn, pgw_start_fn) run on the calling thread, inside
 * whichever blocking function of this client is reading the socket at the
 * time — for a pipelined client that may be the wait for another request.
 * (Elsewhere in polygw callbacks never run inside the registering call; a
 * blocking client cannot honour that for streaming, so the rule here is the
 * weaker one below.) From a callback you may call pgw_cancel(),
 * pgw_set_chunk_handler(), pgw_is_broken(), pgw_in_flight() and the pure
 * helpers (pgw_object_*, pgw_result_*, pgw_error_*); every other function
 * of the same client returns PGW_E_INVALID (pgw_close() must not be called).
 * Objects passed to a callback are borrowed for the duration of the call.
 *
 * Return values: 0 on success or a negative PGW_E_* code. When `err` is not
 * NULL it is always filled (cleared to code PGW_OK on success), so callers
 * may ignore the return value's detail and read `err`.
 *
 * Link: pkg-config --cflags --libs polygw (needs msgpack-c and jansson).
 */
#ifndef POLYGW_H
#define POLYGW_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codes.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where pgw_connect() looks when given no path and $POLYGW_SOCKET is unset. */
#define PGW_DEFAULT_SOCKET "/run/polygw/polygw.sock"

/* Client-local codes. Return values are always one of these (or 0); the
 * detailed code is in struct pgw_error.code, which holds either an
 * enum pgw_code (>= 0, reported by the sidecar) or one of these (< 0, found
 * by the library). PGW_E_REMOTE is only ever a return value. */
enum pgw_local_code {
    PGW_E_REMOTE = -1,   /* the sidecar reported an error: err->code is its enum pgw_code
                            (an error response, or a fatal `error` notification that also
                            broke the connection — see pgw_is_broken()) */
    PGW_E_IO = -2,       /* read/write failed, or the sidecar closed the connection */
    PGW_E_TIMEOUT = -3,  /* no answer within the timeout; the connection stays usable
                            (unless a request was left half-written: then it is broken) */
    PGW_E_PROTOCOL = -4, /* the sidecar sent something that is not msgpack-RPC, or a
                            frame over max_message_bytes; the connection is broken */
    PGW_E_CONNECT = -5,  /* socket path too long, no such socket, refused, ... */
    PGW_E_NOMEM = -6,    /* allocation failed */
    PGW_E_INVALID = -7,  /* bad argument: NULL/empty name, malformed JSON or msgpack,
                            unknown msgid, or a call that is not allowed from a callback */
    PGW_E_CLOSED = -8,   /* the connection broke earlier (the message says why):
                            pgw_close() it and connect again */
};

/* A typed failure. Plain data: copy it freely, nothing to release. */
struct pgw_error {
    int code;             /* PGW_OK (0), an enum pgw_code (> 0), or a PGW_E_* (< 0) */
    char code_name[48];   /* wire name ("stalled") or local name ("timeout"); a code
                              this library does not know keeps its wire name here while
                              `code` is PGW_INTERNAL */
    char message[512];    /* human text, NUL-terminated, may be truncated */
    double retry_after_s; /* seconds the sidecar suggests waiting; < 0 when absent */
    int attempts;         /* upstream attempts the call made; 0 when absent */
    double stalled_s;     /* seconds charged to the stall budget; < 0 when absent */
    int status;           /* upstream HTTP status (upstream_rejected), else 0 */
};

/* Connection options. Zero-initialise and set what you need: every zero
 * field means its default. */
struct pgw_options {
    double connect_timeout_s; /* bound on connect(); default 5 */
    double request_timeout_s; /* default wait for pgw_request/ping/stats/wait and bound
                                  on writes and pgw_cancel; default 30 */
    double call_timeout_s;    /* default wait for pgw_call/pgw_send_call; default 3600 —
                                  a safety net: the sidecar enforces the real deadlines */
    size_t max_message_bytes; /* largest frame accepted from the sidecar; default 64 MiB */
};

/* Chunk handler: receives each `event` map of a streaming call, in order, as
 * it arrives. `event` is borrowed until the handler returns (copy what you
 * keep). Return 0 to go on, non-zero to cancel the call: the library then
 * sends `cancel` once, stops calling the handler for this request, and the
 * call still ends with the sidecar's final response (usually `cancelled`,
 * or the result if it won the race). */
typedef int pgw_chunk_fn(const msgpack_object *event, void *ud);

/* Start handler: called once by pgw_call() right after the request is
 * written, with its msgid — the handle for pgw_cancel() from another thread. */
typedef void pgw_start_fn(uint32_t msgid, void *ud);

/* Options of one `call`. Zero-initialise; zero/NULL fields are absent. */
struct pgw_call_options {
    bool stream;            /* ask for [2,"chunk",[msgid,event]] notifications */
    const char *scope;      /* progress scope; NULL: the capability's own */
    const char *task_id;    /* task the call belongs to; NULL: none */
    double deadline_s;      /* sidecar-side bound on the whole call, seconds; 0: none */
    double timeout_s;       /* client-side wait; 0: pgw_options.call_timeout_s */
    pgw_chunk_fn *on_chunk; /* NULL: chunks are discarded */
    pgw_start_fn *on_start; /* pgw_call() only; NULL: not called */
    void *ud;               /* passed to both callbacks */
    const char *model;      /* the model to ask for (the `model` parameter);
                             * NULL: the body's own */
    /* The caller's W3C trace context (the `trace` parameter): the sidecar's
     * call span becomes the child of `traceparent`'s span. NULL: none. */
    const char *traceparent;
    const char *tracestate;
};

struct pgw_client; /* opaque: one connection */
struct pgw_result; /* opaque: one owned response */

/* --- errors ----------------------------------------------------------- */

/* The version of this library ("0.1.0"). Static string. */
const char *pgw_version(void);

/* Name of any code: wire names for enum pgw_code values, and "remote",
 * "io_error", "timeout", "protocol_error", "connect_failed",
 * "out_of_memory", "invalid_argument", "connection_closed" for PGW_E_*.
 * Never NULL; static string. */
const char *pgw_error_code_name(int code);

/* True when the sidecar said "this scope cannot serve now, retry later"
 * (stalled, retry_exhausted, backend_unavailable, overloaded,
 * shutting_down); err->retry_after_s then says when, if known. False for
 * NULL, success, and all client-local codes. */
bool pgw_error_is_retry_later(const struct pgw_error *err);

/* --- connection ------------------------------------------------------- */

/* Connects to the sidecar at `socket_path` (NULL or "": $POLYGW_SOCKET, then
 * PGW_DEFAULT_SOCKET). `opt` is borrowed (may be NULL: all defaults).
 * On success *out is a new client, owned by the caller (pgw_close()); on
 * failure *out is NULL. Returns 0, PGW_E_CONNECT (path too long, missing,
 * refused, or the listen backlog stayed full for connect_timeout_s),
 * PGW_E_INVALID (negative/NaN option) or PGW_E_NOMEM. No traffic is sent. */
int pgw_connect(const char *socket_path, const struct pgw_options *opt, struct pgw_client **out,
                struct pgw_error *err);

/* Closes the connection and frees the client, buffered responses and all.
 * Requests still in flight are simply abandoned (the sidecar sees the
 * connection close). NULL is a no-op. Not from a callback. */
void pgw_close(struct pgw_client *c);

/* True once the connection is unusable (fatal error notification, EOF, I/O
 * or protocol error, half-written request). Buffered responses can still be
 * collected; new requests fail with PGW_E_CLOSED. */
bool pgw_is_broken(const struct pgw_client *c);

/* Requests sent and neither answered-and-collected nor forgotten. */
size_t pgw_in_flight(const struct pgw_client *c);

/* --- one request, one answer ----------------------------------------- */

/* Sends [0, msgid, method, params] and waits for its response.
 *   method       non-empty string, borrowed.
 *   params       a complete pre-packed msgpack ARRAY of `params_len` bytes
 *                (normally [map]); borrowed; NULL means []. Anything else is
 *                rejected with PGW_E_INVALID before sending.
 *   timeout_s    wait bound (send + answer); 0: request_timeout_s
 *                (call_timeout_s when method is "call").
 *   out          may be NULL. On return *out is NULL or an owned result —
 *                release it with pgw_result_free() WHATEVER the return value:
 *                on success it holds the result; on PGW_E_REMOTE it holds the
 *                sidecar's whole error map (pgw_result_is_error() is true), so
 *                fields beyond struct pgw_error (per-source reasons, the
 *                upstream body) stay reachable — NULL when the error came as
 *                a fatal `error` notification (pgw_is_broken() is then true).
 * Returns 0, PGW_E_REMOTE, or a local code. On PGW_E_TIMEOUT the request is
 * forgotten: its late answer is discarded (and a "call" is also cancelled,
 * as in pgw_call()). Chunks for this request (if the
 * method streams) are discarded; use pgw_call() or pgw_send_request() +
 * pgw_set_chunk_handler() to receive them. */
int pgw_request(struct pgw_client *c, const char *method, const void *params, size_t params_len,
                double timeout_s, struct pgw_result **out, struct pgw_error *err);

/* `ping`. Copies the sidecar's version into `version` (cap `vlen` bytes,
 * truncated, NUL-terminated; may be NULL) and its uptime in seconds into
 * *uptime_s (may be NULL; -1 when absent). timeout_s as pgw_request().
 * Returns as pgw_request(); PGW_E_PROTOCOL when the result is not a map. */
int pgw_ping(struct pgw_client *c, double timeout_s, char *version, size_t vlen, double *uptime_s,
             struct pgw_error *err);

/* `stats`: *out as pgw_request() (the result is a map of nested maps). */
int pgw_stats(struct pgw_client *c, double timeout_s, struct pgw_result **out,
              struct pgw_error *err);

/* `call`: sends {capability, body, stream?, scope?, task_id?, deadline_s?}
 * and waits for the final response.
 *   capability   non-empty, borrowed.
 *   body_json    JSON object text (the upstream request), borrowed;
 *                transcoded to a msgpack map. Not an object, or invalid
 *                JSON: PGW_E_INVALID, nothing sent.
 *   opt          borrowed, may be NULL (non-streaming, defaults). When
 *                opt->stream, opt->on_chunk receives every event as it
 *                arrives, before this function returns; opt->on_start gets
 *                the msgid first.
 *   out          as pgw_request(): the result map {body, source, attempts,
 *                elapsed_s, stalled_s, usage?} (no body when streaming).
 * On PGW_E_TIMEOUT the library also sends `cancel`, so the sidecar releases
 * the call's permits, and discards the late answer. */
int pgw_call(struct pgw_client *c, const char *capability, const char *body_json,
             const struct pgw_call_options *opt, struct pgw_result **out, struct pgw_error *err);

/* --- pipelining ------------------------------------------------------- */

/* Writes a request without waiting; *msgid receives its id (unique among
 * this client's requests in flight). Arguments as pgw_request(); the write
 * is bounded by request_timeout_s. Returns 0 or a local code (never
 * PGW_E_REMOTE). Collect the answer with pgw_wait_response() /
 * pgw_wait_any(), or drop it with pgw_forget(). */
int pgw_send_request(struct pgw_client *c, const char *method, const void *params,
                     size_t params_len, uint32_t *msgid, struct pgw_error *err);

/* pgw_call() without the wait: writes the call (bounded by opt->timeout_s or
 * call_timeout_s), registers opt->on_chunk for it (opt->on_start is not used:
 * the msgid is returned). Returns 0 or a local code. */
int pgw_send_call(struct pgw_client *c, const char *capability, const char *body_json,
                  const struct pgw_call_options *opt, uint32_t *msgid, struct pgw_error *err);

/* Sets (fn != NULL) or clears the chunk handler of request `msgid`, which
 * must be in flight. Chunks that arrived before it was set were discarded.
 * Returns 0 or PGW_E_INVALID. Callable from callbacks. */
int pgw_set_chunk_handler(struct pgw_client *c, uint32_t msgid, pgw_chunk_fn *fn, void *ud);

/* Waits for the response to `msgid` (returned by a pgw_send_* of this
 * client), buffering responses to other requests and delivering chunks.
 *   timeout_s   0: the request's default (call_timeout_s for method "call",
 *               else request_timeout_s).
 *   out         as pgw_request().
 * Returns 0, PGW_E_REMOTE, or a local code. On PGW_E_TIMEOUT the request
 * stays in flight (wait again, pgw_cancel() it, or pgw_forget() it); on any
 * other outcome it is finished. If the connection broke, requests in flight
 * fail with the error that broke it (a fatal notification's code, IO, ...).
 * PGW_E_INVALID for an unknown msgid. */
int pgw_wait_response(struct pgw_client *c, uint32_t msgid, double timeout_s,
                      struct pgw_result **out, struct pgw_error *err);

/* Waits for whichever request in flight finishes first (responses already
 * buffered are returned in arrival order) and sets *msgid to it; otherwise
 * as pgw_wait_response(). timeout_s 0: the longest default among the
 * requests in flight. PGW_E_INVALID when nothing is in flight. On a broken
 * connection each call finishes one request in flight with the breaking
 * error, so `while (pgw_in_flight(c)) pgw_wait_any(...)` terminates. */
int pgw_wait_any(struct pgw_client *c, double timeout_s, uint32_t *msgid, struct pgw_result **out,
                 struct pgw_error *err);

/* Abandons request `msgid` without telling the sidecar: its buffered or
 * late answer and its chunks are discarded. Returns 0 or PGW_E_INVALID. */
int pgw_forget(struct pgw_client *c, uint32_t msgid);

/* Sends the notification [2, "cancel", [msgid]]: the sidecar ends that call
 * with `cancelled` (its final response still arrives and must be collected
 * or forgotten as usual). Does not read and does not touch the request
 * table, so it may be called from a callback or from ANOTHER THREAD while
 * the owner thread is blocked in this client (the write is serialised with
 * the owner's writes; it waits at most request_timeout_s). Returns 0,
 * PGW_E_CLOSED, PGW_E_IO or PGW_E_TIMEOUT. Cancelling an msgid that is not
 * (or no longer) in flight is harmless. */
int pgw_cancel(struct pgw_client *c, uint32_t msgid, struct pgw_error *err);

/* --- tasks (docs/DESIGN.md §3.5, PROTOCOL.md §4.4) ------------------------ *
 *
 * A task is a unit of client work (an agent run, a pipeline) named by a
 * client-chosen task_id. The sidecar keeps its state; the client marks
 * node boundaries and checks the state there:
 *
 *     pgw_task_start(c, "run-42", NULL, &err);
 *     for each step:
 *         rc = pgw_task_node(c, "run-42", "summarise", 0, step_fn, &step, &err);
 *         if (rc < 0) break;       // task_stopped / watchdog_timeout: stop the work
 *     pgw_task_finish(c, "run-42", rc == 0, rc == 0 ? NULL : err.message, &err);
 *
 * and names the task in its calls (pgw_call_options.task_id), so that a
 * `task.stop` or a watchdog expiry ends those calls at once with
 * task_stopped / watchdog_timeout.
 *
 * Every function below sends one request (pgw_task_node: up to three) and
 * waits at most request_timeout_s for each answer. They validate their
 * arguments first (PGW_E_INVALID, nothing sent: NULL or empty task_id or
 * node, NULL reason, a NaN/infinite timeout) and return 0, PGW_E_REMOTE
 * (err->code is the sidecar's code), or a local code, like pgw_request().
 * Sidecar codes to expect:
 *   task_stopped       the task was stopped (task.stop), or is not running;
 *                      err->message carries the reason
 *   watchdog_timeout   the watchdog failed the task (a node overran)
 *   bad_request        unknown or expired task_id (or a bad parameter)
 *   unknown_method     the sidecar predates tasks: err->message then reads
 *                      "tasks are not supported by this sidecar (...)"
 * Strings are borrowed; not callable from a pgw callback (PGW_E_INVALID). */

/* A task's state, parsed from the sidecar's task map by
 * pgw_task_from_object(). Plain data. Strings are NUL-terminated and cut
 * at a UTF-8 boundary when longer than their buffer (the sidecar bounds
 * ids and node names to 128 bytes and reasons to 512). */
enum pgw_task_state {
    PGW_TASK_STATE_OTHER = 0, /* a state this library does not know: see state_name */
    PGW_TASK_RUNNING,
    PGW_TASK_SUCCEEDED,
    PGW_TASK_FAILED,
};

struct pgw_task {
    char task_id[129];
    enum pgw_task_state state;
    char state_name[24];  /* wire name: "running", "succeeded", "failed", ... */
    char reason_kind[24]; /* why it failed: "stopped", "watchdog", "error"; "" when absent */
    char reason[513];     /* "" when absent */
    char node[129];       /* the node in progress; "" when none */
    double started_at;    /* Unix seconds of the current run; -1 when absent */
    double updated_at;    /* Unix seconds of the last state change; -1 when absent */
    int64_t runs;         /* how many times the id was started; -1 when absent */
};

/* Fills *task from a task map (the result of pgw_task_start/get, or one
 * element of task.list's `tasks`). Borrows `o`. Keys this library does not
 * know are ignored. Returns false (and *task cleared) when `o` is not a
 * map or lacks a string task_id or state; NULL arguments are false. */
bool pgw_task_from_object(const msgpack_object *o, struct pgw_task *task);

/* `task.start {task_id}`: marks the task running. A running task is
 * returned unchanged; a succeeded or failed/error one starts a new run
 * (`runs` + 1); a stopped or watchdog-failed one is refused with
 * task_stopped / watchdog_timeout, so a worker that missed a stop cannot
 * undo it. `out` as pgw_request(): on success the task map (parse it with
 * pgw_task_from_object()); may be NULL. */
int pgw_task_start(struct pgw_client *c, const char *task_id, struct pgw_result **out,
                   struct pgw_error *err);

/* pgw_task_start() with the caller's W3C `traceparent` (NULL: none, as
 * pgw_task_start()): with tracing on, the run's trace is its child, and the
 * run's calls without a traceparent of their own join it (docs/OPERATIONS.md
 * section 7, "Tasks"). A malformed one is ignored by the sidecar. */
int pgw_task_start_traced(struct pgw_client *c, const char *task_id, const char *traceparent,
                          struct pgw_result **out, struct pgw_error *err);

/* `task.stop {task_id, reason}`: fails a running task with reason_kind
 * "stopped" and `reason` (non-NULL; "" allowed), and the sidecar ends the
 * task's calls in flight with task_stopped. A task that is not running is
 * refused and unchanged: task_stopped (stopped before: the first reason
 * stays), watchdog_timeout, or bad_request (finished, or unknown). Read
 * the task back with pgw_task_get(). */
int pgw_task_stop(struct pgw_client *c, const char *task_id, const char *reason,
                  struct pgw_error *err);

/* `task.guard {task_id}`: 0 when the task is running; otherwise
 * PGW_E_REMOTE with err->code PGW_TASK_STOPPED or PGW_WATCHDOG_TIMEOUT
 * and the reason in err->message. Call it at safe points (node
 * boundaries), where stopping leaves your own state consistent. */
int pgw_task_guard(struct pgw_client *c, const char *task_id, struct pgw_error *err);

/* `task.node_begin {task_id, node, timeout_s?}`: arms the watchdog for
 * `node`. timeout_s > 0 is the node's deadline in seconds; <= 0 sends no
 * timeout and the sidecar picks it (3 × the node name's recent p99 once it
 * has enough samples, else its node_timeout_s). *armed_timeout_s (may be
 * NULL) receives the deadline actually armed, -1 when unknown. Beginning a
 * node while another is in progress replaces it (nodes do not nest). */
int pgw_task_node_begin(struct pgw_client *c, const char *task_id, const char *node,
                        double timeout_s, double *armed_timeout_s, struct pgw_error *err);

/* `task.node_end {task_id, node}`: disarms the watchdog for `node`; the
 * node's duration feeds the learned timeout of its name. */
int pgw_task_node_end(struct pgw_client *c, const char *task_id, const char *node,
                      struct pgw_error *err);

/* `task.finish {task_id, ok, reason?}`: the running task succeeded (ok) or
 * failed (reason_kind "error"); `reason` may be NULL (not sent). Refused
 * like pgw_task_stop() when the task is not running. */
int pgw_task_finish(struct pgw_client *c, const char *task_id, bool ok, const char *reason,
                    struct pgw_error *err);

/* `task.get {task_id}`: `out` as pgw_task_start(). */
int pgw_task_get(struct pgw_client *c, const char *task_id, struct pgw_result **out,
                 struct pgw_error *err);

/* `task.list {state?}`: `state` NULL for all tasks, else "running",
 * "succeeded" or "failed" (sent as given; the sidecar judges it). `out` as
 * pgw_request(): on success a map whose `tasks` is an array of task maps. */
int pgw_task_list(struct pgw_client *c, const char *state, struct pgw_result **out,
                  struct pgw_error *err);

/* The work of a node scope. `err` is never NULL and is cleared before the
 * call: return 0 on success, or a non-zero code of your choice and describe
 * the failure in `err` (passing `err` to a pgw_* call does both). */
typedef int pgw_task_node_fn(void *ud, struct pgw_error *err);

/* A node scope, the C analogue of Python's `with task.node(...)`:
 *   1. pgw_task_guard(task_id): a stopped task runs no further node;
 *   2. pgw_task_node_begin(task_id, node, timeout_s, NULL);
 *   3. fn(ud, err) — unlike the callbacks above, fn runs with nothing of
 *      this scope in flight, so it may use `c` freely (pgw_call with
 *      .task_id = task_id is the point); it must not pgw_close(c);
 *   4. pgw_task_node_end(task_id, node) — also when fn failed, except when
 *      fn's error is task_stopped / watchdog_timeout (the node is over on
 *      the sidecar's side) or the connection is broken.
 * Returns the first failure and leaves its description in `err`: 1 or 2's
 * (fn is then not called), else fn's return value and error, else 4's.
 * So a stop while fn's call is in flight surfaces as fn's pgw_call
 * failing with task_stopped. `fn` must not be NULL (PGW_E_INVALID). */
int pgw_task_node(struct pgw_client *c, const char *task_id, const char *node, double timeout_s,
                  pgw_task_node_fn *fn, void *ud, struct pgw_error *err);

/* --- results and msgpack/JSON helpers -------------------------------- */

/* The result object (or, when pgw_result_is_error(), the error map).
 * Borrowed: valid until pgw_result_free(r). */
const msgpack_object *pgw_result_object(const struct pgw_result *r);

/* True when `r` holds an error map rather than a result. */
bool pgw_result_is_error(const struct pgw_result *r);

/* The msgid `r` answered. */
uint32_t pgw_result_msgid(const struct pgw_result *r);

/* Frees a result and everything borrowed from it. NULL is a no-op. */
void pgw_result_free(struct pgw_result *r);

/* Looks `key` up in a map with string keys; NULL when `map` is NULL, not a
 * map, or lacks the key. Borrows. */
const msgpack_object *pgw_object_get(const msgpack_object *map, const char *key);

/* Reads an integer or float object as double. False (and *v untouched)
 * when `o` is NULL or not a number. */
bool pgw_object_number(const msgpack_object *o, double *v);

enum {
    PGW_JSON_PRETTY = 1 << 0, /* two-space indentation, one member per line */
};

/* Renders `o` as JSON text. Returns an owned NUL-terminated string (free()
 * it), or NULL when out of memory. Lossless where JSON allows: integers
 * keep all 64 bits, floats print the shortest text that reads back
 * exactly (always with a '.' or exponent), map order and duplicate keys are
 * kept. Where JSON cannot say it: NaN/±inf → null, invalid UTF-8 → U+FFFD,
 * bin → base64 string, ext → {"ext": type, "data": base64}, a non-string
 * map key → the string of its JSON text. */
char *pgw_object_to_json(const msgpack_object *o, int flags);

/* Transcodes JSON text (any JSON value; `len` bytes, or strlen(json) when
 * len is (size_t)-1) to msgpack: objects → maps (member order kept),
 * integers → int, reals → float64, \u0000 allowed inside strings.
 * On success *out is an owned buffer of *out_len bytes (free() it).
 * Returns 0, PGW_E_INVALID (with line/column in err) or PGW_E_NOMEM. */
int pgw_json_to_msgpack(const char *json, size_t len, void **out, size_t *out_len,
                        struct pgw_error *err);

#ifdef __cplusplus
}
#endif

#endif /* POLYGW_H */
