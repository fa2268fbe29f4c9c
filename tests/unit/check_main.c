/* check_main.c — runs every unit suite in fork mode (crash isolation and
 * per-test timeouts come from Check). Exit status is non-zero on any failure.
 *
 * POLYGW_UNIT_SHARD=K/N (1 <= K <= N) runs every Nth suite from the Kth
 * only: tests/unit/run-shards.sh runs N of them side by side. */
#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "suites.h"

int main(void)
{
    /* One suite a line, so adding one is a one-line change (clang-format
     * would lay a list this long out in columns). */
    /* clang-format off */
    Suite *(*const suites[])(void) = {
        frame_suite,
        rpc_suite,
        vectors_suite,
        config_suite,
        sse_suite,
        evstream_suite,
        sigv4_suite,
        cloudauth_suite,
        outcome_suite,
        transcode_suite,
        stallclock_suite,
        breaker_suite,
        aimd_suite,
        bucket_suite,
        progress_suite,
        gov_suite,
        task_suite,
        redis_url_suite,
        redis_cluster_suite,
        dialect_suite,
        convert_suite,
        converse_suite,
        redis_tls_suite,
        tasks_suite,
        call_suite,
        backend_memory_suite,
        prom_suite,
        metrics_suite,
        redact_suite,
        jscan_suite,
        lib_suite,
        yamltree_suite,
        redis_resolve_suite,
        log_suite,
        httpreq_suite,
        raw_suite,
        h1_suite,
        conn_suite,
        writer_suite,
        figures_suite,
        budget_suite,
        trace_suite,
        cache_suite,
    };
    /* clang-format on */
    size_t shard = 0, shards = 1;
    const char *spec = getenv("POLYGW_UNIT_SHARD");
    if (spec && *spec) {
        unsigned k = 0, n = 0;
        char end = 0;
        if (sscanf(spec, "%u/%u%c", &k, &n, &end) != 2 || k < 1 || k > n) {
            fprintf(stderr, "POLYGW_UNIT_SHARD: want K/N with 1 <= K <= N, got '%s'\n", spec);
            return EXIT_FAILURE;
        }
        shard = k - 1;
        shards = n;
    }
    SRunner *sr = srunner_create(NULL);

    config_set_backend_syntax(backend_config_syntax()); /* as main.c does */

    for (size_t i = 0; i < sizeof(suites) / sizeof(suites[0]); i++)
        if (i % shards == shard)
            srunner_add_suite(sr, suites[i]());
    srunner_set_fork_status(sr, CK_FORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
