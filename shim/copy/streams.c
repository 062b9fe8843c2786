/* Per-thread, per-context streams and events, ordering, and capture tracking. */
#define _GNU_SOURCE
#include <pthread.h>
#include "base/log.h"
#include "base/meta.h"
#include "base/real.h"
#include "base/shim.h"
#include "stats/stats.h"
#include "copy/streams.h"

#define STREAMS_PER_THREAD 8

struct thread_streams {
    struct shim_stream slot[STREAMS_PER_THREAD];
    int used;
};

static __thread struct thread_streams *mine;
static pthread_key_t cleanup_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static int forgotten;

static void destroy_thread_streams(void *arg)
{
    struct thread_streams *ts = arg;
    if (!ts)
        return;
    if (!shim_forked_child && !__atomic_load_n(&forgotten, __ATOMIC_RELAXED)) {
        shim_enter();
        for (int i = 0; i < ts->used; i++) {
            struct shim_stream *ss = &ts->slot[i];
            /* A stream with work still queued (a staged copy's last DMA) is released once the
             * device has done it. */
            drv.cuStreamDestroy_v2(ss->stream);
            drv.cuEventDestroy_v2(ss->order_event);
            drv.cuEventDestroy_v2(ss->done_event);
            drv.cuEventDestroy_v2(ss->after_event);
        }
        shim_leave();
    }
    meta_free(ts, sizeof *ts);
}

static void make_key(void)
{
    pthread_key_create(&cleanup_key, destroy_thread_streams);
}

struct shim_stream *streams_current(void)
{
    CUcontext ctx = NULL;
    if (!drv.cuCtxGetCurrent || drv.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
        return NULL;
    struct thread_streams *ts = mine;
    if (ts) {
        for (int i = 0; i < ts->used; i++)
            if (ts->slot[i].ctx == ctx)
                return &ts->slot[i];
    } else {
        pthread_once(&key_once, make_key);
        ts = meta_alloc(sizeof *ts);
        if (!ts)
            return NULL;
        mine = ts;
        pthread_setspecific(cleanup_key, ts);
    }
    if (ts->used == STREAMS_PER_THREAD)
        return NULL;
    struct shim_stream *ss = &ts->slot[ts->used];
    ss->ctx = ctx;
    if (drv.cuStreamCreate(&ss->stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
        goto fail;
    if (drv.cuEventCreate(&ss->order_event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
        drv.cuStreamDestroy_v2(ss->stream);
        goto fail;
    }
    if (drv.cuEventCreate(&ss->done_event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
        drv.cuStreamDestroy_v2(ss->stream);
        drv.cuEventDestroy_v2(ss->order_event);
        goto fail;
    }
    if (drv.cuEventCreate(&ss->after_event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
        drv.cuStreamDestroy_v2(ss->stream);
        drv.cuEventDestroy_v2(ss->order_event);
        drv.cuEventDestroy_v2(ss->done_event);
        goto fail;
    }
    ts->used++;
    return ss;
fail:
    stats_add(STAT_FALLBACKS, 1);
    shim_log_once(LOG_WARN, "could not create a stream for rewritten copies: copies keep their original path");
    return NULL;
}

/* Record an event on the program's stream exactly as the program named it. */
static CUresult record_as_program(CUevent ev, CUstream stream, enum hook_flavour flavour)
{
    if (flavour == PTDS)
        return drv.cuEventRecord_ptsz ? drv.cuEventRecord_ptsz(ev, stream) : CUDA_ERROR_NOT_FOUND;
    return drv.cuEventRecord(ev, stream);
}

int streams_order_after(struct shim_stream *ss, CUstream stream, enum hook_flavour flavour)
{
    /* An event on the legacy stream completes only after earlier legacy work and earlier work of
     * every blocking stream: exactly what the original legacy copy waited for. */
    if (record_as_program(ss->order_event, stream, flavour) != CUDA_SUCCESS)
        return -1;
    if (drv.cuStreamWaitEvent(ss->stream, ss->order_event, 0) != CUDA_SUCCESS)
        return -1;
    return 0;
}

int streams_wait_copy(struct shim_stream *ss, CUstream stream, enum hook_flavour flavour)
{
    if (record_as_program(ss->done_event, stream, flavour) != CUDA_SUCCESS)
        return -1;
    return drv.cuEventSynchronize(ss->done_event) == CUDA_SUCCESS ? 0 : -1;
}

int streams_program_waits(struct shim_stream *ss, CUstream stream, enum hook_flavour flavour)
{
    if (drv.cuEventRecord(ss->after_event, ss->stream) != CUDA_SUCCESS)
        return -1;
    /* The per-thread default stream by its explicit handle, through the legacy entry point. */
    if (flavour == PTDS && stream == 0)
        stream = CU_STREAM_PER_THREAD;
    return drv.cuStreamWaitEvent(stream, ss->after_event, 0) == CUDA_SUCCESS ? 0 : -1;
}

void streams_forget_all(void)
{
    __atomic_store_n(&forgotten, 1, __ATOMIC_RELAXED);
    mine = NULL;
}

/* Capture tracking: a count of active captures in the process. */
static int active_captures;

int capture_active(void)
{
    return __atomic_load_n(&active_captures, __ATOMIC_ACQUIRE) > 0;
}

void capture_begin(CUstream s, CUstreamCaptureMode mode)
{
    __atomic_add_fetch(&active_captures, 1, __ATOMIC_ACQ_REL);
}

void capture_end(CUstream s)
{
    if (__atomic_sub_fetch(&active_captures, 1, __ATOMIC_ACQ_REL) < 0)
        __atomic_store_n(&active_captures, 0, __ATOMIC_RELEASE);
}
