/* harness.c — an in-process sidecar over the fake backend (see harness.h). */
#include "harness.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/log.h"

#define HARNESS_TICK_S    0.002
#define HARNESS_MAX_TURNS 200000

static const char base_yaml[] =
    "listen: {socket: %s/s.sock, mode: \"0600\"}\n"
    "server: {log_level: error}\n"
    "defaults: {max_attempts: 1, stall_window_s: 60, poll_interval_s: 0.05}\n"
    "sources:\n"
    "  - name: refusing\n"
    "    capability: chat\n"
    "    base_url: http://127.0.0.1:9/v1\n"
    "    max_concurrency: 8\n"
    "%s";

static struct backend *harness_backend_new(struct server *srv, const struct backend_hooks *hooks,
                                           char *err, size_t errlen)
{
    struct fake_backend *fb = fake_backend_new(srv->loop, hooks);

    if (!fb) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    return &fb->be;
}

void harness_start(struct harness *h, const char *extra_yaml)
{
    char yaml[4096], err[512];

    memset(h, 0, sizeof(*h));
    snprintf(h->dir, sizeof(h->dir), "/tmp/pgw-unit-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(h->dir));
    snprintf(yaml, sizeof(yaml), base_yaml, h->dir, extra_yaml ? extra_yaml : "");
    h->cfg = config_parse(yaml, strlen(yaml), "harness.yaml", err, sizeof(err));
    ck_assert_msg(h->cfg != NULL, "config: %s", err);
    log_threshold = LOG_ERROR + 1; /* quiet: the tests assert on replies */
    h->loop = ev_loop_new(EVFLAG_AUTO);
    ck_assert_ptr_nonnull(h->loop);
    ck_assert_msg(
        server_init_with(&h->srv, h->loop, h->cfg, harness_backend_new, err, sizeof(err)) == 0,
        "server_init: %s", err);
    h->fb = (struct fake_backend *)h->srv.backend;
    server_start(&h->srv);
}

void harness_stop(struct harness *h)
{
    char path[128];

    for (size_t i = 0; i < h->n_clients; i++) {
        close(h->fds[i]);
        msgpack_unpacker_destroy(&h->up[i]);
    }
    harness_run(h, 0.01); /* the server sees the clients go */
    server_fini(&h->srv);
    ev_loop_destroy(h->loop);
    config_free(h->cfg);
    snprintf(path, sizeof(path), "%s/s.sock", h->dir);
    unlink(path);
    rmdir(h->dir);
}

int harness_connect(struct harness *h)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    ck_assert_uint_lt(h->n_clients, HARNESS_CLIENTS);
    ck_assert_int_ge(fd, 0);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/s.sock", h->dir);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    ck_assert(msgpack_unpacker_init(&h->up[h->n_clients], 65536));
    h->fds[h->n_clients] = fd;
    harness_run(h, 0.005); /* accepted */
    return (int)h->n_clients++;
}

static void on_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)w;
    (void)revents;
}

/* One loop iteration, at most HARNESS_TICK_S long. */
static void turn(struct harness *h)
{
    ev_timer tick;

    ev_timer_init(&tick, on_tick, HARNESS_TICK_S, 0.);
    ev_timer_start(h->loop, &tick);
    ev_run(h->loop, EVRUN_ONCE);
    ev_timer_stop(h->loop, &tick);
}

void harness_run(struct harness *h, double seconds)
{
    double end = ev_time() + seconds;
    int turns = 0;

    do
        turn(h);
    while (ev_time() < end && ++turns < HARNESS_MAX_TURNS);
}

/* A frame being packed for one client. */
struct frame_out {
    msgpack_sbuffer sb;
    msgpack_packer pk;
};

static msgpack_packer *frame_begin(struct frame_out *f)
{
    msgpack_sbuffer_init(&f->sb);
    msgpack_packer_init(&f->pk, &f->sb, msgpack_sbuffer_write);
    return &f->pk;
}

static void frame_send(struct harness *h, int cl, struct frame_out *f)
{
    ck_assert_int_eq(write(h->fds[cl], f->sb.data, f->sb.size), (ssize_t)f->sb.size);
    msgpack_sbuffer_destroy(&f->sb);
}

static void pack_s(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* [0, msgid, method, [{...`n` pairs follow]}] */
static void begin_request(msgpack_packer *pk, uint32_t msgid, const char *method, size_t n)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint8(pk, 0);
    msgpack_pack_uint32(pk, msgid);
    pack_s(pk, method);
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, n);
}

void harness_task(struct harness *h, int cl, uint32_t msgid, const char *method, const char *id,
                  const char *reason)
{
    struct frame_out f;
    msgpack_packer *pk = frame_begin(&f);

    begin_request(pk, msgid, method, reason ? 2 : 1);
    pack_s(pk, "task_id");
    pack_s(pk, id);
    if (reason) {
        pack_s(pk, "reason");
        pack_s(pk, reason);
    }
    frame_send(h, cl, &f);
}

void harness_finish(struct harness *h, int cl, uint32_t msgid, const char *id, bool ok)
{
    struct frame_out f;
    msgpack_packer *pk = frame_begin(&f);

    begin_request(pk, msgid, "task.finish", 2);
    pack_s(pk, "task_id");
    pack_s(pk, id);
    pack_s(pk, "ok");
    if (ok)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
    frame_send(h, cl, &f);
}

void harness_node_begin(struct harness *h, int cl, uint32_t msgid, const char *id, const char *node,
                        double timeout_s)
{
    struct frame_out f;
    msgpack_packer *pk = frame_begin(&f);

    begin_request(pk, msgid, "task.node_begin", 3);
    pack_s(pk, "task_id");
    pack_s(pk, id);
    pack_s(pk, "node");
    pack_s(pk, node);
    pack_s(pk, "timeout_s");
    msgpack_pack_double(pk, timeout_s);
    frame_send(h, cl, &f);
}

void harness_call(struct harness *h, int cl, uint32_t msgid, const char *task_id)
{
    struct frame_out f;
    msgpack_packer *pk = frame_begin(&f);

    begin_request(pk, msgid, "call", task_id ? 3 : 2);
    pack_s(pk, "capability");
    pack_s(pk, "chat");
    pack_s(pk, "body");
    msgpack_pack_map(pk, 1);
    pack_s(pk, "messages");
    msgpack_pack_array(pk, 0);
    if (task_id) {
        pack_s(pk, "task_id");
        pack_s(pk, task_id);
    }
    frame_send(h, cl, &f);
}

void harness_cancel(struct harness *h, int cl, uint32_t msgid)
{
    struct frame_out f;
    msgpack_packer *pk = frame_begin(&f);

    msgpack_pack_array(pk, 3);
    msgpack_pack_uint8(pk, 2);
    pack_s(pk, "cancel");
    msgpack_pack_array(pk, 1);
    msgpack_pack_uint32(pk, msgid);
    frame_send(h, cl, &f);
}

static void copy_field(const msgpack_object *map, const char *key, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (!map || map->type != MSGPACK_OBJECT_MAP)
        return;
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object *k = &map->via.map.ptr[i].key, *v = &map->via.map.ptr[i].val;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(key) &&
            memcmp(k->via.str.ptr, key, k->via.str.size) == 0 && v->type == MSGPACK_OBJECT_STR) {
            size_t n = v->via.str.size < cap - 1 ? v->via.str.size : cap - 1;
            memcpy(buf, v->via.str.ptr, n);
            buf[n] = '\0';
        }
    }
}

static void decode(const msgpack_object *o, struct reply *r)
{
    memset(r, 0, sizeof(*r));
    ck_assert(o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size >= 3);
    const msgpack_object *a = o->via.array.ptr;
    r->type = (int)a[0].via.u64;
    if (r->type == 1) {
        ck_assert_uint_eq(o->via.array.size, 4);
        r->msgid = (uint32_t)a[1].via.u64;
        const msgpack_object *res = a[2].type == MSGPACK_OBJECT_NIL ? &a[3] : &a[2];
        copy_field(&a[2], "code", r->code, sizeof(r->code));
        copy_field(&a[2], "message", r->message, sizeof(r->message));
        copy_field(res, "state", r->state, sizeof(r->state));
        copy_field(res, "reason", r->reason, sizeof(r->reason));
        copy_field(res, "reason_kind", r->reason_kind, sizeof(r->reason_kind));
    } else {
        /* chunk: [msgid, event]; error: [{code, message}] */
        const msgpack_object *p = &a[2];
        if (p->type == MSGPACK_OBJECT_ARRAY && p->via.array.size > 0) {
            if (p->via.array.ptr[0].type == MSGPACK_OBJECT_POSITIVE_INTEGER)
                r->msgid = (uint32_t)p->via.array.ptr[0].via.u64;
            else
                copy_field(&p->via.array.ptr[0], "code", r->code, sizeof(r->code));
        }
    }
}

bool harness_recv(struct harness *h, int cl, struct reply *r, double timeout_s)
{
    double end = ev_time() + timeout_s;
    msgpack_unpacked m;

    msgpack_unpacked_init(&m);
    for (int turns = 0; turns < HARNESS_MAX_TURNS; turns++) {
        if (msgpack_unpacker_next(&h->up[cl], &m) == MSGPACK_UNPACK_SUCCESS) {
            decode(&m.data, r);
            msgpack_unpacked_destroy(&m);
            return true;
        }
        ck_assert(msgpack_unpacker_reserve_buffer(&h->up[cl], 65536));
        ssize_t n = read(h->fds[cl], msgpack_unpacker_buffer(&h->up[cl]), 65536);
        if (n > 0) {
            msgpack_unpacker_buffer_consumed(&h->up[cl], (size_t)n);
            continue;
        }
        ck_assert_msg(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK),
                      "client %d: connection closed by the sidecar", cl);
        if (ev_time() >= end)
            break;
        turn(h);
    }
    msgpack_unpacked_destroy(&m);
    return false;
}

bool harness_wait_ops(struct harness *h, enum fake_kind kind, int op, size_t n, double timeout_s)
{
    double end = ev_time() + timeout_s;

    for (int turns = 0; turns < HARNESS_MAX_TURNS; turns++) {
        if (fake_count(h->fb, kind, op, false) >= n)
            return true;
        if (ev_time() >= end)
            break;
        turn(h);
    }
    return false;
}
