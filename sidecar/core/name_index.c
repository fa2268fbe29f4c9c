/*
 * name_index.c — name_index.h holds the contract.
 */
#include "name_index.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static uint64_t name_hash(const char *s, size_t len)
{
    uint64_t h = 14695981039346656037ull; /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

int name_index_reset(struct name_index *ix, size_t n)
{
    size_t want = 16;

    if (n > UINT32_MAX / 4)
        return -ENOMEM;
    while (want < 2 * n)
        want *= 2;
    if (want > ix->cap) {
        uint32_t *slot = calloc(want, sizeof(*slot));
        if (!slot)
            return -ENOMEM;
        free(ix->slot);
        ix->slot = slot;
        ix->cap = want;
    } else {
        memset(ix->slot, 0, want * sizeof(*ix->slot));
    }
    ix->mask = want - 1;
    return 0;
}

void name_index_fini(struct name_index *ix)
{
    free(ix->slot);
    memset(ix, 0, sizeof(*ix));
}

size_t name_index_find(const struct name_index *ix, const char *s, size_t len, name_at_fn *at,
                       const void *set, size_t *free_slot)
{
    for (size_t i = (size_t)name_hash(s, len) & ix->mask;; i = (i + 1) & ix->mask) {
        uint32_t v = ix->slot[i];
        size_t n;

        if (!v) {
            if (free_slot)
                *free_slot = i;
            return SIZE_MAX;
        }
        const char *t = at(set, v - 1, &n);
        if (n == len && memcmp(t, s, len) == 0)
            return v - 1;
    }
}

size_t name_index_add(struct name_index *ix, size_t pos, name_at_fn *at, const void *set)
{
    size_t len, slot;
    const char *s = at(set, pos, &len);
    size_t prev = name_index_find(ix, s, len, at, set, &slot);

    if (prev == SIZE_MAX)
        ix->slot[slot] = (uint32_t)pos + 1;
    return prev;
}
