/*
 * outcome.h — how one attempt ended, classified for the governed loop
 * (docs/DESIGN.md §3.1): the `kind` drives the loop, the `reason` is the detail that
 * goes into logs, stats and an error's `sources[].reason`.
 *
 *   kind           loop action (docs/DESIGN.md §3.1)
 *   success        mark progress, return the result
 *   rate_limited   429: exempt (no fails++) or transient, per capability policy
 *   transient      fails++, breaker failure, back off and retry
 *   fail_fast      return upstream_rejected at once
 *
 * Default kind of each reason (outcome_from_reason):
 *
 *   none                                     success
 *   http_429                                 rate_limited
 *   http_4xx                                 fail_fast
 *   cancelled                                fail_fast (never retried; the loop
 *                                            reports `cancelled`, not
 *                                            upstream_rejected — check the reason)
 *   everything else (timeouts, dns, connect,
 *   reset, truncated, 5xx, 408, 409,
 *   bad_response, tls)                       transient
 *
 * Pure: no I/O, no clock reads — the caller passes `now`. The parsing of
 * HTTP-dates is done by hand (no strptime, no locale, no timegm).
 */
#ifndef POLYGW_OUTCOME_H
#define POLYGW_OUTCOME_H

enum outcome_kind {
    OUTCOME_SUCCESS,
    OUTCOME_RATE_LIMITED,
    OUTCOME_TRANSIENT,
    OUTCOME_FAIL_FAST,
};

/* Values are stable within a build only; persist/log the names instead. */
enum outcome_reason {
    REASON_NONE,             /* success */
    REASON_CONNECT_TIMEOUT,  /* connect_timeout_s expired (TCP and TLS handshake) */
    REASON_TTFT_TIMEOUT,     /* ttft_timeout_s: request sent, no first byte / first event */
    REASON_IDLE_TIMEOUT,     /* idle_timeout_s between stream events */
    REASON_TOTAL_TIMEOUT,    /* timeout_s of the whole attempt */
    REASON_DNS_TIMEOUT,      /* name resolution did not finish in time */
    REASON_DNS_FAILED,       /* name resolution failed (NXDOMAIN, resolver error) */
    REASON_CONNECT_FAILED,   /* connection refused / host or network unreachable */
    REASON_CONNECTION_RESET, /* connection closed or reset, including mid-body */
    REASON_TRUNCATED,        /* body shorter than announced, or stream ended without
                                its terminal event / mid-event */
    REASON_HTTP_5XX,
    REASON_HTTP_408,
    REASON_HTTP_409,
    REASON_HTTP_429,
    REASON_HTTP_4XX,     /* any other 4xx */
    REASON_BAD_RESPONSE, /* unparseable reply (non-JSON body), or a status that
                                is not 2xx/4xx/5xx (1xx, 3xx: no redirects are followed) */
    REASON_TLS,          /* TLS handshake or certificate failure */
    REASON_CANCELLED,    /* the call was cancelled (client, task stop, shutdown) */
    OUTCOME_REASON_COUNT /* number of reasons, for tables indexed by reason */
};

/* Largest retry delay outcome_parse_retry_after() reports: a server asking
 * for more than a day is treated as asking for a day (the stall window and
 * the call's deadline end the call long before anyway; this only keeps
 * absurd values out of timers and arithmetic). */
#define OUTCOME_RETRY_AFTER_MAX_S 86400.0

enum {
    OUTCOME_EINVAL = -1, /* unparseable Retry-After value */
};

struct outcome {
    enum outcome_kind kind;
    enum outcome_reason reason;
    int http_status;      /* the HTTP status, 0 when none was received */
    double retry_after_s; /* server's Retry-After in seconds, < 0 when absent/invalid */
};

/* Classifies a received HTTP status. Fills all of `*o`:
 *   2xx        success,      REASON_NONE
 *   429        rate_limited, REASON_HTTP_429
 *   408 / 409  transient,    REASON_HTTP_408 / REASON_HTTP_409
 *   5xx        transient,    REASON_HTTP_5XX
 *   other 4xx  fail_fast,    REASON_HTTP_4XX
 *   1xx, 3xx, anything outside 100..599: transient, REASON_BAD_RESPONSE
 * `retry_after_header` (borrowed, may be NULL) is the raw Retry-After value;
 * it is honoured for 429 and every 5xx (RFC 9110 defines it for 503, and
 * gateways send it on other overload statuses such as 529), ignored
 * otherwise. retry_after_s = parsed value relative to `now_unix_s`, or -1. */
void outcome_from_http(struct outcome *o, int status, const char *retry_after_header,
                       double now_unix_s);

/* Fills `*o` for a non-HTTP end (timeout, DNS, connection, TLS, truncation,
 * bad body, cancellation) — or any reason — with the default kind of the
 * table above, http_status 0 and retry_after_s -1. An out-of-range reason
 * is treated as REASON_BAD_RESPONSE. The caller may set http_status after,
 * e.g. a 200 with a non-JSON body. */
void outcome_from_reason(struct outcome *o, enum outcome_reason reason);

/* Parses a Retry-After header value (borrowed, NUL-terminated; surrounding
 * spaces/tabs ignored) into seconds from `now_unix_s`:
 *   - delta-seconds: ASCII digits ("120"); leniently also a decimal with
 *     digits on both sides of one '.' ("1.5"). No sign, no exponent.
 *   - HTTP-date, any of the three RFC 9110 forms, always GMT:
 *       IMF-fixdate  "Sun, 06 Nov 1994 08:49:37 GMT"
 *       RFC 850      "Sunday, 06-Nov-94 08:49:37 GMT"  (two-digit year: the
 *                    century that puts it at most 50 years after now's year)
 *       asctime      "Sun Nov  6 08:49:37 1994"
 *     Day and month names are matched ASCII-case-insensitively, never via the
 *     locale; the weekday is checked to be a weekday name but not against the
 *     date. Fields must be in range (day valid for its month, hour 0-23,
 *     minute 0-59, second 0-60). Result = max(0, date - now).
 * The result is clamped to [0, OUTCOME_RETRY_AFTER_MAX_S].
 * Returns 0 with *out_s set, or OUTCOME_EINVAL (NULL, empty, garbage,
 * negative) leaving *out_s unchanged. */
int outcome_parse_retry_after(const char *value, double now_unix_s, double *out_s);

/* Stable snake_case names ("success", "rate_limited", "transient",
 * "fail_fast"; "connect_timeout", "http_5xx", ... — the enumerator without
 * its prefix, lower-cased). Static strings; "unknown" when out of range. */
const char *outcome_kind_name(enum outcome_kind kind);
const char *outcome_reason_name(enum outcome_reason reason);

#endif /* POLYGW_OUTCOME_H */
