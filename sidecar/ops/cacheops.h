/*
 * cacheops.h — operator actions on the response cache (docs/CONFIG.md,
 * "cache"): a purge, shared by the msgpack method `cache.purge` and the
 * HTTP front's admin endpoint so both authorise and answer alike.
 */
#ifndef POLYGW_CACHEOPS_H
#define POLYGW_CACHEOPS_H

#include <stddef.h>

#include "codes.h"
#include "core/server.h"

/* Drops the cached answers of `capability` (NULL: every capability) and
 * of app `app` (NULL: every app; entries of a `shared` capability belong
 * to no app and go only with a purge that names no app), on behalf of
 * `caller` (borrowed; NULL: unknown). All NUL-terminated, borrowed; may be
 * called from any front's handler.
 * Returns 0 with *purged set (0 when the cache holds nothing of them); -1
 * when `caller` is not an admin app (*code PGW_BAD_REQUEST); -2 for a
 * capability that is not configured (*code PGW_UNKNOWN_CAPABILITY) or an
 * app that is not (*code PGW_BAD_REQUEST). `err` says why. */
int cacheops_purge(struct server *srv, const struct config_app *caller, const char *capability,
                   const char *app, size_t *purged, enum pgw_code *code, char *err, size_t errlen);

#endif /* POLYGW_CACHEOPS_H */
