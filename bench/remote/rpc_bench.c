/* Remote GPU benchmark program: an ordinary driver-API program (linked against libcuda.so.1), run
 * against the remote client library or the fake driver.
 *   rpc_bench IMAGE latency N          empty launch (pipelined and with a synchronize), cuMemGetInfo
 *   rpc_bench IMAGE copy BYTES REPEATS host→device and device→host copies, best of REPEATS
 * Prints key=value lines (microseconds per call, seconds per copy). */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

#define CHECK(call)                                                     \
    do {                                                                \
        CUresult r_ = (call);                                           \
        if (r_ != CUDA_SUCCESS) {                                       \
            fprintf(stderr, "rpc_bench: %s failed: %d\n", #call, (int)r_); \
            return 1;                                                   \
        }                                                               \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 2;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *image = calloc(1, (size_t)n + 1);
    if (fread(image, 1, (size_t)n, f) != (size_t)n) return 2;
    fclose(f);
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction empty;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, image));
    CHECK(cuModuleGetFunction(&empty, mod, "empty"));
    if (!strcmp(argv[2], "latency")) {
        long iters = atol(argv[3]);
        size_t fr, total;
        for (int i = 0; i < 100; i++) CHECK(cuMemGetInfo(&fr, &total));   /* warm up */
        double t0 = now_s();
        for (long i = 0; i < iters; i++) CHECK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        CHECK(cuCtxSynchronize());
        double t1 = now_s();
        for (long i = 0; i < iters; i++) {
            CHECK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
            CHECK(cuCtxSynchronize());
        }
        double t2 = now_s();
        for (long i = 0; i < iters; i++) CHECK(cuMemGetInfo(&fr, &total));
        double t3 = now_s();
        printf("launch_us=%.3f\nlaunch_sync_us=%.3f\nmeminfo_us=%.3f\n", (t1 - t0) / iters * 1e6,
               (t2 - t1) / iters * 1e6, (t3 - t2) / iters * 1e6);
        return 0;
    }
    if (!strcmp(argv[2], "copy") && argc >= 5) {
        size_t bytes = strtoull(argv[3], NULL, 10);
        int repeats = atoi(argv[4]);
        char *host = malloc(bytes);
        memset(host, 1, bytes);
        CUdeviceptr d;
        CHECK(cuMemAlloc(&d, bytes));
        CHECK(cuMemcpyHtoD(d, host, bytes));   /* first touch of the fake device's pages, not timed */
        double best_in = 1e9, best_out = 1e9;
        for (int i = 0; i < repeats; i++) {
            double t0 = now_s();
            CHECK(cuMemcpyHtoD(d, host, bytes));
            double t1 = now_s();
            CHECK(cuMemcpyDtoH(host, d, bytes));
            double t2 = now_s();
            if (t1 - t0 < best_in) best_in = t1 - t0;
            if (t2 - t1 < best_out) best_out = t2 - t1;
        }
        printf("htod_s=%.6f\ndtoh_s=%.6f\n", best_in, best_out);
        return 0;
    }
    return 2;
}
