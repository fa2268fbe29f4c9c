/* test_budget.c — budgets in currency (src/budget.c): reservations, their
 * reconciliation to the real cost, and calendar windows that reset at
 * midnight and on the first of the month in a fixed UTC offset, all on a
 * clock advanced by hand (Unix seconds). */
#include <math.h>

#include "budget.h"
#include "suites.h"

/* 2026-12-05 17:00:00 UTC, a Saturday in December: the next month is in
 * the next year. */
#define T0        1796490000.0
#define MIDNIGHT  1796515200.0 /* 2026-12-06 00:00:00 UTC */
#define NEW_YEAR  1798761600.0 /* 2027-01-01 00:00:00 UTC */
#define LEAP_DAY  1709164800.0 /* 2024-02-29 00:00:00 UTC */
#define MARCH_1ST 1709251200.0 /* 2024-03-01 00:00:00 UTC */

static struct budget make(double daily, double monthly, double total, int32_t off)
{
    struct budget b;
    const struct budget_limits p = { { daily, monthly, total }, off };
    budget_init(&b, &p);
    return b;
}

START_TEST(test_budget__window_ends)
{
    ck_assert_double_eq(budget_window_end(BUDGET_DAILY, 0, T0), MIDNIGHT);
    ck_assert_double_eq(budget_window_end(BUDGET_MONTHLY, 0, T0), NEW_YEAR);
    /* Midnight itself starts the next day. */
    ck_assert_double_eq(budget_window_end(BUDGET_DAILY, 0, MIDNIGHT), MIDNIGHT + 86400);
    /* A leap year's February ends on the 29th. */
    ck_assert_double_eq(budget_window_end(BUDGET_MONTHLY, 0, LEAP_DAY), MARCH_1ST);
    ck_assert_double_eq(budget_window_end(BUDGET_MONTHLY, 0, MARCH_1ST - 1), MARCH_1ST);
    /* UTC+02:00: midnight there is 22:00 UTC the day before. */
    ck_assert_double_eq(budget_window_end(BUDGET_DAILY, 7200, T0), MIDNIGHT - 7200);
    ck_assert_double_eq(budget_window_end(BUDGET_MONTHLY, 7200, T0), NEW_YEAR - 7200);
    /* UTC-08:00: 17:00 UTC is 09:00 there, its midnight is 08:00 UTC. */
    ck_assert_double_eq(budget_window_end(BUDGET_DAILY, -28800, T0), MIDNIGHT + 28800);
    /* ... and on 2027-01-01 02:00 UTC it is still December 31st there. */
    ck_assert_double_eq(budget_window_end(BUDGET_MONTHLY, -28800, NEW_YEAR + 7200),
                        NEW_YEAR + 28800);
}
END_TEST

/* Reservations in flight count against every window: concurrent
 * attempts can never together pass a limit. */
START_TEST(test_budget__reserve_refuses_what_in_flight_would_pass)
{
    struct budget b = make(10, 0, 0, 0);
    struct budget_refusal why;

    ck_assert_int_eq(budget_reserve(&b, 4, T0, &why), 0);
    ck_assert_int_eq(budget_reserve(&b, 4, T0, &why), 0);
    ck_assert_int_eq(budget_reserve(&b, 4, T0, &why), -1);
    ck_assert_int_eq(why.window, BUDGET_DAILY);
    ck_assert_double_eq(why.left, 2);
    ck_assert_double_eq(why.retry_after_s, MIDNIGHT - T0);
    ck_assert_double_eq(b.reserved, 8);                   /* the refused one took nothing */
    ck_assert_int_eq(budget_reserve(&b, 2, T0, &why), 0); /* exactly the limit */
    ck_assert_double_eq(budget_left(&b, BUDGET_DAILY, T0, NULL), 0);
    ck_assert_double_eq(budget_left(&b, BUDGET_TOTAL, T0, NULL), -1); /* no limit */
}
END_TEST

/* The real cost replaces the reservation; a failure gives it back. */
START_TEST(test_budget__settle_reconciles_and_releases)
{
    struct budget b = make(0, 0, 10, 0);
    struct budget_refusal why;
    double resets;

    ck_assert_int_eq(budget_reserve(&b, 6, T0, &why), 0);
    ck_assert_int_eq(budget_reserve(&b, 3, T0, &why), 0);
    budget_settle(&b, 6, 1.5, T0 + 1); /* cost far less than its worst case */
    ck_assert_double_eq(b.reserved, 3);
    ck_assert_double_eq(b.spent[BUDGET_TOTAL], 1.5);
    budget_settle(&b, 3, NAN, T0 + 2); /* failed: nothing charged */
    ck_assert_double_eq(b.reserved, 0);
    ck_assert_double_eq(budget_left(&b, BUDGET_TOTAL, T0 + 2, &resets), 8.5);
    ck_assert_double_eq(resets, -1);
    /* A cost above its reservation is charged whole (the estimate's error). */
    ck_assert_int_eq(budget_reserve(&b, 8, T0 + 3, &why), 0);
    budget_settle(&b, 8, 9, T0 + 4);
    ck_assert_double_eq(budget_left(&b, BUDGET_TOTAL, T0 + 4, NULL), 0);
    ck_assert_int_eq(budget_reserve(&b, 0.01, T0 + 5, &why), -1);
    ck_assert_int_eq(why.window, BUDGET_TOTAL);
    ck_assert_double_eq(why.left, 0);
    ck_assert_double_eq(why.retry_after_s, -1); /* a total never resets */
}
END_TEST

/* A window's spending starts afresh when it resets; reservations in
 * flight carry over, and what they cost is charged to the new window. */
START_TEST(test_budget__windows_reset_at_midnight_and_month_start)
{
    struct budget b = make(5, 12, 0, 0);
    struct budget_refusal why;

    ck_assert_int_eq(budget_reserve(&b, 4, T0, &why), 0);
    budget_settle(&b, 4, 4, T0);
    ck_assert_int_eq(budget_reserve(&b, 2, T0, &why), -1);
    ck_assert_int_eq(why.window, BUDGET_DAILY);
    ck_assert_double_eq(why.retry_after_s, MIDNIGHT - T0);
    ck_assert_int_eq(budget_reserve(&b, 1, MIDNIGHT - 0.5, &why), 0); /* in flight over midnight */
    ck_assert_int_eq(budget_reserve(&b, 4.5, MIDNIGHT, &why), -1);    /* 1 reserved + 4.5 > 5 */
    budget_settle(&b, 1, 1, MIDNIGHT + 1);
    ck_assert_double_eq(b.spent[BUDGET_DAILY], 1);   /* the new day's */
    ck_assert_double_eq(b.spent[BUDGET_MONTHLY], 5); /* the month goes on */
    /* Day after day the month fills up; on January 1st it resets too. */
    double t = MIDNIGHT + 2;
    for (int d = 0; d < 7; d++, t += 86400) {
        if (budget_reserve(&b, 1, t, &why) == 0)
            budget_settle(&b, 1, 1, t);
    }
    ck_assert_double_eq(b.spent[BUDGET_MONTHLY], 12);
    ck_assert_int_eq(budget_reserve(&b, 1, NEW_YEAR - 1, &why), -1);
    ck_assert_int_eq(why.window, BUDGET_MONTHLY);
    ck_assert_double_eq(why.retry_after_s, 1);
    ck_assert_int_eq(budget_reserve(&b, 5, NEW_YEAR, &why), 0);
    /* A reload keeps what was spent, under the new limits. */
    const struct budget_limits lower = { { 4, 12, 0 }, 0 };
    budget_set_limits(&b, &lower);
    ck_assert_double_eq(budget_left(&b, BUDGET_DAILY, NEW_YEAR, NULL), 0);
    ck_assert(budget_is_set(&lower));
    const struct budget_limits none = { { 0, 0, 0 }, 0 };
    ck_assert(!budget_is_set(&none));
    ck_assert_str_eq(budget_window_name(BUDGET_MONTHLY), "monthly");
}
END_TEST

Suite *budget_suite(void)
{
    Suite *s = suite_create("budget");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_budget__window_ends);
    tcase_add_test(tc, test_budget__reserve_refuses_what_in_flight_would_pass);
    tcase_add_test(tc, test_budget__settle_reconciles_and_releases);
    tcase_add_test(tc, test_budget__windows_reset_at_midnight_and_month_start);
    suite_add_tcase(s, tc);
    return s;
}
