/* null_driver: a libcuda.so.1 whose calls return at once, for bench/cpu_copy_overhead.  With the
 * driver's own work gone, what a copy costs under the shim is the shim's own work.  Its device
 * does not support host registration, so the shim's promotion is off (as on a device where it
 * cannot help): the copies take the shim's lookup, clock and statistics, and nothing else.  It
 * knows only what that benchmark and the shim call; it is not a test instrument (that is the
 * checking fake in tests/fakecuda). */
#include <cuda.h>
#include <stdlib.h>

/* cpu_copy_overhead checks for this before it measures anything: the real driver must not
 * stand in for this one (a DT_RPATH puts this directory first; the check makes sure). */
int pinshim_null_driver = 1;

CUresult cuInit(unsigned int flags) { return CUDA_SUCCESS; }

CUresult cuDriverGetVersion(int *version)
{
    *version = CUDA_VERSION;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *ctx)
{
    *ctx = (CUcontext)&cuInit;   /* any non-null handle: "a context is current" */
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *dev)
{
    *dev = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attr, CUdevice dev)
{
    *value = 0;   /* no host registration, no pageable access through the page tables, ... */
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) { return CUDA_SUCCESS; }
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { return CUDA_SUCCESS; }

CUresult cuMemHostAlloc(void **p, size_t n, unsigned int flags)
{
    *p = aligned_alloc(4096, (n + 4095) & ~(size_t)4095);
    return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemFreeHost(void *p)
{
    free(p);
    return CUDA_SUCCESS;
}

CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned int flags) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuMemHostUnregister(void *p) { return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED; }
