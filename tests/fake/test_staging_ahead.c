/* The program's first device allocation has the shim build its staging buffers
 * (copy/staging.c, on_mem_alloc), so that the process's first copy finds them built rather than
 * registering its own block beside them: on a real driver the two registrations wait for each
 * other (an H100 host: a 1 MiB first copy took 10.8 ms, 3.3 of them its registration behind
 * the buffers' 7.6).
 *
 * Where the shim stages with its defaults (mode full, no budget or staging setting), memory is
 * registered after cuMemAlloc and before any copy, and the first copy, 1 MiB from a fresh
 * resident buffer, is staged: its block is not registered (EXPECTED_STAGED). Without the shim,
 * and where the shim does not stage (modes off, observe, pin), cuMemAlloc registers nothing.
 * The copy threads are started there too (on a machine of more than one CPU), not by the first
 * staged copy. Every byte lands in every variant. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#include "drvtest.h"
#include "fakecuda.h"

/* Threads of this process named as the shim names its copy threads. */
static int copy_threads(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[300], name[32] = "";
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        ssize_t len = read(fd, name, sizeof name - 1);
        close(fd);
        if (len > 0 && !strncmp(name, "pinshim-copy", 12))
            count++;
    }
    closedir(d);
    return count;
}

int main(void)
{
    drvtest_init();
    const char *mode = drvtest_mode();
    int stages_by_default = !strcmp(mode, "full") && !getenv("PINSHIM_BUDGET") &&
                            !getenv("PINSHIM_STAGING_MIN") && !getenv("PINSHIM_STAGING_CHUNK");
    int never_stages = !strcmp(mode, "none") || !strcmp(mode, "off") || !strcmp(mode, "observe") ||
                       !strcmp(mode, "pin");
    const size_t n = 1u << 20;
    unsigned char *src = malloc(n), *back = malloc(n);
    CHECK(src != NULL && back != NULL);
    fill_pattern(src, n, 41);
    memset(back, 0, n);
    CHECKF(fakecuda_registered_bytes() == 0, "nothing registered before the program's first cuMemAlloc");

    CUdeviceptr dev;
    CU(cuMemAlloc(&dev, n));
    /* The buffers are built by a thread of their own: wait for their registration (5 s at most),
     * then for the thread to mark them built. */
    size_t ahead = 0;
    for (int i = 0; i < 500 && !(ahead = fakecuda_registered_bytes()); i++)
        drvtest_sleep_ms(10);
    drvtest_sleep_ms(200);
    printf("info: mode %s: %zu bytes registered after cuMemAlloc, before any copy\n", mode, ahead);
    if (stages_by_default)
        CHECKF(ahead > 0, "the staging buffers are registered after the first cuMemAlloc, before any copy");
    if (never_stages)
        CHECKF(ahead == 0, "cuMemAlloc registers nothing where the shim does not stage (mode %s)", mode);
    cpu_set_t cpus;
    int several = sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) > 1;
    int threads = copy_threads();
    printf("info: %d copy threads before the first copy\n", threads);
    if (stages_by_default && several && !getenv("PINSHIM_COPY_THREADS"))
        CHECKF(threads > 0, "the copy threads are started with the staging buffers, before the first copy");
    if (never_stages)
        CHECKF(threads == 0, "no copy threads where the shim does not stage (mode %s)", mode);

    CU(cuMemcpyHtoD(dev, src, n));
    if (stages_by_default)
        CHECKF(!fakecuda_registered(src, n), "the first copy, 1 MiB, is staged: its block is not registered");
    CU(cuMemcpyDtoH(back, dev, n));
    CHECKF(check_pattern(back, n, 41), "the first copies' bytes land");
    CU(cuMemFree(dev));
    free(src);
    free(back);
    printf("EXPECTED_COPIES h2d=1 d2h=1 d2d=0\n");
    printf("EXPECTED_ENTRIES cuMemAlloc_v2=1\n");
    if (stages_by_default)
        printf("EXPECTED_STAGED copies=2\n");
    return TEST_SUMMARY();
}
