/* A program that closes every descriptor it did not open (as daemons and sandboxes do), then
 * opens files of its own under every number up to 1023, copies (2 and 4 MiB each way, a 4 MiB
 * memcpy into and out of pinned memory) and checks that each file holds exactly what it wrote.
 * The shim's own descriptors (its event trace, PINSHIM_TRACE, which tests/check_trace.sh sets
 * for this program) must never carry a line into one of them: a write through a descriptor
 * the program has reused is data corruption. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <unistd.h>
#include "drvtest.h"
#include "fakecuda.h"

#define MAX_FD 1024
#define MB (1u << 20)

int main(void)
{
    drvtest_init();
    printf("mode=%s\n", drvtest_mode());
    CUdeviceptr dev;
    CU(cuMemAlloc(&dev, 4 * MB));
    char *host = malloc(4 * MB), *pinned = NULL;
    CU(cuMemHostAlloc((void **)&pinned, 4 * MB, 0));
    CHECK(host && pinned);

    for (int fd = 3; fd < MAX_FD; fd++)
        close(fd);
    char path[] = "/tmp/pinshim-close-fds.XXXXXX";
    int base = mkstemp(path);
    CHECKF(base >= 0, "a file of the program's own");
    if (base < 0)
        return TEST_SUMMARY();
    unlink(path);
    int taken = 0;
    for (int fd = 3; fd < MAX_FD; fd++) {
        if (fd == base)
            continue;
        /* EBUSY: another thread's open() holds the number for a moment (the checking fake
         * driver reads /proc/self/maps in cuMemHostRegister, which the shim's staging builder
         * calls on its own thread); a program tries again, as this one does. */
        int r, tries = 0;
        while ((r = dup2(base, fd)) < 0 && errno == EBUSY && ++tries < 1000)
            sched_yield();
        taken += r == fd;
    }
    CHECKF(taken >= MAX_FD - 4, "%d descriptors of the program's own", taken);

    for (int i = 0; i < 4; i++) {
        size_t n = (i % 2 ? 4 : 2) * MB;
        fill_pattern(host, n, (unsigned)i);
        CU(cuMemcpyHtoD(dev, host, n));
        memset(host, 0, n);
        CU(cuMemcpyDtoH(host, dev, n));
        CHECKF(check_pattern(host, n, (unsigned)i), "round trip %d of %zu bytes", i, n);
        memcpy(pinned, host, n);
        memset(host, 0, n);
        memcpy(host, pinned, n);
        CHECKF(check_pattern(host, n, (unsigned)i), "memcpy through pinned memory %d", i);
    }
    static const char mine[] = "the program's own bytes\n";
    CHECK(write(base, mine, sizeof mine - 1) == (ssize_t)(sizeof mine - 1));
    off_t len = lseek(base, 0, SEEK_END);
    CHECKF(len == (off_t)(sizeof mine - 1), "the program's file holds %lld bytes, it wrote %zu", (long long)len,
           sizeof mine - 1);

    CU(cuMemFreeHost(pinned));
    CU(cuMemFree(dev));
    free(host);
    CHECKF(fakecuda_violations() == 0, "no violations (%lu)", fakecuda_violations());
    return TEST_SUMMARY();
}
