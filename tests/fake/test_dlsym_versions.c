/* The dlsym door under both glibc symbol versions: a program linked against dlsym@GLIBC_2.2.5
 * (built on an older glibc, e.g. a static CUDA runtime in an old binary) and one linked against
 * dlsym@GLIBC_2.34 must both be handed the shim's entry point for a hooked driver name, which is
 * also what a global lookup finds.  Without the shim both give the driver's own function. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include "drvtest.h"

void *dlsym_glibc_2_2_5(void *handle, const char *name);
__asm__(".symver dlsym_glibc_2_2_5, dlsym@GLIBC_2.2.5");

int main(void)
{
    drvtest_init();
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(lib != NULL);
    if (strcmp(drvtest_mode(), "off") == 0) {
        /* Mode off hands out the driver's functions by handle; the exported doors still win a
         * global lookup, so the comparison below does not apply. */
        CHECK(dlsym_glibc_2_2_5(lib, "cuMemcpyHtoD_v2") == dlsym(lib, "cuMemcpyHtoD_v2"));
        return TEST_SUMMARY();
    }
    const char *names[] = {"cuMemcpyHtoD_v2", "cuMemcpyDtoHAsync_v2_ptsz", "cuGetProcAddress_v2"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *global = dlsym(RTLD_DEFAULT, names[i]);
        CHECKF(global && dlsym(lib, names[i]) == global, "dlsym@GLIBC_2.34(%s) gives the entry point programs link to", names[i]);
        CHECKF(dlsym_glibc_2_2_5(lib, names[i]) == global, "dlsym@GLIBC_2.2.5(%s) gives the entry point programs link to", names[i]);
    }
    /* A name nobody hooks is the driver's under both versions. */
    CHECK(dlsym_glibc_2_2_5(lib, "cuCtxGetCurrent") == dlsym(lib, "cuCtxGetCurrent"));
    printf("EXPECTED_COPIES h2d=0 d2h=0 d2d=0\n");
    return TEST_SUMMARY();
}
