// program_pinning.cu: contract rule 5, the program's own pinning always works (and rule 3,
// its error codes are the original's).
//
//   register_promoted      malloc'd buffer made hot (the shim has promoted it), then the program
//                          cudaHostRegister's all of it: cudaSuccess, truly async copies work,
//                          cudaHostUnregister: cudaSuccess, copies still work; twice over
//   register_subrange      a page-aligned interior sub-range of a promoted buffer; copies over
//                          the whole buffer (straddling the registered part) stay correct
//   register_straddle      mmap'd region, the first half made hot, the program registers a range
//                          straddling the hot part's end, then the whole region
//   register_mapped        cudaHostRegisterMapped on a promoted buffer: device pointer, kernels
//                          read and write host memory directly
//   over_budget            the program registers 128 MiB (more than PINSHIM_BUDGET=64M)
//   error_codes            register twice, register an overlapping interior range, unregister an
//                          interior pointer, unregister a buffer the program never registered
//                          (but the shim promoted), register cudaMallocHost memory: every code is
//                          printed as an OBSERVE line and must equal the run without the shim
//   malloc_host            cudaMallocHost / cudaHostAlloc memory: copies (sync and async),
//                          flags, cudaFreeHost, then a new malloc of the same size
#include "common.cuh"

static uint8_t *d, *d2;
static cudaStream_t s;
static uint32_t g_seed = 20000;
static const size_t DCAP = 128 * MiB + 64 * KiB;

// Round trip through a kernel using async copies on s (valid for any memory; synced before checks).
static void roundtrip(uint8_t *h, size_t n, const char *label)
{
    uint32_t seed = g_seed++;
    uint8_t salt = (uint8_t)(seed * 3 + 1);
    fill(h, n, seed);
    CK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s));
    launch_xform(d2, d, n, salt, s);
    CK(cudaMemcpyAsync(h, d2, n, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    verify_xf(h, n, seed, salt, label);
    // and sync copies
    seed = g_seed++;
    fill(h, n, seed);
    CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    memset(h, 0, n);
    CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
    verify_pat(h, n, seed, label);
}

static void observe(const char *key, cudaError_t e)
{
    printf("OBSERVE %s=%d\n", key, (int)e);
    (void)cudaGetLastError();  // these errors are not sticky; clear the last-error slot
}

// A registration attempt whose code is compared with the plain run; undone if it succeeded.
static void observe_reg(const char *key, void *ptr, size_t n, unsigned flags)
{
    cudaError_t e = cudaHostRegister(ptr, n, flags);
    observe(key, e);
    if (e == cudaSuccess) CK(cudaHostUnregister(ptr));
}

static uint8_t *page_up(uint8_t *p)
{
    return (uint8_t *)(((uintptr_t)p + 4095) & ~(uintptr_t)4095);
}

static void test_register_promoted(void)
{
    t_test = "register_promoted";
    size_t n = 16 * MiB;
    uint8_t *p = (uint8_t *)xmalloc(n);
    memset(p, 1, n);
    for (int rep = 0; rep < 2; rep++) {
        make_hot(p, d, n, 4);
        roundtrip(p, n, "register_promoted/before");
        CK(cudaHostRegister(p, n, cudaHostRegisterDefault));
        cudaPointerAttributes a;
        CK(cudaPointerGetAttributes(&a, p));
        printf("OBSERVE register_promoted_type=%d\n", (int)a.type);
        REQUIRE(a.type == cudaMemoryTypeHost, "registered memory reports type %d", (int)a.type);
        roundtrip(p, n, "register_promoted/registered");
        roundtrip(p + 3, n - 100, "register_promoted/registered interior");
        CK(cudaHostUnregister(p));
        roundtrip(p, n, "register_promoted/after unregister");
    }
    free(p);
    pass("program_pinning.register_promoted");
}

static void test_register_subrange(void)
{
    t_test = "register_subrange";
    size_t n = 32 * MiB;
    uint8_t *p = (uint8_t *)xmalloc(n);
    memset(p, 1, n);
    make_hot(p, d, n, 4);
    uint8_t *q = page_up(p + 4 * MiB + 123);
    size_t qn = 8 * MiB;
    CK(cudaHostRegister(q, qn, cudaHostRegisterDefault));
    roundtrip(q, qn, "register_subrange/sub-range");
    roundtrip(p, n, "register_subrange/whole buffer");
    roundtrip(q - 1000, qn + 2000, "register_subrange/straddling both ends");
    observe_reg("subrange_register_again", q, qn, cudaHostRegisterDefault);
    observe_reg("subrange_register_interior", q + 1 * MiB, 1 * MiB, cudaHostRegisterDefault);
    observe_reg("subrange_register_straddling_end", q + qn - 1 * MiB, 2 * MiB, cudaHostRegisterDefault);
    observe("subrange_unregister_interior", cudaHostUnregister(q + 4096));
    CK(cudaHostUnregister(q));
    observe("subrange_unregister_twice", cudaHostUnregister(q));
    roundtrip(p, n, "register_subrange/after unregister");
    free(p);
    pass("program_pinning.register_subrange");
}

static void test_register_straddle(void)
{
    t_test = "register_straddle";
    size_t n = 32 * MiB;
    uint8_t *r = (uint8_t *)map_anon(n);
    memset(r, 1, n);
    make_hot(r, d, n / 2, 4);
    CK(cudaHostRegister(r + 8 * MiB, 16 * MiB, cudaHostRegisterDefault));
    roundtrip(r, n, "register_straddle/whole region");
    roundtrip(r + 8 * MiB, 16 * MiB, "register_straddle/registered part");
    CK(cudaHostUnregister(r + 8 * MiB));
    make_hot(r, d, n, 3);
    CK(cudaHostRegister(r, n, cudaHostRegisterPortable));
    roundtrip(r + 5, n - 5, "register_straddle/whole registered");
    CK(cudaHostUnregister(r));
    roundtrip(r, n, "register_straddle/after unregister");
    munmap(r, n);
    pass("program_pinning.register_straddle");
}

__global__ void k_inc(uint8_t *p, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] += 1;
}

static void test_register_mapped(void)
{
    t_test = "register_mapped";
    size_t n = 8 * MiB;
    uint8_t *p = (uint8_t *)xmalloc(n);
    memset(p, 1, n);
    make_hot(p, d, n, 4);
    CK(cudaHostRegister(p, n, cudaHostRegisterMapped));
    unsigned flags = 0;
    CK(cudaHostGetFlags(&flags, p));
    printf("OBSERVE mapped_flags=%u\n", flags);
    uint8_t *dp = nullptr;
    CK(cudaHostGetDevicePointer((void **)&dp, p, 0));
    uint32_t seed = g_seed++;
    uint8_t salt = 9;
    fill(p, n, seed);
    launch_xform(d2, dp, n, salt, s);  // the kernel reads host memory directly
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(p, d2, n, cudaMemcpyDeviceToHost));
    verify_xf(p, n, seed, salt, "register_mapped/kernel read");
    fill(p, n, seed);
    k_inc<<<grid_for(n), 256, 0, s>>>(dp, n);  // and writes it
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(s));
    for (size_t i = 0; i < n; i++)
        if (p[i] != (uint8_t)(pat(i, seed) + 1)) FAILF("register_mapped: kernel write not visible at byte %zu", i);
    roundtrip(p, n, "register_mapped/copies");
    CK(cudaHostUnregister(p));
    roundtrip(p, n, "register_mapped/after unregister");
    free(p);

    int ro = 0;
    CK(cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, 0));
    if (ro) {
        p = (uint8_t *)xmalloc(n);
        memset(p, 1, n);
        make_hot(p, d, n, 4);
        cudaError_t e = cudaHostRegister(p, n, cudaHostRegisterReadOnly);
        observe("register_readonly", e);
        if (e == cudaSuccess) {
            uint32_t sd = g_seed++;
            fill(p, n, sd);
            CK(cudaMemcpy(d, p, n, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(d2, d, n, cudaMemcpyDeviceToDevice));
            uint8_t *c = (uint8_t *)xmalloc(n);
            CK(cudaMemcpy(c, d2, n, cudaMemcpyDeviceToHost));
            verify_pat(c, n, sd, "register_readonly/h2d");
            free(c);
            CK(cudaHostUnregister(p));
        }
        free(p);
    }
    pass("program_pinning.register_mapped");
}

static void test_over_budget(void)
{
    t_test = "over_budget";
    size_t n = 128 * MiB;
    uint8_t *p = (uint8_t *)xmalloc(n);
    memset(p, 1, n);
    make_hot(p, d, n, 2);
    CK(cudaHostRegister(p, n, cudaHostRegisterDefault));
    roundtrip(p, n, "over_budget/registered");
    // Other hot buffers compete for the shim's budget meanwhile.
    uint8_t *o = (uint8_t *)xmalloc(48 * MiB);
    memset(o, 2, 48 * MiB);
    make_hot(o, d2, 48 * MiB, 3);
    roundtrip(o, 48 * MiB, "over_budget/other buffer");
    roundtrip(p + 1, n - 1, "over_budget/registered again");
    CK(cudaHostUnregister(p));
    roundtrip(p, 64 * MiB, "over_budget/after unregister");
    free(o);
    free(p);
    pass("program_pinning.over_budget");
}

static void test_error_codes(void)
{
    t_test = "error_codes";
    size_t n = 8 * MiB;
    uint8_t *p = (uint8_t *)xmalloc(n);
    memset(p, 1, n);
    make_hot(p, d, n, 5);
    observe("unregister_never_registered", cudaHostUnregister(p));
    roundtrip(p, n, "error_codes/after failed unregister");
    uint8_t *q = page_up(p + 100);
    CK(cudaHostRegister(q, 4 * MiB, cudaHostRegisterDefault));
    observe_reg("register_twice", q, 4 * MiB, cudaHostRegisterDefault);
    observe_reg("register_overlap_start", q + 64 * KiB, 1 * MiB, cudaHostRegisterDefault);
    CK(cudaHostUnregister(q));
    observe_reg("register_null", nullptr, 4096, cudaHostRegisterDefault);
    observe_reg("register_zero_size", q, 0, cudaHostRegisterDefault);
    observe_reg("register_bad_flags", q, 4096, 0x80000000u);
    void *mh = nullptr;
    CK(cudaMallocHost(&mh, 4 * MiB));
    observe_reg("register_mallochost", mh, 4 * MiB, cudaHostRegisterDefault);
    CK(cudaFreeHost(mh));
    roundtrip(p, n, "error_codes/after");
    free(p);
    pass("program_pinning.error_codes");
}

static void test_malloc_host(void)
{
    t_test = "malloc_host";
    size_t n = 16 * MiB;
    for (int rep = 0; rep < 3; rep++) {
        uint8_t *p;
        CK(cudaMallocHost((void **)&p, n));
        for (int i = 0; i < 4; i++) roundtrip(p + i, n - 8, "malloc_host/cudaMallocHost");
        unsigned flags = 99;
        CK(cudaHostGetFlags(&flags, p));
        printf("OBSERVE mallochost_flags=%u\n", flags);
        CK(cudaFreeHost(p));
        uint8_t *m = (uint8_t *)xmalloc(n);
        roundtrip(m, n, "malloc_host/malloc after cudaFreeHost");
        free(m);
    }
    const unsigned fl[] = {cudaHostAllocDefault, cudaHostAllocPortable, cudaHostAllocMapped,
                           cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined};
    for (unsigned f : fl) {
        uint8_t *p;
        size_t hn = (f & cudaHostAllocWriteCombined) ? 1 * MiB : 8 * MiB;  // WC: slow CPU reads
        CK(cudaHostAlloc((void **)&p, hn, f));
        for (int i = 0; i < 3; i++) roundtrip(p, hn, "malloc_host/cudaHostAlloc");
        unsigned flags = 99;
        CK(cudaHostGetFlags(&flags, p));
        printf("OBSERVE hostalloc_%u_flags=%u\n", f, flags);
        CK(cudaFreeHost(p));
    }
    pass("program_pinning.malloc_host");
}

int main(void)
{
    device_init();
    double t0 = now_ms();
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaMalloc(&d, DCAP));
    CK(cudaMalloc(&d2, DCAP));
    test_register_promoted();
    test_register_subrange();
    test_register_straddle();
    test_register_mapped();
    test_over_budget();
    test_error_codes();
    test_malloc_host();
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    CK(cudaFree(d));
    CK(cudaFree(d2));
    CK(cudaStreamDestroy(s));
    fprintf(stderr, "program_pinning: %.0f ms\n", now_ms() - t0);
    return 0;
}
