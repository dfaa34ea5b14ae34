/* The driver API's allocation paths on a real GPU, run under the preload library's memory cap by
 * preload/gpu_check.py:
 *   alloc_probe API CHUNK_MIB [--leak]
 * API: alloc (cuMemAlloc), async (cuMemAllocAsync on a stream), create (cuMemCreate, mapped as a
 * program using virtual memory management maps it). Allocates CHUNK_MIB at a time until refused and
 * prints key=value lines: cuMemGetInfo's total and free before, the bytes it got, the CUresult that
 * stopped it, and free once everything is released; --leak exits holding everything instead, so the
 * next process shows whether the budget got the bytes back. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CHUNKS 4096
#define CHECK(call)                                                              \
    do {                                                                         \
        CUresult r_ = (call);                                                    \
        if (r_ != CUDA_SUCCESS) {                                                \
            fprintf(stderr, "alloc_probe: %s: %d\n", #call, (int)r_);            \
            printf("failed=%s\nerror=%d\n", #call, (int)r_);                     \
            return 1;                                                            \
        }                                                                        \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: alloc_probe alloc|async|create CHUNK_MIB [--leak]\n");
        return 2;
    }
    const char *api = argv[1];
    size_t chunk = strtoull(argv[2], NULL, 10) << 20;
    int leak = argc > 3 && !strcmp(argv[3], "--leak");
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    size_t free_b, total_b;
    CHECK(cuMemGetInfo(&free_b, &total_b));
    printf("total=%zu\nfree=%zu\n", total_b, free_b);

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    if (!strcmp(api, "create")) {
        size_t gran = 0;
        CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
        chunk = (chunk + gran - 1) / gran * gran;
    }
    static CUdeviceptr ptrs[MAX_CHUNKS];
    static CUmemGenericAllocationHandle handles[MAX_CHUNKS];
    int n = 0;
    CUresult stop = CUDA_SUCCESS;
    while (n < MAX_CHUNKS) {
        if (!strcmp(api, "alloc")) {
            stop = cuMemAlloc(&ptrs[n], chunk);
        } else if (!strcmp(api, "async")) {
            stop = cuMemAllocAsync(&ptrs[n], chunk, stream);
            if (stop == CUDA_SUCCESS) stop = cuStreamSynchronize(stream);
        } else if (!strcmp(api, "create")) {
            stop = cuMemCreate(&handles[n], chunk, &prop, 0);
            if (stop == CUDA_SUCCESS) {
                CUmemAccessDesc access = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
                CHECK(cuMemAddressReserve(&ptrs[n], chunk, 0, 0, 0));
                CHECK(cuMemMap(ptrs[n], chunk, 0, handles[n], 0));
                CHECK(cuMemSetAccess(ptrs[n], chunk, &access, 1));
            }
        } else {
            fprintf(stderr, "alloc_probe: unknown api %s\n", api);
            return 2;
        }
        if (stop != CUDA_SUCCESS) break;
        CHECK(cuMemsetD8Async(ptrs[n], 1, chunk, stream));  /* touch it: really resident */
        n++;
    }
    CHECK(cuStreamSynchronize(stream));
    size_t free_full = 0;
    CHECK(cuMemGetInfo(&free_full, &total_b));
    printf("allocated=%zu\nstop=%d\nfree_at_stop=%zu\n", (size_t)n * chunk, (int)stop, free_full);
    fflush(stdout);
    if (leak) return 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(api, "alloc")) {
            CHECK(cuMemFree(ptrs[i]));
        } else if (!strcmp(api, "async")) {
            CHECK(cuMemFreeAsync(ptrs[i], stream));
        } else {
            CHECK(cuMemUnmap(ptrs[i], chunk));
            CHECK(cuMemAddressFree(ptrs[i], chunk));
            CHECK(cuMemRelease(handles[i]));
        }
    }
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuMemGetInfo(&free_b, &total_b));
    printf("free_after=%zu\n", free_b);
    return 0;
}
