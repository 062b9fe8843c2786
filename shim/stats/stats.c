/* Transfer statistics: counters, size histogram, call sites; the text report and the JSON file.
 *
 * The copy path adds to its own thread's counters with plain stores (no locked instructions: a
 * small copy's whole overhead is a few of them); readers sum the live threads' counters and what
 * exited threads left behind.  Call sites cost a backtrace, so only large copies and a sample of
 * small ones pay it; they live in a uthash table under a mutex.  The writers
 * format into a fixed buffer and write(2) it, so producing the output allocates nothing. */
#define _GNU_SOURCE
#include "stats/stats.h"
#include "stats/trace.h"
#include "base/config.h"
#include "base/os.h"
#include "base/hooks.h"
#include "base/log.h"
#include "base/real.h"
#include "base/shim.h"

#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <unwind.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/auxv.h>
#include <unistd.h>

/* Out of memory in the table must not end the program (uthash's default is exit()). */
#define HASH_NONFATAL_OOM 1
#include "base/meta.h"
#include <uthash.h>

static const char *const dir_names[DIR_COUNT] = { "h2d", "d2h", "d2d", "h2h" };
static const char *const kind_names[MEM_KIND_COUNT] = {
    "pageable", "promoted", "pinned", "staged", "device",
};
/* What the shim did with a copy of this kind, as the report words it. */
static const char *const kind_actions[MEM_KIND_COUNT] = {
    "left pageable", "promoted", "pinned by program", "staged", "device only",
};

/* ---- counters ---- */

#define SITE_KEY_FRAMES 3      /* a site is its first 3 return addresses outside shim and driver */
#define SITE_WALK_FRAMES 16    /* enough for the shim's and the runtime's frames plus the key */
#define SITE_MEMO_ENTRIES 4

/* A call chain a thread walked, remembered so that its next copies from the same place need no
 * walk (see site_memo_find). */
struct site_memo {
    uintptr_t anchor;                      /* stats_record_site's frame then; 0: empty */
    unsigned nslots;
    uint32_t slot_off[SITE_WALK_FRAMES];   /* where each return address lay, above the anchor */
    uintptr_t ra[SITE_WALK_FRAMES];        /* and what it was */
    void *key[SITE_KEY_FRAMES];
};

/* The per-copy counters of one thread.  Only the owner writes them (load, add, store: no lock
 * prefix); a reader may see a count a copy or two behind, never a torn value. */
struct stats_shard {
    struct dir_totals dir[DIR_COUNT];
    struct dir_totals kind[MEM_KIND_COUNT];
    struct dir_totals hist[STATS_HIST_BUCKETS];
    uint64_t entry_calls[HOOK_COUNT];
    struct stats_shard *next;   /* in live_shards or free_shards */
    /* The thread's own, never summed: */
    struct site_memo memo[SITE_MEMO_ENTRIES];
    unsigned memo_next;
};
/* Shards live in the shim's own mappings, never in a thread's TLS or stack: a reader can never
 * find one unmapped, and the shim's static TLS stays a few words (its initial-exec TLS must
 * fit in what the loader reserves). */
/* The counters of a shard, as uint64 words: everything before `next`. */
#define SHARD_WORDS (offsetof(struct stats_shard, next) / sizeof(uint64_t))
static __thread struct stats_shard *my_shard;
static struct stats_shard *live_shards;
static struct stats_shard *free_shards;   /* of exited threads, zeroed, for the next thread */
static struct stats_shard retired;   /* the sums of threads that have exited */
static pthread_mutex_t shards_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_key_t shard_key;
static int shard_key_made;
static pthread_once_t shard_once = PTHREAD_ONCE_INIT;

static uint64_t counters[STAT_COUNTER_COUNT];
static uint64_t registered_now, registered_peak;

/* The first reason promotion was switched off; set once, read at exit. */
static char disabled_reason[192];
static int disabled_claimed, disabled_ready;

static inline void add_relaxed(uint64_t *p, uint64_t v) { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline uint64_t load_relaxed(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

static inline void bump(uint64_t *p, uint64_t v)
{
    __atomic_store_n(p, __atomic_load_n(p, __ATOMIC_RELAXED) + v, __ATOMIC_RELAXED);
}

/* A thread's counters are folded into `retired` when it exits; the key's destructor runs then. */
static void retire_shard(void *arg)
{
    struct stats_shard *sh = arg;
    pthread_mutex_lock(&shards_lock);
    for (struct stats_shard **pp = &live_shards; *pp; pp = &(*pp)->next) {
        if (*pp != sh)
            continue;
        *pp = sh->next;
        break;
    }
    uint64_t *from = (uint64_t *)sh, *to = (uint64_t *)&retired;
    for (size_t i = 0; i < SHARD_WORDS; i++) {
        add_relaxed(&to[i], load_relaxed(&from[i]));
        __atomic_store_n(&from[i], 0, __ATOMIC_RELAXED);
    }
    memset(sh->memo, 0, sizeof sh->memo);   /* the next thread's stack is not this one's */
    sh->memo_next = 0;
    sh->next = free_shards;
    free_shards = sh;
    pthread_mutex_unlock(&shards_lock);
    my_shard = NULL;   /* a copy made by a later destructor of this thread links a shard again */
}

static void make_shard_key(void)
{
    shard_key_made = pthread_key_create(&shard_key, retire_shard) == 0;
}

/* Another thread may hold shards_lock when this one forks: the child gets it unlocked. */
static void shards_prefork(void) { pthread_mutex_lock(&shards_lock); }
static void shards_postfork(void) { pthread_mutex_unlock(&shards_lock); }

__attribute__((constructor)) static void shards_setup(void)
{
    pthread_atfork(shards_prefork, shards_postfork, shards_postfork);
}

/* Give this thread its counters, or answer `retired` (shared, atomic adds) when there is no
 * memory for them or the thread's exit could not be caught. */
static __attribute__((noinline)) struct stats_shard *link_shard(void)
{
    shim_enter();   /* pthread_setspecific may allocate */
    pthread_once(&shard_once, make_shard_key);
    pthread_mutex_lock(&shards_lock);
    struct stats_shard *sh = free_shards;
    if (sh)
        free_shards = sh->next;
    pthread_mutex_unlock(&shards_lock);
    if (!sh)
        sh = os_map(page_up(sizeof *sh));   /* zero-filled */
    if (sh && !(shard_key_made && pthread_setspecific(shard_key, sh) == 0)) {
        pthread_mutex_lock(&shards_lock);
        sh->next = free_shards;
        free_shards = sh;
        pthread_mutex_unlock(&shards_lock);
        sh = NULL;
    }
    if (sh) {
        pthread_mutex_lock(&shards_lock);
        sh->next = live_shards;
        live_shards = sh;
        pthread_mutex_unlock(&shards_lock);
        my_shard = sh;
    }
    shim_leave();
    return sh ? sh : &retired;
}

static inline struct stats_shard *shard(void)
{
    struct stats_shard *sh = my_shard;
    return SHIM_LIKELY(sh != NULL) ? sh : link_shard();
}

/* Add to a counter of `sh`: plainly in the thread's own shard, atomically in the shared one. */
static inline void shard_add(struct stats_shard *sh, uint64_t *p, uint64_t v)
{
    if (SHIM_LIKELY(sh != &retired))
        bump(p, v);
    else
        add_relaxed(p, v);
}

/* Shards lock held: every shard, `retired` first, then the live threads' ones. */
#define FOR_EACH_SHARD(sh) \
    for (struct stats_shard *sh = &retired; sh; sh = sh == &retired ? live_shards : sh->next)

/* The sum over all threads, live and exited, of the uint64 counters at `offset` in a shard. */
static void sum_shards(size_t offset, uint64_t *out, size_t n)
{
    memset(out, 0, n * sizeof *out);
    pthread_mutex_lock(&shards_lock);
    FOR_EACH_SHARD(sh) {
        const uint64_t *v = (const uint64_t *)((const char *)sh + offset);
        for (size_t i = 0; i < n; i++)
            out[i] += load_relaxed(&v[i]);
    }
    pthread_mutex_unlock(&shards_lock);
}

/* The time of `count` copies from the `timed` ones among them. */
static uint64_t scaled_ns(uint64_t ns, uint64_t count, uint64_t timed)
{
    if (!timed || timed >= count)
        return ns;
    return (uint64_t)((double)ns * (double)count / (double)timed);
}

static struct dir_totals sum_totals(size_t offset)
{
    uint64_t v[4];
    sum_shards(offset, v, 4);
    return (struct dir_totals){ v[0], v[1], scaled_ns(v[2], v[0], v[3]), v[3] };
}

unsigned stats_hist_index(uint64_t bytes)
{
    return bytes ? 64u - (unsigned)__builtin_clzll(bytes) : 0u;
}

uint64_t stats_hist_min_bytes(unsigned index)
{
    return index ? UINT64_C(1) << (index - 1) : 0;
}

struct dir_totals stats_hist(unsigned index)
{
    if (index >= STATS_HIST_BUCKETS)
        return (struct dir_totals){ 0, 0, 0, 0 };
    return sum_totals(offsetof(struct stats_shard, hist) + index * sizeof(struct dir_totals));
}

void stats_record_copy(const struct copy_record *r)
{
    if ((unsigned)r->dir >= DIR_COUNT || (unsigned)r->kind >= MEM_KIND_COUNT)
        return;
    struct stats_shard *sh = shard();
    shard_add(sh, &sh->dir[r->dir].count, 1);
    shard_add(sh, &sh->dir[r->dir].bytes, r->bytes);
    shard_add(sh, &sh->kind[r->kind].count, 1);
    shard_add(sh, &sh->kind[r->kind].bytes, r->bytes);
    if (r->timed) {
        shard_add(sh, &sh->dir[r->dir].ns, r->ns);
        shard_add(sh, &sh->dir[r->dir].timed, 1);
        shard_add(sh, &sh->kind[r->kind].ns, r->ns);
        shard_add(sh, &sh->kind[r->kind].timed, 1);
    }
    unsigned h = stats_hist_index(r->bytes);
    shard_add(sh, &sh->hist[h].count, 1);
    shard_add(sh, &sh->hist[h].bytes, r->bytes);
    if (trace_on() && r->timed && r->bytes >= STATS_TIME_ALL_MIN)
        trace_event(r->ns, "copy", "dir=%s bytes=%zu path=%s async=%d why=%s", dir_names[r->dir], r->bytes,
                    kind_names[r->kind], r->is_async, r->why ? r->why : "none");
}

void stats_add(enum stats_counter c, uint64_t delta)
{
    if ((unsigned)c < STAT_COUNTER_COUNT)
        add_relaxed(&counters[c], delta);
}

void stats_count_entry(int id)
{
    if ((unsigned)id >= HOOK_COUNT)
        return;
    struct stats_shard *sh = shard();
    shard_add(sh, &sh->entry_calls[id], 1);
}

uint64_t stats_get(enum stats_counter c)
{
    return (unsigned)c < STAT_COUNTER_COUNT ? load_relaxed(&counters[c]) : 0;
}

void stats_registered_bytes(uint64_t now)
{
    __atomic_store_n(&registered_now, now, __ATOMIC_RELAXED);
    uint64_t peak = load_relaxed(&registered_peak);
    while (now > peak &&
           !__atomic_compare_exchange_n(&registered_peak, &peak, now, true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
        ;
}

uint64_t stats_registered_peak(void) { return load_relaxed(&registered_peak); }

static stats_node_budget_reader node_budget_reader;

void stats_set_node_budget_reader(stats_node_budget_reader read)
{
    __atomic_store_n(&node_budget_reader, read, __ATOMIC_RELEASE);
}

static void node_budget_usage(uint64_t *budget, uint64_t *node_used, uint64_t *mine)
{
    stats_node_budget_reader read = __atomic_load_n(&node_budget_reader, __ATOMIC_ACQUIRE);
    if (read) {
        read(budget, node_used, mine);
        return;
    }
    *budget = shim_cfg.node_budget;
    *node_used = *mine = 0;
}

static stats_tracking_reader tracking_reader;

void stats_set_tracking_reader(stats_tracking_reader read)
{
    __atomic_store_n(&tracking_reader, read, __ATOMIC_RELEASE);
}

void stats_promotion_disabled(const char *reason)
{
    if (__atomic_exchange_n(&disabled_claimed, 1, __ATOMIC_ACQ_REL))
        return;   /* the first reason is the one that matters */
    snprintf(disabled_reason, sizeof disabled_reason, "%s", reason ? reason : "unknown");
    __atomic_store_n(&disabled_ready, 1, __ATOMIC_RELEASE);
    shim_log(LOG_INFO, "promotion disabled: %s", disabled_reason);
}

/* Why promotion is off, or "" when it is on. */
static void promotion_off_reason(char *buf, size_t bufsz)
{
    if (__atomic_load_n(&disabled_ready, __ATOMIC_ACQUIRE))
        snprintf(buf, bufsz, "%s", disabled_reason);
    else if (shim_cfg.mode < MODE_PIN)
        snprintf(buf, bufsz, "PINSHIM_MODE=%s", config_mode_name(shim_cfg.mode));
    else if (shim_cfg.budget == 0)
        snprintf(buf, bufsz, "PINSHIM_BUDGET=0");
    else
        buf[0] = '\0';
}

struct dir_totals stats_dir(enum copy_dir d)
{
    if ((unsigned)d >= DIR_COUNT)
        return (struct dir_totals){ 0, 0, 0, 0 };
    return sum_totals(offsetof(struct stats_shard, dir) + d * sizeof(struct dir_totals));
}

struct dir_totals stats_kind(enum mem_kind k)
{
    if ((unsigned)k >= MEM_KIND_COUNT)
        return (struct dir_totals){ 0, 0, 0, 0 };
    return sum_totals(offsetof(struct stats_shard, kind) + k * sizeof(struct dir_totals));
}

/* ---- call sites ---- */

#define SITE_MAX 4096          /* distinct sites kept; bounds the memory the table can take */
#define SITE_TOP_JSON 20
#define SITE_TOP_REPORT 10

enum site_flag { FLAG_ASYNC_FROM_PAGEABLE, FLAG_SYNC_BLOCKING, FLAG_COUNT };
static const char *const flag_names[FLAG_COUNT] = { "async_from_pageable", "sync_blocking" };

struct site_totals {
    void *key[SITE_KEY_FRAMES];
    uint64_t count, bytes, ns, timed;   /* ns: of the timed copies only (weighted) */
    uint64_t kind_count[MEM_KIND_COUNT];
    unsigned flag_kinds[FLAG_COUNT];   /* per flag: bit k set when a copy of kind k raised it */
    bool sampled;                      /* some counts are scaled-up samples */
};

struct call_site {
    struct site_totals t;
    UT_hash_handle hh;
};

static pthread_mutex_t sites_lock = PTHREAD_MUTEX_INITIALIZER;
static struct call_site *sites;
static uint64_t site_count;
static uint64_t site_copies_dropped;   /* copies of sites beyond SITE_MAX */
static uint64_t site_walks;            /* stacks walked (the rest of the sites came from memos) */

/* Which return addresses to walk past: the shim's own object (when it is a separate library) and
 * the CUDA driver and runtime.  dladdr costs a lookup under the loader lock, so each answer is
 * cached by address: entry = address << 1 | skip, 0 = empty.  A library unloaded and another
 * loaded at the same address could get a stale answer; that only misnames a site. */
#define SKIP_CACHE_BITS 10
static uint64_t skip_cache[1u << SKIP_CACHE_BITS];
/* libgcc_s's unwinder (see site_key); NULL: glibc's backtrace, every copy walked. */
typedef _Unwind_Reason_Code (*uw_backtrace_fn)(_Unwind_Trace_Fn, void *);
typedef _Unwind_Ptr (*uw_get_ip_fn)(struct _Unwind_Context *);
typedef _Unwind_Word (*uw_get_cfa_fn)(struct _Unwind_Context *);
static uw_backtrace_fn uw_backtrace;
static uw_get_ip_fn uw_get_ip;
static uw_get_cfa_fn uw_get_cfa;
static uintptr_t shim_object_base;   /* 0 when the shim is linked into the program (unit tests) */
static pthread_once_t shim_object_once = PTHREAD_ONCE_INIT;

static void find_shim_object(void)
{
    /* The unwinder glibc's backtrace uses, for the frames' addresses as well as their code. */
    real_libc_resolve();
    void *gcc_s = libc.dlsym ? dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_LOCAL) : NULL;
    if (gcc_s) {
        /* The C library's dlsym: the shim's own export is the program's door. */
        uw_get_ip = (uw_get_ip_fn)libc.dlsym(gcc_s, "_Unwind_GetIP");
        uw_get_cfa = (uw_get_cfa_fn)libc.dlsym(gcc_s, "_Unwind_GetCFA");
        uw_backtrace_fn bt = (uw_backtrace_fn)libc.dlsym(gcc_s, "_Unwind_Backtrace");
        if (uw_get_ip && uw_get_cfa)
            uw_backtrace = bt;
    }
    Dl_info self, exe;
    if (!dladdr((void *)&stats_record_site, &self))
        return;
    /* Linked into the program itself, every program frame would look like the shim's: then only
     * stats_record_site's own frame is skipped. */
    void *exe_phdr = (void *)getauxval(AT_PHDR);
    if (exe_phdr && dladdr(exe_phdr, &exe) && exe.dli_fbase == self.dli_fbase)
        return;
    shim_object_base = (uintptr_t)self.dli_fbase;
}

static const char *base_name(const char *path)
{
    const char *slash = path ? strrchr(path, '/') : NULL;
    return slash ? slash + 1 : (path ? path : "");
}

static bool frame_is_skipped(void *addr)
{
    uintptr_t a = (uintptr_t)addr;
    size_t slot = (size_t)(((uint64_t)a * UINT64_C(0x9E3779B97F4A7C15)) >> (64 - SKIP_CACHE_BITS));
    uint64_t entry = __atomic_load_n(&skip_cache[slot], __ATOMIC_RELAXED);
    if (a && entry >> 1 == a)
        return entry & 1;

    Dl_info info;
    bool skip = false;
    if (dladdr(addr, &info)) {
        skip = (shim_object_base && (uintptr_t)info.dli_fbase == shim_object_base) ||
               strncmp(base_name(info.dli_fname), "libcuda", 7) == 0;   /* libcuda, libcudart */
    }
    __atomic_store_n(&skip_cache[slot], ((uint64_t)a << 1) | skip, __ATOMIC_RELAXED);
    return skip;
}

/* Per thread, for copies under 1 MiB and above: how many were walked exactly, and the copies
 * and bytes since the last sampled walk.  stats_reset clears the calling thread's. */
static __thread struct site_sampler { uint32_t exact; uint64_t copies, bytes, next, rng; } sampler[2];

/* The bytes until the next sampled walk: the period, jittered uniformly over half of it either
 * way, so that a program's periodic pattern of copies cannot line up with the samples and
 * credit one site with another's bytes.  A fixed seed keeps a run's attribution repeatable. */
static uint64_t site_sample_gap(struct site_sampler *sp, uint64_t period)
{
    if (!sp->rng)
        sp->rng = 0x9E3779B97F4A7C15ull;
    sp->rng ^= sp->rng << 13;
    sp->rng ^= sp->rng >> 7;
    sp->rng ^= sp->rng << 17;
    return period / 2 + sp->rng % period;
}

/* ---- walking the stack ----
 * A walk costs microseconds (the unwinder interprets each frame's CFI), tens of them once a
 * program has evicted the caches between copies: on a loop of 1 MiB copies, a third of the
 * copy's time.  So each thread remembers the chains it walked: where every return address lay
 * on its stack, relative to stats_record_site's frame, and what it was.  A later copy whose
 * frame is at the same place and whose stack holds the same return addresses in those slots
 * comes from the same place: by induction up the chain, each frame's slot was found from the
 * frame below it, whose size its code fixes (a frame of variable size, alloca's, could in
 * principle leave an old return address in a slot that is no longer one: the cost would be a
 * copy credited to the site it made before, never anything but the statistics).  x86-64 only,
 * where a return address lies just below its frame's CFA; elsewhere every copy walks.
 * The reads stay in mapped memory: a slot is read only once the slot below it held the same
 * return address, so by the same induction it is the return-address slot of a live frame of
 * this stack (a system call per read to make sure, process_vm_readv, cost as much as the walk
 * itself; asking the stack's bounds, pthread_getattr_np, allocates, which the hooks never do: a
 * signal handler of the program that calls malloc would find the C library's lock held).  The
 * one way out of the stack would need a frame of variable size in the chain and, at the same
 * address as the remembered one, a different and shorter stack (a coroutine's, freed and made
 * again). */

#define WALK_MAX (SITE_WALK_FRAMES + 4)   /* the walker's own frames come first */
struct walk {
    int n;
    uintptr_t ip[WALK_MAX], cfa[WALK_MAX];
};

static _Unwind_Reason_Code walk_frame(struct _Unwind_Context *ctx, void *arg)
{
    struct walk *w = arg;
    if (w->n >= WALK_MAX)
        return _URC_END_OF_STACK;
    w->ip[w->n] = (uintptr_t)uw_get_ip(ctx);
    w->cfa[w->n] = (uintptr_t)uw_get_cfa(ctx);
    w->n++;
    return _URC_NO_REASON;
}

static int site_memo_find(struct stats_shard *sh, uintptr_t anchor, void **key)
{
    for (unsigned e = 0; e < SITE_MEMO_ENTRIES; e++) {
        const struct site_memo *m = &sh->memo[e];
        if (m->anchor != anchor)
            continue;
        /* In order, each slot read only once the one below it matched (see above). */
        unsigned i = 0;
        while (i < m->nslots && *(const uintptr_t *)(anchor + m->slot_off[i]) == m->ra[i])
            i++;
        if (i == m->nslots) {
            memcpy(key, m->key, sizeof m->key);
            return 1;
        }
    }
    return 0;
}

/* Remember frames [first, last] of walk w, which gave key, if every return address lies where
 * x86-64 puts it (not so across a signal frame, for one). */
static void site_memo_put(struct stats_shard *sh, uintptr_t anchor, const struct walk *w,
                          int first, int last, void *const *key)
{
#if defined(__x86_64__)
    if (sh == &retired || last - first + 1 > SITE_WALK_FRAMES)
        return;
    struct site_memo *m = &sh->memo[sh->memo_next++ % SITE_MEMO_ENTRIES];
    m->anchor = 0;
    for (int i = first; i <= last; i++) {
        /* The slots were just read by the unwinder: they are mapped now. */
        uintptr_t slot = w->cfa[i] - sizeof(uintptr_t);
        if (slot <= anchor || slot - anchor > UINT32_MAX || *(const uintptr_t *)slot != w->ip[i])
            return;
        m->slot_off[i - first] = (uint32_t)(slot - anchor);
        m->ra[i - first] = w->ip[i];
    }
    m->nslots = (unsigned)(last - first + 1);
    memcpy(m->key, key, sizeof m->key);
    m->anchor = anchor;
#else
    (void)sh, (void)anchor, (void)w, (void)first, (void)last, (void)key;
#endif
}

/* The key of the copy being recorded: caller is stats_record_site's return address, anchor its
 * frame address.  Returns the frames walked, 0 when the thread's memo had the chain. */
static __attribute__((noinline)) int site_key(void **key, void *caller, uintptr_t anchor)
{
    struct stats_shard *sh = shard();
    if (sh != &retired && site_memo_find(sh, anchor, key))
        return 0;
    struct walk w = { .n = 0 };
    add_relaxed(&site_walks, 1);
    if (uw_backtrace) {
        uw_backtrace(walk_frame, &w);
    } else {
        void *frames[WALK_MAX];
        w.n = backtrace(frames, WALK_MAX);
        for (int i = 0; i < w.n; i++)
            w.ip[i] = (uintptr_t)frames[i];
    }
    /* Start at our caller's frame: frames before it are the walker's own and whatever wraps it
     * (a sanitizer's interceptor, for one). */
    int first = -1;
    for (int i = 0; i < w.n; i++) {
        if (w.ip[i] == (uintptr_t)caller) {
            first = i;
            break;
        }
    }
    if (first < 0)
        first = w.n > 2 ? 2 : w.n;
    int k = 0, last = -1;
    for (int i = first; i < w.n && i < first + SITE_WALK_FRAMES && k < SITE_KEY_FRAMES; i++) {
        last = i;
        if (k == 0 && frame_is_skipped((void *)w.ip[i]))
            continue;
        key[k++] = (void *)w.ip[i];
    }
    if (uw_backtrace && k > 0)
        site_memo_put(sh, anchor, &w, first, last, key);
    return w.n > 0 ? w.n : 1;
}

void stats_prepare_sites(void)
{
    shim_enter();   /* dlopen allocates: from the C library */
    pthread_once(&shim_object_once, find_shim_object);
    shim_leave();
}

__attribute__((noinline)) void stats_record_site(const struct copy_record *r)
{
    /* A stack walk costs microseconds: below PINSHIM_CALLSITE_MIN, exact for each thread's
     * first copies of a class, then one walk per STATS_SITE_SAMPLE_BYTES(_SMALL) moved, standing
     * for the copies and bytes since the previous one (see stats.h). */
    uint64_t copies = 1, bytes = r->bytes;
    if (r->bytes < shim_cfg.callsite_min) {
        int small = r->bytes < STATS_TIME_ALL_MIN;
        if (sampler[small].exact < (small ? STATS_SITE_EXACT_FIRST_SMALL : STATS_SITE_EXACT_FIRST)) {
            sampler[small].exact++;
        } else {
            struct site_sampler *sp = &sampler[small];
            uint64_t period = small ? STATS_SITE_SAMPLE_BYTES_SMALL : STATS_SITE_SAMPLE_BYTES;
            if (!sp->next)
                sp->next = site_sample_gap(sp, period);
            sp->copies++;
            sp->bytes += r->bytes ? r->bytes : 1;   /* empty copies still get walked */
            if (sp->bytes < sp->next)
                return;
            sp->next = site_sample_gap(sp, period);
            /* It stands for the bytes since the last walk, and for as many copies of its own
             * size as make them: a site of large copies walked once for many small ones of
             * other sites is not credited with their count. */
            bytes = r->bytes ? sampler[small].bytes : 0;
            copies = r->bytes ? (bytes + r->bytes / 2) / r->bytes : sampler[small].copies;
            sampler[small].copies = sampler[small].bytes = 0;
        }
    }
    if ((unsigned)r->kind >= MEM_KIND_COUNT)
        return;

    shim_enter();   /* backtrace may load libgcc_s (malloc); the table allocates */
    /* A walk's time is traced: a process's first ones (the unwinder finding its tables, dladdr
     * over large libraries) fall on a copy's critical path. */
    uint64_t walk_t0 = trace_on() ? shim_ticks() : 0;
    pthread_once(&shim_object_once, find_shim_object);

    /* Walk and classify outside the table lock: dladdr and the unwinder take the loader lock,
     * which a thread inside dlopen could hold while it copies and waits for our lock. */
    void *key[SITE_KEY_FRAMES] = { 0 };
    int walked = site_key(key, __builtin_extract_return_addr(__builtin_return_address(0)),
                          (uintptr_t)__builtin_frame_address(0));
    if (walk_t0 && walked)
        trace_event(shim_ns_since(walk_t0), "call_site_walk", "frames=%d copy_bytes=%zu", walked, r->bytes);

    unsigned raised = 0;
    if (r->is_async && (r->kind == MEM_PAGEABLE || r->kind == MEM_STAGED || r->kind == MEM_PROMOTED))
        raised |= 1u << FLAG_ASYNC_FROM_PAGEABLE;
    if (!r->is_async && r->host_blocked)
        raised |= 1u << FLAG_SYNC_BLOCKING;

    pthread_mutex_lock(&sites_lock);
    struct call_site *s;
    HASH_FIND(hh, sites, key, sizeof key, s);
    if (!s && site_count < SITE_MAX && (s = meta_alloc(sizeof *s)) != NULL) {
        memcpy(s->t.key, key, sizeof key);
        HASH_ADD(hh, sites, t.key, sizeof key, s);
        if (!s->hh.tbl) {   /* the table could not grow */
            meta_free(s, sizeof *s);
            s = NULL;
        } else {
            site_count++;
        }
    }
    if (s) {
        s->t.count += copies;
        s->t.bytes += bytes;
        if (r->timed) {
            /* The copies it stands for took time in proportion to their bytes. */
            s->t.ns += r->bytes ? (uint64_t)((double)r->ns * ((double)bytes / (double)r->bytes)) : r->ns * copies;
            s->t.timed += copies;
        }
        s->t.kind_count[r->kind] += copies;
        for (int f = 0; f < FLAG_COUNT; f++)
            if (raised & (1u << f))
                s->t.flag_kinds[f] |= 1u << r->kind;
        s->t.sampled |= copies > 1;
    } else {
        site_copies_dropped += copies;
    }
    pthread_mutex_unlock(&sites_lock);
    shim_leave();
}

/* The sites with the most bytes, largest first. */
static size_t top_sites(struct site_totals *top, size_t max, uint64_t *distinct, uint64_t *dropped)
{
    size_t used = 0;
    pthread_mutex_lock(&sites_lock);
    for (struct call_site *s = sites; s; s = s->hh.next) {
        size_t at = used;
        while (at > 0 && top[at - 1].bytes < s->t.bytes)
            at--;
        if (at >= max)
            continue;
        size_t moved = (used < max ? used : max - 1) - at;
        memmove(&top[at + 1], &top[at], moved * sizeof *top);
        top[at] = s->t;
        top[at].ns = scaled_ns(s->t.ns, s->t.count, s->t.timed);
        if (used < max)
            used++;
    }
    *distinct = site_count;
    *dropped = site_copies_dropped;
    pthread_mutex_unlock(&sites_lock);
    return used;
}

/* "symbol+0xoff (object)" or "object+0xoff" for a return address. */
static void symbolize(void *addr, char *buf, size_t bufsz)
{
    Dl_info info;
    if (!addr) {
        snprintf(buf, bufsz, "unknown");
        return;
    }
    /* Look up the call instruction, not the return address, which can lie past the function. */
    if (!dladdr((char *)addr - 1, &info) || !info.dli_fname) {
        snprintf(buf, bufsz, "%p", addr);
    } else if (info.dli_sname && info.dli_saddr) {
        snprintf(buf, bufsz, "%s+0x%lx (%s)", info.dli_sname,
                 (unsigned long)((char *)addr - (char *)info.dli_saddr), base_name(info.dli_fname));
    } else {
        snprintf(buf, bufsz, "%s+0x%lx", base_name(info.dli_fname),
                 (unsigned long)((char *)addr - (char *)info.dli_fbase));
    }
}

/* ---- output: a fixed buffer flushed with write(2) ---- */

struct out {
    int fd;
    int error;   /* first errno of a failed write, 0 if none */
    size_t len;
    char buf[4096];
};

static void out_flush(struct out *o)
{
    if (o->len && !o->error)
        o->error = os_write_all(o->fd, o->buf, o->len);
    o->len = 0;
}

static void out_bytes(struct out *o, const char *p, size_t n)
{
    while (n) {
        if (o->len == sizeof o->buf)
            out_flush(o);
        size_t take = sizeof o->buf - o->len;
        if (take > n)
            take = n;
        memcpy(o->buf + o->len, p, take);
        o->len += take;
        p += take;
        n -= take;
    }
}

static void out_str(struct out *o, const char *s) { out_bytes(o, s, strlen(s)); }

__attribute__((format(printf, 2, 3)))
static void out_fmt(struct out *o, const char *fmt, ...)
{
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        out_bytes(o, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* Length of the valid UTF-8 sequence at p, or 0 when it is not one. */
static size_t utf8_sequence_length(const unsigned char *p)
{
    size_t len;
    uint32_t cp;
    if (p[0] < 0x80) return 1;
    if ((p[0] & 0xE0) == 0xC0) { len = 2; cp = p[0] & 0x1F; }
    else if ((p[0] & 0xF0) == 0xE0) { len = 3; cp = p[0] & 0x0F; }
    else if ((p[0] & 0xF8) == 0xF0) { len = 4; cp = p[0] & 0x07; }
    else return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3F);
    }
    static const uint32_t smallest[5] = { 0, 0, 0x80, 0x800, 0x10000 };
    if (cp < smallest[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;   /* overlong, out of range, or a surrogate */
    return len;
}

/* A JSON string: quotes, backslashes and control bytes escaped; bytes that are not UTF-8 (a file
 * name can hold anything) become U+FFFD so that strict parsers accept the file. */
static void out_json_str(struct out *o, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    out_bytes(o, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        char esc[8];
        if (*p == '"' || *p == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*p;
            out_bytes(o, esc, 2);
            p++;
        } else if (*p < 0x20) {
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[*p >> 4];
            esc[5] = hex[*p & 15];
            out_bytes(o, esc, 6);
            p++;
        } else {
            size_t len = utf8_sequence_length(p);
            if (len) {
                out_bytes(o, (const char *)p, len);
                p += len;
            } else {
                out_str(o, "\\ufffd");
                p++;
            }
        }
    }
    out_bytes(o, "\"", 1);
}

static double seconds(uint64_t ns) { return (double)ns / 1e9; }

/* ---- JSON ---- */

static void json_totals(struct out *o, const char *name, struct dir_totals t, bool first)
{
    out_fmt(o, "%s\"%s\":{\"count\":%llu,\"bytes\":%llu,\"seconds\":%.6f}", first ? "" : ",", name,
            (unsigned long long)t.count, (unsigned long long)t.bytes, seconds(t.ns));
}

static void json_site(struct out *o, const struct site_totals *t, bool first)
{
    char name[1024];
    out_str(o, first ? "{\"site\":" : ",{\"site\":");
    symbolize(t->key[0], name, sizeof name);
    out_json_str(o, name);
    out_str(o, ",\"stack\":[");
    for (int i = 0; i < SITE_KEY_FRAMES && t->key[i]; i++) {
        symbolize(t->key[i], name, sizeof name);
        if (i)
            out_str(o, ",");
        out_json_str(o, name);
    }
    out_fmt(o, "],\"count\":%llu,\"bytes\":%llu,\"seconds\":%.6f,\"sampled\":%s,\"paths\":{",
            (unsigned long long)t->count, (unsigned long long)t->bytes, seconds(t->ns),
            t->sampled ? "true" : "false");
    for (int k = 0; k < MEM_KIND_COUNT; k++)
        out_fmt(o, "%s\"%s\":%llu", k ? "," : "", kind_names[k], (unsigned long long)t->kind_count[k]);
    out_str(o, "},\"flags\":[");
    bool any = false;
    for (int f = 0; f < FLAG_COUNT; f++) {
        if (t->flag_kinds[f]) {
            out_fmt(o, "%s\"%s\"", any ? "," : "", flag_names[f]);
            any = true;
        }
    }
    out_str(o, "],\"flag_paths\":{");
    any = false;
    for (int f = 0; f < FLAG_COUNT; f++) {
        if (!t->flag_kinds[f])
            continue;
        out_fmt(o, "%s\"%s\":[", any ? "," : "", flag_names[f]);
        bool first_kind = true;
        for (int k = 0; k < MEM_KIND_COUNT; k++) {
            if (t->flag_kinds[f] & (1u << k)) {
                out_fmt(o, "%s\"%s\"", first_kind ? "" : ",", kind_names[k]);
                first_kind = false;
            }
        }
        out_str(o, "]");
        any = true;
    }
    out_str(o, "}}");
}

static void write_json(struct out *o)
{
    char reason[256];
    promotion_off_reason(reason, sizeof reason);

    out_fmt(o, "{\"version\":1,\"pid\":%d,\"mode\":\"%s\",\"budget_bytes\":%llu,"
               "\"node_budget_bytes\":%llu,\"min_size\":%llu,\"promotion\":{\"enabled\":%s,"
               "\"disabled_reason\":",
            (int)getpid(), config_mode_name(shim_cfg.mode), (unsigned long long)shim_cfg.budget,
            (unsigned long long)shim_cfg.node_budget, (unsigned long long)shim_cfg.min_size,
            reason[0] ? "false" : "true");
    out_json_str(o, reason);

    out_str(o, "},\n\"copies\":{");
    for (int d = 0; d < DIR_COUNT; d++)
        json_totals(o, dir_names[d], stats_dir((enum copy_dir)d), d == 0);
    out_str(o, "},\n\"memory\":{");
    for (int k = 0; k < MEM_KIND_COUNT; k++)
        json_totals(o, kind_names[k], stats_kind((enum mem_kind)k), k == 0);

#define C(name) (unsigned long long)stats_get(STAT_##name)
    out_fmt(o, "},\n\"promotions\":{\"count\":%llu,\"bytes\":%llu,\"evictions\":%llu,"
               "\"evicted_bytes\":%llu,\"failures\":%llu,\"declined\":%llu,"
               "\"registered_bytes_peak\":%llu,\"cache_hits\":%llu,\"cache_misses\":%llu,"
               "\"cache_released\":%llu,\"register_seconds\":%.6f,\"unregister_seconds\":%.6f,"
               "\"program_register_yields\":%llu,\"flushed_bytes\":%llu},\n",
            C(PROMOTIONS), C(PROMOTED_BYTES), C(EVICTIONS), C(EVICTED_BYTES), C(PROMOTION_FAILURES),
            C(PROMOTIONS_DECLINED), (unsigned long long)stats_registered_peak(), C(CACHE_HITS),
            C(CACHE_MISSES), C(CACHE_RELEASED), seconds(stats_get(STAT_REGISTER_NS)),
            seconds(stats_get(STAT_UNREGISTER_NS)), C(PROGRAM_REGISTER_YIELDS), C(PROMOTION_FLUSHED_BYTES));
    out_fmt(o, "\"rewrites\":{\"sync_to_async\":%llu,\"async_waited\":%llu,"
               "\"ordering_wait_seconds\":%.6f},\n",
            C(REWRITE_SYNC_TO_ASYNC), C(REWRITE_ASYNC_WAITED), seconds(stats_get(STAT_ORDERING_WAIT_NS)));
    out_fmt(o, "\"staging\":{\"count\":%llu,\"bytes\":%llu,\"seconds\":%.6f,\"failures\":%llu,"
               "\"pieces\":%llu,\"cpu_seconds\":%.6f,\"wait_seconds\":%.6f,\"one_shot\":%llu,"
               "\"while_registering\":%llu,\"flushed_bytes\":%llu,\"prefaulted_bytes\":%llu},\n",
            C(STAGED_COPIES), C(STAGED_BYTES), seconds(stats_get(STAT_STAGED_NS)), C(STAGING_FAILURES),
            C(STAGING_PIECES), seconds(stats_get(STAT_STAGING_CPU_NS)), seconds(stats_get(STAT_STAGING_WAIT_NS)),
            C(STAGED_ONE_SHOT), C(STAGED_WHILE_REGISTERING), C(STAGING_FLUSHED_BYTES),
            C(STAGING_PREFAULTED_BYTES));
    out_fmt(o, "\"background\":{\"registrations\":%llu,\"cached_on_free\":%llu,\"taken_back\":%llu,"
               "\"held_off\":%llu},\n",
            C(BACKGROUND_REGISTRATIONS), C(CACHED_ON_FREE), C(CACHE_TAKEN_BACK), C(REGISTRAR_HELD_OFF));
    out_fmt(o, "\"bounce\":{\"count\":%llu,\"bytes\":%llu,\"seconds\":%.6f,\"to_pinned\":%llu,"
               "\"from_pinned\":%llu,\"sets\":%llu,\"set_bytes\":%llu,\"set_seconds\":%.6f},\n",
            C(BOUNCE_COPIES), C(BOUNCE_BYTES), seconds(stats_get(STAT_BOUNCE_NS)), C(BOUNCE_TO_PINNED),
            C(BOUNCE_FROM_PINNED), C(BOUNCE_SETS), C(BOUNCE_SET_BYTES), seconds(stats_get(STAT_BOUNCE_SET_NS)));
    out_fmt(o, "\"program_pinning\":{\"host_allocs\":%llu,\"host_alloc_bytes\":%llu,"
               "\"host_alloc_seconds\":%.6f,\"host_frees\":%llu,\"host_free_seconds\":%.6f,"
               "\"registers\":%llu,\"registered_bytes\":%llu,\"register_seconds\":%.6f,"
               "\"unregisters\":%llu,\"unregister_seconds\":%.6f},\n",
            C(PROGRAM_HOST_ALLOCS), C(PROGRAM_HOST_ALLOC_BYTES), seconds(stats_get(STAT_PROGRAM_HOST_ALLOC_NS)),
            C(PROGRAM_HOST_FREES), seconds(stats_get(STAT_PROGRAM_HOST_FREE_NS)), C(PROGRAM_REGISTERS),
            C(PROGRAM_REGISTERED_BYTES), seconds(stats_get(STAT_PROGRAM_REGISTER_NS)), C(PROGRAM_UNREGISTERS),
            seconds(stats_get(STAT_PROGRAM_UNREGISTER_NS)));
    {   /* node budget: the ceiling, bytes held on the node, by this process */
        uint64_t nb, nb_used, nb_mine;
        node_budget_usage(&nb, &nb_used, &nb_mine);
        out_fmt(o, "\"node_budget\":{\"bytes\":%llu,\"used_bytes\":%llu,\"mine_bytes\":%llu},\n",
                (unsigned long long)nb, (unsigned long long)nb_used, (unsigned long long)nb_mine);
    }
    {   /* what the registry tracks now */
        stats_tracking_reader read = __atomic_load_n(&tracking_reader, __ATOMIC_ACQUIRE);
        if (read) {
            struct stats_tracking t = {0};
            read(&t);
            out_fmt(o, "\"tracking\":{\"program_mappings\":%llu,\"heap_blocks\":%llu,"
                       "\"arena_records\":%llu,\"cached_blocks\":%llu,\"program_ranges\":%llu},\n",
                    (unsigned long long)t.program_mappings, (unsigned long long)t.heap_blocks,
                    (unsigned long long)t.arena_records, (unsigned long long)t.cached_blocks,
                    (unsigned long long)t.program_ranges);
        }
    }
    out_fmt(o, "\"other\":{\"capture_passthrough\":%llu,\"fallbacks\":%llu,\"batch_copies\":%llu,"
               "\"peer_copies\":%llu,\"fork_child_frees\":%llu,\"untracked_lookups\":%llu},\n",
            C(CAPTURE_PASSTHROUGH), C(FALLBACKS), C(BATCH_COPIES), C(PEER_COPIES),
            C(FORK_CHILD_FREES), C(UNTRACKED_LOOKUPS));
#undef C

    out_str(o, "\"entry_points\":{");
    bool first = true;
    uint64_t entry_calls[HOOK_COUNT];
    sum_shards(offsetof(struct stats_shard, entry_calls), entry_calls, HOOK_COUNT);
    for (int i = 0; i < HOOK_COUNT; i++) {
        uint64_t calls = entry_calls[i];
        if (!calls)
            continue;
        out_fmt(o, "%s\"%s\":%llu", first ? "" : ",", hook_table[i].symbol, (unsigned long long)calls);
        first = false;
    }
    out_str(o, "},\n\"histogram\":[");
    first = true;
    for (unsigned i = 0; i < STATS_HIST_BUCKETS; i++) {
        struct dir_totals h = stats_hist(i);
        if (!h.count)
            continue;
        out_fmt(o, "%s{\"min_bytes\":%llu,\"count\":%llu,\"bytes\":%llu}", first ? "" : ",",
                (unsigned long long)stats_hist_min_bytes(i), (unsigned long long)h.count,
                (unsigned long long)h.bytes);
        first = false;
    }

    struct site_totals top[SITE_TOP_JSON];
    uint64_t distinct, dropped;
    size_t n = top_sites(top, SITE_TOP_JSON, &distinct, &dropped);
    out_fmt(o, "],\n\"call_sites_total\":%llu,\"call_site_copies_dropped\":%llu,"
               "\"call_site_walks\":%llu,"
               "\"call_site_exact_first\":%d,\"call_site_exact_first_small\":%d,"
               "\"call_site_sample_bytes\":%u,\"call_site_sample_bytes_small\":%u,\n\"call_sites\":[",
            (unsigned long long)distinct, (unsigned long long)dropped,
            (unsigned long long)load_relaxed(&site_walks), STATS_SITE_EXACT_FIRST,
            STATS_SITE_EXACT_FIRST_SMALL, STATS_SITE_SAMPLE_BYTES, STATS_SITE_SAMPLE_BYTES_SMALL);
    for (size_t i = 0; i < n; i++) {
        json_site(o, &top[i], i == 0);
        out_str(o, "\n");
    }
    out_str(o, "]}\n");
}

/* ---- text report ---- */

/* Bytes in the largest binary unit that keeps the number at least 1. */
static const char *human_bytes(uint64_t bytes, char *buf, size_t bufsz)
{
    static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB" };
    if (bytes < 1024) {
        snprintf(buf, bufsz, "%llu B", (unsigned long long)bytes);
        return buf;
    }
    double v = (double)bytes / 1024;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, bufsz, "%.2f %s", v, units[u]);
    return buf;
}

static void report_rate(struct out *o, uint64_t bytes, uint64_t ns)
{
    if (ns)
        out_fmt(o, "%10.2f\n", (double)bytes / (double)ns);   /* bytes per ns = GB/s */
    else
        out_fmt(o, "%10s\n", "-");
}

static void report_site(struct out *o, unsigned rank, const struct site_totals *t)
{
    char name[1024], b[32];
    symbolize(t->key[0], name, sizeof name);
    out_fmt(o, "  %2u. ", rank);
    out_str(o, name);
    for (int i = 1; i < SITE_KEY_FRAMES && t->key[i]; i++) {
        symbolize(t->key[i], name, sizeof name);
        out_str(o, "  <- ");
        out_str(o, name);
    }
    out_fmt(o, "\n      %s%llu copies, %s, %.4f s; paths:", t->sampled ? "~" : "",
            (unsigned long long)t->count, human_bytes(t->bytes, b, sizeof b), seconds(t->ns));
    for (int k = 0; k < MEM_KIND_COUNT; k++)
        if (t->kind_count[k])
            out_fmt(o, " %s %llu", kind_names[k], (unsigned long long)t->kind_count[k]);
    out_str(o, "\n");
    for (int f = 0; f < FLAG_COUNT; f++) {
        if (!t->flag_kinds[f])
            continue;
        out_fmt(o, "      %s; the shim:", flag_names[f]);
        const char *sep = " ";
        for (int k = 0; k < MEM_KIND_COUNT; k++) {
            if (t->flag_kinds[f] & (1u << k)) {
                out_fmt(o, "%s%s", sep, kind_actions[k]);
                sep = ", ";
            }
        }
        out_str(o, "\n");
    }
}

static void write_report(struct out *o)
{
    char b1[32], b2[32], b3[32], reason[256];

    out_fmt(o, "pinshim report, pid %d: mode %s, budget %s, node budget %s, min size %s\n",
            (int)getpid(), config_mode_name(shim_cfg.mode), human_bytes(shim_cfg.budget, b1, sizeof b1),
            shim_cfg.node_budget ? human_bytes(shim_cfg.node_budget, b2, sizeof b2) : "off",
            human_bytes(shim_cfg.min_size, b3, sizeof b3));
    promotion_off_reason(reason, sizeof reason);
    if (reason[0]) {
        out_str(o, "promotion: disabled: ");
        out_str(o, reason);
        out_str(o, "\n");
    } else {
        out_str(o, "promotion: enabled\n");
    }

    out_fmt(o, "\n%-10s %12s %14s %12s %10s\n", "copies", "count", "bytes", "seconds", "GB/s");
    for (int d = 0; d < DIR_COUNT; d++) {
        struct dir_totals t = stats_dir((enum copy_dir)d);
        out_fmt(o, "%-10s %12llu %14s %12.4f ", dir_names[d], (unsigned long long)t.count,
                human_bytes(t.bytes, b1, sizeof b1), seconds(t.ns));
        report_rate(o, t.bytes, t.ns);
    }

    uint64_t all_bytes = 0;
    for (int k = 0; k < MEM_KIND_COUNT; k++)
        all_bytes += stats_kind((enum mem_kind)k).bytes;
    out_fmt(o, "\n%-10s %12s %14s %12s %10s %7s\n", "path", "count", "bytes", "seconds", "GB/s", "share");
    for (int k = 0; k < MEM_KIND_COUNT; k++) {
        struct dir_totals t = stats_kind((enum mem_kind)k);
        out_fmt(o, "%-10s %12llu %14s %12.4f ", kind_names[k], (unsigned long long)t.count,
                human_bytes(t.bytes, b1, sizeof b1), seconds(t.ns));
        if (t.ns)
            out_fmt(o, "%10.2f", (double)t.bytes / (double)t.ns);
        else
            out_fmt(o, "%10s", "-");
        out_fmt(o, " %6.1f%%\n", all_bytes ? 100.0 * (double)t.bytes / (double)all_bytes : 0.0);
    }

#define C(name) (unsigned long long)stats_get(STAT_##name)
    out_fmt(o, "\npromotions: %llu (%s), evictions %llu (%s), failures %llu, declined %llu, "
               "peak registered %s\n",
            C(PROMOTIONS), human_bytes(stats_get(STAT_PROMOTED_BYTES), b1, sizeof b1), C(EVICTIONS),
            human_bytes(stats_get(STAT_EVICTED_BYTES), b2, sizeof b2), C(PROMOTION_FAILURES),
            C(PROMOTIONS_DECLINED), human_bytes(stats_registered_peak(), b3, sizeof b3));
    out_fmt(o, "pinned cache: hits %llu, misses %llu, released %llu; register %.4f s, "
               "unregister %.4f s, given up to the program's own registration %llu\n",
            C(CACHE_HITS), C(CACHE_MISSES), C(CACHE_RELEASED), seconds(stats_get(STAT_REGISTER_NS)),
            seconds(stats_get(STAT_UNREGISTER_NS)), C(PROGRAM_REGISTER_YIELDS));
    out_fmt(o, "rewrites: %llu sync copies made async, %llu async copies waited, "
               "ordering waits %.4f s\n",
            C(REWRITE_SYNC_TO_ASYNC), C(REWRITE_ASYNC_WAITED), seconds(stats_get(STAT_ORDERING_WAIT_NS)));
    out_fmt(o, "staging: %llu copies, %s, %.4f s, failures %llu\n", C(STAGED_COPIES),
            human_bytes(stats_get(STAT_STAGED_BYTES), b1, sizeof b1),
            seconds(stats_get(STAT_STAGED_NS)), C(STAGING_FAILURES));
    {
        uint64_t ns = stats_get(STAT_BOUNCE_NS), bytes = stats_get(STAT_BOUNCE_BYTES);
        out_fmt(o, "bounce: %llu memcpy/memmove calls shared among the copy threads, %s, %.4f s",
                C(BOUNCE_COPIES), human_bytes(bytes, b1, sizeof b1), seconds(ns));
        if (ns)
            out_fmt(o, " (%.2f GB/s)", (double)bytes / (double)ns);
        out_fmt(o, "; %llu into and %llu out of driver-pinned memory; %llu memset calls shared, %s, %.4f s\n",
                C(BOUNCE_TO_PINNED), C(BOUNCE_FROM_PINNED), C(BOUNCE_SETS),
                human_bytes(stats_get(STAT_BOUNCE_SET_BYTES), b2, sizeof b2), seconds(stats_get(STAT_BOUNCE_SET_NS)));
    }
    out_fmt(o, "the program's own pinning: %llu host allocations (%s, %.4f s), %llu frees (%.4f s), "
               "%llu registrations (%s, %.4f s), %llu unregistrations (%.4f s)\n",
            C(PROGRAM_HOST_ALLOCS), human_bytes(stats_get(STAT_PROGRAM_HOST_ALLOC_BYTES), b1, sizeof b1),
            seconds(stats_get(STAT_PROGRAM_HOST_ALLOC_NS)), C(PROGRAM_HOST_FREES),
            seconds(stats_get(STAT_PROGRAM_HOST_FREE_NS)), C(PROGRAM_REGISTERS),
            human_bytes(stats_get(STAT_PROGRAM_REGISTERED_BYTES), b2, sizeof b2),
            seconds(stats_get(STAT_PROGRAM_REGISTER_NS)), C(PROGRAM_UNREGISTERS),
            seconds(stats_get(STAT_PROGRAM_UNREGISTER_NS)));
    {   /* node budget */
        uint64_t nb, nb_used, nb_mine;
        node_budget_usage(&nb, &nb_used, &nb_mine);
        if (nb)
            out_fmt(o, "node budget: %s, %s held on the node, %s by this process\n",
                    human_bytes(nb, b1, sizeof b1), human_bytes(nb_used, b2, sizeof b2),
                    human_bytes(nb_mine, b3, sizeof b3));
        else
            out_str(o, "node budget: off\n");
    }
    out_fmt(o, "other: %llu passed through during stream capture, %llu fallbacks to the original "
               "call, %llu batch copies, %llu peer copies, %llu frees in forked children\n",
            C(CAPTURE_PASSTHROUGH), C(FALLBACKS), C(BATCH_COPIES), C(PEER_COPIES), C(FORK_CHILD_FREES));
#undef C

    out_fmt(o, "\n%-22s %12s %14s\n", "copy size", "count", "bytes");
    for (unsigned i = 0; i < STATS_HIST_BUCKETS; i++) {
        struct dir_totals h = stats_hist(i);
        if (!h.count)
            continue;
        char range[48];
        if (i == 0)
            snprintf(range, sizeof range, "0");
        else
            snprintf(range, sizeof range, ">= %s", human_bytes(stats_hist_min_bytes(i), b2, sizeof b2));
        out_fmt(o, "%-22s %12llu %14s\n", range, (unsigned long long)h.count,
                human_bytes(h.bytes, b1, sizeof b1));
    }

    struct site_totals top[SITE_TOP_REPORT];
    uint64_t distinct, dropped;
    size_t n = top_sites(top, SITE_TOP_REPORT, &distinct, &dropped);
    out_fmt(o, "\ncall sites: top %zu of %llu by bytes (of copies under %s, each thread's first %d "
               "(%d under 1 MiB) are exact, later ones sampled once per %s moved (%s under 1 MiB) "
               "and scaled, marked ~)\n",
            n, (unsigned long long)distinct, human_bytes(shim_cfg.callsite_min, b1, sizeof b1),
            STATS_SITE_EXACT_FIRST, STATS_SITE_EXACT_FIRST_SMALL,
            human_bytes(STATS_SITE_SAMPLE_BYTES, b2, sizeof b2), human_bytes(STATS_SITE_SAMPLE_BYTES_SMALL, b3, sizeof b3));
    for (size_t i = 0; i < n; i++)
        report_site(o, (unsigned)i + 1, &top[i]);
    if (dropped)
        out_fmt(o, "  (%llu copies from sites beyond the first %d not attributed)\n",
                (unsigned long long)dropped, SITE_MAX);
}

static int write_with(int fd, void (*writer)(struct out *))
{
    struct out o = { .fd = fd };
    writer(&o);
    out_flush(&o);
    return o.error;
}

void stats_write_json(int fd) { write_with(fd, write_json); }
void stats_write_report(int fd) { write_with(fd, write_report); }

/* ---- at exit ---- */

/* The file written into fd (open, or -1 with errno set), then fd closed: 0 or the first errno. */
static int write_and_close(int fd, void (*writer)(struct out *))
{
    if (fd < 0)
        return errno;
    int err = write_with(fd, writer);
    if (close(fd) != 0 && !err)
        err = errno;
    return err;
}

/* Where the user points the file at something that is not a regular file (a FIFO, a terminal,
 * /dev/stdout), write into it as it is: replacing it with a regular file would break what the
 * name stands for (as root, /dev/stdout itself).  Non-blocking open: a FIFO nobody reads must
 * not hang the program's exit (ENXIO, warned). */
static int write_into_special(const char *path, void (*writer)(struct out *))
{
    int fd = open(path, O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd >= 0) {
        int fl = fcntl(fd, F_GETFL);
        if (fl >= 0)
            fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    }
    return write_and_close(fd, writer);
}

/* A regular file (or a new one): written to a temporary file beside it and renamed, so a reader
 * never sees half a file.  A symbolic link is followed first, so the link stays and its target
 * is replaced; anything else is written into (write_into_special).  On failure the temporary
 * is removed and one warning names the variable. */
static void write_file_atomically(const char *var, const char *tmpl, void (*writer)(struct out *))
{
    char path[1024], real[PATH_MAX], tmp[PATH_MAX + 32];
    int err = 0;
    if (!config_expand_path_checked(tmpl, path, sizeof path)) {
        shim_log(LOG_WARN, "%s=%s: the expanded path is too long; nothing written", var, tmpl);
        return;
    }
    const char *target = path;
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) {
        if (realpath(path, real))
            target = real;
        else if (errno == ENOENT) {
            /* A link to a file not there yet: create it through the link, as a shell's `>` would. */
            err = write_and_close(open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), writer);
            goto done;
        }
    }
    if (stat(target, &st) == 0 && !S_ISREG(st.st_mode)) {
        err = write_into_special(target, writer);
        goto done;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", target, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST && unlink(tmp) == 0)   /* left by a dead process of this pid */
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    int opened = fd >= 0;
    err = write_and_close(fd, writer);
    if (opened && !err && rename(tmp, target) != 0)
        err = errno;
    if (opened && err)
        unlink(tmp);
done:
    if (err)
        shim_log(LOG_WARN, "%s: cannot write %s: %s", var, path, strerror(err));
}

void stats_finish(void)
{
    shim_enter();
    int saved_errno = errno;
    if (!strcmp(shim_cfg.report, "1"))
        write_with(2, write_report);
    else if (shim_cfg.report[0])
        write_file_atomically("PINSHIM_REPORT", shim_cfg.report, write_report);
    if (shim_cfg.stats[0])
        write_file_atomically("PINSHIM_STATS", shim_cfg.stats, write_json);
    errno = saved_errno;
    shim_leave();
}

void stats_reset(void)
{
    shim_enter();
    pthread_mutex_lock(&shards_lock);
    FOR_EACH_SHARD(sh) {
        uint64_t *v = (uint64_t *)sh;
        for (size_t i = 0; i < SHARD_WORDS; i++)
            __atomic_store_n(&v[i], 0, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&shards_lock);
    memset(counters, 0, sizeof counters);
    registered_now = registered_peak = 0;
    disabled_reason[0] = '\0';
    disabled_ready = disabled_claimed = 0;
    memset(skip_cache, 0, sizeof skip_cache);

    if (shim_forked_child) {
        /* Another thread of the parent may have held the lock or been halfway through an
         * insert at fork: start a fresh table and leave the old one alone. */
        pthread_mutex_init(&sites_lock, NULL);
        sites = NULL;
    } else {
        pthread_mutex_lock(&sites_lock);
        struct call_site *s, *next;
        HASH_ITER(hh, sites, s, next) {
            HASH_DEL(sites, s);
            meta_free(s, sizeof *s);
        }
        pthread_mutex_unlock(&sites_lock);
    }
    site_count = 0;
    site_copies_dropped = 0;
    memset(sampler, 0, sizeof sampler);
    shim_leave();
}
