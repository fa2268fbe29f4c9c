/*
 * redis_resolve.c — redis_resolve.h holds the contract.
 */
#include "redis_resolve.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* Lookup threads alive in the process (RDS_RESOLVE_MAX). */
static atomic_int lookups;

/* One lookup of the host name on a detached thread. Shared by the thread
 * and the loop (two references); the loop gives up its reference when it
 * gets the answer or abandons the attempt (timeout, rds_free), the thread
 * when it is done, and the last one frees. The thread signals the loop only
 * while holding `mu` and only if the loop still wants the answer, so after
 * rds_resolve_abandon() it never touches the loop or the watcher again. */
struct rds_resolve {
    pthread_mutex_t mu;
    int refs;
    bool abandoned; /* the loop no longer wants the answer */
    struct ev_loop *loop;
    ev_async done_w;
    rds_resolve_fn *cb; /* loop side only */
    void *ud;
    int rc; /* getaddrinfo()'s, 0 = addr is set */
    char addr[INET6_ADDRSTRLEN];
    char host[256];
};

static void resolve_destroy(struct rds_resolve *res)
{
    pthread_mutex_destroy(&res->mu);
    free(res);
}

static void *resolve_main(void *arg)
{
    struct rds_resolve *res = arg;
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *ai = NULL;
    char addr[INET6_ADDRSTRLEN] = "";

    int rc = getaddrinfo(res->host, NULL, &hints, &ai);
    if (rc == 0) {
        /* IPv4 first, as hiredis' own resolution does. */
        const struct addrinfo *pick = NULL;
        for (const struct addrinfo *a = ai; a && !pick; a = a->ai_next)
            if (a->ai_family == AF_INET)
                pick = a;
        for (const struct addrinfo *a = ai; a && !pick; a = a->ai_next)
            if (a->ai_family == AF_INET6)
                pick = a;
        if (!pick)
            rc = EAI_FAMILY;
        else if (pick->ai_family == AF_INET)
            inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)pick->ai_addr)->sin_addr,
                      addr, sizeof(addr));
        else
            inet_ntop(AF_INET6,
                      &((const struct sockaddr_in6 *)(const void *)pick->ai_addr)->sin6_addr, addr,
                      sizeof(addr));
        freeaddrinfo(ai);
    }

    pthread_mutex_lock(&res->mu);
    res->rc = rc;
    memcpy(res->addr, addr, sizeof(addr));
    if (!res->abandoned)
        ev_async_send(res->loop, &res->done_w);
    bool last = --res->refs == 0;
    pthread_mutex_unlock(&res->mu);
    if (last)
        resolve_destroy(res);
    atomic_fetch_sub(&lookups, 1);
    return NULL;
}

/* Drops the loop's reference. The watcher is stopped under the mutex, so
 * the thread can no longer be inside ev_async_send() on it. */
void rds_resolve_abandon(struct rds_resolve *res)
{
    pthread_mutex_lock(&res->mu);
    res->abandoned = true;
    ev_async_stop(res->loop, &res->done_w);
    bool last = --res->refs == 0;
    pthread_mutex_unlock(&res->mu);
    if (last)
        resolve_destroy(res);
}

static void resolve_on_done(struct ev_loop *loop, ev_async *w, int revents)
{
    struct rds_resolve *res = w->data;
    rds_resolve_fn *cb = res->cb;
    void *ud = res->ud;
    char addr[INET6_ADDRSTRLEN];
    int rc;

    (void)loop;
    (void)revents;
    pthread_mutex_lock(&res->mu);
    rc = res->rc;
    memcpy(addr, res->addr, sizeof(addr));
    pthread_mutex_unlock(&res->mu);
    rds_resolve_abandon(res);
    cb(rc, addr, ud);
}

int rds_resolve_start(struct ev_loop *loop, const char *host, rds_resolve_fn *cb, void *ud,
                      struct rds_resolve **out)
{
    struct rds_resolve *res;
    pthread_attr_t attr;
    pthread_t tid;
    sigset_t all, old;

    if (atomic_fetch_add(&lookups, 1) >= RDS_RESOLVE_MAX) {
        atomic_fetch_sub(&lookups, 1);
        return -2;
    }
    res = calloc(1, sizeof(*res));
    if (!res || pthread_mutex_init(&res->mu, NULL) != 0) {
        free(res);
        atomic_fetch_sub(&lookups, 1);
        return -1;
    }
    res->refs = 2;
    res->loop = loop;
    res->cb = cb;
    res->ud = ud;
    snprintf(res->host, sizeof(res->host), "%s", host);
    ev_async_init(&res->done_w, resolve_on_done);
    res->done_w.data = res;
    ev_async_start(loop, &res->done_w);

    if (pthread_attr_init(&attr) != 0) {
        ev_async_stop(loop, &res->done_w);
        resolve_destroy(res);
        atomic_fetch_sub(&lookups, 1);
        return -1;
    }
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* The thread inherits a full signal mask: signals stay with the loop. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&tid, &attr, resolve_main, res);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        ev_async_stop(loop, &res->done_w);
        resolve_destroy(res);
        atomic_fetch_sub(&lookups, 1);
        return -1;
    }
    *out = res;
    return 0;
}
