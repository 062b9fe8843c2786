// Shared helpers for the GPU test programs in tests/gpu/ (CUDA runtime API only).
//
// Every program checks its own results: on the first mismatch or unexpected error it prints
// "FAIL [test] file:line: message" to stderr and exits 1.  Passing sections print "PASS name".
// Lines starting with "OBSERVE " carry facts (error codes, flags) that must be identical with
// and without the shim; run_gpu_tests.sh compares them against the plain run.
#pragma once

#include <cuda_runtime.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static thread_local const char *t_test = "init";

#define FAILF(...)                                                              \
    do {                                                                        \
        fprintf(stderr, "FAIL [%s] %s:%d: ", t_test, __FILE__, __LINE__);     \
        fprintf(stderr, __VA_ARGS__);                                           \
        fprintf(stderr, "\n");                                                  \
        fflush(stderr);                                                         \
        fflush(stdout);                                                         \
        _exit(1);                                                               \
    } while (0)

#define CK(call)                                                                \
    do {                                                                        \
        cudaError_t ck_e_ = (call);                                             \
        if (ck_e_ != cudaSuccess)                                               \
            FAILF("%s -> %s (%d)", #call, cudaGetErrorString(ck_e_), (int)ck_e_); \
    } while (0)

#define REQUIRE(cond, ...)                                                      \
    do {                                                                        \
        if (!(cond)) FAILF(__VA_ARGS__);                                        \
    } while (0)

static inline void pass(const char *name)
{
    printf("PASS %s\n", name);
    fflush(stdout);
}

static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)

// ---------------------------------------------------------------------------------------------
// Data patterns.  pat(i, seed) is the byte at position i of a buffer filled with `seed`;
// xf() is what k_xform makes of it (XOR with a keyed pattern whose bytes are never zero).  Both
// are position-dependent and not periodic, so a shifted, truncated, stale or partly written
// buffer is caught.  The host side works a 64-bit word at a time (little-endian: byte k of word
// j is position 8j+k), which keeps checking 64 MiB buffers cheap.
// ---------------------------------------------------------------------------------------------
__host__ __device__ static inline uint64_t pat_word(uint64_t j, uint32_t seed)
{
    uint64_t z = j + (uint64_t)(seed + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 29)) * 0x94D049BB133111EBull;
    return z ^ (z >> 32);
}

#define XF_KEY_SEED 0x5A17C000u
#define XF_NONZERO 0x0101010101010101ull

__host__ __device__ static inline uint8_t pat(size_t i, uint32_t seed)
{
    return (uint8_t)(pat_word(i >> 3, seed) >> (8 * (i & 7)));
}

__host__ __device__ static inline uint8_t xf(uint8_t b, size_t i, uint8_t salt)
{
    return (uint8_t)(b ^ (pat(i, XF_KEY_SEED + salt) | 1u));
}

static inline uint64_t xf_word(uint64_t w, uint64_t j, uint8_t salt)
{
    return w ^ (pat_word(j, XF_KEY_SEED + salt) | XF_NONZERO);
}

static inline void fill(void *p, size_t n, uint32_t seed)
{
    uint8_t *b = (uint8_t *)p;
    size_t nw = n / 8;
    for (size_t j = 0; j < nw; j++) {
        uint64_t w = pat_word(j, seed);
        memcpy(b + 8 * j, &w, 8);
    }
    for (size_t i = nw * 8; i < n; i++) b[i] = pat(i, seed);
}

// Index of the first byte where p differs from the pattern (xform'ed with salt if xform), or n.
static inline size_t first_mismatch(const void *p, size_t n, uint32_t seed, bool xform, uint8_t salt)
{
    const uint8_t *b = (const uint8_t *)p;
    size_t nw = n / 8, i = nw * 8;
    for (size_t j = 0; j < nw; j++) {
        uint64_t w, e = pat_word(j, seed);
        if (xform) e = xf_word(e, j, salt);
        memcpy(&w, b + 8 * j, 8);
        if (w != e) { i = 8 * j; break; }
    }
    for (; i < n; i++) {
        uint8_t e = xform ? xf(pat(i, seed), i, salt) : pat(i, seed);
        if (b[i] != e) return i;
    }
    return n;
}

// Reports the first mismatching byte.
static inline void verify_pat(const void *p, size_t n, uint32_t seed, const char *what)
{
    const uint8_t *b = (const uint8_t *)p;
    size_t bad = first_mismatch(p, n, seed, false, 0);
    if (bad != n)
        FAILF("%s: %zu bytes at %p, byte %zu is 0x%02x, expected 0x%02x (seed %u)", what, n, p,
              bad, b[bad], pat(bad, seed), seed);
}

static inline void verify_xf(const void *p, size_t n, uint32_t seed, uint8_t salt, const char *what)
{
    const uint8_t *b = (const uint8_t *)p;
    size_t bad = first_mismatch(p, n, seed, true, salt);
    if (bad != n)
        FAILF("%s: %zu bytes at %p, byte %zu is 0x%02x, expected 0x%02x (seed %u salt %u; the "
              "untransformed source byte would be 0x%02x)",
              what, n, p, bad, b[bad], xf(pat(bad, seed), bad, salt), seed, salt, pat(bad, seed));
}

static inline void verify_byte(const void *p, size_t n, uint8_t v, const char *what)
{
    const uint8_t *b = (const uint8_t *)p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != v) FAILF("%s: byte %zu of %zu is 0x%02x, expected 0x%02x", what, i, n, b[i], v);
}

// ---------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------
__device__ static inline uint64_t gtimer_ns(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Every thread spins `ns` nanoseconds first (so the grid is busy for that long).
__device__ static inline void spin_ns(uint64_t ns)
{
    if (!ns) return;
    uint64_t t0 = gtimer_ns();
    while (gtimer_ns() - t0 < ns) __nanosleep(2000);
}

__global__ void k_xform(uint8_t *out, const uint8_t *in, size_t n, uint8_t salt, uint64_t spin)
{
    spin_ns(spin);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = xf(in[i], i, salt);
}

__global__ void k_fill(uint8_t *out, size_t n, uint32_t seed, uint64_t spin)
{
    spin_ns(spin);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = pat(i, seed);
}

// 2D pitched transform: element (y, x) has logical index y * width + x.
__global__ void k_xform2d(uint8_t *out, size_t opitch, const uint8_t *in, size_t ipitch, size_t width,
                          size_t height, uint8_t salt)
{
    size_t n = width * height;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t y = i / width, x = i % width;
        out[y * opitch + x] = xf(in[y * ipitch + x], i, salt);
    }
}

static int g_grid_cap = 0;

static inline int grid_for(size_t n)
{
    if (!g_grid_cap) {
        int dev = 0, sms = 0;
        CK(cudaGetDevice(&dev));
        CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        g_grid_cap = sms * 4;  // 4 x 256 threads per SM: the whole grid is resident at once
    }
    size_t g = (n + 255) / 256;
    if (g < 1) g = 1;
    if (g > (size_t)g_grid_cap) g = g_grid_cap;
    return (int)g;
}

static inline void launch_xform(uint8_t *out, const uint8_t *in, size_t n, uint8_t salt, cudaStream_t s,
                                uint64_t spin_ns_ = 0)
{
    k_xform<<<grid_for(n), 256, 0, s>>>(out, in, n, salt, spin_ns_);
    CK(cudaGetLastError());
}

static inline void launch_fill(uint8_t *out, size_t n, uint32_t seed, cudaStream_t s, uint64_t spin_ns_ = 0)
{
    k_fill<<<grid_for(n), 256, 0, s>>>(out, n, seed, spin_ns_);
    CK(cudaGetLastError());
}

#define SPIN_50MS ((uint64_t)50 * 1000 * 1000)

// A kernel that only spins (one block), to hold a stream busy.
static inline void launch_spin(cudaStream_t s, uint64_t ns)
{
    k_fill<<<1, 32, 0, s>>>(nullptr, 0, 0, ns);
    CK(cudaGetLastError());
}

// ---------------------------------------------------------------------------------------------
// Host memory
// ---------------------------------------------------------------------------------------------
static inline void *map_anon(size_t n)
{
    void *p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) FAILF("mmap(%zu): %s", n, strerror(errno));
    return p;
}

static inline void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p) FAILF("malloc(%zu) failed", n);
    return p;
}

static inline void *pinned_alloc(size_t n)
{
    void *p = nullptr;
    CK(cudaMallocHost(&p, n));
    return p;
}

// Make a pageable host buffer "hot" for the shim: copy it both ways a few times.
static inline void make_hot(void *h, void *d, size_t n, int times = 4)
{
    for (int i = 0; i < times; i++) {
        CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
    }
}

static inline void device_init(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        FAILF("no CUDA device: %s", cudaGetErrorString(e));
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
}

#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
#define PTDS_BUILD 1
#else
#define PTDS_BUILD 0
#endif
