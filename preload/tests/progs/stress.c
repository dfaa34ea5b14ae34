/* Many threads launch and allocate at once (run under ThreadSanitizer / AddressSanitizer).
 *   stress <threads> <iterations> <cap-bytes> [kernel-us]
 * Every 16th launch runs a kernel of kernel-us microseconds on the fake device, so the run spans
 * many token boundaries; the others are empty kernels.
 * Exits 0 when every thread finished and the budget is back to empty. */
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static unsigned long long cap;
static int iterations;
static uint64_t kernel_us;

static void *worker(void *arg) {
    long id = (long)arg;
    CUcontext ctx;
    cuDevicePrimaryCtxRetain(&ctx, 0);
    cuCtxSetCurrent(ctx);
    uint64_t us = kernel_us;
    void *params[] = {&us};
    for (int i = 0; i < iterations; i++) {
        if (cuLaunchKernel((CUfunction)1, 1, 1, 1, 1, 1, 1, 0, NULL, (i % 16) ? NULL : params, NULL) != CUDA_SUCCESS)
            return (void *)1;
        if (i % 16 == 0) {
            CUdeviceptr p;
            CUresult r = cuMemAlloc(&p, cap / 64);
            if (r == CUDA_SUCCESS) cuMemFree(p);
            else if (r != CUDA_ERROR_OUT_OF_MEMORY) return (void *)1;
        }
        if (id == 0 && i == iterations / 2) {
            pid_t child = fork();
            if (child == 0) {
                CUdeviceptr p;
                _exit(cuMemAlloc(&p, cap / 4) == CUDA_SUCCESS ? 0 : 1);
            }
            int status;
            waitpid(child, &status, 0);
            if (!WIFEXITED(status) || WEXITSTATUS(status)) return (void *)1;
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) return 2;
    kernel_us = argc == 5 ? strtoull(argv[4], NULL, 10) : 0;
    int n = atoi(argv[1]);
    iterations = atoi(argv[2]);
    cap = strtoull(argv[3], NULL, 10);
    cuInit(0);
    pthread_t t[256];
    if (n < 1 || n > 256) return 2;
    for (long i = 0; i < n; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    int failed = 0;
    for (int i = 0; i < n; i++) {
        void *r;
        pthread_join(t[i], &r);
        failed |= r != NULL;
    }
    size_t free_b, total_b;
    cuMemGetInfo(&free_b, &total_b);
    printf("failed=%d free=%zu total=%zu\n", failed, free_b, total_b);
    return failed || free_b != total_b;
}
