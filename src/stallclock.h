/*
 * stallclock.h — the per-call stall clock of docs/DESIGN.md §3.1.
 *
 * Every second of a call is charged to exactly one budget: time inside a
 * real attempt that consumes the retry budget is "productive" (governed by
 * max_attempts); everything else — queueing, rate-limit waits, breaker
 * cool-downs, backoff sleeps, and the whole duration of an exempt 429
 * attempt (refunded) — is "stalled" (governed by stall_window_s):
 *
 *     stalled_s = (now - entered_at) - productive_s
 *
 * One clock per call, never shared (two concurrent calls must not pollute
 * each other's budget). Pure arithmetic on the `now` values passed in.
 */
#ifndef POLYGW_STALLCLOCK_H
#define POLYGW_STALLCLOCK_H

#include <stdbool.h>

struct stall_clock {
    double entered_at;
    double productive_s;
    double attempt_started; /* valid while attempting */
    bool attempting;
};

void stall_clock_init(struct stall_clock *sc, double now);

/* An attempt begins. Nested begins are a programming error (ignored). */
void stall_clock_attempt_begin(struct stall_clock *sc, double now);

/* The attempt ended, on any path (success, failure, cancellation). With
 * `refund` (an exempt 429: it consumed no retry budget) its duration stays
 * charged to the stall budget instead. No-op when not attempting. */
void stall_clock_attempt_end(struct stall_clock *sc, double now, bool refund);

/* Seconds of non-productive time so far (an attempt in progress counts as
 * productive until it ends). Never negative. */
double stall_clock_stalled_s(const struct stall_clock *sc, double now);

#endif /* POLYGW_STALLCLOCK_H */
