/*
 * cacheops.h — operator actions on the response cache (docs/CONFIG.md,
 * "cache"): a purge, shared by the msgpack method `cache.purge` and the
 * HTTP front's admin endpoint so both authorise and answer alike.
 */
#ifndef POLYGW_CACHEOPS_H
#define POLYGW_CACHEOPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codec/reply.h"
#include "codes.h"
#include "core/server.h"

/* Drops the cached answers of `capability` (NULL: every capability) and
 * of app `app` (NULL: every app; entries of a `shared` capability belong
 * to no app and go only with a purge that names no app), on behalf of
 * `caller` (borrowed; NULL: unknown). All NUL-terminated, borrowed; may be
 * called from any front's handler.
 * Returns 0 with *purged set (0 when the cache holds nothing of them): the
 * memory tier was the only one, the caller answers now. 1: a shared tier
 * (Redis) is being purged too; the answer, {purged, purged_shared} or a
 * backend_unavailable error, goes to request `msgid` of `out` (borrowed;
 * a pending request of its connection until then, see
 * cacheops_fail_pending), never from inside this call. -1 when `caller`
 * is not an admin app (*code PGW_BAD_REQUEST); -2 for a capability that
 * is not configured (*code PGW_UNKNOWN_CAPABILITY) or an app that is not
 * (*code PGW_BAD_REQUEST). `err` says why. */
int cacheops_purge(struct server *srv, const struct config_app *caller, const char *capability,
                   const char *app, struct reply_outlet *out, uint32_t msgid, size_t *purged,
                   enum pgw_code *code, char *err, size_t errlen);

/* The connection of `o` is gone or shutting down: its purges still run
 * to their end, but no longer answer it; with `code` other than PGW_OK
 * each is answered with that error and `message` first. */
void cacheops_fail_pending(struct reply_outlet *o, enum pgw_code code, const char *message);

/* Is request `msgid` of `o` a purge still walking the shared tier? */
bool cacheops_is_pending(const struct reply_outlet *o, uint32_t msgid);

/* Another sidecar of the fleet purged the shared tier (the backend's
 * on_cache_purged hook): the same entries leave this memory tier; with
 * `missed` (purges may have been lost with the channel) every entry does. */
void cacheops_on_fleet_purge(struct server *srv, const char *capability, const char *app,
                             bool missed);

#endif /* POLYGW_CACHEOPS_H */
