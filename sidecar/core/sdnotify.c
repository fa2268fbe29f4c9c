/* sdnotify.c — sd_notify(3) readiness and watchdog (see sdnotify.h). */
#include "sdnotify.h"

#include <stdint.h>
#include <stdio.h>
#include <systemd/sd-daemon.h>
#include <time.h>

#include "log.h"

static void send_state(const char *state)
{
    int rc = sd_notify(0, state);
    if (rc < 0)
        log_at(LOG_WARN, "cannot notify the service manager", "errno", LOG_I, (long long)-rc, NULL);
}

static void on_watchdog(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    (void)w;
    send_state("WATCHDOG=1");
}

void sdnotify_init(struct sdnotify *n, struct ev_loop *loop)
{
    uint64_t usec = 0;

    *n = (struct sdnotify){ .loop = loop };
    if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0)
        n->watchdog_interval_s = (double)usec / 2e6;
    ev_init(&n->watchdog_w, on_watchdog);
    n->watchdog_w.data = n;
}

void sdnotify_start(struct sdnotify *n)
{
    if (n->watchdog_interval_s <= 0)
        return;
    log_at(LOG_INFO, "watchdog enabled", "interval_s", LOG_F, n->watchdog_interval_s, NULL);
    send_state("WATCHDOG=1");
    ev_timer_set(&n->watchdog_w, n->watchdog_interval_s, n->watchdog_interval_s);
    ev_timer_start(n->loop, &n->watchdog_w);
}

void sdnotify_stop(struct sdnotify *n)
{
    ev_timer_stop(n->loop, &n->watchdog_w);
}

void sdnotify_ready(struct sdnotify *n, const char *status)
{
    char buf[256];

    if (n->ready || n->stopping)
        return;
    n->ready = true;
    snprintf(buf, sizeof(buf), "READY=1\nSTATUS=%s", status ? status : "ready");
    send_state(buf);
}

void sdnotify_reloading(struct sdnotify *n)
{
    char buf[64];
    struct timespec ts;

    if (n->stopping)
        return;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    snprintf(buf, sizeof(buf), "RELOADING=1\nMONOTONIC_USEC=%llu",
             (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000);
    n->ready = false;
    send_state(buf);
}

void sdnotify_stopping(struct sdnotify *n, const char *why)
{
    char buf[160];

    n->ready = false;
    n->stopping = true;
    snprintf(buf, sizeof(buf), "STOPPING=1\nSTATUS=stopping: %s", why ? why : "");
    send_state(buf);
}

bool sdnotify_is_ready(const struct sdnotify *n)
{
    return n->ready;
}
