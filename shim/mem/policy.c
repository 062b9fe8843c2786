/* Promotion: when a pageable block is worth pinning, registering it under the budget, evicting
 * colder registrations, and the pinned block cache. */
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include "base/config.h"
#include "base/os.h"
#include "mem/heap.h"
#include "base/log.h"
#include "mem/nodebudget.h"
#include "base/nvtx.h"
#include "mem/policy.h"
#include "base/real.h"
#include "base/shim.h"
#include "stats/stats.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
/* A promoted block idle this long may be evicted for any newcomer. */
#define IDLE_EVICT_NS 1000000000ull

/* Serializes registration and the budget: registering takes milliseconds and the budget must
 * hold at every instant, so one promotion or eviction runs at a time. */
static pthread_mutex_t reg_mutex = PTHREAD_MUTEX_INITIALIZER;
static uint64_t registered_bytes;
static struct block *cache_head, *cache_tail;

static int promotion_state;   /* 0 unknown, 1 on, -1 off */
static int read_only_supported;

double policy_promotion_gain_us(size_t block_bytes, size_t resident_bytes, enum copy_dir dir,
                                size_t bytes, uint64_t copies_seen, double alt_mbps)
{
    double pinned_mbps = (double)shim_cfg.bw_pinned;
    if (alt_mbps <= 0 || pinned_mbps <= 0)
        return -1;
    /* bytes / (MB/s) is microseconds. */
    double saving_per_copy = (double)bytes / alt_mbps - (double)bytes / pinned_mbps;
    if (resident_bytes > block_bytes)
        resident_bytes = block_bytes;
    double cost = (double)resident_bytes / GIB * (double)shim_cfg.reg_cost_resident +
                  (double)(block_bytes - resident_bytes) / GIB * (double)shim_cfg.reg_cost_fault;
    /* A block copied k times so far is expected to be copied about k more times: the saving
     * counts for this copy and the ones expected to follow. */
    return saving_per_copy * (double)copies_seen - cost;
    (void)dir;
}

static void disable_promotion(const char *reason)
{
    promotion_state = -1;
    stats_promotion_disabled(reason);
    shim_log(LOG_INFO, "promotion off: %s", reason);
}

static void calibrate(void);

int policy_promotion_enabled(void)
{
    int state = __atomic_load_n(&promotion_state, __ATOMIC_ACQUIRE);
    if (state)
        return state > 0;
    pthread_mutex_lock(&reg_mutex);
    if (!promotion_state) {
        CUdevice dev;
        int pageable_ok = 0, register_ok = 1;
        if (shim_cfg.mode != MODE_PIN && shim_cfg.mode != MODE_FULL) {
            promotion_state = -1;
        } else if (shim_cfg.budget == 0) {
            disable_promotion("PINSHIM_BUDGET is 0");
        } else if (!drv.cuCtxGetDevice || drv.cuCtxGetDevice(&dev) != CUDA_SUCCESS) {
            /* No context yet: decide later. */
            pthread_mutex_unlock(&reg_mutex);
            return 0;
        } else {
            drv.cuDeviceGetAttribute(&pageable_ok,
                                     CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, dev);
            if (drv.cuDeviceGetAttribute(&register_ok, CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED,
                                         dev) != CUDA_SUCCESS)
                register_ok = 1;
            drv.cuDeviceGetAttribute(&read_only_supported,
                                     CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, dev);
            if (pageable_ok)
                disable_promotion("the device reads pageable memory through the host page tables: "
                                  "pinning buys little here");
            else if (!register_ok)
                disable_promotion("the device does not support host memory registration");
            else {
                if (shim_cfg.calibrate)
                    calibrate();
                promotion_state = 1;
            }
        }
    }
    int on = promotion_state > 0;
    pthread_mutex_unlock(&reg_mutex);
    return on;
}

int policy_on_copy(struct block *b, enum copy_dir dir, size_t bytes)
{
    uint64_t now = shim_now_ns();
    b->copies++;
    b->bytes_moved += bytes;
    b->last_use_ns = now;
    if (b->no_promote || b->reg_changing || b->state != BLOCK_PAGEABLE)
        return 0;
    /* Promotion switched off for good (no registration, budget 0, a device that reads pageable
     * memory itself): no cost model and no mincore on every copy. */
    if (__atomic_load_n(&promotion_state, __ATOMIC_ACQUIRE) < 0)
        return 0;
    if (b->map_len > shim_cfg.budget)
        return 0;
    if (!(b->prot & PROT_WRITE) && (!read_only_supported || dir != DIR_H2D))
        return 0;
    /* Measured against the driver's own pageable path: staging gets closer to pinned speed,
     * but only a registration reaches it, and waiting longer to register only delays the gain
     * of a buffer that is already showing it is reused. */
    double alt = dir == DIR_H2D ? (double)shim_cfg.bw_h2d_pageable : (double)shim_cfg.bw_d2h_pageable;
    /* The cheapest case first (every page resident): most declines need no mincore. */
    double gain = policy_promotion_gain_us(b->map_len, b->map_len, dir, bytes, b->copies, alt);
    if (gain > 0) {
        size_t resident = os_resident_bytes(b->map_base, b->map_len);
        gain = policy_promotion_gain_us(b->map_len, resident, dir, bytes, b->copies, alt);
    }
    if (gain <= 0 && bytes >= shim_cfg.min_size)
        stats_add(STAT_PROMOTIONS_DECLINED, 1);
    return gain > 0;
}

static void update_registered(int64_t delta)
{
    uint64_t now = __atomic_add_fetch(&registered_bytes, (uint64_t)delta, __ATOMIC_RELAXED);
    stats_registered_bytes(now);
}

uint64_t policy_registered_bytes(void)
{
    return __atomic_load_n(&registered_bytes, __ATOMIC_RELAXED);
}

static void cache_unlink(struct block *b)
{
    if (b->cache_prev)
        b->cache_prev->cache_next = b->cache_next;
    else
        cache_head = b->cache_next;
    if (b->cache_next)
        b->cache_next->cache_prev = b->cache_prev;
    else
        cache_tail = b->cache_prev;
    b->cache_next = b->cache_prev = NULL;
}

/* Unregister a registration the copies can no longer see.  Pushes the registering context:
 * a free() may come from a thread that never used CUDA. */
/* The shim's own registration calls are "potentially unsafe" during a stream capture: in relaxed
 * mode this thread may make them without invalidating the program's capture (a munmap of a
 * promoted block can come in the middle of one, and the registration must go regardless). */
static CUstreamCaptureMode relax_capture(void)
{
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (!drv.cuThreadExchangeStreamCaptureMode || drv.cuThreadExchangeStreamCaptureMode(&mode) != CUDA_SUCCESS)
        return CU_STREAM_CAPTURE_MODE_RELAXED;
    return mode;
}

static void restore_capture(CUstreamCaptureMode mode)
{
    if (mode != CU_STREAM_CAPTURE_MODE_RELAXED && drv.cuThreadExchangeStreamCaptureMode)
        drv.cuThreadExchangeStreamCaptureMode(&mode);
}

static void unregister_range(uintptr_t base, size_t len, CUcontext ctx, int async_pending)
{
    if (shim_forked_child || !real_hook[HOOK_cuMemHostUnregister])
        return;
    uint64_t t0 = shim_now_ns();
    nvtx_push("pinshim unregister");
    CUstreamCaptureMode saved_mode = relax_capture();
    int pushed = ctx && drv.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS;
    if (async_pending && drv.cuCtxSynchronize)
        drv.cuCtxSynchronize();   /* trusted async copies may still use it */
    CUresult r = ((CUresult(*)(void *))real_hook[HOOK_cuMemHostUnregister])((void *)base);
    if (pushed) {
        CUcontext ignored;
        drv.cuCtxPopCurrent_v2(&ignored);
    }
    restore_capture(saved_mode);
    nvtx_pop();
    if (r != CUDA_SUCCESS)
        shim_log_once(LOG_INFO, "unregister of a promoted block failed (error %d)", (int)r);
    stats_add(STAT_UNREGISTER_NS, shim_now_ns() - t0);
    update_registered(-(int64_t)len);
    nodebudget_release(len);
}

/* Make room for `need` more registered bytes.  reg_mutex held, table lock not held.  Cached
 * blocks go first (least recently freed first), then promoted blocks idle for long enough,
 * least recently used first, never `keep`. */
static int make_room(size_t need, struct block *keep)
{
    while (policy_registered_bytes() + need > shim_cfg.budget) {
        uint64_t now = shim_now_ns();
        table_lock();
        struct block *victim = cache_tail;
        if (victim) {
            cache_unlink(victim);
            table_remove(victim);
        } else {
            uint64_t keep_gap = keep && keep->copies > 1 ? now - keep->last_use_ns : 0;
            struct block *b, *tmp;
            TABLE_FOREACH(b, tmp) {
                if (b == keep || b->state != BLOCK_PROMOTED || b->inflight || b->captured)
                    continue;
                uint64_t idle = now - b->last_use_ns;
                if (idle < IDLE_EVICT_NS && idle <= keep_gap)
                    continue;
                if (!victim || b->last_use_ns < victim->last_use_ns)
                    victim = b;
            }
            if (!victim) {
                table_unlock();
                return 0;
            }
            victim->state = BLOCK_PAGEABLE;
            victim->reg_changing = 1;
        }
        int was_cached = victim->state == BLOCK_CACHED;
        uintptr_t base = victim->reg_base, map = victim->map_base;
        size_t len = victim->reg_len, map_len = victim->map_len;
        CUcontext ctx = victim->reg_ctx;
        int pending = victim->async_pending;
        victim->reg_base = 0;
        victim->reg_len = 0;
        victim->async_pending = 0;
        if (was_cached)
            block_delete(victim);
        table_unlock();
        nvtx_mark("pinshim evict");
        unregister_range(base, len, ctx, pending);
        if (!was_cached) {
            table_lock();
            victim->reg_changing = 0;
            table_unlock();
        }
        stats_add(STAT_EVICTIONS, 1);
        stats_add(STAT_EVICTED_BYTES, len);
        if (was_cached) {
            os_unmap((void *)map, map_len);
            stats_add(STAT_CACHE_RELEASED, 1);
        }
    }
    return 1;
}

static CUresult register_range(uintptr_t base, size_t len, unsigned flags)
{
    return ((CUresult(*)(void *, size_t, unsigned))real_hook[HOOK_cuMemHostRegister_v2])(
        (void *)base, len, flags);
}

int policy_worth_keeping_warm(const struct block *b)
{
    /* At least one transfer of most of its bytes: the pattern of a step buffer or a tensor that
     * a framework allocates afresh every step. */
    return b->origin == ORIGIN_HEAP && b->state == BLOCK_PAGEABLE && !b->no_promote &&
           b->bytes_moved >= b->map_len / 2 && b->map_len <= shim_cfg.budget &&
           __atomic_load_n(&promotion_state, __ATOMIC_RELAXED) > 0;
}

int policy_promote(struct block *b)
{
    if (!real_hook[HOOK_cuMemHostRegister_v2] || !policy_promotion_enabled())
        return 0;
    CUcontext ctx = NULL;
    if (drv.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
        return 0;
    int promoted = 0;
    pthread_mutex_lock(&reg_mutex);
    table_lock();
    int state = b->state;
    uintptr_t base = b->map_base;
    size_t len = b->map_len;
    int prot = b->prot;
    table_unlock();
    if (state == BLOCK_PROMOTED) {
        pthread_mutex_unlock(&reg_mutex);
        return 1;
    }
    if (state != BLOCK_PAGEABLE) {
        pthread_mutex_unlock(&reg_mutex);
        return 0;
    }
    if (make_room(len, b) && nodebudget_reserve(len)) {
        unsigned flags = CU_MEMHOSTREGISTER_PORTABLE;
        if (!(prot & PROT_WRITE))
            flags |= CU_MEMHOSTREGISTER_READ_ONLY;
        table_lock();
        if (b->reg_changing || b->state != BLOCK_PAGEABLE) {
            /* The program's own unregister holds it (or it changed while room was made): not
             * now. */
            table_unlock();
            nodebudget_release(len);
            pthread_mutex_unlock(&reg_mutex);
            return 0;
        }
        b->reg_changing = 1;
        table_unlock();
        uint64_t t0 = shim_now_ns();
        nvtx_push("pinshim promote");
        CUresult r = register_range(base, len, flags);
        nvtx_pop();
        stats_add(STAT_REGISTER_NS, shim_now_ns() - t0);
        table_lock();
        b->reg_changing = 0;
        if (r == CUDA_SUCCESS) {
            b->state = BLOCK_PROMOTED;
            b->reg_base = base;
            b->reg_len = len;
            b->reg_ctx = ctx;
            promoted = 1;
        } else {
            /* Overlap with the program's own pinning, or memory the driver refuses: this
             * block stays pageable; the copy takes the original path. */
            if (r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED || r == CUDA_ERROR_INVALID_VALUE ||
                r == CUDA_ERROR_NOT_PERMITTED)
                b->no_promote = 1;
        }
        table_unlock();
        if (promoted) {
            update_registered((int64_t)len);
            stats_add(STAT_PROMOTIONS, 1);
            stats_add(STAT_PROMOTED_BYTES, len);
        } else {
            nodebudget_release(len);
            stats_add(STAT_PROMOTION_FAILURES, 1);
            shim_log_once(LOG_INFO, "registering a hot block failed (error %d): left pageable", (int)r);
            if (r == CUDA_ERROR_NOT_SUPPORTED)
                disable_promotion("the driver refused host memory registration");
        }
    }
    pthread_mutex_unlock(&reg_mutex);
    return promoted;
}

int policy_reserve(size_t bytes)
{
    int ok = 0;
    pthread_mutex_lock(&reg_mutex);
    if (make_room(bytes, NULL) && nodebudget_reserve(bytes)) {
        update_registered((int64_t)bytes);
        ok = 1;
    }
    pthread_mutex_unlock(&reg_mutex);
    return ok;
}

void policy_release(size_t bytes)
{
    update_registered(-(int64_t)bytes);
    nodebudget_release(bytes);
}

struct block *policy_cache_take(size_t n, size_t align)
{
    if (!__atomic_load_n(&cache_head, __ATOMIC_RELAXED))
        return NULL;
    table_lock();
    struct block *best = NULL;
    for (struct block *b = cache_head; b; b = b->cache_next) {
        size_t usable = b->map_base + b->map_len - b->base;
        /* A fit: large enough, not wastefully larger, aligned as asked. */
        if (usable < n || usable / 2 > n || (b->base & (align - 1)))
            continue;
        if (!best || b->map_len < best->map_len)
            best = b;
    }
    if (best) {
        cache_unlink(best);
        best->state = BLOCK_PROMOTED;
        best->size = n;
        best->last_use_ns = shim_now_ns();
    } else {
        stats_add(STAT_CACHE_MISSES, 1);
    }
    table_unlock();
    return best;
}

void policy_cache_put(struct block *b)
{
    b->state = BLOCK_CACHED;
    b->captured = 0;
    b->size = 0;
    b->copies = 0;
    b->bytes_moved = 0;
    b->last_use_ns = shim_now_ns();
    b->cache_prev = NULL;
    b->cache_next = cache_head;
    if (cache_head)
        cache_head->cache_prev = b;
    cache_head = b;
    if (!cache_tail)
        cache_tail = b;
}

int policy_release_range(uintptr_t p, size_t n, int drop_blocks)
{
    int released = 0;
    struct release { uintptr_t base, map; size_t len, map_len; CUcontext ctx; int pending, unmap; struct block *kept; };
    for (;;) {
        struct block *found[32];
        struct release todo[32];
        size_t ntodo = 0;
        table_lock();
        size_t nfound = table_find_overlapping(p, n, found, 32);
        struct block *busy = NULL;
        for (size_t i = 0; i < nfound && !busy; i++)
            if (found[i]->reg_changing)
                busy = found[i];
        if (busy) {
            /* An eviction is reg_changing it: let that finish, then look again. */
            table_wait_reg_settled(busy);
            table_unlock();
            continue;
        }
        int progress = 0;
        for (size_t i = 0; i < nfound; i++) {
            struct block *b = found[i];
            if (b->state != BLOCK_PAGEABLE) {
                todo[ntodo] = (struct release){b->reg_base, b->map_base, b->reg_len, b->map_len,
                                               b->reg_ctx, b->async_pending, 0, drop_blocks ? NULL : b};
                ntodo++;
                if (!drop_blocks)
                    b->reg_changing = 1;
                if (b->state == BLOCK_CACHED)
                    cache_unlink(b);
                b->state = BLOCK_PAGEABLE;
                b->reg_base = 0;
                b->reg_len = 0;
                b->async_pending = 0;
                progress = 1;
            }
            if (drop_blocks) {
                table_remove(b);
                block_delete(b);
                progress = 1;
            }
        }
        table_unlock();
        /* Unregister outside the table lock: it waits for in-flight DMA. */
        for (size_t i = 0; i < ntodo; i++)
            if (todo[i].len) {
                unregister_range(todo[i].base, todo[i].len, todo[i].ctx, todo[i].pending);
                released++;
            }
        table_lock();
        for (size_t i = 0; i < ntodo; i++)
            if (todo[i].kept)
                todo[i].kept->reg_changing = 0;
        table_unlock();
        if (nfound < 32 || !progress)
            break;
    }
    return released;
}

void policy_forget_registrations(void)
{
    /* In a fork child: the threads that held reg_mutex, or were changing a registration, do not
     * exist here, and nothing in the child will ever register. */
    pthread_mutex_init(&reg_mutex, NULL);
    table_lock();
    struct block *b, *tmp;
    TABLE_FOREACH(b, tmp) {
        b->reg_changing = 0;
        b->inflight = 0;
        if (b->state == BLOCK_CACHED) {
            cache_unlink(b);
            b->state = BLOCK_PROMOTED; /* freed by the program: the heap frees it below */
        }
        b->state = BLOCK_PAGEABLE;
        b->reg_base = 0;
        b->reg_len = 0;
    }
    cache_head = cache_tail = NULL;
    registered_bytes = 0;
    table_unlock();
}

/* PINSHIM_CALIBRATE=1: measure this machine's costs once, at the first promotion decision,
 * with a 64 MiB buffer, instead of the defaults measured on an H200. */
static void calibrate(void)
{
    const size_t n = 64ul << 20;
    CUresult (*htod)(CUdeviceptr, const void *, size_t) =
        (CUresult(*)(CUdeviceptr, const void *, size_t))real_hook[HOOK_cuMemcpyHtoD_v2];
    CUresult (*dtoh)(void *, CUdeviceptr, size_t) =
        (CUresult(*)(void *, CUdeviceptr, size_t))real_hook[HOOK_cuMemcpyDtoH_v2];
    CUdeviceptr dev;
    void *host = os_map(n);
    if (!host || !htod || !dtoh || drv.cuMemAlloc_v2(&dev, n) != CUDA_SUCCESS) {
        if (host)
            os_unmap(host, n);
        shim_log(LOG_WARN, "PINSHIM_CALIBRATE: could not set up the measurement; using the defaults");
        return;
    }
    memset(host, 1, n);
    uint64_t t0 = shim_now_ns();
    htod(dev, host, n);
    uint64_t t1 = shim_now_ns();
    dtoh(host, dev, n);
    uint64_t t2 = shim_now_ns();
    CUresult r = register_range((uintptr_t)host, n, CU_MEMHOSTREGISTER_PORTABLE);
    uint64_t t3 = shim_now_ns();
    if (r == CUDA_SUCCESS) {
        htod(dev, host, n);
        uint64_t t4 = shim_now_ns();
        ((CUresult(*)(void *))real_hook[HOOK_cuMemHostUnregister])(host);
        double mb = (double)n / 1e6;
        shim_cfg.bw_h2d_pageable = (uint64_t)(mb / ((double)(t1 - t0) / 1e9));
        shim_cfg.bw_d2h_pageable = (uint64_t)(mb / ((double)(t2 - t1) / 1e9));
        shim_cfg.bw_pinned = (uint64_t)(mb / ((double)(t4 - t3) / 1e9));
        shim_cfg.reg_cost_resident = (uint64_t)((double)(t3 - t2) / 1e3 * (GIB / (double)n));
        shim_log(LOG_INFO, "calibrated: pageable h2d %llu MB/s, d2h %llu MB/s, pinned %llu MB/s, "
                 "register %llu us/GiB",
                 (unsigned long long)shim_cfg.bw_h2d_pageable, (unsigned long long)shim_cfg.bw_d2h_pageable,
                 (unsigned long long)shim_cfg.bw_pinned, (unsigned long long)shim_cfg.reg_cost_resident);
    }
    drv.cuMemFree_v2(dev);
    os_unmap(host, n);
}
