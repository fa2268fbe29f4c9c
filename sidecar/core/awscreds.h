/*
 * awscreds.h — the AWS credentials a `kind: bedrock` source signs with,
 * found the way the AWS SDKs and CLI find them (docs/CONFIG.md,
 * "Bedrock"):
 *
 *   1. the environment: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, with
 *      AWS_SESSION_TOKEN when the keys are temporary;
 *   2. a web identity (EKS IRSA): AWS_ROLE_ARN and
 *      AWS_WEB_IDENTITY_TOKEN_FILE (AWS_ROLE_SESSION_NAME optional), the
 *      keys then fetched from STS by the sidecar (upstream/cloudauth.h) at
 *      AWS_ENDPOINT_URL_STS, AWS_ENDPOINT_URL, or https://sts.REGION.amazonaws.com
 *      (REGION: AWS_REGION, AWS_DEFAULT_REGION, else the source's);
 *   3. the shared credentials file, AWS_SHARED_CREDENTIALS_FILE or
 *      ~/.aws/credentials, section [AWS_PROFILE] (default "default"):
 *      aws_access_key_id, aws_secret_access_key, aws_session_token;
 *   4. a container endpoint (EKS Pod Identity, ECS):
 *      AWS_CONTAINER_CREDENTIALS_FULL_URI with the token of
 *      AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE or AWS_CONTAINER_AUTHORIZATION_TOKEN,
 *      fetched likewise.
 *
 * Read when the configuration is loaded (and reloaded, SIGHUP); keys from
 * the credentials file (3) are read again by the sidecar whenever the file
 * changes (upstream/cloudauth.h), as tools that rotate session keys
 * rewrite it. The keys are secrets: never printed, wiped when the
 * configuration is freed.
 */
#ifndef POLYGW_AWSCREDS_H
#define POLYGW_AWSCREDS_H

#include <stddef.h>

struct aws_creds {
    char *region;            /* owned; from the source's `region` */
    char *access_key_id;     /* owned */
    char *secret_access_key; /* owned secret */
    char *session_token;     /* owned secret, NULL for long-term keys */
    /* Set instead of the keys when they are fetched (2 and 4 above); each
     * owned or NULL. */
    char *role_arn, *token_file, *session_name, *sts_url;
    char *container_uri, *container_token_file;
    char *container_token; /* owned secret */
    /* Set with the keys when they came from the credentials file (3):
     * its path and the profile read, each owned. */
    char *creds_file, *profile;
};

/* Did the keys come from the credentials file (and follow it)? */
static inline int aws_creds_watched(const struct aws_creds *c)
{
    return c->creds_file != NULL;
}

/* Reads the keys of section [profile] of the credentials file at `path`
 * into c's access_key_id, secret_access_key and session_token (which must
 * be unset). Returns 1 found, 0 no such file or section (or a section
 * without keys), -1 an error (`why`, never quoting a value; c cleared). */
int aws_creds_read_file(struct aws_creds *c, const char *path, const char *profile, char *why,
                        size_t whylen);

/* Are the keys fetched by the sidecar (a role or a container endpoint)? */
static inline int aws_creds_fetched(const struct aws_creds *c)
{
    return c->role_arn != NULL || c->container_uri != NULL;
}

/* Is `v` fit for a header value holding a credential: 1 to 4096 bytes of
 * printable ASCII without spaces? 1 or 0. */
int aws_creds_value_ok(const char *v);

/* Frees and wipes everything of `c` but region. */
void aws_creds_clear(struct aws_creds *c);

/* Fills c's keys (replacing none already set: call once). Returns 0, or
 * -1 with `why` saying where it looked (never quoting a value). */
int aws_creds_load(struct aws_creds *c, char *why, size_t whylen);

#endif /* POLYGW_AWSCREDS_H */
