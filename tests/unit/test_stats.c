/* Statistics: counters, histogram edges, call sites, the JSON file (validated twice: by a small
 * validator here and, when python3 is present, by json.load with checks of the numbers), the text
 * report, and stats_finish's atomic files and single warning. */
#define _GNU_SOURCE
#include "base/config.h"
#include "base/hooks.h"
#include "base/log.h"
#include "base/shim.h"
#include "stats/stats.h"
#include "testutil.h"

#include <dirent.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *empty_env(const char *name) { return NULL; }

/* ---- reading what a writer produced ---- */

static char text[1 << 20];

/* Run writer(fd) into a temporary file and read it back into `text`. */
static size_t capture(void (*writer)(int fd))
{
    char path[] = "/tmp/pinshim-stats-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        perror("mkstemp");
        exit(2);
    }
    unlink(path);
    writer(fd);
    lseek(fd, 0, SEEK_SET);
    size_t len = 0;
    ssize_t n;
    while (len < sizeof text - 1 && (n = read(fd, text + len, sizeof text - 1 - len)) > 0)
        len += (size_t)n;
    text[len] = '\0';
    close(fd);
    return len;
}

static size_t read_file(const char *path)
{
    text[0] = '\0';
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return 0;
    size_t len = 0;
    ssize_t n;
    while (len < sizeof text - 1 && (n = read(fd, text + len, sizeof text - 1 - len)) > 0)
        len += (size_t)n;
    text[len] = '\0';
    close(fd);
    return len;
}

/* ---- a small JSON validator (RFC 8259 grammar; strings must be UTF-8 without raw controls) ---- */

static const char *json_value(const char *p, int depth);

static const char *json_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

static const char *json_string(const char *p)
{
    if (*p++ != '"')
        return NULL;
    while (*p != '"') {
        unsigned char c = (unsigned char)*p;
        if (c < 0x20)
            return NULL;
        if (c == '\\') {
            p++;
            if (*p == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (!strchr("0123456789abcdefABCDEF", p[i]) || !p[i])
                        return NULL;
                p += 5;
            } else if (*p && strchr("\"\\/bfnrt", *p)) {
                p++;
            } else {
                return NULL;
            }
        } else if (c < 0x80) {
            p++;
        } else {
            int len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
            if (!len)
                return NULL;
            for (int i = 1; i < len; i++)
                if (((unsigned char)p[i] & 0xC0) != 0x80)
                    return NULL;
            p += len;
        }
    }
    return p + 1;
}

static const char *json_number(const char *p)
{
    if (*p == '-')
        p++;
    if (*p == '0')
        p++;
    else if (*p >= '1' && *p <= '9')
        while (*p >= '0' && *p <= '9')
            p++;
    else
        return NULL;
    if (*p == '.') {
        p++;
        if (!(*p >= '0' && *p <= '9'))
            return NULL;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-')
            p++;
        if (!(*p >= '0' && *p <= '9'))
            return NULL;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    return p;
}

static const char *json_members(const char *p, int depth, char close, bool keyed)
{
    p = json_ws(p + 1);
    if (*p == close)
        return p + 1;
    for (;;) {
        if (keyed) {
            p = json_string(json_ws(p));
            if (!p)
                return NULL;
            p = json_ws(p);
            if (*p++ != ':')
                return NULL;
        }
        p = json_value(p, depth + 1);
        if (!p)
            return NULL;
        p = json_ws(p);
        if (*p == close)
            return p + 1;
        if (*p++ != ',')
            return NULL;
    }
}

static const char *json_value(const char *p, int depth)
{
    if (depth > 64)
        return NULL;
    p = json_ws(p);
    switch (*p) {
    case '{': return json_members(p, depth, '}', true);
    case '[': return json_members(p, depth, ']', false);
    case '"': return json_string(p);
    case 't': return strncmp(p, "true", 4) ? NULL : p + 4;
    case 'f': return strncmp(p, "false", 5) ? NULL : p + 5;
    case 'n': return strncmp(p, "null", 4) ? NULL : p + 4;
    default: return json_number(p);
    }
}

static bool json_valid(const char *s)
{
    const char *end = json_value(s, 0);
    return end && *json_ws(end) == '\0';
}

/* Check JSON with python3: `checks` are Python statements over `d`; exit status 0 = all hold.
 * Returns -1 when python3 is not there. */
static int python_check(const char *path, const char *checks)
{
    if (system("python3 -c 'pass' >/dev/null 2>&1") != 0)
        return -1;
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import json,sys\nd=json.load(open(sys.argv[1], encoding=\"utf-8\"))\n%s' '%s'",
             checks, path);
    return system(cmd) == 0 ? 0 : 1;
}

/* ---- copies from distinct call sites ---- */

/* Inlined so that each site_* function is the first frame of its own call site. */
static inline __attribute__((always_inline)) void record(enum copy_dir dir, enum mem_kind kind, size_t bytes, uint64_t ns, int is_async,
                   int host_blocked)
{
    struct copy_record r = { dir, kind, bytes, ns, 1, is_async, host_blocked, NULL };
    stats_record_copy(&r);
    stats_record_site(&r);
}

/* A copy whose time was not measured (the copy path times small copies one in a few). */
static void record_untimed(enum copy_dir dir, enum mem_kind kind, size_t bytes)
{
    struct copy_record r = { dir, kind, bytes, 0, 0, 0, 1, NULL };
    stats_record_copy(&r);
    stats_record_site(&r);
}

__attribute__((noinline)) static void site_big_h2d(void)
{
    record(DIR_H2D, MEM_PROMOTED, 64u << 20, 2000000, 0, 1);
    __asm__ volatile("");   /* keep the call from becoming a tail call */
}

__attribute__((noinline)) static void site_async_pageable(void)
{
    for (volatile int staged = 0; staged < 2; staged++)   /* one call site (not unrolled), two paths */
        record(DIR_H2D, staged ? MEM_STAGED : MEM_PAGEABLE, 2u << 20, staged ? 500000 : 1000000, 1, 1);
    __asm__ volatile("");
}

/* Small copies of 100 bytes: the exact ones (less the one the empty D2D copy before them
 * takes), then enough for at least one byte-weighted sample (the gap between samples is at
 * most 1.5 periods). */
#define SMALL_EXACT (STATS_SITE_EXACT_FIRST_SMALL - 1)
#define SMALL_N (SMALL_EXACT + (int)((STATS_SITE_SAMPLE_BYTES_SMALL * 3 / 2 + 99) / 100))

/* Bytes as the report writes them (two decimals, binary units). */
static void human(char *buf, size_t n, double b)
{
    const char *u[] = { "B", "KiB", "MiB", "GiB" };
    int i = 0;
    while (b >= 1024 && i < 3) {
        b /= 1024;
        i++;
    }
    if (i == 0)
        snprintf(buf, n, "%.0f B", b);
    else
        snprintf(buf, n, "%.2f %s", b, u[i]);
}

__attribute__((noinline)) static void site_small(void)
{
    record(DIR_D2H, MEM_PINNED, 100, 1000, 1, 0);
    __asm__ volatile("");
}

/* ---- tests ---- */

static void test_counts_and_histogram(void)
{
    stats_reset();
    CHECK(stats_hist_index(0) == 0);
    CHECK(stats_hist_index(1) == 1);
    CHECK(stats_hist_index(2) == 2 && stats_hist_index(3) == 2);
    CHECK(stats_hist_index(4095) == 12);
    CHECK(stats_hist_index(4096) == 13);
    CHECK(stats_hist_index(UINT64_MAX) == 64);
    CHECK(stats_hist_min_bytes(0) == 0 && stats_hist_min_bytes(1) == 1);
    CHECK(stats_hist_min_bytes(12) == 2048 && stats_hist_min_bytes(13) == 4096);

    struct copy_record copies[] = {
        { DIR_H2D, MEM_PAGEABLE, 4096, 1000, 1, 0, 1, NULL },
        { DIR_H2D, MEM_PAGEABLE, 4096, 3000, 1, 0, 1, NULL },
        { DIR_D2H, MEM_PROMOTED, 1 << 20, 500000, 1, 0, 1, NULL },
        { DIR_D2D, MEM_DEVICE, 0, 10, 1, 1, 0, NULL },
        { DIR_H2H, MEM_STAGED, 4095, 7, 1, 0, 1, NULL },
        { DIR_H2D, MEM_PINNED, 1, 5, 1, 1, 0, NULL },
    };
    for (size_t i = 0; i < sizeof copies / sizeof copies[0]; i++)
        stats_record_copy(&copies[i]);
    struct dir_totals t = stats_dir(DIR_H2D);
    CHECK(t.count == 3 && t.bytes == 8193 && t.ns == 4005);
    t = stats_dir(DIR_D2H);
    CHECK(t.count == 1 && t.bytes == 1 << 20 && t.ns == 500000);
    t = stats_dir(DIR_D2D);
    CHECK(t.count == 1 && t.bytes == 0);
    t = stats_dir(DIR_H2H);
    CHECK(t.count == 1 && t.bytes == 4095);
    CHECK(stats_kind(MEM_PAGEABLE).count == 2 && stats_kind(MEM_PAGEABLE).bytes == 8192);
    CHECK(stats_kind(MEM_PROMOTED).count == 1 && stats_kind(MEM_PINNED).bytes == 1);
    CHECK(stats_kind(MEM_STAGED).count == 1 && stats_kind(MEM_DEVICE).count == 1);
    CHECK(stats_dir(DIR_COUNT).count == 0 && stats_kind(MEM_KIND_COUNT).count == 0);

    CHECK(stats_hist(0).count == 1 && stats_hist(0).bytes == 0);            /* 0 bytes */
    CHECK(stats_hist(1).count == 1 && stats_hist(1).bytes == 1);            /* 1 byte */
    CHECK(stats_hist(12).count == 1 && stats_hist(12).bytes == 4095);       /* [2048, 4096) */
    CHECK(stats_hist(13).count == 2 && stats_hist(13).bytes == 8192);       /* [4096, 8192) */
    CHECK(stats_hist(21).count == 1);                                        /* 1 MiB */
    CHECK(stats_hist(STATS_HIST_BUCKETS).count == 0);

    stats_add(STAT_PROMOTIONS, 3);
    stats_add(STAT_PROMOTIONS, 2);
    CHECK(stats_get(STAT_PROMOTIONS) == 5);
    stats_registered_bytes(10);
    stats_registered_bytes(100);
    stats_registered_bytes(50);
    CHECK(stats_registered_peak() == 100);

    stats_reset();
    CHECK(stats_dir(DIR_H2D).count == 0 && stats_kind(MEM_PAGEABLE).bytes == 0);
    CHECK(stats_hist(13).count == 0 && stats_get(STAT_PROMOTIONS) == 0 && stats_registered_peak() == 0);
}

static void test_json_and_report(void)
{
    stats_reset();
    shim_cfg.callsite_min = 1 << 20;
    for (volatile int i = 0; i < 2; i++)   /* one site: the key includes the caller's frames */
        site_big_h2d();
    site_async_pageable();
    /* Under PINSHIM_CALLSITE_MIN and 1 MiB: the thread's first STATS_SITE_EXACT_FIRST_SMALL such
     * copies are walked one by one, then the one that brings the bytes since to
     * STATS_SITE_SAMPLE_BYTES_SMALL stands for all of them (SMALL_N copies in all, every one
     * attributed). */
    record(DIR_D2D, MEM_DEVICE, 0, 10, 0, 0);
    for (int i = 0; i < SMALL_N; i++)
        site_small();
    stats_add(STAT_PROMOTIONS, 7);
    stats_add(STAT_PROMOTED_BYTES, 3u << 30);
    stats_add(STAT_REGISTER_NS, 1500000000);
    stats_add(STAT_REWRITE_SYNC_TO_ASYNC, 11);
    stats_add(STAT_STAGED_COPIES, 4);
    stats_add(STAT_FORK_CHILD_FREES, 2);
    stats_registered_bytes(5u << 20);

    capture(stats_write_json);
    CHECK(json_valid(text));
    CHECK(strstr(text, "\"version\":1") && strstr(text, "\"mode\":\"full\""));
    CHECK(strstr(text, "\"h2d\":{\"count\":4,\"bytes\":138412032,\"seconds\":0.005500}"));
    CHECK(strstr(text, "{\"min_bytes\":0,\"count\":1,\"bytes\":0}"));
    CHECK(strstr(text, "\"enabled\":true,\"disabled_reason\":\"\""));
    CHECK(strstr(text, "\"async_from_pageable\"") && strstr(text, "\"sync_blocking\""));

    /* The same through python's parser, with the numbers. */
    char path[] = "/tmp/pinshim-json-XXXXXX";
    int fd = mkstemp(path);
    stats_write_json(fd);
    close(fd);
    char checks[4096];
    snprintf(checks, sizeof checks,
        "c=d[\"copies\"]; m=d[\"memory\"]; s=d[\"call_sites\"]\n"
        "assert c[\"h2d\"][\"count\"]==4 and c[\"d2h\"][\"count\"]==%d and c[\"d2d\"][\"count\"]==1\n"
        "assert m[\"promoted\"][\"bytes\"]==128<<20 and m[\"pinned\"][\"count\"]==%d\n"
        "assert d[\"promotions\"][\"count\"]==7 and d[\"promotions\"][\"bytes\"]==3<<30\n"
        "assert d[\"promotions\"][\"registered_bytes_peak\"]==5<<20\n"
        "assert abs(d[\"promotions\"][\"register_seconds\"]-1.5)<1e-9\n"
        "assert d[\"rewrites\"][\"sync_to_async\"]==11 and d[\"staging\"][\"count\"]==4\n"
        "assert d[\"other\"][\"fork_child_frees\"]==2\n"
        "assert [h[\"min_bytes\"] for h in d[\"histogram\"]]==[0,64,1<<21,1<<26]\n"
        "assert len(s)==4 and s[0][\"bytes\"]==128<<20 and s[0][\"count\"]==2\n"
        "assert s[0][\"paths\"][\"promoted\"]==2 and s[0][\"flags\"]==[\"sync_blocking\"]\n"
        "a=[x for x in s if x[\"bytes\"]==4<<20][0]; assert a[\"flags\"]==[\"async_from_pageable\"]\n"
        "assert a[\"flag_paths\"][\"async_from_pageable\"]==[\"pageable\",\"staged\"]\n"
        "p=[x for x in s if x[\"paths\"][\"pinned\"]][0]; assert %d < p[\"count\"] <= %d and p[\"sampled\"], p\n"
        "assert p[\"bytes\"]==p[\"count\"]*100 and p[\"flags\"]==[]\n"
        "assert s[0][\"site\"]!=a[\"site\"] and all(x[\"site\"] for x in s)\n"
        "assert d[\"call_site_exact_first_small\"]==%d and d[\"call_site_sample_bytes_small\"]==%d\n",
        SMALL_N, SMALL_N, SMALL_EXACT, SMALL_N, STATS_SITE_EXACT_FIRST_SMALL, (int)STATS_SITE_SAMPLE_BYTES_SMALL);
    int rc = python_check(path, checks);
    unlink(path);
    if (rc < 0)
        printf("SKIP python3 json checks (no python3)\n");
    else
        CHECKF(rc == 0, "json: python3 json.load reads it and the numbers are right");

    /* Hostile text in the one free-form string still gives valid JSON. */
    stats_promotion_disabled("quote \" backslash \\ newline \n tab \t bad utf8 \xff\xfe end");
    stats_promotion_disabled("a later reason is ignored");
    capture(stats_write_json);
    CHECK(json_valid(text));
    CHECK(strstr(text, "\"enabled\":false") && strstr(text, "quote \\\" backslash \\\\ newline \\u000a"));
    CHECK(strstr(text, "\\ufffd\\ufffd end") && !strstr(text, "later reason"));

    capture(stats_write_report);
    CHECK(strstr(text, "pinshim report, pid ") && strstr(text, "mode full"));
    CHECK(strstr(text, "promotion: disabled: quote"));
    CHECK(strstr(text, "128.00 MiB") && strstr(text, "132.00 MiB"));   /* promoted; h2d total */
    char want[64];
    human(want, sizeof want, (double)SMALL_N * 100);                      /* SMALL_N x 100 bytes */
    CHECKF(strstr(text, want), "report: the small copies' bytes (%s)", want);
    CHECK(strstr(text, "promotions: 7 (3.00 GiB)") && strstr(text, "peak registered 5.00 MiB"));
    CHECK(strstr(text, "11 sync copies made async") && strstr(text, "staging: 4 copies"));
    CHECK(strstr(text, "2 frees in forked children"));
    CHECK(strstr(text, "async_from_pageable; the shim: left pageable, staged"));
    CHECK(strstr(text, "sync_blocking; the shim: promoted"));
    const char *est = text;
    while ((est = strchr(est, '~')) && !(est[1] >= '0' && est[1] <= '9'))
        est++;
    unsigned long long est_n = 0;
    CHECKF(est && sscanf(est, "~%llu copies", &est_n) == 1 && est_n > SMALL_EXACT && est_n <= SMALL_N,
           "report: the sampled site's count (%llu) marked ~ as an estimate", est_n);
    /* h2d: 4 copies, 132 MiB in 5.5 ms = 25.17 GB/s */
    char *h2d = strstr(text, "\nh2d ");
    unsigned long long count = 0;
    CHECK(h2d && sscanf(h2d, "\nh2d %llu", &count) == 1 && count == 4 && strstr(h2d, " 25.17\n"));
    /* promoted share: 128 of 132 MiB + SMALL_N x 100 bytes */
    char *promoted = strstr(text, "\npromoted ");
    snprintf(want, sizeof want, " %.1f%%\n", 100.0 * 128 / (132 + SMALL_N * 100.0 / (1 << 20)));
    CHECKF(promoted && strstr(promoted, want), "report: promoted share%s", want);
    CHECK(strstr(text, ">= 64 B") && strstr(text, ">= 64.00 MiB"));

    stats_reset();
    capture(stats_write_json);
    CHECK(json_valid(text) && strstr(text, "\"call_sites\":[]") && strstr(text, "\"histogram\":[]"));
    CHECK(strstr(text, "\"enabled\":true"));

    shim_cfg.mode = MODE_OBSERVE;
    capture(stats_write_json);
    CHECK(strstr(text, "\"enabled\":false,\"disabled_reason\":\"PINSHIM_MODE=observe\""));
    shim_cfg.mode = MODE_FULL;
    shim_cfg.budget = 0;
    capture(stats_write_json);
    CHECK(strstr(text, "\"disabled_reason\":\"PINSHIM_BUDGET=0\""));
    config_load(empty_env);
}

/* Several threads at once: no count lost (and clean under -fsanitize=thread). */
#define THREADS 4
#define COPIES_PER_THREAD 2000

static void *copy_many(void *arg)
{
    for (int i = 0; i < COPIES_PER_THREAD; i++)
        site_small();
    return arg;
}

static void test_threads(void)
{
    stats_reset();
    shim_cfg.callsite_min = 64;   /* every 100-byte copy takes the walk */
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, copy_many, NULL);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    struct dir_totals d = stats_dir(DIR_D2H);
    CHECK(d.count == THREADS * COPIES_PER_THREAD && d.bytes == 100ull * THREADS * COPIES_PER_THREAD);
    capture(stats_write_json);
    char want[64];
    snprintf(want, sizeof want, "\"count\":%d,\"bytes\":%d,", THREADS * COPIES_PER_THREAD,
             100 * THREADS * COPIES_PER_THREAD);
    CHECK(json_valid(text) && strstr(strstr(text, "\"call_sites\":["), want));
    config_load(empty_env);
}

/* A thread's counts are visible while it runs, and the same after it has exited (its
 * per-thread counters are folded into the totals then). */
static pthread_barrier_t live_barrier;

static void *copy_then_wait(void *arg)
{
    struct copy_record r = { DIR_H2D, MEM_PINNED, 4096, 1000, 1, 0, 1, NULL };
    for (int i = 0; i < 10; i++)
        stats_record_copy(&r);
    stats_count_entry(0);
    pthread_barrier_wait(&live_barrier);   /* counted */
    pthread_barrier_wait(&live_barrier);   /* main has looked */
    return arg;
}

static void test_live_and_exited_threads(void)
{
    stats_reset();
    pthread_barrier_init(&live_barrier, NULL, 4);
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        pthread_create(&t[i], NULL, copy_then_wait, NULL);
    pthread_barrier_wait(&live_barrier);
    struct dir_totals live = stats_dir(DIR_H2D);
    CHECK(live.count == 30 && live.bytes == 30 * 4096 && live.ns == 30 * 1000);
    CHECK(stats_kind(MEM_PINNED).count == 30 && stats_hist(13).count == 30);
    capture(stats_write_json);
    char want[96];
    snprintf(want, sizeof want, "\"entry_points\":{\"%s\":3}", hook_table[0].symbol);
    CHECKF(strstr(text, want) != NULL, "entry_points counts the calls of live threads");
    pthread_barrier_wait(&live_barrier);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    struct dir_totals gone = stats_dir(DIR_H2D);
    CHECK(gone.count == 30 && gone.bytes == 30 * 4096 && gone.ns == 30 * 1000);
    capture(stats_write_json);
    CHECKF(strstr(text, want) != NULL, "entry_points keeps the calls of exited threads");
    pthread_barrier_destroy(&live_barrier);
    stats_reset();
    CHECK(stats_dir(DIR_H2D).count == 0);
}

/* Copy times are taken in CPU ticks where the TSC allows: converted, they must be wall time. */
static void test_copy_clock(void)
{
    uint64_t ns0 = shim_now_ns(), t0 = shim_ticks();
    struct timespec nap = { 0, 30 * 1000 * 1000 };
    nanosleep(&nap, NULL);
    uint64_t took = shim_ns_since(t0), wall = shim_now_ns() - ns0;
    CHECKF(took >= 29000000 && took <= wall + 1000000,
           "30 ms sleep timed as %llu ns by the copy clock (%llu ns by CLOCK_MONOTONIC, TSC %s)",
           (unsigned long long)took, (unsigned long long)wall, shim_tsc_ok ? "used" : "not used");
    CHECK(shim_ns_since(shim_ticks() + 1000000000ull) == 0);   /* a clock going backwards */
}

/* Copies whose time was not measured count and move bytes as usual; their time is the average
 * of the timed ones, in every total and in their call site's. */
__attribute__((noinline)) static void site_partly_timed(int timed)
{
    if (timed)
        record(DIR_H2D, MEM_PAGEABLE, 4096, 8000, 0, 1);
    else
        record_untimed(DIR_H2D, MEM_PAGEABLE, 4096);
    __asm__ volatile("");
}

static void test_partly_timed(void)
{
    stats_reset();
    shim_cfg.callsite_min = 0;   /* every copy takes the walk: one site, weight 1 */
    for (volatile int i = 0; i < 8; i++)
        site_partly_timed(i % 4 == 0);   /* 2 of 8 timed, 8 us each */
    struct dir_totals d = stats_dir(DIR_H2D), k = stats_kind(MEM_PAGEABLE);
    CHECKF(d.count == 8 && d.bytes == 8 * 4096 && d.timed == 2 && d.ns == 64000,
           "direction total: 8 copies, 2 timed, 64 us (%llu, %llu, %llu ns)",
           (unsigned long long)d.count, (unsigned long long)d.timed, (unsigned long long)d.ns);
    CHECK(k.count == 8 && k.timed == 2 && k.ns == 64000);
    record_untimed(DIR_D2H, MEM_PINNED, 100);
    d = stats_dir(DIR_D2H);
    CHECKF(d.count == 1 && d.timed == 0 && d.ns == 0, "no timed copy: no time");

    capture(stats_write_json);
    CHECK(json_valid(text));
    CHECKF(strstr(text, "\"h2d\":{\"count\":8,\"bytes\":32768,\"seconds\":0.000064}") != NULL,
           "json: the direction's seconds are scaled from the timed copies");
    CHECKF(strstr(text, "\"count\":8,\"bytes\":32768,\"seconds\":0.000064,\"sampled\":false") != NULL,
           "json: the call site's seconds too");
    shim_cfg.callsite_min = 64u << 20;
}

static int count_entries(const char *dir, const char *containing)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strstr(e->d_name, containing) != NULL;
    if (d)
        closedir(d);
    return n;
}

static int log_pipe[2];
static char logged[8192];

static void log_capture_start(void)
{
    if (pipe(log_pipe) != 0)
        exit(2);
    fcntl(log_pipe[0], F_SETFL, O_NONBLOCK);
    log_set_fd(log_pipe[1]);
}

static int log_capture_stop(void)
{
    log_set_fd(2);
    close(log_pipe[1]);
    ssize_t n = read(log_pipe[0], logged, sizeof logged - 1);
    logged[n > 0 ? n : 0] = '\0';
    close(log_pipe[0]);
    int lines = 0;
    for (char *c = logged; *c; c++)
        lines += *c == '\n';
    return lines;
}

static void test_finish(void)
{
    char dir[] = "/tmp/pinshim-finish-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        exit(2);
    }
    char want_json[256], want_report[256];
    unsetenv("RANK");
    setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    snprintf(shim_cfg.stats, sizeof shim_cfg.stats, "%s/stats-%%p.json", dir);
    snprintf(shim_cfg.report, sizeof shim_cfg.report, "%s/report-%%r.txt", dir);
    snprintf(want_json, sizeof want_json, "%s/stats-%d.json", dir, (int)getpid());
    snprintf(want_report, sizeof want_report, "%s/report-2.txt", dir);

    stats_reset();
    record(DIR_H2D, MEM_PAGEABLE, 12345, 1000, 0, 1);
    log_capture_start();
    stats_finish();
    CHECK(log_capture_stop() == 0);
    CHECK(read_file(want_json) > 0 && json_valid(text) && strstr(text, "\"bytes\":12345"));
    CHECK(read_file(want_report) > 0 && strstr(text, "pinshim report"));
    CHECK(count_entries(dir, ".tmp") == 0);
    struct stat st;
    mode_t mask = umask(022);
    umask(mask);
    CHECK(stat(want_json, &st) == 0 && (st.st_mode & 0777) == (0644 & ~mask));

    /* Rewriting replaces the file whole. */
    record(DIR_H2D, MEM_PAGEABLE, 1, 1, 0, 1);
    stats_finish();
    CHECK(read_file(want_json) > 0 && json_valid(text) && strstr(text, "\"bytes\":12346"));

    /* A directory that does not exist: one warning naming the variable and the path. */
    shim_cfg.report[0] = '\0';
    snprintf(shim_cfg.stats, sizeof shim_cfg.stats, "%s/missing/stats.json", dir);
    log_capture_start();
    stats_finish();
    CHECK(log_capture_stop() == 1 && strstr(logged, "PINSHIM_STATS") && strstr(logged, "/missing/stats.json"));

    /* The target is a directory: the temporary file gets written, the rename fails; the
     * temporary must not stay. */
    char target[256];
    snprintf(target, sizeof target, "%s/taken", dir);
    mkdir(target, 0755);
    snprintf(shim_cfg.stats, sizeof shim_cfg.stats, "%s", target);
    log_capture_start();
    stats_finish();
    CHECK(log_capture_stop() == 1 && strstr(logged, "PINSHIM_STATS") && strstr(logged, target));
    CHECK(count_entries(dir, ".tmp") == 0);

    /* Same for the report. */
    shim_cfg.stats[0] = '\0';
    snprintf(shim_cfg.report, sizeof shim_cfg.report, "%s", target);
    log_capture_start();
    stats_finish();
    CHECK(log_capture_stop() == 1 && strstr(logged, "PINSHIM_REPORT") && strstr(logged, target));
    CHECK(count_entries(dir, ".tmp") == 0);

    /* An expanded path too long for the buffer: one warning, nothing written. */
    memset(shim_cfg.stats, 'p', sizeof shim_cfg.stats - 1);
    shim_cfg.stats[0] = '/';
    for (size_t i = 1; i + 2 < sizeof shim_cfg.stats; i += 40)
        memcpy(shim_cfg.stats + i, "%p", 2);
    shim_cfg.stats[sizeof shim_cfg.stats - 1] = '\0';
    shim_cfg.report[0] = '\0';
    log_capture_start();
    stats_finish();
    CHECK(log_capture_stop() == 1 && strstr(logged, "PINSHIM_STATS"));

    /* PINSHIM_REPORT=1: the report goes to stderr. */
    shim_cfg.stats[0] = '\0';
    snprintf(shim_cfg.report, sizeof shim_cfg.report, "1");
    int saved = dup(2), p[2];
    if (pipe(p) != 0)
        exit(2);
    dup2(p[1], 2);
    close(p[1]);
    stats_finish();
    dup2(saved, 2);
    close(saved);
    ssize_t n = read(p[0], text, sizeof text - 1);
    text[n > 0 ? n : 0] = '\0';
    close(p[0]);
    CHECK(strstr(text, "pinshim report") != NULL);

    unlink(want_json);
    unlink(want_report);
    rmdir(target);
    CHECK(rmdir(dir) == 0);   /* nothing else was left behind */
    unsetenv("OMPI_COMM_WORLD_RANK");
    shim_cfg.report[0] = '\0';
}

int main(void)
{
    config_load(empty_env);
    test_counts_and_histogram();
    test_json_and_report();
    test_threads();
    test_live_and_exited_threads();
    test_copy_clock();
    test_partly_timed();
    test_finish();
    stats_reset();
    return TEST_SUMMARY();
}
