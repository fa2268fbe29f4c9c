/*
 * input.c — the shared input budget (input.h).
 */
#include "input.h"

void net_enforce_input(struct server *srv)
{
    size_t cap = srv->cfg->max_buffered_input_bytes;

    while (srv->input_bytes > cap) {
        const struct server_input_front *v = NULL;
        size_t most = 0;
        for (size_t i = 0; i < srv->n_input_fronts; i++) {
            const struct server_input_front *f = &srv->input_fronts[i];
            size_t n = f->most(f->ud);
            if (n > most) {
                most = n;
                v = f;
            }
        }
        if (!v)
            break;
        srv->stats.input_refusals++;
        v->refuse_most(v->ud, srv->input_bytes, cap);
    }
}
