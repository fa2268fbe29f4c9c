/* stallclock.c — see stallclock.h. */
#include "stallclock.h"

void stall_clock_init(struct stall_clock *sc, double now)
{
    sc->entered_at = now;
    sc->productive_s = 0;
    sc->attempt_started = now;
    sc->attempting = false;
}

void stall_clock_attempt_begin(struct stall_clock *sc, double now)
{
    if (sc->attempting)
        return;
    sc->attempting = true;
    sc->attempt_started = now;
}

void stall_clock_attempt_end(struct stall_clock *sc, double now, bool refund)
{
    if (!sc->attempting)
        return;
    sc->attempting = false;
    if (!refund && now > sc->attempt_started)
        sc->productive_s += now - sc->attempt_started;
}

double stall_clock_stalled_s(const struct stall_clock *sc, double now)
{
    double productive = sc->productive_s;

    if (sc->attempting && now > sc->attempt_started)
        productive += now - sc->attempt_started;
    double s = (now - sc->entered_at) - productive;
    return s > 0 ? s : 0;
}
