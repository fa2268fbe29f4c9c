/* codes.c — names of the wire error codes (see codes.h). */
#include "codes.h"

#include <string.h>

static const char *const code_names[PGW_CODE_COUNT] = {
    [PGW_OK] = "ok",
    [PGW_STALLED] = "stalled",
    [PGW_RETRY_EXHAUSTED] = "retry_exhausted",
    [PGW_UPSTREAM_REJECTED] = "upstream_rejected",
    [PGW_DEADLINE_EXCEEDED] = "deadline_exceeded",
    [PGW_CANCELLED] = "cancelled",
    [PGW_TASK_STOPPED] = "task_stopped",
    [PGW_WATCHDOG_TIMEOUT] = "watchdog_timeout",
    [PGW_STREAM_INTERRUPTED] = "stream_interrupted",
    [PGW_BACKEND_UNAVAILABLE] = "backend_unavailable",
    [PGW_BUDGET_EXHAUSTED] = "budget_exhausted",
    [PGW_BAD_REQUEST] = "bad_request",
    [PGW_UNKNOWN_METHOD] = "unknown_method",
    [PGW_UNKNOWN_CAPABILITY] = "unknown_capability",
    [PGW_MODEL_NOT_FOUND] = "model_not_found",
    [PGW_RESPONSE_NOT_FOUND] = "response_not_found",
    [PGW_TOO_LARGE] = "too_large",
    [PGW_OVERLOADED] = "overloaded",
    [PGW_SHUTTING_DOWN] = "shutting_down",
    [PGW_INTERNAL] = "internal",
};

const char *pgw_code_name(enum pgw_code code)
{
    if ((int)code < 0 || code >= PGW_CODE_COUNT)
        return code_names[PGW_INTERNAL];
    return code_names[code];
}

int pgw_code_from_name(const char *name, size_t len)
{
    for (int i = 0; i < PGW_CODE_COUNT; i++) {
        if (strlen(code_names[i]) == len && memcmp(code_names[i], name, len) == 0)
            return i;
    }
    return -1;
}

bool pgw_code_is_retry_later(enum pgw_code code)
{
    switch (code) {
    case PGW_STALLED:
    case PGW_RETRY_EXHAUSTED:
    case PGW_BACKEND_UNAVAILABLE:
    case PGW_OVERLOADED:
    case PGW_SHUTTING_DOWN:
        return true;
    default:
        return false;
    }
}
