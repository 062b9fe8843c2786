/* The promotion cost model is a pure function: tables of inputs and the decision each must give.
 * Rates as measured on an H200 (the defaults): pageable 9 / 11 GB/s, pinned 54 GB/s, register
 * 45 ms/GiB resident, 360 ms/GiB untouched. */
#include <stdio.h>
#include "mem/costmodel.h"
#include "testutil.h"

#define K (1024ul)
#define M (1024ul * 1024ul)
#define G (1024ul * 1024ul * 1024ul)
#define UNKNOWN COST_RESIDENT_UNKNOWN

static const struct cost_rates h200 = { 9000, 11000, 54000, 45000, 360000 };

struct row {
    const char *what;
    struct cost_inputs in;
    enum cost_verdict verdict;
    enum cost_reason reason;
};

/* IN(dir, copy, block, resident, copies so far, budget, bytes moved, writable, read-only
 * registration supported, stageable): copies that touched the whole block.  SPAN(..., span):
 * copies that touched `span` bytes of it, lowest to highest. */
#define IN(dir, copy, block, resident, copies, budget, moved, writable, ro, stageable) \
    { dir, copy, block, resident, copies, budget, moved, writable, ro, stageable, block }
#define SPAN(dir, copy, block, resident, copies, budget, moved, writable, ro, stageable, span) \
    { dir, copy, block, resident, copies, budget, moved, writable, ro, stageable, span }

static const struct row rows[] = {
    /* Copies too small to stage: registration against the driver's own pageable path.
     * A large resident block pays on its first copy: 1 GiB H2D saves ~99 ms, costs 45 ms. */
    { "1 GiB resident, first H2D copy, not stageable", IN(DIR_H2D, G, G, G, 1, 64 * G, G, 1, 0, 0), COST_REGISTER, COST_GAIN },
    { "1 GiB, residency not known yet", IN(DIR_H2D, G, G, UNKNOWN, 1, 64 * G, G, 1, 0, 0), COST_NEED_RESIDENCY, COST_GAIN },
    /* Untouched pages cost 8x: one D2H copy into a fresh 1 GiB block does not pay. */
    { "1 GiB untouched, first D2H copy", IN(DIR_D2H, G, G, 0, 1, 64 * G, G, 1, 0, 0), COST_LEAVE, COST_GAIN_TOO_SMALL },
    /* ... but a block copied again and again does. */
    { "1 GiB untouched, 8th D2H copy", IN(DIR_D2H, G, G, 0, 8, 64 * G, 8 * G, 1, 0, 0), COST_REGISTER, COST_GAIN },
    /* Small copies from a big block save too little per copy. */
    { "64 KiB copies from a 1 GiB block", IN(DIR_H2D, 64 * K, G, G, 3, 64 * G, 192 * K, 1, 0, 0), COST_LEAVE, COST_GAIN_TOO_SMALL },
    { "  ... unknown residency: the cheapest case already says no", IN(DIR_H2D, 64 * K, G, UNKNOWN, 3, 64 * G, 192 * K, 1, 0, 0), COST_LEAVE, COST_GAIN_TOO_SMALL },
    /* A 1 MiB block copied whole: saves 97 us on the first copy, registering costs 44 us. */
    { "1 MiB resident block, first copy", IN(DIR_H2D, M, M, M, 1, 64 * G, M, 1, 0, 0), COST_REGISTER, COST_GAIN },

    /* Stageable copies: staged while no byte has moved twice, then registered off the path. */
    { "stageable, first copy of a 1 GiB block", IN(DIR_H2D, G, G, G, 1, 64 * G, G, 1, 0, 1), COST_STAGE, COST_ONE_SHOT },
    { "stageable, first copy into a fresh block", IN(DIR_D2H, 32 * M, 32 * M, 0, 1, 64 * G, 32 * M, 1, 0, 1), COST_STAGE, COST_ONE_SHOT },
    { "stageable, second copy of the whole block", IN(DIR_D2H, 32 * M, 32 * M, UNKNOWN, 2, 64 * G, 64 * M, 1, 0, 1), COST_REGISTER_BACKGROUND, COST_REUSED },
    { "stageable, H2D then D2H of a 256 MiB buffer", IN(DIR_D2H, 256 * M, 256 * M, UNKNOWN, 2, 64 * G, 512 * M, 1, 0, 1), COST_REGISTER_BACKGROUND, COST_REUSED },
    /* A small block's registration takes less than waking the registrar may: made on the
     * copy's path where its pages' cost is at most 250 us (4 MiB resident: 176 us). */
    { "stageable, second copy of a 2 MiB buffer", IN(DIR_H2D, 2 * M, 2 * M, UNKNOWN, 2, 64 * G, 4 * M, 1, 0, 1), COST_NEED_RESIDENCY, COST_REUSED_QUICK },
    { "  ... resident", IN(DIR_H2D, 2 * M, 2 * M, 2 * M, 2, 64 * G, 4 * M, 1, 0, 1), COST_REGISTER, COST_REUSED_QUICK },
    { "  ... never touched (703 us to register)", IN(DIR_D2H, 2 * M, 2 * M, 0, 2, 64 * G, 4 * M, 1, 0, 1), COST_REGISTER_BACKGROUND, COST_REUSED },
    { "stageable, 4 MiB resident, copied again", IN(DIR_H2D, 4 * M, 4 * M, 4 * M, 2, 64 * G, 8 * M, 1, 0, 1), COST_REGISTER, COST_REUSED_QUICK },
    { "stageable, 8 MiB resident, copied again (352 us)", IN(DIR_H2D, 8 * M, 8 * M, 8 * M, 2, 64 * G, 16 * M, 1, 0, 1), COST_REGISTER_BACKGROUND, COST_REUSED },
    { "stageable, 2 MiB buffer, first copy", IN(DIR_H2D, 2 * M, 2 * M, 2 * M, 1, 64 * G, 2 * M, 1, 0, 1), COST_STAGE, COST_ONE_SHOT },
    /* Part of a big buffer copied again and again (a bandwidth sweep, a ring's first slot):
     * the same bytes move twice long before the block's size has moved. */
    { "stageable, 2 MiB from the start of a 1 GiB block, second time", SPAN(DIR_H2D, 2 * M, G, UNKNOWN, 2, 64 * G, 4 * M, 1, 0, 1, 2 * M), COST_REGISTER_BACKGROUND, COST_REUSED },
    { "stageable, 2 MiB pieces side by side, second piece", SPAN(DIR_H2D, 2 * M, G, UNKNOWN, 2, 64 * G, 4 * M, 1, 0, 1, 4 * M), COST_STAGE, COST_ONE_SHOT },
    /* A file mapping read piece by piece, in or out of order: many copies, every byte once. */
    { "stageable, pieces out of order, none twice", SPAN(DIR_H2D, 8 * M, 1536 * M, UNKNOWN, 50, 64 * G, 400 * M, 1, 0, 1, 1200 * M), COST_STAGE, COST_ONE_SHOT },
    { "stageable, 100th piece of a 1.5 GiB mapping", IN(DIR_H2D, 8 * M, 1536 * M, UNKNOWN, 100, 64 * G, 800 * M, 1, 0, 1), COST_STAGE, COST_ONE_SHOT },
    { "stageable, that mapping read again", IN(DIR_H2D, 8 * M, 1536 * M, UNKNOWN, 200, 64 * G, 1600 * M, 1, 0, 1), COST_REGISTER_BACKGROUND, COST_REUSED },

    /* The budget is a ceiling for every block. */
    { "block larger than the budget", IN(DIR_H2D, 2 * G, 2 * G, 2 * G, 50, G, 100 * G, 1, 0, 0), COST_LEAVE, COST_LARGER_THAN_BUDGET },
    { "  ... stageable", IN(DIR_H2D, 2 * G, 2 * G, 2 * G, 50, G, 100 * G, 1, 0, 1), COST_STAGE, COST_LARGER_THAN_BUDGET },
    { "block exactly the budget", IN(DIR_H2D, G, G, G, 2, G, 2 * G, 1, 0, 0), COST_REGISTER, COST_GAIN },
    /* Read-only pages register only read-only, for the device to read: H2D where supported. */
    { "read-only, H2D, supported", IN(DIR_H2D, G, G, G, 2, 64 * G, 2 * G, 0, 1, 0), COST_REGISTER, COST_GAIN },
    { "read-only, H2D, unsupported", IN(DIR_H2D, G, G, G, 2, 64 * G, 2 * G, 0, 0, 0), COST_LEAVE, COST_READ_ONLY },
    { "read-only, D2H", IN(DIR_D2H, G, G, G, 2, 64 * G, 2 * G, 0, 1, 0), COST_LEAVE, COST_READ_ONLY },
    { "read-only, D2H, stageable", IN(DIR_D2H, G, G, G, 2, 64 * G, 2 * G, 0, 1, 1), COST_STAGE, COST_READ_ONLY },
};

int main(void)
{
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const struct row *r = &rows[i];
        struct cost_decision d = cost_decide(&r->in, &h200);
        CHECKF(d.verdict == r->verdict && d.reason == r->reason, "%s: verdict %d (%s), want %d (%s)",
               r->what, (int)d.verdict, cost_reason_text(d.reason), (int)r->verdict,
               cost_reason_text(r->reason));
    }
    /* No rates, no judgement. */
    struct cost_rates none = { 0, 0, 0, 0, 0 };
    struct cost_inputs in = IN(DIR_H2D, G, G, G, 9, 64 * G, 9 * G, 1, 0, 0);
    CHECK(cost_decide(&in, &none).reason == COST_NO_RATES);
    /* The register cost interpolates between resident and untouched pages. */
    CHECK(cost_register_us(G, G, &h200) == 45000.0);
    CHECK(cost_register_us(G, 0, &h200) == 360000.0);
    CHECK(cost_register_us(G, G / 2, &h200) == (45000.0 + 360000.0) / 2);
    CHECK(cost_register_us(G, 2 * G, &h200) == 45000.0);   /* resident beyond the block: capped */
    return TEST_SUMMARY();
}
