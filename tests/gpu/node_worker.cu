// node_worker.cu: one process of a node-budget job (tests/gpu/node_budget.sh,
// tests/gpu/run_multi_gpu.sh); with no arguments a short correctness run (run_gpu_tests.sh).
//
//   node_worker [K [SIZE_MiB [HOLD_S [ROUNDS]]]] [--barrier DIR N]
//
// Allocates K pageable (malloc) host buffers of SIZE_MiB each (default 4 x 32 MiB), fills them,
// and ROUNDS times (default 3) copies each one H2D, transforms it on the device, copies it back
// D2H and checks every byte, alternating synchronous copies and async copies on its own stream:
// a preloaded shim sees hot buffers and promotes what its budgets allow.  Then, for HOLD_S
// seconds (default 0.3), it keeps the buffers and round-trips one of them every 100 ms, still
// checking.  With --barrier it then creates DIR/done.<pid> and waits (copying nothing) until N
// such files exist before it exits: no process of the job gives its registrations back while
// another may still be promoting, which node_budget.sh relies on.
//
// Prints PASS lines, then "RESULT node_worker ok=1 seconds=... copy_gbps=... buffers=K
// size_mib=S pid=P" (seconds: start to the end of the hold).  Any wrong byte or CUDA error: a
// FAIL line and exit 1.
#include "common.cuh"

#include <dirent.h>

static double copy_ms;      // time inside the copy calls (and their stream syncs)
static double copy_bytes;

// One round trip of buffer h through d; state tells what h holds now (0: pattern, 1: xf of it),
// and flips.  Synchronous copies on the default stream, or async ones on s.
static void round_trip(uint8_t *h, uint8_t *d, size_t n, uint32_t seed, int *state, bool async,
                       cudaStream_t s)
{
    uint8_t salt = 7;
    double t0 = now_ms();
    if (async) {
        CK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s));
        launch_xform(d, d, n, salt, s);
        CK(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
    } else {
        CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
        launch_xform(d, d, n, salt, 0);
        CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
    }
    copy_ms += now_ms() - t0;   // includes the kernel: a few hundred microseconds at most
    copy_bytes += 2.0 * (double)n;
    *state ^= 1;
    // xf is an XOR with a fixed key: applied twice it gives the pattern back.
    if (*state)
        verify_xf(h, n, seed, salt, "round trip (transformed)");
    else
        verify_pat(h, n, seed, "round trip (transformed back)");
}

static int count_done(const char *dir)
{
    DIR *dp = opendir(dir);
    if (!dp) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dp)))
        if (!strncmp(e->d_name, "done.", 5)) n++;
    closedir(dp);
    return n;
}

int main(int argc, char **argv)
{
    t_test = "node_worker";
    double t_start = now_ms();
    const char *barrier_dir = nullptr;
    int barrier_n = 0;
    double pos[4] = {4, 32, 0.3, 3};
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--barrier") && i + 2 < argc) {
            barrier_dir = argv[i + 1];
            barrier_n = atoi(argv[i + 2]);
            i += 2;
        } else if (npos < 4) {
            pos[npos++] = atof(argv[i]);
        } else {
            fprintf(stderr, "usage: %s [K [SIZE_MiB [HOLD_S [ROUNDS]]]] [--barrier DIR N]\n", argv[0]);
            return 2;
        }
    }
    int K = (int)pos[0];
    size_t S = (size_t)pos[1] * MiB;
    double hold_s = pos[2];
    int rounds = (int)pos[3];
    REQUIRE(K >= 1 && K <= 64 && S >= MiB && rounds >= 1, "bad arguments");

    device_init();
    uint32_t base = (uint32_t)getpid() * 977u;
    uint8_t **h = (uint8_t **)xmalloc(K * sizeof *h);
    uint8_t **d = (uint8_t **)xmalloc(K * sizeof *d);
    int *state = (int *)xmalloc(K * sizeof *state);
    for (int i = 0; i < K; i++) {
        h[i] = (uint8_t *)xmalloc(S);
        fill(h[i], S, base + (uint32_t)i);
        CK(cudaMalloc(&d[i], S));
        state[i] = 0;
    }
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < K; i++)
            round_trip(h[i], d[i], S, base + (uint32_t)i, &state[i], (r & 1) != 0, s);
    pass("node_worker round trips");

    double hold_end = now_ms() + hold_s * 1e3;
    int j = 0;
    while (now_ms() < hold_end) {
        int i = j % K;
        round_trip(h[i], d[i], S, base + (uint32_t)i, &state[i], (j & 1) != 0, s);
        j++;
        double left = hold_end - now_ms();
        if (left > 0) usleep((useconds_t)(left < 100 ? left : 100) * 1000);
    }
    pass("node_worker hold");
    double seconds = (now_ms() - t_start) / 1e3;

    if (barrier_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/done.%d", barrier_dir, (int)getpid());
        FILE *f = fopen(path, "w");
        REQUIRE(f, "cannot create %s: %s", path, strerror(errno));
        fclose(f);
        double give_up = now_ms() + 60e3;
        int n;
        while ((n = count_done(barrier_dir)) < barrier_n) {
            REQUIRE(now_ms() < give_up, "barrier: only %d of %d workers done after 60 s", n, barrier_n);
            usleep(10000);
        }
    }
    printf("RESULT node_worker ok=1 seconds=%.3f copy_gbps=%.2f buffers=%d size_mib=%zu pid=%d\n", seconds,
           copy_ms > 0 ? copy_bytes / (copy_ms * 1e6) : 0.0, K, S / MiB, (int)getpid());
    fflush(stdout);
    CK(cudaStreamDestroy(s));
    for (int i = 0; i < K; i++) {
        CK(cudaFree(d[i]));
        free(h[i]);
    }
    free(h);
    free(d);
    free(state);
    return 0;
}
