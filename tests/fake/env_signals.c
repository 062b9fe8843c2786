/* Signals while copying (tests/check_hostile_env.sh): a SIGALRM handler fires every millisecond
 * (setitimer, no SA_RESTART, so interruptible system calls see EINTR) while the program makes
 * 200 rounds of sync and async copies of several sizes, pageable and hot.  Every call must return
 * CUDA_SUCCESS (the driver deals with EINTR, and so must the shim), the data must be right, and
 * nothing may hang.  stdout does not depend on the number of signals. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>
#include "drvtest.h"
#include "fakecuda.h"

static volatile sig_atomic_t ticks;

static void on_alarm(int sig)
{
    (void)sig;
    int saved = errno;
    ticks++;
    errno = saved;
}

int main(void)
{
    drvtest_init();
    static const size_t sizes[] = { 4u << 10, 256u << 10, 2u << 20, 6u << 20 };
    enum { NS = sizeof sizes / sizeof sizes[0] };
    const size_t max = 6u << 20;
    CUdeviceptr dev;
    CUstream s;
    CU(cuMemAlloc(&dev, max));
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    unsigned char *hot[NS], *back = malloc(max);
    for (int i = 0; i < NS; i++)
        hot[i] = malloc(sizes[i]);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;   /* no SA_RESTART */
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = { { 0, 1000 }, { 0, 1000 } };
    setitimer(ITIMER_REAL, &it, NULL);

    int ok = 1, calls_ok = 1;
    for (unsigned round = 0; round < 200; round++) {
        int k = (int)(round % NS);
        size_t len = sizes[k];
        /* A fresh (cold) buffer now and then, besides the hot ones. */
        unsigned char *src = (round % 10 == 9) ? malloc(len) : hot[k];
        fill_pattern(src, len, round);
        CUresult r;
        if (round % 2 == 0) {
            r = cuMemcpyHtoD(dev, src, len);
            calls_ok &= r == CUDA_SUCCESS;
            memset(back, 0, len);
            r = cuMemcpyDtoH(back, dev, len);
            calls_ok &= r == CUDA_SUCCESS;
        } else {
            r = cuMemcpyHtoDAsync(dev, src, len, s);
            calls_ok &= r == CUDA_SUCCESS;
            memset(back, 0, len);
            r = cuMemcpyDtoHAsync(back, dev, len, s);
            calls_ok &= r == CUDA_SUCCESS;
            r = cuStreamSynchronize(s);
            calls_ok &= r == CUDA_SUCCESS;
        }
        ok &= check_pattern(back, len, round);
        if (src != hot[k])
            free(src);
    }
    struct itimerval off = { { 0, 0 }, { 0, 0 } };
    setitimer(ITIMER_REAL, &off, NULL);

    CHECKF(calls_ok, "every copy call returned CUDA_SUCCESS");
    CHECKF(ok, "data right after 200 interrupted rounds");
    CHECKF(ticks > 0, "the timer fired");
    CHECK(fakecuda_violations() == 0);
    CU(cuStreamDestroy(s));
    CU(cuMemFree(dev));
    for (int i = 0; i < NS; i++)
        free(hot[i]);
    free(back);
    return TEST_SUMMARY();
}
