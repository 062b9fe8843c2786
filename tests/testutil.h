/* The smallest test harness: each check prints PASS or FAIL with its name; TEST_SUMMARY() prints
 * the totals and gives main's exit status. */
#ifndef PINSHIM_TESTUTIL_H
#define PINSHIM_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tests_passed __attribute__((unused));
static int tests_failed __attribute__((unused));

/* CHECK(cond): named after the condition.  CHECKF(cond, fmt, ...): named by a format. */
#define CHECK(cond) CHECKF(cond, "%s", #cond)
#define CHECKF(cond, ...)                                                   \
    do {                                                                    \
        int check_ok_ = !!(cond);                                           \
        printf(check_ok_ ? "PASS " : "FAIL ");                              \
        printf(__VA_ARGS__);                                                \
        if (check_ok_)                                                      \
            tests_passed++;                                                 \
        else {                                                              \
            tests_failed++;                                                 \
            printf("  [%s:%d: %s]", __FILE__, __LINE__, #cond);             \
        }                                                                   \
        printf("\n");                                                       \
        fflush(stdout);                                                     \
    } while (0)

/* The process's mappings: the lines of /proc/self/maps (-1 when it cannot be read). */
static inline int test_count_mappings(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return -1;
    int n = 0, c;
    while ((c = fgetc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

/* A number of /proc/self/status: the one after "key:" (Threads, VmSize in kB, ...); -1 when it
 * cannot be read. */
static inline long test_status_value(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    long v = -1;
    size_t k = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, k) && line[k] == ':') {
            v = atol(line + k + 1);
            break;
        }
    fclose(f);
    return v;
}

#define TEST_SUMMARY()                                                      \
    (printf("%d passed, %d failed\n", tests_passed, tests_failed),          \
     tests_failed ? 1 : 0)

#endif
