/* A file mapped through mmap64, the large-file name of mmap (Rust's memmap2 maps through it:
 * safetensors reads its checkpoints so), is memory the shim knows like any mapping:
 *   - a large memcpy out of it into the program's pinned memory (a loader filling its pinned
 *     buffer) is shared among the copy threads in mode full (EXPECTED_BOUNCE: the stats' bounce
 *     count, checked by run_all.sh), and gives the file's bytes;
 *   - a copy from it to the device and back gives the file's bytes;
 *   - munmap lets it go. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#include "drvtest.h"

#define N (8u << 20)

/* Called through a volatile pointer: the compiler must not fold the call. */
static void *(*volatile do_memcpy)(void *, const void *, size_t) = memcpy;

int main(void)
{
    drvtest_init();
    const char *bounce = getenv("PINSHIM_BOUNCE");
    int shares = strcmp(drvtest_mode(), "full") == 0 && !(bounce && strcmp(bounce, "off") == 0);
    printf("EXPECTED_BOUNCE shared=%d\n", shares);

    char path[] = "/tmp/pinshim-mmap64-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    unlink(path);
    unsigned char *content = malloc(N);
    CHECK(content != NULL);
    fill_pattern(content, N, 64);
    CHECK(write(fd, content, N) == (ssize_t)N);
    unsigned char *map = mmap64(NULL, N, PROT_READ, MAP_PRIVATE, fd, 0);
    CHECK(map != MAP_FAILED);
    close(fd);

    unsigned char *pinned;
    CU(cuMemHostAlloc((void **)&pinned, N, 0));
    do_memcpy(pinned, map, N);
    CHECKF(check_pattern(pinned, N, 64), "memcpy out of a file mapped with mmap64 gives the file's bytes");

    CUdeviceptr dev;
    CU(cuMemAlloc(&dev, N));
    CU(cuMemcpyHtoD(dev, map, N));
    memset(content, 0, N);
    CU(cuMemcpyDtoH(content, dev, N));
    CHECKF(check_pattern(content, N, 64), "a copy from a file mapped with mmap64 lands on the device");

    CHECK(munmap(map, N) == 0);
    CU(cuMemFree(dev));
    CU(cuMemFreeHost(pinned));
    free(content);
    printf("EXPECTED_COPIES h2d=1 d2h=1 d2d=0\n");
    return TEST_SUMMARY();
}
