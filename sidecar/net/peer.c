/* peer.c — see peer.h. */
#include "peer.h"

#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "rpc.h"

void peer_read(int fd, struct peer *p)
{
    struct ucred uc;
    socklen_t len = sizeof(uc);

    memset(p, 0, sizeof(*p));
    if (fd >= 0 && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) == 0 && len == sizeof(uc) &&
        uc.pid > 0) {
        p->known = true;
        p->uid = (uint32_t)uc.uid;
        p->gid = (uint32_t)uc.gid;
        p->pid = (uint32_t)uc.pid;
    }
}

void peer_ids(const struct peer *p, long long *pid, long long *uid)
{
    *pid = p->known ? (long long)p->pid : -1;
    *uid = p->known ? (long long)p->uid : -1;
}

const struct config_app *peer_app(const struct config *cfg, const struct peer *p)
{
    const struct config_app *a = p->known ? config_app_for_peer(cfg, p->uid, p->gid) : NULL;
    return a ? a : config_find_app(cfg, CONFIG_DEFAULT_APP);
}

const struct config_app *peer_declare_app(const struct config *cfg, const char *own_name,
                                          const char *name, size_t len, char *why, size_t whylen)
{
    const struct config_app *own = config_find_app(cfg, own_name);
    char quoted[CONFIG_NAME_MAX + 8], copy[CONFIG_NAME_MAX];

    if (rpc_check_ident("app", name, len, CONFIG_NAME_MAX - 1, why, whylen) < 0)
        return NULL;
    rpc_quote_client_str(name, len, CONFIG_NAME_MAX, quoted);
    memcpy(copy, name, len);
    copy[len] = '\0';
    const struct config_app *a = config_find_app(cfg, copy);
    if (!own)
        own = config_find_app(cfg, CONFIG_DEFAULT_APP);
    if (a && a == own)
        return a;
    if (!own || !own->allow_declared) {
        snprintf(why, whylen,
                 "app '%s' refused: this caller is app '%s' (by its uid or token) "
                 "and may not declare another",
                 quoted, own ? own->name : CONFIG_DEFAULT_APP);
        return NULL;
    }
    if (!a) {
        snprintf(why, whylen, "unknown app '%s'", quoted);
        return NULL;
    }
    if (a->admin && !own->admin) {
        snprintf(why, whylen, "app '%s' refused: an admin app cannot be declared", quoted);
        return NULL;
    }
    return a;
}
