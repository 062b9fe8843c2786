/* The promotion cost model: a pure function of what is known about a block and a copy, and of
 * the machine's measured rates.  No locks, no driver, no clock: the registry gathers the inputs
 * and acts on the decision; tests give it tables of inputs. */
#ifndef PINSHIM_MEM_COSTMODEL_H
#define PINSHIM_MEM_COSTMODEL_H

#include <stddef.h>
#include <stdint.h>
#include "stats/stats.h"

/* Rates, from the settings (or PINSHIM_CALIBRATE). */
struct cost_rates {
    double h2d_pageable_mbps;       /* the driver's own path from pageable memory */
    double d2h_pageable_mbps;
    double pinned_mbps;             /* from or to registered memory, either way */
    double register_us_per_gib;     /* registering pages already resident */
    double register_fault_us_per_gib; /* registering pages never touched (the register faults them in) */
};

#define COST_RESIDENT_UNKNOWN SIZE_MAX

struct cost_inputs {
    enum copy_dir dir;              /* DIR_H2D or DIR_D2H */
    size_t copy_bytes;              /* this copy */
    size_t block_bytes;             /* what a registration of the block would cover */
    size_t resident_bytes;          /* of block_bytes, or COST_RESIDENT_UNKNOWN */
    uint64_t copies_seen;           /* copies of the block so far, this one included */
    uint64_t budget;                /* the most bytes the shim may hold registered */
    uint64_t bytes_moved;           /* by all its copies so far, this one included */
    int writable;                   /* the block's pages are writable */
    int read_only_register;         /* the device can register read-only memory */
    int stageable;                  /* the staging pipeline can take this copy now */
    size_t copied_span;             /* bytes from the lowest to the highest address any of its
                                     * copies touched, this one included: when bytes_moved
                                     * exceeds it, some byte was copied twice */
};

enum cost_verdict {
    COST_LEAVE,                     /* the driver's own pageable path for this copy */
    COST_STAGE,                     /* the staging pipeline for this copy; no registration */
    COST_REGISTER_BACKGROUND,       /* stage this copy; register the block off the copy's path */
    COST_REGISTER,                  /* register it now, then copy */
    COST_NEED_RESIDENCY,            /* worth registering if its pages are resident: ask again knowing */
};

/* Why, for the statistics and the log. */
#define COST_REASONS(X)                                                                               \
    X(GAIN, "gain", "registering pays for itself over the copies expected")                            \
    X(GAIN_TOO_SMALL, "gain_too_small", "the expected saving does not pay for registering")             \
    X(ONE_SHOT, "one_shot", "no byte of the block copied twice yet: staged, not registered")            \
    X(REUSED, "reused", "bytes of the block copied again: registered in the background")                \
    X(REUSED_QUICK, "reused_quick", "bytes of the block copied again, its registration quick: registered on the copy's path") \
    X(LARGER_THAN_BUDGET, "larger_than_budget", "the block is larger than the budget")                  \
    X(READ_ONLY, "read_only", "read-only pages, and the device cannot register them for this direction") \
    X(NO_RATES, "no_rates", "no rates to judge by")

enum cost_reason {
#define COST_REASON_ENUM_(name, key, text) COST_##name,
    COST_REASONS(COST_REASON_ENUM_)
#undef COST_REASON_ENUM_
    COST_REASON_COUNT
};

struct cost_decision {
    enum cost_verdict verdict;
    enum cost_reason reason;
    double gain_us;                 /* expected saving minus the registration's cost */
};

struct cost_decision cost_decide(const struct cost_inputs *in, const struct cost_rates *rates);

/* The microseconds a registration of block_bytes (resident_bytes of them resident) costs. */
double cost_register_us(size_t block_bytes, size_t resident_bytes, const struct cost_rates *rates);

const char *cost_reason_text(enum cost_reason r);
/* The same as one word (the event trace's why=). */
const char *cost_reason_key(enum cost_reason r);

#endif
