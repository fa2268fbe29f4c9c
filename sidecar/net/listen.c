/*
 * listen.c — Unix listening sockets made safely (listen.h).
 */
#include "listen.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/log.h"

/* Creates the parent directory of `path` when it is missing (one level). */
static void make_parent_dir(const char *path)
{
    char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return;
    *slash = '\0';
    if (mkdir(dir, 0750) < 0 && errno != EEXIST)
        log_at(LOG_WARN, "cannot create socket directory", "dir", LOG_S, dir, "error", LOG_S,
               strerror(errno), NULL);
}

/* Returns 0 when `path` is free to bind (absent, or a stale socket that was
 * removed), -1 with `err` filled otherwise. */
static int claim_path(const char *path, struct sockaddr_un *sa, char *err, size_t errlen)
{
    struct stat st;

    if (lstat(path, &st) < 0) {
        if (errno == ENOENT)
            return 0;
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISSOCK(st.st_mode)) {
        snprintf(err, errlen, "%s exists and is not a socket; refusing to replace it", path);
        return -1;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    int rc = connect(fd, (struct sockaddr *)sa, sizeof(*sa));
    int saved = errno;
    close(fd);
    if (rc == 0) {
        snprintf(err, errlen, "another sidecar is already listening on %s; refusing to start",
                 path);
        return -1;
    }
    if (saved != ECONNREFUSED && saved != ENOENT) {
        snprintf(err, errlen, "%s: cannot probe existing socket: %s", path, strerror(saved));
        return -1;
    }
    if (unlink(path) < 0 && errno != ENOENT) {
        snprintf(err, errlen, "%s: cannot remove stale socket: %s", path, strerror(errno));
        return -1;
    }
    log_at(LOG_INFO, "replaced stale socket file", "socket", LOG_S, path, NULL);
    return 0;
}

int net_bind_unix(const char *path, uint32_t mode, char *err, size_t errlen)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };

    if (strlen(path) >= sizeof(sa.sun_path)) {
        snprintf(err, errlen, "socket path too long (%zu bytes, max %zu): %s", strlen(path),
                 sizeof(sa.sun_path) - 1, path);
        return -1;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    make_parent_dir(path);
    if (claim_path(path, &sa, err, errlen) < 0)
        return -1;

    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    /* The file never exists with wider permissions than configured. */
    mode_t old = umask(0777 & ~mode);
    int rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    int saved = errno;
    umask(old);
    if (rc < 0) {
        snprintf(err, errlen, "bind %s: %s", path, strerror(saved));
        close(fd);
        return -1;
    }
    if (chmod(path, mode) < 0 || listen(fd, 511) < 0) {
        snprintf(err, errlen, "listen %s: %s", path, strerror(errno));
        close(fd);
        unlink(path);
        return -1;
    }
    return fd;
}
