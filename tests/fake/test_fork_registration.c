/* Rule 8 under load: fork while another thread is in the middle of registering or unregistering
 * a block (promotion by a copy, release by madvise).  The child then frees that block and others
 * and must neither hang nor call the driver.  A child that takes longer than 10 s fails. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "drvtest.h"
#include "fakecuda.h"

#define N (4u << 20)
static unsigned char *shared_block;
static volatile int stop;
static CUcontext ctx;
static int worker_ok = 1;

/* Promote the block (copies) and give the registration up again (madvise), over and over: the
 * shim spends much of this loop inside a registration change. */
static void *churn(void *arg)
{
    (void)arg;
    CU(cuCtxSetCurrent(ctx));
    CUdeviceptr dev;
    CU(cuMemAlloc(&dev, N));
    unsigned seed = 1;
    while (!stop) {
        fill_pattern(shared_block, N, seed);
        for (int i = 0; i < 3; i++)
            CU(cuMemcpyHtoD(dev, shared_block, N));
        memset(shared_block, 0, N);
        CU(cuMemcpyDtoH(shared_block, dev, N));
        if (!check_pattern(shared_block, N, seed))
            worker_ok = 0;
        madvise(shared_block, N, MADV_DONTNEED);
        seed++;
    }
    cuMemFree(dev);
    return NULL;
}

int main(void)
{
    ctx = drvtest_init();
    shared_block = malloc(N);
    unsigned char *other = malloc(N);
    memset(other, 1, N);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, churn, NULL) == 0);
    int hung = 0, bad = 0;
    for (int round = 0; round < 40; round++) {
        usleep(2000 + (unsigned)round * 97);
        pid_t pid = fork();
        if (pid == 0) {
            /* The child: free what the parent's threads were using; no driver calls.  The
             * counters are read here: the parent's other thread may call the driver up to the
             * moment of the fork. */
            unsigned long unregisters = fakecuda_calls("cuMemHostUnregister");
            unsigned long registers = fakecuda_calls("cuMemHostRegister_v2");
            free(shared_block);
            free(other);
            void *p = malloc(N);
            memset(p, 2, N);
            free(p);
            _exit(fakecuda_calls("cuMemHostUnregister") == unregisters &&
                          fakecuda_calls("cuMemHostRegister_v2") == registers ? 0 : 3);
        }
        int status = 0;
        struct timespec start, now;
        clock_gettime(CLOCK_MONOTONIC, &start);
        for (;;) {
            pid_t w = waitpid(pid, &status, WNOHANG);
            if (w == pid)
                break;
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (now.tv_sec - start.tv_sec > 10) {
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
                hung++;
                break;
            }
            usleep(1000);
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            bad++;
    }
    stop = 1;
    pthread_join(t, NULL);
    CHECKF(hung == 0, "no child hung after a fork during registration changes (%d hung)", hung);
    CHECKF(bad == 0, "every child freed the parent's blocks without calling the driver (%d failed)", bad);
    CHECK(worker_ok);
    CHECK(fakecuda_violations() == 0);
    free(other);
    free(shared_block);
    return TEST_SUMMARY();
}
