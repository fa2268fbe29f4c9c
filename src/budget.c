/* budget.c — see budget.h. */
#include "budget.h"

#include <math.h>

const char *budget_window_name(enum budget_window w)
{
    static const char *const names[BUDGET_WINDOWS] = { "daily", "monthly", "total" };
    return (unsigned)w < BUDGET_WINDOWS ? names[w] : "?";
}

bool budget_is_set(const struct budget_limits *p)
{
    for (int w = 0; w < BUDGET_WINDOWS; w++)
        if (p->limit[w] > 0)
            return true;
    return false;
}

void budget_init(struct budget *b, const struct budget_limits *p)
{
    *b = (struct budget){ .p = *p };
}

void budget_set_limits(struct budget *b, const struct budget_limits *p)
{
    if (p->utc_offset_s != b->p.utc_offset_s)
        b->ends_at[BUDGET_DAILY] = b->ends_at[BUDGET_MONTHLY] = 0;
    b->p = *p;
}

/* Days since 1970-01-01 of a civil date, and back (H. Hinnant's
 * algorithms, exact for every proleptic Gregorian date). */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

static void civil_from_days(int64_t z, int64_t *y, unsigned *m)
{
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    unsigned doe = (unsigned)(z - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    unsigned mp = (5 * doy + 2) / 153;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = (int64_t)yoe + era * 400 + (*m <= 2);
}

double budget_window_end(enum budget_window w, int32_t utc_offset_s, double now)
{
    double local = now + utc_offset_s;
    int64_t day = (int64_t)floor(local / 86400.0);
    if (w == BUDGET_DAILY)
        return (double)(day + 1) * 86400.0 - utc_offset_s;
    int64_t y;
    unsigned m;
    civil_from_days(day, &y, &m);
    int64_t next = m == 12 ? days_from_civil(y + 1, 1, 1) : days_from_civil(y, m + 1, 1);
    return (double)next * 86400.0 - utc_offset_s;
}

/* Starts the windows that ended by `now` afresh. */
static void budget_roll(struct budget *b, double now)
{
    for (int w = BUDGET_DAILY; w <= BUDGET_MONTHLY; w++) {
        if (b->ends_at[w] > 0 && now < b->ends_at[w])
            continue;
        if (b->ends_at[w] > 0)
            b->spent[w] = 0;
        b->ends_at[w] = budget_window_end((enum budget_window)w, b->p.utc_offset_s, now);
    }
}

double budget_left(struct budget *b, enum budget_window w, double now, double *resets_in_s)
{
    budget_roll(b, now);
    if (resets_in_s)
        *resets_in_s = w == BUDGET_TOTAL ? -1 : b->ends_at[w] - now;
    if (!(b->p.limit[w] > 0))
        return -1;
    double left = b->p.limit[w] - b->spent[w] - b->reserved;
    return left > 0 ? left : 0;
}

int budget_reserve(struct budget *b, double amount, double now, struct budget_refusal *why)
{
    budget_roll(b, now);
    for (int w = 0; w < BUDGET_WINDOWS; w++) {
        if (!(b->p.limit[w] > 0) || b->spent[w] + b->reserved + amount <= b->p.limit[w])
            continue;
        why->window = (enum budget_window)w;
        why->left = budget_left(b, (enum budget_window)w, now, &why->retry_after_s);
        return -1;
    }
    b->reserved += amount;
    return 0;
}

void budget_settle(struct budget *b, double reserved, double actual, double now)
{
    budget_roll(b, now);
    b->reserved -= reserved;
    if (b->reserved < 0)
        b->reserved = 0; /* no drift below zero from rounding */
    if (isnan(actual))
        return;
    for (int w = 0; w < BUDGET_WINDOWS; w++)
        b->spent[w] += actual;
}
