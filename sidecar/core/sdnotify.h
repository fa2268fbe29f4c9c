/*
 * sdnotify.h — telling the service manager (systemd, or whatever plays its
 * part through $NOTIFY_SOCKET) what the daemon is doing: readiness, reload,
 * shutdown, and the watchdog keep-alive (sd_notify(3), sd_watchdog_enabled(3)).
 *
 * Everything here is a no-op when $NOTIFY_SOCKET is unset, so a daemon
 * started by hand or under Type=simple behaves exactly as before. Messages
 * are best effort: a service manager that stopped listening is not a reason
 * to fail a call.
 *
 * Watchdog. When the manager asked for one (WATCHDOG_USEC, and WATCHDOG_PID
 * is this process or unset), a repeating timer on the event loop sends
 * WATCHDOG=1 every half interval. It runs on the loop on purpose: a loop
 * that is wedged (a blocking call, an endless callback) stops sending, and
 * the manager restarts the daemon, which is the point.
 */
#ifndef POLYGW_SDNOTIFY_H
#define POLYGW_SDNOTIFY_H

#include <ev.h>
#include <stdbool.h>

struct sdnotify {
    struct ev_loop *loop;
    ev_timer watchdog_w;
    double watchdog_interval_s; /* half of WATCHDOG_USEC; 0 = no watchdog */
    bool ready;                 /* READY=1 sent (and no reload since) */
    bool stopping;              /* STOPPING=1 sent: never ready again */
};

/* Reads the watchdog settings from the environment (leaving it intact).
 * Never fails. */
void sdnotify_init(struct sdnotify *n, struct ev_loop *loop);
/* Arms the watchdog timer (sends one WATCHDOG=1 at once). */
void sdnotify_start(struct sdnotify *n);
void sdnotify_stop(struct sdnotify *n);

/* READY=1 with a STATUS= line (`status` borrowed, may be NULL). Sent once:
 * later calls are ignored until sdnotify_reloading(), and all of them once
 * sdnotify_stopping() was called. */
void sdnotify_ready(struct sdnotify *n, const char *status);
/* RELOADING=1 (with MONOTONIC_USEC=, as Type=notify-reload expects); the
 * next sdnotify_ready() sends READY=1 again. */
void sdnotify_reloading(struct sdnotify *n);
/* STOPPING=1, at the start of shutdown. */
void sdnotify_stopping(struct sdnotify *n, const char *why);
bool sdnotify_is_ready(const struct sdnotify *n);

#endif /* POLYGW_SDNOTIFY_H */
