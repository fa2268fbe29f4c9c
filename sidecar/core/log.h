/*
 * log.h — structured logs: one JSON object per line on stderr,
 *   {"level":"info","ts":"2026-11-30T04:31:02.123Z","msg":"listening","socket":"/run/..."}
 *
 * log_at() checks the level before any formatting happens, so a debug line
 * in a hot path costs one comparison when debug is off. Fields are given as
 * (key, type, value) triples closed by NULL:
 *
 *   log_at(LOG_INFO, "listening", "socket", LOG_S, path, "mode", LOG_U, 0660ULL, NULL);
 *
 * Types: LOG_S const char * (JSON-escaped; NULL prints null), LOG_I long long,
 * LOG_U unsigned long long, LOG_F double (NAN and infinities print null),
 * LOG_B int (true/false), LOG_N long long that prints null when negative.
 * Never pass a secret.
 *
 * The threshold is process-wide: set at start-up, changed at run time by the
 * `log.level` method and on reload. The governance core never logs: it
 * reports through hooks.
 */
#ifndef POLYGW_LOG_H
#define POLYGW_LOG_H

enum log_level { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR };

enum { LOG_S = 1, LOG_I, LOG_U, LOG_F, LOG_B, LOG_N };

extern enum log_level log_threshold;

#define log_at(lvl, ...)                   \
    do {                                   \
        if ((lvl) >= log_threshold)        \
            log_event((lvl), __VA_ARGS__); \
    } while (0)

/* Writes one line. `msg` is a constant event name or short sentence; the
 * variadic part is the NULL-terminated field list described above. */
void log_event(enum log_level lvl, const char *msg, ...);

/* "debug", "info", "warn", "error". */
const char *log_level_name(enum log_level lvl);

#endif /* POLYGW_LOG_H */
