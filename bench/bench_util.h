/* bench_util.h: small helpers shared by the benchmark programs (C and CUDA C++).
 *
 * Every benchmark prints its measurements as lines of the form
 *     RESULT bench=NAME key=value key=value ...
 * on stdout; bench/summarize.py reads those lines.  Everything else a benchmark prints is for
 * people.  No benchmark asserts anything about timings: they only verify their data. */
#ifndef PINSHIM_BENCH_UTIL_H
#define PINSHIM_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline double bu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* "4096", "4K", "64KiB", "256M", "1G" (powers of 1024).  Returns 0 on success. */
static inline int bu_parse_size(const char *s, size_t *out)
{
    char *end = NULL;
    unsigned long long v;
    unsigned long long mul = 1;
    if (s == NULL || *s == '\0')
        return -1;
    v = strtoull(s, &end, 10);
    if (end == s)
        return -1;
    switch (*end) {
    case '\0': break;
    case 'k': case 'K': mul = 1ull << 10; end++; break;
    case 'm': case 'M': mul = 1ull << 20; end++; break;
    case 'g': case 'G': mul = 1ull << 30; end++; break;
    case 't': case 'T': mul = 1ull << 40; end++; break;
    default: return -1;
    }
    if (*end == 'i' || *end == 'I')
        end++;
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end != '\0')
        return -1;
    if (mul != 1 && v > (~0ull) / mul)
        return -1;
    *out = (size_t)(v * mul);
    return 0;
}

/* Human-readable size into buf ("4KiB", "256MiB", "1GiB", else bytes). */
static inline const char *bu_size_name(size_t n, char *buf, size_t bufsz)
{
    static const char *units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    int u = 0;
    size_t v = n;
    while (u < 4 && v >= 1024 && v % 1024 == 0) {
        v /= 1024;
        u++;
    }
    snprintf(buf, bufsz, "%zu%s", v, units[u]);
    return buf;
}

static inline int bu_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[0..n) (sorts v in place). */
static inline double bu_median(double *v, int n)
{
    if (n <= 0)
        return 0.0;
    qsort(v, (size_t)n, sizeof(double), bu_cmp_double);
    if (n % 2)
        return v[n / 2];
    return 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static inline double bu_min(const double *v, int n)
{
    double m = n > 0 ? v[0] : 0.0;
    for (int i = 1; i < n; i++)
        if (v[i] < m)
            m = v[i];
    return m;
}

static inline double bu_max(const double *v, int n)
{
    double m = n > 0 ? v[0] : 0.0;
    for (int i = 1; i < n; i++)
        if (v[i] > m)
            m = v[i];
    return m;
}

/* The batch pattern of the training-style loops: word i of step s. */
static inline uint32_t bu_pattern(size_t i, uint32_t step)
{
    return (uint32_t)i * 2654435761u + step * 40503u + 1u;
}

#endif
