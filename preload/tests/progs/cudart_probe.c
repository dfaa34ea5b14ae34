/* Links the CUDA runtime from the toolkit (shared or static) and reports what it got from the driver.
 * The runtime cannot initialise a context on the fake driver (that needs NVIDIA's private export
 * tables), but it resolves every driver entry point first: dlopen("libcuda.so.1"), dlsym of
 * cuGetProcAddress_v2, then cuGetProcAddress for each symbol. cudaGetDriverEntryPointByVersion hands
 * out exactly the pointers the runtime resolved, so calling them shows whether the cap holds there. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    unsigned long long cap = strtoull(argv[1], NULL, 10);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, 1 << 20);
    printf("cudaMalloc=%d\n", (int)e);
    void *fn = NULL, *init = NULL;
    enum cudaDriverEntryPointQueryResult st;
    cudaError_t e1 = cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 12000, cudaEnableDefault, &st);
    cudaError_t e2 = cudaGetDriverEntryPointByVersion("cuInit", &init, 12000, cudaEnableDefault, &st);
    printf("entry_point=%d\n", (int)(e1 || e2 || !fn || !init));
    if (fn && init) {
        ((CUresult (*)(unsigned))init)(0);
        CUdeviceptr d;
        printf("over_cap=%d\n", ((CUresult (*)(CUdeviceptr *, size_t))fn)(&d, cap + 1));
        printf("under_cap=%d\n", ((CUresult (*)(CUdeviceptr *, size_t))fn)(&d, cap / 2));
    }
    return 0;
}
