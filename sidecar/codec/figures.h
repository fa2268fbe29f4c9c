/*
 * figures.h — one table of named figures, rendered two ways: as a map of
 * the `stats` answer (proto/PROTOCOL.md, through the reply writer) and as
 * Prometheus families (src/prom.h, docs/METRICS.md). A figure is listed
 * once with its stats key, its metric name, type and help, and where its
 * value is; each renderer walks the table, so the two cannot drift apart
 * and no map size is counted by hand.
 *
 * A figure may be shown in stats only (metric NULL: a text, a nested map,
 * a figure no family has), in /metrics only (key NULL: a histogram, a
 * figure stats shows differently) or in both. Several figures may form
 * one family, each with its own label or two (`label`, `label_value`,
 * then `label2`, `label2_value`): the family is written where its first
 * figure is, with all their samples (its type and help are the first
 * figure's). A vector
 * figure is `n` counters in a row of uint64_t, named by `name`: keys
 * `key` + name in stats, samples labelled `label` = name in /metrics.
 *
 * Rows: a table may describe one object (a section of counters, row 0) or
 * each of many (a source, an app: `row` picks one). In stats the caller
 * writes one row as one map; in /metrics each family has one sample per
 * row, labelled by the table's row_labels.
 *
 * Stats keys keep the table's order; families come in the order of their
 * first figure. Pure: no I/O, no allocation beyond the writer's and the
 * text's own.
 */
#ifndef POLYGW_FIGURES_H
#define POLYGW_FIGURES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "prom.h"
#include "writer.h"

enum fig_kind {
    FIG_U64,    /* uint64_t (a vector when n > 0) */
    FIG_DOUBLE, /* double */
    FIG_BOOL,   /* bool: true / false in stats, 1 / 0 in /metrics */
    FIG_STR,    /* const char *: stats only */
    FIG_HIST,   /* struct prom_hist: /metrics only */
    FIG_MAP,    /* a nested table: a map in stats, its families in /metrics */
    FIG_CUSTOM, /* a value `write` writes: stats only */
};

enum {
    /* Left out of /metrics on request (figs_render's `skip`): the local
     * governance's, meaningless with a shared backend. */
    FIG_LOCAL = 1u << 0,
    /* FIG_CUSTOM: `write` writes the key too (a writer another answer
     * shares). */
    FIG_OWN_KEY = 1u << 1,
};

/* A value as `get` gives it; `nil`: there is none (an unlimited bucket's
 * level, an unknown peer's uid): nil in stats, no sample in /metrics. */
struct fig_val {
    union {
        uint64_t u;
        double d;
        bool b;
        const char *s;
        const struct prom_hist *h;
    };
    bool nil;
};

struct fig_table;

struct figure {
    const char *key;    /* stats key (a vector's prefix); NULL: /metrics only */
    const char *metric; /* family name; NULL: stats only */
    const char *type;   /* "counter", "gauge" or "histogram" */
    const char *help;
    const char *label, *label_value;   /* this figure's own label; NULL: none */
    const char *label2, *label2_value; /* a second one, after it; NULL: none */
    enum fig_kind kind;
    /* The value: get(obj, row), or the `kind` at (char *)obj + off. */
    struct fig_val (*get)(const void *obj, size_t row);
    size_t off;
    /* Vector: values off[first .. first + n) of a uint64_t array, value i
     * named name(i). */
    size_t first, n;
    const char *(*name)(size_t i);
    /* NULL, or whether stats shows the key for this object and row (the
     * family is always written). */
    bool (*shown)(const void *obj, size_t row);
    unsigned flags; /* FIG_LOCAL, FIG_OWN_KEY */
    /* FIG_MAP: the nested table, of sub_obj(obj, row) (sub_obj NULL: of
     * obj), row 0; an object of NULL has no families. */
    const struct fig_table *sub;
    const void *(*sub_obj)(const void *obj, size_t row);
    /* FIG_CUSTOM: writes the value. */
    void (*write)(struct writer *w, const void *obj, size_t row);
};

struct fig_table {
    const struct figure *f;
    size_t n;
    /* The labels of row `row` in /metrics, at most FIG_ROW_LABELS; NULL:
     * one row, no labels. */
    size_t (*row_labels)(const void *obj, size_t row, struct prom_label *l);
};

#define FIG_ROW_LABELS 2
#define FIG_TABLE(array)                                  \
    {                                                     \
        (array), sizeof(array) / sizeof((array)[0]), NULL \
    }

/* The stats pairs row `row` of `t` has for `obj`: the map's size. */
uint32_t figs_count(const struct fig_table *t, const void *obj, size_t row);
/* Those pairs, without the map's header (for a map that has more). */
void figs_write_pairs(struct writer *w, const struct fig_table *t, const void *obj, size_t row);
/* The map of row `row`: its header, then its pairs. */
void figs_write_map(struct writer *w, const struct fig_table *t, const void *obj, size_t row);

/* One map of the pairs of several tables, each of its own object (row 0),
 * in order: for a map whose figures are of more than one object. */
struct fig_part {
    const struct fig_table *t;
    const void *obj;
};
void figs_write_parts(struct writer *w, const struct fig_part *parts, size_t n);

/* The families of `t` for `obj`, rows 0 .. n_rows - 1 (with no row_labels,
 * pass 1), nested tables included; figures with a flag in `skip` are left
 * out. */
void figs_render(struct prom_text *p, const struct fig_table *t, const void *obj, size_t n_rows,
                 unsigned skip);

#endif /* POLYGW_FIGURES_H */
