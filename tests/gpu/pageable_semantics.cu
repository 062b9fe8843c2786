// pageable_semantics.cu: contract rule 1, promoted memory keeps pageable semantics.
//
// The host buffers are malloc'd (64 MiB) and copied several times first, so under the shim they
// are promoted (registered).  For the program they are still pageable memory:
//   async_h2d_overwrite   cudaMemcpyAsync H2D from the buffer, queued behind a ~20 ms kernel on
//                         the same stream; the source is overwritten as soon as the call returns;
//                         after a sync the device must hold the OLD data (the original staged the
//                         source before returning).  Streams: created blocking, created
//                         non-blocking, cudaStreamLegacy, cudaStreamPerThread, 0; sizes 64 MiB,
//                         1 MiB + 3 and 64 KiB at unaligned interior offsets.
//   async_d2h_at_return   cudaMemcpyAsync D2H into the buffer behind a kernel that spins and then
//                         fills the device buffer: the data must be in host memory when the call
//                         returns, before any synchronization (the original blocks).
//   sync_h2d_overwrite    cudaMemcpy H2D behind a spin, source overwritten at return.
//   2d_async              cudaMemcpy2DAsync both ways, same two rules, pitched.
//   batch                 cudaMemcpyBatchAsync H2D (srcAccessOrder DuringApiCall) and D2H
//                         (Stream) from/into promoted memory, data checked after a stream sync;
//                         the return codes must be the same with and without the shim.
#include "common.cuh"

static const uint64_t SPIN = 20ull * 1000 * 1000;
static const size_t BIG = 64 * MiB;

struct StreamCase {
    const char *name;
    cudaStream_t s;
};

static uint8_t *h, *chk, *d;
static StreamCase streams[5];
static uint32_t g_seed = 900;

static void async_h2d_overwrite(const StreamCase &sc, size_t off, size_t n)
{
    char w[128];
    snprintf(w, sizeof w, "async_h2d_overwrite/%s n=%zu off=%zu", sc.name, n, off);
    t_test = "async_h2d_overwrite";
    uint32_t seed = g_seed++;
    fill(h + off, n, seed);
    CK(cudaMemsetAsync(d, 0, n, sc.s));
    launch_spin(sc.s, SPIN);
    CK(cudaMemcpyAsync(d, h + off, n, cudaMemcpyHostToDevice, sc.s));
    memset(h + off, 0x5A, n);  // the program may reuse a pageable source at once
    CK(cudaStreamSynchronize(sc.s));
    CK(cudaMemcpy(chk, d, n, cudaMemcpyDeviceToHost));
    verify_pat(chk, n, seed, w);
}

static void async_d2h_at_return(const StreamCase &sc, size_t off, size_t n)
{
    char w[128];
    snprintf(w, sizeof w, "async_d2h_at_return/%s n=%zu off=%zu", sc.name, n, off);
    t_test = "async_d2h_at_return";
    uint32_t seed = g_seed++;
    memset(h + off, 0xA5, n);
    launch_fill(d, n, seed, sc.s, SPIN);
    CK(cudaMemcpyAsync(h + off, d, n, cudaMemcpyDeviceToHost, sc.s));
    verify_pat(h + off, n, seed, w);  // no synchronization before this check
    CK(cudaStreamSynchronize(sc.s));
}

static void sync_h2d_overwrite(cudaStream_t blocking)
{
    t_test = "sync_h2d_overwrite";
    for (int rep = 0; rep < 2; rep++) {
        uint32_t seed = g_seed++;
        size_t off = rep ? 77 : 0, n = rep ? BIG - 4096 : BIG;
        fill(h + off, n, seed);
        launch_spin(PTDS_BUILD ? cudaStreamPerThread : blocking, SPIN);
        CK(cudaMemcpy(d, h + off, n, cudaMemcpyHostToDevice));
        memset(h + off, 0x3C, n);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(chk, d, n, cudaMemcpyDeviceToHost));
        verify_pat(chk, n, seed, "sync_h2d_overwrite");
    }
}

static void test_2d_async(cudaStream_t s)
{
    t_test = "2d_async";
    const size_t w = 8 * KiB + 3, rows = 1024, hp = w + 13;
    uint8_t *d2;
    size_t dp;
    CK(cudaMallocPitch((void **)&d2, &dp, w, rows));
    for (int rep = 0; rep < 4; rep++) {
        uint32_t seed = g_seed++;
        // H2D from the promoted buffer, source overwritten at return.
        for (size_t y = 0; y < rows; y++)
            for (size_t x = 0; x < w; x++) h[y * hp + x] = pat(y * w + x, seed);
        launch_spin(s, SPIN);
        CK(cudaMemcpy2DAsync(d2, dp, h, hp, w, rows, cudaMemcpyHostToDevice, s));
        memset(h, 0x77, hp * rows);
        CK(cudaStreamSynchronize(s));
        memset(chk, 0, w * rows);
        CK(cudaMemcpy2D(chk, w, d2, dp, w, rows, cudaMemcpyDeviceToHost));
        verify_pat(chk, w * rows, seed, "2d_async h2d overwrite");
        // D2H into the promoted buffer: complete at return; padding untouched.
        seed = g_seed++;
        memset(h, 0x66, hp * rows);
        k_fill<<<1, 32, 0, s>>>(nullptr, 0, 0, SPIN);
        CK(cudaGetLastError());
        fill(chk, w * rows, seed);
        CK(cudaMemcpy2DAsync(d2, dp, chk, w, w, rows, cudaMemcpyHostToDevice, s));  // pinned: async
        CK(cudaMemcpy2DAsync(h, hp, d2, dp, w, rows, cudaMemcpyDeviceToHost, s));
        for (size_t y = 0; y < rows; y++)
            for (size_t x = 0; x < hp; x++) {
                uint8_t exp = x < w ? pat(y * w + x, seed) : 0x66;
                if (h[y * hp + x] != exp)
                    FAILF("2d_async d2h at return: row %zu col %zu is 0x%02x, expected 0x%02x", y, x, h[y * hp + x], exp);
            }
        CK(cudaStreamSynchronize(s));
    }
    CK(cudaFree(d2));
}

static void test_batch(cudaStream_t s)
{
    t_test = "batch";
    const size_t n = 4 * MiB + 1;
    void *dsts[3];
    const void *srcs[3];
    size_t szs[3] = {n, n, n};
    uint8_t *dd;
    CK(cudaMalloc(&dd, 3 * n));
    uint32_t seed = g_seed;
    g_seed += 3;
    for (int i = 0; i < 3; i++) {
        dsts[i] = dd + i * n;
        srcs[i] = h + i * (n + 100);
        fill(h + i * (n + 100), n, seed + i);
    }
    cudaMemcpyAttributes attr = {};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderDuringApiCall;
    attr.srcLocHint.type = cudaMemLocationTypeHost;
    attr.dstLocHint.type = cudaMemLocationTypeDevice;
    attr.dstLocHint.id = 0;
    size_t idx = 0;
    launch_spin(s, SPIN);
    cudaError_t e = cudaMemcpyBatchAsync(dsts, srcs, szs, 3, &attr, &idx, 1, s);
    printf("OBSERVE batch_h2d_during_api_call=%d\n", (int)e);
    if (e == cudaSuccess) {
        // (DuringApiCall does not make the driver finish reading before it returns when the
        // stream is busy, measured without the shim: no overwrite-at-return check here.)
        CK(cudaStreamSynchronize(s));
        for (int i = 0; i < 3; i++) memset(h + i * (n + 100), 0x99, n);
        for (int i = 0; i < 3; i++) {
            CK(cudaMemcpy(chk, dd + i * n, n, cudaMemcpyDeviceToHost));
            verify_pat(chk, n, seed + i, "batch h2d (DuringApiCall)");
        }
    } else {
        (void)cudaGetLastError();
    }
    // D2H into pageable memory, stream order: data after a stream sync.
    void *dsts2[3];
    const void *srcs2[3];
    for (int i = 0; i < 3; i++) {
        fill(chk, n, seed + 10 + i);
        CK(cudaMemcpy(dd + i * n, chk, n, cudaMemcpyHostToDevice));
        dsts2[i] = h + 3 + i * (n + 100);
        srcs2[i] = dd + i * n;
        memset(dsts2[i], 0, n);
    }
    cudaMemcpyAttributes attr2 = {};
    attr2.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr2.srcLocHint.type = cudaMemLocationTypeDevice;
    attr2.dstLocHint.type = cudaMemLocationTypeHost;
    e = cudaMemcpyBatchAsync(dsts2, srcs2, szs, 3, &attr2, &idx, 1, s);
    printf("OBSERVE batch_d2h_stream=%d\n", (int)e);
    if (e == cudaSuccess) {
        CK(cudaStreamSynchronize(s));
        for (int i = 0; i < 3; i++) verify_pat(dsts2[i], n, seed + 10 + i, "batch d2h (Stream)");
    } else {
        (void)cudaGetLastError();
    }
    CK(cudaFree(dd));
}

int main(void)
{
    device_init();
    double t0 = now_ms();
    h = (uint8_t *)xmalloc(BIG + 64 * KiB);
    chk = (uint8_t *)pinned_alloc(BIG + 64 * KiB);
    CK(cudaMalloc(&d, BIG + 64 * KiB));
    memset(h, 0, BIG + 64 * KiB);
    make_hot(h, d, BIG);
    make_hot(h + 5, d, 1 * MiB);

    cudaStream_t sb, snb;
    CK(cudaStreamCreateWithFlags(&sb, cudaStreamDefault));
    CK(cudaStreamCreateWithFlags(&snb, cudaStreamNonBlocking));
    streams[0] = {"blocking", sb};
    streams[1] = {"nonblocking", snb};
    streams[2] = {"legacy", cudaStreamLegacy};
    streams[3] = {"per_thread", cudaStreamPerThread};
    streams[4] = {"stream0", 0};

    struct { size_t off, n; int nstreams; } cases[] = {{0, BIG, 5}, {5, 1 * MiB + 3, 5}, {4097, 64 * KiB, 2}};
    for (auto &c : cases)
        for (int i = 0; i < c.nstreams; i++) async_h2d_overwrite(streams[i], c.off, c.n);
    pass("pageable.async_h2d_overwrite");
    for (auto &c : cases)
        for (int i = 0; i < c.nstreams; i++) async_d2h_at_return(streams[i], c.off, c.n);
    pass("pageable.async_d2h_at_return");
    sync_h2d_overwrite(sb);
    pass("pageable.sync_h2d_overwrite");
    test_2d_async(snb);
    pass("pageable.2d_async");
    test_batch(snb);
    pass("pageable.batch");

    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    CK(cudaStreamDestroy(sb));
    CK(cudaStreamDestroy(snb));
    CK(cudaFree(d));
    CK(cudaFreeHost(chk));
    free(h);
    fprintf(stderr, "pageable_semantics: %.0f ms\n", now_ms() - t0);
    return 0;
}
