/*
 * utf8.c — utf8.h holds the contract.
 */
#include "utf8.h"

#include "strbuf.h"

/* The length of the sequence a non-ASCII lead byte starts (0 when it can
 * start none: a continuation byte, C0, C1, F5..FF) and the range its second
 * byte must lie in, which rules out overlong forms (E0 80..9F, F0 80..8F),
 * surrogates (ED A0..BF) and code points above U+10FFFF (F4 90..). */
static size_t utf8_lead(unsigned char c, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c == 0xE0)
        *lo = 0xA0;
    else if (c == 0xED)
        *hi = 0x9F;
    else if (c == 0xF0)
        *lo = 0x90;
    else if (c == 0xF4)
        *hi = 0x8F;
    return c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
}

size_t utf8_seq_len(const unsigned char *p, const unsigned char *end)
{
    unsigned char lo, hi;
    size_t n = utf8_lead(p[0], &lo, &hi);

    if (n == 0 || (size_t)(end - p) < n || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if ((p[i] & 0xC0) != 0x80)
            return 0;
    return n;
}

size_t utf8_bad_len(const unsigned char *p, const unsigned char *end)
{
    unsigned char lo, hi;
    size_t n = utf8_lead(p[0], &lo, &hi), i;

    if (n == 0 || end - p < 2 || p[1] < lo || p[1] > hi)
        return 1;
    for (i = 2; i < n && p + i < end && (p[i] & 0xC0) == 0x80; i++)
        ;
    return i;
}

size_t utf8_valid_prefix(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)(n ? s : ""), *end = p + n;

    while (p < end) {
        size_t k = *p < 0x80 ? 1 : utf8_seq_len(p, end);
        if (k == 0)
            break;
        p += k;
    }
    return (size_t)(p - (const unsigned char *)(n ? s : ""));
}

size_t utf8_cut(const char *s, size_t n, size_t max)
{
    if (n <= max)
        return n;
    /* Back over continuation bytes to the start of the character that
     * would be split. */
    while (max > 0 && ((unsigned char)s[max] & 0xC0) == 0x80)
        max--;
    return max;
}

long utf8_repair(const char *s, size_t n, struct strbuf *out)
{
    static const char fffd[3] = { (char)0xEF, (char)0xBF, (char)0xBD };
    const unsigned char *p = (const unsigned char *)(n ? s : ""), *end = p + n, *run = p;
    size_t start = out->len;
    long bad = 0;

    if (strbuf_reserve(out, n) < 0)
        return STRBUF_ENOMEM;
    while (p < end) {
        if (*p < 0x80) {
            p++;
            continue;
        }
        size_t k = utf8_seq_len(p, end);
        if (k) {
            p += k;
            continue;
        }
        if (strbuf_put(out, run, (size_t)(p - run)) < 0 || strbuf_put(out, fffd, 3) < 0) {
            out->len = start;
            return STRBUF_ENOMEM;
        }
        bad++;
        p += utf8_bad_len(p, end);
        run = p;
    }
    if (strbuf_put(out, run, (size_t)(p - run)) < 0) {
        out->len = start;
        return STRBUF_ENOMEM;
    }
    out->data[out->len] = '\0';
    return bad;
}
