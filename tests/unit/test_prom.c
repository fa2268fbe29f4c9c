/*
 * test_prom.c — the Prometheus text writer and the fixed-bucket histograms
 * (src/prom.c), line by line: escaping, value formatting, histogram series,
 * and whole outputs through the strict reader of expo_check.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expo_check.h"
#include "prom.h"
#include "suites.h"

/* The writer's text (owned), checked to be as long as it says. */
static char *take(struct prom_text *t)
{
    size_t len;
    char *s = prom_text_take(t, &len);
    return expo_text(s, len);
}

/* ------------------------------------------------------------------ */

START_TEST(test_prom__hist_buckets_cumulative)
{
    static const struct prom_buckets b = { .n = 3, .le = { 0.1, 1, 10 } };
    struct prom_hist h;
    struct prom_text t;
    const double obs[] = { 0.05, 0.1, 0.5, 0.7, 2, 100, 1e9 };

    prom_hist_init(&h, &b);
    for (size_t i = 0; i < sizeof(obs) / sizeof(obs[0]); i++)
        prom_hist_observe(&h, obs[i]);
    prom_text_init(&t);
    prom_text_family(&t, "x_seconds", "histogram", "h");
    prom_text_hist(&t, "x_seconds", NULL, 0, &h);
    char *s = take(&t);
    /* A bound is inclusive (le): 0.1 falls in the first bucket. */
    expo_assert_line(s, "x_seconds_bucket{le=\"0.1\"} 2");
    expo_assert_line(s, "x_seconds_bucket{le=\"1\"} 4");
    expo_assert_line(s, "x_seconds_bucket{le=\"10\"} 5");
    expo_assert_line(s, "x_seconds_bucket{le=\"+Inf\"} 7");
    expo_assert_line(s, "x_seconds_count 7");
    double sum = 0;
    for (size_t i = 0; i < sizeof(obs) / sizeof(obs[0]); i++)
        sum += obs[i];
    const char *at = strstr(s, "\nx_seconds_sum ");
    ck_assert_ptr_nonnull(at);
    ck_assert_msg(strtod(at + 15, NULL) == sum, "sum %.17g in:\n%s", sum, s);
    expo_check(s);
    free(s);
}
END_TEST

START_TEST(test_prom__hist_ignores_nan_clamps_negative)
{
    struct prom_hist h;

    prom_hist_init(&h, &prom_buckets_latency_s);
    prom_hist_observe(&h, NAN);
    ck_assert_uint_eq(h.count, 0);
    prom_hist_observe(&h, -0.5);
    prom_hist_observe(&h, INFINITY);
    ck_assert_uint_eq(h.count, 2);
    ck_assert_uint_eq(h.bucket[0], 1);                        /* -0.5 counted as 0 */
    ck_assert_uint_eq(h.bucket[prom_buckets_latency_s.n], 1); /* +Inf only */
}
END_TEST

START_TEST(test_prom__hist_labels_and_le)
{
    static const struct prom_buckets b = { .n = 2, .le = { 0.0025, 600 } };
    struct prom_hist h;
    struct prom_text t;
    const struct prom_label l[] = { { "source", "a" }, { "capability", "chat" } };

    prom_hist_init(&h, &b);
    prom_hist_observe(&h, 0.001);
    prom_text_init(&t);
    prom_text_hist(&t, "y", l, 2, &h);
    char *s = take(&t);
    expo_assert_line(s, "y_bucket{source=\"a\",capability=\"chat\",le=\"0.0025\"} 1");
    expo_assert_line(s, "y_bucket{source=\"a\",capability=\"chat\",le=\"600\"} 1");
    expo_assert_line(s, "y_bucket{source=\"a\",capability=\"chat\",le=\"+Inf\"} 1");
    expo_assert_line(s, "y_sum{source=\"a\",capability=\"chat\"} 0.001");
    expo_assert_line(s, "y_count{source=\"a\",capability=\"chat\"} 1");
    free(s);
}
END_TEST

/* The layouts' bound texts are the bounds, written as the writer would. */
START_TEST(test_prom__bucket_texts_match_bounds)
{
    const struct prom_buckets *layouts[] = { &prom_buckets_latency_s, &prom_buckets_rtt_s };

    for (size_t k = 0; k < 2; k++) {
        struct prom_buckets bare = *layouts[k];
        struct prom_hist a, b;
        struct prom_text t;

        ck_assert_uint_le(bare.n, PROM_HIST_MAX);
        for (size_t i = 0; i < bare.n; i++) {
            ck_assert_ptr_nonnull(bare.le_text[i]);
            ck_assert_msg(strtod(bare.le_text[i], NULL) == bare.le[i], "%s", bare.le_text[i]);
            ck_assert(i == 0 || bare.le[i - 1] < bare.le[i]);
            bare.le_text[i] = NULL;
        }
        prom_hist_init(&a, layouts[k]);
        prom_hist_init(&b, &bare);
        prom_text_init(&t);
        prom_text_hist(&t, "h", NULL, 0, &a);
        char *with = take(&t);
        prom_text_hist(&t, "h", NULL, 0, &b);
        char *without = take(&t);
        ck_assert_str_eq(with, without);
        free(with);
        free(without);
    }
}
END_TEST

START_TEST(test_prom__label_values_escaped)
{
    struct prom_text t;
    const struct prom_label l[] = { { "a", "back\\slash" },
                                    { "b", "say \"hi\"" },
                                    { "c", "two\nlines" },
                                    { "d", NULL },
                                    { "e", "ünï" } };

    prom_text_init(&t);
    prom_text_family(&t, "z_total", "counter", "With \\ and\na newline; \"quotes\" stay.");
    prom_text_sample_u64(&t, "z_total", l, 5, 3);
    char *s = take(&t);
    expo_assert_line(s, "# HELP z_total With \\\\ and\\na newline; \"quotes\" stay.");
    expo_assert_line(s, "# TYPE z_total counter");
    expo_assert_line(s,
                     "z_total{a=\"back\\\\slash\",b=\"say \\\"hi\\\"\",c=\"two\\nlines\",d=\"\","
                     "e=\"ünï\"} 3");
    ck_assert_uint_eq(expo_check(s), 1);
    free(s);
}
END_TEST

START_TEST(test_prom__values_read_back_exactly)
{
    const double v[] = { 0,        1,        -2.5,          0.1,
                         1.0 / 3,  1e-300,   123456789.125, 9007199254740993.0,
                         INFINITY, -INFINITY };
    struct prom_text t;

    prom_text_init(&t);
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
        prom_text_sample(&t, "v", NULL, 0, v[i]);
    prom_text_sample(&t, "v", NULL, 0, NAN);
    prom_text_sample_u64(&t, "v", NULL, 0, UINT64_MAX);
    char *s = take(&t);
    const char *p = s;
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        ck_assert(strncmp(p, "v ", 2) == 0);
        char *end;
        double back = strncmp(p + 2, "+Inf", 4) == 0 ? INFINITY
            : strncmp(p + 2, "-Inf", 4) == 0         ? -INFINITY
                                                     : strtod(p + 2, &end);
        ck_assert_msg(back == v[i], "%.17g written as %.*s", v[i], (int)(strchr(p, '\n') - p), p);
        p = strchr(p, '\n') + 1;
    }
    expo_assert_line(s, "v 0.1"); /* the short form when it reads back */
    expo_assert_line(s, "v +Inf");
    expo_assert_line(s, "v NaN");
    expo_assert_line(s, "v 18446744073709551615");
    free(s);
}
END_TEST

START_TEST(test_prom__take_empty_and_reuse)
{
    struct prom_text t;
    size_t len = 99;

    prom_text_init(&t);
    char *s = prom_text_take(&t, &len);
    ck_assert_ptr_nonnull(s);
    ck_assert_str_eq(s, "");
    ck_assert_uint_eq(len, 0);
    free(s);
    prom_text_sample_u64(&t, "after_take", NULL, 0, 1); /* `t` is empty, usable */
    s = take(&t);
    ck_assert_str_eq(s, "after_take 1\n");
    free(s);
    prom_text_sample_u64(&t, "x", NULL, 0, 1);
    prom_text_fini(&t);
}
END_TEST

START_TEST(test_prom__large_text_grows)
{
    struct prom_text t;
    char name[32];

    prom_text_init(&t);
    for (int i = 0; i < 5000; i++) {
        snprintf(name, sizeof(name), "family_%d_total", i);
        prom_text_family(&t, name, "counter", "many families, to grow the buffer");
        prom_text_sample_u64(&t, name, NULL, 0, (uint64_t)i);
    }
    char *s = take(&t);
    ck_assert_uint_eq(expo_check(s), 5000);
    expo_assert_line(s, "family_4999_total 4999");
    free(s);
}
END_TEST

Suite *prom_suite(void)
{
    Suite *s = suite_create("prom");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_prom__hist_buckets_cumulative);
    tcase_add_test(tc, test_prom__hist_ignores_nan_clamps_negative);
    tcase_add_test(tc, test_prom__hist_labels_and_le);
    tcase_add_test(tc, test_prom__bucket_texts_match_bounds);
    tcase_add_test(tc, test_prom__label_values_escaped);
    tcase_add_test(tc, test_prom__values_read_back_exactly);
    tcase_add_test(tc, test_prom__take_empty_and_reuse);
    tcase_add_test(tc, test_prom__large_text_grows);
    suite_add_tcase(s, tc);
    return s;
}
