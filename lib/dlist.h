/*
 * dlist.h — the two operations of an intrusive, NULL-terminated doubly
 * linked list reached through a head pointer, for any struct with two
 * link fields (their names are arguments, so one struct can sit on
 * several lists: `prev`/`next`, `tprev`/`tnext`...).
 *
 *   DLIST_PUSH(head, e, prev, next)    puts e first; e must be on no list
 *   DLIST_UNLINK(head, e, prev, next)  takes e off the list headed by
 *                                      `head`, which it must be on, and
 *                                      clears e's links
 *   DLIST_UNLINK_HT(head, tail, e, prev, next)
 *                                      the same for a list that also keeps
 *                                      its last element in `tail`
 *
 * `head` is an lvalue (evaluated more than once, as is `e`): pass plain
 * names or field accesses, never expressions with side effects.
 */
#ifndef POLYGW_DLIST_H
#define POLYGW_DLIST_H

#include <stddef.h>

#define DLIST_PUSH(head, e, prev, next) \
    do {                                \
        (e)->prev = NULL;               \
        (e)->next = (head);             \
        if ((e)->next)                  \
            (e)->next->prev = (e);      \
        (head) = (e);                   \
    } while (0)

#define DLIST_UNLINK(head, e, prev, next) \
    do {                                  \
        if ((e)->prev)                    \
            (e)->prev->next = (e)->next;  \
        else                              \
            (head) = (e)->next;           \
        if ((e)->next)                    \
            (e)->next->prev = (e)->prev;  \
        (e)->prev = (e)->next = NULL;     \
    } while (0)

#define DLIST_UNLINK_HT(head, tail, e, prev, next) \
    do {                                           \
        if (!(e)->next)                            \
            (tail) = (e)->prev;                    \
        DLIST_UNLINK(head, e, prev, next);         \
    } while (0)

#endif /* POLYGW_DLIST_H */
