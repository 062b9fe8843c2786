/* The program's own pinning and stream captures: the shim keeps out of their way. */
#define _GNU_SOURCE
#include <cudaTypedefs.h>
#include "copy/handlers.h"
#include "mem/policy.h"
#include "base/real.h"
#include "base/shim.h"
#include "stats/stats.h"
#include "copy/streams.h"
#include "mem/table.h"

CUresult on_host_register(enum hook_id id, void *p, size_t n, unsigned int flags)
{
    int engaged = copy_engaged();
    if (engaged && p && n) {
        /* The program's registration must succeed as it would without the shim (rule 5): the
         * shim lets go of any registration of its own there first, waiting for its DMA. */
        shim_enter();
        int released = policy_release_range((uintptr_t)p, n, 0);
        if (released)
            stats_add(STAT_PROGRAM_REGISTER_YIELDS, (uint64_t)released);
        shim_leave();
    }
    shim_enter();
    CUresult r = ((PFN_cuMemHostRegister_v6050)real_hook[id])(p, n, flags);
    shim_leave();
    if (r == CUDA_SUCCESS)
        pinned_add((uintptr_t)p, n, 0);
    return r;
}

CUresult on_host_unregister(enum hook_id id, void *p)
{
    /* Without the shim this memory is not registered at all: answer as the driver would then,
     * and never let the program's call take the shim's registration away (rules 3 and 4). */
    struct block *claimed = NULL;
    if (copy_engaged() && !pinned_contains((uintptr_t)p, 1) && table_may_contain((uintptr_t)p)) {
        table_lock();
        /* The shim may be registering or unregistering it: wait for the outcome. */
        struct block *b = table_find_containing_settled((uintptr_t)p);
        if (b && b->state != BLOCK_PAGEABLE && (uintptr_t)p >= b->reg_base &&
            (uintptr_t)p < b->reg_base + b->reg_len) {
            table_unlock();
            return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
        }
        if (b) {
            /* Hold the block still until the driver has answered: a promotion starting now
             * would be undone by the program's call. */
            b->reg_changing = 1;
            claimed = b;
        }
        table_unlock();
    }
    shim_enter();
    CUresult r = ((PFN_cuMemHostUnregister_v4000)real_hook[id])(p);
    shim_leave();
    if (claimed) {
        table_lock();
        claimed->reg_changing = 0;
        table_unlock();
    }
    if (r == CUDA_SUCCESS)
        pinned_remove((uintptr_t)p);
    return r;
}

CUresult on_host_alloc(enum hook_id id, void **pp, size_t n, unsigned int flags)
{
    /* The driver's own allocations inside this call are not the program's blocks. */
    shim_enter();
    CUresult r = ((PFN_cuMemHostAlloc_v2020)real_hook[id])(pp, n, flags);
    shim_leave();
    if (r == CUDA_SUCCESS && pp && *pp)
        pinned_add((uintptr_t)*pp, n, 1);
    return r;
}

CUresult on_alloc_host(enum hook_id id, void **pp, size_t n)
{
    shim_enter();
    CUresult r = ((PFN_cuMemAllocHost_v3020)real_hook[id])(pp, n);
    shim_leave();
    if (r == CUDA_SUCCESS && pp && *pp)
        pinned_add((uintptr_t)*pp, n, 1);
    return r;
}

CUresult on_free_host(enum hook_id id, void *p)
{
    shim_enter();
    CUresult r = ((PFN_cuMemFreeHost_v2000)real_hook[id])(p);
    shim_leave();
    if (r == CUDA_SUCCESS)
        pinned_remove((uintptr_t)p);
    return r;
}

CUresult on_begin_capture(enum hook_id id, CUstream s, CUstreamCaptureMode mode)
{
    CUresult r = ((PFN_cuStreamBeginCapture_v10010)real_hook[id])(s, mode);
    if (r == CUDA_SUCCESS)
        capture_begin(s, mode);
    return r;
}

CUresult on_begin_capture_v1(enum hook_id id, CUstream s)
{
    CUresult r = ((CUresult(*)(CUstream))real_hook[id])(s);
    if (r == CUDA_SUCCESS)
        capture_begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
    return r;
}

CUresult on_begin_capture_to_graph(enum hook_id id, CUstream s, CUgraph g, const CUgraphNode *deps,
                                   const CUgraphEdgeData *edges, size_t ndeps, CUstreamCaptureMode mode)
{
    CUresult r = ((PFN_cuStreamBeginCaptureToGraph_v12030)real_hook[id])(s, g, deps, edges, ndeps, mode);
    if (r == CUDA_SUCCESS)
        capture_begin(s, mode);
    return r;
}

CUresult on_end_capture(enum hook_id id, CUstream s, CUgraph *g)
{
    CUresult r = ((PFN_cuStreamEndCapture_v10000)real_hook[id])(s, g);
    /* An invalidated capture has ended too. */
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
        capture_end(s);
    return r;
}
