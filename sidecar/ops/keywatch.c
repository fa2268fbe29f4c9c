/* keywatch.c — see keywatch.h. */
#include "keywatch.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#include "core/log.h"
#include "reload.h"

#define KEYWATCH_DEBOUNCE_S 0.1
#define KEYWATCH_MASK \
    (IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_ATTRIB)

/* One watched directory and the key file names in it. */
struct kw_dir {
    int wd;
    char *path;   /* owned */
    char **names; /* owned base names */
    size_t n_names;
};

struct keywatch {
    struct server *srv;
    int fd;
    ev_io io_w;
    ev_timer debounce_w;
    struct kw_dir *dirs;
    size_t n_dirs;
};

static void dirs_clear(struct keywatch *kw)
{
    for (size_t i = 0; i < kw->n_dirs; i++) {
        inotify_rm_watch(kw->fd, kw->dirs[i].wd);
        for (size_t j = 0; j < kw->dirs[i].n_names; j++)
            free(kw->dirs[i].names[j]);
        free(kw->dirs[i].names);
        free(kw->dirs[i].path);
    }
    free(kw->dirs);
    kw->dirs = NULL;
    kw->n_dirs = 0;
}

/* Adds `file` (absolute) to the watch; 0, or -1 on failure (logged). */
static int watch_file(struct keywatch *kw, const char *file)
{
    const char *slash = strrchr(file, '/');
    size_t dlen = slash && slash != file ? (size_t)(slash - file) : 1;
    const char *base = slash ? slash + 1 : file;
    struct kw_dir *d = NULL;

    for (size_t i = 0; i < kw->n_dirs && !d; i++)
        if (strlen(kw->dirs[i].path) == dlen && memcmp(kw->dirs[i].path, file, dlen) == 0)
            d = &kw->dirs[i];
    if (!d) {
        struct kw_dir *nd = realloc(kw->dirs, (kw->n_dirs + 1) * sizeof(*nd));
        if (!nd)
            return -1;
        kw->dirs = nd;
        d = &kw->dirs[kw->n_dirs];
        *d = (struct kw_dir){ .wd = -1, .path = strndup(file, dlen) };
        if (!d->path)
            return -1;
        kw->n_dirs++;
        d->wd = inotify_add_watch(kw->fd, d->path, KEYWATCH_MASK);
        if (d->wd < 0) {
            log_at(LOG_WARN,
                   "cannot watch a key file's directory; the key is re-read on SIGHUP "
                   "only",
                   "dir", LOG_S, d->path, "error", LOG_S, strerror(errno), NULL);
            return -1;
        }
    }
    for (size_t j = 0; j < d->n_names; j++)
        if (strcmp(d->names[j], base) == 0)
            return 0;
    char **nn = realloc(d->names, (d->n_names + 1) * sizeof(*nn));
    if (!nn)
        return -1;
    d->names = nn;
    if (!(d->names[d->n_names] = strdup(base)))
        return -1;
    d->n_names++;
    return 0;
}

/* Re-reads the list of key files from srv->cfg: at start and after each
 * reload (reload_on_done; safe inside the watch's own callbacks, whose
 * reload calls it). */
static void keywatch_refresh(void *ud)
{
    struct keywatch *kw = ud;

    dirs_clear(kw);
    const struct config *cfg = kw->srv->cfg;
    for (size_t i = 0; i < cfg->n_sources; i++) {
        const struct config_source *src = &cfg->sources[i];
        if (src->retired)
            continue;
        if (src->api_key_file)
            watch_file(kw, src->api_key_file);
        for (size_t j = 0; j < src->n_headers; j++) /* header secrets rotate the same way */
            if (src->headers[j].value_file)
                watch_file(kw, src->headers[j].value_file);
    }
    for (size_t i = 0; i < cfg->n_apps; i++) /* and the apps' bearer tokens */
        if (cfg->apps[i].token_file)
            watch_file(kw, cfg->apps[i].token_file);
    if (kw->n_dirs)
        log_at(LOG_DEBUG, "watching key files", "dirs", LOG_U, (unsigned long long)kw->n_dirs,
               NULL);
}

static bool event_is_ours(const struct keywatch *kw, const struct inotify_event *ev)
{
    if (!ev->len)
        return false;
    for (size_t i = 0; i < kw->n_dirs; i++) {
        if (kw->dirs[i].wd != ev->wd)
            continue;
        if (strcmp(ev->name, "..data") == 0) /* a Kubernetes volume's atomic swap */
            return true;
        for (size_t j = 0; j < kw->dirs[i].n_names; j++)
            if (strcmp(kw->dirs[i].names[j], ev->name) == 0)
                return true;
    }
    return false;
}

static void on_inotify(struct ev_loop *loop, ev_io *w, int revents)
{
    struct keywatch *kw = w->data;
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    bool hit = false;
    (void)revents;

    for (int rounds = 0; rounds < 64; rounds++) {
        ssize_t n = read(kw->fd, buf, sizeof(buf));
        if (n <= 0)
            break;
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)p;
            if (ev->mask & IN_Q_OVERFLOW)
                hit = true; /* events were lost: assume ours were among them */
            else if (event_is_ours(kw, ev))
                hit = true;
            p += sizeof(*ev) + ev->len;
        }
    }
    if (hit) {
        ev_timer_stop(loop, &kw->debounce_w);
        ev_timer_set(&kw->debounce_w, KEYWATCH_DEBOUNCE_S, 0.);
        ev_timer_start(loop, &kw->debounce_w);
    }
}

static void on_debounce(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct keywatch *kw = w->data;
    char err[CONFIG_ERR_MAX];
    (void)loop;
    (void)revents;

    log_at(LOG_INFO, "a key file changed; reloading", NULL);
    reload_run(kw->srv, "key file", NULL, NULL, NULL, err, sizeof(err)); /* logs the outcome */
}

struct keywatch *keywatch_new(struct server *srv)
{
    struct keywatch *kw = calloc(1, sizeof(*kw));

    if (!kw)
        return NULL;
    kw->srv = srv;
    kw->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (kw->fd < 0) {
        log_at(LOG_WARN, "inotify unavailable; key files are re-read on SIGHUP only", "error",
               LOG_S, strerror(errno), NULL);
        free(kw);
        return NULL;
    }
    ev_io_init(&kw->io_w, on_inotify, kw->fd, EV_READ);
    ev_init(&kw->debounce_w, on_debounce);
    kw->io_w.data = kw->debounce_w.data = kw;
    ev_io_start(srv->loop, &kw->io_w);
    keywatch_refresh(kw);
    reload_on_done(srv, keywatch_refresh, kw);
    return kw;
}

void keywatch_free(struct keywatch *kw)
{
    if (!kw)
        return;
    reload_on_done(kw->srv, NULL, NULL);
    ev_io_stop(kw->srv->loop, &kw->io_w);
    ev_timer_stop(kw->srv->loop, &kw->debounce_w);
    dirs_clear(kw);
    close(kw->fd);
    free(kw);
}
