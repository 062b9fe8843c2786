/* fk_memory.c: device memory, pinned host memory (registration and host allocation), pointer
 * attributes, and registered-byte accounting (local and node-wide through FAKECUDA_SHM). */
#include "fk_internal.h"
#include "fakecuda.h"
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ---- device memory: opaque addresses from a PROT_NONE reservation (a host dereference
 * faults, and no host mapping can ever land there, so UVA classification is exact); contents
 * live in separate host memory.  Addresses are never reused, so stale device pointers stay
 * invalid instead of silently aliasing a newer allocation. */
#define FK_DEV_SPAN ((uintptr_t)64 << 30)
#define FK_DEV_TOTAL ((size_t)16 << 30)
#define FK_DEV_GAP ((uintptr_t)64 << 10)   /* unallocated gap after each allocation */

typedef struct { uintptr_t base; size_t size; char *backing; size_t maplen; int dev; uint64_t id; } fk_dalloc;
static fk_dalloc *dallocs;
static size_t ndallocs, capdallocs;
static uintptr_t dev_base;
static uintptr_t dev_next[FK_MAX_DEV];
static size_t dev_used[FK_MAX_DEV];
static uint64_t next_alloc_id = 1;

static size_t pagesz;

/* ---- pinned host ranges, sorted by base ---- */
static fk_hreg **hregs;
static size_t nhregs, caphregs;
static size_t reg_bytes, reg_peak;

/* Node-wide counters shared by every process using the same FAKECUDA_SHM name. */
typedef struct { _Atomic size_t cur, peak; } fk_shm_t;
static fk_shm_t *shm;

void fk_memory_setup(void)
{
    pagesz = (size_t)sysconf(_SC_PAGESIZE);
    if (fk_ndev > 0) {
        void *p = mmap(NULL, FK_DEV_SPAN * (size_t)fk_ndev, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) fk_fatal("cannot reserve the device address range");
        dev_base = (uintptr_t)p;
        for (int i = 0; i < fk_ndev; i++)
            dev_next[i] = dev_base + FK_DEV_SPAN * (uintptr_t)i + FK_DEV_GAP;
    }
    const char *name = getenv("FAKECUDA_SHM");
    if (name && *name) {
        int fd = shm_open(name, O_RDWR | O_CREAT, 0600);
        if (fd >= 0) {
            if (ftruncate(fd, sizeof(fk_shm_t)) == 0) {
                void *m = mmap(NULL, sizeof(fk_shm_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (m != MAP_FAILED) shm = m;
            }
            close(fd);
        }
        if (!shm) fk_log("fakecuda: cannot map FAKECUDA_SHM=%s; node accounting off", name);
    }
}

int fk_is_devaddr(uintptr_t a)
{
    return dev_base && a >= dev_base && a < dev_base + FK_DEV_SPAN * (uintptr_t)fk_ndev;
}

int fk_overlaps_dev(uintptr_t a, size_t n)
{
    if (!dev_base || !n) return 0;
    uintptr_t end = dev_base + FK_DEV_SPAN * (uintptr_t)fk_ndev;
    return a < end && (a + n > dev_base || a + n < a);
}

/* Index of the allocation containing a, or -1. */
static long dalloc_find(uintptr_t a)
{
    size_t lo = 0, hi = ndallocs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (dallocs[mid].base <= a) lo = mid + 1; else hi = mid;
    }
    if (lo == 0) return -1;
    fk_dalloc *d = &dallocs[lo - 1];
    return a < d->base + d->size ? (long)(lo - 1) : -1;
}

char *fk_dev_resolve(uintptr_t a, size_t n, int *dev)
{
    long i = dalloc_find(a);
    if (i < 0) return NULL;
    fk_dalloc *d = &dallocs[i];
    if (n > d->size - (a - d->base)) return NULL;
    if (dev) *dev = d->dev;
    return d->backing + (a - d->base);
}

FK_API(cuMemAlloc_v2, (CUdeviceptr *dptr, size_t size))
{
    FK_COUNT(cuMemAlloc_v2);
    FK_NEED_INIT();
    fk_ctx *c = fk_cur_ctx();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    CUresult r = fk_unsafe_call_check();
    if (r) goto out;
    int dev = c->dev;
    size_t maplen = (size + pagesz - 1) & ~(pagesz - 1);
    if (size > FK_DEV_TOTAL - dev_used[dev] ||
        dev_next[dev] + maplen + FK_DEV_GAP > dev_base + FK_DEV_SPAN * (uintptr_t)(dev + 1)) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    void *b = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED) { r = CUDA_ERROR_OUT_OF_MEMORY; goto out; }
    if (ndallocs == capdallocs) {
        size_t nc = capdallocs ? capdallocs * 2 : 64;
        fk_dalloc *na = fk_realloc(dallocs, nc * sizeof *na);
        if (!na) { munmap(b, maplen); r = CUDA_ERROR_OUT_OF_MEMORY; goto out; }
        dallocs = na;
        capdallocs = nc;
    }
    uintptr_t a = dev_next[dev];
    dev_next[dev] = (a + size + FK_DEV_GAP + 511) & ~(uintptr_t)511;
    /* Addresses only grow per device, but devices interleave: keep the array sorted. */
    size_t pos = ndallocs;
    while (pos > 0 && dallocs[pos - 1].base > a) pos--;
    memmove(&dallocs[pos + 1], &dallocs[pos], (ndallocs - pos) * sizeof *dallocs);
    dallocs[pos] = (fk_dalloc){ a, size, b, maplen, dev, next_alloc_id++ };
    ndallocs++;
    dev_used[dev] += size;
    *dptr = (CUdeviceptr)a;
out:
    pthread_mutex_unlock(&fk_mu);
    return r;
}

FK_API(cuMemFree_v2, (CUdeviceptr dptr))
{
    FK_COUNT(cuMemFree_v2);
    FK_NEED_INIT();
    if (!fk_cur_ctx()) return CUDA_ERROR_INVALID_CONTEXT;
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    CUresult r = fk_unsafe_call_check();
    if (r) goto out;
    long i = dalloc_find((uintptr_t)dptr);
    if (i < 0 || dallocs[i].base != (uintptr_t)dptr) { r = CUDA_ERROR_INVALID_VALUE; goto out; }
    /* cuMemFree synchronizes: queued work may still use the memory. */
    fk_wait_all_idle();
    i = dalloc_find((uintptr_t)dptr);
    if (i < 0 || dallocs[i].base != (uintptr_t)dptr) { r = CUDA_ERROR_INVALID_VALUE; goto out; }
    fk_race_forget(dallocs[i].base, dallocs[i].size);
    munmap(dallocs[i].backing, dallocs[i].maplen);
    dev_used[dallocs[i].dev] -= dallocs[i].size;
    memmove(&dallocs[i], &dallocs[i + 1], (ndallocs - (size_t)i - 1) * sizeof *dallocs);
    ndallocs--;
out:
    pthread_mutex_unlock(&fk_mu);
    return r;
}

FK_API(cuMemGetInfo_v2, (size_t *freeb, size_t *total))
{
    FK_COUNT(cuMemGetInfo_v2);
    FK_NEED_INIT();
    fk_ctx *c = fk_cur_ctx();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    if (!freeb || !total) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    *freeb = FK_DEV_TOTAL - dev_used[c->dev];
    *total = FK_DEV_TOTAL;
    pthread_mutex_unlock(&fk_mu);
    return CUDA_SUCCESS;
}

FK_API(cuMemGetAddressRange_v2, (CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr))
{
    FK_COUNT(cuMemGetAddressRange_v2);
    FK_NEED_INIT();
    if (!fk_cur_ctx()) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&fk_mu);
    long i = dalloc_find((uintptr_t)dptr);
    CUresult r = CUDA_ERROR_NOT_FOUND;
    if (i >= 0) {
        if (pbase) *pbase = (CUdeviceptr)dallocs[i].base;
        if (psize) *psize = dallocs[i].size;
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&fk_mu);
    return r;
}

/* ---- pinned host ranges ---- */
/* Index of the last range with base <= p (or -1). */
static long hreg_floor(uintptr_t p)
{
    size_t lo = 0, hi = nhregs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if ((uintptr_t)hregs[mid]->base <= p) lo = mid + 1; else hi = mid;
    }
    return (long)lo - 1;
}

fk_hreg *fk_hreg_find(const void *p, size_t n)
{
    long i = hreg_floor((uintptr_t)p);
    if (i < 0) return NULL;
    fk_hreg *h = hregs[i];
    uintptr_t off = (uintptr_t)p - (uintptr_t)h->base;
    if (off >= h->size || n > h->size - off) return NULL;
    return h;
}

fk_hreg *fk_hreg_find_any(const void *p, size_t n)
{
    if (!n) n = 1;
    uintptr_t a = (uintptr_t)p, e = a + n;
    long i = hreg_floor(a);
    if (i >= 0 && (uintptr_t)hregs[i]->base + hregs[i]->size > a) return hregs[i];
    if ((size_t)(i + 1) < nhregs && (uintptr_t)hregs[i + 1]->base < e) return hregs[i + 1];
    return NULL;
}

static int hreg_insert(fk_hreg *h)
{
    if (nhregs == caphregs) {
        size_t nc = caphregs ? caphregs * 2 : 64;
        fk_hreg **na = fk_realloc(hregs, nc * sizeof *na);
        if (!na) return -1;
        hregs = na;
        caphregs = nc;
    }
    size_t pos = (size_t)(hreg_floor((uintptr_t)h->base) + 1);
    memmove(&hregs[pos + 1], &hregs[pos], (nhregs - pos) * sizeof *hregs);
    hregs[pos] = h;
    nhregs++;
    return 0;
}

static void hreg_remove(fk_hreg *h)
{
    for (size_t i = 0; i < nhregs; i++)
        if (hregs[i] == h) {
            memmove(&hregs[i], &hregs[i + 1], (nhregs - i - 1) * sizeof *hregs);
            nhregs--;
            return;
        }
}

int fk_range_mapped(const void *p, size_t n)
{
    if (!n) return 1;
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pagesz - 1);
    size_t len = (uintptr_t)p + n - a;
    /* msync fails with ENOMEM exactly when part of the range is not mapped. */
    return !(msync((void *)a, len, MS_ASYNC) != 0 && errno == ENOMEM);
}

void fk_check_reg_mapped(fk_hreg *h)
{
    if (!h->unmapped_reported && !fk_range_mapped(h->base, h->size)) {
        h->unmapped_reported = 1;
        fk_violation("registered memory unmapped while still registered (%s %p+%zu)",
                     h->hostalloc ? "host-alloc" : "registration", (void *)h->base, h->size);
    }
}

void fk_check_all_regs_mapped(void)
{
    for (size_t i = 0; i < nhregs; i++) fk_check_reg_mapped(hregs[i]);
}

void fk_memory_atexit(void)
{
    /* The process's registrations die with it: give their bytes back to the node counter. */
    if (shm && reg_bytes) atomic_fetch_sub(&shm->cur, reg_bytes);
}

static void count_reg(long delta)
{
    if (delta > 0) {
        reg_bytes += (size_t)delta;
        if (reg_bytes > reg_peak) reg_peak = reg_bytes;
        if (shm) {
            size_t now = atomic_fetch_add(&shm->cur, (size_t)delta) + (size_t)delta;
            size_t pk = atomic_load(&shm->peak);
            while (now > pk && !atomic_compare_exchange_weak(&shm->peak, &pk, now)) {}
        }
    } else {
        reg_bytes -= (size_t)-delta;
        if (shm) atomic_fetch_sub(&shm->cur, (size_t)-delta);
    }
}

/* Walk /proc/self/maps: 0 if [p, p+n) is fully mapped, readable, and writable unless read_only
 * is allowed; -1 otherwise.  Reads with read(2) into a stack buffer: no malloc. */
static int maps_check(uintptr_t p, size_t n, int read_only_ok)
{
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;   /* cannot tell: do not invent an error */
    char buf[8192];
    size_t have = 0;
    uintptr_t cur = p, end = p + n;
    int result = -1, done = 0;
    while (!done) {
        ssize_t r = read(fd, buf + have, sizeof buf - 1 - have);
        if (r <= 0) break;
        have += (size_t)r;
        buf[have] = 0;
        char *line = buf;
        char *nl;
        while ((nl = memchr(line, '\n', have - (size_t)(line - buf)))) {
            *nl = 0;
            unsigned long s, e;
            char perms[8] = {0};
            char *q = line;
            s = strtoul(q, &q, 16);
            if (*q == '-') q++;
            e = strtoul(q, &q, 16);
            while (*q == ' ') q++;
            memcpy(perms, q, 4);
            line = nl + 1;
            if (e <= cur) continue;
            if (s > cur) { done = 1; break; }            /* hole */
            if (perms[0] != 'r' || (perms[1] != 'w' && !read_only_ok)) { done = 1; break; }
            cur = e;
            if (cur >= end) { result = 0; done = 1; break; }
        }
        size_t rest = have - (size_t)(line - buf);
        memmove(buf, line, rest);
        have = rest;
        if (have >= sizeof buf - 1) break;
    }
    close(fd);
    return result;
}

#define FK_REG_FLAGS (CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP | \
                      CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY)

static CUresult host_register(void *p, size_t size, unsigned flags)
{
    FK_NEED_INIT();
    fk_ctx *c = fk_cur_ctx();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    if (fk_no_host_register) return CUDA_ERROR_NOT_SUPPORTED;
    if (!p || !size || (flags & ~(unsigned)FK_REG_FLAGS)) return CUDA_ERROR_INVALID_VALUE;
    if ((uintptr_t)p + size < (uintptr_t)p) return CUDA_ERROR_INVALID_VALUE;
    /* The time a real registration takes (pinning the pages), before it is judged: other threads
     * go on meanwhile, a stream capture may begin. */
    fk_sleep_us(__atomic_load_n(&fk_register_delay_us, __ATOMIC_RELAXED));
    pthread_mutex_lock(&fk_mu);
    CUresult r = fk_unsafe_call_check();
    if (r) goto out;
    fk_check_all_regs_mapped();
    if (fk_is_devaddr((uintptr_t)p) || fk_is_devaddr((uintptr_t)p + size - 1)) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    if (fk_hreg_find_any(p, size)) { r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED; goto out; }
    if (maps_check((uintptr_t)p, size, (flags & CU_MEMHOSTREGISTER_READ_ONLY) != 0)) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    fk_hreg *h = fk_calloc(1, sizeof *h);
    if (!h) { r = CUDA_ERROR_OUT_OF_MEMORY; goto out; }
    static uint64_t next_id = 1;
    *h = (fk_hreg){ .base = p, .size = size, .flags = flags, .ctx = c, .id = next_id++ };
    if (hreg_insert(h)) { fk_free(h); r = CUDA_ERROR_OUT_OF_MEMORY; goto out; }
    count_reg((long)size);
    /* Pinning faults the pages in, as the real driver does (mincore then shows them). */
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pagesz - 1);
#ifdef MADV_POPULATE_WRITE
    madvise((void *)a, (uintptr_t)p + size - a,
            (flags & CU_MEMHOSTREGISTER_READ_ONLY) ? MADV_POPULATE_READ : MADV_POPULATE_WRITE);
#endif
out:
    pthread_mutex_unlock(&fk_mu);
    return r;
}

FK_API(cuMemHostRegister_v2, (void *p, size_t size, unsigned int flags))
{
    FK_COUNT(cuMemHostRegister_v2);
    return host_register(p, size, flags);
}

FK_API(cuMemHostRegister, (void *p, size_t size, unsigned int flags))
{
    FK_COUNT(cuMemHostRegister);
    return host_register(p, size, flags);
}

static int hreg_dying(const fk_hreg *h) { return h->inflight >= 1000000000L / 2; }

fk_hreg *fk_hreg_pinned(const void *p, size_t n)
{
    fk_hreg *h = fk_hreg_find(p, n);
    return h && !hreg_dying(h) ? h : NULL;
}

/* Release a pinned range: report and wait for work still relying on it (the real driver
 * waits for the device to go idle), then drop it.  Lock held. */
static void hreg_retire(fk_hreg *h, const char *api)
{
    h->inflight += 1000000000L;   /* "dying": hides it from a concurrent unregister */
    long pending = h->inflight - 1000000000L;
    if (pending > 0)
        fk_violation("%s while %ld queued/running operation(s) still use the range (%p+%zu)",
                     api, pending, (void *)h->base, h->size);
    fk_wait_all_idle();
    fk_check_reg_mapped(h);
    hreg_remove(h);
    if (!h->hostalloc) count_reg(-(long)h->size);
}


FK_API(cuMemHostUnregister, (void *p))
{
    FK_COUNT(cuMemHostUnregister);
    FK_NEED_INIT();
    if (!fk_cur_ctx()) return CUDA_ERROR_INVALID_CONTEXT;
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    CUresult r = fk_unsafe_call_check();
    if (r) goto out;
    fk_hreg *h = fk_hreg_find(p, 1);
    if (!h || h->hostalloc || hreg_dying(h)) { r = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED; goto out; }
    if (h->base != (char *)p) { r = CUDA_ERROR_INVALID_VALUE; goto out; }
    int sig = __atomic_load_n(&fk_unregister_signal, __ATOMIC_RELAXED);
    if (sig) {
        fk_in_unregister = 1;
        raise(sig);   /* delivered here unless the caller blocked it */
        fk_in_unregister = 0;
    }
    hreg_retire(h, "cuMemHostUnregister");
    fk_free(h);
out:
    pthread_mutex_unlock(&fk_mu);
    return r;
}

static CUresult host_alloc(void **pp, size_t size, unsigned flags)
{
    FK_NEED_INIT();
    fk_ctx *c = fk_cur_ctx();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    if (!pp || !size) return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    CUresult r = fk_unsafe_call_check();
    if (r) goto out;
    size_t len = (size + pagesz - 1) & ~(pagesz - 1);
    /* Shared, populated mapping, like cudaMallocHost (a forked child shares the pages). */
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (m == MAP_FAILED) { r = CUDA_ERROR_OUT_OF_MEMORY; goto out; }
    fk_hreg *h = fk_calloc(1, sizeof *h);
    if (!h) { munmap(m, len); r = CUDA_ERROR_OUT_OF_MEMORY; goto out; }
    *h = (fk_hreg){ .base = m, .size = len, .flags = flags, .hostalloc = 1, .ctx = c };
    if (hreg_insert(h)) { munmap(m, len); fk_free(h); r = CUDA_ERROR_OUT_OF_MEMORY; goto out; }
    *pp = m;
out:
    pthread_mutex_unlock(&fk_mu);
    return r;
}

FK_API(cuMemHostAlloc, (void **pp, size_t size, unsigned int flags))
{
    FK_COUNT(cuMemHostAlloc);
    return host_alloc(pp, size, flags);
}

FK_API(cuMemAllocHost_v2, (void **pp, size_t size))
{
    FK_COUNT(cuMemAllocHost_v2);
    return host_alloc(pp, size, 0);
}

FK_API(cuMemFreeHost, (void *p))
{
    FK_COUNT(cuMemFreeHost);
    FK_NEED_INIT();
    if (!fk_cur_ctx()) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&fk_mu);
    CUresult r = CUDA_SUCCESS;
    fk_hreg *h = p ? fk_hreg_find(p, 1) : NULL;
    if (!h || !h->hostalloc || h->base != (char *)p || hreg_dying(h)) { r = CUDA_ERROR_INVALID_VALUE; goto out; }
    hreg_retire(h, "cuMemFreeHost");
    munmap(h->base, h->size);
    fk_free(h);
out:
    pthread_mutex_unlock(&fk_mu);
    return r;
}

FK_API(cuMemHostGetFlags, (unsigned int *pflags, void *p))
{
    FK_COUNT(cuMemHostGetFlags);
    FK_NEED_INIT();
    if (!pflags || !p) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    fk_hreg *h = fk_hreg_find(p, 1);
    if (h) *pflags = h->flags;
    pthread_mutex_unlock(&fk_mu);
    return h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FK_API(cuMemHostGetDevicePointer_v2, (CUdeviceptr *pd, void *p, unsigned int flags))
{
    FK_COUNT(cuMemHostGetDevicePointer_v2);
    FK_NEED_INIT();
    if (!fk_cur_ctx()) return CUDA_ERROR_INVALID_CONTEXT;
    if (!pd || !p || flags) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    fk_hreg *h = fk_hreg_find(p, 1);
    pthread_mutex_unlock(&fk_mu);
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    *pd = (CUdeviceptr)(uintptr_t)p;   /* unified addressing: same address on both sides */
    return CUDA_SUCCESS;
}

/* ---- pointer attributes ---- */
static CUresult ptr_attr(void *data, CUpointer_attribute a, CUdeviceptr ptr)
{
    uintptr_t p = (uintptr_t)ptr;
    long di = fk_is_devaddr(p) ? dalloc_find(p) : -1;
    fk_hreg *h = di < 0 ? fk_hreg_find((void *)p, 1) : NULL;
    if (di < 0 && !h) return CUDA_ERROR_INVALID_VALUE;   /* pageable or unknown */
    fk_dalloc *d = di >= 0 ? &dallocs[di] : NULL;
    switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = d ? &fk_ctxs[d->dev] : h->ctx;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = d ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = ptr;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (d) return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = (void *)p;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(unsigned int *)data = 0;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = d ? d->dev : h->ctx->dev;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(unsigned int *)data = 1;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = d ? (CUdeviceptr)d->base : (CUdeviceptr)(uintptr_t)h->base;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = d ? d->size : h->size;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *(unsigned long long *)data = d ? d->id : h->id | (1ull << 63);
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
        *(unsigned int *)data = 0;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_NOT_SUPPORTED;
    }
}

static size_t attr_size(CUpointer_attribute a)
{
    switch (a) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
        return sizeof(unsigned int);
    default:
        return sizeof(void *);
    }
}

FK_API(cuPointerGetAttribute, (void *data, CUpointer_attribute a, CUdeviceptr ptr))
{
    FK_COUNT(cuPointerGetAttribute);
    FK_NEED_INIT();
    if (!data || !ptr) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    CUresult r = ptr_attr(data, a, ptr);
    pthread_mutex_unlock(&fk_mu);
    return r;
}

/* The plural form never fails on an unknown pointer: attributes read as zero/NULL. */
FK_API(cuPointerGetAttributes, (unsigned int n, CUpointer_attribute *attrs, void **data, CUdeviceptr ptr))
{
    FK_COUNT(cuPointerGetAttributes);
    FK_NEED_INIT();
    if (!attrs || !data) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    for (unsigned i = 0; i < n; i++) {
        if (!data[i]) continue;
        if (ptr_attr(data[i], attrs[i], ptr) != CUDA_SUCCESS) memset(data[i], 0, attr_size(attrs[i]));
    }
    pthread_mutex_unlock(&fk_mu);
    return CUDA_SUCCESS;
}

/* ---- checksums of host ranges (pinned-source check) ---- */
static uint64_t mix(uint64_t h, uint64_t w)
{
    h ^= w;
    h *= 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}

uint64_t fk_checksum_end(const fk_end *e, size_t w, size_t h, size_t d)
{
    uint64_t s = 0xcbf29ce484222325ull;
    const char *base = e->isdev ? e->backing : e->addr;
    for (size_t z = 0; z < d; z++)
        for (size_t y = 0; y < h; y++) {
            const unsigned char *row = (const unsigned char *)base + z * e->slice + y * e->pitch;
            size_t i = 0;
            for (; i + 8 <= w; i += 8) {
                uint64_t v;
                memcpy(&v, row + i, 8);
                s = mix(s, v);
            }
            for (; i < w; i++) s = mix(s, row[i]);
        }
    return s;
}

/* ---- test API ---- */
FK_PUBLIC int fakecuda_registered(const void *p, size_t n)
{
    fk_setup();
    if (!n) n = 1;
    pthread_mutex_lock(&fk_mu);
    int hit = 0;
    uintptr_t a = (uintptr_t)p, e = a + n;
    long i = hreg_floor(a);
    if (i < 0) i = 0;
    for (size_t k = (size_t)i; k < nhregs && (uintptr_t)hregs[k]->base < e; k++) {
        fk_hreg *h = hregs[k];
        if (!h->hostalloc && (uintptr_t)h->base + h->size > a) { hit = 1; break; }
    }
    pthread_mutex_unlock(&fk_mu);
    return hit;
}

FK_PUBLIC unsigned long long fakecuda_registration_id(const void *p)
{
    fk_setup();
    pthread_mutex_lock(&fk_mu);
    unsigned long long id = 0;
    uintptr_t a = (uintptr_t)p;
    long i = hreg_floor(a);
    if (i < 0) i = 0;
    for (size_t k = (size_t)i; k < nhregs && (uintptr_t)hregs[k]->base <= a; k++) {
        fk_hreg *h = hregs[k];
        if (!h->hostalloc && (uintptr_t)h->base + h->size > a) { id = h->id; break; }
    }
    pthread_mutex_unlock(&fk_mu);
    return id;
}

FK_PUBLIC size_t fakecuda_registered_bytes(void)
{
    pthread_mutex_lock(&fk_mu);
    size_t v = reg_bytes;
    pthread_mutex_unlock(&fk_mu);
    return v;
}

FK_PUBLIC size_t fakecuda_registered_bytes_peak(void)
{
    pthread_mutex_lock(&fk_mu);
    size_t v = reg_peak;
    pthread_mutex_unlock(&fk_mu);
    return v;
}

FK_PUBLIC void fakecuda_reset_registered_peak(void)
{
    pthread_mutex_lock(&fk_mu);
    reg_peak = reg_bytes;
    pthread_mutex_unlock(&fk_mu);
}

FK_PUBLIC size_t fakecuda_node_registered_peak(void)
{
    fk_setup();
    if (shm) return atomic_load(&shm->peak);
    return fakecuda_registered_bytes_peak();
}

/* Memory the driver allocates for its own use: malloc called from the driver's code (the
 * barrier keeps the call from becoming a jump, which would make it the caller's call). */
FK_PUBLIC void *fakecuda_driver_malloc(size_t n)
{
    void *p = malloc(n);
    __asm__ volatile("" : "+r"(p));
    return p;
}

FK_PUBLIC void fakecuda_driver_free(void *p)
{
    free(p);
    __asm__ volatile("" ::: "memory");
}

FK_PUBLIC void *fakecuda_driver_mmap(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    __asm__ volatile("" : "+r"(p));
    return p == MAP_FAILED ? NULL : p;
}

/* ---- snapshots of pageable sources (see fk_internal.h) ---- */

#define FK_STAGED_HDR 64   /* the mapping's length, kept in front of the snapshot */

void *fk_staged_alloc(size_t n)
{
    size_t len = n + FK_STAGED_HDR;
    void *m = (void *)syscall(SYS_mmap, NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    *(size_t *)m = len;
    return (char *)m + FK_STAGED_HDR;
}

void fk_staged_free(void *p)
{
    if (!p)
        return;
    char *m = (char *)p - FK_STAGED_HDR;
    syscall(SYS_munmap, m, *(size_t *)m);
}
