/*
 * awscreds.h — the AWS credentials a `kind: bedrock` source signs with,
 * found the way the AWS SDKs and CLI find them (docs/CONFIG.md,
 * "Bedrock"):
 *
 *   1. the environment: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, with
 *      AWS_SESSION_TOKEN when the keys are temporary;
 *   2. the shared credentials file, AWS_SHARED_CREDENTIALS_FILE or
 *      ~/.aws/credentials, section [AWS_PROFILE] (default "default"):
 *      aws_access_key_id, aws_secret_access_key, aws_session_token.
 *
 * Read when the configuration is loaded (and reloaded, SIGHUP). The keys
 * are secrets: never printed, wiped when the configuration is freed.
 */
#ifndef POLYGW_AWSCREDS_H
#define POLYGW_AWSCREDS_H

#include <stddef.h>

struct aws_creds {
    char *region;            /* owned; from the source's `region` */
    char *access_key_id;     /* owned */
    char *secret_access_key; /* owned secret */
    char *session_token;     /* owned secret, NULL for long-term keys */
};

/* Fills c's keys (replacing none already set: call once). Returns 0, or
 * -1 with `why` saying where it looked (never quoting a value). */
int aws_creds_load(struct aws_creds *c, char *why, size_t whylen);

#endif /* POLYGW_AWSCREDS_H */
