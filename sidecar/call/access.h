/*
 * access.h — the access log: one JSON line at `info` per finished `call`
 * (docs/OPERATIONS.md §2 lists every field). Off with server.access_log:
 * false, or whenever the log level is above info.
 *
 * What it never holds: request or response bodies, API keys, upstream
 * error text. Every string in an entry is a configured name (capability,
 * source), a client-chosen identifier the protocol already bounds (task,
 * scope), or a fixed code name.
 */
#ifndef POLYGW_ACCESS_H
#define POLYGW_ACCESS_H

#include <stdbool.h>
#include <stdint.h>

#include "codes.h"
#include "core/config.h"

/* One finished call. Strings are borrowed, NULL when unknown; numbers are
 * NAN (or the sentinel noted) when unknown. */
struct access_entry {
    uint64_t conn;
    uint32_t msgid;
    const char *app; /* who called (docs/APPS.md); NULL: `default` */
    const char *capability;
    const char *scope;
    const char *model;  /* the configured model name the call matched (models.h),
                         * "other", or NULL: it named none */
    const char *source; /* the last attempt's source; NULL: no attempt */
    const char *task;
    long long peer_pid, peer_uid; /* from SO_PEERCRED; -1 unknown */
    bool answered;                /* false: the client went away first */
    enum pgw_code code;           /* the answer; meaningful when answered */
    bool stream;
    uint32_t attempts;
    int status; /* the last attempt's HTTP status; 0 none */
    double elapsed_s, stalled_s;
    double ttft_s;     /* streams: call start -> first chunk relayed */
    double tokens;     /* usage.total_tokens of the answer */
    double cost;       /* what the answer cost (cost.h); NAN: unknown or unpriced
                    * (the field is then left out) */
    const char *cache; /* the response cache's verdict ("hit", "miss", "bypass"),
                        * NULL: not a cached capability (then left out) */
};

/* Writes the entry when cfg->access_log is on and the level admits info.
 * `cfg` and `e` are borrowed. */
void access_log_write(const struct config *cfg, const struct access_entry *e);

#endif /* POLYGW_ACCESS_H */
