/* Contract rule 8: a forked child never calls into the driver through the shim, and its frees of
 * blocks the shim promoted in the parent still work.
 *   - the parent makes buffers hot (promoted under pin/full; one of them an mmap), frees one more
 *     promoted block (into the shim's cache), then forks;
 *   - child 1 reads and writes the inherited buffers, frees / unmaps / discards them, allocates,
 *     reallocs, callocs and frees more large blocks, and checks that no driver entry point was
 *     called; it ends with _exit;
 *   - child 2 does the same and ends with exit(), so atexit handlers and destructors run (the
 *     shim's among them): it must exit 0 and not hang;
 *   - child 3 calls cuMemcpyHtoD itself: it gets the driver's own error, through exactly one
 *     driver call;
 *   - forks while another thread keeps promoting, copying, allocating and freeing large blocks:
 *     each child frees and allocates large blocks and exits 0 without hanging (no lock of the
 *     shim's left held across fork);
 *   - the parent waits for each (status 0), then keeps copying correctly; no violations. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include "drvtest.h"
#include "fakecuda.h"

static const size_t n = 4u << 20;
static CUdeviceptr dev;
static unsigned char *a, *b, *m;

static const char *const watched[] = {
    "cuMemHostRegister_v2", "cuMemHostRegister", "cuMemHostUnregister", "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2", "cuCtxSynchronize", "cuCtxGetCurrent", "cuCtxGetDevice", "cuCtxSetCurrent",
    "cuDeviceGetAttribute", "cuStreamCreate", "cuStreamDestroy_v2", "cuStreamSynchronize",
    "cuStreamWaitEvent", "cuStreamIsCapturing", "cuEventCreate", "cuEventRecord", "cuEventRecord_ptsz",
    "cuEventSynchronize", "cuEventQuery", "cuEventDestroy_v2", "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2",
    "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpy2DAsync_v2", "cuMemcpyAsync",
    "cuPointerGetAttribute", "cuMemAlloc_v2", "cuMemFree_v2", "cuMemHostAlloc", "cuMemFreeHost",
    "cuMemAllocHost_v2", "cuInit", "cuDevicePrimaryCtxRetain",
};

static unsigned long driver_calls(void)
{
    unsigned long sum = 0;
    for (size_t i = 0; i < sizeof watched / sizeof watched[0]; i++)
        sum += fakecuda_calls(watched[i]);
    return sum;
}

static void hot(unsigned char *p, unsigned seed)
{
    fill_pattern(p, n, seed);
    for (int i = 0; i < 4; i++)
        CU(cuMemcpyHtoD(dev, p, n));
}

/* What every child does with memory; returns nothing, records checks. */
static void child_memory_work(const char *who)
{
    unsigned long calls0 = driver_calls();
    unsigned long unreg0 = fakecuda_calls("cuMemHostUnregister");
    CHECKF(check_pattern(a, n, 1) && check_pattern(b, n, 2) && check_pattern(m, n, 3),
           "%s: inherited buffers hold the parent's data", who);
    fill_pattern(a, n, 11);
    CHECKF(check_pattern(a, n, 11), "%s: an inherited promoted buffer is writable", who);
    free(a);
    free(b);
    CHECK(madvise(m, n / 2, MADV_DONTNEED) == 0);
    CHECK(munmap(m, n) == 0);
    int ok = 1;
    for (int i = 0; i < 8; i++) {
        size_t sz = (size_t)(i + 1) << 20;
        unsigned char *p = malloc(sz);
        fill_pattern(p, sz, 20 + (unsigned)i);
        unsigned char *q = realloc(p, sz * 2);
        ok &= q != NULL && check_pattern(q, sz, 20 + (unsigned)i);
        unsigned char *c = calloc(1, n);
        for (size_t k = 0; c && k < n; k += 4096)
            ok &= c[k] == 0;
        free(c);
        free(q);
    }
    void *mm = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ok &= mm != MAP_FAILED;
    if (mm != MAP_FAILED)
        munmap(mm, n);
    CHECKF(ok, "%s: large allocations work", who);
    CHECKF(fakecuda_calls("cuMemHostUnregister") == unreg0, "%s: no cuMemHostUnregister", who);
    CHECKF(driver_calls() == calls0, "%s: no driver call at all (%lu -> %lu)", who, calls0, driver_calls());
}

static int roundtrip_ok(unsigned char *p)
{
    int ok = 1;
    for (unsigned i = 0; i < 3; i++) {
        fill_pattern(p, n, 50 + i);
        CU(cuMemcpyHtoD(dev, p, n));
        memset(p, 0, n);
        CU(cuMemcpyDtoH(p, dev, n));
        ok &= check_pattern(p, n, 50 + i);
    }
    return ok;
}

static volatile int churn_stop;
static CUcontext main_ctx;
static int churn_ok = 1;

static void *churn_main(void *arg)
{
    (void)arg;
    CU(cuCtxSetCurrent(main_ctx));
    CUdeviceptr d;
    CU(cuMemAlloc(&d, n));
    unsigned i = 0;
    while (!__atomic_load_n(&churn_stop, __ATOMIC_ACQUIRE)) {
        size_t sz = ((size_t)(i % 4) + 1) << 20;
        unsigned char *p = malloc(sz);
        fill_pattern(p, sz, 60 + i);
        for (int k = 0; k < 3; k++)
            CU(cuMemcpyHtoD(d, p, sz));
        memset(p, 0, sz);
        CU(cuMemcpyDtoH(p, d, sz));
        if (!check_pattern(p, sz, 60 + i))
            churn_ok = 0;
        free(p);
        i++;
    }
    CU(cuMemFree(d));
    return NULL;
}

static int wait_child(pid_t pid, const char *who)
{
    int st = 0;
    if (waitpid(pid, &st, 0) != pid)
        return 0;
    if (WIFSIGNALED(st))
        printf("info: %s died of signal %d\n", who, WTERMSIG(st));
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(void)
{
    main_ctx = drvtest_init();
    printf("mode=%s\n", drvtest_mode());
    CU(cuMemAlloc(&dev, n));
    a = malloc(n);
    b = malloc(n);
    m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(a && b && m != MAP_FAILED);
    hot(a, 1);
    hot(b, 2);
    hot(m, 3);
    unsigned char *cached = malloc(n);
    hot(cached, 4);
    free(cached);   /* a promoted block now in the shim's cache */
    printf("info: promoted: a=%d b=%d m=%d\n", fakecuda_registered(a, n), fakecuda_registered(b, n),
           fakecuda_registered(m, n));
    if (drvtest_expect_promotion(n))
        CHECKF(fakecuda_registered(a, n) && fakecuda_registered(b, n), "the parent's hot buffers are promoted");
    /* Keep an async copy from program-pinned memory in flight across the forks. */
    unsigned char *pinned;
    CU(cuMemHostAlloc((void **)&pinned, n, 0));
    fill_pattern(pinned, n, 5);
    CUstream s;
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CU(cuCtxSynchronize());   /* hot()'s pageable uploads may not have landed, and s does not wait for them */
    CU(fakecuda_launch_write(s, dev, 0, 4096, 20000));
    CU(cuMemcpyHtoDAsync(dev, pinned, n, s));
    fflush(NULL);

    pid_t c1 = fork();
    if (c1 == 0) {
        alarm(30);
        child_memory_work("child 1 (_exit)");
        fflush(NULL);
        _exit(tests_failed ? 1 : 0);
    }
    CHECKF(c1 > 0 && wait_child(c1, "child 1"), "child 1 (_exit) exits 0");

    fflush(NULL);
    pid_t c2 = fork();
    if (c2 == 0) {
        alarm(30);
        child_memory_work("child 2 (exit)");
        fflush(NULL);
        exit(tests_failed ? 1 : 0);
    }
    CHECKF(c2 > 0 && wait_child(c2, "child 2"), "child 2 (exit, atexit handlers and destructors run) exits 0");

    fflush(NULL);
    pid_t c3 = fork();
    if (c3 == 0) {
        alarm(30);
        unsigned long calls0 = driver_calls();
        CUresult r = cuMemcpyHtoD(dev, a, n);
        CHECKF(r == CUDA_ERROR_NOT_INITIALIZED, "child 3: its own cuMemcpyHtoD gets the driver's error (got %d)", (int)r);
        CHECKF(driver_calls() == calls0 + 1, "child 3: exactly one driver call, the program's (%lu)",
               driver_calls() - calls0);
        free(a);
        fflush(NULL);
        _exit(tests_failed ? 1 : 0);
    }
    CHECKF(c3 > 0 && wait_child(c3, "child 3"), "child 3 exits 0");

    /* forks while another thread works through the shim */
    pthread_t churn;
    pthread_create(&churn, NULL, churn_main, NULL);
    int forks_ok = 1;
    for (int i = 0; i < 10; i++) {
        usleep(7000);
        fflush(NULL);
        pid_t c = fork();
        if (c == 0) {
            alarm(20);
            for (int k = 0; k < 4; k++) {
                unsigned char *p = malloc(((size_t)k + 1) << 20);
                if (!p)
                    _exit(2);
                memset(p, k, ((size_t)k + 1) << 20);
                p = realloc(p, ((size_t)k + 2) << 20);
                free(p);
            }
            _exit(0);
        }
        forks_ok &= c > 0 && wait_child(c, "busy-fork child");
    }
    __atomic_store_n(&churn_stop, 1, __ATOMIC_RELEASE);
    pthread_join(churn, NULL);
    CHECKF(forks_ok, "10 forks while another thread works through the shim: every child exits 0");
    CHECKF(churn_ok, "the working thread's copies stayed correct across the forks");

    /* the parent goes on */
    CU(cuStreamSynchronize(s));
    unsigned char *back = malloc(n);
    memset(back, 0, n);
    CU(cuMemcpyDtoH(back, dev, n));
    CHECKF(check_pattern(back, n, 5), "parent: the async copy in flight across the forks completed right");
    int ok = 1;
    for (unsigned i = 0; i < 3; i++) {
        unsigned char *p = i == 0 ? a : i == 1 ? b : m;
        fill_pattern(p, n, 30 + i);
        CU(cuMemcpyHtoD(dev, p, n));
        memset(back, 0, n);
        CU(cuMemcpyDtoH(back, dev, n));
        ok &= check_pattern(back, n, 30 + i);
        fill_pattern(p, n, 40 + i);
        CU(cuMemcpyHtoDAsync(dev, p, n, s));
        if (!drvtest_trust_async())
            memset(p, 0, n);
        CU(cuStreamSynchronize(s));
        CU(cuMemcpyDtoHAsync(back, dev, n, s));
        CU(cuStreamSynchronize(s));
        ok &= check_pattern(back, n, 40 + i);
    }
    CHECKF(ok, "parent: copies after the forks are correct");
    unsigned char *again = malloc(n);
    CHECKF(roundtrip_ok(again), "parent: a new block (maybe from the cache) copies right");
    free(again);
    free(back);
    free(a);
    free(b);
    munmap(m, n);
    CU(cuStreamDestroy(s));
    CU(cuMemFreeHost(pinned));
    CU(cuMemFree(dev));
    CHECKF(fakecuda_violations() == 0, "no violations (%lu)", fakecuda_violations());
    return TEST_SUMMARY();
}
