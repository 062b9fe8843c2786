/* The promotion cost model (see costmodel.h). */
#include "mem/costmodel.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* A reused stageable block whose registration takes no longer than this is registered on the
 * copy's path instead of by the registrar thread: handing it over costs a wake-up, and while
 * the copy threads keep every CPU busy a woken thread waits for a scheduler slice (milliseconds:
 * a 2 MiB buffer copied in a loop was staged 50-80 times, at about half its pinned speed, before
 * its 0.1 ms registration ran).  About 5 MiB of resident pages at the default rate. */
#define REGISTER_ON_PATH_MAX_US 250.0

double cost_register_us(size_t block_bytes, size_t resident_bytes, const struct cost_rates *rates)
{
    if (resident_bytes > block_bytes)
        resident_bytes = block_bytes;
    return (double)resident_bytes / GIB * rates->register_us_per_gib +
           (double)(block_bytes - resident_bytes) / GIB * rates->register_fault_us_per_gib;
}

static struct cost_decision decided(enum cost_verdict v, enum cost_reason r, double gain)
{
    return (struct cost_decision){ v, r, gain };
}

/* The path of a copy that registration will not take: staging where it can, else the driver. */
static struct cost_decision not_registered(const struct cost_inputs *in, enum cost_reason r, double gain)
{
    return decided(in->stageable ? COST_STAGE : COST_LEAVE, r, gain);
}

struct cost_decision cost_decide(const struct cost_inputs *in, const struct cost_rates *rates)
{
    if (in->block_bytes > in->budget)
        return not_registered(in, COST_LARGER_THAN_BUDGET, 0);
    if (!in->writable && (!in->read_only_register || in->dir != DIR_H2D))
        return not_registered(in, COST_READ_ONLY, 0);
    if (in->stageable) {
        /* Staging runs near the link's speed without touching the block's registration, so the
         * question is only whether the block will be copied again: a block none of whose bytes
         * has been copied twice (a model's weights, a checkpoint, a fresh batch, a file read
         * piece by piece) is staged; once more bytes have moved than the span its copies
         * touched (some byte moved twice: a buffer copied again, whole or in part), it is
         * registered off the copy's path (its next copies staged until then; a small block on
         * it, REGISTER_ON_PATH_MAX_US) and every later copy runs at pinned speed. */
        size_t span = in->copied_span && in->copied_span < in->block_bytes ? in->copied_span : in->block_bytes;
        if (in->copies_seen >= 2 && in->bytes_moved > span) {
            int known = in->resident_bytes != COST_RESIDENT_UNKNOWN;
            /* Unknown residency: the cheapest case (every page resident) decides whether to ask. */
            if (cost_register_us(in->block_bytes, known ? in->resident_bytes : in->block_bytes, rates) <=
                REGISTER_ON_PATH_MAX_US)
                return decided(known ? COST_REGISTER : COST_NEED_RESIDENCY, COST_REUSED_QUICK, 0);
            return decided(COST_REGISTER_BACKGROUND, COST_REUSED, 0);
        }
        return decided(COST_STAGE, COST_ONE_SHOT, 0);
    }
    double alt = in->dir == DIR_H2D ? rates->h2d_pageable_mbps : rates->d2h_pageable_mbps;
    if (alt <= 0 || rates->pinned_mbps <= 0)
        return decided(COST_LEAVE, COST_NO_RATES, 0);
    /* bytes / (MB/s) is microseconds.  Against the driver's own pageable path, the only other
     * one a copy too small to stage has. */
    double saving_per_copy = (double)in->copy_bytes / alt - (double)in->copy_bytes / rates->pinned_mbps;
    /* A block copied k times so far is expected to be copied about k more times: the saving
     * counts for this copy and the ones expected to follow. */
    double saving = saving_per_copy * (double)in->copies_seen;
    if (in->resident_bytes == COST_RESIDENT_UNKNOWN) {
        /* The cheapest case first (every page resident): most declines need no residency. */
        double best = saving - cost_register_us(in->block_bytes, in->block_bytes, rates);
        if (best <= 0)
            return decided(COST_LEAVE, COST_GAIN_TOO_SMALL, best);
        return decided(COST_NEED_RESIDENCY, COST_GAIN, best);
    }
    double gain = saving - cost_register_us(in->block_bytes, in->resident_bytes, rates);
    if (gain <= 0)
        return decided(COST_LEAVE, COST_GAIN_TOO_SMALL, gain);
    return decided(COST_REGISTER, COST_GAIN, gain);
}

/* Each reason as a word and as a sentence, from the one list. */
static const struct { const char *key, *text; } reason_names[COST_REASON_COUNT] = {
#define COST_REASON_NAMES_(name, key, text) [COST_##name] = { key, text },
    COST_REASONS(COST_REASON_NAMES_)
#undef COST_REASON_NAMES_
};

const char *cost_reason_text(enum cost_reason r)
{
    return (unsigned)r < COST_REASON_COUNT ? reason_names[r].text : "unknown";
}

const char *cost_reason_key(enum cost_reason r)
{
    return (unsigned)r < COST_REASON_COUNT ? reason_names[r].key : "unknown";
}
