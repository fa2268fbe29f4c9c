/*
 * reload.h — replacing the running configuration without a restart
 * (SIGHUP, the `config.reload` method, a changed key file: keywatch.h).
 * docs/OPERATIONS.md §4 is the user's description; the rules:
 *
 *  1. The file is loaded and validated completely into a fresh struct
 *     config, exactly as at start-up (API keys re-read from their variables
 *     and files). Any error: nothing changes.
 *  2. Keys that cannot change under a running sidecar are compared, and a
 *     change refuses the whole reload ("needs a restart"), never applies
 *     half of it: the `listen`, `http` and `backend` sections, the `tasks`
 *     section and defaults.node_timeout_s; capabilities may be added, not
 *     removed or reordered; the apps' names and order. With the Redis
 *     backend the sources' names, order and fleet-enforced settings
 *     (max_concurrency, limits, breaker) and the apps' limits are also
 *     fixed: the fleet's scripts and keys were set up for them. An app's
 *     weight and limits otherwise carry over (gov_apps_reconf: counts in
 *     flight and bucket levels kept).
 *  3. Sources are matched by name (and capability). A matched source keeps
 *     its runtime state under its new settings (gov.h: AIMD limit and bucket
 *     levels clamped, breaker state kept); a new one starts fresh; a removed
 *     one that an attempt or a call still uses is kept as `retired` (never
 *     picked again; its attempts finish on the old settings) until a later
 *     reload finds it unused.
 *  4. The swap happens at one point of the loop, inside one callback: every
 *     live call is moved to the new configuration (its own budgets, fixed
 *     when it started, are kept), waiting calls are woken to see new
 *     sources, and the old configuration is freed. No call is answered by
 *     a reload, none is lost.
 *
 * The service manager is told RELOADING=1 before and READY=1 after.
 * Outcomes are counted in srv->stats (reloads_ok / reloads_failed) and the
 * last failure is kept for `stats`.
 */
#ifndef POLYGW_RELOAD_H
#define POLYGW_RELOAD_H

#include <stddef.h>

#include "core/server.h"

/* What a successful reload did, for the method's answer and the log. */
struct reload_summary {
    size_t sources, added, removed; /* in the new file; added and removed by name */
    size_t retired;                 /* removed but still in use (reload.h rule 3) */
};

/* Reloads srv->config_path (see above). `trigger` (borrowed) names the
 * cause in the log ("SIGHUP", "config.reload", "key file"). Returns 0, or
 * -1 with the reason in err (the configuration unchanged). Every error of
 * an invalid file is also logged, one line each, and handed to `report`
 * (may be NULL) with `arg`. Call it from a top-level loop callback (never
 * from inside the governance core or a libcurl callback). */
int reload_run(struct server *srv, const char *trigger, config_report_fn *report, void *arg,
               struct reload_summary *sum, char *err, size_t errlen);

/* After each successful reload (the new configuration in srv->cfg, before
 * READY=1), `fn(ud)` runs: the key-file watch (keywatch.h) registers one to
 * watch the new configuration's files, as reloads do not call it. One at a
 * time; `fn` NULL removes it. */
void reload_on_done(struct server *srv, void (*fn)(void *ud), void *ud);

/* Frees what reloads keep (the keys of earlier configurations). */
void reload_fini(struct server *srv);

#endif /* POLYGW_RELOAD_H */
