/*
 * name_index.h — a hash index over the names of some array (map keys,
 * sources, capabilities), for the configuration loader's duplicate and
 * reference checks. Open addressing over positions in the array; a
 * `name_at_fn` reads the name at a position (the index stores no names).
 * At least half the slots stay free, so a probe always ends.
 */
#ifndef POLYGW_NAME_INDEX_H
#define POLYGW_NAME_INDEX_H

#include <stddef.h>
#include <stdint.h>

/* The name at position `pos` of `set` and its length in *len (borrowed). */
typedef const char *name_at_fn(const void *set, size_t pos, size_t *len);

struct name_index {
    uint32_t *slot; /* owned; position + 1, 0 = free */
    size_t mask;    /* slots in use - 1 (a power of two) */
    size_t cap;     /* slots allocated */
};

/* Empties the index, sized for up to `n` names. Reuses the memory it has
 * and clears only the slots this use needs, so many small uses in a row
 * (one per map) cost no more than their total size. 0 or -ENOMEM. A
 * zeroed struct is an empty index. */
int name_index_reset(struct name_index *ix, size_t n);

/* Frees the slots; the index is zeroed. */
void name_index_fini(struct name_index *ix);

/* Position of the name equal to `s` (`len` bytes), or SIZE_MAX; *free_slot
 * (may be NULL) gets the slot where it would go. */
size_t name_index_find(const struct name_index *ix, const char *s, size_t len, name_at_fn *at,
                       const void *set, size_t *free_slot);

/* Adds the name at position `pos` unless an equal one is there: returns the
 * earlier one's position, or SIZE_MAX when `pos` was added. At most the `n`
 * of the last reset may be added. */
size_t name_index_add(struct name_index *ix, size_t pos, name_at_fn *at, const void *set);

#endif /* POLYGW_NAME_INDEX_H */
