/* bucket.c — see bucket.h. */
#include "bucket.h"

#include <math.h>

void bucket_init(struct bucket *b, double capacity, double window_s, double now)
{
    b->capacity = capacity > 0 ? capacity : 0;
    b->rate = capacity > 0 && window_s > 0 ? capacity / window_s : 0;
    b->level = b->capacity;
    b->updated_at = now;
}

bool bucket_is_unlimited(const struct bucket *b)
{
    return b->capacity <= 0;
}

static void bucket_refill(struct bucket *b, double now)
{
    if (now > b->updated_at) {
        b->level = fmin(b->capacity, b->level + (now - b->updated_at) * b->rate);
        b->updated_at = now;
    }
}

double bucket_level(struct bucket *b, double now)
{
    if (bucket_is_unlimited(b))
        return INFINITY;
    bucket_refill(b, now);
    return b->level;
}

/* What must be in the bucket to take `cost`: oversized requests need a full bucket. */
static double bucket_need(const struct bucket *b, double cost)
{
    return cost < b->capacity ? cost : b->capacity;
}

bool bucket_can_take(struct bucket *b, double cost, double now)
{
    if (bucket_is_unlimited(b))
        return true;
    bucket_refill(b, now);
    /* A tiny tolerance so that floating-point refill arithmetic never makes
     * a due token arrive one timer tick late. */
    return b->level + 1e-9 >= bucket_need(b, cost);
}

void bucket_take(struct bucket *b, double cost, double now)
{
    if (bucket_is_unlimited(b))
        return;
    bucket_refill(b, now);
    b->level -= cost;
}

void bucket_adjust(struct bucket *b, double delta, double now)
{
    if (bucket_is_unlimited(b))
        return;
    bucket_refill(b, now);
    b->level = fmin(b->capacity, b->level - delta);
}

double bucket_available_at(struct bucket *b, double cost, double now)
{
    if (bucket_is_unlimited(b))
        return now;
    bucket_refill(b, now);
    double missing = bucket_need(b, cost) - b->level;
    if (missing <= 1e-9)
        return now;
    return now + missing / b->rate;
}
