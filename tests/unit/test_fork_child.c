/* A fork can come while another thread is inside the driver registering a block: in the child
 * that thread is gone, so the child must not wait for it (rule 8: its free() never touches the
 * driver and always returns).  The registering thread is real here; the driver's register is
 * replaced by one that blocks until the test lets it go, so the fork lands inside it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cuda.h>
#include "base/config.h"
#include "base/real.h"
#include "base/shim.h"
#include "mem/heap.h"
#include "mem/registry.h"
#include "testutil.h"

static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int entered, released;
static CUresult (*driver_register)(void *, size_t, unsigned);

static CUresult blocking_register(void *p, size_t n, unsigned flags)
{
    pthread_mutex_lock(&gate_mu);
    entered = 1;
    pthread_cond_broadcast(&gate_cv);
    while (!released)
        pthread_cond_wait(&gate_cv, &gate_mu);
    pthread_mutex_unlock(&gate_mu);
    return driver_register(p, n, flags);
}

static void *block_p;
static const size_t block_n = 1 << 20;

static void *copier(void *arg)
{
    (void)arg;
    CUcontext ctx = arg;
    CUresult (*set)(CUcontext) = (CUresult(*)(CUcontext))dlsym(RTLD_DEFAULT, "cuCtxSetCurrent");
    set(ctx);
    struct copy_hold hold;
    enum mem_kind k = registry_copy_begin((uintptr_t)block_p, block_n, DIR_H2D, COPY_MAY_PROMOTE, &hold);
    registry_copy_end(&hold, 0);
    return (void *)(uintptr_t)k;
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "FAIL the child's free() waited for a registration change that cannot end\n";
    if (write(1, msg, sizeof msg - 1) < 0)
        _exit(2);
    _exit(1);
}

int main(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    CHECK(h != NULL);
    if (!h)
        return TEST_SUMMARY();
    real_libc_resolve();
    CHECK(real_driver_resolve(h));
    shim_cfg.mode = MODE_FULL;
    shim_cfg.min_size = 64 << 10;
    shim_cfg.budget = 1ull << 30;
    shim_cfg.bw_h2d_pageable = 9000;
    shim_cfg.bw_d2h_pageable = 11000;
    shim_cfg.bw_pinned = 54000;
    shim_cfg.reg_cost_resident = 45000;
    shim_cfg.reg_cost_fault = 360000;
    heap_init();
    heap_track_min = (size_t)shim_cfg.min_size;

    CUresult (*init)(unsigned) = dlsym(h, "cuInit");
    CUresult (*dev_get)(CUdevice *, int) = dlsym(h, "cuDeviceGet");
    CUresult (*retain)(CUcontext *, CUdevice) = dlsym(h, "cuDevicePrimaryCtxRetain");
    CUresult (*set)(CUcontext) = dlsym(h, "cuCtxSetCurrent");
    CUdevice dev;
    CUcontext ctx;
    CHECK(init(0) == CUDA_SUCCESS && dev_get(&dev, 0) == CUDA_SUCCESS &&
          retain(&ctx, dev) == CUDA_SUCCESS && set(ctx) == CUDA_SUCCESS);

    driver_register = (CUresult(*)(void *, size_t, unsigned))real_hook[HOOK_cuMemHostRegister_v2];
    real_hook[HOOK_cuMemHostRegister_v2] = (void *)blocking_register;

    block_p = heap_alloc(block_n, 16, 0);
    CHECK(block_p != NULL);
    memset(block_p, 1, block_n);   /* resident: the cost model registers it on its first copy */

    pthread_t t;
    pthread_create(&t, NULL, copier, ctx);
    pthread_mutex_lock(&gate_mu);
    while (!entered)
        pthread_cond_wait(&gate_cv, &gate_mu);
    pthread_mutex_unlock(&gate_mu);

    /* The copier is inside the driver's register now, its block marked as changing. */
    pid_t pid = fork();
    if (pid == 0) {
        shim_forked_child = 1;
        heap_after_fork_child();
        registry_after_fork_child();
        signal(SIGALRM, on_alarm);
        alarm(5);
        int freed = heap_free(block_p);
        alarm(0);
        _exit(freed == 1 && !registry_known_host((uintptr_t)block_p) ? 0 : 3);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0,
           "the child freed the block without waiting (exit status %d)", WEXITSTATUS(status));

    pthread_mutex_lock(&gate_mu);
    released = 1;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
    void *kind;
    pthread_join(t, &kind);
    CHECKF((enum mem_kind)(uintptr_t)kind == MEM_PROMOTED, "the parent's copy promoted the block");
    CHECK(heap_free(block_p) == 1);
    return TEST_SUMMARY();
}
