/* progress.c — see progress.h. A small open list: scopes are few in
 * practice (one per capability plus the ones clients name). */
#include "progress.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct scope_entry {
    char *name;
    double last_at;
};

struct progress_store {
    struct scope_entry *v;
    size_t n, cap, max;
};

struct progress_store *progress_store_new(size_t max_scopes)
{
    struct progress_store *ps = calloc(1, sizeof(*ps));
    if (ps)
        ps->max = max_scopes ? max_scopes : 1;
    return ps;
}

void progress_store_free(struct progress_store *ps)
{
    if (!ps)
        return;
    for (size_t i = 0; i < ps->n; i++)
        free(ps->v[i].name);
    free(ps->v);
    free(ps);
}

static struct scope_entry *find(const struct progress_store *ps, const char *scope)
{
    for (size_t i = 0; i < ps->n; i++) {
        if (strcmp(ps->v[i].name, scope) == 0)
            return &ps->v[i];
    }
    return NULL;
}

int progress_mark(struct progress_store *ps, const char *scope, double now)
{
    struct scope_entry *e = find(ps, scope);

    if (e) {
        if (now > e->last_at)
            e->last_at = now;
        return 0;
    }
    char *name = strdup(scope);
    if (!name)
        return -1;
    if (ps->n == ps->max) {
        /* Forget the stalest scope. */
        size_t old = 0;
        for (size_t i = 1; i < ps->n; i++) {
            if (ps->v[i].last_at < ps->v[old].last_at)
                old = i;
        }
        free(ps->v[old].name);
        ps->v[old] = ps->v[--ps->n];
    }
    if (ps->n == ps->cap) {
        size_t cap = ps->cap ? ps->cap * 2 : 8;
        struct scope_entry *v = realloc(ps->v, cap * sizeof(*v));
        if (!v) {
            free(name);
            return -1;
        }
        ps->v = v;
        ps->cap = cap;
    }
    ps->v[ps->n].name = name;
    ps->v[ps->n].last_at = now;
    ps->n++;
    return 0;
}

double progress_age(const struct progress_store *ps, const char *scope, double now)
{
    const struct scope_entry *e = find(ps, scope);
    if (!e)
        return INFINITY;
    return now > e->last_at ? now - e->last_at : 0;
}

size_t progress_count(const struct progress_store *ps)
{
    return ps->n;
}

void progress_foreach(const struct progress_store *ps,
                      void (*fn)(const char *scope, double last_at, void *ud), void *ud)
{
    for (size_t i = 0; i < ps->n; i++)
        fn(ps->v[i].name, ps->v[i].last_at, ud);
}
