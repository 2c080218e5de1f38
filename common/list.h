/* Intrusive circular doubly-linked lists (O(1) unlink from any list a node is on). */
#ifndef DDP_COMMON_LIST_H
#define DDP_COMMON_LIST_H

#include <stdbool.h>
#include <stddef.h>

struct ddp_list {
    struct ddp_list *prev, *next;
};

#define DDP_CONTAINER_OF(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

static inline void ddp_list_init(struct ddp_list *h)
{
    h->prev = h->next = h;
}
static inline bool ddp_list_empty(const struct ddp_list *h)
{
    return h->next == h;
}
static inline void ddp_list_add_tail(struct ddp_list *h, struct ddp_list *n)
{
    n->prev = h->prev;
    n->next = h;
    h->prev->next = n;
    h->prev = n;
}
/* Unlinks n and leaves it self-linked, so a second unlink is harmless. */
static inline void ddp_list_del(struct ddp_list *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = n;
}

/* Iterates safely against removal of the current node. */
#define DDP_LIST_FOREACH_SAFE(pos, tmp, head)                                                      \
    for ((pos) = (head)->next, (tmp) = (pos)->next; (pos) != (head);                               \
         (pos) = (tmp), (tmp) = (pos)->next)

#endif
