/* Helpers for the fake driver's own self-tests (tests/fake/test_fake_*.c). */
#ifndef FK_TEST_H
#define FK_TEST_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "fakecuda.h"
#include "testutil.h"

/* Expect a specific CUresult; names the check after the call. */
#define EXPECT_RC(call, want)                                                          \
    do {                                                                               \
        CUresult fk_r_ = (call);                                                       \
        CHECKF(fk_r_ == (want), "%s == %s (got %d)", #call, #want, (int)fk_r_);         \
    } while (0)

/* A call that must succeed for the test to make sense. */
#define MUST(call)                                                                     \
    do {                                                                               \
        CUresult fk_r_ = (call);                                                       \
        if (fk_r_ != CUDA_SUCCESS) {                                                   \
            printf("FAIL %s: returned %d at %s:%d\n", #call, (int)fk_r_, __FILE__, __LINE__); \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

static inline double fkt_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static inline CUcontext fkt_init(void)
{
    CUdevice dev;
    CUcontext ctx;
    MUST(cuInit(0));
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuDevicePrimaryCtxRetain(&ctx, dev));
    MUST(cuCtxSetCurrent(ctx));
    return ctx;
}

/* Read n device bytes back (sync, legacy) and check they all equal v. */
static inline int fkt_dev_all(CUdeviceptr d, size_t n, unsigned char v)
{
    unsigned char *b = malloc(n);
    int ok = cuMemcpyDtoH_v2(b, d, n) == CUDA_SUCCESS;
    for (size_t i = 0; ok && i < n; i++) ok = b[i] == v;
    free(b);
    return ok;
}

/* Run this program again as `prog scenario` with extra environment (NAME=VALUE strings, NULL
 * ended); its stdout+stderr go to out (NUL-terminated); returns the exit status, or 128+signal. */
static inline int fkt_run_self(const char *scenario, const char *const *env, char *out, size_t outlen)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/fkt_out_%d_XXXXXX", (int)getpid());
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    unlink(path);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        for (const char *const *e = env; e && *e; e++) putenv((char *)*e);
        dup2(fd, 1);
        dup2(fd, 2);
        execl("/proc/self/exe", "child", scenario, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    ssize_t n = pread(fd, out, outlen - 1, 0);
    while (n > 0 && out[n - 1] == '\n') n--;
    out[n > 0 ? n : 0] = 0;
    close(fd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Count of "fakecuda: VIOLATION" lines in a captured output. */
static inline int fkt_count(const char *out, const char *needle)
{
    int n = 0;
    for (const char *p = out; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}
#endif
