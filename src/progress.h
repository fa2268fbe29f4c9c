/*
 * progress.h — per-scope progress for the stall verdict (docs/DESIGN.md §3.1),
 * the memory implementation of the progress half of the backend interface.
 *
 * A scope's progress age is the time since any call in it last succeeded;
 * it is +INFINITY for a scope that never succeeded (a deliberate,
 * conservative default: there is no evidence the scope is alive).
 *
 * Bounded: at most `max_scopes` scopes are remembered (clients name scopes,
 * so the set is not trusted to stay small). When full, the scope with the
 * oldest progress is forgotten — it then reads +INFINITY again, the
 * conservative direction.
 */
#ifndef POLYGW_PROGRESS_H
#define POLYGW_PROGRESS_H

#include <stddef.h>

struct progress_store;

/* Returns NULL when out of memory. */
struct progress_store *progress_store_new(size_t max_scopes);
void progress_store_free(struct progress_store *ps);

/* Records a success in `scope` at `now`. Returns 0 or -1 (out of memory). */
int progress_mark(struct progress_store *ps, const char *scope, double now);

/* Seconds since the scope's last success, +INFINITY if never. */
double progress_age(const struct progress_store *ps, const char *scope, double now);

/* Number of scopes remembered. */
size_t progress_count(const struct progress_store *ps);

/* Iterates the scopes (for `stats`): fn(scope, last_success_at, ud). */
void progress_foreach(const struct progress_store *ps,
                      void (*fn)(const char *scope, double last_at, void *ud), void *ud);

#endif /* POLYGW_PROGRESS_H */
