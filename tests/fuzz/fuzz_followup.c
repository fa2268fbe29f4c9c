/*
 * fuzz_followup.c — libFuzzer target: the HTTP front's reading of a
 * Responses API follow-up (http/raw.h). The first byte picks the method
 * (GET, POST, DELETE or PUT) and whether the capability is a passthrough;
 * the rest is a request target after /v1 (its path, then maybe '?' and a
 * query), read as http.c reads it: httpraw_followup on the path,
 * httpraw_stream_query on the query, raw_call_suffix_problem on what
 * follows the capability's path. Contracts checked:
 *   - httpraw_followup returns -2 .. 2; never reads past n (the path is
 *     copied to a buffer of exactly its size, for ASan);
 *   - 0 exactly when the path is not the capability's path, '/', then at
 *     least one byte (or the capability is raw);
 *   - > 0: the id is p[11 ..] (after "/responses/"), 1 to RESPIDS_ID_MAX
 *     bytes respids_id_ok accepts, followed by nothing (1: GET, DELETE),
 *     or by "/cancel" (2: POST) or "/input_items" (2: GET);
 *   - -2 only where the same path with another method is a follow-up;
 *   - httpraw_stream_query is true exactly when one '&'-separated
 *     parameter is the 11 bytes "stream=true" (a naive reference);
 *   - an accepted suffix (the follow-up's sub-path and query) is printable
 *     ASCII without spaces or '#'.
 */
#include <http_parser.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/respids.h"
#include "call/rawcall.h"
#include "core/config.h"
#include "http/raw.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const int methods[4] = { HTTP_GET, HTTP_POST, HTTP_DELETE, HTTP_PUT };

/* The reference reading of the query: split at every '&'. */
static bool naive_stream(const char *q, size_t n)
{
    size_t start = 0;

    for (size_t i = 0; i <= n; i++) {
        if (i == n || q[i] == '&') {
            if (i - start == 11 && memcmp(q + start, "stream=true", 11) == 0)
                return true;
            start = i + 1;
        }
    }
    return false;
}

static void check_followup(const struct config_capability *cap, const char *p, size_t n, int method)
{
    size_t off = 0, len = 0;
    int rc = httpraw_followup(cap, p, n, method, &off, &len);
    bool below = !cap->raw && n > 11 && memcmp(p, "/responses/", 11) == 0;

    if (rc < -2 || rc > 2 || (rc == 0) != !below)
        abort();
    if (rc > 0) {
        if (off != 11 || len == 0 || len > RESPIDS_ID_MAX || off + len > n ||
            !respids_id_ok(p + off, len))
            abort();
        const char *rest = p + off + len;
        size_t rlen = n - off - len;
        if (rc == 1 && (rlen != 0 || (method != HTTP_GET && method != HTTP_DELETE)))
            abort();
        if (rc == 2 && !(rlen == 7 && memcmp(rest, "/cancel", 7) == 0 && method == HTTP_POST) &&
            !(rlen == 12 && memcmp(rest, "/input_items", 12) == 0 && method == HTTP_GET))
            abort();
    }
    if (rc == -2) {
        bool other = false;
        for (size_t i = 0; i < 4 && !other; i++)
            other = methods[i] != method && httpraw_followup(cap, p, n, methods[i], &off, &len) > 0;
        if (!other)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct config_capability cap;

    if (size < 1)
        return 0;
    memset(&cap, 0, sizeof(cap));
    strcpy(cap.path, "/responses");
    cap.raw = (data[0] & 4) != 0;
    int method = methods[data[0] & 3];
    const char *t = (const char *)data + 1;
    size_t tn = size - 1;
    const char *q = memchr(t, '?', tn);
    size_t plen = q ? (size_t)(q - t) : tn;

    /* Exactly the path's bytes, so that a read past n is an ASan report. */
    char *p = malloc(plen ? plen : 1);
    if (!p)
        return 0;
    memcpy(p, t, plen);
    check_followup(&cap, p, plen, method);
    free(p);

    size_t qn = q ? tn - plen - 1 : 0;
    char *qb = malloc(qn ? qn : 1);
    if (!qb)
        return 0;
    if (qn)
        memcpy(qb, q + 1, qn);
    if (httpraw_stream_query(q ? qb : NULL, qn) != naive_stream(qb, qn))
        abort();
    free(qb);

    /* What http.c checks before relaying a follow-up: the target after the
     * capability's path. */
    if (tn >= 10 && memcmp(t, "/responses", 10) == 0) {
        const char *s = t + 10;
        size_t sn = tn - 10;
        if (raw_call_suffix_problem(s, sn) == NULL)
            for (size_t i = 0; i < sn; i++)
                if (s[i] <= ' ' || s[i] > '~' || s[i] == '#')
                    abort();
    }
    return 0;
}
