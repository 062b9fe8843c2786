/* A device pointer passed as the host side of a copy (a wrong direction, as when cudaMemcpy is
 * given the wrong kind): the driver answers CUDA_ERROR_INVALID_VALUE and touches nothing.  A
 * library in between must give the same answer; it must not read or write the device address
 * from the CPU (on a GPU, and on the fake, that address faults).
 * Every case runs in a child of its own, so a crash names the case: copies of 4, 16 and 64 MiB,
 * HtoD with a device source and DtoH with a device destination, sync, async on a created
 * stream and on the per-thread default stream, 1D, 2D and 3D, a few times each (a library may
 * treat a pointer differently once it has seen it). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>
#include "drvtest.h"
#include "fakecuda.h"

#define MAXN ((size_t)64 << 20)
#define ROW ((size_t)1 << 20)

static const char *const cases[] = {
    "htod", "htod_ptds", "htod_async", "htod_async_ptsz", "htod_2d", "htod_2d_async", "htod_3d",
    "dtoh", "dtoh_ptds", "dtoh_async", "dtoh_async_ptsz", "dtoh_2d", "dtoh_3d_async",
};
#define NCASES (sizeof cases / sizeof cases[0])

static CUresult one(const char *c, CUdeviceptr a, CUdeviceptr b, size_t n, CUstream s)
{
    void *ha = (void *)(uintptr_t)a, *hb = (void *)(uintptr_t)b;
    if (!strcmp(c, "htod")) return cuMemcpyHtoD(b, ha, n);
    if (!strcmp(c, "htod_ptds")) return cuMemcpyHtoD_v2_ptds(b, ha, n);
    if (!strcmp(c, "htod_async")) return cuMemcpyHtoDAsync(b, ha, n, s);
    if (!strcmp(c, "htod_async_ptsz")) return cuMemcpyHtoDAsync_v2_ptsz(b, ha, n, NULL);
    if (!strcmp(c, "dtoh")) return cuMemcpyDtoH(hb, a, n);
    if (!strcmp(c, "dtoh_ptds")) return cuMemcpyDtoH_v2_ptds(hb, a, n);
    if (!strcmp(c, "dtoh_async")) return cuMemcpyDtoHAsync(hb, a, n, s);
    if (!strcmp(c, "dtoh_async_ptsz")) return cuMemcpyDtoHAsync_v2_ptsz(hb, a, n, CU_STREAM_PER_THREAD);
    int h2d = c[0] == 'h';
    if (strstr(c, "_2d")) {
        CUDA_MEMCPY2D p;
        memset(&p, 0, sizeof p);
        p.WidthInBytes = ROW;
        p.Height = n / ROW;
        if (h2d) {
            p.srcMemoryType = CU_MEMORYTYPE_HOST; p.srcHost = ha; p.srcPitch = ROW;
            p.dstMemoryType = CU_MEMORYTYPE_DEVICE; p.dstDevice = b; p.dstPitch = ROW;
        } else {
            p.srcMemoryType = CU_MEMORYTYPE_DEVICE; p.srcDevice = a; p.srcPitch = ROW;
            p.dstMemoryType = CU_MEMORYTYPE_HOST; p.dstHost = hb; p.dstPitch = ROW;
        }
        return strstr(c, "async") ? cuMemcpy2DAsync(&p, s) : cuMemcpy2D(&p);
    }
    CUDA_MEMCPY3D p;
    memset(&p, 0, sizeof p);
    p.WidthInBytes = ROW;
    p.Height = 2;
    p.Depth = n / (2 * ROW);
    if (h2d) {
        p.srcMemoryType = CU_MEMORYTYPE_HOST; p.srcHost = ha; p.srcPitch = ROW; p.srcHeight = 2;
        p.dstMemoryType = CU_MEMORYTYPE_DEVICE; p.dstDevice = b; p.dstPitch = ROW; p.dstHeight = 2;
    } else {
        p.srcMemoryType = CU_MEMORYTYPE_DEVICE; p.srcDevice = a; p.srcPitch = ROW; p.srcHeight = 2;
        p.dstMemoryType = CU_MEMORYTYPE_HOST; p.dstHost = hb; p.dstPitch = ROW; p.dstHeight = 2;
    }
    return strstr(c, "async") ? cuMemcpy3DAsync(&p, s) : cuMemcpy3D(&p);
}

/* Device content, read back through pinned memory, equals v everywhere. */
static int dev_is(CUdeviceptr d, unsigned char *pin, unsigned char v)
{
    CU(cuMemcpyDtoH(pin, d, MAXN));
    for (size_t i = 0; i < MAXN; i++)
        if (pin[i] != v) return 0;
    return 1;
}

static int child(const char *c)
{
    drvtest_init();
    CUdeviceptr a, b;
    CU(cuMemAlloc(&a, MAXN));
    CU(cuMemAlloc(&b, MAXN));
    CU(cuMemsetD8(a, 0x5a, MAXN));
    CU(cuMemsetD8(b, 0xa5, MAXN));
    CUstream s;
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    unsigned char *pin;
    CU(cuMemHostAlloc((void **)&pin, MAXN, 0));
    static const size_t sizes[] = { (size_t)4 << 20, (size_t)16 << 20, MAXN };
    for (int k = 0; k < 3; k++)
        for (int rep = 0; rep < 3; rep++) {
            CUresult r = one(c, a, b, sizes[k], s);
            CHECKF(r == CUDA_ERROR_INVALID_VALUE, "%s, %zu MiB, try %d: CUDA_ERROR_INVALID_VALUE (got %d)", c,
                   sizes[k] >> 20, rep + 1, (int)r);
        }
    CU(cuStreamSynchronize(s));
    CU(cuCtxSynchronize());
    CHECKF(dev_is(a, pin, 0x5a) && dev_is(b, pin, 0xa5), "%s: both device buffers unchanged", c);
    CHECKF(fakecuda_violations() == 0, "%s: no violations (%lu)", c, fakecuda_violations());
    CU(cuMemFreeHost(pin));
    CU(cuStreamDestroy(s));
    CU(cuMemFree(a));
    CU(cuMemFree(b));
    return TEST_SUMMARY();
}

int main(int argc, char **argv)
{
    if (argc > 1) return child(argv[1]);
    printf("mode=%s\n", drvtest_mode());
    for (size_t i = 0; i < NCASES; i++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            execl("/proc/self/exe", argv[0], cases[i], (char *)NULL);
            _exit(127);
        }
        int st = 0;
        if (pid < 0 || waitpid(pid, &st, 0) != pid) st = -1;
        char how[64];
        if (st == -1) snprintf(how, sizeof how, "could not run");
        else if (WIFSIGNALED(st)) snprintf(how, sizeof how, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
        else snprintf(how, sizeof how, "exit status %d", WEXITSTATUS(st));
        CHECKF(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "case %s: %s", cases[i], how);
    }
    return TEST_SUMMARY();
}
