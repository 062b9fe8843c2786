/* NVTX ranges around what the shim does, so an Nsight Systems timeline shows it.  NVTX3 is
 * header-only: with no tool attached each call is a check of a null pointer. */
#ifndef PINSHIM_NVTX_H
#define PINSHIM_NVTX_H

void nvtx_push(const char *what);
void nvtx_pop(void);
void nvtx_mark(const char *what);

#endif
