/* The event trace's writer: lines of the shim's own threads wait for a program's thread, which
 * writes them before its own (or at trace_flush), in order, at most 64 of them and then a count
 * of the rest; and a descriptor the program has reused by the time they are written receives
 * none of them (the trace stops). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/config.h"
#include "base/shim.h"
#include "stats/trace.h"
#include "testutil.h"

static char trace_path[] = "/tmp/pinshim-trace-test-XXXXXX";

static const char *test_env(const char *name)
{
    return strcmp(name, "PINSHIM_TRACE") == 0 ? trace_path : NULL;
}

/* Lines in the file at path, and whether line `want` (1-based) holds `text`. */
static int count_lines(const char *path, int want, const char *text, int *found)
{
    FILE *f = fopen(path, "r");
    char buf[1024];
    int n = 0;
    *found = 0;
    while (f && fgets(buf, sizeof buf, f))
        if (++n == want && strstr(buf, text))
            *found = 1;
    if (f)
        fclose(f);
    return n;
}

struct queued { int lines; const char *event; };

/* One of the shim's own threads tracing. */
static void *shim_thread(void *arg)
{
    struct queued *q = arg;
    shim_own_thread = 1;
    for (int i = 0; i < q->lines; i++)
        trace_event(1000, q->event, "i=%d", i);
    return NULL;
}

static void from_shim_thread(int lines, const char *event)
{
    struct queued q = { lines, event };
    pthread_t t;
    CHECK(pthread_create(&t, NULL, shim_thread, &q) == 0);
    pthread_join(t, NULL);
}

int main(void)
{
    int tmp = mkstemp(trace_path);
    CHECK(tmp >= 0);
    close(tmp);
    config_load(test_env);
    trace_open();
    CHECKF(trace_on(), "the trace is open");
    int found;

    trace_event(2000, "first", "k=1");
    CHECKF(count_lines(trace_path, 1, " first k=1", &found) == 1 && found, "a program thread's line is written at once");

    from_shim_thread(3, "queued");
    CHECKF(count_lines(trace_path, 0, "", &found) == 1, "a shim thread's lines wait (file still 1 line)");
    trace_event(2000, "second", "k=2");
    int n = count_lines(trace_path, 2, " queued i=0", &found);
    CHECKF(n == 5 && found, "the program's next line writes them first, in order (%d lines)", n);
    count_lines(trace_path, 5, " second k=2", &found);
    CHECKF(found, "then its own");

    from_shim_thread(70, "many");
    trace_flush();
    n = count_lines(trace_path, 5 + 65, "trace_lost lines=6", &found);
    CHECKF(n == 5 + 64 + 1 && found, "64 waiting lines at most, then a count of the lost (%d lines)", n);
    trace_flush();
    CHECKF(count_lines(trace_path, 0, "", &found) == n, "flushed once");

    /* The program reuses the trace's descriptor number for a file of its own. */
    from_shim_thread(2, "late");
    char mine_path[] = "/tmp/pinshim-trace-mine-XXXXXX";
    int mine = mkstemp(mine_path);
    CHECK(mine >= 0);
    CHECK(dup2(mine, trace_fd) == trace_fd);
    trace_event(2000, "after", "k=3");
    off_t len = lseek(mine, 0, SEEK_END);
    CHECKF(len == 0, "the program's file received nothing (%lld bytes)", (long long)len);
    CHECKF(!trace_on(), "the trace stopped");
    CHECKF(count_lines(trace_path, 0, "", &found) == n, "the trace file did not grow");
    close(mine);
    unlink(mine_path);
    unlink(trace_path);
    return TEST_SUMMARY();
}
