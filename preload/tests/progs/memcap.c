/* Allocates through one resolution path and one allocation API, and prints what happened.
 *   memcap <resolver> <api> <cap-bytes>
 * resolver: direct (compiled with -DDIRECT), dlopen, gpa1:<flags>, gpa2:<flags>, gpa_self
 * api: alloc pitch managed async async_ptsz pool pool_ptsz create array array3d mipmap */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef CUresult (*gpa1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static void *lib;
static const char *resolver;
static gpa2_fn gpa2;
static gpa1_fn gpa1;
static unsigned long long gpa_flags;

#ifdef DIRECT
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
uint64_t fakeAllocatedBytes(void);
#define D(n) {#n, (void *)&n}
static const struct { const char *name; void *fn; } linked[] = {
    D(cuInit), D(cuMemAlloc_v2), D(cuMemFree_v2), D(cuMemAllocPitch_v2), D(cuMemAllocManaged),
    D(cuMemAllocAsync), D(cuMemAllocAsync_ptsz), D(cuMemAllocFromPoolAsync), D(cuMemAllocFromPoolAsync_ptsz),
    D(cuMemFreeAsync), D(cuMemFreeAsync_ptsz), D(cuMemCreate), D(cuMemRelease), D(cuArrayCreate_v2),
    D(cuArray3DCreate_v2), D(cuArrayDestroy), D(cuMipmappedArrayCreate), D(cuMipmappedArrayDestroy), D(cuMemGetInfo_v2), D(cuDeviceTotalMem_v2),
    D(fakeAllocatedBytes), {NULL, NULL}};
#endif

/* base: the name without suffix (for cuGetProcAddress); exact: the exported symbol */
static void *get(const char *base, const char *exact) {
    void *fn = NULL;
    if (!strcmp(resolver, "direct")) {
#ifdef DIRECT
        for (int i = 0; linked[i].name; i++)
            if (!strcmp(linked[i].name, exact)) fn = linked[i].fn;
#endif
    } else if (!strcmp(resolver, "dlopen") || !strncmp(exact, "fake", 4)) {
        fn = dlsym(lib, exact);
    } else if (gpa2) {
        CUdriverProcAddressQueryResult st;
        if (gpa2(base, &fn, 12000, gpa_flags, &st) != CUDA_SUCCESS) fn = NULL;
    } else if (gpa1) {
        if (gpa1(base, &fn, 12000, gpa_flags) != CUDA_SUCCESS) fn = NULL;
    }
    if (!fn) {
        fprintf(stderr, "memcap: cannot resolve %s via %s\n", exact, resolver);
        exit(3);
    }
    return fn;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: memcap <resolver> <api> <cap-bytes>\n");
        return 2;
    }
    resolver = argv[1];
    const char *api = argv[2];
    unsigned long long cap = strtoull(argv[3], NULL, 10);
    int ptsz = strstr(api, "_ptsz") != NULL;
    lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "memcap: %s\n", dlerror());
        return 2;
    }
    if (!strncmp(resolver, "gpa1:", 5)) {
        gpa_flags = strtoull(resolver + 5, NULL, 10);
        gpa1 = (gpa1_fn)dlsym(lib, "cuGetProcAddress");
    } else if (!strncmp(resolver, "gpa2:", 5)) {
        gpa_flags = strtoull(resolver + 5, NULL, 10);
        gpa2 = (gpa2_fn)dlsym(lib, "cuGetProcAddress_v2");
    } else if (!strcmp(resolver, "gpa_self")) {
        gpa2_fn first = (gpa2_fn)dlsym(lib, "cuGetProcAddress_v2");
        CUdriverProcAddressQueryResult st;
        void *again = NULL;
        first("cuGetProcAddress", &again, 12000, 0, &st);
        gpa2 = (gpa2_fn)again;   /* every lookup below goes through the pointer it gave for itself */
    }
    if (ptsz && (gpa1 || gpa2)) gpa_flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

    CUresult (*init)(unsigned) = (CUresult (*)(unsigned))get("cuInit", "cuInit");
    uint64_t (*fake_allocated)(void) = (uint64_t (*)(void))get("fakeAllocatedBytes", "fakeAllocatedBytes");
    CUresult (*info)(size_t *, size_t *) = (CUresult (*)(size_t *, size_t *))get("cuMemGetInfo", "cuMemGetInfo_v2");
    CUresult (*total_mem)(size_t *, CUdevice) =
        (CUresult (*)(size_t *, CUdevice))get("cuDeviceTotalMem", "cuDeviceTotalMem_v2");
    init(0);

    unsigned long long sizes[3] = {cap / 4 * 3, cap / 2, cap / 2};
    CUresult rc[3];
    unsigned long long handles[3] = {0, 0, 0};
    uint64_t fake_before = 0, fake_after = 0;
    for (int i = 0; i < 3; i++) {
        unsigned long long n = sizes[i];
        if (i == 1) fake_before = fake_allocated();
        if (!strcmp(api, "alloc")) {
            rc[i] = ((CUresult (*)(CUdeviceptr *, size_t))get("cuMemAlloc", "cuMemAlloc_v2"))(&handles[i], n);
        } else if (!strcmp(api, "pitch")) {
            size_t pitch;
            rc[i] = ((CUresult (*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned))get(
                "cuMemAllocPitch", "cuMemAllocPitch_v2"))(&handles[i], &pitch, 1024, n / 1024, 4);
        } else if (!strcmp(api, "managed")) {
            rc[i] = ((CUresult (*)(CUdeviceptr *, size_t, unsigned))get("cuMemAllocManaged", "cuMemAllocManaged"))(
                &handles[i], n, CU_MEM_ATTACH_GLOBAL);
        } else if (!strncmp(api, "async", 5)) {
            rc[i] = ((CUresult (*)(CUdeviceptr *, size_t, CUstream))get(
                "cuMemAllocAsync", ptsz ? "cuMemAllocAsync_ptsz" : "cuMemAllocAsync"))(&handles[i], n, NULL);
        } else if (!strncmp(api, "pool", 4)) {
            rc[i] = ((CUresult (*)(CUdeviceptr *, size_t, CUmemoryPool, CUstream))get(
                "cuMemAllocFromPoolAsync", ptsz ? "cuMemAllocFromPoolAsync_ptsz" : "cuMemAllocFromPoolAsync"))(
                &handles[i], n, NULL, NULL);
        } else if (!strcmp(api, "create")) {
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof prop);
            rc[i] = ((CUresult (*)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                                   unsigned long long))get("cuMemCreate", "cuMemCreate"))(&handles[i], n, &prop, 0);
        } else if (!strcmp(api, "array")) {
            CUDA_ARRAY_DESCRIPTOR d = {.Width = 1024, .Height = n / 4096, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
            CUarray a = NULL;
            rc[i] = ((CUresult (*)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *))get("cuArrayCreate", "cuArrayCreate_v2"))(&a, &d);
            handles[i] = (uint64_t)a;
        } else if (!strcmp(api, "array3d")) {
            CUDA_ARRAY3D_DESCRIPTOR d = {.Width = 256, .Height = 16, .Depth = n / (256 * 16 * 4),
                                         .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
            CUarray a = NULL;
            rc[i] = ((CUresult (*)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *))get("cuArray3DCreate", "cuArray3DCreate_v2"))(&a, &d);
            handles[i] = (uint64_t)a;
        } else if (!strcmp(api, "mipmap")) {
            /* three levels of a 2D float array: 1 + 1/4 + 1/16 of the first level = n bytes */
            CUDA_ARRAY3D_DESCRIPTOR d = {.Width = 1024, .Height = n / 4096 * 16 / 21, .Depth = 0,
                                         .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
            CUmipmappedArray m = NULL;
            rc[i] = ((CUresult (*)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned))get(
                "cuMipmappedArrayCreate", "cuMipmappedArrayCreate"))(&m, &d, 3);
            handles[i] = (uint64_t)m;
        } else {
            fprintf(stderr, "memcap: unknown api %s\n", api);
            return 2;
        }
        if (i == 1) fake_after = fake_allocated();
        if (i == 1) {
            /* free the first allocation through the matching free */
            CUresult fr;
            if (!strncmp(api, "async", 5) || !strncmp(api, "pool", 4))
                fr = ((CUresult (*)(CUdeviceptr, CUstream))get("cuMemFreeAsync", ptsz ? "cuMemFreeAsync_ptsz" : "cuMemFreeAsync"))(handles[0], NULL);
            else if (!strcmp(api, "create"))
                fr = ((CUresult (*)(CUmemGenericAllocationHandle))get("cuMemRelease", "cuMemRelease"))(handles[0]);
            else if (!strcmp(api, "mipmap"))
                fr = ((CUresult (*)(CUmipmappedArray))get("cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy"))(
                    (CUmipmappedArray)handles[0]);
            else if (!strncmp(api, "array", 5))
                fr = ((CUresult (*)(CUarray))get("cuArrayDestroy", "cuArrayDestroy"))((CUarray)handles[0]);
            else
                fr = ((CUresult (*)(CUdeviceptr))get("cuMemFree", "cuMemFree_v2"))(handles[0]);
            printf("freed=%d\n", fr);
        }
    }
    size_t free_b = 0, total_b = 0, dev_total = 0;
    info(&free_b, &total_b);
    total_mem(&dev_total, 0);
    printf("first=%d\nsecond=%d\nthird=%d\nfake_delta=%llu\ntotal=%zu\nfree=%zu\ndevice_total=%zu\n", rc[0], rc[1],
           rc[2], (unsigned long long)(fake_after - fake_before), total_b, free_b, dev_total);
    return 0;
}
