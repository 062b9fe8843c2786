/* The real libc and driver functions, each resolved once. */
#ifndef PINSHIM_REAL_H
#define PINSHIM_REAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <cuda.h>
#include "base/hooks.h"

struct libc_fns {
    void *(*malloc)(size_t);
    void *(*calloc)(size_t, size_t);
    void *(*realloc)(void *, size_t);
    void (*free)(void *);
    int (*posix_memalign)(void **, size_t, size_t);
    void *(*aligned_alloc)(size_t, size_t);
    void *(*memalign)(size_t, size_t);
    void *(*valloc)(size_t);
    void *(*pvalloc)(size_t);
    size_t (*malloc_usable_size)(void *);
    void *(*mmap)(void *, size_t, int, int, int, off_t);
    int (*munmap)(void *, size_t);
    void *(*mremap)(void *, size_t, size_t, int, ...);
    int (*madvise)(void *, size_t, int);
    int (*mprotect)(void *, size_t, int);
    void *(*memcpy)(void *, const void *, size_t);
    void *(*memmove)(void *, const void *, size_t);
    void *(*memcpy_chk)(void *, const void *, size_t, size_t);
    void *(*memmove_chk)(void *, const void *, size_t, size_t);
    void *(*memset)(void *, int, size_t);
    void *(*memset_chk)(void *, int, size_t, size_t);
    void *(*dlsym)(void *, const char *);
};
extern struct libc_fns libc;

/* Resolve the libc functions (idempotent; safe from inside the first malloc). */
void real_libc_resolve(void);

/* Driver functions the shim calls for its own work (not hooked). */
#define DRIVER_HELPERS(X)                                                                   \
    X(cuCtxGetCurrent, CUresult, (CUcontext *))                                             \
    X(cuCtxPushCurrent_v2, CUresult, (CUcontext))                                           \
    X(cuCtxPopCurrent_v2, CUresult, (CUcontext *))                                          \
    X(cuCtxGetDevice, CUresult, (CUdevice *))                                               \
    X(cuDeviceGetPCIBusId, CUresult, (char *, int, CUdevice))                               \
    X(cuCtxSynchronize, CUresult, (void))                                                   \
    X(cuDeviceGetAttribute, CUresult, (int *, CUdevice_attribute, CUdevice))                \
    X(cuPointerGetAttribute, CUresult, (void *, CUpointer_attribute, CUdeviceptr))          \
    X(cuPointerGetAttributes, CUresult, (unsigned int, CUpointer_attribute *, void **, CUdeviceptr)) \
    X(cuStreamCreate, CUresult, (CUstream *, unsigned int))                                 \
    X(cuStreamDestroy_v2, CUresult, (CUstream))                                             \
    X(cuStreamSynchronize, CUresult, (CUstream))                                            \
    X(cuStreamWaitEvent, CUresult, (CUstream, CUevent, unsigned int))                       \
    X(cuStreamIsCapturing, CUresult, (CUstream, CUstreamCaptureStatus *))                   \
    X(cuStreamIsCapturing_ptsz, CUresult, (CUstream, CUstreamCaptureStatus *))              \
    X(cuStreamGetCtx, CUresult, (CUstream, CUcontext *))                                    \
    X(cuEventCreate, CUresult, (CUevent *, unsigned int))                                   \
    X(cuEventRecord, CUresult, (CUevent, CUstream))                                         \
    X(cuEventRecord_ptsz, CUresult, (CUevent, CUstream))                                    \
    X(cuEventSynchronize, CUresult, (CUevent))                                              \
    X(cuEventQuery, CUresult, (CUevent))                                                    \
    X(cuEventDestroy_v2, CUresult, (CUevent))                                               \
    X(cuMemAlloc_v2, CUresult, (CUdeviceptr *, size_t))                                     \
    X(cuMemFree_v2, CUresult, (CUdeviceptr))                                                \
    X(cuThreadExchangeStreamCaptureMode, CUresult, (CUstreamCaptureMode *))

struct driver_fns {
#define DRIVER_FIELD_(name, ret, params) ret (*name) params;
    DRIVER_HELPERS(DRIVER_FIELD_)
#undef DRIVER_FIELD_
};
extern struct driver_fns drv;

/* The shim's own driver calls (registering, unregistering, building its staging buffers) are
 * "potentially unsafe" while a program's stream capture runs in global mode: made from a thread
 * in the default mode, the driver refuses them and invalidates the program's capture, from
 * whichever thread it runs.  In relaxed mode a thread may make them and the capture is not
 * touched.  drv_relax_capture puts the calling thread in relaxed mode and returns its mode
 * before; drv_restore_capture puts that back.  The shim's own threads relax once, for life. */
CUstreamCaptureMode drv_relax_capture(void);
void drv_restore_capture(CUstreamCaptureMode before);

/* The driver's own definition of each hooked symbol (NULL where the driver lacks it). */
extern void *real_hook[HOOK_COUNT];

/* Find the driver once: from `handle` when a program hands us one (dlsym door), else from
 * the global scope or an already-loaded libcuda.so.1.  Returns 1 when the driver is known.
 * Never loads libcuda into a program that did not load it. */
int real_driver_resolve(void *handle);
int real_driver_ready(void);

/* The driver's code, [lo, hi), once the driver is known (0, 0 before).  Memory the driver
 * allocates for itself is never a transfer buffer of the program: the allocation hooks leave it
 * to the real allocator, so the driver's own data stays where it would be without the shim. */
extern uintptr_t driver_code_lo, driver_code_hi;
static inline int called_from_driver(const void *return_address)
{
    uintptr_t a = (uintptr_t)return_address;
    return a >= __atomic_load_n(&driver_code_lo, __ATOMIC_RELAXED) &&
           a < __atomic_load_n(&driver_code_hi, __ATOMIC_RELAXED);
}

#endif
