/* A driver-API program, linked against libcuda.so.1 like any other: run against the remote client
 * library it uses a remote GPU, against the fake driver a local one, unchanged.
 *   drv_prog IMAGE [--bytes N] [--launches N] [--kernel-us N] [--over BYTES] [--loop N] [--hold-ms N]
 * Prints key=value lines (results are CUresult numbers, 0 = success). --loop N: the toy loop only
 * (copy N bytes in, N launches, copy out), timed. --hold-ms: sleep that long after the first copy in. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

#define CHECK(call)                                                                 \
    do {                                                                            \
        CUresult r_ = (call);                                                       \
        if (r_ != CUDA_SUCCESS) {                                                   \
            const char *s_ = NULL;                                                  \
            cuGetErrorString(r_, &s_);                                              \
            printf("failed=%s\nerror=%d\n", #call, (int)r_);                        \
            fprintf(stderr, "drv_prog: %s: %d (%s)\n", #call, (int)r_, s_ ? s_ : "?"); \
            fflush(stdout);                                                         \
            return 1;                                                               \
        }                                                                           \
    } while (0)

static void *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = calloc(1, (size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) n = -1;
    fclose(f);
    return n < 0 ? NULL : buf;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);   /* tests read progress line by line */
    if (argc < 2) return 2;
    size_t bytes = 1 << 20, over = 0;
    unsigned long long launches = 4, kernel_us = 2000, loop = 0, hold_ms = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--bytes")) bytes = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--launches")) launches = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--kernel-us")) kernel_us = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--over")) over = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--loop")) loop = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--hold-ms")) hold_ms = strtoull(argv[i + 1], NULL, 10);
        else return 2;
    }
    void *image = read_file(argv[1]);
    if (!image) {
        fprintf(stderr, "drv_prog: cannot read %s\n", argv[1]);
        return 2;
    }
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction spin, empty;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, image));
    CHECK(cuModuleGetFunction(&spin, mod, "spin"));
    CHECK(cuModuleGetFunction(&empty, mod, "empty"));
    size_t free_b, total;
    CHECK(cuMemGetInfo(&free_b, &total));
    printf("total=%zu\nfree=%zu\n", total, free_b);

    unsigned char *host = malloc(bytes), *back = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) host[i] = (unsigned char)(i * 7 + 3);
    CUdeviceptr a, b;
    CHECK(cuMemAlloc(&a, bytes));
    CHECK(cuMemAlloc(&b, bytes));
    printf("allocated=1\n");
    if (loop) {   /* the toy loop: copy in, N launches, copy out */
        unsigned long long us = kernel_us;
        void *params[] = {&us, &b, &(int){1}};
        double t0 = now_s();
        CHECK(cuMemcpyHtoD(a, host, bytes));
        for (unsigned long long i = 0; i < loop; i++)
            CHECK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL));
        CHECK(cuMemcpyDtoH(back, a, bytes));
        double t1 = now_s();
        printf("loop_s=%.6f\nloop_ok=%d\n", t1 - t0, memcmp(host, back, bytes) == 0);
        return 0;
    }
    double t0 = now_s();
    CHECK(cuMemcpyHtoD(a, host, bytes));
    double t1 = now_s();
    printf("copied_in=1\n");
    if (hold_ms) {
        printf("holding=1\n");
        fflush(stdout);
        usleep((useconds_t)(hold_ms * 1000));
    }
    CHECK(cuMemcpyDtoD(b, a, bytes));
    memset(back, 0, bytes);
    printf("copying_out=1\n");
    double t2 = now_s();
    CHECK(cuMemcpyDtoH(back, b, bytes));
    double t3 = now_s();
    printf("copy_ok=%d\nhtod_s=%.6f\ndtoh_s=%.6f\n", memcmp(host, back, bytes) == 0, t1 - t0, t3 - t2);
    CHECK(cuMemsetD8(b, 0x5a, bytes));
    CHECK(cuMemcpyDtoH(back, b, bytes));
    int memset_ok = 1;
    for (size_t i = 0; i < bytes; i++) memset_ok &= back[i] == 0x5a;
    printf("memset_ok=%d\n", memset_ok);

    CUstream s;
    CUevent e0, e1;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
    CHECK(cuMemcpyHtoDAsync(a, host, bytes, s));
    CHECK(cuEventRecord(e0, s));
    unsigned long long us = kernel_us;
    int n = 7;
    void *params[] = {&us, &b, &n};
    for (unsigned long long i = 0; i < launches; i++) CHECK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, s, params, NULL));
    CHECK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
    CHECK(cuEventRecord(e1, s));
    CHECK(cuEventSynchronize(e1));
    float ms = 0;
    CHECK(cuEventElapsedTime(&ms, e0, e1));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuMemcpyDtoHAsync(back, a, bytes, s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuCtxSynchronize());
    printf("elapsed_ms=%.3f\nasync_copy_ok=%d\n", ms, memcmp(host, back, bytes) == 0);
    printf("stream_query=%d\nevent_query=%d\n", (int)cuStreamQuery(s), (int)cuEventQuery(e1));
    CHECK(cuEventDestroy(e0));
    CHECK(cuEventDestroy(e1));
    CHECK(cuStreamDestroy(s));

    CUdeviceptr c = 0;
    if (over) printf("over_cap=%d\n", (int)cuMemAlloc(&c, over));
    CHECK(cuMemGetInfo(&free_b, &total));
    printf("free_used=%zu\n", free_b);
    CUipcMemHandle ipc;
    printf("ipc=%d\n", (int)cuIpcGetMemHandle(&ipc, a));
    CUgraph g;
    printf("graph=%d\n", (int)cuGraphCreate(&g, 0));
    printf("bad_free=%d\n", (int)cuMemFree(a + 12345));
    CHECK(cuMemFree(a));
    CHECK(cuMemFree(b));
    CHECK(cuMemGetInfo(&free_b, &total));
    printf("free_end=%zu\n", free_b);
    CHECK(cuModuleUnload(mod));
    printf("done=1\n");
    return 0;
}
