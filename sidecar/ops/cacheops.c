/*
 * cacheops.c — operator actions on the response cache (cacheops.h).
 */
#include "cacheops.h"

#include <stdio.h>
#include <string.h>

#include "backend/cache.h"
#include "core/log.h"

int cacheops_purge(struct server *srv, const struct config_app *caller, const char *capability,
                   const char *app, size_t *purged, enum pgw_code *code, char *err, size_t errlen)
{
    const struct config *cfg = srv->cfg;

    *purged = 0;
    /* An operator's action: a purge by one app would let it empty another
     * app's entries and, timed against a hit, learn what that app asks. */
    if (!caller || !caller->admin) {
        *code = PGW_BAD_REQUEST;
        snprintf(err, errlen, "cache purge: app '%s' is not an admin app (docs/APPS.md)",
                 caller ? caller->name : "?");
        return -1;
    }
    if (capability && config_find_capability(cfg, capability, strlen(capability)) < 0) {
        *code = PGW_UNKNOWN_CAPABILITY;
        snprintf(err, errlen, "cache purge: no capability '%.64s'", capability);
        return -2;
    }
    if (app && !config_find_app(cfg, app)) {
        *code = PGW_BAD_REQUEST;
        snprintf(err, errlen, "cache purge: no app '%.64s'", app);
        return -2;
    }
    if (srv->cache)
        *purged = cache_purge_match(srv->cache, capability, app);
    log_at(LOG_INFO, "cache purged", "app", LOG_S, caller->name, "capability", LOG_S,
           capability ? capability : "*", "of_app", LOG_S, app ? app : "*", "entries", LOG_U,
           (unsigned long long)*purged, NULL);
    return 0;
}
