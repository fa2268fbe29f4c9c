/*
 * cloudsign.h — the header lines that authenticate an attempt to a cloud
 * provider's source (docs/CONFIG.md §7a): a `kind: bedrock` source's AWS
 * Signature Version 4, a `kind: vertex` source's bearer token.
 */
#ifndef POLYGW_CLOUDSIGN_H
#define POLYGW_CLOUDSIGN_H

#include <stddef.h>
#include <time.h>

#include "core/config.h"

struct cloudauth;
/* The header lines that authenticate one attempt of `src` with cloud
 * credentials: a `kind: bedrock` source's signature (its own keys, or
 * those `aws` fetched), a `kind: vertex` source's bearer token (from
 * `gcp`); *lines NULL for any other source. Returns 0 (*lines malloc'd, a
 * secret the caller wipes and frees), 1 when there are no valid
 * credentials to use (`why` says so: the attempt is refused unsent), or
 * -1 out of memory. */
int cloudsign_lines(const struct config_source *src, struct cloudauth *aws, struct cloudauth *gcp,
                    const char *url, const void *body, size_t body_len, time_t now, char **lines,
                    char *why, size_t whylen);

#endif /* POLYGW_CLOUDSIGN_H */
