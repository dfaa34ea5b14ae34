/* A fake libcuda.so.1 for tests without a GPU.
 *
 * Memory calls hand out addresses from a counter and remember what is allocated. A "kernel" sleeps
 * for the microseconds in its first parameter while holding this fake GPU's device lock (a flock on
 * $FAKE_CUDA_STATE_DIR/<FAKE_GPU_UUID>.lock), so kernels of all processes on one fake GPU run one at a
 * time and device time is measured without spinning the CPU. Linked with -Bsymbolic: the preload
 * library cannot rewrite its internals, exactly as with the real driver. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda_runtime.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t idle_cv = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t device_mu = PTHREAD_MUTEX_INITIALIZER;
static int device_fd = -1;
static uint64_t next_addr = 0x700000000000ull, allocated, busy_ns, kernels;
static int initialized;
static uint64_t launched;   /* kernels started; with `kernels` (finished), what a synchronize waits for */
static struct { int dummy; } primary_ctx, module, function;
static __thread CUcontext current;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t card_bytes(void) {
    const char *v = getenv("FAKE_GPU_MEMORY");
    return v ? strtoull(v, NULL, 10) : 16ull << 30;
}

static const char *gpu_uuid(void) {
    const char *v = getenv("FAKE_GPU_UUID");
    return v && *v ? v : "GPU-fake-0";
}

/* ---- test-only accessors ---- */
uint64_t fakeAllocatedBytes(void) {
    pthread_mutex_lock(&mu);
    uint64_t v = allocated;
    pthread_mutex_unlock(&mu);
    return v;
}
uint64_t fakeBusyNs(void) {
    pthread_mutex_lock(&mu);
    uint64_t v = busy_ns;
    pthread_mutex_unlock(&mu);
    return v;
}
uint64_t fakeKernels(void) {
    pthread_mutex_lock(&mu);
    uint64_t v = kernels;
    pthread_mutex_unlock(&mu);
    return v;
}
/* A graph whose launch runs one kernel of `us` microseconds. */
CUgraphExec fakeGraphCreate(uint64_t us) {
    uint64_t *g = malloc(sizeof *g);
    *g = us;
    return (CUgraphExec)g;
}

/* ---- device and context ---- */
CUresult cuInit(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&mu);
    initialized = 1;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}
CUresult cuDriverGetVersion(int *v) { *v = CUDA_VERSION; return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) { if (ordinal) return CUDA_ERROR_INVALID_DEVICE; *d = 0; return CUDA_SUCCESS; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return CUDA_SUCCESS; }
CUresult cuDeviceGetName(char *name, int len, CUdevice d) { (void)d; snprintf(name, (size_t)len, "Tessera Fake GPU"); return CUDA_SUCCESS; }
static CUresult fake_uuid(CUuuid *u, CUdevice d) { (void)d; memset(u, 0x42, sizeof *u); return CUDA_SUCCESS; }
CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return fake_uuid(u, d); }
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) { (void)d; *bytes = card_bytes(); return CUDA_SUCCESS; }
CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
    (void)d;
    *v = a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ? 9 : a == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT ? 132 : 1;
    return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { (void)d; *c = (CUcontext)&primary_ctx; return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { (void)d; return CUDA_SUCCESS; }
CUresult cuCtxGetCurrent(CUcontext *c) { *c = current; return CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext c) { current = c; return CUDA_SUCCESS; }
CUresult cuCtxPushCurrent_v2(CUcontext c) { current = c; return CUDA_SUCCESS; }
CUresult cuCtxPopCurrent_v2(CUcontext *c) { if (c) *c = current; current = NULL; return CUDA_SUCCESS; }
CUresult cuCtxSynchronize(void) {
    pthread_mutex_lock(&mu);
    /* as the real driver: wait for the work queued before this call, not for an idle device (a thread
     * launching back to back would otherwise keep a synchronizing thread waiting forever) */
    uint64_t target = launched;
    while (kernels < target) pthread_cond_wait(&idle_cv, &mu);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}
CUresult cuStreamSynchronize(CUstream s) { (void)s; return cuCtxSynchronize(); }
CUresult cuModuleLoadData(CUmodule *m, const void *image) { (void)image; *m = (CUmodule)&module; return CUDA_SUCCESS; }
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) { (void)m; (void)name; *f = (CUfunction)&function; return CUDA_SUCCESS; }
CUresult cuGetErrorString(CUresult e, const char **s) { *s = e == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory" : "fake error"; return CUDA_SUCCESS; }
CUresult cuGetErrorName(CUresult e, const char **s) { *s = e == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_FAKE"; return CUDA_SUCCESS; }
CUresult cuGetExportTable(const void **table, const CUuuid *id) { return fake_export_table(table, id); }

/* ---- memory ---- */
/* Memory is backed by host pages reserved without commitment (MAP_NORESERVE), so copies in and out
 * of the fake device keep their bytes (the remote GPU tests check them) while a test may still
 * "allocate" far more than the machine has. Where the kernel refuses such a reservation, addresses come
 * from a counter and the memory has no backing (copies to it are refused). */
static __thread int last_backed;   /* fake_alloc → remember, on the allocating thread */
static CUresult fake_alloc(CUdeviceptr *p, uint64_t bytes) {
    if (!p || !bytes) return CUDA_ERROR_INVALID_VALUE;
    last_backed = 0;
    pthread_mutex_lock(&mu);
    if (allocated + bytes > card_bytes()) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    allocated += bytes;
    pthread_mutex_unlock(&mu);
    void *backing = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (backing != MAP_FAILED) {
        *p = (CUdeviceptr)(uintptr_t)backing;
        last_backed = 1;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&mu);
    *p = next_addr;
    next_addr += (bytes + 0xfffff) & ~0xfffffull;
    pthread_mutex_unlock(&mu);
    /* the size travels in a side table keyed by address */
    return CUDA_SUCCESS;
}

#define MAX_LIVE 65536
static struct { uint64_t key, size; int backed; } live[MAX_LIVE];
static int live_top;   /* slots at or above this were never used */
static void remember(uint64_t key, uint64_t size) {
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_LIVE; i++)
        if (!live[i].key) {
            live[i].key = key;
            live[i].size = size;
            live[i].backed = last_backed;
            if (i >= live_top) live_top = i + 1;
            break;
        }
    pthread_mutex_unlock(&mu);
}
static CUresult forget(uint64_t key) {
    pthread_mutex_lock(&mu);
    for (int i = 0; i < live_top; i++)
        if (live[i].key == key) {
            uint64_t size = live[i].size;
            int was_backed = live[i].backed;
            allocated -= size;
            live[i].key = 0;
            pthread_mutex_unlock(&mu);
            if (was_backed) munmap((void *)(uintptr_t)key, size);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&mu);
    return CUDA_ERROR_INVALID_VALUE;
}
/* The host address behind [addr, addr + len) of fake device memory, or NULL when the range is not
 * inside one live, backed allocation (for fake_cuda_copy.c). */
void *fake_device_range(uint64_t addr, uint64_t len) {
    void *out = NULL;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < live_top; i++)
        if (live[i].key && addr >= live[i].key && addr - live[i].key <= live[i].size &&
            len <= live[i].size - (addr - live[i].key)) {
            if (live[i].backed) out = (void *)(uintptr_t)addr;
            break;
        }
    pthread_mutex_unlock(&mu);
    return out;
}
static CUresult alloc_and_remember(CUdeviceptr *p, uint64_t bytes) {
    CUresult r = fake_alloc(p, bytes);
    if (r == CUDA_SUCCESS) remember(*p, bytes);
    return r;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return alloc_and_remember(p, n); }
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned f) { (void)f; return alloc_and_remember(p, n); }
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { (void)s; return alloc_and_remember(p, n); }
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) { (void)s; return alloc_and_remember(p, n); }
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) { (void)pool; (void)s; return alloc_and_remember(p, n); }
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) { (void)pool; (void)s; return alloc_and_remember(p, n); }
CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned e) {
    (void)e;
    *pitch = (w + 255) & ~(size_t)255;
    return alloc_and_remember(p, (uint64_t)*pitch * h);
}
CUresult cuMemFree_v2(CUdeviceptr p) { return forget(p); }
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; return forget(p); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { (void)s; return forget(p); }
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *prop, unsigned long long f) {
    (void)prop; (void)f;
    CUdeviceptr p;
    CUresult r = alloc_and_remember(&p, n);
    if (r == CUDA_SUCCESS) *h = p;
    return r;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return forget(h); }
CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d) {
    CUdeviceptr p;
    CUresult r = alloc_and_remember(&p, (uint64_t)d->Width * (d->Height ? d->Height : 1) * 4 * d->NumChannels);
    if (r == CUDA_SUCCESS) *a = (CUarray)p;
    return r;
}
CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    CUdeviceptr p;
    uint64_t n = (uint64_t)d->Width * (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1) * 4 * d->NumChannels;
    CUresult r = alloc_and_remember(&p, n);
    if (r == CUDA_SUCCESS) *a = (CUarray)p;
    return r;
}
CUresult cuArrayDestroy(CUarray a) { return forget((uint64_t)a); }
CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels) {
    CUdeviceptr p;
    uint64_t n = 0, w = d->Width, h = d->Height ? d->Height : 1, depth = d->Depth ? d->Depth : 1;
    for (unsigned l = 0; l < levels; l++, w = w > 1 ? w / 2 : 1, h = h > 1 ? h / 2 : 1, depth = depth > 1 ? depth / 2 : 1)
        n += w * h * depth * 4 * d->NumChannels;
    CUresult r = alloc_and_remember(&p, n);
    if (r == CUDA_SUCCESS) *m = (CUmipmappedArray)p;
    return r;
}
CUresult cuMipmappedArrayDestroy(CUmipmappedArray m) { return forget((uint64_t)m); }
CUresult cuMemGetInfo_v2(size_t *free_, size_t *total) {
    pthread_mutex_lock(&mu);
    *total = card_bytes();
    *free_ = *total - allocated;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

/* ---- kernels ---- */
static int open_device(void) {
    if (device_fd >= 0) return device_fd;
    const char *dir = getenv("FAKE_CUDA_STATE_DIR");
    char path[512];
    snprintf(path, sizeof path, "%s/%s.lock", dir && *dir ? dir : "/tmp", gpu_uuid());
    device_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    return device_fd;
}

static CUresult run_kernel(void **params) {
    if (!params) return CUDA_SUCCESS;   /* an empty kernel: returns at once (overhead benchmarks) */
    uint64_t us = params && params[0] ? *(uint64_t *)params[0] : 0;
    pthread_mutex_lock(&mu);
    launched++;
    pthread_mutex_unlock(&mu);
    pthread_mutex_lock(&device_mu);
    int fd = open_device();
    if (fd >= 0) while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {}
    uint64_t t0 = now_ns();
    struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    uint64_t t1 = now_ns();
    if (fd >= 0) flock(fd, LOCK_UN);
    pthread_mutex_unlock(&device_mu);
    pthread_mutex_lock(&mu);
    busy_ns += t1 - t0;
    kernels++;
    pthread_cond_broadcast(&idle_cv);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned sh, CUstream s, void **params, void **extra) {
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)sh; (void)s; (void)extra;
    return run_kernel(params);
}
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, unsigned sh, CUstream s, void **params, void **extra) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, sh, s, params, extra);
}
CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    (void)c; (void)f; (void)extra;
    return run_kernel(params);
}
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    return cuLaunchKernelEx(c, f, params, extra);
}
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                   unsigned bz, unsigned sh, CUstream s, void **params) {
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)sh; (void)s;
    return run_kernel(params);
}
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                        unsigned by, unsigned bz, unsigned sh, CUstream s, void **params) {
    return cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, sh, s, params);
}
CUresult cuGraphLaunch(CUgraphExec g, CUstream s) {
    (void)s;
    uint64_t us = g ? *(uint64_t *)g : 0;
    void *params[] = {&us};
    return run_kernel(params);
}
CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { return cuGraphLaunch(g, s); }

/* ---- cuGetProcAddress: a static table, as the real driver has ---- */
CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
CUresult fake_gpa_v1(const char *, void **, int, cuuint64_t) __asm__("cuGetProcAddress");

#define E(n) {#n, (void *)&n}
static const struct { const char *name; void *fn; } table[] = {
    E(cuInit), E(cuDriverGetVersion), E(cuDeviceGet), E(cuDeviceGetCount), E(cuDeviceGetName),
    E(cuCtxGetDevice), E(cuCtxGetApiVersion), E(cuModuleGetLoadingMode),
    E(cuDeviceGetUuid_v2), E(cuDeviceTotalMem_v2), E(cuDeviceGetAttribute),
    E(cuDevicePrimaryCtxRetain), E(cuDevicePrimaryCtxRelease_v2), E(cuCtxGetCurrent), E(cuCtxSetCurrent),
    E(cuCtxPushCurrent_v2), E(cuCtxPopCurrent_v2), E(cuCtxSynchronize), E(cuStreamSynchronize),
    E(cuModuleLoadData), E(cuModuleGetFunction), E(cuGetErrorString), E(cuGetErrorName), E(cuGetExportTable),
    E(cuMemAlloc_v2), E(cuMemAllocManaged), E(cuMemAllocAsync), E(cuMemAllocAsync_ptsz),
    E(cuMemAllocFromPoolAsync), E(cuMemAllocFromPoolAsync_ptsz), E(cuMemAllocPitch_v2), E(cuMemFree_v2),
    E(cuMemFreeAsync), E(cuMemFreeAsync_ptsz), E(cuMemCreate), E(cuMemRelease), E(cuArrayCreate_v2),
    E(cuArray3DCreate_v2), E(cuArrayDestroy), E(cuMipmappedArrayCreate), E(cuMipmappedArrayDestroy), E(cuMemGetInfo_v2), E(cuLaunchKernel), E(cuLaunchKernel_ptsz),
    E(cuLaunchKernelEx), E(cuLaunchKernelEx_ptsz), E(cuLaunchCooperativeKernel),
    E(cuLaunchCooperativeKernel_ptsz), E(cuGraphLaunch), E(cuGraphLaunch_ptsz), E(cuGetProcAddress_v2),
    {"cuGetProcAddress", (void *)&fake_gpa_v1}, {NULL, NULL},
};

/* With FAKE_GPA_ALIASES=1, cuGetProcAddress hands out internal entry points (other addresses than
 * the exported symbols), as a driver may. */
static CUresult alias_alloc(CUdeviceptr *p, size_t n) { return alloc_and_remember(p, n); }
static CUresult alias_alloc_async_ptsz(CUdeviceptr *p, size_t n, CUstream s) { (void)s; return alloc_and_remember(p, n); }
static CUresult alias_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, unsigned sh, CUstream s, void **params, void **extra) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, sh, s, params, extra);
}
static const struct { const char *name; void *fn; } aliases[] = {
    {"cuMemAlloc_v2", (void *)&alias_alloc}, {"cuMemAllocAsync_ptsz", (void *)&alias_alloc_async_ptsz},
    {"cuLaunchKernel", (void *)&alias_launch}, {NULL, NULL},
};

static void *find(const char *name) {
    const char *use_aliases = getenv("FAKE_GPA_ALIASES");
    if (use_aliases && *use_aliases == '1')
        for (int i = 0; aliases[i].name; i++)
            if (!strcmp(aliases[i].name, name)) return aliases[i].fn;
    for (int i = 0; table[i].name; i++)
        if (!strcmp(table[i].name, name)) return table[i].fn;
    return NULL;
}

static void *lookup(const char *sym, int version, cuuint64_t flags) {
    char buf[160];
    void *fn = NULL;
    if (strlen(sym) > 100) return NULL;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        snprintf(buf, sizeof buf, "%s_ptsz", sym);
        fn = find(buf);
    }
    if (!fn && !strcmp(sym, "cuGetProcAddress") && version >= 12000) fn = find("cuGetProcAddress_v2");
    if (!fn && version >= 3020) {
        snprintf(buf, sizeof buf, "%s_v2", sym);
        fn = find(buf);
    }
    if (!fn) fn = find(sym);
    /* Any other driver name resolves (the CUDA runtime insists), to an entry point that says
     * "not supported"; names outside the driver's API are not found. */
    if (!fn && !strncmp(sym, "cu", 2)) fn = (void *)&fake_unimplemented;
    return fn;
}

CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
    if (!sym || !pfn) return CUDA_ERROR_INVALID_VALUE;
    *pfn = lookup(sym, version, flags);
    if (status) *status = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult fake_gpa_v1(const char *sym, void **pfn, int version, cuuint64_t flags) {
    return cuGetProcAddress_v2(sym, pfn, version, flags, NULL);
}
