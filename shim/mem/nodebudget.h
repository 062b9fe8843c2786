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
/* Attach to the node's segment now, where the budget is set.  Start-up calls it on the
 * program's thread: the registrar thread's reservations never open a descriptor (a program may
 * be reusing descriptor numbers it did not open), so they are refused until attached. */
void nodebudget_attach(void);
/* For the report: the node budget, bytes held by all processes, and by this one. */
void nodebudget_usage(uint64_t *budget, uint64_t *node_used, uint64_t *mine);

/* Clear this process's slot (its bytes go back to the node) and refuse further reservations.
 * Runs by itself at exit, after the shim's own destructor; safe to call again. */
void nodebudget_shutdown(void);

/* ---- for tests ---- */

/* The shared-memory name in use ("/pinshim-<uid>-<budget>"), "" before the first use. */
const char *nodebudget_segment_name(void);

struct nodebudget_audit {
    uint64_t budget;      /* shim_cfg.node_budget */
    uint64_t used;        /* the segment's running total */
    uint64_t slot_sum;    /* the slots' bytes added up, under the segment's lock */
    uint64_t slots_used;
    uint64_t mine;
};
/* Read the segment under its lock (attaching if needed): 0, 1 when the node budget fell back
 * to a per-process ceiling (only budget is filled), -1 when there is no node budget. */
int nodebudget_audit(struct nodebudget_audit *a);
#ifdef PINSHIM_TEST_SEAMS
/* Put a slot for another process into the segment, as a dead or reused pid would leave it. */
int nodebudget_test_plant(int32_t pid, uint64_t start, uint64_t bytes);
/* Take the segment's lock, spoil the node total, and die by SIGKILL holding the lock: what a
 * process killed halfway through an update leaves behind. */
void nodebudget_test_die_locked(void);
#endif

#endif
