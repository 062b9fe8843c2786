/* A checkpoint of many tensors of one size, written twice: each round's CPU copies are freed
 * together, in one burst far faster than the registrar registers them (each registration here
 * takes 3 ms, so that the small tensors of the test outrun it as a real checkpoint's large ones
 * outrun a real registrar).
 *
 * Every round's bytes land.  Where the shim promotes: the first round's allocations miss the
 * pinned cache, and those misses size what the size keeps cached on free, so every block of the
 * burst is queued, registered and cached, and every destination of the second round is a
 * registered block when the program gets it.  A registrar's queue shorter than the burst loses
 * the blocks past its end. */
#include "drvtest.h"
#include "fakecuda.h"

#define TENSORS 96
#define TENSOR_BYTES (512u << 10)

int main(void)
{
    drvtest_init();
    fakecuda_set_register_delay_us(3000);
    CUdeviceptr dev[TENSORS];
    unsigned char *src = malloc(TENSOR_BYTES);
    CHECK(src != NULL);
    for (int i = 0; i < TENSORS; i++) {
        fill_pattern(src, TENSOR_BYTES, (unsigned)i);
        CU(cuMemAlloc(&dev[i], TENSOR_BYTES));
        CU(cuMemcpyHtoD(dev[i], src, TENSOR_BYTES));
    }
    free(src);
    int ok = 1;
    int registered_on_arrival[2] = { 0 };
    for (int r = 0; r < 2; r++) {
        drvtest_wait_registrations_settled();
        unsigned char *out[TENSORS];
        for (int i = 0; i < TENSORS; i++) {
            out[i] = malloc(TENSOR_BYTES);
            CHECK(out[i] != NULL);
            registered_on_arrival[r] += fakecuda_registered(out[i], TENSOR_BYTES);
            CU(cuMemcpyDtoH(out[i], dev[i], TENSOR_BYTES));
        }
        for (int i = 0; i < TENSORS; i++)
            ok &= check_pattern(out[i], TENSOR_BYTES, (unsigned)i);
        for (int i = 0; i < TENSORS; i++)   /* the burst */
            free(out[i]);
        printf("info: round %d: %d of %d destinations registered when allocated\n", r + 1,
               registered_on_arrival[r], TENSORS);
    }
    CHECKF(ok, "every round's copies carry the model's bytes");
    if (drvtest_expect_promotion(TENSOR_BYTES))
        CHECKF(registered_on_arrival[1] == TENSORS,
               "the second round's destinations all come registered from the pinned cache (%d of %d)",
               registered_on_arrival[1], TENSORS);
    drvtest_wait_registrations_settled();
    fakecuda_set_register_delay_us(0);
    for (int i = 0; i < TENSORS; i++)
        CU(cuMemFree(dev[i]));
    printf("EXPECTED_COPIES h2d=%d d2h=%d d2d=0\n", TENSORS, TENSORS * 2);
    return TEST_SUMMARY();
}
