/*
 * trace.h — OpenTelemetry spans and their export over OTLP/HTTP
 * (protobuf), from the event loop, never blocking it.
 *
 * A tracer records spans (a trace id, a span id, a parent, a name, a kind,
 * start and end times, attributes, events, a link, a status) and exports
 * the ended ones in batches. What it holds is bounded whatever the
 * receiver does:
 *
 *   span_end --> queue (at most max_queue_spans; a span ended into a
 *                full queue is dropped and counted: dropped_queue)
 *   every export_interval_s, or as soon as max_batch_spans are queued:
 *   queue --> one batch (at most max_batch_spans) --> encoded (otlp.h) -->
 *   one POST in flight at a time, on the upstream engine (upstream.h), with
 *   its own deadlines (timeout_s; nothing waits for a receiver that never
 *   answers). 2xx: exported. 429, 502, 503, 504, no answer or a timeout:
 *   the same bytes again after a backoff (1 s doubling, at most 30 s, or
 *   the receiver's Retry-After up to 60 s) at most max_retries times, then
 *   the batch is dropped (dropped_export); any other answer drops it at
 *   once. While a batch waits the queue keeps filling and drops at its
 *   bound: memory is queue + one batch.
 *
 * Sampling (the sampler decides once, at a trace's first polygw span): a
 * span whose parent context is sampled (or not) follows it when the
 * sampler is parent-based (the default); otherwise the trace id decides
 * as OpenTelemetry's TraceIdRatioBased does (trace_ratio_sampled). An unsampled span is
 * NULL: every span_* function accepts NULL and does nothing, so callers
 * never test for it; span_start_ctx also gives the context an unsampled
 * span passes on (its trace, flagged not sampled).
 *
 * Content: the tracer copies only what its callers give it; they give no
 * body text, key or header value (call/calltrace.c). Strings are cut at
 * TRACE_STR_MAX bytes, a span keeps at most TRACE_ATTRS_MAX attributes and
 * TRACE_EVENTS_MAX events (more are counted as dropped in the span: of
 * events, the middle ones, the latest TRACE_EVENTS_TAIL kept).
 *
 * Everything runs on the loop thread; nothing here is called from a
 * libcurl callback.
 */
#ifndef POLYGW_TRACE_H
#define POLYGW_TRACE_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trace/span.h" /* the limits, kinds and value types */

struct upstream;
struct config_tracing;
struct tracer;
struct span;


/* The W3C trace context a caller sent (traceparent, tracestate). */
struct trace_ctx {
    uint8_t trace_id[16];
    uint8_t span_id[8];
    uint8_t flags;   /* bit 0: sampled */
    bool valid;      /* a well-formed traceparent was given */
    bool own;        /* polygw's own context (a task's trace): always the parent, whatever
                      * tracing.parent says (set by the caller after parsing) */
    char state[257]; /* tracestate as given ("" = none; longer ones are dropped) */
};

/* Parses `traceparent` (NUL-terminated, may be NULL) and `tracestate`
 * (may be NULL) into *c. Version 00's form, and any later version's first
 * four fields: "VV-<32 hex>-<16 hex>-FF", lower-case hex, ids not all zero,
 * version not ff. Returns 0, or -1 when traceparent is absent or malformed
 * (c->valid false: the call starts a new trace, as the W3C rules say). */
int trace_ctx_parse(struct trace_ctx *c, const char *traceparent, const char *tracestate);


/* The ratio sampler's decision for `trace_id` (16 bytes): its last 8
 * bytes, big-endian, shifted right by one, below `bound` =
 * trace_ratio_bound(ratio) (ratio x 2^63), as the OpenTelemetry SDKs
 * decide; ratio >= 1 samples every id, <= 0 none. */
uint64_t trace_ratio_bound(double ratio);
bool trace_ratio_sampled(double ratio, uint64_t bound, const uint8_t *trace_id);

/* One attribute as a caller passes it: `key` must be static (it is kept as
 * a pointer); a string value is copied. */
struct trace_kv {
    const char *key;
    enum trace_val_type type;
    const char *s; /* TRACE_STR: NUL-terminated */
    int64_t i;
    double d;
    bool b;
};
#define TKV_S(k, v) ((struct trace_kv){ .key = (k), .type = TRACE_STR, .s = (v) })
#define TKV_I(k, v) ((struct trace_kv){ .key = (k), .type = TRACE_INT, .i = (v) })
#define TKV_D(k, v) ((struct trace_kv){ .key = (k), .type = TRACE_DOUBLE, .d = (v) })
#define TKV_B(k, v) ((struct trace_kv){ .key = (k), .type = TRACE_BOOL, .b = (v) })

/* The tracer's own figures (stats `tracing`, /metrics polygw_trace_*). */
struct trace_stats {
    uint64_t spans_started;  /* sampled spans begun */
    uint64_t spans_exported; /* accepted by the receiver (2xx) */
    uint64_t dropped_queue;  /* ended into a full queue */
    uint64_t dropped_export; /* in a batch the receiver never took */
    uint64_t exports_ok, exports_failed, export_retries;
    uint64_t queued;    /* gauge: ended spans waiting */
    uint64_t unsampled; /* traces the sampler left out */
};

/* Creates a tracer exporting through `up` (borrowed; it must outlive the
 * tracer) with the settings of `ct` (copied) merged with the environment
 * (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT +
 * "/v1/traces", OTEL_EXPORTER_OTLP_HEADERS, OTEL_SERVICE_NAME,
 * OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER and _ARG,
 * OTEL_EXPORTER_OTLP_TIMEOUT; a key of `ct` that is set wins);
 * OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn it off as
 * `enabled: false` would. Returns NULL with `err` when the environment
 * holds a malformed value (an endpoint that is not http(s)://, a header
 * line that is not key=value); other malformed values are warned about
 * and ignored (a malformed OTEL_RESOURCE_ATTRIBUTES whole). */
struct tracer *tracer_new(struct ev_loop *loop, struct upstream *up,
                          const struct config_tracing *ct, char *err, size_t errlen);

/* Takes new settings (a reload): the queue is kept; a batch in flight is
 * sent again with the new endpoint. Returns 0, or -1 with `err` (nothing
 * changed). */
int tracer_reconf(struct tracer *t, const struct config_tracing *ct, char *err, size_t errlen);

/* Sends what is queued now (at exit): every batch leaves at once, one after
 * the other, and a failed one is dropped (counted), not retried; done(ud)
 * is called, from the loop, when none is left. Returns 1 (done will be
 * called, unless the tracer is freed first: the caller bounds the wait),
 * or 0 when there is nothing to send (done is not called). */
int tracer_flush(struct tracer *t, void (*done)(void *ud), void *ud);

/* Cancels the export in flight and frees every span. NULL: no-op. */
void tracer_free(struct tracer *t);

const struct trace_stats *tracer_stats(const struct tracer *t);
/* The oldest ended span waiting for export (the others follow it by
 * span->next), or NULL: what the next batch starts with. */
const struct span *tracer_queue_head(const struct tracer *t);
/* True when `t` is not NULL and tracing is on. */
bool tracer_is_enabled(const struct tracer *t);

/* Starts a span at `now` (ev_now(): seconds since the epoch). Its parent is
 * `parent` when not NULL (same trace and tracer: `t` may be NULL); else the caller's context `ctx`
 * (may be NULL or invalid: a new trace), which with `link` (or
 * tracing.parent: link) becomes a link of a new root instead, unless it is
 * polygw's own (ctx->own). Returns NULL when the trace is not sampled, the
 * tracer is NULL, or out of memory. `name` is copied. */
struct span *span_start(struct tracer *t, const struct span *parent, const struct trace_ctx *ctx,
                        bool link, const char *name, enum trace_kind kind, double now);

/* As span_start; when the sampler leaves the trace out, *quiet (not NULL)
 * gets the context to pass on instead (W3C: a participant that does not
 * record still propagates): valid, the trace id (the parent context's, or
 * a new root's), the span id the span would have had, the parent's flags
 * (sampled and random only) with sampled clear, and its tracestate. Else
 * quiet->valid is false. */
struct span *span_start_ctx(struct tracer *t, const struct span *parent,
                            const struct trace_ctx *ctx, bool link, const char *name,
                            enum trace_kind kind, double now, struct trace_ctx *quiet);
/* The traceparent of a new child of context `c` (a span not recorded):
 * c's trace id and flags, a new span id from `t` (not NULL);
 * NUL-terminated, 55 characters (`out` holds at least 56). */
void trace_ctx_child(struct tracer *t, const struct trace_ctx *c, char *out);

void span_set(struct span *s, const struct trace_kv *kv);
/* An event at `at` with up to TRACE_EVENT_ATTRS_MAX attributes. */
void span_event(struct span *s, const char *name, double at, const struct trace_kv *kv, size_t n);
/* Marks the span failed with `message` (copied; may be NULL). */
void span_set_error(struct span *s, const char *message);
/* Ends the span at `now` and hands it to the export queue; `s` is gone. */
void span_end(struct span *s, double now);
/* The span's context as a W3C traceparent value, NUL-terminated (55
 * characters; `out` holds at least 56). */
void span_traceparent(const struct span *s, char *out);
/* The span's tracestate ("" = none, or NULL span). */
const char *span_tracestate(const struct span *s);

#endif /* POLYGW_TRACE_H */
