/* A runtime-API program as nvcc -cudart shared builds them: it loads libcudart.so.<its CUDA major> (bench/remote/soname_check.py). */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>
int main(void) {
    int v = 0;
    cudaRuntimeGetVersion(&v);
    struct cudaDeviceProp p;
    memset(&p, 0, sizeof p);
    cudaError_t e = cudaGetDeviceProperties(&p, 0);
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    char in[4096], out[4096];
    for (int i = 0; i < 4096; i++) in[i] = (char)(i * 7);
    void *d = NULL;
    cudaError_t m = cudaMalloc(&d, sizeof in);
    cudaMemcpy(d, in, sizeof in, cudaMemcpyHostToDevice);
    cudaMemcpy(out, d, sizeof out, cudaMemcpyDeviceToHost);
    printf("runtime=%d props=%d name=%s total_global=%zu sm=%d major=%d warp=%d malloc=%d same=%d mem_total=%zu\n", v,
           (int)e, p.name, p.totalGlobalMem, p.multiProcessorCount, p.major, p.warpSize, (int)m,
           memcmp(in, out, sizeof in) == 0, total);
    return 0;
}
