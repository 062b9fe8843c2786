// gpu_bandwidth: host<->device copy bandwidth and latency with plain cudaMemcpy.
//
// Modes (each prints "RESULT bench=... key=value ..." lines on stdout, a readable line on stderr):
//   --mode sweep    bandwidth vs size, --min 4K .. --max 1G by --factor 2, for --kinds
//                   pageable (a malloc'ed buffer per size) and pinned (cudaMallocHost, the
//                   ceiling), --dirs h2d,d2h.  Per size: --warmup copies, then --reps timings of
//                   enough copies (>= --target bytes, at most --max-iters) each; the median.
//   --mode loop     one --size buffer (256M) copied H2D then D2H --iters (50) times, --kind
//                   pageable|pinned; everything timed (promotion included), data verified.
//   --mode latency  median latency of --count (2000) single sync copies of each of --sizes
//                   (4K,16K,64K), pinned and pageable, both directions.
//   --mode staging  --size (256M) pageable copies each way, --reps (7) timings; meant to be run
//                   under PINSHIM_BUDGET smaller than the buffer so the shim must stage it.
// Exit status: 0 ok, 1 data mismatch, 2 CUDA error, 3 bad usage.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <string>

#include "bench_util.h"

#define CK(call)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "gpu_bandwidth: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,     \
                    cudaGetErrorString(e_));                                                  \
            exit(2);                                                                          \
        }                                                                                     \
    } while (0)

struct opts {
    std::string mode = "sweep";
    size_t min = 4u << 10, max = 1u << 30, size = 256u << 20, target = 64u << 20;
    int factor = 2, reps = 5, warmup = 3, iters = 50, count = 2000, max_iters = 2000;
    bool pageable = true, pinned = true, h2d = true, d2h = true;
    std::vector<size_t> sizes = {4u << 10, 16u << 10, 64u << 10};
};

static void usage()
{
    fprintf(stderr,
            "usage: gpu_bandwidth --mode sweep|loop|latency|staging [--min S] [--max S] [--factor 2|4]\n"
            "       [--reps N] [--warmup N] [--target S] [--max-iters N] [--kinds pageable,pinned]\n"
            "       [--kind pageable|pinned] [--dirs h2d,d2h] [--size S] [--iters N] [--count N]\n"
            "       [--sizes S,S,...]\n");
    exit(3);
}

static size_t need_size(const char *s)
{
    size_t v;
    if (bu_parse_size(s, &v) || v == 0)
        usage();
    return v;
}

static void parse_list(const char *s, bool *a, const char *na, bool *b, const char *nb)
{
    *a = strstr(s, na) != NULL;
    *b = strstr(s, nb) != NULL;
    if (!*a && !*b)
        usage();
}

static double now() { return bu_now(); }

static void copy(void *host, void *dev, size_t n, bool h2d)
{
    if (h2d)
        CK(cudaMemcpy(dev, host, n, cudaMemcpyHostToDevice));
    else
        CK(cudaMemcpy(host, dev, n, cudaMemcpyDeviceToHost));
}

static const char *dname(bool h2d) { return h2d ? "h2d" : "d2h"; }

// Median GB/s of reps timings of `iters` copies of n bytes.
static double bandwidth(void *host, void *dev, size_t n, bool h2d, const opts &o, double *lo,
                        double *hi)
{
    int iters = (int)(o.target / n);
    if (iters < 1) iters = 1;
    if (iters > o.max_iters) iters = o.max_iters;
    for (int i = 0; i < o.warmup; i++)
        copy(host, dev, n, h2d);
    CK(cudaDeviceSynchronize());
    std::vector<double> g(o.reps);
    for (int r = 0; r < o.reps; r++) {
        double t0 = now();
        for (int i = 0; i < iters; i++)
            copy(host, dev, n, h2d);
        CK(cudaDeviceSynchronize());
        g[r] = (double)n * iters / (now() - t0) / 1e9;
    }
    *lo = bu_min(g.data(), o.reps);
    *hi = bu_max(g.data(), o.reps);
    return bu_median(g.data(), o.reps);
}

static void *host_buffer(size_t n, bool pinned)
{
    void *p = NULL;
    if (pinned) {
        CK(cudaMallocHost(&p, n));
    } else {
        p = malloc(n);
        if (!p) {
            fprintf(stderr, "gpu_bandwidth: out of host memory (%zu bytes)\n", n);
            exit(3);
        }
    }
    memset(p, 0x5a, n);
    return p;
}

static void host_free(void *p, bool pinned)
{
    if (pinned)
        CK(cudaFreeHost(p));
    else
        free(p);
}

static int mode_sweep(const opts &o)
{
    void *dev, *pin = NULL;
    CK(cudaMalloc(&dev, o.max));
    if (o.pinned)
        pin = host_buffer(o.max, true);
    char nm[32];
    for (size_t n = o.min; n <= o.max; n *= (size_t)o.factor) {
        for (int k = 0; k < 2; k++) {
            bool pinned = k == 1;
            if ((pinned && !o.pinned) || (!pinned && !o.pageable))
                continue;
            void *host = pinned ? pin : host_buffer(n, false);
            for (int d = 0; d < 2; d++) {
                bool h2d = d == 0;
                if ((h2d && !o.h2d) || (!h2d && !o.d2h))
                    continue;
                double lo, hi, med = bandwidth(host, dev, n, h2d, o, &lo, &hi);
                fprintf(stderr, "%-8s %-3s %8s %8.2f GB/s\n", pinned ? "pinned" : "pageable",
                        dname(h2d), bu_size_name(n, nm, sizeof nm), med);
                printf("RESULT bench=bandwidth kind=%s dir=%s bytes=%zu gbps=%.4f gbps_min=%.4f "
                       "gbps_max=%.4f reps=%d\n",
                       pinned ? "pinned" : "pageable", dname(h2d), n, med, lo, hi, o.reps);
                fflush(stdout);
            }
            if (!pinned)
                free(host);
        }
        if (n > o.max / (size_t)o.factor)
            break;
    }
    if (pin)
        CK(cudaFreeHost(pin));
    CK(cudaFree(dev));
    return 0;
}

static int mode_loop(const opts &o, bool pinned)
{
    void *dev;
    size_t n = o.size & ~(size_t)3;
    CK(cudaMalloc(&dev, n));
    uint32_t *host = (uint32_t *)host_buffer(n, pinned);
    for (size_t i = 0; i < n / 4; i++)
        host[i] = bu_pattern(i, 7);
    CK(cudaDeviceSynchronize());
    double t0 = now(), first = 0.0;
    for (int i = 0; i < o.iters; i++) {
        copy(host, dev, n, true);
        copy(host, dev, n, false);
        if (i == 0)
            first = now() - t0;
    }
    CK(cudaDeviceSynchronize());
    double secs = now() - t0;
    int ok = 1;
    for (size_t i = 0; i < n / 4; i += 1021)
        if (host[i] != bu_pattern(i, 7)) {
            fprintf(stderr, "gpu_bandwidth: MISMATCH at word %zu\n", i);
            ok = 0;
            break;
        }
    double gbps = 2.0 * (double)n * o.iters / secs / 1e9;
    char nm[32];
    fprintf(stderr, "loop %s %s H2D+D2H x%d: %.3f s, %.2f GB/s (first round trip %.1f ms)\n",
            pinned ? "pinned" : "pageable", bu_size_name(n, nm, sizeof nm), o.iters, secs, gbps,
            first * 1e3);
    printf("RESULT bench=loop kind=%s bytes=%zu iters=%d seconds=%.6f gbps=%.4f first_s=%.6f ok=%d\n",
           pinned ? "pinned" : "pageable", n, o.iters, secs, gbps, first, ok);
    host_free(host, pinned);
    CK(cudaFree(dev));
    return ok ? 0 : 1;
}

static int mode_latency(const opts &o)
{
    size_t maxn = 0;
    for (size_t s : o.sizes)
        maxn = s > maxn ? s : maxn;
    void *dev;
    CK(cudaMalloc(&dev, maxn));
    std::vector<double> us(o.count);
    char nm[32];
    for (size_t n : o.sizes) {
        for (int k = 0; k < 2; k++) {
            bool pinned = k == 1;
            if ((pinned && !o.pinned) || (!pinned && !o.pageable))
                continue;
            void *host = host_buffer(n, pinned);
            for (int d = 0; d < 2; d++) {
                bool h2d = d == 0;
                if ((h2d && !o.h2d) || (!h2d && !o.d2h))
                    continue;
                for (int i = 0; i < 50; i++)
                    copy(host, dev, n, h2d);
                CK(cudaDeviceSynchronize());
                for (int i = 0; i < o.count; i++) {
                    double t0 = now();
                    copy(host, dev, n, h2d);
                    us[i] = (now() - t0) * 1e6;
                }
                double p10, p90;
                std::vector<double> c = us;
                double med = bu_median(c.data(), o.count); // sorts c
                p10 = c[o.count / 10];
                p90 = c[(o.count * 9) / 10];
                fprintf(stderr, "latency %-8s %-3s %6s median %.2f us\n", pinned ? "pinned" : "pageable",
                        dname(h2d), bu_size_name(n, nm, sizeof nm), med);
                printf("RESULT bench=latency kind=%s dir=%s bytes=%zu us_median=%.3f us_p10=%.3f "
                       "us_p90=%.3f count=%d\n",
                       pinned ? "pinned" : "pageable", dname(h2d), n, med, p10, p90, o.count);
            }
            host_free(host, pinned);
        }
    }
    CK(cudaFree(dev));
    return 0;
}

static int mode_staging(const opts &o)
{
    void *dev;
    size_t n = o.size;
    CK(cudaMalloc(&dev, n));
    void *host = host_buffer(n, false);
    char nm[32];
    for (int d = 0; d < 2; d++) {
        bool h2d = d == 0;
        if ((h2d && !o.h2d) || (!h2d && !o.d2h))
            continue;
        for (int i = 0; i < 2; i++)
            copy(host, dev, n, h2d);
        CK(cudaDeviceSynchronize());
        std::vector<double> g(o.reps);
        for (int r = 0; r < o.reps; r++) {
            double t0 = now();
            copy(host, dev, n, h2d);
            CK(cudaDeviceSynchronize());
            g[r] = (double)n / (now() - t0) / 1e9;
        }
        double lo = bu_min(g.data(), o.reps), hi = bu_max(g.data(), o.reps);
        double med = bu_median(g.data(), o.reps);
        fprintf(stderr, "staging pageable %s %s: %.2f GB/s\n", dname(h2d),
                bu_size_name(n, nm, sizeof nm), med);
        printf("RESULT bench=staging kind=pageable dir=%s bytes=%zu gbps=%.4f gbps_min=%.4f "
               "gbps_max=%.4f reps=%d\n",
               dname(h2d), n, med, lo, hi, o.reps);
    }
    free(host);
    CK(cudaFree(dev));
    return 0;
}

int main(int argc, char **argv)
{
    opts o;
    std::string kind = "pageable";
    bool reps_set = false;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL) usage();
        i++;
        if (a == "--mode") o.mode = v;
        else if (a == "--min") o.min = need_size(v);
        else if (a == "--max") o.max = need_size(v);
        else if (a == "--size") o.size = need_size(v);
        else if (a == "--target") o.target = need_size(v);
        else if (a == "--factor") o.factor = atoi(v);
        else if (a == "--reps") { o.reps = atoi(v); reps_set = true; }
        else if (a == "--warmup") o.warmup = atoi(v);
        else if (a == "--iters") o.iters = atoi(v);
        else if (a == "--count") o.count = atoi(v);
        else if (a == "--max-iters") o.max_iters = atoi(v);
        else if (a == "--kinds") parse_list(v, &o.pageable, "pageable", &o.pinned, "pinned");
        else if (a == "--kind") kind = v;
        else if (a == "--dirs") parse_list(v, &o.h2d, "h2d", &o.d2h, "d2h");
        else if (a == "--sizes") {
            o.sizes.clear();
            std::string s = v;
            size_t pos = 0;
            while (pos <= s.size()) {
                size_t c = s.find(',', pos);
                if (c == std::string::npos) c = s.size();
                o.sizes.push_back(need_size(s.substr(pos, c - pos).c_str()));
                pos = c + 1;
            }
        } else usage();
    }
    if (o.factor < 2 || o.reps < 1 || o.warmup < 0 || o.iters < 1 || o.count < 10 ||
        o.max_iters < 1 || o.min > o.max || (kind != "pageable" && kind != "pinned"))
        usage();

    CK(cudaSetDevice(0));
    CK(cudaFree(0)); // create the context before any timing
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    fprintf(stderr, "gpu_bandwidth: %s, mode %s\n", prop.name, o.mode.c_str());

    if (o.mode == "sweep") return mode_sweep(o);
    if (o.mode == "loop") return mode_loop(o, kind == "pinned");
    if (o.mode == "latency") return mode_latency(o);
    if (o.mode == "staging") {
        if (!reps_set) o.reps = 7;
        return mode_staging(o);
    }
    usage();
    return 3;
}
