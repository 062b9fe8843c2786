/* The staging pipeline: pageable copies too cold or too large to promote move through the
 * shim's own pinned buffers in chunks, the CPU copies split over a pool of copy threads and
 * overlapped with the DMA. */
#ifndef PINSHIM_STAGING_H
#define PINSHIM_STAGING_H

#include <stddef.h>
#include <cuda.h>
#include "base/hooks.h"
#include "stats/stats.h"

/* One staged copy.  2D copies give height > 1 and pitches; 1D copies height 1. */
struct stage_req {
    enum copy_dir dir;            /* DIR_H2D or DIR_D2H */
    void *host;                   /* first byte of the host side */
    size_t host_pitch;
    CUdeviceptr dev;              /* first byte of the device side */
    size_t dev_pitch;
    size_t width;                 /* bytes per row */
    size_t height;                /* rows */
    CUstream stream;              /* the program's stream, as named in its call */
    enum hook_flavour flavour;    /* of the entry point the program called */
    int flush_host;               /* H2D: push the host side's lines out of the CPU caches once
                                   * copied (the block is about to be registered: cpupool.h) */
};

/* Whether staging could take a copy of this many bytes now (mode, settings, buffers). */
int staging_available(size_t bytes);

/* Whether a lane of the current context is built; if none is, one is built on a thread of
 * its own.  wait: wait for that thread (up to 100 ms) rather than answer no at once. */
int staging_ready(int wait);

/* Run the copy through staging.  On return the copy is complete (H2D: the device has the data;
 * D2H: the host has it), ordered after the work the original call would have waited for.
 * Returns 1 when staged (*result holds the outcome), 0 when staging declined before moving any
 * data (no buffers, no context, capture, shim-only failure): the caller takes the original path. */
int staging_copy(const struct stage_req *req, CUresult *result);

/* Stop the copy threads (exit, fork child). */
void staging_shutdown(void);

#endif
