/*
 * calltrace.h — a call's spans (trace/trace.h): what call.c tells at a
 * few points of a call's life becomes one call span (kind SERVER, the root
 * of polygw's work, under the caller's traceparent) with one child per
 * attempt (kind CLIENT), the GenAI semantic conventions' attributes and
 * polygw's own, and events for every wait and verdict with their
 * durations. docs/OPERATIONS.md (Tracing) lists every attribute and event.
 *
 * Nothing of a body, a key or a header value is ever given to a span: only
 * names (capability, source, app, model), numbers, codes and reasons.
 *
 * Embedded in a call, zeroed; every function is a no-op for a call that
 * is not traced (tracing off, or not sampled), but for the trace context
 * an unsampled call still passes upstream.
 */
#ifndef POLYGW_CALLTRACE_H
#define POLYGW_CALLTRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codes.h"
#include "trace/trace.h"

struct gov_call;
struct attempt_result;
struct dialect_usage;
struct config_source;

struct calltrace {
    struct span *call, *attempt;
    const char *wait; /* static: the open wait's event name; NULL: none */
    double wait_from;
    const char *wait_reason; /* static, or NULL */
    const char *last_source;
    char op[64];          /* gen_ai.operation.name, of the call and of each attempt */
    char model[128];      /* the model asked for, "" = none */
    char resp_model[128]; /* the model the current attempt's answer names, "" = none */
    char call_model[128]; /* ... the last successful attempt's (the call span's) */
    /* Sent with the attempt: "traceparent: ...", and "
tracestate: ..."
     * when the call has one (the caller's, or its task run's). */
    char tp_line[13 + 55 + 14 + 256 + 1];
    /* A call the sampler left out: the context its attempts pass on
     * (quiet.valid), each with a span id of its own. */
    struct tracer *tracer;
    struct trace_ctx quiet;
    uint64_t breaker_told; /* sources (index < 64) whose open breaker was told */
};

/* What call_begin knows of the call (all borrowed for the call only). */
struct calltrace_start {
    const char *traceparent, *tracestate; /* the caller's, or NULL */
    const char *task_trace;      /* the call's task's trace (its task.start span), or NULL: the
                             * parent when the caller sent no valid traceparent */
    const char *task_tracestate; /* ... and its tracestate, or NULL */
    const char *capability, *app, *task_id;
    const char *model; /* model_len bytes, NULL = none */
    size_t model_len;
    bool stream, http; /* http: the HTTP front (else msgpack) */
};

void calltrace_begin(struct calltrace *ct, struct tracer *t, const struct calltrace_start *s,
                     double now);

/* The governed loop decided to wait (`last`: the attempt that just ended,
 * or NULL). Opens a wait event, closed (with its duration) by the next
 * attempt or the call's end. */
void calltrace_wait(struct calltrace *ct, const struct gov_call *g,
                    const struct attempt_result *last, double now);

/* An attempt starts on `src` (asking for its model, else the call's): the
 * wait ends, a change of source is a failover, and the attempt's span
 * begins; each source of the call's that its open breaker kept out is told
 * once (polygw.breaker_skip). Returns the attempt's "traceparent: ..." header line,
 * with a "tracestate: ..." line after it (CRLF between) when the call has
 * one (in ct, until the next attempt), or NULL when tracing is off. A call the sampler
 * left out records nothing but still passes its trace on: the caller's
 * trace id (or a new one), a new span id, flagged not sampled. */
const char *calltrace_attempt(struct calltrace *ct, const struct gov_call *g,
                              const struct config_source *src, double now);

/* A JSON reply or stream event of the current attempt (`p`, `len`
 * bytes): its top-level `model` (OpenAI, Anthropic), `modelVersion`
 * (Gemini), or the `model` of its `message` (Anthropic's message_start) or
 * `response` (the Responses API's events) becomes the attempt's
 * gen_ai.response.model. Read until one is found; nothing else of the
 * JSON is kept. */
void calltrace_response_model(struct calltrace *ct, const char *p, size_t len);

/* The attempt ended with `r`; `u` its token counts (may be NULL). */
void calltrace_attempt_end(struct calltrace *ct, const struct attempt_result *r,
                           const struct dialect_usage *u, double now);

/* A verdict from outside the loop: "polygw.cancel", "polygw.task_stop",
 * "polygw.watchdog" (static names), with a reason (copied; may be NULL). */
void calltrace_note(struct calltrace *ct, const char *event, const char *reason, double now);

/* The call ended with `code` (PGW_CANCELLED: unanswered too), its answer
 * costing `cost` (NAN: unknown): ends the spans. */
void calltrace_end(struct calltrace *ct, enum pgw_code code, const char *source, uint32_t attempts,
                   double stalled_s, double cost, double now);

#endif /* POLYGW_CALLTRACE_H */
