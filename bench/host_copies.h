/* host_copies.h: copy benchmarks on fresh and bounce host buffers, one source for two builds:
 *   bench/gpu_host_copies.cu  the CUDA runtime (cudaMemcpy, cudaMallocHost), built with nvcc by
 *                             bench/run_bench.sh: the one the targets are judged on
 *   bench/drv_host_copies.c   the driver API (cuMemcpyHtoD/DtoH, cuMemHostAlloc), built by make:
 *                             it runs on the checking fake driver too, and on a GPU without nvcc
 * The source is the common part of C11 and C++.
 *
 * Modes (RESULT lines on stdout, a readable line per figure on stderr):
 *   --mode fresh      for each of --sizes (1M,4M,32M) and each direction: a fresh host buffer
 *                     (--kind pageable: malloc; pinned: cudaMallocHost), then --copies (100)
 *                     sync copies, each after a memset of --evict (256M) bytes of another buffer
 *                     so that no cache holds the buffer; only the copies are timed, the first
 *                     one included.  An H2D source is filled by the program first; a D2H
 *                     destination is left as malloc returns it.
 *   --mode two_fresh  two threads at once, one H2D and one D2H, each making --copies (20) copies
 *                     of --size (256M), each from/into a NEW malloc buffer (malloc, copy, free,
 *                     all timed; the H2D source is copied as malloc returns it, so that the
 *                     figure is the allocation and the copy, not the CPU filling 256 MiB);
 *                     aggregate GB/s, --reps (3) timings: the median and the first
 *   --mode bounce     what a framework does when it copies through its own pinned buffers: a
 *                     CPU memcpy of --size (512M) from resident malloc memory into
 *                     cudaMallocHost memory (to_pinned), back (from_pinned), and from pinned
 *                     memory into a destination allocated afresh each time: malloc
 *                     (from_pinned_malloc; never touched without the shim, whose heap gives the
 *                     next one the resident pages of the one freed before) or mmap
 *                     (from_pinned_mmap, never touched); --reps (10) timed copies each, of the
 *                     memcpy alone (the allocation and its release are not timed)
 * --quick: small sizes and counts (a smoke run).
 * Exit status: 0 ok, 1 data mismatch, 2 CUDA error, 3 bad usage or out of memory. */
#ifndef PINSHIM_BENCH_HOST_COPIES_H
#define PINSHIM_BENCH_HOST_COPIES_H

#undef _FORTIFY_SOURCE /* a fortified memcpy would bypass an interposed one (bounce mode) */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench_util.h"

/* ------------------------------------------------------------------ the two APIs */
#ifdef __CUDACC__
#include <cuda_runtime.h>
#define HC_API "runtime"
typedef void *hc_dptr;

static void hc_check(cudaError_t e, const char *what, int line)
{
    if (e == cudaSuccess)
        return;
    fprintf(stderr, "host_copies: line %d: %s: %s\n", line, what, cudaGetErrorString(e));
    exit(2);
}
#define HC_CK(call) hc_check((call), #call, __LINE__)

static void hc_init(void)
{
    HC_CK(cudaSetDevice(0));
    HC_CK(cudaFree(0)); /* the context, before any timing */
}
static void hc_thread_init(void) { HC_CK(cudaSetDevice(0)); }
static const char *hc_device_name(char *buf, size_t n)
{
    cudaDeviceProp prop;
    HC_CK(cudaGetDeviceProperties(&prop, 0));
    snprintf(buf, n, "%s", prop.name);
    return buf;
}
static hc_dptr hc_dev_alloc(size_t n)
{
    void *p = NULL;
    HC_CK(cudaMalloc(&p, n));
    return p;
}
static void hc_dev_free(hc_dptr p) { HC_CK(cudaFree(p)); }
static void *hc_pinned_alloc(size_t n)
{
    void *p = NULL;
    HC_CK(cudaMallocHost(&p, n));
    return p;
}
static void hc_pinned_free(void *p) { HC_CK(cudaFreeHost(p)); }
static void hc_h2d(hc_dptr d, const void *h, size_t n) { HC_CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice)); }
static void hc_d2h(void *h, hc_dptr d, size_t n) { HC_CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost)); }
static void hc_dev_fill(hc_dptr d, int byte, size_t n)
{
    HC_CK(cudaMemset(d, byte, n));
    HC_CK(cudaDeviceSynchronize());
}
static hc_dptr hc_dev_offset(hc_dptr d, size_t off) { return (char *)d + off; }
#else
#include <cuda.h>
#define HC_API "driver"
typedef CUdeviceptr hc_dptr;
static CUcontext hc_ctx;

static void hc_check(CUresult r, const char *what, int line)
{
    if (r == CUDA_SUCCESS)
        return;
    const char *name = NULL;
    if (cuGetErrorName(r, &name) != CUDA_SUCCESS || name == NULL)
        name = "?";
    fprintf(stderr, "host_copies: line %d: %s: %s (%d)\n", line, what, name, (int)r);
    exit(2);
}
#define HC_CK(call) hc_check((call), #call, __LINE__)

static void hc_init(void)
{
    CUdevice dev;
    HC_CK(cuInit(0));
    HC_CK(cuDeviceGet(&dev, 0));
    HC_CK(cuDevicePrimaryCtxRetain(&hc_ctx, dev));
    HC_CK(cuCtxSetCurrent(hc_ctx));
}
static void hc_thread_init(void) { HC_CK(cuCtxSetCurrent(hc_ctx)); }
static const char *hc_device_name(char *buf, size_t n)
{
    CUdevice dev;
    HC_CK(cuDeviceGet(&dev, 0));
    HC_CK(cuDeviceGetName(buf, (int)n, dev));
    return buf;
}
static hc_dptr hc_dev_alloc(size_t n)
{
    CUdeviceptr p = 0;
    HC_CK(cuMemAlloc(&p, n));
    return p;
}
static void hc_dev_free(hc_dptr p) { HC_CK(cuMemFree(p)); }
/* cudaMallocHost is cuMemHostAlloc with no flags underneath. */
static void *hc_pinned_alloc(size_t n)
{
    void *p = NULL;
    HC_CK(cuMemHostAlloc(&p, n, 0));
    return p;
}
static void hc_pinned_free(void *p) { HC_CK(cuMemFreeHost(p)); }
static void hc_h2d(hc_dptr d, const void *h, size_t n) { HC_CK(cuMemcpyHtoD(d, h, n)); }
static void hc_d2h(void *h, hc_dptr d, size_t n) { HC_CK(cuMemcpyDtoH(h, d, n)); }
static void hc_dev_fill(hc_dptr d, int byte, size_t n)
{
    HC_CK(cuMemsetD8(d, (unsigned char)byte, n));
    HC_CK(cuCtxSynchronize());
}
static hc_dptr hc_dev_offset(hc_dptr d, size_t off) { return d + off; }
#endif

/* ------------------------------------------------------------------ shared helpers */
typedef void *(*hc_copy_fn)(void *, const void *, size_t);
/* Called through a pointer so that the call goes to whatever memcpy the dynamic linker bound. */
static hc_copy_fn volatile hc_memcpy = memcpy;
static volatile unsigned hc_sink;

struct hc_opts {
    const char *mode;
    int pinned;
    size_t sizes[8];
    int nsizes;
    size_t size, evict;
    int copies, reps;
};

static void hc_usage(void)
{
    fprintf(stderr,
            "usage: host_copies --mode fresh [--kind pageable|pinned] [--sizes S,S..] [--copies N]\n"
            "                   [--evict SIZE]\n"
            "       host_copies --mode two_fresh [--size SIZE] [--copies N] [--reps N]\n"
            "       host_copies --mode bounce [--size SIZE] [--reps N]\n"
            "       (any mode: --quick)\n");
    exit(3);
}

static size_t hc_need_size(const char *s)
{
    size_t v;
    if (bu_parse_size(s, &v) || v == 0)
        hc_usage();
    return v;
}

static void *hc_malloc(size_t n)
{
    void *p = malloc(n);
    if (p == NULL) {
        fprintf(stderr, "host_copies: out of host memory (%zu bytes)\n", n);
        exit(3);
    }
    return p;
}

static void hc_fill_words(void *p, size_t n, uint32_t seed)
{
    uint32_t *w = (uint32_t *)p;
    for (size_t i = 0; i < n / 4; i++)
        w[i] = bu_pattern(i, seed);
}

/* Checks a word in every 4 KiB and the last one; returns 0 when all match. */
static int hc_check_words(const void *p, size_t n, uint32_t seed)
{
    const uint32_t *w = (const uint32_t *)p;
    size_t words = n / 4;
    for (size_t i = 0; i < words; i += 1024)
        if (w[i] != bu_pattern(i, seed))
            return 1;
    return words && w[words - 1] != bu_pattern(words - 1, seed);
}

/* Checks a byte in every `stride` and the last one; returns 0 when all match. */
static int hc_check_bytes(const void *p, size_t n, int byte, size_t stride)
{
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i += stride)
        if (b[i] != (unsigned char)byte)
            return 1;
    return n && b[n - 1] != (unsigned char)byte;
}

static const char *hc_dir(int h2d) { return h2d ? "h2d" : "d2h"; }

/* ------------------------------------------------------------------ --mode fresh */
static int hc_mode_fresh(const struct hc_opts *o)
{
    size_t maxn = 0;
    for (int s = 0; s < o->nsizes; s++)
        maxn = o->sizes[s] > maxn ? o->sizes[s] : maxn;
    hc_dptr dev = hc_dev_alloc(maxn);
    unsigned char *evict = (unsigned char *)hc_malloc(o->evict);
    memset(evict, 1, o->evict);
    int bad = 0;
    char nm[32];
    for (int s = 0; s < o->nsizes; s++) {
        size_t n = o->sizes[s] & ~(size_t)3;
        for (int h2d = 1; h2d >= 0; h2d--) {
            uint32_t seed = (uint32_t)(s * 2 + h2d + 1);
            void *host = o->pinned ? hc_pinned_alloc(n) : hc_malloc(n);
            if (h2d)
                hc_fill_words(host, n, seed);
            else
                hc_dev_fill(dev, 0x40 + (int)seed, n);
            double total = 0.0, first = 0.0;
            for (int i = 0; i < o->copies; i++) {
                memset(evict, i & 0xff, o->evict);
                hc_sink += evict[(size_t)i * 4099 % o->evict];
                double t0 = bu_now();
                if (h2d)
                    hc_h2d(dev, host, n);
                else
                    hc_d2h(host, dev, n);
                double dt = bu_now() - t0;
                total += dt;
                if (i == 0)
                    first = dt;
            }
            int ok;
            if (h2d) {
                /* The device's first and last 4 KiB against the source. */
                size_t k = n < 4096 ? n : 4096;
                unsigned char *back = (unsigned char *)hc_malloc(k);
                hc_d2h(back, dev, k);
                ok = memcmp(back, host, k) == 0;
                hc_d2h(back, hc_dev_offset(dev, n - k), k);
                ok = ok && memcmp(back, (unsigned char *)host + n - k, k) == 0;
                free(back);
            } else {
                ok = hc_check_bytes(host, n, 0x40 + (int)seed, 4096) == 0;
            }
            if (!ok) {
                fprintf(stderr, "host_copies: MISMATCH after the fresh %s copies of %zu bytes\n",
                        hc_dir(h2d), n);
                bad = 1;
            }
            double gbps = (double)n * o->copies / total / 1e9;
            double steady = o->copies > 1 ? (double)n * (o->copies - 1) / (total - first) / 1e9 : gbps;
            fprintf(stderr, "fresh %-8s %-3s %8s x%d: %7.2f GB/s (first copy %.1f us, the rest %.2f GB/s)\n",
                    o->pinned ? "pinned" : "pageable", hc_dir(h2d), bu_size_name(n, nm, sizeof nm),
                    o->copies, gbps, first * 1e6, steady);
            printf("RESULT bench=fresh api=%s kind=%s dir=%s bytes=%zu copies=%d evict_bytes=%zu "
                   "seconds=%.6f gbps=%.4f first_us=%.1f gbps_rest=%.4f ok=%d\n",
                   HC_API, o->pinned ? "pinned" : "pageable", hc_dir(h2d), n, o->copies, o->evict,
                   total, gbps, first * 1e6, steady, ok);
            fflush(stdout);
            if (o->pinned)
                hc_pinned_free(host);
            else
                free(host);
        }
    }
    free(evict);
    hc_dev_free(dev);
    return bad;
}

/* ------------------------------------------------------------------ --mode two_fresh */
struct hc_two_worker {
    pthread_t tid;
    int h2d;
    hc_dptr dev;
    const struct hc_opts *o;
    pthread_barrier_t *start, *done;
    double t_start, t_end;
    int bad;
};

static void *hc_two_main(void *arg)
{
    struct hc_two_worker *w = (struct hc_two_worker *)arg;
    const struct hc_opts *o = w->o;
    hc_thread_init();
    for (int r = 0; r < o->reps; r++) {
        pthread_barrier_wait(w->start);
        w->t_start = bu_now();
        for (int i = 0; i < o->copies; i++) {
            void *host = hc_malloc(o->size);
            if (w->h2d) {
                hc_h2d(w->dev, host, o->size);
            } else {
                hc_d2h(host, w->dev, o->size);
                /* Sparse, as it is timed: a byte per MiB. */
                w->bad |= hc_check_bytes(host, o->size, 0x6b, 1u << 20);
            }
            free(host);
        }
        w->t_end = bu_now();
        pthread_barrier_wait(w->done);
    }
    return NULL;
}

static int hc_mode_two_fresh(const struct hc_opts *o)
{
    struct hc_two_worker w[2];
    pthread_barrier_t start, done;
    pthread_barrier_init(&start, NULL, 3);
    pthread_barrier_init(&done, NULL, 3);
    double *g = (double *)hc_malloc(sizeof(double) * (size_t)o->reps);
    for (int t = 0; t < 2; t++) {
        memset(&w[t], 0, sizeof w[t]);
        w[t].h2d = t == 0;
        w[t].dev = hc_dev_alloc(o->size);
        w[t].o = o;
        w[t].start = &start;
        w[t].done = &done;
    }
    hc_dev_fill(w[1].dev, 0x6b, o->size); /* what the D2H thread must find */
    for (int t = 0; t < 2; t++)
        if (pthread_create(&w[t].tid, NULL, hc_two_main, &w[t]) != 0) {
            fprintf(stderr, "host_copies: pthread_create failed\n");
            return 3;
        }
    for (int r = 0; r < o->reps; r++) {
        pthread_barrier_wait(&start);
        pthread_barrier_wait(&done);
        double t0 = w[0].t_start < w[1].t_start ? w[0].t_start : w[1].t_start;
        double t1 = w[0].t_end > w[1].t_end ? w[0].t_end : w[1].t_end;
        g[r] = 2.0 * (double)o->size * o->copies / (t1 - t0) / 1e9;
        fprintf(stderr, "two_fresh rep %d: %.2f GB/s aggregate (H2D thread %.3f s, D2H thread %.3f s)\n",
                r + 1, g[r], w[0].t_end - w[0].t_start, w[1].t_end - w[1].t_start);
    }
    for (int t = 0; t < 2; t++)
        pthread_join(w[t].tid, NULL);
    int bad = w[1].bad;
    if (bad)
        fprintf(stderr, "host_copies: MISMATCH in a D2H copy into a fresh buffer\n");
    double first = g[0];
    double lo = bu_min(g, o->reps), hi = bu_max(g, o->reps), med = bu_median(g, o->reps);
    char nm[32];
    fprintf(stderr, "two_fresh %s x%d each way: %.2f GB/s aggregate (median of %d; first %.2f)\n",
            bu_size_name(o->size, nm, sizeof nm), o->copies, med, o->reps, first);
    printf("RESULT bench=two_fresh api=%s threads=2 bytes=%zu copies=%d reps=%d gbps=%.4f "
           "gbps_min=%.4f gbps_max=%.4f gbps_first=%.4f ok=%d\n",
           HC_API, o->size, o->copies, o->reps, med, lo, hi, first, !bad);
    for (int t = 0; t < 2; t++)
        hc_dev_free(w[t].dev);
    free(g);
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&done);
    return bad;
}

/* ------------------------------------------------------------------ --mode bounce */
enum hc_bounce_case { TO_PINNED, FROM_PINNED, FROM_PINNED_MALLOC, FROM_PINNED_MMAP };

static int hc_mode_bounce(const struct hc_opts *o)
{
    static const char *names[] = { "to_pinned", "from_pinned", "from_pinned_malloc", "from_pinned_mmap" };
    static const char *dst_kind[] = { "pinned", "resident", "fresh_malloc", "fresh_mmap" };
    size_t n = o->size & ~(size_t)3;
    void *pinned = hc_pinned_alloc(n);
    void *resident = hc_malloc(n);
    double *g = (double *)hc_malloc(sizeof(double) * (size_t)o->reps);
    int bad = 0;
    char nm[32];
    for (int c = TO_PINNED; c <= FROM_PINNED_MMAP; c++) {
        uint32_t seed = (uint32_t)(c + 11);
        /* The source, filled before the timings; a resident destination touched too. */
        hc_fill_words(c == TO_PINNED ? resident : pinned, n, seed);
        if (c == TO_PINNED)
            memset(pinned, 0, n);
        else if (c == FROM_PINNED)
            memset(resident, 0, n);
        int ok = 1;
        for (int r = 0; r < o->reps; r++) {
            void *src = c == TO_PINNED ? resident : pinned;
            void *dst = c == TO_PINNED ? pinned : resident;
            if (c == FROM_PINNED_MALLOC) {
                dst = hc_malloc(n);
            } else if (c == FROM_PINNED_MMAP) {
                dst = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                if (dst == MAP_FAILED) {
                    fprintf(stderr, "host_copies: mmap of %zu bytes failed\n", n);
                    return 3;
                }
            }
            double t0 = bu_now();
            hc_memcpy(dst, src, n);
            g[r] = (double)n / (bu_now() - t0) / 1e9;
            ok = ok && hc_check_words(dst, n, seed) == 0;
            if (c == FROM_PINNED_MALLOC)
                free(dst);
            else if (c == FROM_PINNED_MMAP)
                munmap(dst, n);
        }
        if (!ok) {
            fprintf(stderr, "host_copies: MISMATCH in memcpy %s\n", names[c]);
            bad = 1;
        }
        double lo = bu_min(g, o->reps), hi = bu_max(g, o->reps), med = bu_median(g, o->reps);
        fprintf(stderr, "bounce memcpy %-18s %8s: %7.2f GB/s (min %.2f, max %.2f)\n", names[c],
                bu_size_name(n, nm, sizeof nm), med, lo, hi);
        printf("RESULT bench=bounce api=%s op=%s dst=%s bytes=%zu reps=%d gbps=%.4f gbps_min=%.4f "
               "gbps_max=%.4f ok=%d\n",
               HC_API, names[c], dst_kind[c], n, o->reps, med, lo, hi, ok);
        fflush(stdout);
    }
    free(g);
    free(resident);
    hc_pinned_free(pinned);
    return bad;
}

/* ------------------------------------------------------------------ main */
static int hc_main(int argc, char **argv)
{
    struct hc_opts o;
    memset(&o, 0, sizeof o);
    o.mode = "";
    o.sizes[0] = 1u << 20;
    o.sizes[1] = 4u << 20;
    o.sizes[2] = 32u << 20;
    o.nsizes = 3;
    o.evict = 256u << 20;
    int copies = -1, reps = -1, quick = 0;
    size_t size = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--quick")) {
            quick = 1;
            continue;
        }
        if (i + 1 >= argc)
            hc_usage();
        const char *v = argv[++i];
        if (!strcmp(a, "--mode")) {
            o.mode = v;
        } else if (!strcmp(a, "--kind")) {
            if (strcmp(v, "pageable") && strcmp(v, "pinned"))
                hc_usage();
            o.pinned = !strcmp(v, "pinned");
        } else if (!strcmp(a, "--sizes")) {
            char buf[256];
            snprintf(buf, sizeof buf, "%s", v);
            o.nsizes = 0;
            for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
                 tok = strtok_r(NULL, ",", &save)) {
                if (o.nsizes == 8)
                    hc_usage();
                o.sizes[o.nsizes++] = hc_need_size(tok);
            }
        } else if (!strcmp(a, "--size")) {
            size = hc_need_size(v);
        } else if (!strcmp(a, "--evict")) {
            o.evict = hc_need_size(v);
        } else if (!strcmp(a, "--copies")) {
            copies = atoi(v);
        } else if (!strcmp(a, "--reps")) {
            reps = atoi(v);
        } else {
            hc_usage();
        }
    }
    int fresh = !strcmp(o.mode, "fresh"), two = !strcmp(o.mode, "two_fresh");
    int bounce = !strcmp(o.mode, "bounce");
    if (!fresh && !two && !bounce)
        hc_usage();
    /* Defaults per mode; --quick shrinks whatever was not given. */
    o.copies = copies > 0 ? copies : fresh ? (quick ? 5 : 100) : (quick ? 3 : 20);
    o.reps = reps > 0 ? reps : bounce ? (quick ? 2 : 10) : (quick ? 1 : 3);
    o.size = size ? size : bounce ? (quick ? 32u << 20 : 512u << 20) : (quick ? 16u << 20 : 256u << 20);
    if (quick && fresh)
        o.evict = o.evict < (16u << 20) ? o.evict : 16u << 20;
    if (o.nsizes == 0 || (copies == 0) || (reps == 0))
        hc_usage();

    hc_init();
    char name[256];
    fprintf(stderr, "host_copies (%s API): %s, mode %s\n", HC_API, hc_device_name(name, sizeof name), o.mode);
    if (fresh)
        return hc_mode_fresh(&o);
    if (two)
        return hc_mode_two_fresh(&o);
    return hc_mode_bounce(&o);
}

#endif
