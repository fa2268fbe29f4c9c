/*
 * span.h — a recorded span as trace.c keeps it and otlp.c encodes it;
 * callers use only trace.h's functions on it (and the limits and types
 * below).
 */
#ifndef POLYGW_TRACE_SPAN_H
#define POLYGW_TRACE_SPAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TRACE_ATTRS_MAX       24
#define TRACE_EVENTS_MAX      16
/* Of these, the last ones: once the span is full, each new event takes the
 * place of the oldest of them, so the first events and the latest (a
 * call's verdict) are kept and the middle dropped. */
#define TRACE_EVENTS_TAIL     4
#define TRACE_EVENT_ATTRS_MAX 4
#define TRACE_STR_MAX         256

enum trace_kind { TRACE_INTERNAL = 1, TRACE_SERVER = 2, TRACE_CLIENT = 3 };

enum trace_val_type { TRACE_STR, TRACE_INT, TRACE_DOUBLE, TRACE_BOOL };

struct tracer;

/* An attribute: a static key and a value; a string value is an offset
 * into its span's `text` (NUL-terminated there). */
struct span_attr {
    const char *key;
    enum trace_val_type type;
    union {
        int64_t i;
        double d;
        bool b;
        uint32_t s_off;
    };
};

struct span_event {
    uint64_t time_ns;
    uint32_t name_off; /* into text */
    uint8_t n_attrs;
    struct span_attr attrs[TRACE_EVENT_ATTRS_MAX];
};

struct span {
    struct tracer *t;  /* whose queue it ends in */
    struct span *next; /* the tracer's queue or a batch */
    uint8_t trace_id[16], span_id[8], parent_id[8];
    bool has_parent;
    uint8_t flags;
    bool has_link;
    uint8_t link_trace_id[16], link_span_id[8];
    uint8_t link_flags;
    uint32_t name_off, state_off, link_state_off, error_off; /* into text; error: 0 = none */
    bool error;
    enum trace_kind kind;
    uint64_t start_ns, end_ns;
    uint8_t n_attrs, n_events;
    uint8_t tail_next; /* full: the tail slot the next event takes (0 .. TAIL-1) */
    uint32_t dropped_attrs, dropped_events;
    struct span_attr attrs[TRACE_ATTRS_MAX];
    struct span_event events[TRACE_EVENTS_MAX];
    /* Every string of the span, each NUL-terminated; offset 0 is "". */
    char *text;
    uint32_t text_len, text_cap;
};

/* The string at `off` of span `s`. */
static inline const char *span_text(const struct span *s, uint32_t off)
{
    return s->text + off;
}

#endif /* POLYGW_TRACE_SPAN_H */
