/* Transfer statistics: counters, size histogram, call sites; text report and JSON at exit. */
#ifndef PINSHIM_STATS_H
#define PINSHIM_STATS_H

#include <stddef.h>
#include <stdint.h>

enum copy_dir { DIR_H2D, DIR_D2H, DIR_D2D, DIR_H2H, DIR_COUNT };

/* What the host side of a copy was, i.e. which path it took. */
enum mem_kind {
    MEM_PAGEABLE,   /* left pageable: the driver's own path */
    MEM_PROMOTED,   /* registered by the shim */
    MEM_PINNED,     /* pinned by the program itself (cuMemHostAlloc / its own register) */
    MEM_STAGED,     /* pageable, moved through the shim's staging pipeline */
    MEM_DEVICE,     /* no host side (device to device, peer) */
    MEM_KIND_COUNT
};

/* Event counters.  X(name, json key) */
#define STATS_COUNTERS(X)                                   \
    X(PROMOTIONS, "promotions")                             \
    X(PROMOTED_BYTES, "promoted_bytes")                     \
    X(EVICTIONS, "evictions")                               \
    X(EVICTED_BYTES, "evicted_bytes")                       \
    X(PROMOTION_FAILURES, "promotion_failures")             \
    X(PROMOTIONS_DECLINED, "promotions_declined")           \
    X(CACHE_HITS, "cache_hits")                             \
    X(CACHE_MISSES, "cache_misses")                         \
    X(CACHE_RELEASED, "cache_released")                     \
    X(PROMOTION_FLUSHED_BYTES, "promotion_flushed_bytes")   \
    X(REGISTER_NS, "register_ns")                           \
    X(UNREGISTER_NS, "unregister_ns")                       \
    X(PROGRAM_REGISTER_YIELDS, "program_register_yields")   \
    X(REWRITE_SYNC_TO_ASYNC, "sync_to_async")               \
    X(REWRITE_ASYNC_WAITED, "async_waited")                 \
    X(ORDERING_WAIT_NS, "ordering_wait_ns")                 \
    X(STAGED_COPIES, "staged_copies")                       \
    X(STAGED_BYTES, "staged_bytes")                         \
    X(STAGED_NS, "staged_ns")                               \
    X(STAGING_FAILURES, "staging_failures")                 \
    X(CAPTURE_PASSTHROUGH, "capture_passthrough")           \
    X(FALLBACKS, "fallbacks")                               \
    X(BATCH_COPIES, "batch_copies")                         \
    X(PEER_COPIES, "peer_copies")                           \
    X(FORK_CHILD_FREES, "fork_child_frees")                 \
    X(UNTRACKED_LOOKUPS, "untracked_lookups")              \
    X(STAGED_ONE_SHOT, "staged_one_shot")                   \
    X(BACKGROUND_REGISTRATIONS, "background_registrations") \
    X(STAGED_WHILE_REGISTERING, "staged_while_registering") \
    X(CACHED_ON_FREE, "cached_on_free")                     \
    X(CACHE_TAKEN_BACK, "cache_taken_back")                 \
    X(REGISTRAR_HELD_OFF, "registrar_held_off")             \
    X(STAGING_CPU_NS, "staging_cpu_ns")                     \
    X(STAGING_WAIT_NS, "staging_wait_ns")                   \
    X(STAGING_PIECES, "staging_pieces")                     \
    X(STAGING_FLUSHED_BYTES, "staging_flushed_bytes")       \
    X(STAGING_PREFAULTED_BYTES, "staging_prefaulted_bytes") \
    X(BOUNCE_COPIES, "bounce_copies")                       \
    X(BOUNCE_BYTES, "bounce_bytes")                         \
    X(BOUNCE_NS, "bounce_ns")                               \
    X(BOUNCE_TO_PINNED, "bounce_to_pinned")                 \
    X(BOUNCE_FROM_PINNED, "bounce_from_pinned")             \
    X(BOUNCE_SETS, "bounce_sets")                           \
    X(BOUNCE_SET_BYTES, "bounce_set_bytes")                 \
    X(BOUNCE_SET_NS, "bounce_set_ns")                       \
    X(PROGRAM_HOST_ALLOCS, "program_host_allocs")           \
    X(PROGRAM_HOST_ALLOC_BYTES, "program_host_alloc_bytes") \
    X(PROGRAM_HOST_ALLOC_NS, "program_host_alloc_ns")       \
    X(PROGRAM_HOST_FREES, "program_host_frees")             \
    X(PROGRAM_HOST_FREE_NS, "program_host_free_ns")         \
    X(PROGRAM_REGISTERS, "program_registers")               \
    X(PROGRAM_REGISTERED_BYTES, "program_registered_bytes") \
    X(PROGRAM_REGISTER_NS, "program_register_ns")           \
    X(PROGRAM_UNREGISTERS, "program_unregisters")           \
    X(PROGRAM_UNREGISTER_NS, "program_unregister_ns")

enum stats_counter {
#define STATS_ENUM_(name, key) STAT_##name,
    STATS_COUNTERS(STATS_ENUM_)
#undef STATS_ENUM_
    STAT_COUNTER_COUNT
};

/* One copy, as the copy engine saw it. */
/* Reading the clock around a copy costs ~40 ns on the H200's host, 0.5% of a 4 KiB copy: copies
 * under STATS_TIME_ALL_MIN bytes are timed one in STATS_TIME_EVERY (per thread), and the time
 * of each total is scaled from its timed copies. */
#define STATS_TIME_ALL_MIN (1u << 20)
#define STATS_TIME_EVERY 8

struct copy_record {
    enum copy_dir dir;
    enum mem_kind kind;
    size_t bytes;
    uint64_t ns;          /* time spent inside the call, when timed */
    int timed;            /* ns was measured */
    int is_async;         /* the program called an *Async entry point */
    int host_blocked;     /* the call blocked the host (sync copy, or async from pageable) */
    const char *why;      /* one word on why this path (the event trace), or NULL */
};

void stats_record_copy(const struct copy_record *r);
void stats_add(enum stats_counter c, uint64_t delta);
/* One call through the door of hook `id` (which driver entry points the program really uses). */
void stats_count_entry(int id);
uint64_t stats_get(enum stats_counter c);

/* Registered bytes (promotions + cache + staging) now; keeps the peak. */
void stats_registered_bytes(uint64_t now);

/* Promotion switched itself off (e.g. the device reads pageable memory through host page
 * tables, or registration is unsupported): the reason goes into the report. */
void stats_promotion_disabled(const char *reason);

/* The node budget's figures for the report (the ceiling, bytes held on the node, by this
 * process).  The budget lives in mem, above stats: top/init.c hands its reader in.  Without one
 * the report shows the configured ceiling and nothing held. */
typedef void (*stats_node_budget_reader)(uint64_t *budget, uint64_t *node_used, uint64_t *mine);
void stats_set_node_budget_reader(stats_node_budget_reader read);

/* What the registry tracks at the time of the report (the registry lives in mem, above stats:
 * top/init.c hands its reader in; without one the report has no "tracking" key). */
struct stats_tracking {
    uint64_t program_mappings;   /* the program's own mappings */
    uint64_t heap_blocks;        /* large heap blocks outside the arena */
    uint64_t arena_records;
    uint64_t cached_blocks;
    uint64_t program_ranges;     /* ranges the program registered itself */
};
typedef void (*stats_tracking_reader)(struct stats_tracking *t);
void stats_set_tracking_reader(stats_tracking_reader read);

/* Call-site attribution: walks the stack (backtrace) above the shim and driver frames.  Copies
 * of at least PINSHIM_CALLSITE_MIN bytes are walked every time.  Of smaller ones, each thread's
 * first STATS_SITE_EXACT_FIRST copies of at least STATS_TIME_ALL_MIN (_SMALL: of smaller ones) are
 * walked too, so a short run is exact; after them one copy is walked each time the class has
 * moved STATS_SITE_SAMPLE_BYTES (_SMALL) more, and stands for the copies and bytes since the
 * previous walk (an estimate, marked so): a site's chance to be walked follows its bytes, so a
 * site that carries a noticeable share of them does not disappear. */
#define STATS_SITE_EXACT_FIRST 256
#define STATS_SITE_EXACT_FIRST_SMALL 64
#define STATS_SITE_SAMPLE_BYTES (64u << 20)
#define STATS_SITE_SAMPLE_BYTES_SMALL (16u << 20)
void stats_record_site(const struct copy_record *r);
/* Load what call-site walks need (the unwinder, the shim's own address) before the first copy.
 * The program's driver lookups (dlsym, cuGetProcAddress) and device allocations call it, during
 * its CUDA start-up: otherwise a process's first walk loads the unwinder on its first large
 * copy (a dlopen, typically 0.3-0.7 ms). */
void stats_prepare_sites(void);

/* Read-only views for tests and the report. */
/* ns: the time of all `count` copies, scaled from the `timed` ones where not all were timed. */
struct dir_totals { uint64_t count, bytes, ns, timed; };
struct dir_totals stats_dir(enum copy_dir d);
struct dir_totals stats_kind(enum mem_kind k);

/* Size histogram: bucket 0 holds empty copies, bucket k+1 copies with 2^k <= bytes < 2^(k+1). */
#define STATS_HIST_BUCKETS 65
unsigned stats_hist_index(uint64_t bytes);
uint64_t stats_hist_min_bytes(unsigned index);
struct dir_totals stats_hist(unsigned index);     /* ns is always 0 */
uint64_t stats_registered_peak(void);

/* Output.  Both write to the file descriptor; JSON follows the README's format. */
void stats_write_json(int fd);
void stats_write_report(int fd);

/* JSON keys beyond the README's format: memory.<kind>.seconds; other.untracked_lookups;
 * tracking.{program_mappings,heap_blocks,arena_records,cached_blocks,program_ranges} (what the
 * registry tracks when the file is written); call_sites_total (distinct sites seen), call_site_copies_dropped (copies from sites past the
 * table's limit), call_site_sampling (copies under PINSHIM_CALLSITE_MIN are sampled 1 in this
 * many and counted that many times); per call site: stack (the key's return addresses,
 * symbolized), sampled (counts include scaled samples), paths.device, flag_paths (per flag, the
 * paths the flagged copies took, i.e. what the shim did with them). */

/* At exit: the report (PINSHIM_REPORT) and the JSON file (PINSHIM_STATS), written to a temporary
 * file and renamed, so there is never a partial file; a failure warns and nothing else. */
void stats_finish(void);

/* Zero everything (tests; the child after fork). */
void stats_reset(void);

#endif
