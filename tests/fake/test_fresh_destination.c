/* D2H copies into never-touched memory, which staging faults in over the copy threads while the
 * first DMAs run (copy/staging.c, prefault_destination): a fresh malloc block, a range that
 * begins and ends inside pages of a fresh mapping, a shared file mapping (the file must hold the
 * bytes too), an async copy on a stream, rows with gaps (2D: never prefaulted, only the rows
 * written), and a destination whose first page the program touched (left to the pieces).  Every
 * byte lands, and nothing beyond the destination changes.
 * EXPECTED_PREFAULT: at most the contiguous fresh destinations' pages; all of them where every
 * copy was staged. */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#include "drvtest.h"

#define M (1u << 20)
#define PAGE 4096u

static CUdeviceptr dev;
static const size_t dev_len = 32 * M;
static size_t prefault_pages;   /* pages of the contiguous fresh destinations */

static size_t pages_of(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(PAGE - 1), b = ((uintptr_t)p + n + PAGE - 1) & ~(uintptr_t)(PAGE - 1);
    return (b - a) / PAGE;
}

/* dst must hold the device's first n bytes; the `guard` bytes either side must still be zero. */
static void check_landed(const char *what, const unsigned char *dst, size_t n, size_t guard)
{
    CHECKF(check_pattern(dst, n, 31), "%s: every byte lands", what);
    size_t stray = 0;
    for (size_t i = 1; i <= guard; i++)
        stray += (dst[-(ptrdiff_t)i] != 0) + (dst[n - 1 + i] != 0);
    CHECKF(stray == 0, "%s: %zu bytes beyond the destination changed", what, stray);
}

int main(void)
{
    drvtest_init();
    CU(cuMemAlloc(&dev, dev_len));
    unsigned char *pinned;
    CU(cuMemAllocHost((void **)&pinned, dev_len));
    fill_pattern(pinned, dev_len, 31);
    CU(cuMemcpyHtoD(dev, pinned, dev_len));
    CU(cuMemFreeHost(pinned));
    size_t d2h = 0;

    /* A fresh malloc block, copied whole. */
    size_t n = 24 * M;
    unsigned char *a = malloc(n);
    CHECK(a != NULL);
    CU(cuMemcpyDtoH(a, dev, n));
    d2h++;
    prefault_pages += pages_of(a, n);
    CHECKF(check_pattern(a, n, 31), "fresh malloc block: every byte lands");
    free(a);

    /* Inside a fresh mapping: the range begins 3 pages and 100 bytes in and ends inside a page. */
    size_t map_len = 16 * M;
    unsigned char *map = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(map != MAP_FAILED);
    unsigned char *b = map + 3 * PAGE + 100;
    n = 9 * M + 777;
    CU(cuMemcpyDtoH(b, dev, n));
    d2h++;
    prefault_pages += pages_of(b, n);
    check_landed("unaligned range in a fresh mapping", b, n, 100);
    munmap(map, map_len);

    /* A shared file mapping: the file holds the bytes once synced. */
    FILE *f = tmpfile();
    CHECK(f != NULL);
    int fd = fileno(f);
    n = 8 * M;
    CHECK(ftruncate(fd, (off_t)n) == 0);
    unsigned char *c = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(c != MAP_FAILED);
    CU(cuMemcpyDtoH(c, dev, n));
    d2h++;
    prefault_pages += pages_of(c, n);
    CHECKF(check_pattern(c, n, 31), "shared file mapping: every byte lands");
    CHECK(msync(c, n, MS_SYNC) == 0);
    unsigned char *back = malloc(n);
    CHECK(back != NULL && pread(fd, back, n, 0) == (ssize_t)n);
    CHECKF(check_pattern(back, n, 31), "shared file mapping: the file holds the bytes");
    free(back);
    munmap(c, n);
    fclose(f);

    /* An async copy on a stream, read after the stream's synchronize. */
    CUstream s;
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    n = 12 * M;
    unsigned char *d = malloc(n);
    CHECK(d != NULL);
    CU(cuMemcpyDtoHAsync(d, dev, n, s));
    CU(cuStreamSynchronize(s));
    d2h++;
    prefault_pages += pages_of(d, n);
    CHECKF(check_pattern(d, n, 31), "async copy into a fresh block: every byte lands");
    free(d);
    CU(cuStreamDestroy(s));

    /* Rows with gaps: 64 rows of 96 KiB, 128 KiB apart; the gaps stay zero. */
    size_t width = 96 * 1024, pitch = 128 * 1024, rows = 64;
    unsigned char *e = mmap(NULL, pitch * rows, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(e != MAP_FAILED);
    CUDA_MEMCPY2D m;
    memset(&m, 0, sizeof m);
    m.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    m.srcDevice = dev;
    m.srcPitch = width;
    m.dstMemoryType = CU_MEMORYTYPE_HOST;
    m.dstHost = e;
    m.dstPitch = pitch;
    m.WidthInBytes = width;
    m.Height = rows;
    CU(cuMemcpy2D(&m));
    d2h++;
    size_t bad_rows = 0, gap_bytes = 0;
    for (size_t r = 0; r < rows; r++) {
        const unsigned char *row = e + r * pitch;
        for (size_t i = 0; i < width; i++)
            if (row[i] != (unsigned char)(31 * 131u + (r * width + i) * 7u + ((r * width + i) >> 12))) {
                bad_rows++;
                break;
            }
        for (size_t i = width; i < pitch; i++)
            gap_bytes += row[i] != 0;
    }
    CHECKF(bad_rows == 0 && gap_bytes == 0, "rows with gaps: %zu rows wrong, %zu gap bytes changed", bad_rows,
           gap_bytes);
    munmap(e, pitch * rows);

    /* The program touched the first page: no prefault, the pieces fault the rest in. */
    n = 10 * M;
    unsigned char *g = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(g != MAP_FAILED);
    g[0] = 1;
    CU(cuMemcpyDtoH(g, dev, n));
    d2h++;
    CHECKF(check_pattern(g, n, 31), "first page touched: every byte lands");
    munmap(g, n);

    CU(cuMemFree(dev));
    printf("EXPECTED_COPIES h2d=1 d2h=%zu d2d=0\n", d2h);
    printf("EXPECTED_PREFAULT bytes=%zu\n", prefault_pages * PAGE);
    return TEST_SUMMARY();
}
