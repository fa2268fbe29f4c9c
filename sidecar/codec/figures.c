/*
 * figures.c — the two renderers of a table of figures (figures.h).
 */
#include "figures.h"

#include <stdio.h>
#include <string.h>

static struct fig_val value_of(const struct figure *f, const void *obj, size_t row)
{
    const char *at = (const char *)obj + f->off;
    struct fig_val v = { .nil = false };

    if (f->get)
        return f->get(obj, row);
    switch (f->kind) {
    case FIG_U64:
        memcpy(&v.u, at, sizeof(v.u));
        break;
    case FIG_DOUBLE:
        memcpy(&v.d, at, sizeof(v.d));
        break;
    case FIG_BOOL:
        memcpy(&v.b, at, sizeof(v.b));
        break;
    case FIG_STR:
        memcpy(&v.s, at, sizeof(v.s));
        break;
    case FIG_HIST:
        v.h = (const struct prom_hist *)(const void *)at;
        break;
    case FIG_MAP:
    case FIG_CUSTOM:
        break;
    }
    return v;
}

/* Value i of a vector. */
static uint64_t vector_at(const struct figure *f, const void *obj, size_t i)
{
    uint64_t v;
    memcpy(&v, (const char *)obj + f->off + i * sizeof(uint64_t), sizeof(v));
    return v;
}

static bool in_stats(const struct figure *f, const void *obj, size_t row)
{
    return f->key && f->kind != FIG_HIST && (!f->shown || f->shown(obj, row));
}

static const void *sub_obj(const struct figure *f, const void *obj, size_t row)
{
    return f->sub_obj ? f->sub_obj(obj, row) : obj;
}

/* ---- stats ------------------------------------------------------------ */

uint32_t figs_count(const struct fig_table *t, const void *obj, size_t row)
{
    uint32_t n = 0;

    for (size_t i = 0; i < t->n; i++)
        if (in_stats(&t->f[i], obj, row))
            n += t->f[i].n ? (uint32_t)t->f[i].n : 1;
    return n;
}

void figs_write_pairs(struct writer *w, const struct fig_table *t, const void *obj, size_t row)
{
    for (size_t i = 0; i < t->n; i++) {
        const struct figure *f = &t->f[i];
        if (!in_stats(f, obj, row))
            continue;
        if (f->n) {
            for (size_t k = f->first; k < f->first + f->n; k++) {
                char key[64];
                snprintf(key, sizeof(key), "%s%s", f->key, f->name(k));
                writer_kv_u64(w, key, vector_at(f, obj, k));
            }
            continue;
        }
        if (f->kind == FIG_CUSTOM && (f->flags & FIG_OWN_KEY)) {
            f->write(w, obj, row);
            continue;
        }
        writer_str(w, f->key);
        struct fig_val v = value_of(f, obj, row);
        if (v.nil) {
            writer_nil(w);
            continue;
        }
        switch (f->kind) {
        case FIG_U64:
            writer_u64(w, v.u);
            break;
        case FIG_DOUBLE:
            writer_double(w, v.d);
            break;
        case FIG_BOOL:
            writer_bool(w, v.b);
            break;
        case FIG_STR:
            writer_str(w, v.s);
            break;
        case FIG_MAP:
            figs_write_map(w, f->sub, sub_obj(f, obj, row), 0);
            break;
        case FIG_CUSTOM:
            f->write(w, obj, row);
            break;
        case FIG_HIST: /* not in stats */
            break;
        }
    }
}

void figs_write_map(struct writer *w, const struct fig_table *t, const void *obj, size_t row)
{
    writer_map(w, figs_count(t, obj, row));
    figs_write_pairs(w, t, obj, row);
}

void figs_write_parts(struct writer *w, const struct fig_part *parts, size_t n)
{
    uint32_t pairs = 0;

    for (size_t i = 0; i < n; i++)
        pairs += figs_count(parts[i].t, parts[i].obj, 0);
    writer_map(w, pairs);
    for (size_t i = 0; i < n; i++)
        figs_write_pairs(w, parts[i].t, parts[i].obj, 0);
}

/* ---- /metrics --------------------------------------------------------- */

static bool same_family(const struct figure *a, const struct figure *b)
{
    return a->metric && b->metric && strcmp(a->metric, b->metric) == 0;
}

/* The samples of figure `f` for one row, after the row's `n` labels. */
static void render_samples(struct prom_text *p, const struct figure *f, const void *obj, size_t row,
                           struct prom_label *l, size_t n)
{
    if (f->n) {
        for (size_t k = f->first; k < f->first + f->n; k++) {
            l[n] = (struct prom_label){ f->label, f->name(k) };
            prom_text_sample_u64(p, f->metric, l, n + 1, vector_at(f, obj, k));
        }
        return;
    }
    if (f->label)
        l[n++] = (struct prom_label){ f->label, f->label_value };
    if (f->label2)
        l[n++] = (struct prom_label){ f->label2, f->label2_value };
    struct fig_val v = value_of(f, obj, row);
    if (v.nil)
        return;
    switch (f->kind) {
    case FIG_U64:
        prom_text_sample_u64(p, f->metric, l, n, v.u);
        break;
    case FIG_DOUBLE:
        prom_text_sample(p, f->metric, l, n, v.d);
        break;
    case FIG_BOOL:
        prom_text_sample_u64(p, f->metric, l, n, v.b);
        break;
    case FIG_HIST:
        prom_text_hist(p, f->metric, l, n, v.h);
        break;
    case FIG_STR:
    case FIG_MAP:
    case FIG_CUSTOM: /* not in /metrics */
        break;
    }
}

void figs_render(struct prom_text *p, const struct fig_table *t, const void *obj, size_t n_rows,
                 unsigned skip)
{
    for (size_t i = 0; i < t->n; i++) {
        const struct figure *f = &t->f[i];
        bool seen = false;
        if (f->kind == FIG_MAP) {
            const void *sub = sub_obj(f, obj, 0);
            if (sub) /* NULL: a part that is not there (the HTTP front) */
                figs_render(p, f->sub, sub, 1, skip);
            continue;
        }
        if (!f->metric || (f->flags & skip))
            continue;
        for (size_t j = 0; j < i && !seen; j++)
            seen = same_family(&t->f[j], f);
        if (seen) /* written with the first figure of its family */
            continue;
        prom_text_family(p, f->metric, f->type, f->help);
        for (size_t row = 0; row < n_rows; row++) {
            struct prom_label l[FIG_ROW_LABELS + 2]; /* the row's, the figure's own */
            size_t n = t->row_labels ? t->row_labels(obj, row, l) : 0;
            for (size_t j = i; j < t->n; j++)
                if (same_family(&t->f[j], f))
                    render_samples(p, &t->f[j], obj, row, l, n);
        }
    }
}
