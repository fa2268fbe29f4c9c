/*
 * reply.c — the fields of an error answer (reply.h).
 */
#include "reply.h"

#include <string.h>

uint32_t reply_error_n_fields(const struct reply_error *e, const char *app)
{
    return (app || e->app) + e->has_attempts + (e->stalled_s >= 0) + (e->retry_after_s >= 0) +
        (e->status != 0) + (e->upstream_body != NULL) + (e->reason != NULL) +
        (e->reason_kind != NULL) + e->n_more;
}

void reply_error_write_fields(struct writer *w, const struct reply_error *e, const char *app)
{
    if (app || e->app)
        writer_kv_str(w, "app", app ? app : e->app);
    if (e->has_attempts)
        writer_kv_u64(w, "attempts", e->attempts);
    if (e->stalled_s >= 0)
        writer_kv_double(w, "stalled_s", e->stalled_s);
    if (e->retry_after_s >= 0)
        writer_kv_double(w, "retry_after_s", e->retry_after_s);
    if (e->status)
        writer_kv_i64(w, "status", e->status);
    if (e->upstream_body) {
        writer_str(w, "upstream_body");
        if (e->upstream_body_json)
            writer_raw_json(w, e->upstream_body, e->upstream_body_len);
        else
            w->ops->str(w, e->upstream_body, e->upstream_body_len);
    }
    if (e->reason)
        writer_kv_text(w, "reason", e->reason);
    if (e->reason_kind)
        writer_kv_text(w, "reason_kind", e->reason_kind);
    if (e->n_more)
        e->write_more(w, e);
}

void reply_error_write(struct writer *w, const struct reply_error *e)
{
    writer_map(w, 2 + reply_error_n_fields(e, NULL));
    writer_kv_str(w, "code", pgw_code_name(e->code));
    writer_kv_text(w, "message", e->message ? e->message : "");
    reply_error_write_fields(w, e, NULL);
}
