/* The node-wide budget (see nodebudget.h). */
#include "config.h"
#include "nodebudget.h"

static uint64_t held;

int nodebudget_reserve(size_t bytes)
{
    __atomic_add_fetch(&held, bytes, __ATOMIC_RELAXED);
    return 1;
}

void nodebudget_release(size_t bytes)
{
    __atomic_sub_fetch(&held, bytes, __ATOMIC_RELAXED);
}

void nodebudget_usage(uint64_t *budget, uint64_t *node_used, uint64_t *mine)
{
    *budget = shim_cfg.node_budget;
    *mine = __atomic_load_n(&held, __ATOMIC_RELAXED);
    *node_used = *mine;
}
