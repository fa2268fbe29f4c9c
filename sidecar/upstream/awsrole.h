/*
 * awsrole.h — AWS credentials that expire and are fetched again on the
 * loop: the pod identities of EKS (docs/CONFIG.md, "Bedrock").
 *
 *   web identity (IRSA)  AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE: the
 *                        token file (rotated by the kubelet) is read at each
 *                        fetch and exchanged with STS AssumeRoleWithWebIdentity
 *                        (an unsigned POST; the answer is XML);
 *   container            AWS_CONTAINER_CREDENTIALS_FULL_URI (EKS Pod Identity,
 *                        ECS): a GET with the token of
 *                        AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE (or _TOKEN) in
 *                        Authorization; the answer is JSON.
 *
 * The first fetch starts with the sidecar; each later one is scheduled
 * before the credentials expire (REFRESH_BEFORE_S, or half their life when
 * that is shorter), so calls never wait for one. A failed fetch is retried
 * with backoff (1 s doubling to 60 s) whatever the calls do, and keeps the
 * credentials it had while they are valid: a dead STS is never hit harder
 * because calls arrive. With no valid credentials, awsrole_get says why, and
 * the attempt fails without being sent.
 *
 * The fetch runs on the upstream engine, like any request: it never blocks
 * the loop. Keys are held in memory only, wiped when replaced.
 */
#ifndef POLYGW_AWSROLE_H
#define POLYGW_AWSROLE_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/awscreds.h"
#include "sigv4.h"
#include "upstream.h"

struct awsrole;

struct awsrole_stats {
    uint64_t fetches_ok, fetches_failed;
    double expires_at; /* wall-clock seconds of the current credentials; 0: none */
};

/* Starts fetching for the settings `c` names (awscreds.h: its role_arn and
 * token_file, or container_uri). Returns NULL (err set) when `c` needs no
 * fetching or out of memory. */
struct awsrole *awsrole_new(struct ev_loop *loop, struct upstream *up, const struct aws_creds *c,
                            char *err, size_t errlen);
void awsrole_free(struct awsrole *r);

struct config;
/* Starts *r when it is not running and a `kind: bedrock` source of `cfg`
 * fetches its credentials (at start, and after a reload that adds one).
 * Every such source shares it: the credentials are the process's. */
void awsrole_ensure(struct awsrole **r, struct ev_loop *loop, struct upstream *up,
                    const struct config *cfg);

/* The current credentials (borrowed until the loop runs again): true, or
 * false with `why` saying what the last fetch found. */
bool awsrole_get(struct awsrole *r, struct sigv4_creds *out, char *why, size_t whylen);

const struct awsrole_stats *awsrole_get_stats(const struct awsrole *r);

/* Parses an STS AssumeRoleWithWebIdentity answer (XML) or a container
 * endpoint's answer (JSON) into the four values (malloc'd; *expires_at in
 * wall-clock seconds). 0, or -1 with `why`. Exposed for the unit tests. */
int awsrole_parse_sts(const char *body, size_t len, char **key_id, char **secret, char **token,
                      double *expires_at, char *why, size_t whylen);
int awsrole_parse_container(const char *body, size_t len, char **key_id, char **secret,
                            char **token, double *expires_at, char *why, size_t whylen);

#endif /* POLYGW_AWSROLE_H */
