/* Resolving the real libc and driver functions, once each. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <string.h>
#include "base/libc_string.h"
#include "base/real.h"
#include "base/shim.h"

struct libc_fns libc;
struct driver_fns drv;
void *real_hook[HOOK_COUNT];
uintptr_t driver_code_lo, driver_code_hi;

static void *find_real_dlsym(void)
{
    /* dlsym is hooked, so the real one comes from dlvsym under either glibc version. */
    void *f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!f)
        f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    return f;
}

void real_libc_resolve(void)
{
    if (__atomic_load_n(&libc.dlsym, __ATOMIC_ACQUIRE))
        return;
    void *(*real_dlsym)(void *, const char *) = (void *(*)(void *, const char *))find_real_dlsym();
    if (!real_dlsym)
        return;
    /* dlsym may allocate (dlerror state): the hooks serve that from the bootstrap pool. */
    shim_enter();
#define RESOLVE_(field, name) *(void **)&libc.field = real_dlsym(RTLD_NEXT, name)
    RESOLVE_(malloc, "malloc");
    RESOLVE_(calloc, "calloc");
    RESOLVE_(realloc, "realloc");
    RESOLVE_(free, "free");
    RESOLVE_(posix_memalign, "posix_memalign");
    RESOLVE_(aligned_alloc, "aligned_alloc");
    RESOLVE_(memalign, "memalign");
    RESOLVE_(valloc, "valloc");
    RESOLVE_(pvalloc, "pvalloc");
    RESOLVE_(malloc_usable_size, "malloc_usable_size");
    RESOLVE_(mmap, "mmap");
    RESOLVE_(munmap, "munmap");
    RESOLVE_(mremap, "mremap");
    RESOLVE_(madvise, "madvise");
    RESOLVE_(mprotect, "mprotect");
    RESOLVE_(memcpy, "memcpy");
    RESOLVE_(memmove, "memmove");
    RESOLVE_(memcpy_chk, "__memcpy_chk");
    RESOLVE_(memmove_chk, "__memmove_chk");
    RESOLVE_(memset, "memset");
    RESOLVE_(memset_chk, "__memset_chk");
#undef RESOLVE_
    if (libc.memcpy)
        __atomic_store_n(&shim_next_memcpy, libc.memcpy, __ATOMIC_RELEASE);
    if (libc.memmove)
        __atomic_store_n(&shim_next_memmove, libc.memmove, __ATOMIC_RELEASE);
    if (libc.memset)
        __atomic_store_n(&shim_next_memset, libc.memset, __ATOMIC_RELEASE);
    __atomic_store_n(&libc.dlsym, real_dlsym, __ATOMIC_RELEASE);
    shim_leave();
}

static pthread_mutex_t driver_lock = PTHREAD_MUTEX_INITIALIZER;
static int driver_ready;

int real_driver_ready(void)
{
    return __atomic_load_n(&driver_ready, __ATOMIC_ACQUIRE);
}

static int is_pseudo_handle(void *h)
{
    return h == RTLD_DEFAULT || h == RTLD_NEXT;
}

/* Note where the driver's executable segments lie, from the program headers of the object that
 * defines sym (the ELF header is mapped at dli_fbase). */
static void note_driver_code(void *handle, void *sym)
{
    Dl_info info;
    struct link_map *map = NULL;
    if (!sym || !dladdr(sym, &info) || !info.dli_fbase || dlinfo(handle, RTLD_DI_LINKMAP, &map) || !map)
        return;
    const ElfW(Ehdr) *eh = info.dli_fbase;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0)
        return;
    const ElfW(Phdr) *ph = (const ElfW(Phdr) *)((const char *)eh + eh->e_phoff);
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (int i = 0; i < eh->e_phnum; i++) {
        if (ph[i].p_type != PT_LOAD || !(ph[i].p_flags & PF_X))
            continue;
        uintptr_t start = map->l_addr + ph[i].p_vaddr;
        if (start < lo)
            lo = start;
        if (start + ph[i].p_memsz > hi)
            hi = start + ph[i].p_memsz;
    }
    if (lo < hi && (uintptr_t)sym >= lo && (uintptr_t)sym < hi) {
        __atomic_store_n(&driver_code_lo, lo, __ATOMIC_RELAXED);
        __atomic_store_n(&driver_code_hi, hi, __ATOMIC_RELAXED);
    }
}

int real_driver_resolve(void *handle)
{
    if (real_driver_ready())
        return 1;
    if (shim_forked_child)
        return 0;
    real_libc_resolve();
    if (!libc.dlsym)
        return 0;
    shim_enter();
    pthread_mutex_lock(&driver_lock);
    if (!driver_ready) {
        void *h = NULL;
        if (handle && !is_pseudo_handle(handle) && libc.dlsym(handle, "cuInit"))
            h = handle;
        /* RTLD_NOLOAD: never load the driver into a program that did not. */
        if (!h)
            h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (!h)
            h = dlopen("libcuda.so", RTLD_LAZY | RTLD_NOLOAD);
        if (h) {
            for (int i = 0; i < HOOK_COUNT; i++)
                real_hook[i] = libc.dlsym(h, hook_table[i].symbol);
#define DRIVER_RESOLVE_(name, ret, params) *(void **)&drv.name = libc.dlsym(h, #name);
            DRIVER_HELPERS(DRIVER_RESOLVE_)
#undef DRIVER_RESOLVE_
            note_driver_code(h, libc.dlsym(h, "cuInit"));
            __atomic_store_n(&driver_ready, 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&driver_lock);
    shim_leave();
    return real_driver_ready();
}

CUstreamCaptureMode drv_relax_capture(void)
{
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (!drv.cuThreadExchangeStreamCaptureMode || drv.cuThreadExchangeStreamCaptureMode(&mode) != CUDA_SUCCESS)
        return CU_STREAM_CAPTURE_MODE_RELAXED;
    return mode;
}

void drv_restore_capture(CUstreamCaptureMode before)
{
    if (before != CU_STREAM_CAPTURE_MODE_RELAXED && drv.cuThreadExchangeStreamCaptureMode)
        drv.cuThreadExchangeStreamCaptureMode(&before);
}
