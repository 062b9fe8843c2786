/* A process's first large copy, from a resident 64 MiB block copied whole: the staging buffers
 * are not built yet (their thread starts at this copy), and registering the block pays for
 * itself on this one copy (64 MiB at the driver's pageable rate against pinned, 5 ms, for a
 * 2.8 ms registration), so where the shim promotes (pin, full; default budget) the block is
 * registered on the copy's path rather than the copy waiting for the staging buffers: registered
 * as soon as the call returns.  The copies after it run on the registration; every byte lands. */
#include "drvtest.h"

int main(void)
{
    drvtest_init();
    const size_t n = 64u << 20;
    unsigned char *buf = malloc(n), *back = malloc(n);
    CHECK(buf != NULL && back != NULL);
    fill_pattern(buf, n, 21);
    memset(back, 0, n);   /* resident too */
    CUdeviceptr dev;
    CU(cuMemAlloc(&dev, n));
    CU(cuMemcpyHtoD(dev, buf, n));
    int registered = fakecuda_registered(buf, n);
    printf("info: registered after the first copy: %d\n", registered);
    if (drvtest_expect_promotion(n))
        CHECKF(registered, "the first copy of a resident 64 MiB block registers it on its path");
    else
        CHECKF(!registered, "not registered where the shim may not promote (mode %s)", drvtest_mode());
    CU(cuMemcpyDtoH(back, dev, n));
    CHECKF(check_pattern(back, n, 21), "the first copy's bytes land");
    fill_pattern(buf, n, 22);
    CU(cuMemcpyHtoD(dev, buf, n));
    CU(cuMemcpyDtoH(back, dev, n));
    CHECKF(check_pattern(back, n, 22), "the next round trip's bytes land");
    CU(cuMemFree(dev));
    free(buf);
    free(back);
    printf("EXPECTED_COPIES h2d=2 d2h=2 d2d=0\n");
    return TEST_SUMMARY();
}
