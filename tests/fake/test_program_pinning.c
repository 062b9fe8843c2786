/* Contract rules 3 and 5: the program's own pinning always works, and errors are the driver's.
 *   - cuMemHostRegister by the program of a range the shim promoted (the whole buffer; a
 *     sub-range of another; a range straddling two promoted mappings) succeeds; copies work;
 *     cuMemHostUnregister works; registering twice, or an overlapping range, gives
 *     CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED exactly as without the shim;
 *   - cuMemHostUnregister of a pointer the program never registered gives
 *     CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, also when the shim promoted that memory (the
 *     shim's registration is not the program's); an interior pointer of a program
 *     registration gives CUDA_ERROR_INVALID_VALUE; the same while another thread's copies get
 *     the memory promoted (the program's unregister must neither undo nor race the shim's);
 *   - invalid copies (device pointer 0, beyond or straddling the end of an allocation, a NULL
 *     host pointer, a 2D pitch below the width) give CUDA_ERROR_INVALID_VALUE with every kind of
 *     host memory (promoted, cold pageable, program-pinned), sync and async, and change nothing
 *     on the device.
 * The codes are the real driver's; the run without the shim proves the fake gives them. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>
#include "drvtest.h"
#include "fakecuda.h"

static const size_t n = 8u << 20;
static CUdeviceptr dev;        /* n bytes */
static CUdeviceptr dev4;       /* n / 2 bytes */
static unsigned char *check;   /* pinned read-back */

#define EXPECT(call, want)                                                                   \
    do {                                                                                     \
        CUresult r_ = (call);                                                                \
        CHECKF(r_ == (want), "%s -> %s (got %d)", #call, #want, (int)r_);                    \
    } while (0)

static void promote(void *p, size_t len)
{
    for (int i = 0; i < 4; i++)
        CU(cuMemcpyHtoD(dev, p, len));
    drvtest_wait_registered(p, len);
}

static int roundtrip(unsigned char *p, size_t len, unsigned seed)
{
    fill_pattern(p, len, seed);
    CU(cuMemcpyHtoD(dev, p, len));
    memset(check, 0, len);
    CU(cuMemcpyDtoH(check, dev, len));
    int ok = check_pattern(check, len, seed);
    memset(p, 0, len);
    CU(cuMemcpyDtoH(p, dev, len));
    return ok && check_pattern(p, len, seed);
}

/* Async both ways on s, for memory the program pinned itself. */
static int roundtrip_async(unsigned char *p, size_t len, unsigned seed, CUstream s)
{
    /* s does not wait for the legacy stream, and a pageable cuMemcpyHtoD there returns once its
     * source is staged, before its DMA to dev is done: let that land first. */
    CU(cuStreamSynchronize(CU_STREAM_LEGACY));
    fill_pattern(p, len, seed);
    CU(cuMemcpyHtoDAsync(dev, p, len, s));
    CU(cuStreamSynchronize(s));
    memset(p, 0, len);
    CU(cuMemcpyDtoHAsync(p, dev, len, s));
    CU(cuStreamSynchronize(s));
    return check_pattern(p, len, seed);
}

static void whole_buffer(CUstream s)
{
    unsigned char *a = malloc(n);
    fill_pattern(a, n, 1);
    promote(a, n);
    printf("info: buffer promoted by the shim: %d\n", fakecuda_registered(a, n));
    EXPECT(cuMemHostRegister(a, n, 0), CUDA_SUCCESS);
    CHECK(fakecuda_registered(a, n));
    CHECKF(roundtrip(a, n, 2), "program-registered (formerly promoted) buffer: sync copies");
    CHECKF(roundtrip_async(a, n, 3, s), "program-registered buffer: async copies");
    EXPECT(cuMemHostRegister(a, n, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    EXPECT(cuMemHostRegister(a + 4096, 4096, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    EXPECT(cuMemHostRegister(a + n - 4096, 4096, CU_MEMHOSTREGISTER_PORTABLE),
           CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    EXPECT(cuMemHostUnregister(a + 4096), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemHostUnregister(a), CUDA_SUCCESS);
    EXPECT(cuMemHostUnregister(a), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    CHECKF(roundtrip(a, n, 4), "after the program's unregister: copies correct");

    /* hot again (the shim may promote it again), then the program pins it again */
    promote(a, n);
    promote(a, n);
    EXPECT(cuMemHostRegister(a, n, CU_MEMHOSTREGISTER_PORTABLE), CUDA_SUCCESS);
    CHECKF(roundtrip_async(a, n, 5, s), "registered a second time: async copies");
    EXPECT(cuMemHostUnregister(a), CUDA_SUCCESS);
    CHECKF(roundtrip(a, n, 6), "after the second unregister: copies correct");
    free(a);
}

static void sub_range(CUstream s)
{
    unsigned char *b = malloc(n);
    fill_pattern(b, n, 10);
    promote(b, n);
    unsigned char *sub = b + (1u << 20);
    const size_t sub_n = 2u << 20;
    EXPECT(cuMemHostRegister(sub, sub_n, 0), CUDA_SUCCESS);
    CHECKF(roundtrip(sub, sub_n, 11), "program-registered sub-range: sync copies");
    CHECKF(roundtrip_async(sub, sub_n, 12, s), "program-registered sub-range: async copies");
    CHECKF(roundtrip(b, n, 13), "the whole buffer around the program's sub-range: sync copies");
    promote(b, n);
    CHECKF(roundtrip(b, n, 14), "the whole buffer, hot: sync copies");
    EXPECT(cuMemHostRegister(b, n, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    EXPECT(cuMemHostUnregister(sub + 4096), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemHostUnregister(b), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    EXPECT(cuMemHostUnregister(sub), CUDA_SUCCESS);
    CHECKF(roundtrip(b, n, 15), "after the sub-range's unregister: copies correct");
    promote(b, n);
    CHECKF(roundtrip(b, n, 16), "hot again: copies correct");
    free(b);
}

static void straddle(CUstream s)
{
    const int prot = PROT_READ | PROT_WRITE, fl = MAP_PRIVATE | MAP_ANONYMOUS;
    unsigned char *x = mmap(NULL, n, prot, fl, -1, 0);
    CHECK(x != MAP_FAILED);
    unsigned char *y = mmap(x + n, n, prot, fl | MAP_FIXED_NOREPLACE, -1, 0);
    if (y != x + n) {
        printf("info: could not place two mappings side by side; straddle case skipped\n");
        if (y != MAP_FAILED)
            munmap(y, n);
        munmap(x, n);
        return;
    }
    fill_pattern(x, n, 20);
    fill_pattern(y, n, 21);
    promote(x, n);
    promote(y, n);
    unsigned char *mid = x + n / 2;
    EXPECT(cuMemHostRegister(mid, n, 0), CUDA_SUCCESS);
    CHECKF(roundtrip(mid, n, 22), "program-registered range straddling two promoted mappings: sync copies");
    CHECKF(roundtrip_async(mid, n, 23, s), "straddling registration: async copies");
    EXPECT(cuMemHostUnregister(mid), CUDA_SUCCESS);
    CHECKF(roundtrip(x, n, 24) && roundtrip(y, n, 25), "both mappings copy right afterwards");
    munmap(x, 2 * n);
    CHECK(!fakecuda_registered(x, 2 * n));
}

static void never_registered(void)
{
    unsigned char *small = malloc(4096);
    EXPECT(cuMemHostUnregister(small), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    free(small);
    /* memory the shim may have promoted, which the program never registered */
    unsigned char *p = malloc(n);
    fill_pattern(p, n, 30);
    promote(p, n);
    printf("info: never-registered buffer promoted by the shim: %d\n", fakecuda_registered(p, n));
    EXPECT(cuMemHostUnregister(p + 4096), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    EXPECT(cuMemHostUnregister(p), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    EXPECT(cuMemHostUnregister(p), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    EXPECT(cuMemFreeHost(p), CUDA_ERROR_INVALID_VALUE);
    CHECKF(roundtrip(p, n, 31), "the buffer still copies right");
    free(p);
}

/* One thread copies fresh buffers (the shim promotes them as it goes) while another keeps
 * unregistering them: every answer is the driver's "not registered", and the data survives. */
#define RACE_BUFFERS 24
static unsigned char *race_buf[RACE_BUFFERS];
static int race_done;
static unsigned long race_calls, race_wrong;

static void *unregister_loop(void *ctx)
{
    CU(cuCtxSetCurrent((CUcontext)ctx));
    while (!__atomic_load_n(&race_done, __ATOMIC_ACQUIRE)) {
        for (int i = 0; i < RACE_BUFFERS; i++) {
            CUresult r = cuMemHostUnregister(race_buf[i]);
            race_calls++;
            if (r != CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED && race_wrong++ == 0)
                printf("info: first wrong answer: %d\n", (int)r);
        }
    }
    return NULL;
}

static void never_registered_while_promoting(void)
{
    const size_t len = 1u << 20;
    for (int i = 0; i < RACE_BUFFERS; i++) {
        race_buf[i] = malloc(len);
        fill_pattern(race_buf[i], len, 40 + i);
    }
    CUcontext ctx;
    CU(cuCtxGetCurrent(&ctx));
    pthread_t t;
    CHECK(pthread_create(&t, NULL, unregister_loop, ctx) == 0);
    for (int i = 0; i < RACE_BUFFERS; i++)
        promote(race_buf[i], len);
    __atomic_store_n(&race_done, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    CHECKF(race_calls > 0 && race_wrong == 0,
           "unregister during promotions: %lu calls, %lu not answered \"not registered\"",
           race_calls, race_wrong);
    int ok = 1;
    for (int i = 0; i < RACE_BUFFERS; i++) {
        ok &= roundtrip(race_buf[i], len, 70 + i);
        free(race_buf[i]);
    }
    CHECKF(ok, "the buffers still copy right");
}

static void bad_arguments(void)
{
    unsigned char *promoted = malloc(n), *cold = malloc(n), *pinned;
    CU(cuMemHostAlloc((void **)&pinned, n, 0));
    fill_pattern(promoted, n, 40);
    promote(promoted, n);
    fill_pattern(cold, n, 41);
    fill_pattern(pinned, n, 42);
    CUstream s;
    CU(cuStreamCreate(&s, 0));
    struct { const char *name; unsigned char *p; } hosts[3] = {
        {"promoted", promoted}, {"cold pageable", cold}, {"program-pinned", pinned}};
    const size_t half = n / 2;

    for (int k = 0; k < 3; k++) {
        unsigned char *h = hosts[k].p;
        /* the device holds a known pattern: a failed copy must leave it */
        fill_pattern(check, half, 50 + (unsigned)k);
        CU(cuMemcpyHtoD(dev4, check, half));
        printf("-- %s host memory\n", hosts[k].name);
        EXPECT(cuMemcpyHtoD(0, h, 4096), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuMemcpyHtoD(dev4 + half, h, 4096), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuMemcpyHtoD(dev4 + half - 4096, h, 8192), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuMemcpyHtoD(dev4, h, n), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuMemcpyHtoD(dev4 + (1u << 20), h, half), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuMemcpyDtoH(h, 0, 4096), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuMemcpyDtoH(h, dev4 + half, 4096), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuMemcpyDtoH(h, dev4, n), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuMemcpyHtoDAsync(0, h, 4096, s), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuMemcpyHtoDAsync(dev4 + (1u << 20), h, half, s), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuMemcpyDtoHAsync(h, dev4 + (1u << 20), half, s), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuMemcpyDtoHAsync(h, 0, half, s), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuMemcpy(dev4 + (1u << 20), (CUdeviceptr)h, half), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuMemcpy((CUdeviceptr)h, dev4 + (1u << 20), half), CUDA_ERROR_INVALID_VALUE);

        CUDA_MEMCPY2D p;
        memset(&p, 0, sizeof p);
        p.srcMemoryType = CU_MEMORYTYPE_HOST;
        p.srcHost = h;
        p.srcPitch = 4096;
        p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
        p.dstDevice = dev4;
        p.dstPitch = 4096;
        p.WidthInBytes = 4096;
        p.Height = (unsigned)(n / 4096);   /* twice the device allocation */
        EXPECT(cuMemcpy2D(&p), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuMemcpy2DAsync(&p, s), CUDA_ERROR_INVALID_VALUE);
        p.Height = (unsigned)(half / 8192);
        p.WidthInBytes = 8192;             /* pitch below the width */
        EXPECT(cuMemcpy2D(&p), CUDA_ERROR_INVALID_VALUE);

        CU(cuStreamSynchronize(s));
        memset(check, 0, half);
        CU(cuMemcpyDtoH(check, dev4, half));
        CHECKF(check_pattern(check, half, 50 + (unsigned)k), "%s: failed copies changed nothing on the device",
               hosts[k].name);
        /* and the memory still works */
        CU(cuMemcpyHtoD(dev4, h, half));
        memset(check, 0, half);
        CU(cuMemcpyDtoH(check, dev4, half));
        CHECKF(memcmp(check, h, half) == 0, "%s: a valid copy after the errors is correct", hosts[k].name);
    }
    EXPECT(cuMemcpyHtoD(dev4, NULL, 4096), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemcpyDtoH(NULL, dev4, 4096), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemcpyHtoD(dev4, promoted, 0), CUDA_SUCCESS);
    EXPECT(cuMemcpyDtoH(promoted, dev4, 0), CUDA_SUCCESS);
    EXPECT(cuMemHostRegister(NULL, 4096, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemHostRegister(cold, 0, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemHostRegister(cold, n, 0x80), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemHostRegister(pinned, n, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);

    CU(cuStreamDestroy(s));
    CU(cuMemFreeHost(pinned));
    free(promoted);
    free(cold);
}

int main(void)
{
    drvtest_init();
    printf("mode=%s\n", drvtest_mode());
    CU(cuMemAlloc(&dev, n));
    CU(cuMemAlloc(&dev4, n / 2));
    CU(cuMemHostAlloc((void **)&check, n, 0));
    CUstream s;
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

    whole_buffer(s);
    sub_range(s);
    straddle(s);
    never_registered();
    never_registered_while_promoting();
    bad_arguments();

    CU(cuCtxSynchronize());
    CU(cuStreamDestroy(s));
    CU(cuMemFreeHost(check));
    CU(cuMemFree(dev));
    CU(cuMemFree(dev4));
    CHECKF(fakecuda_violations() == 0, "no violations (%lu)", fakecuda_violations());
    return TEST_SUMMARY();
}
