/*
 * governor.h — builds the governance core (src/gov.h) from the sidecar's
 * configuration: one gov source per configured source (same index), the
 * capability policies, and the process's random source for jitter.
 */
#ifndef POLYGW_GOVERNOR_H
#define POLYGW_GOVERNOR_H

#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "gov.h"

/* Initialises `g` for `cfg` (borrowed: source names point into it, so it
 * must outlive `g`). `backend` is the progress backend (NULL: memory).
 * With a shared backend the rate buckets and the breaker are left to it
 * (locally unlimited). `rand_state` (borrowed, outlives `g`, seeded by
 * governor_seed) holds the jitter generator's state. Returns 0, or -1 with
 * `err` (out of memory). */
int governor_init(struct gov *g, const struct config *cfg, const struct gov_backend *backend,
                  const struct gov_hooks *hooks, uint64_t *rand_state, double now, char *err,
                  size_t errlen);

/* Seeds the process's random state (the jitter generator; the task
 * registry's hash seed is drawn from it too) from the clock and the pid. */
void governor_seed(uint64_t *rand_state);

/* The core's parameters of every source of `cfg`, in order, into
 * p[0..cfg->n_sources) (names borrowed from cfg). */
void governor_source_params(const struct config *cfg, struct gov_source_params *p);

/* The core's parameters of every app of `cfg`, in order: *apps (cfg->n_apps
 * entries) and the per-capability figures they point into, *per_cap; both
 * returned owned (free both, after the core took them). Returns 0, or -1
 * when out of memory (nothing returned). */
int governor_app_params(const struct config *cfg, struct gov_app_params **apps,
                        struct gov_app_cap_params **per_cap);

/* The budgets of a call on capability `cap`. */
void governor_policy(const struct config *cfg, size_t cap, struct gov_policy *pol);

/* Estimated token cost of a request whose JSON body is `json_len` bytes and
 * which asks for up to `max_tokens` completion tokens (0 when unknown):
 * reserved in the TPM/daily buckets before the attempt, reconciled with the
 * real usage after it. */
double governor_estimate_tokens(size_t json_len, uint64_t max_tokens);

#endif /* POLYGW_GOVERNOR_H */
