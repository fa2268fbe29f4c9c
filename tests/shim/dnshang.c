/*
 * dnshang.c — an LD_PRELOAD shim that makes name resolution misbehave on
 * purpose, so the integration tests can prove that a hung getaddrinfo never
 * blocks the sidecar's loop nor outlives the attempt's connect deadline
 * (docs/DESIGN.md §3.3; issue 3).
 *
 * Environment (read once, at the first call):
 *
 *   POLYGW_TEST_DNS_HANG    comma-separated node names whose lookup blocks
 *                           for POLYGW_TEST_DNS_HANG_S seconds (default 60),
 *                           then fails with EAI_AGAIN — a resolver that
 *                           never answers.
 *   POLYGW_TEST_DNS_MAP     comma-separated `name=address` pairs resolved at
 *                           once to that numeric address (so a test can use
 *                           a real-looking host name that reaches the
 *                           loopback mock without touching /etc/hosts).
 *   POLYGW_TEST_DNS_MAP_FILE  a file of `name=address` lines, read again at
 *                           every lookup (after POLYGW_TEST_DNS_MAP), so a
 *                           test can change what a name resolves to while
 *                           the sidecar runs.
 *   POLYGW_TEST_DNS_FAIL    comma-separated node names that fail at once
 *                           with EAI_NONAME (NXDOMAIN), without asking any
 *                           real resolver.
 *
 * Names are compared ASCII-case-insensitively. Every other lookup goes to
 * the next getaddrinfo in the library order (libc's, or the ASan
 * interceptor in front of it), found with dlsym(RTLD_NEXT).
 *
 * Under an ASan-built sidecar the shim comes before the ASan runtime in the
 * library list; run it with ASAN_OPTIONS=...:verify_asan_link_order=0. The
 * shim itself is never sanitized (see the Makefile).
 *
 * For debugging, polygw_test_dns_in_progress() returns how many hung
 * lookups are blocked right now (e.g. from gdb), and POLYGW_TEST_DNS_LOG=1
 * writes one line to stderr when a hung lookup starts and ends.
 */
#include <dlfcn.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

typedef int getaddrinfo_fn(const char *node, const char *service, const struct addrinfo *hints,
                           struct addrinfo **res);

#define DNSHANG_MAX_NAMES 32
#define DNSHANG_NAME_MAX  256

struct dnshang_entry {
    char name[DNSHANG_NAME_MAX];
    char addr[64]; /* numeric address for MAP entries */
};

static pthread_once_t dnshang_once = PTHREAD_ONCE_INIT;
static getaddrinfo_fn *dnshang_next;
static struct dnshang_entry dnshang_hang[DNSHANG_MAX_NAMES];
static size_t dnshang_n_hang;
static struct dnshang_entry dnshang_map[DNSHANG_MAX_NAMES];
static size_t dnshang_n_map;
static struct dnshang_entry dnshang_fail[DNSHANG_MAX_NAMES];
static size_t dnshang_n_fail;
static const char *dnshang_map_file;
static double dnshang_hang_s = 60.0;
static int dnshang_log;
static atomic_int dnshang_in_progress;

int polygw_test_dns_in_progress(void);

int polygw_test_dns_in_progress(void)
{
    return atomic_load(&dnshang_in_progress);
}

/* Splits `list` at commas into `out` (name, and for MAP the part after '='). */
static size_t dnshang_parse(const char *list, struct dnshang_entry *out, int with_addr)
{
    size_t n = 0;

    while (list && *list && n < DNSHANG_MAX_NAMES) {
        const char *end = strchr(list, ',');
        size_t len = end ? (size_t)(end - list) : strlen(list);
        char item[DNSHANG_NAME_MAX + 64];

        if (len > 0 && len < sizeof(item)) {
            memcpy(item, list, len);
            item[len] = '\0';
            char *eq = with_addr ? strchr(item, '=') : NULL;
            if (eq)
                *eq = '\0';
            if ((!with_addr || (eq && eq[1])) && item[0] && strlen(item) < DNSHANG_NAME_MAX) {
                snprintf(out[n].name, sizeof(out[n].name), "%s", item);
                if (eq)
                    snprintf(out[n].addr, sizeof(out[n].addr), "%s", eq + 1);
                n++;
            }
        }
        list = end ? end + 1 : NULL;
    }
    return n;
}

static void dnshang_init(void)
{
    const char *s;

    dnshang_next = (getaddrinfo_fn *)dlsym(RTLD_NEXT, "getaddrinfo");
    dnshang_n_hang = dnshang_parse(getenv("POLYGW_TEST_DNS_HANG"), dnshang_hang, 0);
    dnshang_n_map = dnshang_parse(getenv("POLYGW_TEST_DNS_MAP"), dnshang_map, 1);
    dnshang_n_fail = dnshang_parse(getenv("POLYGW_TEST_DNS_FAIL"), dnshang_fail, 0);
    if ((s = getenv("POLYGW_TEST_DNS_MAP_FILE")) && *s)
        dnshang_map_file = s;
    if ((s = getenv("POLYGW_TEST_DNS_HANG_S")) && *s) {
        double v = strtod(s, NULL);
        if (v >= 0)
            dnshang_hang_s = v;
    }
    dnshang_log = (s = getenv("POLYGW_TEST_DNS_LOG")) && *s == '1';
}

static const struct dnshang_entry *dnshang_find(const struct dnshang_entry *list, size_t n,
                                                const char *node)
{
    for (size_t i = 0; node && i < n; i++) {
        if (strcasecmp(list[i].name, node) == 0)
            return &list[i];
    }
    return NULL;
}

/* The address POLYGW_TEST_DNS_MAP_FILE gives `node` now, in out (cap
 * bytes); false when the file is absent or does not name it. */
static bool dnshang_file_find(const char *node, char *out, size_t cap)
{
    FILE *f = dnshang_map_file && node ? fopen(dnshang_map_file, "re") : NULL;
    char line[DNSHANG_NAME_MAX + 64];
    bool found = false;

    while (f && !found && fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\r\n")] = '\0';
        char *eq = strchr(line, '=');
        if (!eq || !eq[1])
            continue;
        *eq = '\0';
        if (strcasecmp(line, node) == 0) {
            snprintf(out, cap, "%s", eq + 1);
            found = true;
        }
    }
    if (f)
        fclose(f);
    return found;
}

/* Sleeps the whole period even when signals interrupt nanosleep. */
static void dnshang_sleep(double s)
{
    struct timespec ts = { .tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9) };

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res)
{
    const struct dnshang_entry *e;

    pthread_once(&dnshang_once, dnshang_init);
    if (!dnshang_next)
        return EAI_SYSTEM;
    if ((e = dnshang_find(dnshang_hang, dnshang_n_hang, node))) {
        int now = atomic_fetch_add(&dnshang_in_progress, 1) + 1;
        if (dnshang_log)
            fprintf(stderr, "dnshang: lookup of %s hangs for %gs (%d in progress)\n", node,
                    dnshang_hang_s, now);
        dnshang_sleep(dnshang_hang_s);
        now = atomic_fetch_sub(&dnshang_in_progress, 1) - 1;
        if (dnshang_log)
            fprintf(stderr, "dnshang: lookup of %s gives up (%d in progress)\n", node, now);
        return EAI_AGAIN;
    }
    if (dnshang_find(dnshang_fail, dnshang_n_fail, node))
        return EAI_NONAME;
    char addr[64];
    e = dnshang_find(dnshang_map, dnshang_n_map, node);
    if (e || dnshang_file_find(node, addr, sizeof(addr))) {
        /* Let the real resolver build the result from the numeric address:
         * the caller then frees it with the real freeaddrinfo. */
        struct addrinfo h = { 0 };
        if (hints)
            h = *hints;
        h.ai_flags |= AI_NUMERICHOST;
        h.ai_flags &= ~AI_CANONNAME;
        return dnshang_next(e ? e->addr : addr, service, &h, res);
    }
    return dnshang_next(node, service, hints, res);
}
