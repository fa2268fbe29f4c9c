/*
 * keywatch.h — reloads the configuration when a source's api_key_file
 * (or a header's value_file, or an app's token_file) changes, without a
 * signal (docs/OPERATIONS.md §4).
 *
 * The directory of each key file is watched with inotify, not the file:
 * a file replaced by rename (an editor, `install`, a secrets agent) or by a
 * Kubernetes Secret volume (which swaps a `..data` symlink to a new
 * directory, the file itself being a symlink through it) keeps no inode to
 * watch. An event naming a key file's base name, or `..data`, arms a short
 * debounce timer (several events of one update make one reload); when it
 * fires the whole configuration is reloaded (reload.h), which re-reads
 * every key. A reload that fails leaves the running keys in place and is
 * logged; the next change (or SIGHUP) tries again. After every successful
 * reload, whatever its cause, the watch follows the new configuration's key
 * files (it registers itself with reload_on_done).
 */
#ifndef POLYGW_KEYWATCH_H
#define POLYGW_KEYWATCH_H

#include "core/server.h"

/* Creates the watch for srv->cfg's key files (none is fine: it watches
 * nothing until a reload adds one). Returns NULL (and logs why) when
 * inotify is unavailable: key files are then re-read only on SIGHUP. */
struct keywatch *keywatch_new(struct server *srv);
void keywatch_free(struct keywatch *kw);

#endif /* POLYGW_KEYWATCH_H */
