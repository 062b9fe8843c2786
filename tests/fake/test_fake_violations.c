/* Each violation kind the fake driver exists to catch, provoked in a child process; plus the
 * cases that must NOT count (stream-ordered writes to a pinned source, pageable reuse). */
#include "fk_test.h"
#include <sys/mman.h>

#define N (256 * 1024)
static CUstream s;
static CUdeviceptr d;

static char *map_reg(void)
{
    char *p = mmap(NULL, N, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(p, 1, N);
    MUST(cuMemHostRegister_v2(p, N, 0));
    return p;
}

static void CUDA_CB refill(void *p) { memset(p, 9, N); }

static int scenario(const char *name)
{
    fkt_init();
    MUST(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    MUST(cuMemAlloc_v2(&d, N));
    if (!strcmp(name, "clean")) {
        char *p = map_reg();
        MUST(cuMemcpyHtoDAsync_v2(d, p, N, s));
        MUST(cuMemcpyDtoHAsync_v2(p, d, N, s));
        MUST(cuStreamSynchronize(s));
        memset(p, 2, N);                               /* after the sync: fine */
        MUST(cuMemHostUnregister(p));
        munmap(p, N);
        char *pg = malloc(N);
        memset(pg, 3, N);
        MUST(cuMemcpyHtoDAsync_v2(d, pg, N, s));
        memset(pg, 4, N);                              /* pageable: staged, fine */
        free(pg);
    } else if (!strcmp(name, "unmapped_dma")) {        /* 1: pinned DMA into vanished memory */
        char *p = map_reg();
        MUST(fakecuda_launch_write(s, d, 0, 0, 100000));
        MUST(cuMemcpyDtoHAsync_v2(p, d, N, s));
        munmap(p, N);
    } else if (!strcmp(name, "unregistered_dma")) {    /* 1: graph node pinned at capture */
        char *p = map_reg();
        CUgraph g;
        CUgraphExec x;
        MUST(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
        MUST(cuMemcpyHtoDAsync_v2(d, p, N, s));
        MUST(cuStreamEndCapture(s, &g));
        MUST(cuGraphInstantiateWithFlags(&x, g, 0));
        MUST(cuMemHostUnregister(p));
        MUST(cuGraphLaunch(x, s));
        MUST(cuStreamSynchronize(s));
    } else if (!strcmp(name, "unregister_busy")) {     /* 2: then waits, returns success */
        char *p = map_reg();
        memset(p, 0x3c, N);
        MUST(fakecuda_launch_write(s, d, 0, 0, 100000));
        MUST(cuMemcpyHtoDAsync_v2(d, p, N, s));
        double t0 = fkt_ms();
        CUresult r = cuMemHostUnregister(p);
        printf("unregister rc=%d waited=%d data=%d\n", (int)r, fkt_ms() - t0 >= 80, fkt_dev_all(d, N, 0x3c));
    } else if (!strcmp(name, "freehost_busy")) {       /* 2 via cuMemFreeHost */
        char *h;
        MUST(cuMemHostAlloc((void **)&h, N, 0));
        MUST(fakecuda_launch_write(s, d, 0, 0, 100000));
        MUST(cuMemcpyDtoHAsync_v2(h, d, N, s));
        printf("freehost rc=%d\n", (int)cuMemFreeHost(h));
    } else if (!strcmp(name, "source_changed")) {      /* 3 */
        char *p = map_reg();
        MUST(fakecuda_launch_write(s, d, 0, 0, 100000));
        MUST(cuMemcpyHtoDAsync_v2(d, p, N, s));
        p[N / 2] ^= 1;                                 /* before the DMA read it */
        MUST(cuStreamSynchronize(s));
        MUST(cuMemHostUnregister(p));
    } else if (!strcmp(name, "ordered_writes")) {      /* no 3: writes in stream order */
        char *p = map_reg();
        MUST(fakecuda_launch_write(s, d, 0x44, N, 50000));
        MUST(cuMemcpyDtoHAsync_v2(p, d, N, s));        /* DMA writes p ... */
        MUST(cuMemcpyHtoDAsync_v2(d, p, N, s));        /* ... then reads it */
        MUST(cuLaunchHostFunc(s, refill, p));          /* a host function writes p ... */
        MUST(cuMemcpyHtoDAsync_v2(d, p, N, s));        /* ... then it is read */
        MUST(cuStreamSynchronize(s));
        printf("data=%d\n", fkt_dev_all(d, N, 9));
        MUST(cuMemHostUnregister(p));
    } else if (!strcmp(name, "unmapped_registered")) { /* 4: at exit */
        char *p = map_reg();
        munmap(p, N);
    } else {
        return 99;
    }
    printf("violations=%lu\n", fakecuda_violations());
    return 0;
}

static void run(const char *name, int exit0, int want_rc, const char *want_out, int min_v, int max_v)
{
    char out[16384];
    const char *env0[] = { "FAKECUDA_EXIT_STATUS=0", NULL };
    const char *env_nocheck[] = { "FAKECUDA_EXIT_STATUS=0", "FAKECUDA_CHECK_SOURCE=0", NULL };
    int rc;
    if (exit0 == 2) rc = fkt_run_self(name, env_nocheck, out, sizeof out);
    else rc = fkt_run_self(name, exit0 ? env0 : NULL, out, sizeof out);
    int v = fkt_count(out, "fakecuda: VIOLATION:");
    int ok = rc == want_rc && v >= min_v && v <= max_v && (!want_out || strstr(out, want_out));
    CHECKF(ok, "%s%s: exit %d, %d violation line(s)%s", name, exit0 == 2 ? " (FAKECUDA_CHECK_SOURCE=0)" : "",
           rc, v, ok ? "" : "");
    if (!ok) printf("---- output of %s ----\n%s\n----\n", name, out);
}

int main(int argc, char **argv)
{
    if (argc > 1) return scenario(argv[1]);
    run("clean", 0, 0, "violations=0", 0, 0);
    run("unmapped_dma", 1, 0, "no longer mapped", 1, 3);
    run("unregistered_dma", 1, 0, "no longer registered", 1, 1);
    run("unregister_busy", 1, 0, "unregister rc=0 waited=1 data=1", 1, 1);
    run("unregister_busy", 0, 86, "fakecuda: 1 violation(s)", 1, 1);
    run("freehost_busy", 1, 0, "freehost rc=0", 1, 1);
    run("source_changed", 1, 0, "pinned source changed", 1, 1);
    run("source_changed", 2, 0, "violations=0", 0, 0);
    run("ordered_writes", 1, 0, "data=1", 0, 0);
    run("unmapped_registered", 1, 0, "unmapped while still registered", 1, 1);
    run("unmapped_registered", 0, 86, "fakecuda: 1 violation(s)", 1, 1);
    return TEST_SUMMARY();
}
