/* The recursion guard and the fork flag (declared in shim.h).  They live apart from the hook
 * layer so that unit tests, which link the logic without alloc_hooks.c, have them too. */
#include "base/shim.h"

__thread int shim_busy;
__thread int shim_own_thread;
volatile int shim_forked_child;
