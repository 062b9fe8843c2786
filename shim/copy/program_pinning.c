/* The program's own pinning and stream captures: the shim keeps out of their way. */
#define _GNU_SOURCE
#include <cudaTypedefs.h>
#include "copy/handlers.h"
#include "mem/registry.h"
#include "base/real.h"
#include "base/shim.h"
#include "stats/stats.h"
#include "stats/trace.h"
#include "copy/streams.h"

/* The program's own pinning calls that succeeded are counted and timed: pinning is part of what
 * its transfers cost (a framework that pins a buffer per transfer pays 45-490 ms per GiB there,
 * more than the copy), and the report shows it beside the shim's own registrations. */
static void count_pinning(enum stats_counter calls, enum stats_counter ns, uint64_t t0, const char *call,
                          const void *p, size_t n)
{
    uint64_t took = shim_ns_since(t0);
    stats_add(ns, took);
    stats_add(calls, 1);
    if (trace_on() && n)
        trace_event(took, call, "addr=%p bytes=%zu", p, n);
    else if (trace_on())
        trace_event(took, call, "addr=%p", p);
}

CUresult on_host_register(enum hook_id id, void *p, size_t n, unsigned int flags)
{
    /* The program's registration must succeed as it would without the shim (rule 5). */
    uint64_t t0 = shim_ticks();
    CUresult r = registry_program_register(p, n, flags, (PFN_cuMemHostRegister_v6050)real_hook[id]);
    if (r == CUDA_SUCCESS) {
        count_pinning(STAT_PROGRAM_REGISTERS, STAT_PROGRAM_REGISTER_NS, t0, "program_register", p, n);
        stats_add(STAT_PROGRAM_REGISTERED_BYTES, n);
    }
    return r;
}

CUresult on_host_unregister(enum hook_id id, void *p)
{
    /* Without the shim this memory may not be registered at all: the registry answers as the
     * driver would then (rules 3 and 4). */
    uint64_t t0 = shim_ticks();
    CUresult r = registry_program_unregister(p, (PFN_cuMemHostUnregister_v4000)real_hook[id]);
    if (r == CUDA_SUCCESS)
        count_pinning(STAT_PROGRAM_UNREGISTERS, STAT_PROGRAM_UNREGISTER_NS, t0, "program_unregister", p, 0);
    return r;
}

static void host_allocated(CUresult r, void **pp, size_t n, uint64_t t0)
{
    if (r != CUDA_SUCCESS || !pp || !*pp)
        return;
    count_pinning(STAT_PROGRAM_HOST_ALLOCS, STAT_PROGRAM_HOST_ALLOC_NS, t0, "program_host_alloc", *pp, n);
    stats_add(STAT_PROGRAM_HOST_ALLOC_BYTES, n);
    registry_program_allocated((uintptr_t)*pp, n);
}

CUresult on_host_alloc(enum hook_id id, void **pp, size_t n, unsigned int flags)
{
    /* The driver's own allocations inside this call are not the program's blocks: the door's
     * guard sends them to the C library. */
    uint64_t t0 = shim_ticks();
    CUresult r = ((PFN_cuMemHostAlloc_v2020)real_hook[id])(pp, n, flags);
    host_allocated(r, pp, n, t0);
    return r;
}

CUresult on_alloc_host(enum hook_id id, void **pp, size_t n)
{
    uint64_t t0 = shim_ticks();
    CUresult r = ((PFN_cuMemAllocHost_v3020)real_hook[id])(pp, n);
    host_allocated(r, pp, n, t0);
    return r;
}

CUresult on_free_host(enum hook_id id, void *p)
{
    uint64_t t0 = shim_ticks();
    CUresult r = ((PFN_cuMemFreeHost_v2000)real_hook[id])(p);
    if (r == CUDA_SUCCESS) {
        count_pinning(STAT_PROGRAM_HOST_FREES, STAT_PROGRAM_HOST_FREE_NS, t0, "program_host_free", p, 0);
        registry_program_freed((uintptr_t)p);
    }
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
