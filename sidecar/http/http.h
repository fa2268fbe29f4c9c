/*
 * http.h — the HTTP/1.1 front end (docs/HTTP.md): an OpenAI-compatible
 * door to the same governed call path as msgpack-RPC, on the same loop.
 *
 * It owns its listeners (http.socket, a Unix socket created like
 * listen.socket; http.listen, TCP) and its connections. Each connection
 * has one input buffer, one output buffer that replies are written
 * straight into, an http_parser (Node's, from Debian's libhttp-parser),
 * one phase timer and a call sink (call.h). Requests on a connection are
 * served one at a time in arrival order, so pipelining is safe; the parser
 * is paused at the end of each request until its answer is queued.
 *
 * Every function takes NULL (no HTTP configured) and then does nothing.
 */
#ifndef POLYGW_HTTP_H
#define POLYGW_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct server;
struct http_server;


/* Creates the front end and binds its listeners, when the config names
 * any. Returns NULL with `err` empty when none is configured, NULL with
 * `err` filled on failure, or the front end (owned; http_free). Nothing
 * is accepted before http_start. */
struct http_server *http_new(struct server *srv, char *err, size_t errlen);

/* Starts accepting. */
void http_start(struct http_server *hs);

/* DRAINING: closes the listeners (removing the socket file); requests on
 * open connections are answered shutting_down. */
void http_stop_listening(struct http_server *hs);

/* STOPPING: answers every call in flight shutting_down and closes each
 * connection once its output is written. */
void http_stop(struct http_server *hs);

/* Closes every connection now (the stop flush bound expired). */
void http_close_all(struct http_server *hs);

bool http_has_conns(const struct http_server *hs);

/* Unfinished input (request bodies being read, requests not parsed yet)
 * counts in the server's srv->input_bytes, as msgpack's partial frames do
 * (net/input.h). The most one connection holds (0: none), and the
 * refusal of that connection: 503 overloaded, its input dropped from the
 * total at once, and the connection closed. `total` and `cap` are for the
 * message. */
size_t http_input_most(const struct http_server *hs);
void http_refuse_input_most(struct http_server *hs, size_t total, size_t cap);

const struct http_stats *http_get_stats(const struct http_server *hs);

/* Closes everything and frees the front end. */
void http_free(struct http_server *hs);

#endif /* POLYGW_HTTP_H */
