/* Allocates through NVIDIA's CUDA runtime from the toolkit (linked shared or static), which reaches
 * the driver only through dlopen("libcuda.so.1"), dlsym of cuGetProcAddress and the pointers that hands
 * out. Usage: cudart_probe CAP_BYTES. Prints key=value lines:
 *   total, free            cudaMemGetInfo before anything is allocated
 *   device_total           cudaDeviceProp.totalGlobalMem
 *   first, second, third   cudaMalloc of 3/4 of the cap, then 1/2 (over the cap), then 1/2 after
 *                          freeing the first (cudaError_t; 2 = cudaErrorMemoryAllocation)
 *   fake_delta             bytes the driver itself allocated for the refused call
 *   free_after             cudaMemGetInfo at the end
 *   over_cap, under_cap    the same through the cuMemAlloc pointer the runtime hands out */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    size_t cap = (size_t)strtoull(argv[1], NULL, 10);
    size_t free_bytes = 0, total = 0;
    cudaError_t info = cudaMemGetInfo(&free_bytes, &total);
    printf("info=%d\ntotal=%zu\nfree=%zu\n", (int)info, total, free_bytes);
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) printf("device_total=%zu\n", prop.totalGlobalMem);

    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);  /* the runtime loaded it by now */
    uint64_t (*fake_allocated)(void) = lib ? (uint64_t (*)(void))dlsym(lib, "fakeAllocatedBytes") : NULL;
    void *a = NULL, *b = NULL, *c = NULL;
    cudaError_t first = cudaMalloc(&a, cap / 4 * 3);
    uint64_t before = fake_allocated ? fake_allocated() : 0;
    cudaError_t second = cudaMalloc(&b, cap / 2);
    uint64_t after = fake_allocated ? fake_allocated() : 0;
    cudaError_t freed = cudaFree(a);
    cudaError_t third = cudaMalloc(&c, cap / 2);
    cudaMemGetInfo(&free_bytes, &total);
    printf("first=%d\nsecond=%d\nfreed=%d\nthird=%d\nfake_delta=%llu\nfree_after=%zu\n", (int)first, (int)second,
           (int)freed, (int)third, (unsigned long long)(after - before), free_bytes);
    if (second == cudaSuccess) cudaFree(b);
    cudaFree(c);

    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult st;
    if (cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 12000, cudaEnableDefault, &st) == cudaSuccess && fn) {
        CUdeviceptr d;
        CUresult over = ((CUresult (*)(CUdeviceptr *, size_t))fn)(&d, cap + 1);
        CUresult under = ((CUresult (*)(CUdeviceptr *, size_t))fn)(&d, cap / 2);
        printf("over_cap=%d\nunder_cap=%d\n", (int)over, (int)under);
    }
    return 0;
}
