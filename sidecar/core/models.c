/*
 * models.c — model names to sources (see models.h).
 */
#include "models.h"

#include <string.h>

int models_source_rank(const struct config_source *s, const char *name, size_t len,
                       const char **pat)
{
    return models_rank(s->model, s->serves, s->n_serves, name, len, pat);
}

bool models_app_allows(const struct config_app *a, const char *name, size_t len)
{
    if (!a || a->n_models == 0)
        return true;
    for (size_t i = 0; i < a->n_models; i++)
        if (models_match(a->models[i], name, len) >= 0)
            return true;
    return false;
}

long models_select(const struct config *cfg, size_t cap, const char *name, size_t len,
                   const struct config_app *a, bool *use, const char **label)
{
    bool listed = a && a->n_models > 0;
    long n = 0;

    if (label)
        *label = NULL;
    if (!name) {
        if (!listed)
            return -1;
        /* No model named: the sources whose upstream model the app may use. */
        for (size_t i = 0; i < cfg->n_sources; i++) {
            const struct config_source *s = &cfg->sources[i];
            use[i] = s->capability_index == cap && !s->retired && s->model &&
                models_app_allows(a, s->model, strlen(s->model));
            n += use[i];
        }
        return n;
    }
    memset(use, 0, cfg->n_sources * sizeof(*use));
    if (!models_app_allows(a, name, len))
        return 0;
    int best = -1;
    const char *best_pat = NULL;
    for (size_t i = 0; i < cfg->n_sources; i++) {
        const struct config_source *s = &cfg->sources[i];
        const char *pat;
        if (s->capability_index != cap || s->retired)
            continue;
        int r = models_source_rank(s, name, len, &pat);
        if (r > best) {
            best = r;
            best_pat = pat;
        }
    }
    if (best < 0)
        return 0;
    for (size_t i = 0; i < cfg->n_sources; i++) {
        const struct config_source *s = &cfg->sources[i];
        use[i] = s->capability_index == cap && !s->retired &&
            models_source_rank(s, name, len, NULL) == best;
        n += use[i];
    }
    if (label)
        *label = best > 0 && best_pat ? best_pat : "other";
    return n;
}
