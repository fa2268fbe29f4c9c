/*
 * iplit.c — IP address literals (iplit.h).
 */
#include "iplit.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>

int iplit_parse(const char *s, size_t n, unsigned which, unsigned char out[16])
{
    char buf[INET6_ADDRSTRLEN + 1];
    unsigned char tmp[16];

    if (!out)
        out = tmp;
    if (n >= 2 && s[0] == '[' && s[n - 1] == ']') {
        if (!(which & IPLIT_V6) || !(which & IPLIT_BRACKETS))
            return 0;
        which = IPLIT_V6;
        s++;
        n -= 2;
    } else if (which & IPLIT_BRACKETS) {
        which &= ~(unsigned)IPLIT_V6;
    }
    if (n == 0 || n >= sizeof(buf) || memchr(s, '\0', n))
        return 0;
    memcpy(buf, s, n);
    buf[n] = '\0';
    if ((which & IPLIT_V4) && inet_pton(AF_INET, buf, out) == 1)
        return AF_INET;
    if ((which & IPLIT_V6) && inet_pton(AF_INET6, buf, out) == 1)
        return AF_INET6;
    return 0;
}

bool iplit_is(const char *s)
{
    return iplit_parse(s, strlen(s), IPLIT_ANY, NULL) != 0;
}

int iplit_sockaddr(const char *s, size_t n, unsigned which, uint16_t port,
                   struct sockaddr_storage *ss, socklen_t *len)
{
    unsigned char a[16];

    memset(ss, 0, sizeof(*ss));
    switch (iplit_parse(s, n, which, a)) {
    case AF_INET: {
        struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
        s4->sin_family = AF_INET;
        s4->sin_port = htons(port);
        memcpy(&s4->sin_addr, a, 4);
        *len = sizeof(*s4);
        return 0;
    }
    case AF_INET6: {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons(port);
        memcpy(&s6->sin6_addr, a, 16);
        *len = sizeof(*s6);
        return 0;
    }
    default:
        return -1;
    }
}
