/* A read-only mapping (a data file mapped PROT_READ, or an anonymous one) is copied to the
 * device often, then made writable with mprotect and receives a device-to-host copy.  Without
 * a library in between the driver copies into pageable, writable memory: the data lands.  A
 * library that pinned the mapping while it was read-only registered it
 * CU_MEMHOSTREGISTER_READ_ONLY: the device may not write there, whatever mprotect says now
 * (a fault or a failed copy on a GPU; the fake flags the DMA write).  The data must land and the
 * driver see nothing wrong: sync, async, per-thread, 2D and a sub-range, 8 and 64 MiB. */
#define _GNU_SOURCE
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#include "drvtest.h"
#include "fakecuda.h"

#define MAXN ((size_t)64 << 20)

static CUdeviceptr dev;
static unsigned char *pin;   /* pinned scratch: device content in and out */
static CUstream s;

enum { R_SYNC, R_ASYNC, R_PTDS, R_2D, R_HALF, NREAD };
static const char *const rname[NREAD] = { "sync", "async", "per-thread", "2D", "sub-range" };

/* A read-only mapping of n bytes holding pattern seed: a file's (memfd) or anonymous zeros. */
static unsigned char *map_readonly(size_t n, int file, unsigned seed)
{
    if (!file)
        return mmap(NULL, n, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int fd = memfd_create("hostile-ro", 0);
    if (fd < 0) return MAP_FAILED;
    unsigned char *w = malloc(n);
    fill_pattern(w, n, seed);
    ssize_t put = write(fd, w, n);
    free(w);
    void *m = put == (ssize_t)n ? mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    close(fd);
    return m;
}

static void read_back(int how, unsigned char *p, size_t off, size_t len)
{
    switch (how) {
    case R_SYNC: case R_HALF: CU(cuMemcpyDtoH(p + off, dev + off, len)); break;
    case R_ASYNC: CU(cuMemcpyDtoHAsync(p + off, dev + off, len, s)); CU(cuStreamSynchronize(s)); break;
    case R_PTDS: CU(cuMemcpyDtoH_v2_ptds(p + off, dev + off, len)); break;
    default: {
        CUDA_MEMCPY2D c;
        memset(&c, 0, sizeof c);
        c.srcMemoryType = CU_MEMORYTYPE_DEVICE; c.srcDevice = dev + off; c.srcPitch = 1 << 20;
        c.dstMemoryType = CU_MEMORYTYPE_HOST; c.dstHost = p + off; c.dstPitch = 1 << 20;
        c.WidthInBytes = 1 << 20; c.Height = len >> 20;
        CU(cuMemcpy2D(&c));
    }
    }
}

static void one(size_t n, int file, int how)
{
    const char *kind = file ? "file" : "anonymous";
    unsigned seed = (unsigned)(n >> 20) * 10 + (unsigned)how + (file ? 100 : 0);
    unsigned char *p = map_readonly(n, file, seed);
    if (p == MAP_FAILED) {
        CHECKF(0, "%s read-only mapping of %zu MiB", kind, n >> 20);
        return;
    }
    /* hot: copied to the device again and again while read-only */
    int ok = 1;
    for (int i = 0; i < 8; i++) {
        CU(cuMemcpyHtoD(dev, p, n));
        CU(cuMemcpyDtoH(pin, dev, n));
        ok &= memcmp(pin, p, n) == 0;
    }
    CHECKF(ok, "%s %zu MiB, %s: copies from the read-only mapping correct", kind, n >> 20, rname[how]);
    printf("info: registered by the shim while read-only: %d\n", fakecuda_registered(p, n));

    CHECKF(mprotect(p, n, PROT_READ | PROT_WRITE) == 0, "mprotect to read-write");
    size_t off = how == R_HALF ? n / 4 : 0, len = how == R_HALF ? n / 2 : n;
    fill_pattern(pin, n, seed + 1);
    CU(cuMemcpyHtoD(dev, pin, n));
    unsigned long v0 = fakecuda_violations();
    read_back(how, p, off, len);
    /* (a sub-range: pattern seed+1 is checked on the bytes the copy wrote) */
    int landed = 1;
    for (size_t i = off; landed && i < off + len; i++)
        landed = p[i] == pin[i];
    CHECKF(landed,
           "%s %zu MiB, %s: the device-to-host copy into the now writable mapping landed", kind, n >> 20,
           rname[how]);
    CHECKF(fakecuda_violations() == v0, "%s %zu MiB, %s: the driver saw no DMA write into a read-only "
           "registration (%lu)", kind, n >> 20, rname[how], fakecuda_violations() - v0);
    /* and the mapping, written by the host now, still goes to the device right */
    fill_pattern(p, n, seed + 2);
    CU(cuMemcpyHtoD(dev, p, n));
    CU(cuMemcpyDtoH(pin, dev, n));
    CHECKF(check_pattern(pin, n, seed + 2), "%s %zu MiB, %s: written by the host, copied to the device",
           kind, n >> 20, rname[how]);
    munmap(p, n);
}

int main(void)
{
    drvtest_init();
    printf("mode=%s\n", drvtest_mode());
    CU(cuMemAlloc(&dev, MAXN));
    CU(cuMemHostAlloc((void **)&pin, MAXN, 0));
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    /* An ordinary buffer first, copied often as programs do: a library that decides per buffer
     * what to pin has then made up its mind about the device before the read-only mappings. */
    unsigned char *warm = malloc(MAXN / 8);
    fill_pattern(warm, MAXN / 8, 1);
    for (int i = 0; i < 8; i++) CU(cuMemcpyHtoD(dev, warm, MAXN / 8));
    free(warm);
    static const size_t sizes[] = { (size_t)8 << 20, MAXN };
    for (int k = 0; k < 2; k++)
        for (int file = 1; file >= 0; file--)
            for (int how = 0; how < NREAD; how++) one(sizes[k], file, how);
    CU(cuCtxSynchronize());
    CU(cuStreamDestroy(s));
    CU(cuMemFreeHost(pin));
    CU(cuMemFree(dev));
    CHECKF(fakecuda_violations() == 0, "no violations (%lu)", fakecuda_violations());
    return TEST_SUMMARY();
}
