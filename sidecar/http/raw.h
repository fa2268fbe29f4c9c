/*
 * raw.h — the HTTP front's side of passthrough capabilities (`body: raw`,
 * docs/HTTP.md §1 and docs/CONFIG.md §6b): which request paths and methods
 * such a capability serves, the bound on its request bodies, and what of
 * an upstream answer's Content-Type may be relayed. No socket, no loop:
 * http.c asks, call/rawcall.c carries the call.
 *
 * Paths: a raw capability with `path: /files` serves POST /v1/files and
 * every sub-path below it (/v1/files/{id}, /v1/files/{id}/content), with
 * the methods its `methods:` lists; the sub-path and the query are
 * appended to the upstream path as the client sent them, once
 * raw_call_suffix_problem (call/rawcall.h) finds nothing wrong with them.
 */
#ifndef POLYGW_HTTP_RAW_H
#define POLYGW_HTTP_RAW_H

#include <stdbool.h>
#include <stddef.h>

struct config;
struct config_capability;

/* True when capability `cap` is raw and p[0..n) is a sub-path of its path
 * (its path, then '/'). */
bool httpraw_sub_path(const struct config_capability *cap, const char *p, size_t n);

/* A Responses API follow-up: capability `cap` takes JSON at a path ending
 * in /responses, and p[0..n) (a request path after /v1, without its
 * query) is that path, '/', a response id (respids.h's characters), then
 * nothing (GET, DELETE: the response), /cancel (POST) or /input_items
 * (GET). Returns 1 (the response itself) or 2 (its /cancel or
 * /input_items) with the id at p[*id_off ..] (*id_len bytes), 0 when p is
 * not below the capability's path at all, -1 when it is but names no
 * follow-up (404), -2 when the method is not that follow-up's (405).
 * Bounded by n: p need not be NUL-terminated. */
int httpraw_followup(const struct config_capability *cap, const char *p, size_t n, int method,
                     size_t *id_off, size_t *id_len);

/* True when query string q[0..n) (after its '?'; NULL with n 0: none) has
 * the parameter `stream=true`, as the OpenAI SDKs send it to resume a
 * background response's stream (GET of the response: docs/HTTP.md §4a).
 * Any other value, or none, is a plain retrieve. */
bool httpraw_stream_query(const char *q, size_t n);

/* The largest request body any request may announce before its route is
 * known: http.max_body_bytes, or a raw capability's larger bound. */
size_t httpraw_max_body(const struct config *cfg);

/* The CONFIG_METHOD_* bit and name of http_parser method `m`, or 0 and
 * NULL for one no capability takes. */
unsigned httpraw_method_bit(int m, const char **name);

/* An upstream Content-Type as it may be relayed: `ct` when it is printable
 * ASCII and not empty, else "application/octet-stream". */
const char *httpraw_ctype(const char *ct);

#endif /* POLYGW_HTTP_RAW_H */
