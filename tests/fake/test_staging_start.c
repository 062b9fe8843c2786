/* A process's first large copies: eight one-shot 8 MiB H2D copies (each from its own part of a
 * 64 MiB buffer, as a model's tensors are loaded), and eight D2H into another, right after the
 * context is made.  Every byte lands; and where the shim stages (mode full, its defaults), the
 * first copy already is staged: it waits for the staging buffers being built rather than take
 * the driver's path, which on a real driver kept the building thread out behind back-to-back
 * copies (EXPECTED_STAGED, checked by run_all.sh against the stats file: on a machine so loaded
 * that building takes longer than the wait's 100 ms bound, a copy not staged must have waited
 * that long). */
#include "drvtest.h"

#define PART (8u << 20)
#define PARTS 8

int main(void)
{
    drvtest_init();
    const size_t n = (size_t)PART * PARTS;
    unsigned char *src = malloc(n), *dst = malloc(n);
    CHECK(src != NULL && dst != NULL);
    fill_pattern(src, n, 3);
    CUdeviceptr dev;
    CU(cuMemAlloc(&dev, n));
    for (unsigned i = 0; i < PARTS; i++)
        CU(cuMemcpyHtoD(dev + (size_t)i * PART, src + (size_t)i * PART, PART));
    for (unsigned i = 0; i < PARTS; i++)
        CU(cuMemcpyDtoH(dst + (size_t)i * PART, dev + (size_t)i * PART, PART));
    CHECKF(check_pattern(dst, n, 3), "%u one-shot copies each way: every byte lands", PARTS);
    CU(cuMemFree(dev));
    free(src);
    free(dst);
    printf("EXPECTED_COPIES h2d=%u d2h=%u d2d=0\n", PARTS, PARTS);
    const char *budget = getenv("PINSHIM_BUDGET"), *min = getenv("PINSHIM_STAGING_MIN");
    if (!strcmp(drvtest_mode(), "full") && !budget && !min)
        printf("EXPECTED_STAGED copies=%u\n", 2 * PARTS);
    return TEST_SUMMARY();
}
