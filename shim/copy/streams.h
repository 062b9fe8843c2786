/* The shim's own streams: one non-blocking stream and two events per thread and context. */
#ifndef PINSHIM_STREAMS_H
#define PINSHIM_STREAMS_H

#include <cuda.h>
#include "base/hooks.h"

struct shim_stream {
    CUcontext ctx;
    CUstream stream;      /* CU_STREAM_NON_BLOCKING: copies of different threads never serialize */
    CUevent order_event;  /* recorded where the original copy would have waited */
    CUevent done_event;   /* recorded after a copy the call must see finished */
    CUevent after_event;  /* recorded after the shim's own work that later program work needs */
};

/* For the calling thread's current context; NULL when there is none or creation failed (the
 * caller then takes the original path).  Destroyed when the thread exits. */
struct shim_stream *streams_current(void);

/* Make ss->stream wait for the work that a copy issued by the program on `stream` through an
 * entry point of `flavour` would have waited for (legacy stream: every blocking stream too;
 * per-thread stream; or that stream).  Returns 0 on success. */
int streams_order_after(struct shim_stream *ss, CUstream stream, enum hook_flavour flavour);

/* Record done_event on `stream` (as the program named it, with its flavour) and wait for it:
 * the copy just issued there has finished.  Returns 0 on success. */
int streams_wait_copy(struct shim_stream *ss, CUstream stream, enum hook_flavour flavour);

/* Make the program's `stream` (as named, with its flavour) wait, on the device, for the work
 * issued so far on ss->stream: later work there (and, for the legacy stream, in every blocking
 * stream) sees what that work did, as it would have seen the original copy's.  0 on success. */
int streams_program_waits(struct shim_stream *ss, CUstream stream, enum hook_flavour flavour);

/* Forget every stream and event without destroying them (the child after fork). */
void streams_forget_all(void);

/* Capture: while any stream capture is active in the process the shim changes nothing
 * (contract rule 6), since its own calls (register, event waits) are not capture-safe. */
int capture_active(void);
void capture_begin(CUstream s, CUstreamCaptureMode mode);
void capture_end(CUstream s);

#endif
