/*
 * redis_tls.h — TLS for hiredis 0.14, which has none: an in-process bridge.
 *
 * hiredis keeps talking plain RESP, to one end of a socketpair; this module
 * owns the other end and the real TCP connection, and pumps bytes between
 * them through OpenSSL on the same libev loop (non-blocking SSL_read and
 * SSL_write, waiting for whatever WANT_READ / WANT_WRITE asks). Nothing of
 * hiredis is patched: rtls_new() only swaps the descriptor under a context
 * whose non-blocking connect has just been started, before it is attached
 * to the loop. The whole module goes away once hiredis >= 1.0 (hiredis_ssl)
 * is what Debian ships.
 *
 * Verification is always on: the server's chain against `ca_file` (or the
 * system store), its name against `server_name` (or the host connected to;
 * an IP literal is checked against the certificate's IP addresses). SNI
 * carries the name unless it is an IP literal. A client certificate is
 * optional.
 *
 * Failures are not reported through callbacks: the bridge records a reason
 * (rtls_error) and closes its end of the socketpair, so hiredis sees the
 * connection end the ordinary way and its owner reads the reason then.
 *
 * Writes to a peer that has gone raise SIGPIPE: the process must ignore it
 * (the daemon does, in main).
 */
#ifndef POLYGW_REDIS_TLS_H
#define POLYGW_REDIS_TLS_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>

struct rtls_opts {
    const char *ca_file;     /* PEM bundle; NULL = the system store */
    const char *cert_file;   /* client certificate chain (PEM); NULL = none */
    const char *key_file;    /* its private key (PEM); with cert_file */
    const char *server_name; /* expected name; NULL = the host connected to */
};

struct rtls_ctx;
struct rtls;
struct ssl_st;     /* OpenSSL's SSL */
struct ssl_ctx_st; /* OpenSSL's SSL_CTX */

/* Loads the CA, certificate and key (reading the files now). Returns an
 * owned context, or NULL with a reason naming the file that failed. The
 * strings are copied. */
struct rtls_ctx *rtls_ctx_new(const struct rtls_opts *o, char *err, size_t errlen);
void rtls_ctx_free(struct rtls_ctx *ctx); /* NULL ok; after every rtls_free */

/* Takes over the TCP socket *fd (non-blocking, connect in progress or done)
 * and puts in its place, under the same number, a connected socketpair end
 * for the caller's plain protocol. `host` (borrowed) is what was connected
 * to, the name checked unless the context has a server_name. Returns the
 * bridge (owned; it borrows ctx and loop), or NULL with a reason and *fd
 * untouched. */
struct rtls *rtls_new(struct ev_loop *loop, struct rtls_ctx *ctx, int *fd, const char *host,
                      char *err, size_t errlen);

/* Closes the TLS side (the caller closes the plain descriptor it holds).
 * NULL ok. Never called back into anything: safe from any callback. */
void rtls_free(struct rtls *t);

/* Why the bridge gave up (connect error, handshake or verification failure,
 * TLS error, the server closing), or NULL while it works. No secrets. */
const char *rtls_error(const struct rtls *t);

/* Is the TLS session established (handshake done, not failed)? */
bool rtls_is_open(const struct rtls *t);

/* Shared with the other TLS client (h1.c), on OpenSSL's own objects: */

/* The context's OpenSSL context (owned by ctx). */
struct ssl_ctx_st *rtls_ctx_ssl(const struct rtls_ctx *ctx);

/* Sets what `ssl` checks the server against: `name` as SNI and the
 * certificate's host name, or, for an IP literal, the certificate's
 * addresses without SNI. 0 or -1. */
int rtls_set_peer(struct ssl_st *ssl, const char *name);

/* Why SSL_connect failed (its SSL_get_error `e`), in `buf`: the
 * verification result when the chain or the name was refused ("certificate
 * verify failed: ..."), else OpenSSL's reason or the socket's error. Empties
 * OpenSSL's error queue. Names no secret. Returns buf. */
const char *rtls_handshake_error(struct ssl_st *ssl, int e, char *buf, size_t cap);

#endif /* POLYGW_REDIS_TLS_H */
