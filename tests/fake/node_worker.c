/* One rank of tests/check_node_budget.sh (not a test_* program: it needs that script's
 * environment).  Four hot 16 MiB malloc buffers, each filled, copied H2D, cleared, copied back
 * and checked, over and over, so that the preloaded shim wants to pin all of them.
 *
 *   node_worker run ITERATIONS   copy, then print what it saw and exit (0 = data right, no
 *                                violations)
 *   node_worker hold             copy until the shim has pinned what it can, print HELD <n>,
 *                                then wait to be killed
 *
 * Output lines: PROMOTED <buffers registered at the end>, LOCAL_PEAK <bytes>, NODE_PEAK <bytes
 * registered at once over every process sharing FAKECUDA_SHM>, DATA ok|bad, VIOLATIONS <n>. */
#define _GNU_SOURCE
#include <signal.h>
#include <unistd.h>
#include "drvtest.h"
#include "fakecuda.h"

#define NBUF 4
#define BUF_BYTES (16u << 20)

static unsigned char *bufs[NBUF];
static CUdeviceptr dev;
static int data_ok = 1;

static void round_trip(unsigned seed)
{
    for (int i = 0; i < NBUF; i++) {
        fill_pattern(bufs[i], BUF_BYTES, seed + (unsigned)i);
        CU(cuMemcpyHtoD(dev, bufs[i], BUF_BYTES));
        memset(bufs[i], 0, BUF_BYTES);
        CU(cuMemcpyDtoH(bufs[i], dev, BUF_BYTES));
        if (!check_pattern(bufs[i], BUF_BYTES, seed + (unsigned)i))
            data_ok = 0;
    }
}

static int promoted(void)
{
    int n = 0;
    for (int i = 0; i < NBUF; i++)
        n += fakecuda_registered(bufs[i], BUF_BYTES);
    return n;
}

int main(int argc, char **argv)
{
    int hold = argc > 1 && !strcmp(argv[1], "hold");
    int iterations = argc > 2 ? atoi(argv[2]) : 8;
    drvtest_init();
    CU(cuMemAlloc(&dev, BUF_BYTES));
    for (int i = 0; i < NBUF; i++) {
        bufs[i] = malloc(BUF_BYTES);
        if (!bufs[i]) {
            printf("FAIL malloc\n");
            return 1;
        }
    }
    unsigned seed = (unsigned)getpid();
    if (hold) {
        /* Until the pinned set stops growing for a few rounds: the shim has what it can get. */
        int best = 0, still = 0;
        for (int it = 0; it < 40 && still < 3; it++) {
            round_trip(seed + (unsigned)it * 16);
            int p = promoted();
            still = p > best ? 0 : still + 1;
            if (p > best)
                best = p;
        }
        printf("HELD %d\nDATA %s\n", promoted(), data_ok ? "ok" : "bad");
        fflush(stdout);
        for (;;)
            pause();
    }
    for (int it = 0; it < iterations; it++)
        round_trip(seed + (unsigned)it * 16);
    printf("PROMOTED %d\nLOCAL_PEAK %zu\nNODE_PEAK %zu\nDATA %s\nVIOLATIONS %lu\n", promoted(),
           fakecuda_registered_bytes_peak(), fakecuda_node_registered_peak(), data_ok ? "ok" : "bad",
           fakecuda_violations());
    for (int i = 0; i < NBUF; i++)
        free(bufs[i]);
    CU(cuMemFree(dev));
    return data_ok && fakecuda_violations() == 0 ? 0 : 1;
}
