/*
 * aimd.h — additive-increase / multiplicative-decrease concurrency limit
 * of one source (docs/DESIGN.md §3.2):
 *
 *   success          limit += increase / limit      (about +increase per RTT window)
 *   429 or timeout   limit  = max(min, limit * decrease)
 *
 * The limit never exceeds `max` (the source's max_concurrency) so that a
 * long run of successes cannot bank an unbounded burst. The number of
 * permits it grants is floor(limit), at least 1.
 */
#ifndef POLYGW_AIMD_H
#define POLYGW_AIMD_H

#include <stdint.h>

struct aimd {
    double limit;
    double min, max, increase, decrease;
};

/* initial is clamped into [min, max]; min >= 1; 0 < decrease < 1. */
void aimd_init(struct aimd *a, double initial, double min, double max, double increase,
               double decrease);
void aimd_on_success(struct aimd *a);
void aimd_on_decrease(struct aimd *a);
/* floor(limit), at least 1. */
uint32_t aimd_permits(const struct aimd *a);

#endif /* POLYGW_AIMD_H */
