/* fakecuda.h: test API of the checking fake CUDA driver (build/fakecuda/libcuda.so.1).
 * Tests link against the fake and call these to look inside the model; none of them needs
 * cuInit, and all are thread-safe. */
#ifndef FAKECUDA_H
#define FAKECUDA_H
#include <stddef.h>
#include <cuda.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 if any byte of [p, p+n) lies in a cuMemHostRegister registration (not host-alloc memory). */
int fakecuda_registered(const void *p, size_t n);
/* Which cuMemHostRegister registration holds byte p: a number given to each registration as it
 * is made, never reused (a range unregistered and registered again gets a new one); 0 when none. */
unsigned long long fakecuda_registration_id(const void *p);
/* Bytes registered with cuMemHostRegister right now, and the peak since start or last reset. */
size_t fakecuda_registered_bytes(void);
size_t fakecuda_registered_bytes_peak(void);
void fakecuda_reset_registered_peak(void);
/* Peak registered bytes over all processes sharing the FAKECUDA_SHM segment (this process's
 * own peak when FAKECUDA_SHM is unset). */
size_t fakecuda_node_registered_peak(void);

/* "Kernel": after delay_us, memset n bytes at dst to value, ordered like any work on stream s
 * (NULL = legacy stream, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD or a stream handle).
 * The _ptsz form treats NULL as the calling thread's per-thread default stream. */
CUresult fakecuda_launch_write(CUstream s, CUdeviceptr dst, int value, size_t n, unsigned delay_us);
CUresult fakecuda_launch_write_ptsz(CUstream s, CUdeviceptr dst, int value, size_t n, unsigned delay_us);

/* malloc, free and mmap called from inside the driver's code, as the driver does for its own
 * data (the mapping is anonymous and read-write; NULL on failure; release it with munmap). */
void *fakecuda_driver_malloc(size_t n);
void fakecuda_driver_free(void *p);
void *fakecuda_driver_mmap(size_t n);

/* Make every cuMemHostRegister take us microseconds before it acts (0: at once, the default;
 * FAKECUDA_REGISTER_DELAY_US sets it at start): a real registration takes 45-366 ms per GiB,
 * long enough for a program's stream capture to begin while a background one is under way. */
void fakecuda_set_register_delay_us(unsigned us);
/* Each async operation enqueued from now on waits this long before it runs (FAKECUDA_ASYNC_DELAY_US). */
void fakecuda_set_async_delay_us(unsigned us);

/* Make every cuMemHostUnregister raise signal sig on the calling thread midway, while it holds
 * its locks (0: never, the default): a real driver takes the C library's locks inside its calls,
 * and a program's signal handler that allocates must not run there.  fakecuda_in_unregister()
 * says, from a handler, whether it interrupted that window. */
void fakecuda_set_unregister_signal(int sig);
int fakecuda_in_unregister(void);

/* Make linear host<->device copies (cuMemcpyHtoD*, cuMemcpyDtoH*) fail, as on a device lost in
 * the middle of a pipeline: once n more of them have been accepted, each one returns err, until
 * called again with err CUDA_SUCCESS. */
void fakecuda_fail_copies_after(unsigned n, CUresult err);

/* Violations detected so far (each also printed as "fakecuda: VIOLATION: ..." on stderr). */
unsigned long fakecuda_violations(void);
/* Calls so far of the exported entry point with that exact symbol name ("cuMemcpyHtoD_v2"). */
unsigned long fakecuda_calls(const char *symbol);

/* The per-thread-default-stream entry points, which cuda.h declares only when
 * CUDA_API_PER_THREAD_DEFAULT_STREAM is defined: declared here so tests can call both kinds. */
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D *p);
CUresult cuMemcpy3D_v2_ptds(const CUDA_MEMCPY3D *p);
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t n, CUstream s);
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D *p, CUstream s);
CUresult cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D *p, CUstream s);
CUresult cuMemsetD8_v2_ptds(CUdeviceptr d, unsigned char v, size_t n);
CUresult cuMemsetD8Async_ptsz(CUdeviceptr d, unsigned char v, size_t n, CUstream s);
CUresult cuStreamSynchronize_ptsz(CUstream s);
CUresult cuStreamQuery_ptsz(CUstream s);
CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned int flags);
CUresult cuEventRecord_ptsz(CUevent e, CUstream s);
CUresult cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *ud);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g);
CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus *st);
CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s);

#ifdef __cplusplus
}
#endif
#endif
