/* Metadata of the hooked entry points, and how cuGetProcAddress picks a variant. */
#include <string.h>
#include "base/hooks.h"

const struct hook_info hook_table[HOOK_COUNT] = {
#define HOOK(sym, base, ver, flav, handler, params, args) [HOOK_##sym] = {#sym, #base, ver, flav},
#include "base/hooks.def"
#undef HOOK
};

int hook_find_symbol(const char *symbol)
{
    /* Called from dlsym for names starting with "cu" only; the list is short. */
    for (int i = 0; i < HOOK_COUNT; i++)
        if (strcmp(hook_table[i].symbol, symbol) == 0)
            return i;
    return -1;
}

int hook_select_variant(const char *base, int version, int per_thread)
{
    /* The newest variant the caller's version allows, of the wanted stream flavour; names
     * without a per-thread variant answer per-thread lookups with their legacy variant,
     * as the driver does. */
    int best = -1, best_any_flavour = -1;
    for (int i = 0; i < HOOK_COUNT; i++) {
        const struct hook_info *h = &hook_table[i];
        if (strcmp(h->base, base) != 0 || h->version > version)
            continue;
        int wanted = per_thread ? (h->flavour == PTDS) : (h->flavour != PTDS);
        if (wanted && (best < 0 || h->version > hook_table[best].version))
            best = i;
        if (h->flavour != PTDS &&
            (best_any_flavour < 0 || h->version > hook_table[best_any_flavour].version))
            best_any_flavour = i;
    }
    if (best < 0 && per_thread) {
        /* A per-thread lookup of a name whose per-thread variant is newer than the caller's
         * version, or that has none, gets the legacy variant. */
        int has_ptds = 0;
        for (int i = 0; i < HOOK_COUNT; i++)
            if (strcmp(hook_table[i].base, base) == 0 && hook_table[i].flavour == PTDS)
                has_ptds = 1;
        if (!has_ptds)
            return best_any_flavour;
    }
    return best;
}
