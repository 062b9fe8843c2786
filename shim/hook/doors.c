/* The doors: every hooked driver entry point is exported here under its exact name, plus dlsym
 * and the cuGetProcAddress lookups, which hand out these doors instead of the driver's
 * functions.  Each door is one line: the work is in the handlers. */
#define _GNU_SOURCE
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <string.h>
#include "base/config.h"
#include "copy/handlers.h"
#include "base/real.h"
#include "base/shim.h"
#include "stats/stats.h"

/* Whether the shim may act on a call at all: its mode, a fork child (which must never reach
 * the driver through the shim, rule 8), and its own work (its calls are not the program's). */
static inline int door_engaged(void)
{
    return shim_cfg.mode != MODE_OFF && !shim_busy && !shim_forked_child;
}

/* A door resolves the driver on first use (a program linked against libcuda calls doors without
 * any lookup first), counts the call, and brackets the handler with the shim's guard: nothing
 * below takes or leaves the guard by hand.  When the shim may not act, the driver's own function
 * runs, untouched. */
#define HOOK(sym, base, ver, flav, handler, params, args)                              \
    typedef CUresult (*door_fn_##sym) params;                                           \
    SHIM_EXPORT CUresult door_##sym params __asm__(#sym);                               \
    CUresult door_##sym params                                                          \
    {                                                                                   \
        if (SHIM_UNLIKELY(!real_hook[HOOK_##sym]) && !real_driver_resolve(NULL))        \
            return CUDA_ERROR_NOT_INITIALIZED;                                          \
        if (SHIM_UNLIKELY(!real_hook[HOOK_##sym]))                                      \
            return CUDA_ERROR_NOT_FOUND;                                                \
        stats_count_entry(HOOK_##sym);                                                  \
        if (!door_engaged())                                                            \
            return ((door_fn_##sym)real_hook[HOOK_##sym]) args;                         \
        shim_enter();                                                                   \
        CUresult r_ = handler(HOOK_##sym, HOOK_UNPACK args);                            \
        shim_leave();                                                                   \
        return r_;                                                                      \
    }
#include "base/hooks.def"
#undef HOOK

void *const hook_doors[HOOK_COUNT] = {
#define HOOK(sym, base, ver, flav, handler, params, args) [HOOK_##sym] = (void *)door_##sym,
#include "base/hooks.def"
#undef HOOK
};

/* Which door stands for the driver function `fn` the driver handed out for `symbol`. */
static void *door_for(const char *symbol, void *fn, int version, cuuint64_t flags)
{
    for (int i = 0; i < HOOK_COUNT; i++)
        if (real_hook[i] == fn)
            return hook_doors[i];
    /* The driver answered with a function it does not export under that name: choose the door
     * by name, version and flags, as the driver chose its function. */
    int id = hook_select_variant(symbol, version,
                                 (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0);
    if (id >= 0 && real_hook[id])
        return hook_doors[id];
    stats_add(STAT_UNTRACKED_LOOKUPS, 1);
    return fn;
}

CUresult on_get_proc_address(enum hook_id id, const char *symbol, void **pfn, int version,
                             cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    CUresult r = ((PFN_cuGetProcAddress_v12000)real_hook[id])(symbol, pfn, version, flags, status);
    if (r == CUDA_SUCCESS && pfn && *pfn && symbol)
        *pfn = door_for(symbol, *pfn, version, flags);
    stats_prepare_sites();
    return r;
}

CUresult on_get_proc_address_v1(enum hook_id id, const char *symbol, void **pfn, int version,
                                cuuint64_t flags)
{
    CUresult r = ((PFN_cuGetProcAddress_v11030)real_hook[id])(symbol, pfn, version, flags);
    if (r == CUDA_SUCCESS && pfn && *pfn && symbol)
        *pfn = door_for(symbol, *pfn, version, flags);
    stats_prepare_sites();
    return r;
}

/* dlsym: programs (and the CUDA runtime) find the driver's entry points this way.  Exported
 * unversioned, which also answers references to dlsym@GLIBC_2.2.5 and dlsym@GLIBC_2.34. */
SHIM_EXPORT void *dlsym(void *handle, const char *name)
{
    real_libc_resolve();
    if (SHIM_UNLIKELY(!libc.dlsym))
        return NULL;
    void *fn = libc.dlsym(handle, name);
    if (!fn || name[0] != 'c' || name[1] != 'u' || !door_engaged())
        return fn;
    int id = hook_find_symbol(name);
    if (id < 0)
        return fn;
    if (fn == hook_doors[id])
        return fn;
    real_driver_resolve(handle);
    stats_prepare_sites();   /* the program is starting CUDA: the first walk's cost goes here */
    if (real_hook[id] == fn)
        return hook_doors[id];
    stats_add(STAT_UNTRACKED_LOOKUPS, 1);
    return fn;
}
