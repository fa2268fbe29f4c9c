/*
 * otlp.c — spans into an ExportTraceServiceRequest with libprotobuf-c.
 *
 * protoc-c's message structs point at each other (a span's attributes are
 * an array of pointers to KeyValue, each pointing at an AnyValue): one
 * arena, sized from the batch before anything is filled, holds them all,
 * so a batch costs two allocations (the arena and the packed bytes) and
 * one free of each. Strings point into the spans' own text.
 */
#include "trace/otlp.h"

#include <stdlib.h>
#include <string.h>

#include "trace/span.h"
#include "otlp.pb-c.h"

struct arena {
    char *p;
    size_t used, cap;
};

#define ALIGN16(n) (((n) + 15u) & ~(size_t)15u)

static void *arena_take(struct arena *a, size_t n)
{
    void *p = a->p + a->used;
    a->used += ALIGN16(n);
    return p; /* sized in advance: never past cap */
}

/* What one attribute costs in the arena: its pointer, KeyValue, AnyValue. */
#define ATTR_BYTES                                                               \
    (ALIGN16(sizeof(Pgwotlp__KeyValue *)) + ALIGN16(sizeof(Pgwotlp__KeyValue)) + \
     ALIGN16(sizeof(Pgwotlp__AnyValue)))

static size_t span_bytes(const struct span *s)
{
    size_t n = ALIGN16(sizeof(Pgwotlp__Span *)) + ALIGN16(sizeof(Pgwotlp__Span)) +
        ALIGN16(sizeof(Pgwotlp__Status)) + ALIGN16(sizeof(Pgwotlp__Span__Link *)) +
        ALIGN16(sizeof(Pgwotlp__Span__Link)) + ALIGN16(s->n_attrs * sizeof(Pgwotlp__KeyValue *)) +
        s->n_attrs * ATTR_BYTES + ALIGN16(s->n_events * sizeof(Pgwotlp__Span__Event *));
    for (size_t i = 0; i < s->n_events; i++)
        n += ALIGN16(sizeof(Pgwotlp__Span__Event)) +
            ALIGN16(s->events[i].n_attrs * sizeof(Pgwotlp__KeyValue *)) +
            s->events[i].n_attrs * ATTR_BYTES;
    return n;
}

static Pgwotlp__KeyValue *kv_new(struct arena *a, const char *key)
{
    Pgwotlp__KeyValue *kv = arena_take(a, sizeof(*kv));
    Pgwotlp__AnyValue *v = arena_take(a, sizeof(*v));
    *kv = (Pgwotlp__KeyValue)PGWOTLP__KEY_VALUE__INIT;
    *v = (Pgwotlp__AnyValue)PGWOTLP__ANY_VALUE__INIT;
    kv->key = (char *)key;
    kv->value = v;
    return kv;
}

static Pgwotlp__KeyValue **attrs_fill(struct arena *a, const struct span *s,
                                      const struct span_attr *at, size_t n)
{
    Pgwotlp__KeyValue **out = arena_take(a, n * sizeof(*out));
    for (size_t i = 0; i < n; i++) {
        Pgwotlp__KeyValue *kv = kv_new(a, at[i].key);
        Pgwotlp__AnyValue *v = kv->value;
        switch (at[i].type) {
        case TRACE_STR:
            v->value_case = PGWOTLP__ANY_VALUE__VALUE_STRING_VALUE;
            v->string_value = (char *)span_text(s, at[i].s_off);
            break;
        case TRACE_INT:
            v->value_case = PGWOTLP__ANY_VALUE__VALUE_INT_VALUE;
            v->int_value = at[i].i;
            break;
        case TRACE_DOUBLE:
            v->value_case = PGWOTLP__ANY_VALUE__VALUE_DOUBLE_VALUE;
            v->double_value = at[i].d;
            break;
        case TRACE_BOOL:
            v->value_case = PGWOTLP__ANY_VALUE__VALUE_BOOL_VALUE;
            v->bool_value = at[i].b;
            break;
        }
        out[i] = kv;
    }
    return out;
}

static Pgwotlp__Span *span_fill(struct arena *a, const struct span *s)
{
    Pgwotlp__Span *p = arena_take(a, sizeof(*p));
    *p = (Pgwotlp__Span)PGWOTLP__SPAN__INIT;
    p->trace_id = (ProtobufCBinaryData){ 16, (uint8_t *)s->trace_id };
    p->span_id = (ProtobufCBinaryData){ 8, (uint8_t *)s->span_id };
    if (s->has_parent)
        p->parent_span_id = (ProtobufCBinaryData){ 8, (uint8_t *)s->parent_id };
    p->trace_state = (char *)span_text(s, s->state_off);
    p->name = (char *)span_text(s, s->name_off);
    p->kind = (Pgwotlp__Span__SpanKind)s->kind;
    p->start_time_unix_nano = s->start_ns;
    p->end_time_unix_nano = s->end_ns;
    /* W3C trace flags, and "the parent is remote" known (bit 8) and set
     * (bit 9) for a span whose parent is the caller's. */
    p->flags = s->flags | 0x100u | (s->has_parent && s->kind == TRACE_SERVER ? 0x200u : 0);
    p->n_attributes = s->n_attrs;
    p->attributes = attrs_fill(a, s, s->attrs, s->n_attrs);
    p->dropped_attributes_count = s->dropped_attrs;
    p->n_events = s->n_events;
    p->events = arena_take(a, s->n_events * sizeof(*p->events));
    for (size_t i = 0; i < s->n_events; i++) {
        const struct span_event *e = &s->events[i];
        Pgwotlp__Span__Event *pe = arena_take(a, sizeof(*pe));
        *pe = (Pgwotlp__Span__Event)PGWOTLP__SPAN__EVENT__INIT;
        pe->time_unix_nano = e->time_ns;
        pe->name = (char *)span_text(s, e->name_off);
        pe->n_attributes = e->n_attrs;
        pe->attributes = attrs_fill(a, s, e->attrs, e->n_attrs);
        p->events[i] = pe;
    }
    p->dropped_events_count = s->dropped_events;
    Pgwotlp__Status *st = arena_take(a, sizeof(*st));
    *st = (Pgwotlp__Status)PGWOTLP__STATUS__INIT;
    if (s->error) {
        st->code = PGWOTLP__STATUS__STATUS_CODE__STATUS_CODE_ERROR;
        st->message = (char *)span_text(s, s->error_off);
    }
    p->status = st;
    p->links = arena_take(a, sizeof(*p->links));
    if (s->has_link) {
        Pgwotlp__Span__Link *l = arena_take(a, sizeof(*l));
        *l = (Pgwotlp__Span__Link)PGWOTLP__SPAN__LINK__INIT;
        l->trace_id = (ProtobufCBinaryData){ 16, (uint8_t *)s->link_trace_id };
        l->span_id = (ProtobufCBinaryData){ 8, (uint8_t *)s->link_span_id };
        l->trace_state = (char *)span_text(s, s->link_state_off);
        l->flags = s->link_flags | 0x300u; /* the caller's context: remote */
        p->links[0] = l;
        p->n_links = 1;
    }
    return p;
}

uint8_t *otlp_encode(const struct otlp_resource *r, const struct span *head, size_t n, size_t *len)
{
    struct arena a = { NULL, 0, 0 };
    const struct span *s;
    size_t i;

    a.cap = ALIGN16(n * sizeof(Pgwotlp__Span *)) + r->n * ATTR_BYTES;
    for (s = head, i = 0; s && i < n; s = s->next, i++)
        a.cap += span_bytes(s);
    a.p = malloc(a.cap ? a.cap : 1);
    if (!a.p)
        return NULL;

    Pgwotlp__Resource res = PGWOTLP__RESOURCE__INIT;
    res.n_attributes = r->n;
    res.attributes = arena_take(&a, r->n * sizeof(*res.attributes));
    for (i = 0; i < r->n; i++) {
        Pgwotlp__KeyValue *kv = kv_new(&a, r->keys[i]);
        kv->value->value_case = PGWOTLP__ANY_VALUE__VALUE_STRING_VALUE;
        kv->value->string_value = (char *)r->values[i];
        res.attributes[i] = kv;
    }
    Pgwotlp__InstrumentationScope scope = PGWOTLP__INSTRUMENTATION_SCOPE__INIT;
    scope.name = (char *)r->scope_name;
    scope.version = (char *)r->scope_version;
    Pgwotlp__ScopeSpans ss = PGWOTLP__SCOPE_SPANS__INIT;
    ss.scope = &scope;
    ss.spans = arena_take(&a, n * sizeof(*ss.spans));
    for (s = head, i = 0; s && i < n; s = s->next, i++)
        ss.spans[i] = span_fill(&a, s);
    ss.n_spans = i;
    Pgwotlp__ScopeSpans *ssp = &ss;
    Pgwotlp__ResourceSpans rs = PGWOTLP__RESOURCE_SPANS__INIT;
    rs.resource = &res;
    rs.n_scope_spans = 1;
    rs.scope_spans = &ssp;
    Pgwotlp__ResourceSpans *rsp = &rs;
    Pgwotlp__ExportTraceServiceRequest req = PGWOTLP__EXPORT_TRACE_SERVICE_REQUEST__INIT;
    req.n_resource_spans = 1;
    req.resource_spans = &rsp;

    size_t sz = pgwotlp__export_trace_service_request__get_packed_size(&req);
    uint8_t *out = malloc(sz ? sz : 1);
    if (out)
        *len = pgwotlp__export_trace_service_request__pack(&req, out);
    free(a.p);
    return out;
}

int64_t otlp_rejected(const uint8_t *body, size_t len)
{
    if (!body || len == 0)
        return 0;
    Pgwotlp__ExportTraceServiceResponse *r =
        pgwotlp__export_trace_service_response__unpack(NULL, len, body);
    if (!r)
        return 0;
    int64_t n = r->partial_success ? r->partial_success->rejected_spans : 0;
    pgwotlp__export_trace_service_response__free_unpacked(r, NULL);
    return n;
}
