/*
 * figures.h — the figures both the `stats` answer (ops/stats.c) and
 * /metrics (metrics.c) show, as tables of codec/figures.h over the
 * process's state: each is listed once, with its stats key and its
 * family. docs/METRICS.md lists the families, proto/PROTOCOL.md the keys.
 */
#ifndef POLYGW_METRICS_FIGURES_H
#define POLYGW_METRICS_FIGURES_H

#include "codec/figures.h"

/* Of a struct server, row 0: the sections connections, requests,
 * rejected, io, upstream, reload and (with the HTTP front) http. */
extern const struct fig_table figs_server;
/* Of a struct server, one row per source (gov.sources, labelled by
 * cfg->sources): its governance state. */
extern const struct fig_table figs_source;
/* Of a struct server, one row per app (gov.apps, labelled by cfg->apps):
 * its admission figures. */
extern const struct fig_table figs_app;
/* Of a struct server, row 0: the task registry's counts and counters
 * (stats shows them in `tasks`, after its `running_tasks`). */
extern const struct fig_table figs_tasks;

#endif /* POLYGW_METRICS_FIGURES_H */
