/* fk_internal.h: shared state of the checking fake driver.  One global mutex (fk_mu) guards all
 * model state; workers and blocking callers wait on one condition variable (fk_cv), which is
 * broadcast whenever any queued operation completes.  Simple, deterministic and race-free, which
 * matters more in a test instrument than speed. */
#ifndef FK_INTERNAL_H
#define FK_INTERNAL_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stddef.h>
#include <sys/types.h>

/* The shim under test interposes malloc/free and calls this driver from inside them: the fake
 * allocates through glibc directly so it never re-enters the shim.  Sanitizer builds keep the
 * interposed malloc so the sanitizer sees every allocation. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define fk_malloc(n) malloc(n)
#define fk_calloc(a, b) calloc((a), (b))
#define fk_realloc(p, n) realloc((p), (n))
#define fk_free(p) free(p)
#else
void *__libc_malloc(size_t);
void *__libc_calloc(size_t, size_t);
void *__libc_realloc(void *, size_t);
void __libc_free(void *);
#define fk_malloc(n) __libc_malloc(n)
#define fk_calloc(a, b) __libc_calloc((a), (b))
#define fk_realloc(p, n) __libc_realloc((p), (n))
#define fk_free(p) __libc_free(p)
#endif
#define uthash_malloc(sz) fk_malloc(sz)
#define uthash_free(ptr, sz) fk_free(ptr)
#define uthash_fatal(msg) fk_fatal(msg)
#include <uthash.h>

/* Internal symbols stay inside the library: only cu* entry points and fakecuda_* are exported. */
#pragma GCC visibility push(hidden)

/* ---- exported entry points ---- */
enum {
#define FK_X(sym, base, ver, pt) FKI_##sym,
#include "fk_exports.def"
#undef FK_X
    FKI_COUNT
};
extern atomic_ulong fk_call_counts[FKI_COUNT];

/* Defines the exported symbol `sym` (exact name, via an asm label, so cuda.h's renaming macros
 * never touch it) and counts the call. Use: FK_API(cuFoo_v2, (int a, int b)) { FK_COUNT(cuFoo_v2); ... } */
#define FK_API(sym, params) \
    CUresult fkx_##sym params __asm__(#sym) __attribute__((visibility("default"))); \
    CUresult fkx_##sym params
#define FK_COUNT(sym) atomic_fetch_add_explicit(&fk_call_counts[FKI_##sym], 1, memory_order_relaxed)
#define FK_PUBLIC __attribute__((visibility("default")))

#define FK_MAX_DEV 8

/* ---- global state ---- */
extern pthread_mutex_t fk_mu;
extern pthread_cond_t fk_cv;
extern atomic_int fk_initialized;
extern int fk_ndev;
extern unsigned fk_delay_us;
extern int fk_check_source;
extern int fk_check_races;
extern int fk_pageable_hpt;
extern int fk_no_host_register;
extern unsigned fk_register_delay_us;
extern int fk_unregister_signal;                  /* fakecuda_set_unregister_signal */
extern __thread volatile sig_atomic_t fk_in_unregister;
extern int fk_forked_child;

void fk_setup(void);
void fk_fatal(const char *msg) __attribute__((noreturn));
void fk_violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fk_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
uint64_t fk_now_ns(void);
void fk_sleep_us(unsigned us);

/* Early-out for entry points: not initialised (or forked child) -> NOT_INITIALIZED. */
#define FK_NEED_INIT() do { if (!atomic_load(&fk_initialized) || fk_forked_child) return CUDA_ERROR_NOT_INITIALIZED; } while (0)

/* ---- objects ---- */
typedef struct CUstream_st fk_stream;
typedef struct CUctx_st fk_ctx;
typedef struct CUevent_st fk_event;
/* Snapshots of pageable sources come straight from the kernel, as a driver's own staging
 * memory would, never from the C library's heap: the C library holds its arena lock while it
 * maps a large block, and a signal handler that allocates on the same thread (as sampling
 * profilers do) would then wait for it forever, shim or not. */
void *fk_staged_alloc(size_t n);
void fk_staged_free(void *p);

typedef struct fk_op fk_op;
typedef struct fk_capture fk_capture;

/* Vector clock (happens-before): for each stream, by its id (never reused), the last position
 * known to come before; sparse, sorted by id, 0 where absent. */
typedef struct { uint64_t stream, seq; } fk_vc_ent;
typedef struct { fk_vc_ent *e; uint32_t n, cap; } fk_vc;
typedef struct fk_hreg fk_hreg;

enum { FK_S_LEGACY = 1, FK_S_PTDS, FK_S_USER };

struct CUctx_st {
    int dev;
    int refcount;
    fk_stream *legacy;
    fk_stream *streams;         /* every stream of this context, via ctx_next */
};
extern fk_ctx fk_ctxs[FK_MAX_DEV];

struct CUstream_st {
    fk_ctx *ctx;
    int kind;
    unsigned flags;
    int prio;
    uint64_t id;
    fk_op *head, *tail;
    uint64_t enq_seq, done_seq;  /* ops enqueued / completed so far; positions are seq numbers */
    fk_vc tail_vc;               /* clock of the last op enqueued (position enq_seq) */
    int worker;                  /* a worker thread is draining this queue */
    int hostfn_running;          /* a host function of this stream runs now (lock released) */
    int destroyed;
    fk_capture *cap;             /* capture this stream currently belongs to */
    fk_stream *ctx_next;
    void *self;                  /* hash key: the handle value */
    UT_hash_handle hh;           /* live handle set */
};

struct CUevent_st {
    fk_ctx *ctx;
    unsigned flags;
    fk_stream *s;                /* last record: stream and position */
    uint64_t seq;
    fk_vc vc;                    /* clock of the recorded position */
    uint64_t gen;
    int recorded;
    int timed;                   /* time_ns valid for this gen */
    uint64_t time_ns;
    fk_capture *cap;             /* recorded inside this capture */
    fk_event *dead_next;         /* destroyed events stay allocated, on a list */
    void *self;
    UT_hash_handle hh;
};

/* Registered (cuMemHostRegister) or host-allocated (cuMemHostAlloc) host range. */
struct fk_hreg {
    char *base;
    size_t size;
    unsigned flags;
    int hostalloc;
    fk_ctx *ctx;
    long inflight;               /* queued/running ops relying on this range being pinned */
    int unmapped_reported;
    uint64_t id;
};

/* One side of a copy.  Offsets already folded into addr; element (x,y,z) is at
 * addr + z*slice + y*pitch + x. */
typedef struct {
    int isdev;
    char *addr;                  /* host address, or device address for device memory */
    char *backing;               /* device: host storage behind addr (resolved at enqueue) */
    size_t pitch, slice;
    int pinned;                  /* host: accepted as a pinned (direct DMA) copy */
    fk_hreg *reg;                /* host pinned: registration relied on (inflight held) */
} fk_end;

typedef struct { fk_stream *s; uint64_t seq; } fk_dep;

enum { OP_COPY = 1, OP_MEMSET, OP_HOSTFN, OP_EVENT, OP_WAIT };

struct fk_op {
    fk_op *next;
    int kind;
    unsigned delay_us;
    const char *what;            /* entry point, for messages */
    fk_stream *s;
    uint64_t seq;
    fk_vc vc;                    /* what happens before it (fk_races.c), itself included */
    fk_dep *deps;
    int ndeps, capdeps;
    /* copy / memset (memset: dst, w = bytes, elem, val) */
    fk_end src, dst;
    size_t w, h, d;
    unsigned elem;
    uint32_t val;
    char *staged;                /* owned snapshot of a pageable source */
    int async_api;
    int check_src;
    uint64_t src_sum;
    fk_op *ck_prev, *ck_next;    /* pending source-checksum list */
    /* host function */
    CUhostFn fn;
    void *ud;
    /* event record */
    fk_event *ev;
    uint64_t ev_gen;
    /* wait: only deps */
};

struct CUgraph_st { fk_op **nodes; size_t n, cap; void *self; UT_hash_handle hh; };
struct CUgraphExec_st { fk_op **nodes; size_t n; void *self; UT_hash_handle hh; };

struct fk_capture {
    uint64_t id;
    CUstreamCaptureMode mode;
    void *thread;                /* fk_tls of the thread that began it */
    int invalidated;
    fk_stream *origin;
    struct CUgraph_st *graph;
    fk_capture *next;            /* active capture list */
};
extern fk_capture *fk_captures;

/* ---- per-thread state ---- */
typedef struct {
    fk_ctx *stack[32];
    int depth;
    fk_stream *ptds[FK_MAX_DEV];
    CUstreamCaptureMode capmode;
} fk_tls_t;
fk_tls_t *fk_tls(void);
fk_ctx *fk_cur_ctx(void);

/* ---- streams (fk_streams.c) ---- */
fk_stream *fk_stream_new(fk_ctx *c, int kind, unsigned flags, int prio);
/* Resolve a stream argument; ptds: the entry point is a _ptds/_ptsz one. Lock held. */
CUresult fk_resolve_stream(CUstream h, int ptds, fk_stream **out);
fk_op *fk_op_new(int kind, const char *what);
void fk_op_free(fk_op *op);
/* Checks capture rules for work entering s. Returns CUDA_SUCCESS (not capturing), a capture
 * error, or FK_CAPTURED if the op was recorded into the capture (op is then owned by it). */
#define FK_CAPTURED ((CUresult)0x7fff0001)
CUresult fk_capture_gate(fk_stream *s, fk_op *op, int sync_api);
/* Fails (and invalidates captures) if an unsafe call is not allowed on this thread now. */
CUresult fk_unsafe_call_check(void);
/* Enqueue op on s (lock held): computes ordering deps, assigns position, starts a worker. */
CUresult fk_submit(fk_stream *s, fk_op *op);
/* Block (lock held, released while waiting) until s has completed position seq. */
void fk_wait_pos(fk_stream *s, uint64_t seq);
/* Block until the deps an op on s would get now, and s's current position, are complete. */
void fk_wait_stream_and_deps(fk_stream *s);
/* Block while a host function that work enqueued on s now would follow is running. */
void fk_wait_hostfns_before(fk_stream *s);
void fk_wait_ctx_idle(fk_ctx *c);
void fk_wait_all_idle(void);
/* Prepare an op's host endpoints for execution (classify pinned, snapshot, checksum); lock held.
 * graph: op replayed from a graph (no snapshot; classification taken from the template). */
void fk_ck_add(fk_op *op);
void fk_ck_remove(fk_op *op);

/* ---- device memory races (fk_races.c); lock held ---- */
uint64_t fk_vc_get(const fk_vc *v, uint64_t stream);
void fk_vc_set(fk_vc *v, uint64_t stream, uint64_t seq);
void fk_vc_join(fk_vc *dst, const fk_vc *src);
void fk_vc_assign(fk_vc *dst, const fk_vc *src);
void fk_vc_free(fk_vc *v);
/* The host saw the work that clock describes complete (a sync, a successful query, ...). */
void fk_host_observe(const fk_vc *seen);
/* Join what the host has seen complete into v (work submitted now is ordered after it). */
void fk_vc_join_host(fk_vc *v);
/* Running op (worker): check its device ranges against earlier unordered accesses, record them. */
void fk_race_exec(const fk_op *op);
/* Device memory freed: forget its accesses. */
void fk_race_forget(uintptr_t base, size_t size);

/* ---- memory (fk_memory.c) ---- */
void fk_memory_setup(void);
int fk_is_devaddr(uintptr_t a);
int fk_overlaps_dev(uintptr_t a, size_t n);      /* any byte of [a, a+n) is a device address */
/* Device range [a, a+n) within one allocation: backing pointer and owning device, else NULL. */
char *fk_dev_resolve(uintptr_t a, size_t n, int *dev);
fk_hreg *fk_hreg_find(const void *p, size_t n);          /* whole range inside one pinned range */
fk_hreg *fk_hreg_find_any(const void *p, size_t n);      /* any overlap */
int fk_range_mapped(const void *p, size_t n);
void fk_check_all_regs_mapped(void);
void fk_check_reg_mapped(fk_hreg *h);
/* Pinned range containing all of [p, p+n) that is not being released, else NULL. */
fk_hreg *fk_hreg_pinned(const void *p, size_t n);
void fk_memory_atexit(void);
uint64_t fk_checksum_end(const fk_end *e, size_t w, size_t h, size_t d);

/* ---- copies (fk_copy.c) ---- */
void fk_exec_copy(fk_op *op);
void fk_exec_memset(fk_op *op);
void fk_op_release_regs(fk_op *op);
/* Re-validate a graph template's endpoints for a launch; fills runtime fields of a clone. */
void fk_prepare_graph_op(fk_op *op);

#pragma GCC visibility pop
#endif
