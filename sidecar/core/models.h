/*
 * models.h — which sources serve a model name (docs/CONFIG.md, "Models").
 *
 * A source's public names are its `model` (the upstream name it sends)
 * and the entries of its `serves` list; an entry holding a `*` is a glob,
 * where `*` matches any run of characters (also none) and every other
 * character itself (case-sensitive). A source with neither serves every
 * name, passing the body's model through.
 *
 * A requested name selects, within its capability, the sources of the best
 * rank among those that serve it:
 *   - an exact name (rank MODELS_EXACT) wins over every glob;
 *   - a glob ranks by its number of literal (non-`*`) characters: the most
 *     specific glob wins ("claude-haiku-4-5*", 16, over "claude-*", 7);
 *   - a source naming no model, like the glob "*", ranks 0.
 * Sources of the same best rank all serve it (their priority tiers,
 * weights and limits then choose among them). An app's `models` list
 * (apps[i].models) allows the names that match one of its entries.
 *
 * Pure functions over the configuration: no allocation, no I/O. The
 * matching of one name against one pattern is modelmatch.h's, which the
 * configuration loader shares.
 */
#ifndef POLYGW_MODELS_H
#define POLYGW_MODELS_H

#include <stdbool.h>
#include <stddef.h>

#include "config.h"
#include "modelmatch.h"

/* The best rank at which source `s` serves `name` (-1: it does not), and
 * in *pat (may be NULL) the public name or glob that matched (borrowed
 * from `s`; NULL for a source naming no model): models_rank over its
 * `model` and `serves`. */
int models_source_rank(const struct config_source *s, const char *name, size_t len,
                       const char **pat);

/* Does app `a` allow `name`? True when it has no `models` list. */
bool models_app_allows(const struct config_app *a, const char *name, size_t len);

/* The sources of capability `cap` that serve a request for `name` (`len`
 * bytes; NULL: the request names no model) from app `a` (NULL: any):
 * use[i] for every i < cfg->n_sources. Returns the number selected (0: no
 * source serves it, or the app does not allow it: model_not_found), or -1
 * when the request is not restricted at all (no model named, no allow-list:
 * every source of the capability, as without model routing; use[] is then
 * not written). A request naming no model from an app with a `models`
 * list is served by the sources whose `model` the list allows. In *label
 * (may be NULL), the configured name the metrics and the access log show
 * for it: the exact name, or the glob, that matched; "other" when only
 * sources naming no model (or the glob "*") serve it; NULL when it names
 * no model. */
long models_select(const struct config *cfg, size_t cap, const char *name, size_t len,
                   const struct config_app *a, bool *use, const char **label);

#endif /* POLYGW_MODELS_H */
