/*
 * otlp.h — a batch of spans as one OTLP/HTTP export request body
 * (ExportTraceServiceRequest, binary protobuf: otlp.proto, packed with
 * libprotobuf-c), and the receiver's answer read back. Pure: no I/O.
 */
#ifndef POLYGW_OTLP_H
#define POLYGW_OTLP_H

#include <stddef.h>
#include <stdint.h>

struct span;

/* The resource the spans come from: `n` attributes, string values, keys
 * and values borrowed. */
struct otlp_resource {
    const char *const *keys;
    const char *const *values;
    size_t n;
    const char *scope_name, *scope_version;
};

/* Encodes the `n` spans linked from `head` (by span->next) for resource
 * `r`. Returns the request body (malloc'd, owned by the caller) with its
 * length in *len, or NULL when out of memory. */
uint8_t *otlp_encode(const struct otlp_resource *r, const struct span *head, size_t n, size_t *len);

/* The rejected_spans of an ExportTraceServiceResponse body (a receiver's
 * partial success), 0 when none or the body is not one. */
int64_t otlp_rejected(const uint8_t *body, size_t len);

#endif /* POLYGW_OTLP_H */
