/* NVTX ranges (see nvtx.h), off when PINSHIM_NVTX=0. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include "base/config.h"
#include "base/nvtx.h"
#include "base/real.h"

/* NVTX's loader finds its tool with dlsym, which the shim exports as a hook: ask the C library
 * directly (one path to the loader). */
static void *nvtx_dlsym(void *handle, const char *name)
{
    real_libc_resolve();
    return libc.dlsym ? libc.dlsym(handle, name) : NULL;
}
#define dlsym nvtx_dlsym
#include <nvToolsExt.h>
#undef dlsym

void nvtx_push(const char *what)
{
    if (shim_cfg.nvtx)
        nvtxRangePushA(what);
}

void nvtx_pop(void)
{
    if (shim_cfg.nvtx)
        nvtxRangePop();
}

void nvtx_mark(const char *what)
{
    if (shim_cfg.nvtx)
        nvtxMarkA(what);
}
