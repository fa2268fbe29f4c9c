/*
 * modelmatch.c — model names against public names and globs (see
 * modelmatch.h).
 */
#include "modelmatch.h"

#include <string.h>

bool models_is_glob(const char *pat)
{
    return strchr(pat, '*') != NULL;
}

/* Does glob `p` match the `len` bytes of `s`? The usual two-pointer walk:
 * on a mismatch, the last `*` takes one more character. O(|p| x len) at
 * worst, both bounded (config text, MODELS_NAME_MAX). */
static bool glob_match(const char *p, const char *s, size_t len)
{
    const char *star = NULL;
    size_t i = 0, resume = 0;

    while (i < len) {
        if (*p == '*') {
            star = ++p;
            resume = i;
        } else if (*p && *p == s[i]) {
            p++;
            i++;
        } else if (star) {
            p = star;
            i = ++resume;
        } else {
            return false;
        }
    }
    while (*p == '*')
        p++;
    return *p == '\0';
}

int models_match(const char *pat, const char *name, size_t len)
{
    if (!models_is_glob(pat))
        return strlen(pat) == len && memcmp(pat, name, len) == 0 ? MODELS_EXACT : -1;
    if (!glob_match(pat, name, len))
        return -1;
    int literal = 0;
    for (const char *p = pat; *p; p++)
        literal += *p != '*';
    return literal;
}

int models_rank(const char *model, char *const *serves, size_t n_serves, const char *name,
                size_t len, const char **pat)
{
    int best = -1;

    if (pat)
        *pat = NULL;
    if (!model && n_serves == 0)
        return 0; /* serves every name, passed through */
    if (model && models_match(model, name, len) == MODELS_EXACT) {
        if (pat)
            *pat = model;
        return MODELS_EXACT;
    }
    for (size_t i = 0; i < n_serves; i++) {
        int r = models_match(serves[i], name, len);
        if (r > best) {
            best = r;
            if (pat)
                *pat = serves[i];
        }
    }
    return best;
}
