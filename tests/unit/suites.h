/* suites.h — every Check suite of the unit-test binary (one per module). */
#ifndef POLYGW_TEST_SUITES_H
#define POLYGW_TEST_SUITES_H

#include <check.h>

Suite *frame_suite(void);
Suite *rpc_suite(void);
Suite *vectors_suite(void);
Suite *config_suite(void);
Suite *sse_suite(void);
Suite *sigv4_suite(void);
Suite *cloudauth_suite(void);
Suite *evstream_suite(void);
Suite *outcome_suite(void);
Suite *transcode_suite(void);
Suite *stallclock_suite(void);
Suite *breaker_suite(void);
Suite *aimd_suite(void);
Suite *bucket_suite(void);
Suite *progress_suite(void);
Suite *gov_suite(void);
Suite *task_suite(void);
Suite *redis_url_suite(void);
Suite *redis_cluster_suite(void);
Suite *dialect_suite(void);
Suite *convert_suite(void);
Suite *converse_suite(void);
Suite *redis_tls_suite(void);
Suite *tasks_suite(void);
Suite *call_suite(void);
Suite *backend_memory_suite(void);
Suite *prom_suite(void);
Suite *metrics_suite(void);
Suite *redact_suite(void);
Suite *jscan_suite(void);
Suite *lib_suite(void);
Suite *yamltree_suite(void);
Suite *redis_resolve_suite(void);
Suite *log_suite(void);
Suite *httpreq_suite(void);
Suite *raw_suite(void);
Suite *h1_suite(void);
Suite *conn_suite(void);
Suite *writer_suite(void);
Suite *figures_suite(void);
Suite *budget_suite(void);
Suite *trace_suite(void);
Suite *cache_suite(void);

#endif
