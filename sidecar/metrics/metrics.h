/*
 * metrics.h — the sidecar's Prometheus metrics: counters and fixed-bucket
 * histograms updated where events happen, gauges read from the live state
 * at render time, written in the text exposition format 0.0.4 (src/prom.h).
 * Every family is listed, with its labels and meaning, in docs/METRICS.md.
 *
 * Hot path. Every label set is resolved to a slot when the registry is
 * built from the configuration (one slot per source, one per capability,
 * indexed like cfg->sources and cfg->capabilities), so an observation is an
 * array index and an add: no lookup, no allocation, no lock (the daemon is
 * single-threaded; all functions here run on the loop thread). A histogram
 * observation scans at most PROM_HIST_MAX bounds.
 *
 * Rendering allocates one growing buffer and returns it; it is the only
 * part that allocates after metrics_new().
 */
#ifndef POLYGW_METRICS_H
#define POLYGW_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codes.h"
#include "core/config.h"
#include "cost.h"
#include "backend/cache.h"
#include "prom.h"

struct server;
struct attempt_result;

struct metrics;

/* A registry with one slot per source and capability of `cfg` (borrowed:
 * it must outlive the registry). NULL when out of memory. */
struct metrics *metrics_new(const struct config *cfg);
void metrics_free(struct metrics *m);

/* A reload (reload.h) in two phases: prepare allocates the series in the
 * new source order (new source j continues old source from[j], or starts
 * at zero when from[j] < 0; capabilities keep their indices, new ones start
 * at zero), commit installs them and borrows `cfg` (the new configuration)
 * from then on; it cannot fail. abort frees what prepare made. */
struct metrics_source;
struct metrics_capability;
struct metrics_reconf {
    struct metrics_source *src;
    struct metrics_capability *cap;
};
int metrics_reconf_prepare(const struct metrics *m, const struct config *cfg, const long *from,
                           struct metrics_reconf *r);
void metrics_reconf_commit(struct metrics *m, const struct config *cfg, struct metrics_reconf *r);
void metrics_reconf_abort(struct metrics_reconf *r);

/* An attempt on source `source` ended with `r` (its outcome, duration and
 * time to first byte or event). */
void metrics_on_attempt(struct metrics *m, size_t source, const struct attempt_result *r);
/* A successful attempt on `source` reported `prompt` prompt tokens, of
 * which `cached` were read from the provider's prompt cache; -1: not
 * reported (nothing is counted; a cached count only with its prompt). */
void metrics_on_prompt_tokens(struct metrics *m, size_t source, int64_t prompt, int64_t cached);
/* A successful attempt on `source` for app `app` and model label `model`
 * (both borrowed: configured names, or "other", so the series stay
 * bounded) used `t` (its tokens by class, cost.h) and cost `cost` (NAN:
 * the source is unpriced; its tokens are still counted). */
void metrics_on_usage(struct metrics *m, size_t source, const char *app, const char *model,
                      const struct cost_tokens *t, double cost);

/* An attempt on `source` was torn down before it ended (cancel, task stop,
 * client gone, shutdown). */
void metrics_on_attempt_cancelled(struct metrics *m, size_t source);

/* A call of capability `cap` entered the governed loop / ended with `code`
 * after `duration_s`, of which `stalled_s` charged to the stall budget. A
 * call refused before entering the loop (its task is not running) is only
 * ended, with duration 0. */
void metrics_on_call_start(struct metrics *m, size_t cap);
void metrics_on_call_end(struct metrics *m, size_t cap, enum pgw_code code, double duration_s,
                         double stalled_s);
void metrics_on_call_refused(struct metrics *m, size_t cap, enum pgw_code code);

/* A call of capability `cap` that asked for a model ended with `code`;
 * `model` (borrowed) is its configured name or "other" (models.h), never
 * a client's string, so the series stay bounded. */
void metrics_on_model_call(struct metrics *m, size_t cap, const char *model, enum pgw_code code);
/* A call of capability `cap` met the response cache as `ev` (a hit, a
 * miss, a bypass, or coalesced with an identical call in flight). */
void metrics_on_cache(struct metrics *m, size_t cap, enum cache_event ev);
/* A streaming call relayed its first event `ttft_s` after it arrived. */
void metrics_on_call_first_event(struct metrics *m, size_t cap, double ttft_s);

/* The Prometheus text exposition of everything `srv` (borrowed) holds:
 * the registry's counters and histograms plus gauges read now from the
 * governance core, the task registry, the upstream engine, the connection
 * layer and the state backend (its own families: backend.h). Returns an
 * owned, NUL-terminated string with *len set to its length (without the
 * NUL), or NULL when out of memory. Never blocks. Any front end may call it. */
char *metrics_render(struct server *srv, size_t *len);

#endif /* POLYGW_METRICS_H */
