// gpu_block_layout: why do copies from a promoted 2-64 MiB block run below cudaMallocHost speed
// on some machines while copies from a registered mapping do not?  A probe, not part of
// `make bench`'s groups; run it without and with the shim:
//   nvcc -O2 -o gpu_block_layout bench/gpu_block_layout.cu
//   ./gpu_block_layout;  LD_PRELOAD=build/libpinshim.so ./gpu_block_layout
// For 2, 8 and 32 MiB, two rounds of fresh buffers of each kind:
//   pinned      cudaMallocHost
//   malloc+reg  malloc, touched, registered by the program (flags 0): under the shim an arena
//               block the program pinned itself, so its copies take the driver's path untouched
//   malloc+regP the same registered as the shim registers a block: its whole pages, PORTABLE
//   map-thp     a 2 MiB-aligned mapping advised MADV_HUGEPAGE, touched, registered
//   map-4k      a mapping advised MADV_NOHUGEPAGE, touched, registered
//   malloc      malloc, touched, not registered: pageable without the shim, promoted with it
//   malloc+regT malloc+regP registered by another thread
//   malloc-late malloc, four H2D copies (the shim promotes it), 200 ms asleep, then measured
//   read1, read16, read16+flush, read16+demote: malloc, touched, read by 1 or 16 threads (as
//               the shim's staging reads a block), registered, then nothing, every line flushed
//               (CLFLUSHOPT), or each reader's lines demoted (CLDEMOTE) as it finished
//   stage16, stage16nta1024, stage16nta4096: copied twice by 16 threads into a pinned buffer
//               as staging copies (streaming stores), without or with non-temporal prefetches
//               that far ahead of the loads, then registered (and the CPU copy's GB/s)
// GBL_ONLY=a,b picks variants ("rest": the first six and the two malloc- ones).
// Each: H2D, D2H, H2D again, like the sweep (3 warm-up copies, 5 timings of >= 64 MiB, median GB/s),
// and where /proc/self/pagemap shows frame numbers (root), how many physically contiguous runs
// the buffer's pages form and how many of its 2 MiB frames are whole.  It asserts nothing.
#include <cuda_runtime.h>
#include <emmintrin.h>
#include <xmmintrin.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <algorithm>
#include <thread>
#include <vector>

#define CK(x)                                                                                 \
    do {                                                                                      \
        cudaError_t e_ = (x);                                                                 \
        if (e_) {                                                                             \
            printf("ERR %s line %d: %s\n", #x, __LINE__, cudaGetErrorString(e_));             \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static double now()
{
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double bandwidth(char *host, void *dev, size_t n, bool h2d, double *lo, double *hi)
{
    int iters = (int)std::max<size_t>(1, (64u << 20) / n);
    for (int i = 0; i < 3; i++)
        CK(h2d ? cudaMemcpy(dev, host, n, cudaMemcpyHostToDevice) : cudaMemcpy(host, dev, n, cudaMemcpyDeviceToHost));
    std::vector<double> g;
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        for (int i = 0; i < iters; i++)
            CK(h2d ? cudaMemcpy(dev, host, n, cudaMemcpyHostToDevice) : cudaMemcpy(host, dev, n, cudaMemcpyDeviceToHost));
        CK(cudaDeviceSynchronize());
        g.push_back((double)n * iters / (now() - t0) / 1e9);
    }
    std::sort(g.begin(), g.end());
    *lo = g[0];
    *hi = g[4];
    return g[2];
}

// Physically contiguous runs of the pages of [p, p + n), and whole 2 MiB frames; -1 unknown.
static void layout(const char *p, size_t n, long *runs, long *huge)
{
    *runs = *huge = -1;
    int fd = open("/proc/self/pagemap", O_RDONLY);
    if (fd < 0)
        return;
    uintptr_t first = (uintptr_t)p & ~(uintptr_t)4095, end = ((uintptr_t)p + n + 4095) & ~(uintptr_t)4095;
    long r = 0, h = 0, in_frame = 0;
    uint64_t prev = 0;
    for (uintptr_t a = first; a < end; a += 4096) {
        uint64_t e = 0;
        if (pread(fd, &e, 8, (off_t)(a / 4096 * 8)) != 8) {
            close(fd);
            return;
        }
        uint64_t pfn = e & ((1ull << 55) - 1);
        if (!(e >> 63) || !pfn) {
            close(fd);
            return;   // not present, or frame numbers hidden (not root)
        }
        if (a == first || pfn != prev + 1) {
            r++;
            in_frame = 0;
        }
        if (pfn % 512 == 0)
            in_frame = 1;
        else if (in_frame && pfn % 512 == 511)
            h++;
        prev = pfn;
    }
    close(fd);
    *runs = r;
    *huge = h;
}

static void report(const char *name, int round, char *host, void *dev, size_t n)
{
    double lo1, hi1, lo2, hi2;
    double h2d = bandwidth(host, dev, n, true, &lo1, &hi1);
    double d2h = bandwidth(host, dev, n, false, &lo2, &hi2);
    double lo3, hi3, again = bandwidth(host, dev, n, true, &lo3, &hi3);
    long runs, huge;
    layout(host, n, &runs, &huge);
    printf("%-12s r%d %6zu KiB  H2D %6.2f (%.2f-%.2f)  D2H %6.2f (%.2f-%.2f)  H2D again %6.2f (%.2f-%.2f)  off4k %4zu off2m %7zu  runs %ld  2M-frames %ld/%zu\n",
           name, round, n >> 10, h2d, lo1, hi1, d2h, lo2, hi2, again, lo3, hi3, (size_t)((uintptr_t)host & 4095),
           (size_t)((uintptr_t)host & ((2u << 20) - 1)), runs, huge, n >> 21);
    fflush(stdout);
}

static bool want(const char *name)
{
    const char *only = getenv("GBL_ONLY");   // a comma list of variants; all by default
    if (!only)
        return true;
    size_t k = strlen(name);
    for (const char *q = only; (q = strstr(q, name)); q += k)
        if ((q == only || q[-1] == ',') && (q[k] == ',' || q[k] == '\0'))
            return true;
    return false;
}

// Read [p, p + n) from `threads` threads, each its slice, as a staging pass does; demote: each
// reader then hints its lines out of its own caches (CLDEMOTE; a no-op where unsupported).
static void read_spread(const char *p, size_t n, int threads, bool demote)
{
    std::vector<std::thread> t;
    static volatile uint64_t sink;
    for (int k = 0; k < threads; k++)
        t.emplace_back([=] {
            size_t lo = n / threads * k, hi = k == threads - 1 ? n : n / threads * (k + 1);
            uint64_t s = 0;
            for (size_t i = lo; i < hi; i += 64)
                s += *(const volatile uint64_t *)(p + i);
            if (demote)
                for (size_t i = lo; i < hi; i += 64)
                    asm volatile("cldemote %0" ::"m"(p[i]));
            sink += s;
        });
    for (auto &x : t)
        x.join();
}

// Copy [p, p + n) into dst from `threads` threads, each its slice, as the shim's staging does
// (16-byte loads, streaming stores); ahead > 0: each line is first prefetched `ahead` bytes in
// advance with the non-temporal hint.  Returns GB/s.
static double stage_spread(char *dst, const char *p, size_t n, int threads, size_t ahead)
{
    std::vector<std::thread> t;
    double t0 = now();
    for (int k = 0; k < threads; k++)
        t.emplace_back([=] {
            size_t lo = n / threads * k & ~(size_t)63, hi = k == threads - 1 ? n : n / threads * (k + 1) & ~(size_t)63;
            for (size_t i = lo; i + 64 <= hi; i += 64) {
                if (ahead)
                    _mm_prefetch(p + i + ahead, _MM_HINT_NTA);
                __m128i a = _mm_loadu_si128((const __m128i *)(p + i));
                __m128i b = _mm_loadu_si128((const __m128i *)(p + i + 16));
                __m128i c = _mm_loadu_si128((const __m128i *)(p + i + 32));
                __m128i d = _mm_loadu_si128((const __m128i *)(p + i + 48));
                _mm_stream_si128((__m128i *)(dst + i), a);
                _mm_stream_si128((__m128i *)(dst + i + 16), b);
                _mm_stream_si128((__m128i *)(dst + i + 32), c);
                _mm_stream_si128((__m128i *)(dst + i + 48), d);
            }
            _mm_sfence();
        });
    for (auto &x : t)
        x.join();
    return n / (now() - t0) / 1e9;
}

static double flush_lines(const char *p, size_t n)
{
    double t0 = now();
    for (size_t i = 0; i < n; i += 64)
        asm volatile("clflushopt %0" ::"m"(p[i]));
    asm volatile("sfence" ::: "memory");
    return now() - t0;
}

// n bytes at a 2 MiB boundary, advised `advice`; *raw, *len: the whole mapping, for munmap.
static char *map_aligned(size_t n, int advice, char **raw, size_t *len)
{
    *len = (n + (4u << 20)) & ~(size_t)((2u << 20) - 1);
    *raw = (char *)mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (*raw == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    char *p = (char *)(((uintptr_t)*raw + (2u << 20) - 1) & ~(uintptr_t)((2u << 20) - 1));
    madvise(p, n, advice);
    return p;
}

int main()
{
    void *dev;
    CK(cudaMalloc(&dev, 64u << 20));
    size_t sizes[] = {2u << 20, 8u << 20, 32u << 20};
    for (int round = 0; round < 2; round++)
        for (size_t n : sizes) {
            char *pin, *m;
            if (want("pinned")) {
                CK(cudaMallocHost((void **)&pin, n));
                memset(pin, 1, n);
                report("pinned", round, pin, dev, n);
                CK(cudaFreeHost(pin));
            }
            for (size_t ahead : {(size_t)0, (size_t)1024, (size_t)4096}) {
                // staged twice by 16 threads into a pinned buffer, then registered
                char name[32];
                snprintf(name, sizeof name, ahead ? "stage16nta%zu" : "stage16", ahead);
                if (!want(name))
                    continue;
                char *stage;
                CK(cudaMallocHost((void **)&stage, n + 8192));
                m = (char *)malloc(n);
                memset(m, 10, n);
                double g1 = stage_spread(stage, m, n, 16, ahead), g2 = stage_spread(stage, m, n, 16, ahead);
                printf("%s CPU copy of %zu KiB: %.1f, %.1f GB/s\n", name, n >> 10, g1, g2);
                CK(cudaHostRegister(m, n, 0));
                report(name, round, m, dev, n);
                CK(cudaHostUnregister(m));
                free(m);
                CK(cudaFreeHost(stage));
            }
            for (int readers : {1, 16})
                for (int after = 0; after < 3; after++) {
                    // read by `readers` threads, registered, then: nothing, CLFLUSHOPT, CLDEMOTE
                    char name[32];
                    snprintf(name, sizeof name, "read%d%s", readers, after == 1 ? "+flush" : after == 2 ? "+demote" : "");
                    if (!want(name) || (readers == 1 && after))
                        continue;
                    m = (char *)malloc(n);
                    memset(m, 9, n);
                    read_spread(m, n, readers, after == 2);
                    CK(cudaHostRegister(m, n, 0));
                    if (after == 1)
                        printf("flush of %zu KiB: %.3f ms\n", n >> 10, flush_lines(m, n) * 1e3);
                    report(name, round, m, dev, n);
                    CK(cudaHostUnregister(m));
                    free(m);
                }

            if (!want("rest"))
                continue;
            m = (char *)malloc(n);
            memset(m, 2, n);
            CK(cudaHostRegister(m, n, 0));
            report("malloc+reg", round, m, dev, n);
            CK(cudaHostUnregister(m));
            free(m);

            m = (char *)malloc(n);
            memset(m, 3, n);
            char *base = (char *)((uintptr_t)m & ~(uintptr_t)4095);
            size_t len = (((uintptr_t)m + n + 4095) & ~(uintptr_t)4095) - (uintptr_t)base;
            CK(cudaHostRegister(base, len, cudaHostRegisterPortable));
            report("malloc+regP", round, m, dev, n);
            CK(cudaHostUnregister(base));
            free(m);

            for (int huge = 1; huge >= 0; huge--) {
                char *raw;
                size_t raw_len;
                m = map_aligned(n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE, &raw, &raw_len);
                memset(m, 5 - huge, n);
                CK(cudaHostRegister(m, n, 0));
                report(huge ? "map-thp" : "map-4k", round, m, dev, n);
                CK(cudaHostUnregister(m));
                munmap(raw, raw_len);
            }

            m = (char *)malloc(n);
            memset(m, 6, n);
            report("malloc", round, m, dev, n);
            free(m);

            m = (char *)malloc(n);
            memset(m, 7, n);
            std::thread([&] { CK(cudaHostRegister(m, n, cudaHostRegisterPortable)); }).join();
            report("malloc+regT", round, m, dev, n);
            CK(cudaHostUnregister(m));
            free(m);

            m = (char *)malloc(n);
            memset(m, 8, n);
            for (int i = 0; i < 4; i++)
                CK(cudaMemcpy(dev, m, n, cudaMemcpyHostToDevice));
            usleep(200000);
            report("malloc-late", round, m, dev, n);
            free(m);
        }
    CK(cudaFree(dev));
    return 0;
}
