/*
 * cost.h — what a call costs: its token counts, split into disjoint
 * classes, times a source's prices (docs/CONFIG.md §7d).
 *
 * A price is per million tokens of one class, in the deployment's one
 * currency (a label: nothing is converted). The classes do not overlap, so
 * a cost is a plain sum:
 *
 *   input        prompt tokens neither read from nor written to a cache
 *   cached       prompt tokens read from the provider's prompt cache
 *   cache_write  prompt tokens written to it (Anthropic's cache creation)
 *   output       completion tokens that are not reasoning
 *   reasoning    completion tokens spent reasoning (thinking)
 *
 * A source without prices has no cost (NAN), never 0: an unpriced model is
 * not free, its cost is unknown. Pure: no I/O, no clock, no allocation.
 */
#ifndef POLYGW_COST_H
#define POLYGW_COST_H

#include <stdbool.h>
#include <stdint.h>

enum cost_class { COST_INPUT = 0, COST_CACHED, COST_CACHE_WRITE, COST_OUTPUT, COST_REASONING };
#define COST_CLASSES 5

/* A source's prices per million tokens, >= 0 each, or !set: unpriced. */
struct cost_prices {
    bool set;
    double per_mtok[COST_CLASSES]; /* enum cost_class */
};

/* One answer's tokens by class (enum cost_class), each >= 0. */
struct cost_tokens {
    int64_t n[COST_CLASSES];
};

/* "input", "cached_input", "cache_write", "output", "reasoning": the
 * class's name in the configuration, metrics and results. */
const char *cost_class_name(enum cost_class c);

/* The cost of `t` at prices `p` (both borrowed): the sum over the classes
 * of tokens x price / 10^6, or NAN when `p` is unset. */
double cost_of(const struct cost_prices *p, const struct cost_tokens *t);

/* The most an answer of `in` prompt tokens and `out` output tokens can
 * cost at `p`: every prompt token at the dearest input class, every output
 * token at the dearer of output and reasoning. NAN when `p` is unset. */
double cost_worst(const struct cost_prices *p, double in, double out);

/* True when `c` is a cost (finite, >= 0), false for NAN (unknown). */
bool cost_is_known(double c);

#endif /* POLYGW_COST_H */
