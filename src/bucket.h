/*
 * bucket.h — a token bucket for RPM / TPM / daily-token limits.
 *
 * A bucket holds up to `capacity` tokens and refills continuously at
 * capacity / window_s tokens per second (rpm: capacity = rpm, window 60 s;
 * tpm: tpm per 60 s; daily tokens: per 86400 s). It starts full.
 *
 * Reserve-and-reconcile: an attempt takes its *estimated* cost before it
 * starts; when the real usage is known, bucket_adjust() takes or gives back
 * the difference. The level may go negative (debt) after an adjustment,
 * which delays later admissions until it is repaid — the limit holds over
 * time even when estimates are low.
 *
 * A request costing more than the whole capacity could never be admitted;
 * it is admitted when the bucket is full (and leaves it in debt), so a big
 * request is slowed down, never refused forever. capacity 0 = unlimited.
 */
#ifndef POLYGW_BUCKET_H
#define POLYGW_BUCKET_H

#include <stdbool.h>

struct bucket {
    double capacity; /* 0 = unlimited */
    double rate;     /* tokens per second */
    double level;
    double updated_at;
};

void bucket_init(struct bucket *b, double capacity, double window_s, double now);
bool bucket_is_unlimited(const struct bucket *b);
/* Current level after refill (may be negative). */
double bucket_level(struct bucket *b, double now);
/* Could `cost` be taken now? */
bool bucket_can_take(struct bucket *b, double cost, double now);
/* Takes `cost` (call after bucket_can_take said yes). */
void bucket_take(struct bucket *b, double cost, double now);
/* Reconcile: take `delta` more (delta > 0) or give -delta back (delta < 0);
 * the level never rises above capacity. */
void bucket_adjust(struct bucket *b, double delta, double now);
/* The earliest time `cost` can be taken (now when it can be taken now). */
double bucket_available_at(struct bucket *b, double cost, double now);

#endif /* POLYGW_BUCKET_H */
