/*
 * fuzz_retry_after.c — libFuzzer target: an upstream's Retry-After header
 * value -> outcome_parse_retry_after(), checking the documented range.
 */
#include "outcome.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Fixed "now"s: mid-range, near the RFC 850 century pivot, and epoch 0. */
    static const double nows[] = { 1700000000.0, 4102444800.0, 0.0 };
    char *s = malloc(size + 1);
    size_t i;

    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    for (i = 0; i < sizeof(nows) / sizeof(nows[0]); i++) {
        double out = -42.0;
        int rc = outcome_parse_retry_after(s, nows[i], &out);

        if (rc == 0 && !(out >= 0 && out <= OUTCOME_RETRY_AFTER_MAX_S))
            abort(); /* contract: clamped to [0, OUTCOME_RETRY_AFTER_MAX_S] */
        if (rc != 0 && (rc != OUTCOME_EINVAL || out != -42.0))
            abort(); /* contract: EINVAL leaves *out_s unchanged */
    }
    free(s);
    return 0;
}
