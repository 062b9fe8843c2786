// fork.cu: contract rule 8, a forked child never calls into CUDA through the shim.
//
// The parent makes several buffers hot (malloc, new[], mmap: promoted under the shim) while a
// background thread keeps copying (so the shim's locks and copy threads are busy at fork time),
// then forks 6 times.  Each child reads the buffers (it sees the parent's data at fork time),
// writes them, frees / deletes / munmaps / reallocs them and other tracked blocks, allocates some
// more, and exits 0 (through exit(), so atexit handlers run) without touching CUDA.  A child that
// hangs (a lock held across fork) is killed after 30 s and the test fails.  After each child the
// parent checks that its buffers still hold its own data (the child's writes are not visible)
// and that copies into and out of them are still correct.
#include "common.cuh"

#include <atomic>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

static uint8_t *d, *d2, *chk;
static uint32_t g_seed = 1;
static std::atomic<bool> g_stop{false};

static void roundtrip(uint8_t *h, size_t n, const char *label)
{
    uint32_t seed = g_seed++;
    uint8_t salt = (uint8_t)(seed + 17);
    fill(h, n, seed);
    CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(chk, d, n, cudaMemcpyDeviceToHost));
    verify_pat(chk, n, seed, label);
    launch_xform(d2, d, n, salt, 0);
    CK(cudaMemcpy(h, d2, n, cudaMemcpyDeviceToHost));
    verify_xf(h, n, seed, salt, label);
}

static void *background(void *)
{
    t_test = "background";
    size_t n = 64 * MiB;
    uint8_t *h = (uint8_t *)xmalloc(n), *bd;
    memset(h, 0, n);
    CK(cudaMalloc(&bd, n));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    uint32_t seed = 99000;
    while (!g_stop.load()) {
        fill(h, 8 * MiB, seed);
        CK(cudaMemcpyAsync(bd, h, n, cudaMemcpyHostToDevice, s));
        memset(h, 0, 8 * MiB);
        CK(cudaMemcpyAsync(h, bd, n, cudaMemcpyDeviceToHost, s));
        verify_pat(h, 8 * MiB, seed, "background copier");
        uint8_t *tmp = (uint8_t *)xmalloc(3 * MiB);  // allocator traffic too
        memset(tmp, 1, 3 * MiB);
        CK(cudaMemcpy(bd, tmp, 3 * MiB, cudaMemcpyHostToDevice));
        free(tmp);
        seed++;
    }
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamDestroy(s));
    CK(cudaFree(bd));
    free(h);
    return nullptr;
}

// The child: no CUDA calls from here on.
static int child(uint8_t *p, size_t pn, uint32_t pseed, uint8_t *q, size_t qn, uint8_t *r, size_t rn, uint8_t *m,
                 size_t mn, int round)
{
    if (first_mismatch(p, pn, pseed, false, 0) != pn) return 3;  // sees the parent's data
    memset(p, 0xCC, pn);                                         // its own copy now
    memset(m, 0xCD, mn);
    free(p);
    free(q);
    delete[] r;
    if (munmap(m, mn) != 0) return 4;
    (void)qn;
    (void)rn;
    // More allocator traffic: large blocks (mmap'd), realloc, small blocks.
    for (int i = 0; i < 8; i++) {
        size_t n = (size_t)(i + 1) * 2 * MiB;
        uint8_t *x = (uint8_t *)malloc(n);
        if (!x) return 5;
        memset(x, i, n);
        uint8_t *y = (uint8_t *)realloc(x, n * 2);
        if (!y || y[n - 1] != (uint8_t)i) return 6;
        free(y);
        void *z = calloc(1000, 7);
        free(z);
    }
    // exit() runs the atexit handlers (the shim's, and the CUDA runtime's own, which the
    // per-thread-default-stream build's runtime does not survive in a child even without the
    // shim); _exit() is the path without them.
    if (PTDS_BUILD || round % 3 == 2) _exit(0);
    exit(0);
}

int main(void)
{
    device_init();
    double t0 = now_ms();
    const size_t CAP = 64 * MiB;
    CK(cudaMalloc(&d, CAP));
    CK(cudaMalloc(&d2, CAP));
    chk = (uint8_t *)pinned_alloc(CAP);

    size_t pn = 32 * MiB + 5, qn = 4 * MiB, rn = 1 * MiB + 3, mn = 16 * MiB;
    uint8_t *p = (uint8_t *)xmalloc(pn);
    uint8_t *q = (uint8_t *)xmalloc(qn);
    uint8_t *r = new uint8_t[rn];
    uint8_t *m = (uint8_t *)map_anon(mn);
    t_test = "hot";
    for (int i = 0; i < 3; i++) {
        roundtrip(p, pn, "parent p before fork");
        roundtrip(q, qn, "parent q before fork");
        roundtrip(r, rn, "parent r before fork");
        roundtrip(m, mn, "parent m before fork");
    }
    pthread_t bg;
    REQUIRE(pthread_create(&bg, nullptr, background, nullptr) == 0, "pthread_create");

    t_test = "fork";
    for (int round = 0; round < 6; round++) {
        uint32_t pseed = 5000 + round;
        fill(p, pn, pseed);
        fill(m, mn, pseed + 1);
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        REQUIRE(pid >= 0, "fork: %s", strerror(errno));
        if (pid == 0) _exit(child(p, pn, pseed, q, qn, r, rn, m, mn, round));
        int status = 0;
        double tw = now_ms();
        for (;;) {
            pid_t w = waitpid(pid, &status, WNOHANG);
            if (w == pid) break;
            REQUIRE(w == 0, "waitpid: %s", strerror(errno));
            if (now_ms() - tw > 30000) {
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
                FAILF("round %d: the child hung for 30 s (a lock held across fork, or a CUDA call in the child?)", round);
            }
            usleep(2000);
        }
        fprintf(stderr, "fork round %d: child took %.0f ms\n", round, now_ms() - tw);
        if (WIFSIGNALED(status)) FAILF("round %d: child killed by signal %d", round, WTERMSIG(status));
        REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0, "round %d: child exit status %d", round, WEXITSTATUS(status));
        // The parent's memory is its own; copies still right.
        verify_pat(p, pn, pseed, "parent p after the child wrote and freed its copy");
        verify_pat(m, mn, pseed + 1, "parent m after the child unmapped its copy");
        roundtrip(p, pn, "parent p after fork");
        roundtrip(m, mn, "parent m after fork");
        roundtrip(q + 1, qn - 1, "parent q after fork");
        roundtrip(r, rn, "parent r after fork");
    }
    g_stop = true;
    pthread_join(bg, nullptr);
    pass("fork.children");

    // And the buffers can still be freed and replaced in the parent.
    t_test = "after";
    free(p);
    free(q);
    delete[] r;
    munmap(m, mn);
    p = (uint8_t *)xmalloc(pn);
    roundtrip(p, pn, "parent new block after fork");
    free(p);
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    CK(cudaFreeHost(chk));
    CK(cudaFree(d));
    CK(cudaFree(d2));
    pass("fork.parent_after");
    fprintf(stderr, "fork: %.0f ms\n", now_ms() - t0);
    return 0;
}
