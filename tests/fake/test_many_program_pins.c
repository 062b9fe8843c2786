/* A program that pins 5,000 separate ranges itself (half from aligned_alloc, half from mmap),
 * copies through some of them, and unregisters and frees them all.  The shim records each range
 * in a growing array of its own; that array must come from its raw pages (base/os.c), never
 * from the program's malloc or mmap, or it would be tracked as one of the program's mappings.
 *   - every register and unregister succeeds, copies through pinned ranges are right;
 *   - registering adds no mappings to the process beyond a few (the shim's array), nor does
 *     unregistering;
 *   - at exit the shim tracks exactly the mappings the program still holds (KEEP of them,
 *     large enough to be tracked in every mode) and no program-pinned range: run_all.sh reads
 *     EXPECTED_TRACKING against the stats file's "tracking" object;
 *   - the program's own pinning calls are counted, bytes and all, and timed (EXPECTED_PINNING
 *     against the "program_pinning" object): the registrations above, HOST_ALLOCS host
 *     allocations of both entry points, their frees, and no failed call. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "drvtest.h"
#include "fakecuda.h"

/* Under a sanitizer the allocator maps regions of its own as the program and the fake driver
 * allocate (and the shim is not preloaded there): the process's mapping count then says nothing
 * about the shim, and is not checked. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MAPPINGS_COUNT 0
#else
#define MAPPINGS_COUNT 1
#endif

#define RANGES 5000
#define RANGE_BYTES 8192
#define KEEP 3
#define KEEP_BYTES (1u << 20)
#define HOST_ALLOCS 6

int main(void)
{
    drvtest_init();
    printf("mode=%s\n", drvtest_mode());
    CUdeviceptr dev;
    CU(cuMemAlloc(&dev, RANGE_BYTES));

    /* Mappings the program keeps to the end: what the shim must report, and nothing more. */
    void *keep[KEEP];
    int kept = 0;
    for (int i = 0; i < KEEP; i++) {
        keep[i] = mmap(NULL, KEEP_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (keep[i] != MAP_FAILED) {
            memset(keep[i], i + 1, KEEP_BYTES);
            kept++;
        }
    }
    CHECKF(kept == KEEP, "%d kept mappings of %u bytes", kept, KEEP_BYTES);

    static unsigned char *range[RANGES];
    int made = 0;
    for (int i = 0; i < RANGES; i++) {
        if (i % 2) {
            void *p = mmap(NULL, RANGE_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            range[i] = p == MAP_FAILED ? NULL : p;
        } else {
            /* Page-aligned, so that no two registrations share a page. */
            range[i] = aligned_alloc(4096, RANGE_BYTES);
        }
        made += range[i] != NULL;
    }
    CHECKF(made == RANGES, "%d ranges of %d bytes made", made, RANGE_BYTES);
    if (made != RANGES)
        return TEST_SUMMARY();

    /* The shim's own start (full mode: its staging buffers and copy threads, begun by the
     * device allocation above) maps memory and thread stacks when it gets to it: done first,
     * so that what the counts see is what registering does. */
    drvtest_wait_shim_settled();
    int before = test_count_mappings();
    int registered = 0;
    for (int i = 0; i < RANGES; i++)
        registered += cuMemHostRegister(range[i], RANGE_BYTES, 0) == CUDA_SUCCESS;
    CHECKF(registered == RANGES, "%d of %d program registrations succeeded", registered, RANGES);
    int during = test_count_mappings();
    /* The shim's array of 5,000 ranges is one mapping (or none, merged with a neighbour). */
    if (MAPPINGS_COUNT)
        CHECKF(during - before <= 4, "registering added %d mappings (%d -> %d), at most 4", during - before,
               before, during);

    int copies_ok = 1;
    for (int k = 0; k < 4; k++) {
        int i = k * (RANGES - 1) / 3;   /* the first, the last, two between */
        fill_pattern(range[i], RANGE_BYTES, (unsigned)i);
        CU(cuMemcpyHtoD(dev, range[i], RANGE_BYTES));
        memset(range[i], 0, RANGE_BYTES);
        CU(cuMemcpyDtoH(range[i], dev, RANGE_BYTES));
        copies_ok &= check_pattern(range[i], RANGE_BYTES, (unsigned)i);
    }
    CHECKF(copies_ok, "copies through 4 program-pinned ranges are right");
    CHECKF(fakecuda_registered(range[0], RANGE_BYTES) && fakecuda_registered(range[RANGES - 1], RANGE_BYTES),
           "the driver holds the program's registrations");

    drvtest_wait_shim_settled();   /* the copies may have started threads of the shim's */
    int mid = test_count_mappings();
    int unregistered = 0;
    for (int i = 0; i < RANGES; i++)
        unregistered += cuMemHostUnregister(range[i]) == CUDA_SUCCESS;
    CHECKF(unregistered == RANGES, "%d of %d unregisters succeeded", unregistered, RANGES);
    CHECKF(!fakecuda_registered(range[0], RANGE_BYTES), "nothing of the program's left registered");
    for (int i = 0; i < RANGES; i++) {
        if (i % 2)
            munmap(range[i], RANGE_BYTES);
        else
            free(range[i]);
    }
    int after = test_count_mappings();
    if (MAPPINGS_COUNT)
        CHECKF(after - mid <= 2, "unregistering and freeing added %d mappings (%d -> %d), at most 2",
               after - mid, mid, after);

    /* The program's own pinned allocations, of both entry points; failed calls are not counted. */
    unsigned long long host_bytes = 0;
    for (int i = 0; i < HOST_ALLOCS; i++) {
        void *h = NULL;
        size_t bytes = (size_t)(i + 1) * 12288 + 100;
        CUresult r = i % 2 ? cuMemAllocHost(&h, bytes) : cuMemHostAlloc(&h, bytes, CU_MEMHOSTALLOC_PORTABLE);
        CHECKF(r == CUDA_SUCCESS && h, "host allocation %d of %zu bytes (%d)", i, bytes, (int)r);
        host_bytes += bytes;
        if (h) {
            memset(h, i, bytes);
            CU(cuMemFreeHost(h));
        }
    }
    void *none = NULL;
    CHECKF(cuMemHostAlloc(&none, 4096, 0xff00) == CUDA_ERROR_INVALID_VALUE, "a host allocation with unknown flags fails");
    CHECKF(cuMemHostUnregister(range[0]) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
           "an unregister of memory no longer registered fails");

    CU(cuCtxSynchronize());
    CU(cuMemFree(dev));
    CHECKF(fakecuda_violations() == 0, "no violations (%lu)", fakecuda_violations());
    printf("EXPECTED_COPIES h2d=4 d2h=4\n");
    /* The doors count every call, the failed unregister too. */
    printf("EXPECTED_ENTRIES cuMemHostRegister_v2=%d cuMemHostUnregister=%d cuMemHostAlloc=%d "
           "cuMemAllocHost_v2=%d cuMemFreeHost=%d\n", RANGES, RANGES + 1, HOST_ALLOCS / 2 + 1,
           HOST_ALLOCS / 2, HOST_ALLOCS);
    printf("EXPECTED_TRACKING program_mappings=%d program_ranges=0\n", KEEP);
    printf("EXPECTED_PINNING host_allocs=%d host_alloc_bytes=%llu host_frees=%d registers=%d "
           "registered_bytes=%llu unregisters=%d\n", HOST_ALLOCS, host_bytes, HOST_ALLOCS, RANGES,
           (unsigned long long)RANGES * RANGE_BYTES, RANGES);
    return TEST_SUMMARY();
}
