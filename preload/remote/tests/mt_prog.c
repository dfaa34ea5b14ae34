/* Several host threads using one (remote) GPU at once, each on its own stream with its own memory, and
 * one more asking for memory information all the while: every thread must get its own bytes back.
 *   mt_prog IMAGE THREADS ROUNDS
 * Prints ok=1 when every check passed, else the failures. */
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static CUcontext ctx;
static CUfunction spin;
static int rounds;
static atomic_int failures, stop;

static void *worker(void *arg) {
    int id = (int)(long)arg;
    size_t bytes = (1u << 20) + (size_t)id * 4096;
    unsigned char *host = malloc(bytes), *back = malloc(bytes);
    cuCtxSetCurrent(ctx);
    CUstream s;
    CUdeviceptr d;
    if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) || cuMemAlloc(&d, bytes)) {
        atomic_fetch_add(&failures, 1);
        return NULL;
    }
    for (int r = 0; r < rounds; r++) {
        for (size_t i = 0; i < bytes; i++) host[i] = (unsigned char)(i * 31 + (size_t)id * 7 + (size_t)r);
        unsigned long long us = 200;
        int n = id;
        void *params[] = {&us, &d, &n};
        CUresult e = cuMemcpyHtoDAsync(d, host, bytes, s);
        for (int k = 0; k < 3 && !e; k++) e = cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, s, params, NULL);
        if (!e) e = cuMemcpyDtoHAsync(back, d, bytes, s);
        if (!e) e = cuStreamSynchronize(s);
        if (e || memcmp(host, back, bytes)) {
            fprintf(stderr, "mt_prog: thread %d round %d: %s\n", id, r, e ? "call failed" : "bytes differ");
            atomic_fetch_add(&failures, 1);
        }
    }
    cuMemFree(d);
    cuStreamDestroy(s);
    free(host);
    free(back);
    return NULL;
}

static void *watcher(void *arg) {
    (void)arg;
    cuCtxSetCurrent(ctx);
    while (!atomic_load(&stop)) {
        size_t fr, total;
        if (cuMemGetInfo(&fr, &total) || fr > total) atomic_fetch_add(&failures, 1);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    int threads = atoi(argv[2]);
    rounds = atoi(argv[3]);
    FILE *f = fopen(argv[1], "rb");
    if (!f || threads < 1 || threads > 64) return 2;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *image = calloc(1, (size_t)n + 1);
    if (fread(image, 1, (size_t)n, f) != (size_t)n) return 2;
    fclose(f);
    CUdevice dev;
    CUmodule mod;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx) ||
        cuModuleLoadData(&mod, image) || cuModuleGetFunction(&spin, mod, "spin")) {
        printf("ok=0\nsetup=failed\n");
        return 1;
    }
    pthread_t tids[65];
    for (int i = 0; i < threads; i++) pthread_create(&tids[i], NULL, worker, (void *)(long)i);
    pthread_create(&tids[threads], NULL, watcher, NULL);
    for (int i = 0; i < threads; i++) pthread_join(tids[i], NULL);
    atomic_store(&stop, 1);
    pthread_join(tids[threads], NULL);
    size_t fr, total;
    cuMemGetInfo(&fr, &total);
    printf("ok=%d\nfailures=%d\nfree_end=%zu\ntotal=%zu\n", atomic_load(&failures) == 0, atomic_load(&failures), fr,
           total);
    return atomic_load(&failures) != 0;
}
