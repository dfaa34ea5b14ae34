/* Memory: every allocation path of the driver API is counted against the container's budget
 * before the driver sees it; over the cap the call fails with CUDA_ERROR_OUT_OF_MEMORY and nothing
 * is allocated. The memory queries (driver and NVML) report the share, not the card. */
#include "tessera.h"
#include "hooks.h"

#define REAL(name, ...)                                                                              \
    static void *_Atomic name##_slot;                                                                 \
    __typeof__(__VA_ARGS__) real = (__typeof__(__VA_ARGS__))atomic_load_explicit(&name##_slot, memory_order_relaxed); \
    if (!real) {                                                                                      \
        real = (__typeof__(__VA_ARGS__))real_cuda(#name);                                                         \
        atomic_store_explicit(&name##_slot, (void *)real, memory_order_relaxed);                      \
    }                                                                                                 \
    if (!real) return CUDA_ERROR_NOT_INITIALIZED

static CUresult refuse(const char *api, uint64_t bytes) {
    tlog(TLOG_DEBUG, "%s(%llu bytes) refused: over the memory cap", api, (unsigned long long)bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* Counts `bytes`, lets the driver allocate, keeps or returns the bytes by its answer. */
#define COUNTED_ALLOC(api, bytes, call, kind, key)                                                    \
    do {                                                                                              \
        uint64_t n_ = (bytes);                                                                        \
        if (budget_reserve(n_)) return refuse(api, n_);                                               \
        CUresult r_ = (call);                                                                         \
        if (r_ == CUDA_SUCCESS) alloc_track((kind), (uint64_t)(key), n_);                             \
        else budget_release(n_);                                                                      \
        return r_;                                                                                    \
    } while (0)

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
    tessera_init();
    REAL(cuMemAlloc_v2, CUresult (*)(CUdeviceptr *, size_t));
    COUNTED_ALLOC("cuMemAlloc", bytes, real(dptr, bytes), ALLOC_PTR, *dptr);
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags) {
    tessera_init();
    REAL(cuMemAllocManaged, CUresult (*)(CUdeviceptr *, size_t, unsigned int));
    COUNTED_ALLOC("cuMemAllocManaged", bytes, real(dptr, bytes, flags), ALLOC_PTR, *dptr);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s) {
    tessera_init();
    REAL(cuMemAllocAsync, CUresult (*)(CUdeviceptr *, size_t, CUstream));
    COUNTED_ALLOC("cuMemAllocAsync", bytes, real(dptr, bytes, s), ALLOC_PTR, *dptr);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s) {
    tessera_init();
    REAL(cuMemAllocAsync_ptsz, CUresult (*)(CUdeviceptr *, size_t, CUstream));
    COUNTED_ALLOC("cuMemAllocAsync", bytes, real(dptr, bytes, s), ALLOC_PTR, *dptr);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s) {
    tessera_init();
    REAL(cuMemAllocFromPoolAsync, CUresult (*)(CUdeviceptr *, size_t, CUmemoryPool, CUstream));
    COUNTED_ALLOC("cuMemAllocFromPoolAsync", bytes, real(dptr, bytes, pool, s), ALLOC_PTR, *dptr);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s) {
    tessera_init();
    REAL(cuMemAllocFromPoolAsync_ptsz, CUresult (*)(CUdeviceptr *, size_t, CUmemoryPool, CUstream));
    COUNTED_ALLOC("cuMemAllocFromPoolAsync", bytes, real(dptr, bytes, pool, s), ALLOC_PTR, *dptr);
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                            unsigned int element_size) {
    tessera_init();
    REAL(cuMemAllocPitch_v2, CUresult (*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int));
    /* the driver picks the pitch; reserve with the widest alignment it uses, then settle */
    uint64_t row = (width + 511) & ~(uint64_t)511;
    if (height && row > UINT64_MAX / height) return refuse("cuMemAllocPitch", UINT64_MAX);
    uint64_t estimate = row * height;
    if (budget_reserve(estimate)) return refuse("cuMemAllocPitch", estimate);
    CUresult r = real(dptr, pitch, width, height, element_size);
    if (r != CUDA_SUCCESS) {
        budget_release(estimate);
        return r;
    }
    uint64_t actual = (uint64_t)*pitch * height;
    if (actual > estimate && budget_reserve(actual - estimate)) {
        CUresult (*free_fn)(CUdeviceptr) = (CUresult (*)(CUdeviceptr))real_cuda("cuMemFree_v2");
        if (free_fn) free_fn(*dptr);
        budget_release(estimate);
        return refuse("cuMemAllocPitch", actual);
    }
    if (actual < estimate) budget_release(estimate - actual);
    alloc_track(ALLOC_PTR, *dptr, actual);
    return r;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
    tessera_init();
    REAL(cuMemFree_v2, CUresult (*)(CUdeviceptr));
    CUresult r = real(dptr);
    if (r == CUDA_SUCCESS) budget_release(alloc_untrack(ALLOC_PTR, dptr));
    return r;
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) {
    tessera_init();
    REAL(cuMemFreeAsync, CUresult (*)(CUdeviceptr, CUstream));
    CUresult r = real(dptr, s);
    if (r == CUDA_SUCCESS) budget_release(alloc_untrack(ALLOC_PTR, dptr));
    return r;
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) {
    tessera_init();
    REAL(cuMemFreeAsync_ptsz, CUresult (*)(CUdeviceptr, CUstream));
    CUresult r = real(dptr, s);
    if (r == CUDA_SUCCESS) budget_release(alloc_untrack(ALLOC_PTR, dptr));
    return r;
}

/* Virtual memory management: physical memory is counted when created, returned when released. */
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags) {
    tessera_init();
    REAL(cuMemCreate, CUresult (*)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                                   unsigned long long));
    COUNTED_ALLOC("cuMemCreate", size, real(handle, size, prop, flags), ALLOC_VMM, *handle);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    tessera_init();
    REAL(cuMemRelease, CUresult (*)(CUmemGenericAllocationHandle));
    CUresult r = real(handle);
    if (r == CUDA_SUCCESS) budget_release(alloc_untrack(ALLOC_VMM, handle));
    return r;
}

static uint64_t format_bytes(CUarray_format f) {
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4;
    default: return 16;   /* formats we do not size exactly are over-counted, never under */
    }
}

static uint64_t array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch) {
    uint64_t n = (uint64_t)w * (h ? h : 1);
    n *= d ? d : 1;
    return n * format_bytes(f) * (ch ? ch : 1);
}

CUresult cuArrayCreate_v2(CUarray *handle, const CUDA_ARRAY_DESCRIPTOR *desc) {
    tessera_init();
    REAL(cuArrayCreate_v2, CUresult (*)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *));
    if (!desc) return real(handle, desc);
    uint64_t n = array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels);
    COUNTED_ALLOC("cuArrayCreate", n, real(handle, desc), ALLOC_ARRAY, (uintptr_t)*handle);
}

CUresult cuArray3DCreate_v2(CUarray *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    tessera_init();
    REAL(cuArray3DCreate_v2, CUresult (*)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *));
    if (!desc) return real(handle, desc);
    uint64_t n = array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels);
    COUNTED_ALLOC("cuArray3DCreate", n, real(handle, desc), ALLOC_ARRAY, (uintptr_t)*handle);
}

CUresult cuArrayDestroy(CUarray handle) {
    tessera_init();
    REAL(cuArrayDestroy, CUresult (*)(CUarray));
    CUresult r = real(handle);
    if (r == CUDA_SUCCESS) budget_release(alloc_untrack(ALLOC_ARRAY, (uintptr_t)handle));
    return r;
}

/* every level of a mipmapped array, each half the size of the one before in each dimension */
static uint64_t mipmap_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels) {
    uint64_t total = 0;
    size_t w = d->Width, h = d->Height, depth = d->Depth;
    for (unsigned l = 0; l < levels && l < 64; l++) {
        total += array_bytes(w, h, depth, d->Format, d->NumChannels);
        w = w > 1 ? w / 2 : w;
        h = h > 1 ? h / 2 : h;
        depth = depth > 1 ? depth / 2 : depth;
    }
    return total;
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned levels) {
    tessera_init();
    REAL(cuMipmappedArrayCreate, CUresult (*)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned));
    if (!desc) return real(handle, desc, levels);
    uint64_t n = mipmap_bytes(desc, levels);
    COUNTED_ALLOC("cuMipmappedArrayCreate", n, real(handle, desc, levels), ALLOC_ARRAY, (uintptr_t)*handle);
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray handle) {
    tessera_init();
    REAL(cuMipmappedArrayDestroy, CUresult (*)(CUmipmappedArray));
    CUresult r = real(handle);
    if (r == CUDA_SUCCESS) budget_release(alloc_untrack(ALLOC_ARRAY, (uintptr_t)handle));
    return r;
}

/* ---- what the process sees ---- */

static void share_view(uint64_t card_total, uint64_t card_free, uint64_t *total, uint64_t *free_,
                       uint64_t *used) {
    uint64_t cap = g_cfg.mem_limit;
    uint64_t t = card_total < cap ? card_total : cap;
    uint64_t u = budget_used();
    uint64_t f = u >= t ? 0 : t - u;
    if (f > card_free) f = card_free;   /* the card may be fuller than our share says */
    *total = t;
    *free_ = f;
    *used = u > t ? t : u;
}

CUresult cuMemGetInfo_v2(size_t *free_, size_t *total) {
    tessera_init();
    REAL(cuMemGetInfo_v2, CUresult (*)(size_t *, size_t *));
    size_t f = 0, t = 0;
    CUresult r = real(&f, &t);
    if (r != CUDA_SUCCESS || g_cfg.mem_limit == TESSERA_NO_LIMIT) {
        if (free_) *free_ = f;
        if (total) *total = t;
        return r;
    }
    uint64_t vt, vf, vu;
    share_view(t, f, &vt, &vf, &vu);
    if (free_) *free_ = vf;
    if (total) *total = vt;
    return r;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    tessera_init();
    REAL(cuDeviceTotalMem_v2, CUresult (*)(size_t *, CUdevice));
    CUresult r = real(bytes, dev);
    if (r == CUDA_SUCCESS && bytes && *bytes > g_cfg.mem_limit) *bytes = g_cfg.mem_limit;
    return r;
}

#define NVML_ERROR_UNINITIALIZED 1

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    tessera_init();
    nvmlReturn_t (*real)(nvmlDevice_t, nvmlMemory_t *) =
        (nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t *))real_nvml("nvmlDeviceGetMemoryInfo");
    if (!real) return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = real(device, memory);
    if (r == 0 && memory && g_cfg.mem_limit != TESSERA_NO_LIMIT) {
        uint64_t t, f, u;
        share_view(memory->total, memory->free, &t, &f, &u);
        memory->total = t;
        memory->free = f;
        memory->used = u;
    }
    return r;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    tessera_init();
    nvmlReturn_t (*real)(nvmlDevice_t, nvmlMemory_v2_t *) =
        (nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_v2_t *))real_nvml("nvmlDeviceGetMemoryInfo_v2");
    if (!real) return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = real(device, memory);
    if (r == 0 && memory && g_cfg.mem_limit != TESSERA_NO_LIMIT) {
        uint64_t t, f, u;
        share_view(memory->total, memory->free, &t, &f, &u);
        memory->total = t;
        memory->free = f;
        memory->used = u;
        memory->reserved = 0;
    }
    return r;
}
