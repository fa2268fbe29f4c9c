/*
 * tls.h — OpenSSL client contexts built from the configuration's files,
 * shared by every TLS client of the daemon (the Redis bridge, the checks
 * of a source's `tls` section).
 *
 * A context always verifies the peer: its chain against `ca_file` or the
 * system store, TLS 1.2 at least; a client certificate is optional.
 * Checking the peer's name is the connection's business (SSL_set1_host).
 */
#ifndef POLYGW_TLS_H
#define POLYGW_TLS_H

#include <stddef.h>

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

struct tls_files {
    const char *ca_file;   /* PEM bundle; NULL = the system store */
    const char *cert_file; /* client certificate chain (PEM); NULL = none */
    const char *key_file;  /* its private key (PEM); with cert_file */
};

/* Loads the CA, certificate and key (reading the files now). Returns an
 * owned context (SSL_CTX_free), or NULL with a reason naming the file that
 * failed. */
SSL_CTX *tls_ctx_new(const struct tls_files *f, char *err, size_t errlen);

/* Sets what `ssl` checks the server against: `name` as SNI and the
 * certificate's host name, or, for an IP literal, the certificate's
 * addresses without SNI. 0 or -1. */
int tls_set_peer(SSL *ssl, const char *name);

/* Why SSL_connect failed (its SSL_get_error `e`), in `buf`: the
 * verification result when the chain or the name was refused ("certificate
 * verify failed: ..."), else OpenSSL's reason or the socket's error. Empties
 * OpenSSL's error queue. Names no secret. Returns buf. */
const char *tls_handshake_error(SSL *ssl, int e, char *buf, size_t cap);

/* OpenSSL's last queued error as text (the queue emptied), or `dflt`. */
const char *tls_reason(char *buf, size_t cap, const char *dflt);

#endif /* POLYGW_TLS_H */
