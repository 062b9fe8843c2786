/* The handler every variant of a hooked entry point forwards to (declared from hooks.def).  A
 * handler runs inside the shim's guard, entered by its door, and only when the shim may act. */
#ifndef PINSHIM_HANDLERS_H
#define PINSHIM_HANDLERS_H

#include <cuda.h>
#include "base/hooks.h"

#define HOOK_UNPACK(...) __VA_ARGS__
#define HOOK(sym, base, ver, flav, handler, params, args) CUresult handler(enum hook_id id, HOOK_UNPACK params);
#include "base/hooks.def"
#undef HOOK

#endif
