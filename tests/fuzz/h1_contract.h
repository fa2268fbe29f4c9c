/*
 * h1_contract.h — what the fuzz targets of the own HTTP/1.1 client
 * (fuzz_h1_answer.c, fuzz_h1_tls.c) share: hooks that check the contract
 * of sidecar/upstream/h1.h and keep a transcript of what a request told
 * them, so that two runs of one input can be compared.
 *
 * Checked by the hooks (each failure an abort): nothing after on_end, and
 * on_end exactly once; on_sending once, before any answer line; header
 * lines inside the parser, CRLF-terminated within H1_LINE_MAX, each set
 * opened by a status line and a new set only after an interim (1xx, not
 * 101) answer; no empty body buffer, none before a head or after a 1xx,
 * 204 or 304 one; a paused buffer offered again whole; a detail with every
 * failure; H1_OK only after a final status; H1_TLS only on a TLS origin,
 * and there exactly when the handshake did not complete (no on_sending).
 * A head line "x-refuse: ..." is refused, as the engine refuses a line it
 * cannot take.
 */
#ifndef POLYGW_FUZZ_H1_CONTRACT_H
#define POLYGW_FUZZ_H1_CONTRACT_H

#include "upstream/h1.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

struct transcript {
    char *p;
    size_t len, cap;
};

/* What one request told its hooks, and how it went. */
struct told {
    struct transcript lines; /* records: the header lines, then the body taken */
    int end;                 /* -1: never started */
    bool sent;               /* on_sending (on TLS: the handshake completed) */
    char detail[H1_DETAIL_MAX];
};

/* The client's side of one request; set told, busy, rng and the options,
 * zero the rest, and start req with &exchange_hooks and the exchange. */
struct exchange {
    struct h1_req req;
    struct told *told;
    int *busy;     /* the pool's counter: raised inside the parser */
    uint32_t *rng; /* draws the pauses */
    bool tls;      /* the origin speaks TLS: H1_TLS may end it */
    bool pauses;   /* on_body pauses (H1_PAUSE) on half the new buffers */
    bool refuse;   /* on_body refuses (H1_ABORT) the buffers it would take */
    bool ended, paused;
    unsigned status;   /* of the last status line told */
    size_t lines_left; /* lines since it (0: a status line is due) */
    char *held;        /* the buffer paused on, as offered */
    size_t held_len;
    struct transcript body; /* whole: its pieces depend on the reads */
};

extern const struct h1_hooks exchange_hooks;

void transcript_put(struct transcript *t, const void *p, size_t n);

/* The generator of write sizes, pauses and events. */
uint32_t rng_next(uint32_t *rng);

/* 1 to 16, 256, 4096 or 65536 bytes, a quarter of the time each. */
size_t rng_piece(uint32_t *rng);

/* One turn of `loop`, then the paused request resumed, from outside its
 * hooks as h1.h asks. */
void exchange_turn(struct ev_loop *loop, struct exchange *x);

/* Frees what the exchange holds (not the exchange). */
void exchange_free(struct exchange *x);

/* Two runs of one input tell the same: a complete answer line for line and
 * byte for byte, a failure as the same ending. Not more on a malformed
 * head: the lines told before the parser stops depend on where reads ended
 * (a line is told when the next one starts), and so do the detail and
 * whether the hook refused one of them first (H1_ABORTED). */
void told_compare(const struct told *a, const struct told *b);

void told_free(struct told t[2]);

/* The socket the upstream listens on, non-blocking: an abstract Unix one
 * (nothing on disk, gone with the process) named `name` and the pid; its
 * address in *addr and *len. Aborts on failure. */
int upstream_listen(const char *name, struct sockaddr_un *addr, socklen_t *len);

#endif /* POLYGW_FUZZ_H1_CONTRACT_H */
