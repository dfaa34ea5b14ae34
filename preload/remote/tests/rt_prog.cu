// A runtime-API program built with `nvcc -cudart shared`: kernels come from its own fat binary and are
// launched with <<<...>>>. Run against the remote client libraries it uses a remote GPU, unchanged.
//   rt_prog [--bytes N] [--launches N] [--kernel-us N] [--over BYTES]
// Prints key=value lines (results are cudaError_t numbers, 0 = success).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

__global__ void spin(unsigned long long us, float *out, int n) {
    if (out && threadIdx.x == 0) out[0] = (float)n + (float)us;
}
__global__ void empty() {}

static void host_fn(void *flag) { *(int *)flag = 1; }

#define CHECK(call)                                                                       \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            printf("failed=%s\nerror=%d\n", #call, (int)e_);                              \
            fprintf(stderr, "rt_prog: %s: %d (%s)\n", #call, (int)e_, cudaGetErrorString(e_)); \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)

int main(int argc, char **argv) {
    size_t bytes = 1 << 20, over = 0;
    unsigned long long launches = 4, kernel_us = 2000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--bytes")) bytes = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--launches")) launches = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--kernel-us")) kernel_us = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--over")) over = strtoull(argv[i + 1], NULL, 10);
        else return 2;
    }
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    size_t free_b, total;
    CHECK(cudaMemGetInfo(&free_b, &total));
    printf("devices=%d\nname=%s\nprop_total=%zu\ntotal=%zu\nfree=%zu\n", count, prop.name, prop.totalGlobalMem, total,
           free_b);

    unsigned char *host = (unsigned char *)malloc(bytes), *back = (unsigned char *)malloc(bytes);
    for (size_t i = 0; i < bytes; i++) host[i] = (unsigned char)(i * 13 + 1);
    unsigned char *a, *b;
    float *out;
    CHECK(cudaMalloc(&a, bytes));
    CHECK(cudaMalloc(&b, bytes));
    CHECK(cudaMalloc(&out, sizeof(float)));
    CHECK(cudaMemcpy(a, host, bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy(back, b, bytes, cudaMemcpyDeviceToHost));
    printf("copy_ok=%d\n", memcmp(host, back, bytes) == 0);
    CHECK(cudaMemset(b, 0x11, bytes));
    CHECK(cudaMemcpy(back, b, bytes, cudaMemcpyDefault));
    printf("memset_ok=%d\n", back[0] == 0x11 && back[bytes - 1] == 0x11);

    cudaStream_t s;
    cudaEvent_t e0, e1;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    CHECK(cudaEventRecord(e0, s));
    for (unsigned long long i = 0; i < launches; i++) spin<<<1, 32, 0, s>>>(kernel_us, out, 5);
    empty<<<1, 1>>>();
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(e1, s));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    CHECK(cudaMemcpyAsync(a, host, bytes, cudaMemcpyHostToDevice, s));
    CHECK(cudaMemcpyAsync(back, a, bytes, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaDeviceSynchronize());
    printf("elapsed_ms=%.3f\nasync_copy_ok=%d\n", ms, memcmp(host, back, bytes) == 0);
    int flag = 0;
    spin<<<1, 32, 0, s>>>(kernel_us, out, 1);
    CHECK(cudaLaunchHostFunc(s, host_fn, &flag));
    printf("host_fn_ok=%d\n", flag);
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaEventDestroy(e1));
    CHECK(cudaStreamDestroy(s));

    size_t pitch = 0;
    unsigned char *pitched;
    CHECK(cudaMallocPitch((void **)&pitched, &pitch, 100, 8));
    CHECK(cudaMemcpy2D(pitched, pitch, host, 100, 100, 8, cudaMemcpyHostToDevice));
    memset(back, 0, 800);
    CHECK(cudaMemcpy2D(back, 100, pitched, pitch, 100, 8, cudaMemcpyDeviceToHost));
    printf("pitch=%zu\npitched_ok=%d\n", pitch, memcmp(host, back, 800) == 0);
    CHECK(cudaFree(pitched));
    cudaPointerAttributes attr_dev, attr_host;
    CHECK(cudaPointerGetAttributes(&attr_dev, a + 10));
    CHECK(cudaPointerGetAttributes(&attr_host, host));
    printf("ptr_attr_ok=%d\n", attr_dev.type == cudaMemoryTypeDevice && attr_host.type == cudaMemoryTypeUnregistered);

    if (over) {
        void *c = NULL;
        printf("over_cap=%d\n", (int)cudaMalloc(&c, over));
        printf("last_error=%d\n", (int)cudaGetLastError());
    }
    CHECK(cudaMemGetInfo(&free_b, &total));
    printf("free_used=%zu\n", free_b);
    cudaIpcMemHandle_t ipc;
    cudaError_t ipc_err = cudaIpcGetMemHandle(&ipc, a);
    printf("ipc=%d\nipc_text=%s\n", (int)ipc_err, cudaGetErrorString(ipc_err));
    cudaGraph_t g;
    printf("graph=%d\n", (int)cudaGraphCreate(&g, 0));
    cudaGetLastError();
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(out));
    CHECK(cudaMemGetInfo(&free_b, &total));
    printf("free_end=%zu\ndone=1\n", free_b);
    return 0;
}
