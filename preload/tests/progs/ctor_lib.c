/* A library whose constructor uses the driver before main runs (as some frameworks' plugins do):
 * dlopen, dlsym of cuGetProcAddress_v2, and an allocation over the cap through what it returned.
 * Preloaded beside the Tessera library, in either order, it must neither deadlock nor escape. */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

__attribute__((constructor)) static void use_the_driver_early(void) {
    const char *cap_text = getenv("CTOR_CAP");
    if (!cap_text) return;
    unsigned long long cap = strtoull(cap_text, NULL, 10);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    gpa2_fn gpa = lib ? (gpa2_fn)dlsym(lib, "cuGetProcAddress_v2") : NULL;
    void *init = NULL, *alloc = NULL;
    CUdriverProcAddressQueryResult st;
    if (!gpa || gpa("cuInit", &init, 12000, 0, &st) || gpa("cuMemAlloc", &alloc, 12000, 0, &st)) {
        printf("ctor_resolved=0\n");
        return;
    }
    ((CUresult (*)(unsigned))init)(0);
    CUdeviceptr p;
    printf("ctor_over_cap=%d\n", ((CUresult (*)(CUdeviceptr *, size_t))alloc)(&p, cap + 1));
    printf("ctor_under_cap=%d\n", ((CUresult (*)(CUdeviceptr *, size_t))alloc)(&p, cap / 2));
    fflush(stdout);
}
