/* redact.c — exact-match scrubbing of known secrets (see redact.h). */
#include "redact.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NONE          SIZE_MAX
#define STACK_SECRETS 16

struct secret {
    char *p;
    size_t n;
};

struct redact {
    struct secret *s; /* longest first: the longest match wins a tie */
    size_t n;
    size_t min_len;        /* shortest secret; 0 when there are none */
    struct strbuf scratch; /* redact_on_str's output */
};

static int by_length_desc(const void *a, const void *b)
{
    const struct secret *x = a, *y = b;
    return x->n < y->n ? 1 : x->n > y->n ? -1 : 0;
}

struct redact *redact_new(const char *const *secrets, size_t n)
{
    struct redact *r = calloc(1, sizeof(*r));

    if (!r || (n && !(r->s = calloc(n, sizeof(*r->s))))) {
        free(r);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        const char *k = secrets[i];
        size_t len = k ? strlen(k) : 0;
        bool dup = false;
        for (size_t j = 0; j < r->n && !dup; j++)
            dup = r->s[j].n == len && memcmp(r->s[j].p, k, len) == 0;
        if (len == 0 || dup)
            continue;
        if (!(r->s[r->n].p = malloc(len))) {
            redact_free(r);
            return NULL;
        }
        memcpy(r->s[r->n].p, k, len);
        r->s[r->n++].n = len;
    }
    if (r->n > 1)
        qsort(r->s, r->n, sizeof(*r->s), by_length_desc);
    r->min_len = r->n ? r->s[r->n - 1].n : 0;
    return r;
}

void redact_free(struct redact *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++) {
        explicit_bzero(r->s[i].p, r->s[i].n);
        free(r->s[i].p);
    }
    free(r->s);
    /* The scratch buffer held redacted text only, but may have held a
     * secret's neighbours: wipe it too. */
    if (r->scratch.data)
        explicit_bzero(r->scratch.data, r->scratch.cap);
    strbuf_fini(&r->scratch);
    free(r);
}

bool redact_hit(const struct redact *r, const char *s, size_t n)
{
    if (!r || r->n == 0 || n < r->min_len)
        return false;
    for (size_t i = 0; i < r->n; i++) {
        if (r->s[i].n <= n && memmem(s, n, r->s[i].p, r->s[i].n))
            return true;
    }
    return false;
}

static size_t find_from(const struct secret *k, const char *s, size_t n, size_t from)
{
    if (from > n || n - from < k->n)
        return NONE;
    const char *p = memmem(s + from, n - from, k->p, k->n);
    return p ? (size_t)(p - s) : NONE;
}

long redact_copy(const struct redact *r, const char *s, size_t n, struct strbuf *out)
{
    size_t stack_next[STACK_SECRETS];
    size_t nk = r ? r->n : 0, start = out->len, pos = 0;
    long hits = 0;

    if (strbuf_reserve(out, n) < 0)
        return TRANSCODE_ENOMEM;
    if (n == 0 || !redact_hit(r, s, n)) {
        if (n)
            memcpy(out->data + out->len, s, n);
        out->len += n;
        out->data[out->len] = '\0';
        return 0;
    }
    /* next[i]: where secret i next occurs at or after pos. Each secret's
     * occurrences are searched for once, left to right, so the whole copy
     * is linear in n for each secret however many echoes the text holds. */
    size_t *next = nk <= STACK_SECRETS ? stack_next : malloc(nk * sizeof(*next));
    if (!next)
        return TRANSCODE_ENOMEM;
    for (size_t i = 0; i < nk; i++)
        next[i] = find_from(&r->s[i], s, n, 0);
    for (;;) {
        size_t best = NONE, at = NONE;
        for (size_t i = 0; i < nk; i++) {
            if (next[i] < at) { /* strict: a tie keeps the longer (earlier) */
                at = next[i];
                best = i;
            }
        }
        size_t upto = best == NONE ? n : at;
        if (strbuf_reserve(out, upto - pos + sizeof(REDACT_MARKER)) < 0) {
            out->len = start;
            hits = TRANSCODE_ENOMEM;
            break;
        }
        memcpy(out->data + out->len, s + pos, upto - pos);
        out->len += upto - pos;
        if (best == NONE)
            break;
        memcpy(out->data + out->len, REDACT_MARKER, sizeof(REDACT_MARKER) - 1);
        out->len += sizeof(REDACT_MARKER) - 1;
        hits++;
        pos = at + r->s[best].n;
        for (size_t i = 0; i < nk; i++) {
            if (next[i] != NONE && next[i] < pos)
                next[i] = find_from(&r->s[i], s, n, pos);
        }
    }
    if (out->data)
        out->data[out->len] = '\0';
    if (next != stack_next)
        free(next);
    return hits;
}

int redact_on_str(void *ud, const char **s, size_t *n)
{
    struct redact *r = ud;

    if (!redact_hit(r, *s, *n))
        return 0;
    strbuf_reset(&r->scratch);
    if (redact_copy(r, *s, *n, &r->scratch) < 0)
        return TRANSCODE_ENOMEM;
    *s = r->scratch.data;
    *n = r->scratch.len;
    return 0;
}
