/*
 * breaker.h — a per-source circuit breaker (docs/DESIGN.md §3.2).
 *
 *            `failures` consecutive                 cooldown over
 *   CLOSED ---- transient failures ----> OPEN ---------------------> HALF_OPEN
 *     ^                                   ^                            |  one probe
 *     |                                   +---- probe fails -----------+  admitted
 *     +------------------------------- probe succeeds -----------------+
 *
 * Only transient failures count; a 429 never trips the breaker (it is the
 * AIMD's business). Each failed probe doubles the cool-down up to
 * max_cooldown_s; a success closes the breaker and resets the cool-down.
 * A probe that ends without a verdict (cancelled) frees the probe slot.
 * All times are seconds on the caller's monotonic clock.
 */
#ifndef POLYGW_BREAKER_H
#define POLYGW_BREAKER_H

#include <stdbool.h>
#include <stdint.h>

enum breaker_state { BREAKER_CLOSED = 0, BREAKER_OPEN, BREAKER_HALF_OPEN };

struct breaker {
    enum breaker_state state;
    uint32_t failures; /* threshold */
    double base_cooldown_s, max_cooldown_s;
    uint32_t consecutive;  /* transient failures in a row while closed */
    double cooldown_s;     /* current cool-down (doubles on failed probes) */
    double open_until;     /* OPEN: when the half-open probe becomes possible */
    bool probe_busy;       /* HALF_OPEN: the single probe is in flight */
    uint64_t opened_total; /* times it opened */
};

/* Transition hook (for logs/metrics); may be NULL. */
typedef void breaker_transition_fn(void *ud, const struct breaker *b, enum breaker_state from,
                                   enum breaker_state to, double now);

void breaker_init(struct breaker *b, uint32_t failures, double cooldown_s, double max_cooldown_s);

/* Would an attempt be admitted now? Moves OPEN -> HALF_OPEN when the
 * cool-down is over (hence not const). */
bool breaker_admits(struct breaker *b, double now, breaker_transition_fn *fn, void *ud);

/* An admitted attempt starts: in HALF_OPEN it takes the probe slot. */
void breaker_on_attempt(struct breaker *b);

/* Verdicts of an admitted attempt. `was_probe` tells whether that attempt
 * held the probe slot (the caller remembers what breaker_on_attempt did). */
void breaker_on_success(struct breaker *b, bool was_probe, double now, breaker_transition_fn *fn,
                        void *ud);
void breaker_on_failure(struct breaker *b, bool was_probe, double now, breaker_transition_fn *fn,
                        void *ud);
/* The attempt ended without a verdict for the breaker (429, cancel). */
void breaker_on_neutral(struct breaker *b, bool was_probe);

/* The earliest time the breaker may admit again; `now` or earlier when it
 * admits now, +INFINITY while a half-open probe is busy. */
double breaker_next_admit(const struct breaker *b, double now);

const char *breaker_state_name(enum breaker_state s);

#endif /* POLYGW_BREAKER_H */
