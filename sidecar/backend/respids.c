/* respids.c — see respids.h. */
#include "respids.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct entry {
    struct entry *chain;         /* next in its bucket */
    struct entry *older, *newer; /* write order */
    double expires;
    uint32_t hash;
    char source[RESPIDS_SOURCE_MAX + 1];
    char id[]; /* NUL-terminated */
};

struct respids {
    struct entry **bucket;
    size_t mask; /* buckets - 1 (0 with no table yet) */
    struct entry *oldest, *newest;
    size_t n;
};

/* FNV-1a: ids are random strings from the upstream, not chosen to collide
 * (and a chain only costs time, bounded by `max`). */
static uint32_t hash_of(const char *s)
{
    uint32_t h = 2166136261u;

    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

bool respids_id_ok(const char *s, size_t n)
{
    if (n == 0 || n > RESPIDS_ID_MAX || s[0] == '.')
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.' || c == ':'))
            return false;
    }
    return true;
}

struct respids *respids_new(void)
{
    return calloc(1, sizeof(struct respids));
}

static struct entry **slot_of(struct respids *r, const char *id, uint32_t h)
{
    struct entry **p = &r->bucket[h & r->mask];

    while (*p && ((*p)->hash != h || strcmp((*p)->id, id) != 0))
        p = &(*p)->chain;
    return p;
}

static void drop(struct respids *r, struct entry *e)
{
    struct entry **p = slot_of(r, e->id, e->hash);

    *p = e->chain;
    if (e->older)
        e->older->newer = e->newer;
    else
        r->oldest = e->newer;
    if (e->newer)
        e->newer->older = e->older;
    else
        r->newest = e->older;
    r->n--;
    free(e);
}

static void expire(struct respids *r, size_t max, double now)
{
    while (r->oldest && (r->n > max || r->oldest->expires <= now))
        drop(r, r->oldest);
}

/* Grows the table to at least `max` buckets (a power of two). */
static int fit_table(struct respids *r, size_t max)
{
    size_t want = 16;

    while (want < max && want < ((size_t)1 << 30))
        want <<= 1;
    if (r->mask + 1 >= want && r->bucket)
        return 0;
    struct entry **b = calloc(want, sizeof(*b));
    if (!b)
        return -1;
    for (struct entry *e = r->oldest; e; e = e->newer) {
        e->chain = b[e->hash & (want - 1)];
        b[e->hash & (want - 1)] = e;
    }
    free(r->bucket);
    r->bucket = b;
    r->mask = want - 1;
    return 0;
}

int respids_put(struct respids *r, const char *id, const char *source, double ttl_s, size_t max,
                double now)
{
    size_t n = strlen(id);

    if (n == 0 || n > RESPIDS_ID_MAX || strlen(source) > RESPIDS_SOURCE_MAX)
        return 0;
    if (max < 1)
        max = 1;
    if (fit_table(r, max) < 0)
        return -1;
    uint32_t h = hash_of(id);
    struct entry *old = *slot_of(r, id, h);
    if (old)
        drop(r, old);
    struct entry *e = calloc(1, sizeof(*e) + n + 1);
    if (!e)
        return -1;
    memcpy(e->id, id, n + 1);
    strcpy(e->source, source);
    e->hash = h;
    e->expires = now + ttl_s;
    e->chain = r->bucket[h & r->mask];
    r->bucket[h & r->mask] = e;
    e->older = r->newest;
    if (r->newest)
        r->newest->newer = e;
    else
        r->oldest = e;
    r->newest = e;
    r->n++;
    expire(r, max, now);
    return 0;
}

const char *respids_get(struct respids *r, const char *id, double now)
{
    if (!r->bucket)
        return NULL;
    struct entry *e = *slot_of(r, id, hash_of(id));
    return e && e->expires > now ? e->source : NULL;
}

size_t respids_count(const struct respids *r)
{
    return r->n;
}

void respids_free(struct respids *r)
{
    if (!r)
        return;
    while (r->oldest) {
        struct entry *e = r->oldest;
        r->oldest = e->newer;
        free(e);
    }
    free(r->bucket);
    free(r);
}
