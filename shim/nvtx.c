/* NVTX ranges (see nvtx.h), off when PINSHIM_NVTX=0. */
#include <nvToolsExt.h>
#include "config.h"
#include "nvtx.h"

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
