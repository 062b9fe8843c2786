/* Identifiers and metadata generated from hooks.def. */
#ifndef PINSHIM_HOOKS_H
#define PINSHIM_HOOKS_H

#include <cuda.h>

enum hook_flavour { LEGACY, PTDS, NOSTREAM };

enum hook_id {
#define HOOK(sym, base, ver, flav, handler, params, args) HOOK_##sym,
#include "base/hooks.def"
#undef HOOK
    HOOK_COUNT
};

struct hook_info {
    const char *symbol;
    const char *base;
    int version;
    enum hook_flavour flavour;
};

extern const struct hook_info hook_table[HOOK_COUNT];

/* The door (exported wrapper) of each hook, defined in doors.c. */
extern void *const hook_doors[HOOK_COUNT];

/* Index of an exact symbol name, or -1. */
int hook_find_symbol(const char *symbol);

/* The variant of base name `base` that cuGetProcAddress(base, version, flags) selects, or -1. */
int hook_select_variant(const char *base, int version, int per_thread);

#endif
