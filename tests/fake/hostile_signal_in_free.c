/* A signal handler that allocates (as sampling profilers do) must never run inside driver code
 * that the program did not call.  Without the shim, free and munmap run no driver code; with it,
 * freeing or unmapping a promoted block unregisters it, and a real driver takes the C library's
 * locks inside that call: a handler allocating there waits for them forever (the randomized
 * stress run's signal thread hung this way).  The fake driver here raises SIGUSR1 on the calling
 * thread in the middle of every cuMemHostUnregister (fakecuda_set_unregister_signal); the
 * handler counts the times it found itself inside one.
 *
 * A block copied again and again (promoted where the shim promotes: drvtest_wait_registered),
 * then freed; a mapping likewise, then unmapped. Checks, in every variant: the handler never ran
 * inside an unregister the program did not make, and each signal raised in one (one per
 * unregister the fake counted) was delivered, not lost, by the time free or munmap returned.
 * The program never unregisters anything itself. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include "drvtest.h"
#include "fakecuda.h"

#define HANDLER_BYTES 888

static volatile sig_atomic_t handled, inside;

static void handler(int sig)
{
    int saved = errno;
    if (fakecuda_in_unregister())
        inside++;
    unsigned char *volatile p = malloc(HANDLER_BYTES);
    if (p) {
        p[0] = (unsigned char)sig;
        free(p);
    }
    handled++;
    errno = saved;
}

/* Copy [p, p+n) to the device and back until the shim has it registered (or four times where
 * it does not promote); every round trip checked. */
static int copy_until_registered(unsigned char *p, size_t n, CUdeviceptr dev, unsigned seed)
{
    for (int i = 0; i < 4; i++) {
        fill_pattern(p, n, seed + (unsigned)i);
        CU(cuMemcpyHtoD(dev, p, n));
        memset(p, 0, n);
        CU(cuMemcpyDtoH(p, dev, n));
        CHECKF(check_pattern(p, n, seed + (unsigned)i), "round trip %d of %zu bytes", i, n);
    }
    return drvtest_wait_registered(p, n);
}

static void let_go(const char *what, int registered, void (*release)(void *, size_t), void *p, size_t n)
{
    sig_atomic_t before = handled;
    unsigned long unregisters = fakecuda_calls("cuMemHostUnregister");
    release(p, n);
    unregisters = fakecuda_calls("cuMemHostUnregister") - unregisters;
    printf("info: %s: registered before %d, unregisters during it %lu, signals handled %d, inside the "
           "driver %d\n", what, registered, unregisters, (int)(handled - before), (int)inside);
    CHECKF(inside == 0, "%s: the handler never ran inside an unregister the program did not make", what);
    CHECKF(handled - before == (sig_atomic_t)unregisters,
           "%s: each signal raised during an unregister was delivered by the time it returned", what);
}

static void release_heap(void *p, size_t n)
{
    (void)n;
    free(p);
}

static void release_map(void *p, size_t n)
{
    munmap(p, n);
}

int main(void)
{
    drvtest_init();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
    /* The handler's block in this thread's cache before any signal (see hostile_signal_malloc). */
    void *volatile warm = malloc(HANDLER_BYTES);
    free(warm);

    const size_t n = 8u << 20;
    CUdeviceptr dev;
    CU(cuMemAlloc(&dev, n));
    fakecuda_set_unregister_signal(SIGUSR1);

    unsigned char *heap = malloc(n);
    CHECK(heap != NULL);
    int reg = copy_until_registered(heap, n, dev, 10);
    let_go("free of a copied heap block", reg, release_heap, heap, n);

    unsigned char *map = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(map != MAP_FAILED);
    reg = copy_until_registered(map, n, dev, 20);
    let_go("munmap of a copied mapping", reg, release_map, map, n);

    fakecuda_set_unregister_signal(0);
    CU(cuMemFree(dev));
    printf("EXPECTED_COPIES h2d=8 d2h=8 d2d=0\n");
    return TEST_SUMMARY();
}
