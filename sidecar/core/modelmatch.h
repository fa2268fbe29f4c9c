/*
 * modelmatch.h — a requested model name against public names and globs:
 * the matching rules of models.h, on plain strings.
 *
 * Apart from models.c, which reads the loaded configuration, so that the
 * configuration loader (config.c) checks the names and globs it reads
 * with the same rules without depending on it.
 */
#ifndef POLYGW_MODELMATCH_H
#define POLYGW_MODELMATCH_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

#define MODELS_EXACT    INT_MAX
#define MODELS_NAME_MAX 256 /* longest model name a request may ask for, in bytes */

/* The rank at which pattern `pat` (NUL-terminated) matches the `len` bytes
 * of `name`: MODELS_EXACT when `pat` has no `*` and equals it, the number
 * of literal characters of a matching glob, -1 when it does not match. */
int models_match(const char *pat, const char *name, size_t len);

/* True when `pat` is a glob (holds a `*`). */
bool models_is_glob(const char *pat);

/* The best rank at which the public names of a source (its `model`, NULL
 * for none, and its `n_serves` `serves` entries) serve `name` (-1: they do
 * not; 0 when it names neither, serving every name), and in *pat (may be
 * NULL) the public name or glob that matched (borrowed; NULL for a source
 * naming no model). */
int models_rank(const char *model, char *const *serves, size_t n_serves, const char *name,
                size_t len, const char **pat);

#endif /* POLYGW_MODELMATCH_H */
