/*
 * codes.h — the stable error codes of the polygw wire protocol.
 *
 * Every error a client sees carries one of these names as its `code`
 * string (proto/PROTOCOL.md, "Error codes"). The enum is the C spelling of
 * the same list, shared by the sidecar and libpolygw; the numeric values are
 * NOT part of the wire contract (only the names are) and may be reordered.
 *
 * This header is installed with libpolygw and must stay self-contained.
 */
#ifndef POLYGW_CODES_H
#define POLYGW_CODES_H

#include <stdbool.h>
#include <stddef.h>

enum pgw_code {
    PGW_OK = 0,
    PGW_STALLED,             /* scope-level unavailability, retry later */
    PGW_RETRY_EXHAUSTED,     /* scope-level unavailability, retry later */
    PGW_UPSTREAM_REJECTED,   /* upstream said no (4xx); carries status + body */
    PGW_DEADLINE_EXCEEDED,   /* the call's own deadline_s passed */
    PGW_CANCELLED,           /* the client cancelled the call */
    PGW_TASK_STOPPED,        /* the call's task was stopped */
    PGW_WATCHDOG_TIMEOUT,    /* the call's task was failed by the watchdog */
    PGW_STREAM_INTERRUPTED,  /* a stream failed after its first event */
    PGW_BACKEND_UNAVAILABLE, /* the state backend could not answer */
    PGW_BUDGET_EXHAUSTED,    /* a budget in currency cannot cover the call */
    PGW_BAD_REQUEST,         /* malformed frame or wrong params */
    PGW_UNKNOWN_METHOD,
    PGW_UNKNOWN_CAPABILITY,
    PGW_MODEL_NOT_FOUND,    /* no source of the capability serves the model asked for */
    PGW_RESPONSE_NOT_FOUND, /* a Responses follow-up names a response no source can be
                             * found for */
    PGW_TOO_LARGE,          /* message over max_message_bytes */
    PGW_OVERLOADED,         /* a sidecar limit (requests in flight) was hit */
    PGW_SHUTTING_DOWN,      /* the sidecar is draining */
    PGW_INTERNAL,
    PGW_CODE_COUNT
};

/* The wire name of `code` ("stalled", ...). Never NULL: out-of-range values
 * map to "internal". Safe from any context. */
const char *pgw_code_name(enum pgw_code code);

/* Looks a wire name up (exact, case-sensitive, `len` bytes, no NUL needed).
 * Returns the code, or -1 when the name is not one of ours (a newer sidecar
 * may add codes: treat such an error as PGW_INTERNAL-like but keep its name). */
int pgw_code_from_name(const char *name, size_t len);

/* True for the codes that mean "the scope cannot serve now, retry later":
 * stalled, retry_exhausted, backend_unavailable, overloaded, shutting_down. */
bool pgw_code_is_retry_later(enum pgw_code code);

#endif /* POLYGW_CODES_H */
