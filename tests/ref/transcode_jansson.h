/*
 * transcode_jansson.h — JSON -> msgpack through jansson's tree: the
 * reference the daemon's one-pass transcode_json_to_msgpack() is tested,
 * fuzzed and benchmarked against. Test code: the daemon does not link it
 * (nor jansson).
 */
#ifndef POLYGW_TRANSCODE_JANSSON_H
#define POLYGW_TRANSCODE_JANSSON_H

#include "codec/transcode.h"

/* Parses a tree, walks it into `pk`, with the options and error messages
 * of transcode_json_to_msgpack() (the same return codes). `pk` may have
 * received part of the value after a failure. */
int transcode_json_to_msgpack_jansson(const char *json, size_t len, msgpack_packer *pk,
                                      const struct transcode_j2m *opt, char *err, size_t errlen);

#endif /* POLYGW_TRANSCODE_JANSSON_H */
