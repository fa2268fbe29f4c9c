/*
 * internal.h — declarations shared by the mock upstream's modules:
 *
 *   main.c     CLI, listener, accept (with EMFILE back-off), signals, reaper
 *   conn.c     one client connection: HTTP/1.1 parsing, the writer (trickle,
 *              close_after_bytes, hangs), keep-alive, stream pacing
 *   behave.c   behaviour objects: validation, the script queue, the default
 *   reply.c    response generation: chat (plain + SSE), embeddings, OCR, errors
 *   control.c  /_mock/ endpoints, counters, request history
 *   scan.c     allocation-free reader of plain chat requests (fast path)
 *   buf.c      growable byte buffers and JSON string escaping
 *
 * The mock is a test fixture, not a product: it aborts on out-of-memory
 * (mock_xrealloc) instead of carrying error paths that no test exercises.
 * The scripting interface is documented in README.md beside this file.
 */
#ifndef POLYGW_MOCK_UPSTREAM_INTERNAL_H
#define POLYGW_MOCK_UPSTREAM_INTERNAL_H

#include <ev.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MOCK_MAX_HEAD_BYTES   (64u * 1024u)         /* request line + headers -> 431 */
#define MOCK_MAX_BODY_BYTES   (64u * 1024u * 1024u) /* request body -> 413 */
#define MOCK_PIPELINE_BYTES   (256u * 1024u)        /* read-ahead while answering, then pause */
#define MOCK_MAX_PATHS        64                    /* distinct paths in stats.by_path */
#define MOCK_HISTORY          32                    /* requests kept for /_mock/requests */
#define MOCK_HISTORY_BODY_MAX (1u << 20)            /* body bytes kept per history entry */
#define MOCK_MAX_STATUS       600
#define MOCK_MAX_INTERIM      8 /* 1xx answers before the final one */

/* ---------------------------------------------------------------- buf.c */

/* A growable byte buffer. Zero-initialised = empty. Never NUL-terminated
 * unless the caller adds one. */
struct buf {
    char *p;
    size_t len, cap;
};

/* realloc that aborts on failure (see the file comment). */
void *mock_xrealloc(void *p, size_t n);
/* strndup that aborts on failure. */
char *mock_xstrndup(const char *s, size_t n);

/* Makes room for `extra` more bytes after len. */
void buf_reserve(struct buf *b, size_t extra);
void buf_add(struct buf *b, const void *p, size_t n);
void buf_adds(struct buf *b, const char *s);
void buf_addf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void buf_add_ll(struct buf *b, long long v);
/* Appends s[0..n) as a quoted JSON string. s must be UTF-8 (control
 * characters, quote and backslash are escaped; other bytes pass through). */
void buf_add_json_str(struct buf *b, const char *s, size_t n);
/* The value of one hex digit, or -1. */
int buf_hexval(char ch);
/* Appends the bytes spelled by hex[0..n), digit pairs already validated. */
void buf_add_hex(struct buf *b, const char *hex, size_t n);
/* Frees the storage when it grew beyond keep_cap (a one-off large request
 * must not pin memory forever); otherwise only empties it. */
void buf_trim(struct buf *b, size_t keep_cap);
void buf_fini(struct buf *b);

/* --------------------------------------------------------------- scan.c */

/* What the fast path needs from a plain chat request. Strings point into
 * the body, still JSON-escaped (valid to copy between quotes as is). */
struct scan_chat {
    const char *model; /* NULL when absent */
    size_t model_len;
    const char *echo; /* last string message content, NULL if none */
    size_t echo_len, echo_decoded;
    size_t prompt_bytes; /* decoded bytes of all string contents */
};

/* Returns 0 when body[0..n) is a plain non-streaming chat request that the
 * fast path answers exactly like the jansson path would; -1 otherwise (not
 * an error: the caller falls back to jansson). */
int scan_chat(const char *body, size_t n, struct scan_chat *out);

/* ------------------------------------------------------------- behave.c */

enum behave_hang {
    BEHAVE_HANG_NONE,
    BEHAVE_HANG_ACCEPT,         /* never read the connection */
    BEHAVE_HANG_BEFORE_HEADERS, /* read the request, never answer */
    BEHAVE_HANG_AFTER_HEADERS,  /* send status + headers, then nothing */
};

/* One parsed behaviour object. Strings and objects are borrowed from the
 * json_t it was parsed from, which the owner keeps alive. Numbers are -1
 * when unset unless noted. */
struct behave {
    long long delay_ms; /* 0 = none */
    enum behave_hang hang;
    long long hang_ms;           /* 0 = until the client closes */
    long long trickle_ms;        /* 0 = off */
    long long trickle_bytes;     /* bytes per tick, default 1 */
    int status;                  /* 0 = the normal 200 reply */
    const char *retry_after;     /* NULL = no header */
    char retry_after_buf[40];    /* formatted numeric retry_after */
    long long close_after_bytes; /* -1 = off */
    bool no_length;
    long long stream_events; /* -1 = default */
    long long stream_interval_ms;
    bool no_done;
    const char *body; /* raw body override (hex digits when body_hex) */
    size_t body_len;
    bool body_hex; /* `body_hex`: body is the bytes spelled in hex */
    const char *content_type;
    const char *content; /* reply text override */
    size_t content_len;
    long long content_repeat; /* chat: repeat the text to this many bytes, 0 = off */
    const char *error_message, *error_type;
    json_t *usage;                 /* object or NULL */
    json_t *headers;               /* object of string values or NULL */
    long long dims;                /* embedding dimensions, -1 = default */
    const char *stream_error;      /* Anthropic stream: end with this error event */
    bool usage_if_asked;           /* OpenAI: stream usage only with include_usage */
    bool chunked;                  /* plain answers: Transfer-Encoding: chunked */
    bool connection_close;         /* Connection: close, and close after the answer */
    int interim[MOCK_MAX_INTERIM]; /* 1xx statuses sent before the final head */
    size_t n_interim;
    const char *raw; /* raw_hex: the whole response, hex digits; NULL = off */
    size_t raw_len;
    bool raw_keep;        /* keep the connection after a raw response */
    bool trickle_headers; /* trickle_ms paces the head too */
    bool sse_ids;         /* Responses streams: `id: <sequence_number>` before each event */
    bool stamp;           /* Responses streams: "mock_sent_at" (epoch seconds) in each event */
};

void behave_init(struct behave *b);
/* Validates `obj` as a behaviour object and fills `b` with values borrowed
 * from it. Returns 0, or -1 with a reason in err (b is then reset). */
int behave_parse(struct behave *b, json_t *obj, char *err, size_t errlen);

struct mock;
/* Returns owned: the behaviour for the next API request — the queue head
 * (consumed) or a new reference to the default — or NULL for "normal". */
json_t *behave_take(struct mock *m);
/* True when the next behaviour behave_take() would return has
 * hang == "accept" (checked when a new connection first gets data). */
bool behave_accept_pending(const struct mock *m);

/* --------------------------------------------------------------- conn.c */

enum mock_endpoint {
    EP_CHAT,
    EP_EMBEDDINGS,
    EP_OCR,
    EP_MESSAGES,
    EP_RESPONSES,
    EP_GEMINI,        /* models/M:generateContent */
    EP_GEMINI_STREAM, /* models/M:streamGenerateContent */
    EP_COUNT_TOKENS,  /* models/M:countTokens, /messages/count_tokens */
};

enum conn_state {
    CONN_PEEK,        /* new connection while an accept-hang is scripted */
    CONN_READ,        /* reading / parsing a request */
    CONN_DELAY,       /* answer built, waiting delay_ms */
    CONN_SEND,        /* writing the answer (maybe paced) */
    CONN_HANG,        /* hang before/after headers: read only to see a close */
    CONN_HANG_ACCEPT, /* never reads: polls for the peer's FIN/RST */
    CONN_LINGER,      /* error answer sent, write side shut: drain until EOF */
    CONN_CLOSED,      /* fd closed; memory freed by the reaper */
};

/* SSE generation state of a streaming chat answer. Strings borrowed from
 * the connection's req_json / beh_json. */
struct reply_stream {
    bool active, done;
    bool include_usage; /* OpenAI shape: separate usage chunk */
    bool anthropic;     /* Messages API events instead of chunks */
    bool responses;     /* Responses API events instead of chunks */
    long long seq;      /* Responses: the next event's sequence_number */
    long long events, next;
    long long interval_ms;
    const char *model;
    size_t model_len;
    const char *text;
    size_t text_len;
    unsigned long long id;
    long long created;
    long long prompt_tokens, completion_tokens, total_tokens;
    /* A resumed Responses stream (GET /responses/{id}?stream=true): the
     * response's id as asked ("" = a new stream's resp_mock_<pid>_<id>),
     * and the events with a sequence_number below skip_below (its
     * starting_after + 1; 0 = none) are not sent. */
    char resume_id[128];
    long long skip_below;
};

struct conn {
    struct mock *m;
    struct conn *prev, *next; /* m->conns, or m->dead once closed */
    int fd;
    enum conn_state state;
    ev_io rw, ww;
    ev_timer step_w; /* delay, stream interval, peek retry, hup poll */
    ev_timer trickle_w;
    ev_timer deadline_w; /* hang_ms */
    int peek_tries;

    /* input */
    struct buf in;
    size_t scan;     /* where to resume looking for CRLFCRLF */
    size_t head_len; /* 0 = head not complete yet */
    size_t meth_off, meth_len, target_off, target_len;
    int minor;
    long long content_length; /* -1 = none */
    bool chunked, expect_continue, sent_continue, req_keep_alive;
    struct buf cbody; /* de-chunked request body */
    size_t cpos, crem;
    int cstate;
    bool reading_paused;

    /* current answer */
    struct buf out;
    size_t out_off;
    size_t head_left; /* head bytes at out_off not yet written */
    bool resp_active, head_done, keep_alive, chunked_out;
    size_t body_budget; /* trickle: body bytes allowed until next tick */
    unsigned long long body_written;
    int status;
    struct behave b;
    json_t *beh_json; /* owns b's strings */
    json_t *req_json; /* parsed request body (strings used by stream) */
    struct reply_stream st;
    enum mock_endpoint ep; /* of the current API request */
    struct buf repeated;   /* chat text made by content_repeat (st.text may point here) */

    unsigned long long req_id; /* X-Mock-Request, completion ids */
    bool linger;               /* close via CONN_LINGER (input left unread) */
    bool is_api;               /* carried an API request: in connection counts */
    bool in_progress;          /* counted in stats.in_progress */
};

void conn_new(struct mock *m, int fd);
/* Closes the socket and moves c to the dead list (freed by the reaper, never
 * while one of its callbacks is on the stack). Idempotent. */
void conn_close(struct conn *c, bool by_peer);
void conn_free(struct conn *c);
/* Marks c as having carried an API request (connection counters). */
void conn_mark_api(struct conn *c);
/* The answer in c->out (head_left set) is complete or will be produced by
 * the stream generator: honour delay_ms, then send. May close c. */
void conn_start_response(struct conn *c);
/* hang == before_headers: never answer; close on hang_ms. */
void conn_hang(struct conn *c);

/* -------------------------------------------------------------- reply.c */


/* Answers an API request (counting already done). body is borrowed. */
void reply_api(struct conn *c, enum mock_endpoint ep, const char *body, size_t len);
/* Answers with a fixed body and the default behaviour. */
void reply_simple(struct conn *c, int status, const char *ctype, const char *body, size_t len);
/* OpenAI-style {"error":{...}} answer with the default behaviour. */
void reply_error(struct conn *c, int status, const char *type, const char *msg);
/* A Responses API follow-up of response `id`: GET or DELETE of it (rest
 * ""), POST /cancel, GET /input_items; anything else 404. */
/* GET /responses/{id}?stream=true (query q[0..qlen), without '?'): the
 * response's Responses event stream again, under the API request's
 * behaviour, from after starting_after=N when the query says so. */
void reply_responses_resume(struct conn *c, const char *id, size_t idlen, const char *q,
                            size_t qlen);
void reply_responses_followup(struct conn *c, const char *meth, size_t mlen, const char *id,
                              size_t idlen, const char *rest, size_t rlen);
/* Appends the next SSE step (or all remaining steps) to c->out. */
void reply_stream_fill(struct conn *c, bool all);

/* ------------------------------------------------------------- gemini.c */

/* The answer of a Gemini or token-counting endpoint (c->ep). */
void reply_gemini(struct conn *c, json_t *req, int status, size_t body_len);
const char *reply_reason(int status);

/* ------------------------------------------------------------ control.c */

/* Answers a /_mock/... request. */
void control_handle(struct conn *c, const char *method, size_t mlen, const char *path, size_t plen,
                    const char *body, size_t blen);
/* Copies an API request into the history ring (bounded). */
void control_record(struct mock *m, const char *head, size_t hlen, const char *body, size_t blen);
/* Counts an API request under its path. */
void control_count_path(struct mock *m, const char *path, size_t plen);
void control_fini(struct mock *m);
/* Validates an `auth` object of /_mock/script; 0, or -1 with a reason. */
int control_auth_check(json_t *auth, char *err, size_t errlen);

/* --------------------------------------------------------------- main.c */

struct mock_path_count {
    char *path;
    unsigned long long n;
};

struct mock_record {
    struct buf data; /* head bytes then (maybe truncated) body */
    size_t head_len, body_len, body_total;
};

/* Monotonic counters (zeroed by /_mock/reset) and gauges (never reset). */
struct mock_stats {
    unsigned long long requests;
    unsigned long long accepted;        /* connections that carried an API request */
    unsigned long long closed;          /* of those, closed (either side) */
    unsigned long long closed_by_peer;  /* of those, the client closed first */
    unsigned long long aborted_by_peer; /* ... while its request was unanswered */
    unsigned long long tcp_accepted;    /* every accepted connection */
    unsigned long long control_requests;
    unsigned long long open;        /* gauge: API connections open */
    unsigned long long tcp_open;    /* gauge: all connections open */
    unsigned long long in_progress; /* gauge: API requests not fully answered */
    double last_abort_s;            /* Unix time of the latest aborted_by_peer, 0 = none */
};

struct mock {
    struct ev_loop *loop;
    int lfd;
    ev_io accept_w;
    ev_timer accept_retry_w;
    bool accept_paused_logged;
    ev_signal sigterm_w, sigint_w;
    ev_prepare reap_w;
    struct conn *conns, *dead;
    json_t *queue; /* array of behaviour objects */
    json_t *dflt;  /* object or NULL */
    json_t *auth;  /* the auth every API request must carry, or NULL */
    unsigned long long next_id;
    struct mock_stats st;
    unsigned long long by_status[MOCK_MAX_STATUS];
    struct mock_path_count paths[MOCK_MAX_PATHS];
    size_t npaths;
    unsigned long long paths_overflow;
    struct mock_record hist[MOCK_HISTORY];
    size_t hist_next, hist_count;
    struct buf scratch; /* reused by reply generation */
};

#endif /* POLYGW_MOCK_UPSTREAM_INTERNAL_H */
