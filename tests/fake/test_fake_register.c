/* The fake driver's pinning rules: registration errors, host allocation, pointer attributes,
 * accounting (local and node-wide through FAKECUDA_SHM). */
#include "fk_test.h"
#include <pthread.h>
#include <sys/mman.h>

static CUresult thread_rc[2];
static void *no_ctx_thread(void *p)
{
    thread_rc[0] = cuMemHostRegister_v2(p, 4096, 0);
    thread_rc[1] = cuMemHostUnregister(p);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "noreg")) {
        fkt_init();
        int v = 7;
        MUST(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 0));
        void *p = malloc(8192);
        CUresult r = cuMemHostRegister_v2(p, 8192, 0);
        printf("attr=%d rc=%d\n", v, (int)r);
        free(p);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "shm")) {
        fkt_init();
        size_t n = 1 << 20;
        void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        MUST(cuMemHostRegister_v2(p, n, 0));
        /* Hold it until the sibling has registered too (a file in /tmp is the barrier). */
        const char *flag = getenv("FKT_FLAG");
        int fd = open(flag, O_CREAT | O_RDWR | O_APPEND, 0600);
        if (write(fd, "x", 1) != 1) return 2;
        for (int i = 0; i < 500; i++) {
            if (lseek(fd, 0, SEEK_END) >= 2) break;
            usleep(10000);
        }
        close(fd);
        printf("node_peak=%zu\n", fakecuda_node_registered_peak());
        MUST(cuMemHostUnregister(p));
        return 0;
    }

    CUcontext ctx = fkt_init();
    long pg = sysconf(_SC_PAGESIZE);
    size_t n = 256 * 1024;
    char *buf = mmap(NULL, 2 * n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    EXPECT_RC(cuMemHostRegister_v2(buf, n, 0), CUDA_SUCCESS);
    CHECK(fakecuda_registered(buf, 1) && fakecuda_registered(buf + n - 1, 1) && !fakecuda_registered(buf + n, 16));
    CHECK(fakecuda_registered_bytes() == n);
    EXPECT_RC(cuMemHostRegister_v2(buf + n / 2, n, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    EXPECT_RC(cuMemHostRegister_v2(buf + 100, 10, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    EXPECT_RC(cuMemHostRegister_v2(buf + n - 1, 2, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    EXPECT_RC(cuMemHostRegister_v2(buf + n, n, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP), CUDA_SUCCESS);
    CHECK(fakecuda_registered_bytes() == 2 * n && fakecuda_registered_bytes_peak() >= 2 * n);
    EXPECT_RC(cuMemHostUnregister(buf + 64), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemHostUnregister(buf + 2 * n + 64), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    char stackbuf[16];
    EXPECT_RC(cuMemHostUnregister(stackbuf), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    /* Each registration has a number of its own: the same for every byte it holds, none for
     * bytes outside, a new one when the range is registered again. */
    unsigned long long id1 = fakecuda_registration_id(buf), id2 = fakecuda_registration_id(buf + n);
    CHECK(id1 && id2 && id1 != id2 && fakecuda_registration_id(buf + n - 1) == id1 &&
          fakecuda_registration_id(buf + 2 * n) == 0);
    EXPECT_RC(cuMemHostUnregister(buf + n), CUDA_SUCCESS);
    CHECK(fakecuda_registration_id(buf + n) == 0);
    EXPECT_RC(cuMemHostRegister_v2(buf + n, n, 0), CUDA_SUCCESS);
    CHECK(fakecuda_registration_id(buf + n) && fakecuda_registration_id(buf + n) != id2);
    EXPECT_RC(cuMemHostUnregister(buf + n), CUDA_SUCCESS);
    EXPECT_RC(cuMemHostUnregister(buf + n), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    fakecuda_reset_registered_peak();
    CHECK(fakecuda_registered_bytes_peak() == n);

    /* Argument errors. */
    EXPECT_RC(cuMemHostRegister_v2(NULL, 16, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemHostRegister_v2(buf + n, 0, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemHostRegister_v2(buf + n, 16, 0x100), CUDA_ERROR_INVALID_VALUE);
    char *gone = mmap(NULL, 4 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(gone + pg, pg);
    EXPECT_RC(cuMemHostRegister_v2(gone, 4 * pg, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemHostRegister_v2(gone + 2 * pg, 2 * pg, 0), CUDA_SUCCESS);
    MUST(cuMemHostUnregister(gone + 2 * pg));
    char *ro = mmap(NULL, 2 * pg, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_RC(cuMemHostRegister_v2(ro, 2 * pg, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemHostRegister_v2(ro, 2 * pg, CU_MEMHOSTREGISTER_READ_ONLY), CUDA_SUCCESS);
    MUST(cuMemHostUnregister(ro));
    CUresult (*reg_v1)(void *, size_t, unsigned) = NULL;
    MUST(cuGetProcAddress_v2("cuMemHostRegister", (void **)&reg_v1, 4000, 0, NULL));
    EXPECT_RC(reg_v1(buf + n, 4096, 0), CUDA_SUCCESS);   /* the v1 symbol */
    MUST(cuMemHostUnregister(buf + n));

    /* Without a current context: INVALID_CONTEXT, as measured on the real driver. */
    pthread_t th;
    pthread_create(&th, NULL, no_ctx_thread, buf + n);
    pthread_join(th, NULL);
    CHECKF(thread_rc[0] == CUDA_ERROR_INVALID_CONTEXT, "register without a context: %d", (int)thread_rc[0]);
    CHECKF(thread_rc[1] == CUDA_ERROR_INVALID_CONTEXT, "unregister without a context: %d", (int)thread_rc[1]);

    /* Host allocations: pinned, not "registered", overlap-protected. */
    char *ha;
    MUST(cuMemHostAlloc((void **)&ha, 3 * pg, CU_MEMHOSTALLOC_PORTABLE));
    CHECK(!fakecuda_registered(ha, 3 * pg) && fakecuda_registered_bytes() == n);
    EXPECT_RC(cuMemHostRegister_v2(ha + pg, pg, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    EXPECT_RC(cuMemHostUnregister(ha), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    unsigned hf = 0;
    MUST(cuMemHostGetFlags(&hf, ha + 5));
    CHECK(hf == CU_MEMHOSTALLOC_PORTABLE);
    EXPECT_RC(cuMemFreeHost(buf), CUDA_ERROR_INVALID_VALUE);
    EXPECT_RC(cuMemFreeHost(ha + 1), CUDA_ERROR_INVALID_VALUE);
    void *ah;
    MUST(cuMemAllocHost_v2(&ah, 100));

    /* Pointer attributes. */
    CUdeviceptr d;
    MUST(cuMemAlloc_v2(&d, 1000));
    unsigned mt = 0;
    MUST(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + 10));
    CHECK(mt == CU_MEMORYTYPE_DEVICE);
    MUST(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)(buf + 7)));
    CHECK(mt == CU_MEMORYTYPE_HOST);
    MUST(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)ha));
    CHECK(mt == CU_MEMORYTYPE_HOST);
    EXPECT_RC(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)(buf + n)),
              CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr rs = 0;
    size_t rsz = 0;
    MUST(cuPointerGetAttribute(&rs, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, d + 10));
    MUST(cuPointerGetAttribute(&rsz, CU_POINTER_ATTRIBUTE_RANGE_SIZE, d + 10));
    CHECK(rs == d && rsz == 1000);
    CUcontext pc = NULL;
    MUST(cuPointerGetAttribute(&pc, CU_POINTER_ATTRIBUTE_CONTEXT, (CUdeviceptr)(uintptr_t)buf));
    CHECK(pc == ctx);
    void *hp = NULL;
    MUST(cuPointerGetAttribute(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, (CUdeviceptr)(uintptr_t)(buf + 3)));
    CHECK(hp == buf + 3);
    CUdeviceptr dp = 0;
    MUST(cuMemHostGetDevicePointer_v2(&dp, buf + 3, 0));
    CHECK(dp == (CUdeviceptr)(uintptr_t)(buf + 3));
    EXPECT_RC(cuMemHostGetDevicePointer_v2(&dp, buf + n, 0), CUDA_ERROR_INVALID_VALUE);
    CUpointer_attribute attrs[2] = { CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL };
    unsigned mt2 = 99;
    int ord = 99;
    void *data[2] = { &mt2, &ord };
    MUST(cuPointerGetAttributes(2, attrs, data, (CUdeviceptr)(uintptr_t)(buf + n)));
    CHECKF(mt2 == 0 && ord == 0, "cuPointerGetAttributes on pageable memory: zeros, success");

    /* A copy through a registered host range used as a device pointer (unified addressing). */
    memset(buf, 0x42, 64);
    MUST(cuMemcpyDtoD_v2(d, (CUdeviceptr)(uintptr_t)buf, 64));
    CHECK(fkt_dev_all(d, 64, 0x42));

    MUST(cuMemFreeHost(ha));
    MUST(cuMemFreeHost(ah));
    MUST(cuMemHostUnregister(buf));
    CHECK(fakecuda_registered_bytes() == 0);
    CHECKF(fakecuda_calls("cuMemHostUnregister") >= 10 && fakecuda_calls("cuMemHostRegister") == 1, "call counters (%lu unregister, %lu v1 register)", fakecuda_calls("cuMemHostUnregister"), fakecuda_calls("cuMemHostRegister"));

    /* FAKECUDA_NO_HOST_REGISTER=1. */
    char out[4096];
    const char *env1[] = { "FAKECUDA_NO_HOST_REGISTER=1", NULL };
    int st = fkt_run_self("noreg", env1, out, sizeof out);
    CHECKF(st == 0 && strstr(out, "attr=0 rc=801"), "FAKECUDA_NO_HOST_REGISTER=1: %s", out);

    /* Node-wide peak across two processes sharing FAKECUDA_SHM. */
    char shmenv[64], flagenv[64], flag[48];
    snprintf(shmenv, sizeof shmenv, "FAKECUDA_SHM=/fkt_shm_%d", (int)getpid());
    snprintf(flag, sizeof flag, "/tmp/fkt_flag_%d", (int)getpid());
    snprintf(flagenv, sizeof flagenv, "FKT_FLAG=%s", flag);
    unlink(flag);
    const char *env2[] = { shmenv, flagenv, NULL };
    char out2[4096];
    fflush(NULL);
    pid_t p2 = fork();
    if (p2 == 0) _exit(fkt_run_self("shm", env2, out2, sizeof out2) == 0 && strstr(out2, "node_peak=2097152") ? 0 : 1);
    st = fkt_run_self("shm", env2, out, sizeof out);
    int st2 = 0;
    waitpid(p2, &st2, 0);
    CHECKF(st == 0 && strstr(out, "node_peak=2097152") && WIFEXITED(st2) && WEXITSTATUS(st2) == 0,
           "FAKECUDA_SHM node peak counts both processes: %s", out);
    unlink(flag);
    shm_unlink(shmenv + strlen("FAKECUDA_SHM="));

    CHECK(fakecuda_violations() == 0);
    return TEST_SUMMARY();
}
