/*
 * iplit.h — one parser of IP address literals for the daemon and the tools.
 *
 * An IPv4 literal is a dotted quad as inet_pton(AF_INET) takes it; an IPv6
 * literal is what inet_pton(AF_INET6) takes (no zone id). Callers pass
 * bytes with a length, so a host inside a URL, a Host header or a listen
 * address needs no copy. Pure functions on borrowed bytes; libc only.
 */
#ifndef POLYGW_IPLIT_H
#define POLYGW_IPLIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

enum {
    IPLIT_V4 = 1,       /* accept a dotted quad */
    IPLIT_V6 = 2,       /* accept a bare IPv6 address */
    IPLIT_ANY = 3,      /* either */
    IPLIT_BRACKETS = 4, /* with IPLIT_V6: the IPv6 address must stand in
                         * "[...]", as URLs and Host headers write it */
};

/* Parses s[0..n) as an IP literal of a kind `which` allows. Returns
 * AF_INET (4 bytes of address in *out when out is not NULL) or AF_INET6
 * (16 bytes), or 0 when it is not such a literal. */
int iplit_parse(const char *s, size_t n, unsigned which, unsigned char out[16]);

/* Whether the C string s is an IPv4 or a bare IPv6 literal. */
bool iplit_is(const char *s);

/* The socket address of the literal s[0..n) (kinds as for iplit_parse)
 * with `port`, in *ss and its length in *len. Returns 0, or -1 when s is
 * not such a literal. */
int iplit_sockaddr(const char *s, size_t n, unsigned which, uint16_t port,
                   struct sockaddr_storage *ss, socklen_t *len);

#endif /* POLYGW_IPLIT_H */
