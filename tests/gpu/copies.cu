// copies.cu: every runtime copy kind that involves host memory, checked through a kernel.
//
// Round trips host -> device (-> device) -> kernel transform -> host for:
//   methods  cudaMemcpy H2D/D2H, cudaMemcpy with cudaMemcpyDefault (both directions, and D2D),
//            cudaMemcpyAsync on stream 0, a created stream, cudaStreamPerThread, cudaStreamLegacy,
//            cudaMemcpyAsync with cudaMemcpyDefault, cudaMemcpy D2D / cudaMemcpyAsync D2D;
//            cudaMemcpy2D / 2DAsync with host pitches (padding must stay untouched),
//            cudaMemcpy3D / 3DAsync, 2D copies to/from a CUDA array, To/FromSymbol (+Async)
//   memory   malloc, new[], calloc, posix_memalign, static arrays, stack buffers (small sizes),
//            mmap, cudaMallocHost, cudaHostAlloc(portable|mapped), cudaHostRegister'ed malloc
//   sizes    1 byte .. 64 MiB, odd sizes, unaligned host pointers (interior offsets)
// The same buffers are reused across methods, so under the shim they become hot and promoted
// (interior pointers into promoted blocks get exercised).
//
// Last line of stdout: EXPECTED_COPIES h2d=N d2h=N d2d=N, the exact number of copies this
// program issued per direction (cudaMemcpyDefault counted by actual direction).  Under
// PINSHIM_MODE=observe the shim's JSON must report exactly these counts.
#include "common.cuh"

#include <new>

static long g_h2d, g_d2h, g_d2d;
static cudaStream_t g_stream;  // a created (blocking) stream

enum Method {
    M_SYNC,           // cudaMemcpy H2D / D2H (+ cudaMemcpy D2D in between)
    M_DEFAULT,        // cudaMemcpy cudaMemcpyDefault (+ Default D2D)
    M_ASYNC0,         // cudaMemcpyAsync, stream 0
    M_ASYNC_STREAM,   // cudaMemcpyAsync, created stream (+ async D2D)
    M_ASYNC_PTS,      // cudaMemcpyAsync, cudaStreamPerThread
    M_ASYNC_LEGACY,   // cudaMemcpyAsync, cudaStreamLegacy
    M_ASYNC_DEFKIND,  // cudaMemcpyAsync cudaMemcpyDefault, created stream
    M_COUNT
};
static const char *method_name[M_COUNT] = {"sync", "default", "async0", "async_stream", "async_pts",
                                           "async_legacy", "async_defkind"};

static cudaStream_t stream_of(int m)
{
    switch (m) {
    case M_ASYNC_STREAM:
    case M_ASYNC_DEFKIND: return g_stream;
    case M_ASYNC_PTS: return cudaStreamPerThread;
    case M_ASYNC_LEGACY: return cudaStreamLegacy;
    default: return 0;
    }
}

static void h2d(int m, void *d, const void *h, size_t n)
{
    switch (m) {
    case M_SYNC: CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice)); break;
    case M_DEFAULT: CK(cudaMemcpy(d, h, n, cudaMemcpyDefault)); break;
    case M_ASYNC_DEFKIND: CK(cudaMemcpyAsync(d, h, n, cudaMemcpyDefault, stream_of(m))); break;
    default: CK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, stream_of(m))); break;
    }
    g_h2d++;
}

static void d2h(int m, void *h, const void *d, size_t n)
{
    switch (m) {
    case M_SYNC: CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost)); break;
    case M_DEFAULT: CK(cudaMemcpy(h, d, n, cudaMemcpyDefault)); break;
    case M_ASYNC_DEFKIND: CK(cudaMemcpyAsync(h, d, n, cudaMemcpyDefault, stream_of(m))); break;
    default: CK(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, stream_of(m))); break;
    }
    g_d2h++;
}

// Returns true if it issued a device-to-device copy (the kernel then reads `mid`).
static bool d2d(int m, void *dst, const void *src, size_t n)
{
    switch (m) {
    case M_SYNC: CK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToDevice)); break;
    case M_DEFAULT: CK(cudaMemcpy(dst, src, n, cudaMemcpyDefault)); break;
    case M_ASYNC_STREAM: CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream_of(m))); break;
    default: return false;
    }
    g_d2d++;
    return true;
}

static const size_t MAXN = 64 * MiB;
static uint8_t *d_in, *d_mid, *d_out;

// One round trip: fill src, H2D, (D2D), transform, D2H into dst, check.
static void roundtrip(int m, uint8_t *src, uint8_t *dst, size_t n, uint32_t seed, const char *kind)
{
    char what[160];
    uint8_t salt = (uint8_t)(seed * 13 + 1);
    fill(src, n, seed);
    memset(dst, 0xC5, n);
    h2d(m, d_in, src, n);
    const uint8_t *kin = d_in;
    if (d2d(m, d_mid, d_in, n)) kin = d_mid;
    launch_xform(d_out, kin, n, salt, stream_of(m));
    d2h(m, dst, d_out, n);
    CK(cudaStreamSynchronize(stream_of(m)));
    snprintf(what, sizeof what, "%s/%s n=%zu src=%p dst=%p", kind, method_name[m], n, (void *)src, (void *)dst);
    verify_xf(dst, n, seed, salt, what);
    // The source must be unchanged by the copy.
    verify_pat(src, n, seed, what);
}

static const size_t sizes[] = {1,       3,       17,          4095,          4096,          4097,
                               65549,   1 * MiB, 1 * MiB + 7, 8 * MiB - 1,   16 * MiB + 5,  64 * MiB};
static const int nsizes = sizeof sizes / sizeof sizes[0];

enum Kind { K_MALLOC, K_NEW, K_CALLOC, K_MEMALIGN, K_STATIC, K_MMAP, K_MALLOCHOST, K_HOSTALLOC, K_REGISTERED, K_NKIND };
static const char *kind_name[K_NKIND] = {"malloc", "new", "calloc", "posix_memalign", "static",
                                         "mmap", "cudaMallocHost", "cudaHostAlloc", "registered"};

static const size_t STATIC_CAP = 4 * MiB + 64;
static uint8_t g_static_a[STATIC_CAP], g_static_b[STATIC_CAP];

static size_t kind_cap(int k)
{
    switch (k) {
    case K_STATIC: return STATIC_CAP;
    case K_CALLOC:
    case K_MEMALIGN:
    case K_HOSTALLOC: return 16 * MiB + 64;
    default: return MAXN + 64;
    }
}

static uint8_t *kind_alloc(int k, size_t cap, int which)
{
    void *p = nullptr;
    switch (k) {
    case K_MALLOC: p = xmalloc(cap); break;
    case K_NEW: p = new uint8_t[cap]; break;
    case K_CALLOC: p = calloc(1, cap); REQUIRE(p, "calloc"); break;
    case K_MEMALIGN: REQUIRE(posix_memalign(&p, 4096, cap) == 0, "posix_memalign"); break;
    case K_STATIC: p = which ? g_static_b : g_static_a; break;
    case K_MMAP: p = map_anon(cap); break;
    case K_MALLOCHOST: CK(cudaMallocHost(&p, cap)); break;
    case K_HOSTALLOC: CK(cudaHostAlloc(&p, cap, cudaHostAllocPortable | cudaHostAllocMapped)); break;
    case K_REGISTERED:
        p = xmalloc(cap);
        memset(p, 0, cap);
        CK(cudaHostRegister(p, cap, cudaHostRegisterDefault));
        break;
    }
    return (uint8_t *)p;
}

static void kind_free(int k, uint8_t *p, size_t cap)
{
    switch (k) {
    case K_MALLOC:
    case K_CALLOC:
    case K_MEMALIGN: free(p); break;
    case K_NEW: delete[] p; break;
    case K_STATIC: break;
    case K_MMAP: munmap(p, cap); break;
    case K_MALLOCHOST:
    case K_HOSTALLOC: CK(cudaFreeHost(p)); break;
    case K_REGISTERED: CK(cudaHostUnregister(p)); free(p); break;
    }
}

static void test_kind(int k)
{
    t_test = kind_name[k];
    size_t cap = kind_cap(k);
    uint8_t *a = kind_alloc(k, cap, 0), *b = kind_alloc(k, cap, 1);
    uint32_t seed = 100 + k * 1000;
    for (int si = 0; si < nsizes; si++) {
        size_t n = sizes[si];
        for (int m = 0; m < M_COUNT; m++) {
            // Large sizes: only a rotating subset of methods, to keep the run short.
            if (n > 4 * MiB && (si + m + k) % (n > 32 * MiB ? 7 : 4) != 0) continue;
            size_t offa = ((si + m) % 3 == 0) ? 0 : (size_t)((si * 7 + m) % 15 + 1);
            size_t offb = ((si + m) % 2 == 0) ? 0 : (size_t)((si * 5 + m * 3) % 13 + 1);
            if (n + offa > cap || n + offb > cap) continue;
            roundtrip(m, a + offa, b + offb, n, seed++, kind_name[k]);
            // Same buffers, reverse roles: the destination becomes a source.
            if (n <= 1 * MiB) roundtrip((m + 3) % M_COUNT, b + offb, a + offa, n, seed++, kind_name[k]);
        }
    }
    kind_free(k, a, cap);
    kind_free(k, b, cap);
    char name[64];
    snprintf(name, sizeof name, "copies.%s", kind_name[k]);
    pass(name);
}

// Stack buffers (small sizes only).
static void __attribute__((noinline)) test_stack(void)
{
    t_test = "stack";
    uint8_t a[65536 + 64], b[65536 + 64];
    const size_t ns[] = {1, 7, 100, 4099, 65536};
    uint32_t seed = 7;
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        for (int m = 0; m < M_COUNT; m++) roundtrip(m, a + (m & 3), b + ((m + i) % 5), ns[i], seed++, "stack");
    pass("copies.stack");
}

// ----- 2D ------------------------------------------------------------------------------------
static void test_2d_one(uint8_t *hsrc, uint8_t *hdst, size_t w, size_t h, size_t sp, size_t dp, int mode,
                        uint32_t seed, const char *kind)
{
    // mode 0: cudaMemcpy2D H2D/D2H; 1: cudaMemcpy2DAsync created stream; 2: 2DAsync stream 0;
    // 3: cudaMemcpy2D cudaMemcpyDefault; 4: 2DAsync cudaStreamLegacy
    char what[160];
    snprintf(what, sizeof what, "2d/%s mode=%d %zux%zu pitches %zu/%zu", kind, mode, w, h, sp, dp);
    uint8_t salt = (uint8_t)(seed + 3);
    uint8_t *din, *dout;
    size_t dpin, dpout;
    CK(cudaMallocPitch((void **)&din, &dpin, w, h));
    CK(cudaMallocPitch((void **)&dout, &dpout, w, h));
    memset(hsrc, 0xEE, sp * h);
    for (size_t y = 0; y < h; y++)
        for (size_t x = 0; x < w; x++) hsrc[y * sp + x] = pat(y * w + x, seed);
    memset(hdst, 0x5C, dp * h);
    cudaStream_t s = mode == 1 ? g_stream : mode == 4 ? cudaStreamLegacy : 0;
    switch (mode) {
    case 0: CK(cudaMemcpy2D(din, dpin, hsrc, sp, w, h, cudaMemcpyHostToDevice)); break;
    case 3: CK(cudaMemcpy2D(din, dpin, hsrc, sp, w, h, cudaMemcpyDefault)); break;
    default: CK(cudaMemcpy2DAsync(din, dpin, hsrc, sp, w, h, cudaMemcpyHostToDevice, s)); break;
    }
    g_h2d++;
    k_xform2d<<<grid_for(w * h), 256, 0, s>>>(dout, dpout, din, dpin, w, h, salt);
    CK(cudaGetLastError());
    switch (mode) {
    case 0: CK(cudaMemcpy2D(hdst, dp, dout, dpout, w, h, cudaMemcpyDeviceToHost)); break;
    case 3: CK(cudaMemcpy2D(hdst, dp, dout, dpout, w, h, cudaMemcpyDefault)); break;
    default: CK(cudaMemcpy2DAsync(hdst, dp, dout, dpout, w, h, cudaMemcpyDeviceToHost, s)); break;
    }
    g_d2h++;
    CK(cudaStreamSynchronize(s));
    for (size_t y = 0; y < h; y++) {
        for (size_t x = 0; x < dp; x++) {
            uint8_t got = hdst[y * dp + x];
            uint8_t exp = x < w ? xf(pat(y * w + x, seed), y * w + x, salt) : 0x5C;
            if (got != exp)
                FAILF("%s: row %zu col %zu is 0x%02x, expected 0x%02x%s", what, y, x, got, exp,
                      x >= w ? " (pitch padding was written)" : "");
        }
    }
    for (size_t y = 0; y < h; y++)
        for (size_t x = w; x < sp; x++)
            if (hsrc[y * sp + x] != 0xEE) FAILF("%s: source padding changed", what);
    CK(cudaFree(din));
    CK(cudaFree(dout));
}

static void test_2d(void)
{
    t_test = "2d";
    struct { size_t w, h; } shapes[] = {{1, 1}, {1000, 37}, {4097, 300}, {65539, 64}, {3 * 1024 + 1, 2048}};
    const int kinds[] = {K_MALLOC, K_MALLOCHOST, K_REGISTERED, K_MMAP};
    uint32_t seed = 5000;
    for (int ki = 0; ki < 4; ki++) {
        int k = kinds[ki];
        size_t cap = 16 * MiB;
        uint8_t *a = kind_alloc(k, cap, 0), *b = kind_alloc(k, cap, 1);
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            size_t w = shapes[si].w, h = shapes[si].h;
            size_t sp = w + 5 + si, dp = w + 11;
            for (int mode = 0; mode < 5; mode++) {
                size_t off = (mode + si) % 3;
                REQUIRE(sp * h + off <= cap && dp * h + off <= cap, "2d shape too large");
                test_2d_one(a + off, b + (mode & 1), w, h, sp, dp, mode, seed++, kind_name[k]);
            }
        }
        kind_free(k, a, cap);
        kind_free(k, b, cap);
    }
    pass("copies.2d");
}

// ----- 3D ------------------------------------------------------------------------------------
static void test_3d(void)
{
    t_test = "3d";
    struct { size_t w, h, d; } shapes[] = {{333, 17, 9}, {4096, 64, 16}, {1 << 16, 8, 4}};
    const int kinds[] = {K_MALLOC, K_MALLOCHOST, K_MMAP};
    uint32_t seed = 9000;
    for (int ki = 0; ki < 3; ki++) {
        int k = kinds[ki];
        size_t cap = 16 * MiB;
        uint8_t *a = kind_alloc(k, cap, 0), *b = kind_alloc(k, cap, 1);
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            for (int async = 0; async < 2; async++) {
                size_t w = shapes[si].w, h = shapes[si].h, dd = shapes[si].d;
                size_t sp = w + 7, sh = h;          // source: pitched rows, packed slices
                size_t dp = w + 3, dh = h + 2;      // destination: padded rows and slices
                REQUIRE(sp * sh * dd <= cap && dp * dh * dd <= cap, "3d shape too large");
                uint32_t sd = seed++;
                uint8_t salt = (uint8_t)(sd * 3);
                char what[128];
                snprintf(what, sizeof what, "3d/%s %zux%zux%zu async=%d", kind_name[k], w, h, dd, async);
                memset(a, 0xEE, sp * sh * dd);
                for (size_t z = 0; z < dd; z++)
                    for (size_t y = 0; y < h; y++)
                        for (size_t x = 0; x < w; x++) a[(z * sh + y) * sp + x] = pat((z * h + y) * w + x, sd);
                memset(b, 0x5C, dp * dh * dd);
                cudaExtent ext = make_cudaExtent(w, h, dd);
                cudaPitchedPtr din, dout;
                CK(cudaMalloc3D(&din, ext));
                CK(cudaMalloc3D(&dout, ext));
                cudaMemcpy3DParms p = {};
                p.srcPtr = make_cudaPitchedPtr(a, sp, w, sh);
                p.dstPtr = din;
                p.extent = ext;
                p.kind = async ? cudaMemcpyDefault : cudaMemcpyHostToDevice;
                cudaStream_t s = async ? g_stream : 0;
                if (async) CK(cudaMemcpy3DAsync(&p, s)); else CK(cudaMemcpy3D(&p));
                g_h2d++;
                // Device slices are din.pitch * h apart: treat the volume as (d*h) rows.
                k_xform2d<<<grid_for(w * h * dd), 256, 0, s>>>((uint8_t *)dout.ptr, dout.pitch, (const uint8_t *)din.ptr,
                                                               din.pitch, w, h * dd, salt);
                CK(cudaGetLastError());
                cudaMemcpy3DParms q = {};
                q.srcPtr = dout;
                q.dstPtr = make_cudaPitchedPtr(b, dp, w, dh);
                q.extent = ext;
                q.kind = async ? cudaMemcpyDeviceToHost : cudaMemcpyDefault;
                if (async) CK(cudaMemcpy3DAsync(&q, s)); else CK(cudaMemcpy3D(&q));
                g_d2h++;
                CK(cudaStreamSynchronize(s));
                for (size_t z = 0; z < dd; z++)
                    for (size_t y = 0; y < dh; y++)
                        for (size_t x = 0; x < dp; x++) {
                            uint8_t got = b[(z * dh + y) * dp + x];
                            size_t li = (z * h + y) * w + x;
                            uint8_t exp = (x < w && y < h) ? xf(pat(li, sd), li, salt) : 0x5C;
                            if (got != exp)
                                FAILF("%s: z=%zu y=%zu x=%zu is 0x%02x, expected 0x%02x", what, z, y, x, got, exp);
                        }
                CK(cudaFree(din.ptr));
                CK(cudaFree(dout.ptr));
            }
        }
        kind_free(k, a, cap);
        kind_free(k, b, cap);
    }
    pass("copies.3d");
}

// ----- CUDA arrays ---------------------------------------------------------------------------
static void test_array(void)
{
    t_test = "array";
    size_t w = 1031, h = 77, sp = w + 9, dp = w + 1;
    cudaChannelFormatDesc desc = cudaCreateChannelDesc<unsigned char>();
    cudaArray_t arr;
    CK(cudaMallocArray(&arr, &desc, w, h));
    uint8_t *a = (uint8_t *)xmalloc(sp * h), *b = (uint8_t *)xmalloc(dp * h);
    for (int it = 0; it < 4; it++) {
        uint32_t sd = 777 + it;
        for (size_t y = 0; y < h; y++)
            for (size_t x = 0; x < sp; x++) a[y * sp + x] = x < w ? pat(y * w + x, sd) : 0xEE;
        memset(b, 0x5C, dp * h);
        if (it & 1) {
            CK(cudaMemcpy2DToArrayAsync(arr, 0, 0, a, sp, w, h, cudaMemcpyHostToDevice, g_stream));
            g_h2d++;
            CK(cudaMemcpy2DFromArrayAsync(b, dp, arr, 0, 0, w, h, cudaMemcpyDeviceToHost, g_stream));
            g_d2h++;
            CK(cudaStreamSynchronize(g_stream));
        } else {
            CK(cudaMemcpy2DToArray(arr, 0, 0, a, sp, w, h, cudaMemcpyHostToDevice));
            g_h2d++;
            CK(cudaMemcpy2DFromArray(b, dp, arr, 0, 0, w, h, cudaMemcpyDeviceToHost));
            g_d2h++;
        }
        for (size_t y = 0; y < h; y++)
            for (size_t x = 0; x < dp; x++) {
                uint8_t exp = x < w ? pat(y * w + x, sd) : 0x5C;
                if (b[y * dp + x] != exp) FAILF("array it=%d y=%zu x=%zu: 0x%02x vs 0x%02x", it, y, x, b[y * dp + x], exp);
            }
    }
    free(a);
    free(b);
    CK(cudaFreeArray(arr));
    pass("copies.array");
}

// ----- symbols -------------------------------------------------------------------------------
__device__ uint8_t g_sym[8192 + 64];

static void test_symbol(void)
{
    t_test = "symbol";
    uint8_t *symp;
    CK(cudaGetSymbolAddress((void **)&symp, g_sym));
    uint8_t a[8192 + 64], b[8192 + 64];
    const size_t ns[] = {1, 4096, 8192 + 5};
    for (int it = 0; it < 6; it++) {
        size_t n = ns[it % 3], off = (size_t)(it * 11) % 50;
        uint32_t sd = 31 + it;
        uint8_t salt = (uint8_t)it;
        fill(a, n, sd);
        if (it & 1) CK(cudaMemcpyToSymbolAsync(g_sym, a, n, off, cudaMemcpyHostToDevice, g_stream));
        else CK(cudaMemcpyToSymbol(g_sym, a, n, off, cudaMemcpyHostToDevice));
        g_h2d++;
        cudaStream_t s = (it & 1) ? g_stream : 0;
        launch_xform(d_out, symp + off, n, salt, s);
        memset(b, 0, sizeof b);
        if (it & 1) CK(cudaMemcpyFromSymbolAsync(b, g_sym, n, off, cudaMemcpyDeviceToHost, g_stream));
        else CK(cudaMemcpyFromSymbol(b, g_sym, n, off, cudaMemcpyDeviceToHost));
        g_d2h++;
        CK(cudaStreamSynchronize(s));
        verify_pat(b, n, sd, "FromSymbol");
        CK(cudaMemcpy(b, d_out, n, cudaMemcpyDeviceToHost));
        g_d2h++;
        verify_xf(b, n, sd, salt, "symbol transform");
    }
    pass("copies.symbol");
}

// ----- D2D with odd offsets and sizes ------------------------------------------------------------
static void test_d2d(void)
{
    t_test = "d2d";
    uint8_t *h = (uint8_t *)pinned_alloc(4 * MiB + 64);
    const size_t ns[] = {1, 4097, 1 * MiB + 3, 4 * MiB};
    for (int it = 0; it < 8; it++) {
        size_t n = ns[it % 4], so = (size_t)it * 3, dof = (size_t)(it * 5) % 17;
        uint32_t sd = 4242 + it;
        fill(h, n, sd);
        CK(cudaMemcpy(d_in + so, h, n, cudaMemcpyHostToDevice));
        g_h2d++;
        switch (it % 3) {
        case 0: CK(cudaMemcpy(d_mid + dof, d_in + so, n, cudaMemcpyDeviceToDevice)); break;
        case 1: CK(cudaMemcpy(d_mid + dof, d_in + so, n, cudaMemcpyDefault)); break;
        case 2: CK(cudaMemcpyAsync(d_mid + dof, d_in + so, n, cudaMemcpyDefault, g_stream)); CK(cudaStreamSynchronize(g_stream)); break;
        }
        g_d2d++;
        memset(h, 0, n);
        CK(cudaMemcpy(h, d_mid + dof, n, cudaMemcpyDeviceToHost));
        g_d2h++;
        verify_pat(h, n, sd, "d2d");
    }
    CK(cudaFreeHost(h));
    pass("copies.d2d");
}

int main(void)
{
    device_init();
    CK(cudaStreamCreate(&g_stream));
    CK(cudaMalloc(&d_in, MAXN + 64));
    CK(cudaMalloc(&d_mid, MAXN + 64));
    CK(cudaMalloc(&d_out, MAXN + 64));
    double t0 = now_ms();
    test_stack();
    for (int k = 0; k < K_NKIND; k++) test_kind(k);
    test_2d();
    test_3d();
    test_array();
    test_symbol();
    test_d2d();
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    CK(cudaFree(d_in));
    CK(cudaFree(d_mid));
    CK(cudaFree(d_out));
    CK(cudaStreamDestroy(g_stream));
    fprintf(stderr, "copies: %.0f ms\n", now_ms() - t0);
    printf("EXPECTED_COPIES h2d=%ld d2h=%ld d2d=%ld\n", g_h2d, g_d2h, g_d2d);
    return 0;
}
