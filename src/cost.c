/* cost.c — see cost.h. */
#include "cost.h"

#include <math.h>

const char *cost_class_name(enum cost_class c)
{
    static const char *const names[COST_CLASSES] = { "input", "cached_input", "cache_write",
                                                     "output", "reasoning" };
    return (unsigned)c < COST_CLASSES ? names[c] : "?";
}

double cost_of(const struct cost_prices *p, const struct cost_tokens *t)
{
    double sum = 0;

    if (!p->set)
        return NAN;
    for (int c = 0; c < COST_CLASSES; c++)
        sum += (double)t->n[c] * p->per_mtok[c];
    return sum / 1e6;
}

double cost_worst(const struct cost_prices *p, double in, double out)
{
    if (!p->set)
        return NAN;
    double pin = fmax(p->per_mtok[COST_INPUT],
                      fmax(p->per_mtok[COST_CACHED], p->per_mtok[COST_CACHE_WRITE]));
    double pout = fmax(p->per_mtok[COST_OUTPUT], p->per_mtok[COST_REASONING]);
    return (in * pin + out * pout) / 1e6;
}

bool cost_is_known(double c)
{
    return isfinite(c) && c >= 0;
}
