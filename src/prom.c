/* prom.c — see prom.h. */
#include "prom.h"
#include "strbuf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Each bound twice, as a double and as text (the unit tests check that
 * the two agree). */
const struct prom_buckets prom_buckets_latency_s = {
    18,
    { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
      600 },
    { "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5",
      "10", "30", "60", "120", "300", "600" },
};

const struct prom_buckets prom_buckets_rtt_s = {
    14,
    { 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5 },
    { "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1",
      "0.25", "0.5", "1", "2.5" },
};

/* ------------------------------------------------------------------ */

void prom_hist_init(struct prom_hist *h, const struct prom_buckets *b)
{
    memset(h, 0, sizeof(*h));
    h->b = b;
}

void prom_hist_observe(struct prom_hist *h, double v)
{
    size_t i = 0;

    if (isnan(v))
        return;
    if (v < 0)
        v = 0;
    while (i < h->b->n && v > h->b->le[i])
        i++;
    h->bucket[i]++;
    h->count++;
    h->sum += v;
}

/* ------------------------------------------------------------------ */

void prom_text_init(struct prom_text *t)
{
    memset(t, 0, sizeof(*t));
}

void prom_text_fini(struct prom_text *t)
{
    free(t->data);
    memset(t, 0, sizeof(*t));
}

bool prom_text_reserve(struct prom_text *t, size_t n)
{
    if (t->oom)
        return false;
    if (t->len + n + 1 <= t->cap)
        return true;
    size_t cap = t->cap ? t->cap : 4096;
    while (cap < t->len + n + 1)
        cap *= 2;
    char *p = realloc(t->data, cap);
    if (!p) {
        t->oom = true;
        return false;
    }
    t->data = p;
    t->cap = cap;
    return true;
}

/* The NUL is written once, by prom_text_take (prom_text_reserve keeps room). */
static void text_put(struct prom_text *t, const char *s, size_t n)
{
    if (t->len + n + 1 > t->cap && !prom_text_reserve(t, n))
        return;
    memcpy(t->data + t->len, s, n);
    t->len += n;
}

static void text_puts(struct prom_text *t, const char *s)
{
    text_put(t, s, strlen(s));
}

/* `s` with backslash and newline escaped, and the double quote too when
 * `quote` (label values; HELP text keeps its quotes). */
static void text_escaped(struct prom_text *t, const char *s, bool quote)
{
    const char *run = s;

    if (!strpbrk(s, quote ? "\\\n\"" : "\\\n")) {
        text_puts(t, s);
        return;
    }
    for (; *s; s++) {
        const char *esc = *s == '\\' ? "\\\\"
            : *s == '\n'             ? "\\n"
            : quote && *s == '"'     ? "\\\""
                                     : NULL;
        if (!esc)
            continue;
        text_put(t, run, (size_t)(s - run));
        text_put(t, esc, 2);
        run = s + 1;
    }
    text_put(t, run, (size_t)(s - run));
}

/* The shortest of %.15g / %.17g that reads back as `v`. */
static void format_double(char *buf, size_t cap, double v)
{
    if (isnan(v)) {
        snprintf(buf, cap, "NaN");
    } else if (isinf(v)) {
        snprintf(buf, cap, v > 0 ? "+Inf" : "-Inf");
    } else {
        snprintf(buf, cap, "%.15g", v);
        if (strtod(buf, NULL) != v)
            snprintf(buf, cap, "%.17g", v);
    }
}

/* Decimal digits of `v` into buf (>= 21 bytes), NUL-terminated; snprintf
 * costs more than the rest of a sample line. */
static const char *format_u64(char *buf, size_t cap, uint64_t v)
{
    (void)cap;
    *put_uint(buf, v) = '\0';
    return buf;
}

/* {a="x",b="y"[,extra="z"]}, nothing when there is no label at all. */
static void text_labels(struct prom_text *t, const struct prom_label *l, size_t n,
                        const char *extra_name, const char *extra_value)
{
    if (n == 0 && !extra_name)
        return;
    text_put(t, "{", 1);
    for (size_t i = 0; i < n; i++) {
        if (i)
            text_put(t, ",", 1);
        text_puts(t, l[i].name);
        text_put(t, "=\"", 2);
        text_escaped(t, l[i].value ? l[i].value : "", true);
        text_put(t, "\"", 1);
    }
    if (extra_name) {
        if (n)
            text_put(t, ",", 1);
        text_puts(t, extra_name);
        text_put(t, "=\"", 2);
        text_escaped(t, extra_value, true);
        text_put(t, "\"", 1);
    }
    text_put(t, "}", 1);
}

static void text_line(struct prom_text *t, const char *name, const char *suffix,
                      const struct prom_label *l, size_t n, const char *extra_name,
                      const char *extra_value, const char *value)
{
    text_puts(t, name);
    text_puts(t, suffix);
    text_labels(t, l, n, extra_name, extra_value);
    text_put(t, " ", 1);
    text_puts(t, value);
    text_put(t, "\n", 1);
}

void prom_text_family(struct prom_text *t, const char *name, const char *type, const char *help)
{
    text_puts(t, "# HELP ");
    text_puts(t, name);
    text_put(t, " ", 1);
    text_escaped(t, help, false);
    text_puts(t, "\n# TYPE ");
    text_puts(t, name);
    text_put(t, " ", 1);
    text_puts(t, type);
    text_put(t, "\n", 1);
}

void prom_text_sample(struct prom_text *t, const char *name, const struct prom_label *labels,
                      size_t n_labels, double v)
{
    char buf[40];
    format_double(buf, sizeof(buf), v);
    text_line(t, name, "", labels, n_labels, NULL, NULL, buf);
}

void prom_text_sample_u64(struct prom_text *t, const char *name, const struct prom_label *labels,
                          size_t n_labels, uint64_t v)
{
    char buf[24];
    text_line(t, name, "", labels, n_labels, NULL, NULL, format_u64(buf, sizeof(buf), v));
}

void prom_text_hist(struct prom_text *t, const char *name, const struct prom_label *labels,
                    size_t n_labels, const struct prom_hist *h)
{
    char le[40], val[40];
    uint64_t cum = 0;

    for (size_t i = 0; i <= h->b->n; i++) {
        const char *bound = i == h->b->n ? "+Inf" : h->b->le_text[i];
        cum += h->bucket[i];
        if (!bound) {
            format_double(le, sizeof(le), h->b->le[i]);
            bound = le;
        }
        text_line(t, name, "_bucket", labels, n_labels, "le", bound,
                  format_u64(val, sizeof(val), cum));
    }
    format_double(val, sizeof(val), h->sum);
    text_line(t, name, "_sum", labels, n_labels, NULL, NULL, val);
    text_line(t, name, "_count", labels, n_labels, NULL, NULL,
              format_u64(val, sizeof(val), h->count));
}

char *prom_text_take(struct prom_text *t, size_t *len)
{
    char *out = t->data;

    if (t->oom) {
        free(out);
        out = NULL;
    } else if (!out) {
        out = strdup("");
    } else {
        out[t->len] = '\0';
    }
    *len = out ? t->len : 0;
    memset(t, 0, sizeof(*t));
    return out;
}
