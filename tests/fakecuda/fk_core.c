/* fk_core.c: initialisation, devices, contexts, error strings, violation accounting, exit checks
 * and cuGetProcAddress. */
#include "fk_internal.h"
#include "fakecuda.h"
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

pthread_mutex_t fk_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t fk_cv = PTHREAD_COND_INITIALIZER;
atomic_int fk_initialized;
int fk_ndev = 1;
unsigned fk_delay_us = 50;
int fk_check_source = 1;
int fk_pageable_hpt;
int fk_no_host_register;
unsigned fk_register_delay_us;
int fk_unregister_signal;
__thread volatile sig_atomic_t fk_in_unregister;
int fk_forked_child;
static int fk_exit_status = 86;
fk_ctx fk_ctxs[FK_MAX_DEV];
atomic_ulong fk_call_counts[FKI_COUNT];
static atomic_ulong fk_nviol;
static pthread_once_t fk_once = PTHREAD_ONCE_INIT;

/* ---- small utilities ---- */
void fk_log(const char *fmt, ...)
{
    /* Format on the stack and write(2): no stdio locks or malloc inside the shim's hooks. */
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n > sizeof buf - 2) n = sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t r = write(2, buf, (size_t)n);
    (void)r;
}

void fk_fatal(const char *msg)
{
    fk_log("fakecuda: FATAL: %s", msg);
    abort();
}

void fk_violation(const char *fmt, ...)
{
    char buf[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    atomic_fetch_add(&fk_nviol, 1);
    fk_log("fakecuda: VIOLATION: %s", buf);
}

uint64_t fk_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void fk_sleep_us(unsigned us)
{
    if (!us) return;
    struct timespec ts = { us / 1000000u, (long)(us % 1000000u) * 1000 };
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
}

static long env_long(const char *name, long dflt)
{
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    long x = strtol(v, &end, 10);
    return *end ? dflt : x;
}

/* fork: the child gets no worker threads and no driver, as with the real one (calls fail). */
static void fk_atfork_prepare(void) { pthread_mutex_lock(&fk_mu); }
static void fk_atfork_parent(void) { pthread_mutex_unlock(&fk_mu); }
static void fk_atfork_child(void)
{
    fk_forked_child = 1;
    atomic_store(&fk_nviol, 0);
    pthread_mutex_unlock(&fk_mu);
}

static void fk_setup_once(void)
{
    long n = env_long("FAKECUDA_DEVICES", 1);
    if (n < 0) n = 0;
    if (n > FK_MAX_DEV) n = FK_MAX_DEV;
    fk_ndev = (int)n;
    long d = env_long("FAKECUDA_ASYNC_DELAY_US", 50);
    fk_delay_us = d < 0 ? 0 : (unsigned)d;
    fk_check_source = env_long("FAKECUDA_CHECK_SOURCE", 1) != 0;
    fk_check_races = env_long("FAKECUDA_CHECK_DEVICE_RACES", 1) != 0;
    fk_pageable_hpt = env_long("FAKECUDA_PAGEABLE_HOST_PAGE_TABLES", 0) == 1;
    fk_no_host_register = env_long("FAKECUDA_NO_HOST_REGISTER", 0) == 1;
    long rd = env_long("FAKECUDA_REGISTER_DELAY_US", 0);
    fk_register_delay_us = rd < 0 ? 0 : (unsigned)rd;
    fk_exit_status = (int)env_long("FAKECUDA_EXIT_STATUS", 86);
    for (int i = 0; i < FK_MAX_DEV; i++) fk_ctxs[i].dev = i;
    fk_memory_setup();
    pthread_atfork(fk_atfork_prepare, fk_atfork_parent, fk_atfork_child);
}

void fk_setup(void) { pthread_once(&fk_once, fk_setup_once); }

/* Exit: let queued work finish, look for registrations whose memory vanished, report, and make
 * the process fail if anything was violated. */
__attribute__((destructor)) static void fk_fini(void)
{
    if (fk_forked_child) return;
    fk_setup();
    pthread_mutex_lock(&fk_mu);
    fk_wait_all_idle();
    fk_check_all_regs_mapped();
    fk_memory_atexit();
    pthread_mutex_unlock(&fk_mu);
    unsigned long v = atomic_load(&fk_nviol);
    if (v) {
        fk_log("fakecuda: %lu violation(s)", v);
        if (fk_exit_status != 0) {
            fflush(NULL);
            _exit(fk_exit_status);
        }
    }
}

/* ---- per-thread context stack ---- */
static __thread fk_tls_t fk_tls_data = { .capmode = CU_STREAM_CAPTURE_MODE_GLOBAL };
fk_tls_t *fk_tls(void) { return &fk_tls_data; }
fk_ctx *fk_cur_ctx(void)
{
    fk_tls_t *t = &fk_tls_data;
    return t->depth ? t->stack[t->depth - 1] : NULL;
}

static int ctx_valid(CUcontext c)
{
    for (int i = 0; i < fk_ndev; i++)
        if (c == &fk_ctxs[i]) return 1;
    return 0;
}

/* ---- test API ---- */
FK_PUBLIC unsigned long fakecuda_violations(void) { return atomic_load(&fk_nviol); }

static const struct fk_sym { const char *sym, *base; int ver, pt; } fk_syms[] = {
#define FK_X(sym, base, ver, pt) { #sym, base, ver, pt },
#include "fk_exports.def"
#undef FK_X
};

FK_PUBLIC void fakecuda_set_register_delay_us(unsigned us)
{
    fk_setup();
    __atomic_store_n(&fk_register_delay_us, us, __ATOMIC_RELAXED);
}

FK_PUBLIC void fakecuda_set_async_delay_us(unsigned us)
{
    fk_setup();
    __atomic_store_n(&fk_delay_us, us, __ATOMIC_RELAXED);
}

FK_PUBLIC void fakecuda_set_unregister_signal(int sig)
{
    fk_setup();
    __atomic_store_n(&fk_unregister_signal, sig, __ATOMIC_RELAXED);
}

FK_PUBLIC int fakecuda_in_unregister(void)
{
    return fk_in_unregister;
}

FK_PUBLIC unsigned long fakecuda_calls(const char *symbol)
{
    if (!symbol) return 0;
    for (size_t i = 0; i < FKI_COUNT; i++)
        if (!strcmp(fk_syms[i].sym, symbol)) return atomic_load(&fk_call_counts[i]);
    return 0;
}

/* ---- errors ---- */
#define FK_ERRS(E) \
    E(CUDA_SUCCESS, "no error") \
    E(CUDA_ERROR_INVALID_VALUE, "invalid argument") \
    E(CUDA_ERROR_OUT_OF_MEMORY, "out of memory") \
    E(CUDA_ERROR_NOT_INITIALIZED, "initialization error") \
    E(CUDA_ERROR_DEINITIALIZED, "driver shutting down") \
    E(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected") \
    E(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal") \
    E(CUDA_ERROR_INVALID_CONTEXT, "invalid device context") \
    E(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current") \
    E(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle") \
    E(CUDA_ERROR_NOT_FOUND, "named symbol not found") \
    E(CUDA_ERROR_NOT_READY, "device not ready") \
    E(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered") \
    E(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state") \
    E(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "part or all of the requested memory range is already mapped") \
    E(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "pointer does not correspond to a registered memory region") \
    E(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed") \
    E(CUDA_ERROR_NOT_SUPPORTED, "operation not supported") \
    E(CUDA_ERROR_NOT_PERMITTED, "operation not permitted") \
    E(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing") \
    E(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "operation failed due to a previous error during capture") \
    E(CUDA_ERROR_STREAM_CAPTURE_MERGE, "operation would result in a merge of separate capture sequences") \
    E(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "capture was not ended in the same stream as it began") \
    E(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "capturing stream has unjoined work") \
    E(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "dependency created on uncaptured work in another stream") \
    E(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "operation would make the legacy stream depend on a capturing blocking stream") \
    E(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "attempt to terminate a thread-local capture sequence from another thread") \
    E(CUDA_ERROR_CAPTURED_EVENT, "operation not permitted on an event last recorded in a capturing stream") \
    E(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS") \
    E(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access is not supported between these two devices") \
    E(CUDA_ERROR_UNKNOWN, "unknown error")

FK_API(cuGetErrorName, (CUresult e, const char **pStr))
{
    FK_COUNT(cuGetErrorName);
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    switch (e) {
#define E(code, str) case code: *pStr = #code; return CUDA_SUCCESS;
        FK_ERRS(E)
#undef E
    default: *pStr = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
}

FK_API(cuGetErrorString, (CUresult e, const char **pStr))
{
    FK_COUNT(cuGetErrorString);
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    switch (e) {
#define E(code, str) case code: *pStr = str; return CUDA_SUCCESS;
        FK_ERRS(E)
#undef E
    default: *pStr = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
}

/* ---- init and devices ---- */
FK_API(cuInit, (unsigned int flags))
{
    FK_COUNT(cuInit);
    fk_setup();
    if (fk_forked_child) return CUDA_ERROR_NOT_INITIALIZED;
    if (flags) return CUDA_ERROR_INVALID_VALUE;
    if (fk_ndev == 0) return CUDA_ERROR_NO_DEVICE;
    atomic_store(&fk_initialized, 1);
    return CUDA_SUCCESS;
}

FK_API(cuDriverGetVersion, (int *v))
{
    FK_COUNT(cuDriverGetVersion);
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = 13000;
    return CUDA_SUCCESS;
}

FK_API(cuDeviceGet, (CUdevice *d, int ordinal))
{
    FK_COUNT(cuDeviceGet);
    FK_NEED_INIT();
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= fk_ndev) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

FK_API(cuDeviceGetCount, (int *n))
{
    FK_COUNT(cuDeviceGetCount);
    FK_NEED_INIT();
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    *n = fk_ndev;
    return CUDA_SUCCESS;
}

FK_API(cuDeviceGetName, (char *name, int len, CUdevice d))
{
    FK_COUNT(cuDeviceGetName);
    FK_NEED_INIT();
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= fk_ndev) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "fakecuda device %d", d);
    return CUDA_SUCCESS;
}

#define FK_DEV_TOTAL_MEM ((size_t)16 << 30)

FK_API(cuDeviceTotalMem_v2, (size_t *bytes, CUdevice d))
{
    FK_COUNT(cuDeviceTotalMem_v2);
    FK_NEED_INIT();
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= fk_ndev) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = FK_DEV_TOTAL_MEM;
    return CUDA_SUCCESS;
}

FK_API(cuDeviceGetAttribute, (int *pi, CUdevice_attribute a, CUdevice d))
{
    FK_COUNT(cuDeviceGetAttribute);
    FK_NEED_INIT();
    if (!pi) return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= fk_ndev) return CUDA_ERROR_INVALID_DEVICE;
    if ((int)a <= 0 || a >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
    int v = 0;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES: v = fk_pageable_hpt; break;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: v = fk_pageable_hpt; break;
    case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: v = !fk_no_host_register; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = 132; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: v = 2; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = d + 1; break;
    default: v = 0;
    }
    *pi = v;
    return CUDA_SUCCESS;
}

/* ---- contexts: one primary context per device; current context is a per-thread stack ---- */
FK_API(cuDevicePrimaryCtxRetain, (CUcontext *pctx, CUdevice d))
{
    FK_COUNT(cuDevicePrimaryCtxRetain);
    FK_NEED_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= fk_ndev) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&fk_mu);
    fk_ctx *c = &fk_ctxs[d];
    if (!c->legacy) c->legacy = fk_stream_new(c, FK_S_LEGACY, 0, 0);
    c->refcount++;
    pthread_mutex_unlock(&fk_mu);
    *pctx = c;
    return CUDA_SUCCESS;
}

FK_API(cuDevicePrimaryCtxRelease_v2, (CUdevice d))
{
    FK_COUNT(cuDevicePrimaryCtxRelease_v2);
    FK_NEED_INIT();
    if (d < 0 || d >= fk_ndev) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&fk_mu);
    CUresult r = CUDA_SUCCESS;
    if (fk_ctxs[d].refcount <= 0) r = CUDA_ERROR_INVALID_CONTEXT;
    else fk_ctxs[d].refcount--;
    /* Model decision: the context's state (memory, streams) survives refcount 0 here. */
    pthread_mutex_unlock(&fk_mu);
    return r;
}

FK_API(cuDevicePrimaryCtxReset_v2, (CUdevice d))
{
    FK_COUNT(cuDevicePrimaryCtxReset_v2);
    FK_NEED_INIT();
    if (d < 0 || d >= fk_ndev) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&fk_mu);
    fk_wait_ctx_idle(&fk_ctxs[d]);
    fk_ctxs[d].refcount = 0;
    pthread_mutex_unlock(&fk_mu);
    return CUDA_SUCCESS;
}

FK_API(cuDevicePrimaryCtxGetState, (CUdevice d, unsigned int *flags, int *active))
{
    FK_COUNT(cuDevicePrimaryCtxGetState);
    FK_NEED_INIT();
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= fk_ndev) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&fk_mu);
    *flags = 0;
    *active = fk_ctxs[d].refcount > 0;
    pthread_mutex_unlock(&fk_mu);
    return CUDA_SUCCESS;
}

/* A context handle must name a primary context that has been retained at least once. */
static CUresult ctx_check(CUcontext c)
{
    if (!ctx_valid(c)) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&fk_mu);
    int ok = c->legacy != NULL;
    pthread_mutex_unlock(&fk_mu);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

FK_API(cuCtxSetCurrent, (CUcontext c))
{
    FK_COUNT(cuCtxSetCurrent);
    FK_NEED_INIT();
    fk_tls_t *t = fk_tls();
    if (!c) {
        if (t->depth) t->depth--;
        return CUDA_SUCCESS;
    }
    CUresult r = ctx_check(c);
    if (r) return r;
    if (t->depth) t->stack[t->depth - 1] = c;
    else t->stack[t->depth++] = c;
    return CUDA_SUCCESS;
}

FK_API(cuCtxGetCurrent, (CUcontext *pc))
{
    FK_COUNT(cuCtxGetCurrent);
    FK_NEED_INIT();
    if (!pc) return CUDA_ERROR_INVALID_VALUE;
    *pc = fk_cur_ctx();
    return CUDA_SUCCESS;
}

FK_API(cuCtxPushCurrent_v2, (CUcontext c))
{
    FK_COUNT(cuCtxPushCurrent_v2);
    FK_NEED_INIT();
    CUresult r = ctx_check(c);
    if (r) return r;
    fk_tls_t *t = fk_tls();
    if (t->depth >= (int)(sizeof t->stack / sizeof t->stack[0])) return CUDA_ERROR_OUT_OF_MEMORY;
    t->stack[t->depth++] = c;
    return CUDA_SUCCESS;
}

FK_API(cuCtxPopCurrent_v2, (CUcontext *pc))
{
    FK_COUNT(cuCtxPopCurrent_v2);
    FK_NEED_INIT();
    fk_tls_t *t = fk_tls();
    if (!t->depth) return CUDA_ERROR_INVALID_CONTEXT;
    fk_ctx *c = t->stack[--t->depth];
    if (pc) *pc = c;
    return CUDA_SUCCESS;
}

static CUresult ctx_get_device(CUdevice *d, CUcontext c)
{
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    *d = c->dev;
    return CUDA_SUCCESS;
}

FK_API(cuCtxGetDevice, (CUdevice *d))
{
    FK_COUNT(cuCtxGetDevice);
    FK_NEED_INIT();
    return ctx_get_device(d, fk_cur_ctx());
}

FK_API(cuCtxGetDevice_v2, (CUdevice *d, CUcontext c))
{
    FK_COUNT(cuCtxGetDevice_v2);
    FK_NEED_INIT();
    if (c && !ctx_valid(c)) return CUDA_ERROR_INVALID_CONTEXT;
    return ctx_get_device(d, c ? c : fk_cur_ctx());
}

static CUresult ctx_sync(fk_ctx *c)
{
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&fk_mu);
    CUresult r = fk_unsafe_call_check();
    if (!r) fk_wait_ctx_idle(c);
    pthread_mutex_unlock(&fk_mu);
    return r;
}

FK_API(cuCtxSynchronize, (void))
{
    FK_COUNT(cuCtxSynchronize);
    FK_NEED_INIT();
    return ctx_sync(fk_cur_ctx());
}

FK_API(cuCtxSynchronize_v2, (CUcontext c))
{
    FK_COUNT(cuCtxSynchronize_v2);
    FK_NEED_INIT();
    if (c && !ctx_valid(c)) return CUDA_ERROR_INVALID_CONTEXT;
    return ctx_sync(c ? c : fk_cur_ctx());
}

/* ---- cuGetProcAddress: served from the export list ---- */
extern void *const fk_sym_addrs[FKI_COUNT];   /* fk_procaddr.c */

static CUresult proc_lookup(const char *symbol, void **pfn, int ver, cuuint64_t flags,
                            CUdriverProcAddressQueryResult *status)
{
    if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    if (ver > 13000) return CUDA_ERROR_INVALID_VALUE;   /* newer than this driver */
    /* DEFAULT (0) means legacy for a library built without per-thread default stream. */
    int want_pt = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int best = -1, best_pt = -1, known = 0;
    for (int i = 0; i < FKI_COUNT; i++) {
        if (strcmp(fk_syms[i].base, symbol)) continue;
        known = 1;
        if (fk_syms[i].ver > ver) continue;
        if (fk_syms[i].pt) {
            if (best_pt < 0 || fk_syms[i].ver > fk_syms[best_pt].ver) best_pt = i;
        } else if (best < 0 || fk_syms[i].ver > fk_syms[best].ver) {
            best = i;
        }
    }
    /* Per-thread request: the newest per-thread variant that the version allows, else the
     * legacy one (as documented: "If a per-thread version is not found, ... the legacy"). */
    int pick = (want_pt && best_pt >= 0) ? best_pt : best;
    if (pick < 0) {
        if (status && known) *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = fk_sym_addrs[pick];
    if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

FK_API(cuGetProcAddress, (const char *symbol, void **pfn, int ver, cuuint64_t flags))
{
    FK_COUNT(cuGetProcAddress);
    return proc_lookup(symbol, pfn, ver, flags, NULL);
}

FK_API(cuGetProcAddress_v2, (const char *symbol, void **pfn, int ver, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status))
{
    FK_COUNT(cuGetProcAddress_v2);
    return proc_lookup(symbol, pfn, ver, flags, status);
}
