/* Start-up and shut-down: settings, tracking, fork handling, the exit report. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include "base/config.h"
#include "base/meta.h"
#include "base/real.h"
#include "base/shim.h"
#include "copy/bounce.h"
#include "copy/staging.h"
#include "copy/streams.h"
#include "mem/heap.h"
#include "mem/nodebudget.h"
#include "mem/registry.h"
#include "stats/stats.h"
#include "stats/trace.h"

/* Every lock the child needs, taken in the order the shim takes them at run time. */
static void before_fork(void)
{
    registry_before_fork();
    heap_before_fork();
    meta_before_fork();
}

static void after_fork_parent(void)
{
    meta_after_fork_parent();
    heap_after_fork_parent();
    registry_after_fork_parent();
}

static void after_fork_child(void)
{
    /* The child shares no driver state with the parent: it must never call the driver
     * (contract rule 8).  Its frees of tracked blocks still work, without the driver. */
    shim_forked_child = 1;
    meta_after_fork_child();
    heap_after_fork_child();
    registry_after_fork_child();
    streams_forget_all();
    staging_shutdown();
}

/* The library constructor runs before main, after the allocator hooks may already have served
 * the loader (they serve it from the real allocator until the settings are known). */
__attribute__((constructor)) static void pinshim_start(void)
{
    shim_init();
}

/* The registry's counts in the report's terms (stats sits below mem). */
static void read_tracking(struct stats_tracking *t)
{
    struct registry_usage u;
    registry_usage(&u);
    *t = (struct stats_tracking){
        .program_mappings = u.tracked_mappings,
        .heap_blocks = u.huge_blocks,
        .arena_records = u.arena_records,
        .cached_blocks = u.cached_blocks,
        .program_ranges = u.program_ranges,
    };
}

static int started;

void shim_init(void)
{
    if (__atomic_exchange_n(&started, 1, __ATOMIC_ACQ_REL))
        return;
    shim_enter();
    /* The report (stats) sits below the registry and the node budget (mem): their readers
     * are handed down. */
    stats_set_node_budget_reader(nodebudget_usage);
    stats_set_tracking_reader(read_tracking);
    real_libc_resolve();
    config_load(NULL);
    trace_open();
    heap_init();
    bounce_init();
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    if (shim_cfg.mode != MODE_OFF) {
        heap_track_min = (size_t)shim_cfg.min_size;
        nodebudget_attach();
    }
    shim_leave();
}

__attribute__((destructor)) static void pinshim_stop(void)
{
    /* A process that never reached the driver (a shell, a launcher such as timeout or
     * torchrun's parent) writes nothing: it would only overwrite the real program's file. */
    if (shim_cfg.mode == MODE_OFF || shim_forked_child || !real_driver_ready())
        return;
    shim_enter();
    registry_shutdown();
    staging_shutdown();
    trace_flush();   /* the lines the shim's threads queued, now that they are done */
    stats_finish();
    shim_leave();
}
