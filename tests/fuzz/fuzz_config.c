/*
 * fuzz_config.c — libFuzzer target: YAML text -> config_parse() -> config_free().
 */
#include "backend/redis_url.h"
#include "core/config.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];

    config_set_backend_syntax(&rds_config_syntax); /* as the daemon does */
    struct config *cfg = config_parse((const char *)data, size, "fuzz", err, sizeof(err));

    config_free(cfg);
    return 0;
}
