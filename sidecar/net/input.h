/*
 * input.h — one budget for unfinished input across both front ends.
 *
 * Partial msgpack frames and HTTP requests not yet read in full count in
 * srv->input_bytes. Past listen.max_buffered_input_bytes, the connection
 * holding the most, of whichever front, is refused (msgpack: the
 * `overloaded` notification; HTTP: 503) until the total fits; each refusal
 * drops its share at once. The fronts are registered by the process owner
 * (srv->input_fronts), so neither front calls the other.
 */
#ifndef POLYGW_INPUT_H
#define POLYGW_INPUT_H

#include "core/server.h"

void net_enforce_input(struct server *srv);

#endif /* POLYGW_INPUT_H */
