// realloc_free.cu: contract rule 4, a registration never outlives its memory.
//
// A buffer is made hot (copied several times, so the shim promotes it), then its memory goes
// back to the allocator or the kernel, and new memory (often at the same address, with new
// physical pages) gets new content.  Copies from and to the new memory must see the NEW pages: a
// stale registration would DMA from/to the old physical pages (silent corruption).
// check_buffer() verifies both directions separately: H2D checked through a pinned buffer, D2H
// checked in the buffer itself, sync and async.
//   free_reuse        malloc/free/malloc of the same size (256 KiB .. 64 MiB)
//   calloc_zero       calloc after a promoted block was freed must return zeroed memory
//   new_delete, memalign
//   realloc           grow and shrink of promoted blocks: content preserved, copies correct
//   munmap_remap      munmap of a promoted mmap, new mmap at the same address; partial munmap
//   mremap            grow (may move) and shrink; a new mapping at the old address
//   madvise           MADV_DONTNEED (whole and partial: pages read back as zero), MADV_FREE
//   mmap_fixed_over   mmap(MAP_FIXED) over a promoted mapping (an implicit munmap)
//   free_other_thread free() of a promoted block on a thread that never used CUDA
//   free_after_async  free() right after cudaMemcpyAsync H2D from a promoted block returned
//   loop100           100 x (alloc, copy, free) with changing content and sizes
#include "common.cuh"

#include <pthread.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif
#ifndef MADV_FREE
#define MADV_FREE 8
#endif

static const size_t CAP = 96 * MiB + 64 * KiB;
static uint8_t *d, *d2, *chk;
static cudaStream_t s;
static uint32_t g_seed = 3000;

static void check_buffer(uint8_t *h, size_t n, const char *label)
{
    char w[160];
    uint32_t seed = g_seed++;
    uint8_t salt = (uint8_t)(seed * 11 + 5);
    REQUIRE(n <= CAP, "check_buffer too large");
    fill(h, n, seed);
    CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(chk, d, n, cudaMemcpyDeviceToHost));
    snprintf(w, sizeof w, "%s: H2D from %p (n=%zu) sent stale data", label, (void *)h, n);
    verify_pat(chk, n, seed, w);
    launch_xform(d2, d, n, salt, 0);
    CK(cudaMemcpy(h, d2, n, cudaMemcpyDeviceToHost));
    snprintf(w, sizeof w, "%s: D2H into %p (n=%zu) did not land in the program's pages", label, (void *)h, n);
    verify_xf(h, n, seed, salt, w);
    // Async forms (pageable: H2D staged at return, D2H complete at return).
    seed = g_seed++;
    fill(h, n, seed);
    CK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s));
    memset(h, 0, n);
    CK(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, s));
    snprintf(w, sizeof w, "%s: async round trip through %p (n=%zu)", label, (void *)h, n);
    verify_pat(h, n, seed, w);
    CK(cudaStreamSynchronize(s));
}

static void hot(uint8_t *h, size_t n, const char *label)
{
    check_buffer(h, n, label);
    make_hot(h, d, n, 3);
}

static void note_reuse(const char *what, size_t n, void *a, void *b)
{
    printf("NOTE %s n=%zu: %s address\n", what, n, a == b ? "same" : "different");
}

static void test_free_reuse(void)
{
    t_test = "free_reuse";
    const size_t ns[] = {256 * KiB, 1 * MiB + 5, 8 * MiB, 64 * MiB};
    for (size_t n : ns) {
        uint8_t *p = (uint8_t *)xmalloc(n);
        hot(p, n, "free_reuse/before");
        free(p);
        uint8_t *q = (uint8_t *)xmalloc(n);
        note_reuse("free_reuse", n, p, q);
        check_buffer(q, n, "free_reuse/after");
        check_buffer(q, n, "free_reuse/after again");
        free(q);
    }
    pass("realloc_free.free_reuse");

    t_test = "calloc_zero";
    for (size_t n : ns) {
        uint8_t *p = (uint8_t *)xmalloc(n);
        hot(p, n, "calloc_zero/before");
        memset(p, 0xFF, n);
        free(p);
        uint8_t *q = (uint8_t *)calloc(1, n);
        REQUIRE(q, "calloc");
        note_reuse("calloc_zero", n, p, q);
        verify_byte(q, n, 0, "calloc after free of a promoted block");
        check_buffer(q, n, "calloc_zero/after");
        free(q);
    }
    pass("realloc_free.calloc_zero");

    t_test = "new_delete";
    for (int i = 0; i < 3; i++) {
        size_t n = 8 * MiB + i;
        uint8_t *p = new uint8_t[n];
        hot(p, n, "new/before");
        delete[] p;
        uint8_t *q = new uint8_t[n];
        check_buffer(q, n, "new/after");
        delete[] q;
    }
    pass("realloc_free.new_delete");

    t_test = "memalign";
    for (int i = 0; i < 3; i++) {
        size_t n = 4 * MiB;
        void *p = nullptr;
        REQUIRE(posix_memalign(&p, 64 * KiB, n) == 0, "posix_memalign");
        hot((uint8_t *)p, n, "memalign/before");
        free(p);
        uint8_t *q = (uint8_t *)aligned_alloc(4096, n);
        REQUIRE(q, "aligned_alloc");
        check_buffer(q, n, "memalign/after");
        free(q);
    }
    pass("realloc_free.memalign");
}

static void test_realloc(void)
{
    t_test = "realloc";
    struct { size_t from, to; } steps[] = {
        {8 * MiB, 40 * MiB}, {40 * MiB, 2 * MiB}, {2 * MiB, 3 * MiB + 7}, {64 * MiB, 96 * MiB}, {96 * MiB, 16 * MiB}};
    uint8_t *p = nullptr;
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        size_t from = steps[i].from, to = steps[i].to;
        if (!p || i == 3) {
            free(p);
            p = (uint8_t *)xmalloc(from);
        }
        hot(p, from, "realloc/before");
        uint32_t seed = g_seed++;
        fill(p, from, seed);
        uint8_t *q = (uint8_t *)realloc(p, to);
        REQUIRE(q, "realloc(%zu -> %zu) failed", from, to);
        char w[96];
        snprintf(w, sizeof w, "realloc %zu -> %zu: content not preserved", from, to);
        verify_pat(q, from < to ? from : to, seed, w);
        check_buffer(q, to, "realloc/after");
        p = q;
        // Memory the shrink gave back may be reused by the next allocation.
        if (to < from) {
            uint8_t *r = (uint8_t *)xmalloc(from - to);
            check_buffer(r, from - to, "realloc/after shrink, new block");
            free(r);
        }
    }
    free(p);
    pass("realloc_free.realloc");
}

static uint8_t *map_at(void *addr, size_t n, int extra)
{
    void *q = mmap(addr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | extra, -1, 0);
    if (q == MAP_FAILED && (extra & MAP_FIXED_NOREPLACE))  // old kernel, or something else moved in
        q = mmap(addr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (q == MAP_FAILED) FAILF("mmap(%p, %zu): %s", addr, n, strerror(errno));
    return (uint8_t *)q;
}

static void test_munmap(void)
{
    t_test = "munmap_remap";
    for (int rep = 0; rep < 3; rep++) {
        size_t n = 32 * MiB;
        uint8_t *p = (uint8_t *)map_anon(n);
        hot(p, n, "munmap/before");
        REQUIRE(munmap(p, n) == 0, "munmap");
        uint8_t *q = map_at(p, n, MAP_FIXED_NOREPLACE);
        note_reuse("munmap_remap", n, p, q);
        verify_byte(q, n, 0, "new anonymous mapping after munmap");
        check_buffer(q, n, "munmap/after");
        REQUIRE(munmap(q, n) == 0, "munmap");
    }
    // Partial munmap: the second half goes away and comes back as new pages.
    size_t n = 32 * MiB;
    uint8_t *p = (uint8_t *)map_anon(n);
    hot(p, n, "partial munmap/before");
    REQUIRE(munmap(p + n / 2, n / 2) == 0, "munmap half");
    uint8_t *q = map_at(p + n / 2, n / 2, MAP_FIXED_NOREPLACE);
    if (q == p + n / 2) {
        check_buffer(p, n, "partial munmap/after, whole range");
    } else {
        check_buffer(p, n / 2, "partial munmap/after, first half");
        check_buffer(q, n / 2, "partial munmap/after, new half");
    }
    check_buffer(q, n / 2, "partial munmap/after, second half");
    munmap(p, n / 2);
    munmap(q, n / 2);
    pass("realloc_free.munmap_remap");

    t_test = "mremap";
    n = 16 * MiB;
    p = (uint8_t *)map_anon(n);
    hot(p, n, "mremap/before");
    uint32_t seed = g_seed++;
    fill(p, n, seed);
    q = (uint8_t *)mremap(p, n, 2 * n, MREMAP_MAYMOVE);
    REQUIRE(q != MAP_FAILED, "mremap grow: %s", strerror(errno));
    verify_pat(q, n, seed, "mremap grow: content not preserved");
    check_buffer(q, 2 * n, "mremap/after grow");
    uint8_t *r = nullptr;
    if (q != p) {
        r = map_at(p, n, MAP_FIXED_NOREPLACE);
        check_buffer(r, n, "mremap/new mapping at the old address");
    }
    hot(q, 2 * n, "mremap/before shrink");
    uint8_t *q2 = (uint8_t *)mremap(q, 2 * n, n / 2, 0);
    REQUIRE(q2 == q, "mremap shrink moved");
    uint8_t *tail = map_at(q + n / 2, n + n / 2, MAP_FIXED_NOREPLACE);
    check_buffer(q, n / 2, "mremap/after shrink");
    check_buffer(tail, n + n / 2, "mremap/new mapping over the released tail");
    munmap(q, n / 2);
    munmap(tail, n + n / 2);
    if (r) munmap(r, n);
    pass("realloc_free.mremap");
}

static void test_madvise(void)
{
    t_test = "madvise";
    size_t n = 16 * MiB;
    uint8_t *p = (uint8_t *)map_anon(n);
    hot(p, n, "madvise/before");
    memset(p, 0xEE, n);
    REQUIRE(madvise(p, n, MADV_DONTNEED) == 0, "madvise DONTNEED: %s", strerror(errno));
    verify_byte(p, n, 0, "private anonymous pages after MADV_DONTNEED must read as zero");
    check_buffer(p, n, "madvise DONTNEED/after");
    // Partial: the middle 4 MiB.
    hot(p, n, "madvise partial/before");
    uint32_t seed = g_seed++;
    fill(p, n, seed);
    REQUIRE(madvise(p + 6 * MiB, 4 * MiB, MADV_DONTNEED) == 0, "madvise partial");
    verify_pat(p, 6 * MiB, seed, "madvise partial: first part changed");
    verify_byte(p + 6 * MiB, 4 * MiB, 0, "madvise partial: middle must read as zero");
    for (size_t i = 10 * MiB; i < n; i++)
        if (p[i] != pat(i, seed)) FAILF("madvise partial: byte %zu of the last part changed", i);
    check_buffer(p, n, "madvise partial/after");
    // MADV_FREE: contents undefined until written; after writing, copies must see them.
    hot(p, n, "madvise FREE/before");
    int e = madvise(p, n, MADV_FREE);
    if (e == 0) check_buffer(p, n, "madvise FREE/after");
    munmap(p, n);
    pass("realloc_free.madvise");

    t_test = "mmap_fixed_over";
    p = (uint8_t *)map_anon(n);
    hot(p, n, "mmap_fixed_over/before");
    memset(p, 0xEE, n);
    uint8_t *q = map_at(p, n, MAP_FIXED);
    REQUIRE(q == p, "MAP_FIXED moved");
    verify_byte(q, n, 0, "a new MAP_FIXED mapping must read as zero");
    check_buffer(q, n, "mmap_fixed_over/after");
    munmap(q, n);
    pass("realloc_free.mmap_fixed_over");
}

static void *free_thread(void *arg)
{
    free(arg);  // this thread never touches CUDA
    return nullptr;
}

static void test_free_other_thread(void)
{
    t_test = "free_other_thread";
    const size_t ns[] = {16 * MiB, 64 * MiB};
    for (size_t n : ns) {
        uint8_t *p = (uint8_t *)xmalloc(n);
        hot(p, n, "free_other_thread/before");
        pthread_t t;
        REQUIRE(pthread_create(&t, nullptr, free_thread, p) == 0, "pthread_create");
        pthread_join(t, nullptr);
        uint8_t *q = (uint8_t *)xmalloc(n);
        note_reuse("free_other_thread", n, p, q);
        check_buffer(q, n, "free_other_thread/after");
        free(q);
    }
    pass("realloc_free.free_other_thread");
}

static void test_free_after_async(void)
{
    t_test = "free_after_async";
    const size_t ns[] = {8 * MiB, 48 * MiB};
    for (size_t n : ns) {
        uint8_t *p = (uint8_t *)xmalloc(n);
        hot(p, n, "free_after_async/before");
        uint32_t seed = g_seed++;
        fill(p, n, seed);
        launch_spin(s, 20ull * 1000 * 1000);
        CK(cudaMemcpyAsync(d, p, n, cudaMemcpyHostToDevice, s));
        free(p);  // allowed: a pageable source has been read when the call returned
        uint8_t *q = (uint8_t *)xmalloc(n);
        memset(q, 0x42, n);
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(chk, d, n, cudaMemcpyDeviceToHost));
        verify_pat(chk, n, seed, "free_after_async: device must hold the data of the freed source");
        check_buffer(q, n, "free_after_async/new block");
        free(q);
    }
    pass("realloc_free.free_after_async");
}

static void test_loop100(void)
{
    t_test = "loop100";
    for (int i = 0; i < 100; i++) {
        size_t n = (i % 10 == 9) ? 40 * MiB + (size_t)i : 4 * MiB + (size_t)(i % 3) * 4096;
        uint8_t *p = (uint8_t *)xmalloc(n);
        uint32_t seed = 70000 + i;
        uint8_t salt = (uint8_t)i;
        fill(p, n, seed);
        for (int k = 0; k < 3; k++) CK(cudaMemcpy(d, p, n, cudaMemcpyHostToDevice));
        launch_xform(d2, d, n, salt, 0);
        if (i & 1) CK(cudaMemcpy(p, d2, n, cudaMemcpyDeviceToHost));
        else CK(cudaMemcpyAsync(p, d2, n, cudaMemcpyDeviceToHost, 0));
        char w[64];
        snprintf(w, sizeof w, "loop100 iteration %d", i);
        verify_xf(p, n, seed, salt, w);
        free(p);
    }
    pass("realloc_free.loop100");
}

int main(void)
{
    device_init();
    double t0 = now_ms();
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaMalloc(&d, CAP));
    CK(cudaMalloc(&d2, CAP));
    chk = (uint8_t *)pinned_alloc(CAP);
    test_free_reuse();
    test_realloc();
    test_munmap();
    test_madvise();
    test_free_other_thread();
    test_free_after_async();
    test_loop100();
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    CK(cudaFreeHost(chk));
    CK(cudaFree(d));
    CK(cudaFree(d2));
    CK(cudaStreamDestroy(s));
    fprintf(stderr, "realloc_free: %.0f ms\n", now_ms() - t0);
    return 0;
}
