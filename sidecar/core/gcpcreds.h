/*
 * gcpcreds.h — where a `kind: vertex` source gets its OAuth 2 access
 * token, found as Google's client libraries find it (docs/CONFIG.md,
 * "Vertex AI"):
 *
 *   1. GOOGLE_APPLICATION_CREDENTIALS names a service-account key file
 *      (JSON, "type": "service_account"): the sidecar signs a JWT (RS256)
 *      with its private key and exchanges it at the key's token_uri;
 *   2. else the metadata server of GKE Workload Identity or a GCE VM
 *      (GCE_METADATA_HOST, default metadata.google.internal) hands the
 *      token of the pod's service account.
 *
 * The key file is read and checked when the configuration is loaded; the
 * tokens themselves are fetched on the loop (upstream/cloudauth.h).
 */
#ifndef POLYGW_GCPCREDS_H
#define POLYGW_GCPCREDS_H

#include <stddef.h>

struct gcp_creds {
    char *key_file;       /* owned: the service-account key's path, or NULL */
    char *client_email;   /* owned, from the key */
    char *private_key;    /* owned secret (PEM), from the key */
    char *private_key_id; /* owned or NULL, from the key (the JWT's kid) */
    char *token_uri;      /* owned, from the key */
    char *metadata_url;   /* owned: the metadata server's token URL (no key file) */
};

/* Fills `c`. Returns 0, or -1 with `why` (never quoting a secret). */
int gcp_creds_load(struct gcp_creds *c, char *why, size_t whylen);

/* Frees and wipes everything of `c`. */
void gcp_creds_clear(struct gcp_creds *c);

#endif /* POLYGW_GCPCREDS_H */
