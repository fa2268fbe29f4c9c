/*
 * reply.h — an error answer as a C struct, rendered by each front.
 *
 * The call engine and the task methods describe an error once (struct
 * reply_error); the msgpack-RPC front writes it as the error object of a
 * response ({code, message, ...}, PROTOCOL.md §6.1), the HTTP front as an
 * OpenAI-shaped error whose "polygw" member holds the same fields, and
 * reads the few it turns into headers (Retry-After, X-Polygw-Attempts...)
 * from the struct itself. Every pointer is borrowed for the call that
 * hands the struct over.
 */
#ifndef POLYGW_REPLY_H
#define POLYGW_REPLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codes.h"
#include "writer.h"

struct reply_error;

/* Writes the fields after the standard ones (e->n_more pairs). */
typedef void reply_more_fn(struct writer *w, const struct reply_error *e);

struct reply_error {
    enum pgw_code code;
    const char *message; /* text: repaired to UTF-8 when written */
    /* Optional fields, written in this order after code and message. */
    const char *app; /* NULL: absent */
    bool has_attempts;
    uint32_t attempts;
    double stalled_s;     /* < 0: absent */
    double retry_after_s; /* < 0: absent */
    int status;           /* an upstream's HTTP status; 0: absent */
    /* An upstream's answer to a rejected request, secrets scrubbed: JSON
     * text (upstream_body_json: valid JSON, relayed as it is) or valid
     * UTF-8 text. NULL: absent. */
    const char *upstream_body;
    size_t upstream_body_len;
    bool upstream_body_json;
    const char *reason;      /* text a client chose; NULL: absent */
    const char *reason_kind; /* NULL: absent */
    uint32_t n_more;
    reply_more_fn *write_more;
    const void *ud; /* for write_more */
};

/* A reply_error with only code and message. */
#define REPLY_ERROR(c, msg) \
    ((struct reply_error){ .code = (c), .message = (msg), .stalled_s = -1, .retry_after_s = -1 })

/* A reply handle: where the answers of one front's connection go
 * (embedded in it, like the call engine's sink). A handler answers request
 * `id` exactly once: result_begin returns the writer for the success value
 * and result_end completes it, or error completes it with an error. */
struct reply_outlet;
struct server;
struct tasks_req;
struct cacheops_wait;

struct reply_outlet_ops {
    struct writer *(*result_begin)(struct reply_outlet *o, uint32_t id);
    void (*result_end)(struct reply_outlet *o, uint32_t id);
    void (*error)(struct reply_outlet *o, uint32_t id, const struct reply_error *e);
    /* Optional: `delta` requests (+1 or -1) now wait, or no longer wait,
     * for the state backend. */
    void (*waiting)(struct reply_outlet *o, int delta);
    /* Optional: an answer was written from the event loop (not inside the
     * handler's call): send it. */
    void (*flush)(struct reply_outlet *o);
};

struct reply_outlet {
    const struct reply_outlet_ops *ops;
    struct server *srv;
    struct tasks_req *waiting;    /* task requests waiting for the backend (call/tasks.c) */
    struct cacheops_wait *purges; /* cache purges waiting for it (ops/cacheops.c) */
    struct writer w;              /* what result_begin hands out */
};

/* The number of optional pairs reply_error_write_fields writes; `app`,
 * when not NULL, replaces e->app (and is written even when e->app is
 * absent). */
uint32_t reply_error_n_fields(const struct reply_error *e, const char *app);
void reply_error_write_fields(struct writer *w, const struct reply_error *e, const char *app);

/* The whole error object: {code, message, <fields>}. */
void reply_error_write(struct writer *w, const struct reply_error *e);

#endif /* POLYGW_REPLY_H */
