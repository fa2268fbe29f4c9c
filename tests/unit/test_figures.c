/* test_figures.c — tables of figures (sidecar/codec/figures.h): the stats
 * map and the Prometheus families one table gives, with map sizes counted
 * from it (the JSON writer fails on a wrong count), keys shown only when
 * asked, nil values, vectors, families several figures share, rows,
 * nested tables, a figure's two labels and a map of several tables. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "codec/figures.h"
#include "suites.h"

struct thing {
    uint64_t hits, misses;
    uint64_t by_kind[3];
    double ratio;
    bool on;
    const char *name;
    struct prom_hist lat;
};

struct inner {
    uint64_t depth;
};

static const char *kind_name(size_t i)
{
    static const char *const names[] = { "a", "b", "c" };
    return names[i];
}

static bool when_on(const void *obj, size_t row)
{
    (void)row;
    return ((const struct thing *)obj)->on;
}

static struct fig_val none(const void *obj, size_t row)
{
    (void)obj;
    (void)row;
    return (struct fig_val){ .nil = true };
}

static const struct figure inner_list[] = {
    { .key = "depth",
      .metric = "t_depth",
      .type = "gauge",
      .help = "Depth.",
      .off = offsetof(struct inner, depth) },
};
static const struct fig_table inner_table = FIG_TABLE(inner_list);
static const struct inner the_inner = { 7 };

static const void *inner_of(const void *obj, size_t row)
{
    (void)obj;
    (void)row;
    return &the_inner;
}

static void write_custom(struct writer *w, const void *obj, size_t row)
{
    (void)obj;
    (void)row;
    writer_array(w, 0);
}

static const struct figure list[] = {
    { .key = "name", .kind = FIG_STR, .off = offsetof(struct thing, name) },
    { .key = "hits",
      .metric = "t_lookups_total",
      .type = "counter",
      .help = "Lookups, by result.",
      .label = "result",
      .label_value = "hit",
      .off = offsetof(struct thing, hits) },
    { .key = "on", .kind = FIG_BOOL, .off = offsetof(struct thing, on) },
    { .key = "ratio",
      .metric = "t_ratio",
      .type = "gauge",
      .help = "A ratio.",
      .kind = FIG_DOUBLE,
      .off = offsetof(struct thing, ratio),
      .shown = when_on,
      .flags = FIG_LOCAL },
    { .key = "misses",
      .metric = "t_lookups_total",
      .label = "result",
      .label_value = "miss",
      .off = offsetof(struct thing, misses) },
    { .key = "kind_",
      .metric = "t_kinds_total",
      .type = "counter",
      .help = "By kind.",
      .label = "kind",
      .off = offsetof(struct thing, by_kind),
      .first = 1,
      .n = 2,
      .name = kind_name },
    { .key = "unknown", .metric = "t_unknown", .type = "gauge", .help = "Never.", .get = none },
    { .metric = "t_latency_seconds",
      .type = "histogram",
      .help = "Latency.",
      .kind = FIG_HIST,
      .off = offsetof(struct thing, lat) },
    { .key = "inner", .kind = FIG_MAP, .sub = &inner_table, .sub_obj = inner_of },
    { .key = "custom", .kind = FIG_CUSTOM, .write = write_custom },
};
static const struct fig_table table = FIG_TABLE(list);

static void thing_init(struct thing *t, bool on)
{
    static const struct prom_buckets b = { 1, { 1 }, { NULL } };

    memset(t, 0, sizeof(*t));
    *t = (struct thing){
        .hits = 3, .misses = 4, .by_kind = { 9, 5, 6 }, .ratio = 0.5, .on = on, .name = "x"
    };
    prom_hist_init(&t->lat, &b);
    prom_hist_observe(&t->lat, 0.5);
}

/* The JSON of one map: row `row` of `t`, or (t NULL) the `n` parts. */
static char *map_json(const struct fig_table *t, const void *obj, size_t row,
                      const struct fig_part *parts, size_t n)
{
    struct strbuf out;
    struct writer w;

    strbuf_init(&out);
    writer_init_json(&w, &out);
    if (t)
        figs_write_map(&w, t, obj, row);
    else
        figs_write_parts(&w, parts, n);
    ck_assert_int_eq(w.err, 0);
    ck_assert_int_eq(w.depth, 0);
    char *s = strndup(out.data, out.len);
    ck_assert_ptr_nonnull(s);
    strbuf_fini(&out);
    return s;
}

static char *stats_json(const struct thing *t)
{
    return map_json(&table, t, 0, NULL, 0);
}

START_TEST(test_figures__stats_map)
{
    struct thing t;

    thing_init(&t, true);
    char *s = stats_json(&t);
    ck_assert_str_eq(s,
                     "{\"name\":\"x\",\"hits\":3,\"on\":true,\"ratio\":0.5,\"misses\":4,"
                     "\"kind_b\":5,\"kind_c\":6,\"unknown\":null,\"inner\":{\"depth\":7},"
                     "\"custom\":[]}");
    free(s);
    ck_assert_uint_eq(figs_count(&table, &t, 0), 10);
    /* A key shown only when asked: the count follows. */
    thing_init(&t, false);
    s = stats_json(&t);
    ck_assert_ptr_null(strstr(s, "ratio"));
    free(s);
    ck_assert_uint_eq(figs_count(&table, &t, 0), 9);
}
END_TEST

static char *families(const struct fig_table *t, const void *obj, size_t n_rows, unsigned skip)
{
    struct prom_text p;
    size_t len;

    prom_text_init(&p);
    figs_render(&p, t, obj, n_rows, skip);
    char *s = prom_text_take(&p, &len);
    ck_assert_ptr_nonnull(s);
    return s;
}

static char *render(const struct thing *t, unsigned skip)
{
    return families(&table, t, 1, skip);
}

START_TEST(test_figures__families)
{
    struct thing t;

    thing_init(&t, false); /* `shown` is about stats only */
    char *s = render(&t, 0);
    ck_assert_str_eq(s,
                     "# HELP t_lookups_total Lookups, by result.\n"
                     "# TYPE t_lookups_total counter\n"
                     "t_lookups_total{result=\"hit\"} 3\n"
                     "t_lookups_total{result=\"miss\"} 4\n"
                     "# HELP t_ratio A ratio.\n"
                     "# TYPE t_ratio gauge\n"
                     "t_ratio 0.5\n"
                     "# HELP t_kinds_total By kind.\n"
                     "# TYPE t_kinds_total counter\n"
                     "t_kinds_total{kind=\"b\"} 5\n"
                     "t_kinds_total{kind=\"c\"} 6\n"
                     "# HELP t_unknown Never.\n"
                     "# TYPE t_unknown gauge\n"
                     "# HELP t_latency_seconds Latency.\n"
                     "# TYPE t_latency_seconds histogram\n"
                     "t_latency_seconds_bucket{le=\"1\"} 1\n"
                     "t_latency_seconds_bucket{le=\"+Inf\"} 1\n"
                     "t_latency_seconds_sum 0.5\n"
                     "t_latency_seconds_count 1\n"
                     "# HELP t_depth Depth.\n"
                     "# TYPE t_depth gauge\n"
                     "t_depth 7\n");
    free(s);
    s = render(&t, FIG_LOCAL);
    ck_assert_ptr_null(strstr(s, "t_ratio"));
    free(s);
}
END_TEST

/* Rows: one map each in stats, one labelled sample each in /metrics. */
static size_t row_labels(const void *obj, size_t row, struct prom_label *l)
{
    (void)obj;
    l[0] = (struct prom_label){ "row", row ? "r1" : "r0" };
    return 1;
}

static struct fig_val row_value(const void *obj, size_t row)
{
    return (struct fig_val){ .u = ((const uint64_t *)obj)[row] };
}

static const struct figure row_list[] = {
    { .key = "v", .metric = "t_v", .type = "gauge", .help = "V.", .get = row_value },
};
static const struct fig_table row_table = { row_list, 1, row_labels };

START_TEST(test_figures__rows)
{
    const uint64_t v[2] = { 10, 11 };

    char *s = families(&row_table, v, 2, 0);
    ck_assert_str_eq(s,
                     "# HELP t_v V.\n# TYPE t_v gauge\nt_v{row=\"r0\"} 10\nt_v{row=\"r1\"} 11\n");
    free(s);
    s = map_json(&row_table, v, 1, NULL, 0);
    ck_assert_str_eq(s, "{\"v\":11}");
    free(s);
}
END_TEST

/* Two labels of a figure's own, after the row's; a map of two tables'
 * pairs, each of its own object, sized from both. */
static const struct figure two_list[] = {
    { .key = "v_a",
      .metric = "t_two",
      .type = "gauge",
      .help = "Two.",
      .label = "state",
      .label_value = "failed",
      .label2 = "kind",
      .label2_value = "a",
      .get = row_value },
};
static const struct fig_table two_table = { two_list, 1, row_labels };

START_TEST(test_figures__parts_two_labels)
{
    const uint64_t v[2] = { 10, 11 };
    const struct inner other = { 9 };
    const struct fig_part parts[] = { { &two_table, v }, { &inner_table, &other } };

    char *s = families(&two_table, v, 2, 0);
    ck_assert_str_eq(s,
                     "# HELP t_two Two.\n# TYPE t_two gauge\n"
                     "t_two{row=\"r0\",state=\"failed\",kind=\"a\"} 10\n"
                     "t_two{row=\"r1\",state=\"failed\",kind=\"a\"} 11\n");
    free(s);
    s = map_json(NULL, NULL, 0, parts, 2);
    ck_assert_str_eq(s, "{\"v_a\":10,\"depth\":9}");
    free(s);
}
END_TEST

Suite *figures_suite(void)
{
    Suite *s = suite_create("figures");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_figures__stats_map);
    tcase_add_test(tc, test_figures__families);
    tcase_add_test(tc, test_figures__rows);
    tcase_add_test(tc, test_figures__parts_two_labels);
    suite_add_tcase(s, tc);
    return s;
}
