/* governor.c — see governor.h. */
#include "governor.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* xorshift64*: jitter only needs to decorrelate sidecars, not be secret. */
static double governor_rand(void *ud)
{
    uint64_t *s = ud;
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (double)((*s * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
}

void governor_seed(uint64_t *rand_state)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    *rand_state = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40);
    if (!*rand_state)
        *rand_state = 0x9e3779b97f4a7c15ULL;
}

void governor_source_params(const struct config *cfg, struct gov_source_params *p)
{
    bool shared = cfg->backend == BACKEND_REDIS;

    for (size_t i = 0; i < cfg->n_sources; i++) {
        const struct config_source *s = &cfg->sources[i];
        p[i] = (struct gov_source_params){
            .name = s->name,
            .capability = (uint32_t)s->capability_index,
            .priority = s->priority,
            .weight = s->weight,
            .max_concurrency = s->max_concurrency,
            .aimd_initial = s->aimd.initial,
            .aimd_min = s->aimd.min,
            .aimd_increase = s->aimd.increase,
            .aimd_decrease = s->aimd.decrease,
            .breaker_failures = s->breaker.failures,
            .breaker_cooldown_s = s->breaker.cooldown_s,
            .breaker_max_cooldown_s = s->breaker.max_cooldown_s,
            .rpm = s->limits.rpm,
            .tpm = s->limits.tpm,
            .daily_tokens = s->limits.daily_tokens,
            .itpm = s->limits.itpm,
            .otpm = s->limits.otpm,
            .window_s = s->limits.window_s,
            .pacer_min_interval_s = s->pacer_min_interval_ms / 1000.0,
            .retired = s->retired,
        };
        if (shared) {
            /* The buckets and the breaker are the fleet's, enforced by the
             * backend's scripts; locally only the permits (AIMD, the local
             * share of max_concurrency) and the pacer remain. */
            p[i].rpm = p[i].tpm = p[i].daily_tokens = p[i].itpm = p[i].otpm = 0;
            p[i].breaker_failures = UINT32_MAX;
        }
    }
}

int governor_app_params(const struct config *cfg, struct gov_app_params **apps,
                        struct gov_app_cap_params **per_cap)
{
    size_t nc = cfg->n_capabilities;
    struct gov_app_params *w = calloc(cfg->n_apps ? cfg->n_apps : 1, sizeof(*w));
    struct gov_app_cap_params *pc = calloc(cfg->n_apps * nc + 1, sizeof(*pc));

    if (!w || !pc) {
        free(w);
        free(pc);
        return -1;
    }
    for (size_t i = 0; i < cfg->n_apps; i++) {
        const struct config_app *a = &cfg->apps[i];
        w[i] = (struct gov_app_params){
            .weight = a->weight,
            .max_concurrency = a->max_concurrency,
            .rpm = a->limits.rpm,
            .tpm = a->limits.tpm,
            .daily_tokens = a->limits.daily_tokens,
            .itpm = a->limits.itpm,
            .otpm = a->limits.otpm,
            .window_s = a->limits.window_s,
            .per_cap = a->per_capability ? &pc[i * nc] : NULL,
        };
        for (size_t c = 0; a->per_capability && c < nc; c++) {
            const struct config_app_limits *l = &a->per_capability[c];
            pc[i * nc + c] = (struct gov_app_cap_params){
                .max_concurrency = l->max_concurrency,
                .rpm = l->limits.rpm,
                .tpm = l->limits.tpm,
                .daily_tokens = l->limits.daily_tokens,
                .window_s = l->limits.window_s,
            };
        }
    }
    *apps = w;
    *per_cap = pc;
    return 0;
}

int governor_init(struct gov *g, const struct config *cfg, const struct gov_backend *backend,
                  const struct gov_hooks *hooks, uint64_t *rand_state, double now, char *err,
                  size_t errlen)
{
    struct gov_source_params *p = calloc(cfg->n_sources ? cfg->n_sources : 1, sizeof(*p));

    if (!p) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    governor_source_params(cfg, p);
    int rc = gov_init(g, p, cfg->n_sources, cfg->n_capabilities, backend, governor_rand, rand_state,
                      hooks, now);
    free(p);
    if (rc == 0 && cfg->n_apps > 0) {
        /* Fair queueing between the apps and their own limits (cfg->apps
         * order). With Redis the limits hold here too (a subset of the
         * fleet's: admit.lua checks the fleet-wide ones). */
        struct gov_app_params *w = NULL;
        struct gov_app_cap_params *pc = NULL;
        if (governor_app_params(cfg, &w, &pc) < 0 || gov_set_apps(g, w, cfg->n_apps, now) < 0) {
            gov_fini(g);
            rc = -1;
        }
        free(pc);
        free(w);
    }
    if (rc < 0)
        snprintf(err, errlen, "out of memory initialising the governance core");
    return rc;
}

void governor_policy(const struct config *cfg, size_t cap, struct gov_policy *pol)
{
    const struct config_capability *c = &cfg->capabilities[cap];
    *pol = (struct gov_policy){
        .max_attempts = c->policy.max_attempts,
        .stall_window_s = c->policy.stall_window_s,
        .backoff_base_s = c->policy.backoff_base_s,
        .backoff_max_s = c->policy.backoff_max_s,
        .poll_interval_s = c->policy.poll_interval_s,
        .exempt_429 = c->exempt_429,
    };
}

double governor_estimate_tokens(size_t json_len, uint64_t max_tokens)
{
    /* ~4 bytes per token of prompt (JSON overhead makes this an over-estimate
     * for prose, an under-estimate for CJK text; usage reconciles it). */
    return (double)json_len / 4.0 + (double)max_tokens;
}
