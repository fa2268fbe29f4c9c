/* aimd.c — see aimd.h. */
#include "aimd.h"

#include <math.h>

void aimd_init(struct aimd *a, double initial, double min, double max, double increase,
               double decrease)
{
    a->min = min >= 1 ? min : 1;
    a->max = max >= a->min ? max : a->min;
    a->increase = increase;
    a->decrease = decrease;
    a->limit = fmin(fmax(initial, a->min), a->max);
}

void aimd_on_success(struct aimd *a)
{
    a->limit = fmin(a->max, a->limit + a->increase / a->limit);
}

void aimd_on_decrease(struct aimd *a)
{
    a->limit = fmax(a->min, a->limit * a->decrease);
}

uint32_t aimd_permits(const struct aimd *a)
{
    double f = floor(a->limit);
    return f >= 1 ? (uint32_t)f : 1;
}
