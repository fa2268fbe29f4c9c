/*
 * yamltree.c — libyaml's event stream folded into a node tree, and the
 * scalar resolution the configuration loader applies to it. yamltree.h
 * holds the contract.
 */
#include "yamltree.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "name_index.h"

/* One parse. */
struct yt {
    const char *input; /* the YAML text (borrowed), for syntax hints */
    size_t input_len;
    unsigned max_depth;
    struct yamltree_error *err;
    struct name_index keys; /* one map's keys at a time (tree_mark_dups) */
};

static void yt_vappend(struct yt *t, const char *fmt, va_list ap)
{
    size_t used = strlen(t->err->text);

    if (used < sizeof(t->err->text) - 1)
        vsnprintf(t->err->text + used, sizeof(t->err->text) - used, fmt, ap);
}

static void yt_append(struct yt *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void yt_append(struct yt *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    yt_vappend(t, fmt, ap);
    va_end(ap);
}

/* Records the parse's error (the first one only: the parse stops there).
 * Returns -EINVAL. */
static int yt_fail(struct yt *t, unsigned line, unsigned col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int yt_fail(struct yt *t, unsigned line, unsigned col, const char *fmt, ...)
{
    va_list ap;

    if (t->err->text[0] || t->err->nomem)
        return -EINVAL;
    t->err->line = line;
    t->err->col = col;
    va_start(ap, fmt);
    yt_vappend(t, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

static int yt_nomem(struct yt *t)
{
    t->err->nomem = true;
    return -ENOMEM;
}


void ynode_free(struct ynode *n)
{
    if (!n)
        return;
    for (size_t i = 0; i < n->n_kids; i++)
        ynode_free(n->kids[i]);
    free(n->kids);
    if (n->text) {
        /* The text may be a pasted secret (an inline api_key: is rejected,
         * but it was read); do not leave it in freed memory. */
        explicit_bzero(n->text, n->len);
        free(n->text);
    }
    free(n);
}

static int ynode_append(struct ynode *parent, struct ynode *kid)
{
    if (parent->n_kids == parent->cap_kids) {
        size_t cap = parent->cap_kids ? parent->cap_kids * 2 : 8;
        struct ynode **k = realloc(parent->kids, cap * sizeof(*k));
        if (!k)
            return -ENOMEM;
        parent->kids = k;
        parent->cap_kids = cap;
    }
    parent->kids[parent->n_kids++] = kid;
    return 0;
}

static int fail_yaml(struct yt *t, const yaml_parser_t *p)
{
    switch (p->error) {
    case YAML_MEMORY_ERROR:
        return yt_nomem(t);
    case YAML_READER_ERROR:
        /* problem_value is the offending byte: never echoed. */
        return yt_fail(t, 0, 0, "invalid input at byte %zu: %s", p->problem_offset,
                       p->problem ? p->problem : "unreadable");
    default:
        yt_fail(t, (unsigned)p->problem_mark.line + 1, (unsigned)p->problem_mark.column + 1,
                "YAML syntax error: %s", p->problem ? p->problem : "unknown problem");
        if (p->context)
            yt_append(t, " (%s at line %zu)", p->context, p->context_mark.line + 1);
        if (p->problem_mark.index < t->input_len && t->input[p->problem_mark.index] == '\t')
            yt_append(t, "; YAML indentation must use spaces, not tabs");
        return -EINVAL;
    }
}

static int tree_next(struct yt *t, yaml_parser_t *p, yaml_event_t *ev)
{
    if (!yaml_parser_parse(p, ev))
        return fail_yaml(t, p);
    return 0;
}

static const char *map_key_at(const void *set, size_t pos, size_t *len)
{
    const struct ynode *k = ((const struct ynode *)set)->kids[2 * pos];
    *len = k->len;
    return k->text;
}

/* Marks each key of `map` that repeats an earlier one (dup_line) for the
 * walk to report with its key path. Keys that are not scalars are left to
 * the walk ("map keys must be plain strings"). */
static int tree_mark_dups(struct yt *t, struct ynode *map)
{
    size_t n = map->n_kids / 2;

    if (n < 2)
        return 0;
    if (name_index_reset(&t->keys, n) < 0)
        return yt_nomem(t);
    for (size_t i = 0; i < n; i++) {
        struct ynode *k = map->kids[2 * i];
        if (k->kind != YN_SCALAR)
            continue;
        size_t prev = name_index_add(&t->keys, i, map_key_at, map);
        if (prev != SIZE_MAX)
            k->dup_line = map->kids[2 * prev]->line;
    }
    return 0;
}

/* Builds the node that starts with `ev` (taken: always deleted). */
static int tree_node(struct yt *t, yaml_parser_t *p, yaml_event_t *ev, unsigned depth,
                     struct ynode **out)
{
    unsigned line = (unsigned)ev->start_mark.line + 1;
    const yaml_char_t *anchor = NULL, *tag = NULL;
    yaml_event_type_t end;
    struct ynode *n;
    int rc;

    *out = NULL;
    switch (ev->type) {
    case YAML_SCALAR_EVENT:
        anchor = ev->data.scalar.anchor;
        tag = ev->data.scalar.tag;
        end = YAML_NO_EVENT;
        break;
    case YAML_MAPPING_START_EVENT:
        anchor = ev->data.mapping_start.anchor;
        tag = ev->data.mapping_start.tag;
        end = YAML_MAPPING_END_EVENT;
        break;
    case YAML_SEQUENCE_START_EVENT:
        anchor = ev->data.sequence_start.anchor;
        tag = ev->data.sequence_start.tag;
        end = YAML_SEQUENCE_END_EVENT;
        break;
    case YAML_ALIAS_EVENT:
        yaml_event_delete(ev);
        return yt_fail(t, line, 0,
                       "YAML aliases (*name) are not supported; "
                       "write the value out");
    default:
        yaml_event_delete(ev);
        return yt_fail(t, line, 0, "unexpected YAML event");
    }
    if (anchor) {
        yaml_event_delete(ev);
        return yt_fail(t, line, 0,
                       "YAML anchors (&name) are not supported; "
                       "write the value out");
    }
    if (tag) {
        yaml_event_delete(ev);
        return yt_fail(t, line, 0, "YAML tags (!tag, !!type) are not supported");
    }
    if (depth > t->max_depth) {
        yaml_event_delete(ev);
        return yt_fail(t, line, 0, "nested deeper than %u levels", t->max_depth);
    }

    n = calloc(1, sizeof(*n));
    if (!n) {
        yaml_event_delete(ev);
        return yt_nomem(t);
    }
    n->line = line;
    n->col = (unsigned)ev->start_mark.column + 1;

    if (ev->type == YAML_SCALAR_EVENT) {
        n->kind = YN_SCALAR;
        n->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        n->len = ev->data.scalar.length;
        n->text = malloc(n->len + 1);
        if (!n->text) {
            yaml_event_delete(ev);
            ynode_free(n);
            return yt_nomem(t);
        }
        memcpy(n->text, ev->data.scalar.value, n->len);
        n->text[n->len] = '\0';
        /* libyaml frees without wiping; clear its copy of a possible secret. */
        explicit_bzero(ev->data.scalar.value, n->len);
        yaml_event_delete(ev);
        *out = n;
        return 0;
    }

    n->kind = ev->type == YAML_MAPPING_START_EVENT ? YN_MAP : YN_SEQ;
    yaml_event_delete(ev);
    for (;;) {
        yaml_event_t kev;
        struct ynode *kid;

        if ((rc = tree_next(t, p, &kev)) < 0)
            goto fail;
        if (kev.type == end) {
            yaml_event_delete(&kev);
            break;
        }
        if ((rc = tree_node(t, p, &kev, depth + 1, &kid)) < 0)
            goto fail;
        if (ynode_append(n, kid) < 0) {
            ynode_free(kid);
            rc = yt_nomem(t);
            goto fail;
        }
    }
    if (n->kind == YN_MAP && (rc = tree_mark_dups(t, n)) < 0)
        goto fail;
    *out = n;
    return 0;
fail:
    ynode_free(n);
    return rc;
}

int yamltree_parse(const char *yaml, size_t len, unsigned max_depth, struct ynode **root,
                   struct yamltree_error *err)
{
    yaml_parser_t p;
    yaml_event_t ev;
    struct ynode *n = NULL;
    int rc;

    struct yt t_ = { .input = yaml, .input_len = len, .max_depth = max_depth, .err = err };
    struct yt *t = &t_;

    *root = NULL;
    memset(err, 0, sizeof(*err));
    if (!yaml_parser_initialize(&p))
        return yt_nomem(t);
    yaml_parser_set_input_string(&p, (const unsigned char *)yaml, len);

    if ((rc = tree_next(t, &p, &ev)) < 0) /* STREAM-START */
        goto out;
    yaml_event_delete(&ev);
    if ((rc = tree_next(t, &p, &ev)) < 0)
        goto out;
    if (ev.type == YAML_STREAM_END_EVENT) {
        yaml_event_delete(&ev);
        goto out; /* no document at all */
    }
    yaml_event_delete(&ev); /* DOCUMENT-START */
    if ((rc = tree_next(t, &p, &ev)) < 0)
        goto out;
    if ((rc = tree_node(t, &p, &ev, 0, &n)) < 0)
        goto out;
    if ((rc = tree_next(t, &p, &ev)) < 0) /* DOCUMENT-END */
        goto out;
    yaml_event_delete(&ev);
    if ((rc = tree_next(t, &p, &ev)) < 0)
        goto out;
    if (ev.type != YAML_STREAM_END_EVENT) {
        unsigned line = (unsigned)ev.start_mark.line + 1;
        yaml_event_delete(&ev);
        rc = yt_fail(t, line, 0, "only one YAML document is allowed");
        goto out;
    }
    yaml_event_delete(&ev);
    if (ynode_is_null(n)) {
        ynode_free(n);
        n = NULL;
    }
    *root = n;
    n = NULL;
out:
    ynode_free(n);
    yaml_parser_delete(&p);
    name_index_fini(&t->keys);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Scalar resolution (YAML 1.2 core schema, plain scalars only)             */

static bool text_is(const struct ynode *n, const char *const *words)
{
    for (; *words; words++)
        if (strlen(*words) == n->len && memcmp(*words, n->text, n->len) == 0)
            return true;
    return false;
}

bool ynode_is_null(const struct ynode *n)
{
    static const char *const nulls[] = { "~", "null", "Null", "NULL", NULL };
    return n && n->kind == YN_SCALAR && n->plain && (n->len == 0 || text_is(n, nulls));
}

int ynode_bool(const struct ynode *n)
{
    static const char *const yes[] = { "true", "True", "TRUE", NULL };
    static const char *const no[] = { "false", "False", "FALSE", NULL };
    if (n->kind != YN_SCALAR || !n->plain)
        return -1;
    return text_is(n, yes) ? 1 : text_is(n, no) ? 0 : -1;
}

int ynode_int(const struct ynode *n, int64_t *out)
{
    const char *s = n->text, *digits = s;
    int base = 10;
    char *end;

    if (n->kind != YN_SCALAR || !n->plain || n->len == 0 || strlen(s) != n->len)
        return 0;
    if (s[0] == '0' && (s[1] == 'o' || s[1] == 'x')) {
        base = s[1] == 'o' ? 8 : 16;
        digits = s + 2;
    } else if (s[0] == '-' || s[0] == '+') {
        digits = s + 1;
    }
    if (!*digits)
        return 0;
    for (const char *c = digits; *c; c++)
        if (!(base == 16 ? isxdigit((unsigned char)*c)
                         : (*c >= '0' && *c <= (base == 8 ? '7' : '9'))))
            return 0;
    errno = 0;
    long long v = strtoll(base == 10 ? s : digits, &end, base);
    if (errno == ERANGE)
        return -1;
    *out = v;
    return 1;
}

int ynode_float(const struct ynode *n, double *out)
{
    static const char *const infs[] = { ".inf",  ".Inf",  ".INF",  "+.inf", "+.Inf",
                                        "+.INF", "-.inf", "-.Inf", "-.INF", NULL };
    static const char *const nans[] = { ".nan", ".NaN", ".NAN", NULL };
    const char *c;
    int64_t i;
    int r;

    if (n->kind != YN_SCALAR || !n->plain || n->len == 0 || strlen(n->text) != n->len)
        return 0;
    if ((r = ynode_int(n, &i)) != 0) {
        if (r > 0) {
            *out = (double)i;
            return 1;
        }
    }
    if (text_is(n, infs)) {
        *out = n->text[0] == '-' ? -INFINITY : INFINITY;
        return 1;
    }
    if (text_is(n, nans)) {
        *out = NAN;
        return 1;
    }
    c = n->text;
    if (*c == '-' || *c == '+')
        c++;
    size_t int_digits = strspn(c, "0123456789");
    c += int_digits;
    size_t frac_digits = 0;
    if (*c == '.') {
        c++;
        frac_digits = strspn(c, "0123456789");
        c += frac_digits;
    }
    if (int_digits == 0 && frac_digits == 0)
        return 0;
    if (*c == 'e' || *c == 'E') {
        c++;
        if (*c == '-' || *c == '+')
            c++;
        size_t exp_digits = strspn(c, "0123456789");
        if (exp_digits == 0)
            return 0;
        c += exp_digits;
    }
    if (*c)
        return 0;
    *out = strtod(n->text, NULL);
    return 1;
}

const char *ynode_what(const struct ynode *n)
{
    double d;
    switch (n->kind) {
    case YN_MAP:
        return "a map";
    case YN_SEQ:
        return "a list";
    case YN_SCALAR:
        break;
    }
    if (!n->plain)
        return "a string";
    if (ynode_is_null(n))
        return "null";
    if (ynode_bool(n) >= 0)
        return "a boolean";
    if (ynode_float(n, &d))
        return "a number";
    return "a string";
}
