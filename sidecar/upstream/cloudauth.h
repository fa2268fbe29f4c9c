/*
 * cloudauth.h — cloud credentials that expire and are fetched again on the
 * loop: the pod identities of EKS for Bedrock, and OAuth 2 access tokens
 * for Vertex AI (docs/CONFIG.md §7a).
 *
 *   web identity (IRSA)  AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE: the
 *                        token file (rotated by the kubelet) is read at each
 *                        fetch and exchanged with STS AssumeRoleWithWebIdentity
 *                        (an unsigned POST; the answer is XML);
 *   container            AWS_CONTAINER_CREDENTIALS_FULL_URI (EKS Pod Identity,
 *                        ECS): a GET with the token of
 *                        AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE (or _TOKEN) in
 *                        Authorization; the answer is JSON;
 *   credentials file     the shared credentials file the keys were loaded
 *                        from (core/awscreds.h): looked at (stat) when a
 *                        request signs and every second, its profile read
 *                        again when it changed, so rotated keys are used
 *                        without a reload;
 *   gcp key              a service-account key (core/gcpcreds.h): a JWT
 *                        signed RS256 with its private key, exchanged at its
 *                        token_uri (grant type jwt-bearer); JSON answer;
 *   gcp metadata         the metadata server (GKE Workload Identity): a GET
 *                        with Metadata-Flavor: Google; JSON answer.
 *   gcp command          token_command: a program run off the loop
 *                        (posix_spawn, its pipes read on the loop, killed with
 *                        its process group after FETCH_TIMEOUT_S); its
 *                        standard output is the token, its standard error
 *                        counted and never kept;
 *   gcp file             token_file: a file looked at (stat) every second and
 *                        read again when it changed.
 *
 * The first fetch starts with the sidecar; each later one is scheduled
 * before the credentials expire (REFRESH_BEFORE_S, or half their life when
 * that is shorter), so calls never wait for one. A failed fetch is retried
 * with backoff (1 s doubling to 60 s) whatever the calls do, and keeps the
 * credentials it had while they are valid: a dead STS is never hit harder
 * because calls arrive. With no valid credentials, cloudauth_get says why, and
 * the attempt fails without being sent.
 *
 * The fetch runs on the upstream engine, like any request (or, for a
 * token_command, in a child process): it never blocks the loop. Keys are
 * held in memory only, wiped when replaced.
 */
#ifndef POLYGW_CLOUDAUTH_H
#define POLYGW_CLOUDAUTH_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/awscreds.h"
#include "core/gcpcreds.h"
#include "sigv4.h"
#include "upstream.h"

struct cloudauth;

struct cloudauth_stats {
    uint64_t fetches_ok, fetches_failed;
    double expires_at; /* wall-clock seconds of the current credentials; 0: none */
};

/* Starts fetching AWS keys for the settings `c` names (its role_arn and
 * token_file, or container_uri), or a Google access token for `g`.
 * Returns NULL (err set) when there is nothing to fetch, or out of memory. */
struct cloudauth *cloudauth_new_aws(struct ev_loop *loop, struct upstream *up,
                                    const struct aws_creds *c, char *err, size_t errlen);
struct cloudauth *cloudauth_new_gcp(struct ev_loop *loop, struct upstream *up,
                                    const struct gcp_creds *g, char *err, size_t errlen);
void cloudauth_free(struct cloudauth *r);

struct config;
/* Starts *aws and *gcp when not running and a source of `cfg` needs them
 * (a `kind: bedrock` source whose keys are fetched; a `kind: vertex`
 * source): at start, and after a reload that adds one. The credentials
 * are the process's: every such source shares them. */
void cloudauth_ensure(struct cloudauth **aws, struct cloudauth **gcp, struct ev_loop *loop,
                      struct upstream *up, const struct config *cfg);

/* The current credentials (borrowed until the loop runs again): true, or
 * false with `why` saying what the last fetch found. A Google access
 * token is in out->session_token (the other two NULL). */
bool cloudauth_get(struct cloudauth *r, struct sigv4_creds *out, char *why, size_t whylen);

const struct cloudauth_stats *cloudauth_get_stats(const struct cloudauth *r);

/* Parses an STS AssumeRoleWithWebIdentity answer (XML), a container
 * endpoint's answer (JSON) or an OAuth 2 token answer (JSON:
 * access_token, expires_in; key_id and secret left NULL) into malloc'd
 * values, *expires_at in wall-clock seconds (`now` + expires_in for the
 * last). 0, or -1 with `why`. Exposed for the unit tests. */
int cloudauth_parse_sts(const char *body, size_t len, char **key_id, char **secret, char **token,
                        double *expires_at, char *why, size_t whylen);
int cloudauth_parse_container(const char *body, size_t len, char **key_id, char **secret,
                              char **token, double *expires_at, char *why, size_t whylen);
int cloudauth_parse_oauth(const char *body, size_t len, double now, char **token,
                          double *expires_at, char *why, size_t whylen);

/* The JWT a service-account key signs to ask for a token (RS256;
 * claims iss, scope, aud, iat, exp = iat + 3600). Malloc'd, NULL on
 * failure. Exposed for the unit tests. */
char *cloudauth_gcp_jwt(const struct gcp_creds *g, long iat);

#endif /* POLYGW_CLOUDAUTH_H */
