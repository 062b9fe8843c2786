/* The node-wide budget: one ceiling on registered bytes shared by every process of this user
 * that runs the shim with the same PINSHIM_NODE_BUDGET. */
#ifndef PINSHIM_NODEBUDGET_H
#define PINSHIM_NODEBUDGET_H

#include <stddef.h>
#include <stdint.h>

/* Take bytes of the node budget for this process; 1 on success (always, when there is no node
 * budget), 0 when the node is full.  A process never evicts another's registrations. */
int nodebudget_reserve(size_t bytes);
void nodebudget_release(size_t bytes);
/* For the report: the node budget, bytes held by all processes, and by this one. */
void nodebudget_usage(uint64_t *budget, uint64_t *node_used, uint64_t *mine);

#endif
