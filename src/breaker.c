/* breaker.c — see breaker.h for the state diagram. */
#include "breaker.h"

#include <math.h>

const char *breaker_state_name(enum breaker_state s)
{
    switch (s) {
    case BREAKER_CLOSED:
        return "closed";
    case BREAKER_OPEN:
        return "open";
    default:
        return "half_open";
    }
}

/* The only place the state changes. */
static void breaker_set_state(struct breaker *b, enum breaker_state to, double now,
                              breaker_transition_fn *fn, void *ud)
{
    enum breaker_state from = b->state;

    if (from == to)
        return;
    b->state = to;
    if (to == BREAKER_OPEN) {
        b->open_until = now + b->cooldown_s;
        b->opened_total++;
    }
    if (to != BREAKER_HALF_OPEN)
        b->probe_busy = false;
    if (fn)
        fn(ud, b, from, to, now);
}

void breaker_init(struct breaker *b, uint32_t failures, double cooldown_s, double max_cooldown_s)
{
    b->state = BREAKER_CLOSED;
    b->failures = failures ? failures : 1;
    b->base_cooldown_s = cooldown_s;
    b->max_cooldown_s = max_cooldown_s > cooldown_s ? max_cooldown_s : cooldown_s;
    b->consecutive = 0;
    b->cooldown_s = cooldown_s;
    b->open_until = 0;
    b->probe_busy = false;
    b->opened_total = 0;
}

bool breaker_admits(struct breaker *b, double now, breaker_transition_fn *fn, void *ud)
{
    switch (b->state) {
    case BREAKER_CLOSED:
        return true;
    case BREAKER_OPEN:
        if (now < b->open_until)
            return false;
        breaker_set_state(b, BREAKER_HALF_OPEN, now, fn, ud);
        return true;
    default:
        return !b->probe_busy;
    }
}

void breaker_on_attempt(struct breaker *b)
{
    if (b->state == BREAKER_HALF_OPEN)
        b->probe_busy = true;
}

void breaker_on_success(struct breaker *b, bool was_probe, double now, breaker_transition_fn *fn,
                        void *ud)
{
    b->consecutive = 0;
    if (b->state == BREAKER_HALF_OPEN && was_probe) {
        b->cooldown_s = b->base_cooldown_s;
        breaker_set_state(b, BREAKER_CLOSED, now, fn, ud);
    }
}

void breaker_on_failure(struct breaker *b, bool was_probe, double now, breaker_transition_fn *fn,
                        void *ud)
{
    switch (b->state) {
    case BREAKER_CLOSED:
        if (++b->consecutive >= b->failures) {
            b->consecutive = 0;
            breaker_set_state(b, BREAKER_OPEN, now, fn, ud);
        }
        break;
    case BREAKER_HALF_OPEN:
        if (was_probe) {
            b->cooldown_s = fmin(b->cooldown_s * 2, b->max_cooldown_s);
            breaker_set_state(b, BREAKER_OPEN, now, fn, ud);
        }
        break;
    case BREAKER_OPEN:
        /* A straggler admitted before the breaker opened: already open. */
        break;
    }
}

void breaker_on_neutral(struct breaker *b, bool was_probe)
{
    if (b->state == BREAKER_HALF_OPEN && was_probe)
        b->probe_busy = false;
}

double breaker_next_admit(const struct breaker *b, double now)
{
    switch (b->state) {
    case BREAKER_CLOSED:
        return now;
    case BREAKER_OPEN:
        return b->open_until;
    default:
        return b->probe_busy ? INFINITY : now;
    }
}
