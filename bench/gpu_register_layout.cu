// gpu_register_layout: does the layout of registered host memory change the copy engine's speed?
// A probe, not part of `make bench`'s groups (bench/RESULTS.md, run 14, has its output):
//   nvcc -O2 -o gpu_register_layout bench/gpu_register_layout.cu && ./gpu_register_layout
// Copies of 1, 4 and 8 MiB, each direction, between the device and: cudaMallocHost memory; an
// 80 MiB mapping advised MADV_NOHUGEPAGE, touched and registered whole, copied from byte offsets
// 0, 16, 64 and 2048; the same advised MADV_HUGEPAGE; and a registration of one block's pages
// inside the 4 KiB mapping (as the shim registers an arena block).  "tight": back to back,
// 256 MiB per timing; "evict": a 256 MiB memset of another buffer before each of 40 copies.
// Median GB/s of 5 timings.  It asserts nothing.
#include <cuda_runtime.h>
#include <cuda.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <stdint.h>
#include <vector>
#include <algorithm>
#define CK(x) do { cudaError_t e = (x); if (e) { printf("ERR %s line %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)
static double now() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static char *evict;
static size_t EV = 256u << 20;
static void test(const char *name, char *host, void *dev, size_t n, bool h2d, bool ev) {
    int iters = ev ? 40 : (int)std::max<size_t>(8, (256u << 20) / n);
    std::vector<double> g;
    for (int r = 0; r < 5; r++) {
        double tot = 0;
        for (int i = 0; i < iters; i++) {
            if (ev) memset(evict, i, EV);
            double t0 = now();
            if (h2d) CK(cudaMemcpy(dev, host, n, cudaMemcpyHostToDevice));
            else CK(cudaMemcpy(host, dev, n, cudaMemcpyDeviceToHost));
            tot += now() - t0;
        }
        g.push_back(n * (double)iters / tot / 1e9);
    }
    std::sort(g.begin(), g.end());
    printf("%-28s %5zu KiB %s %s %7.2f GB/s (min %.2f max %.2f)\n", name, n >> 10, h2d ? "H2D" : "D2H",
           ev ? "evict" : "tight", g[2], g[0], g[4]);
    fflush(stdout);
}
int main() {
    void *dev; CK(cudaMalloc(&dev, 64u << 20));
    evict = (char *)malloc(EV); memset(evict, 1, EV);
    size_t sizes[] = {1u << 20, 4u << 20, 8u << 20};
    char *pin; CK(cudaMallocHost((void **)&pin, 80u << 20)); memset(pin, 3, 80u << 20);
    // 4K-page mapping, no THP
    size_t L = 80u << 20;
    char *m4 = (char *)mmap(NULL, L, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    madvise(m4, L, MADV_NOHUGEPAGE); memset(m4, 3, L);
    CK(cudaHostRegister(m4, L, 0));
    // THP mapping
    char *raw = (char *)mmap(NULL, L + (2u << 20), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *mh = (char *)(((uintptr_t)raw + (2u << 20) - 1) & ~(uintptr_t)((2u << 20) - 1));
    int hr = madvise(mh, L, MADV_HUGEPAGE); memset(mh, 3, L);
    CK(cudaHostRegister(mh, L, 0));
    printf("MADV_HUGEPAGE rc %d\n", hr);
    for (size_t n : sizes) for (int ev = 0; ev < 2; ev++) for (int d = 0; d < 2; d++) {
        bool h2d = d == 0;
        test("cudaMallocHost", pin, dev, n, h2d, ev);
        test("register 4K off 0", m4, dev, n, h2d, ev);
        test("register 4K off 64", m4 + 64, dev, n, h2d, ev);
        test("register 4K off 2048", m4 + 2048, dev, n, h2d, ev);
        test("register 4K off 16", m4 + 16, dev, n, h2d, ev);
        test("register THP off 0", mh, dev, n, h2d, ev);
        test("register THP off 64", mh + 64, dev, n, h2d, ev);
    }
    // registration of just the block (like the shim's promoted block inside an arena segment)
    for (size_t n : sizes) {
        char *b = m4 + (16u << 20);
        CK(cudaHostUnregister(m4));
        CK(cudaHostRegister(b, n + 4096, 0));
        test("block-only reg off 64", b + 64, dev, n, true, false);
        test("block-only reg off 64", b + 64, dev, n, false, false);
        test("block-only reg off 64", b + 64, dev, n, true, true);
        CK(cudaHostUnregister(b));
        CK(cudaHostRegister(m4, L, 0));
    }
    return 0;
}
