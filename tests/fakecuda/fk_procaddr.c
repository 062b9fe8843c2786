/* fk_procaddr.c: the address of every exported entry point, for cuGetProcAddress.
 * Deliberately does not include cuda.h: each symbol is declared here under its exact exported
 * name with a neutral type, which cuda.h's own (renamed, typed) declarations would clash with. */
#include <stddef.h>

#define FK_X(sym, base, ver, pt) extern void fkref_##sym(void) __asm__(#sym);
#include "fk_exports.def"
#undef FK_X

__attribute__((visibility("hidden"))) void *const fk_sym_addrs[] = {
#define FK_X(sym, base, ver, pt) (void *)fkref_##sym,
#include "fk_exports.def"
#undef FK_X
};
