/*
 * budget.h — a budget in currency (docs/CONFIG.md §12a): a daily window, a
 * monthly window and a total, each optional. The windows are calendar
 * ones: a day starts at midnight and a month on its first day, in a fixed
 * offset from UTC (default 0); the total never resets.
 *
 * Reserve before, reconcile after: an attempt reserves its worst case
 * before it starts (budget_reserve), refused when a window's spent plus
 * the reservations in flight plus this one would pass its limit; when the
 * attempt ends, budget_settle replaces the reservation by the real cost
 * (charged to the windows current then) or gives it back. So concurrent
 * attempts can never together pass a limit by more than the amount by
 * which real costs exceed their reservations.
 *
 * Time is Unix seconds, passed in: no clock read, no I/O, no allocation.
 */
#ifndef POLYGW_BUDGET_H
#define POLYGW_BUDGET_H

#include <stdbool.h>
#include <stdint.h>

enum budget_window { BUDGET_DAILY = 0, BUDGET_MONTHLY, BUDGET_TOTAL, BUDGET_WINDOWS };

/* The limits: > 0 each, or 0 = that window has none. */
struct budget_limits {
    double limit[BUDGET_WINDOWS];
    int32_t utc_offset_s; /* where the windows' midnight is: -86399 .. 86399 */
};

struct budget {
    struct budget_limits p;
    double spent[BUDGET_WINDOWS]; /* real costs charged in the current window */
    double reserved;              /* worst cases of the attempts in flight */
    double ends_at[2];            /* Unix end of the current daily / monthly window;
                                   * 0 before the first use */
};

/* Why a reservation was refused. */
struct budget_refusal {
    enum budget_window window; /* the first window that could not cover it */
    double left;               /* its limit - spent - reserved, >= 0 */
    double retry_after_s;      /* until it resets (daily, monthly); -1: total */
};

/* "daily", "monthly", "total". */
const char *budget_window_name(enum budget_window w);

/* True when `p` has some limit. */
bool budget_is_set(const struct budget_limits *p);

/* A fresh budget under `p` (copied): nothing spent or reserved. */
void budget_init(struct budget *b, const struct budget_limits *p);

/* A reload: new limits (copied), what was spent and reserved kept; the
 * windows are recomputed at the next use (a changed offset moves them). */
void budget_set_limits(struct budget *b, const struct budget_limits *p);

/* Reserves `amount` (>= 0, finite) at `now`. Returns 0, or -1 with *why
 * (nothing reserved) when some window's spent + reserved + amount would
 * pass its limit. */
int budget_reserve(struct budget *b, double amount, double now, struct budget_refusal *why);

/* Ends a reservation of `reserved` (what budget_reserve took) at `now`:
 * `actual` >= 0 is charged in its place to every window; NAN gives it
 * back (the attempt failed and costs nothing). */
void budget_settle(struct budget *b, double reserved, double actual, double now);

/* What window `w` has left at `now` (limit - spent - reserved, >= 0), or
 * -1 when it has no limit; *resets_in_s (may be NULL) gets the seconds
 * until it resets (-1 for the total). */
double budget_left(struct budget *b, enum budget_window w, double now, double *resets_in_s);

/* The Unix time window `w` (daily or monthly) that holds `now` ends, with
 * midnight at `utc_offset_s`. Exposed for tests. */
double budget_window_end(enum budget_window w, int32_t utc_offset_s, double now);

#endif /* POLYGW_BUDGET_H */
