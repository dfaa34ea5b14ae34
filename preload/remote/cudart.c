/* The remote client's CUDA runtime: a libcudart.so.13 for programs built with `nvcc -cudart shared`
 * (CUDA 13), on the remote client's libcuda.so.1.
 *
 * NVIDIA's own libcudart cannot run on a remote driver: it drives the GPU through the driver's private
 * export tables (cuGetExportTable), undocumented interfaces no forwarding library can answer. This one
 * implements the runtime entry points programs use (and those nvcc's generated code calls: fat binary
 * and kernel registration, launch configuration, __cudaLaunchKernel) on top of the remote driver API.
 * Kernels are loaded on the server from the program's own fat binary the first time one of them is
 * launched; the server learns each kernel's parameter layout (cuFuncGetParamInfo, or the cubin's
 * .nv.info), so `<<<...>>>` arguments are packed here without knowing their types.
 *
 * Runtime error codes equal the driver's for every code this library returns (both APIs number
 * them alike since CUDA 10), so a CUresult is passed on as the cudaError_t of the same value. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image.h"
#include "remote_client.h"
#include "wire.h"

/* The runtime's ABI (cudaDeviceProp's layout, the launch entry points) is the one of the headers it
 * is built against; its soname must say that major, or programs of another CUDA load the wrong one
 * (the Makefile passes the soname's major; see remote/README.md). */
#if defined(TESSERA_CUDART_SONAME_MAJOR) && CUDART_VERSION / 1000 != TESSERA_CUDART_SONAME_MAJOR
#error "libcudart.so.N must be built against CUDA N's headers: set CUDA_HOME to that toolkit"
#endif
#if CUDA_VERSION < 12080 /* older headers lack it; the client libcuda.so.1 (driver.c) exports it */
CUresult CUDAAPI cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b);
#endif

#define API __attribute__((visibility("default")))
#define U64(h) ((uint64_t)(uintptr_t)(h))

static __thread cudaError_t last_error;

static cudaError_t ret(CUresult r) {
    cudaError_t e = (cudaError_t)r;
    if (e != cudaSuccess) last_error = e;
    return e;
}

/* ---- fat binaries and kernels registered by nvcc's generated constructors ---- */
struct fatbin {
    const void *image;
    uint64_t module;
    CUresult load_result;
    int loaded;
};
struct kernel {
    const void *host_fun;
    struct fatbin *fb;
    char *name;
    struct rfunction *fn;
};
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct kernel *kernels;
static size_t nkernels, kernels_cap;

API void **__cudaRegisterFatBinary(void *wrapper) {
    struct fatbin *fb = calloc(1, sizeof *fb);
    if (!fb) return NULL;
    const int *w = wrapper;
    /* the wrapper: magic, version, then a pointer to the fat binary itself */
    fb->image = w && w[0] == FATBIN_WRAPPER_MAGIC ? *(const void *const *)((const char *)wrapper + 8) : wrapper;
    return (void **)fb;
}
API void __cudaRegisterFatBinaryEnd(void **handle) { (void)handle; }
API void __cudaUnregisterFatBinary(void **handle) { (void)handle; /* the server unloads it with the process */ }
API char __cudaInitModule(void **handle) { (void)handle; return 1; }

API void __cudaRegisterFunction(void **handle, const char *host_fun, char *device_fun, const char *device_name,
                                int thread_limit, uint3 *tid, uint3 *bid, dim3 *bdim, dim3 *gdim, int *wsize) {
    (void)device_fun; (void)thread_limit; (void)tid; (void)bid; (void)bdim; (void)gdim; (void)wsize;
    if (!handle || !host_fun || !device_name) return;
    pthread_mutex_lock(&reg_mu);
    if (nkernels == kernels_cap) {
        size_t cap = kernels_cap ? kernels_cap * 2 : 64;
        struct kernel *k = realloc(kernels, cap * sizeof *k);
        if (!k) {
            pthread_mutex_unlock(&reg_mu);
            return;
        }
        kernels = k;
        kernels_cap = cap;
    }
    kernels[nkernels++] = (struct kernel){host_fun, (struct fatbin *)handle, strdup(device_name), NULL};
    pthread_mutex_unlock(&reg_mu);
}
API void __cudaRegisterVar(void **handle, char *host_var, char *device_address, const char *device_name, int ext,
                           size_t size, int constant, int global) {
    (void)handle; (void)host_var; (void)device_address; (void)ext; (void)size; (void)constant; (void)global;
    rlog(RLOG_INFO, "__device__ variable %s: cudaMemcpyToSymbol/FromSymbol are not supported remotely", device_name);
}
API void __cudaRegisterManagedVar(void **handle, void **host_var, char *device_address, const char *device_name,
                                  int ext, size_t size, int constant, int global) {
    (void)handle; (void)host_var; (void)device_address; (void)ext; (void)size; (void)constant; (void)global;
    rlog(RLOG_WARN, "__managed__ variable %s: managed memory is not supported on a remote GPU share", device_name);
}

static struct kernel *kernel_for(const void *host_fun) {
    for (size_t i = 0; i < nkernels; i++)
        if (kernels[i].host_fun == host_fun || (const void *)&kernels[i] == host_fun) return &kernels[i];
    return NULL;
}

/* Under reg_mu: the kernel's function on the server, loading its fat binary on first use. */
static CUresult kernel_function(struct kernel *k) {
    if (k->fn) return CUDA_SUCCESS;
    struct fatbin *fb = k->fb;
    if (!fb->loaded) {
        CUmodule m;
        fb->load_result = cuModuleLoadData(&m, fb->image);
        fb->module = fb->load_result == CUDA_SUCCESS ? U64(m) : 0;
        fb->loaded = 1;
    }
    if (fb->load_result != CUDA_SUCCESS) return fb->load_result;
    CUfunction f;
    CUresult r = cuModuleGetFunction(&f, (CUmodule)(uintptr_t)fb->module, k->name);
    if (r == CUDA_SUCCESS) k->fn = (struct rfunction *)f;
    return r;
}

/* ---- launch configuration (<<<grid, block, shmem, stream>>>) ---- */
struct config {
    dim3 grid, block;
    size_t shmem;
    void *stream;
};
#define CONFIG_DEPTH 16
static __thread struct config config_stack[CONFIG_DEPTH];
static __thread int config_depth;

API unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shmem, struct CUstream_st *stream) {
    if (config_depth == CONFIG_DEPTH) return 1;
    config_stack[config_depth++] = (struct config){grid, block, shmem, stream};
    return 0;
}
API cudaError_t __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shmem, void *stream) {
    if (!config_depth) return ret(CUDA_ERROR_INVALID_VALUE);
    struct config c = config_stack[--config_depth];
    *grid = c.grid;
    *block = c.block;
    *shmem = c.shmem;
    *(void **)stream = c.stream;
    return cudaSuccess;
}

API cudaError_t __cudaGetKernel(cudaKernel_t *out, const void *host_fun) {
    pthread_mutex_lock(&reg_mu);
    struct kernel *k = kernel_for(host_fun);
    pthread_mutex_unlock(&reg_mu);
    if (!out || !k) return ret(CUDA_ERROR_INVALID_VALUE);
    *out = (cudaKernel_t)k;
    return cudaSuccess;
}

static cudaError_t launch(struct kernel *k, dim3 grid, dim3 block, void **args, size_t shmem, cudaStream_t s) {
    if (!k) {
        rlog(RLOG_ERROR, "launch of a kernel this process never registered");
        return ret(CUDA_ERROR_INVALID_VALUE);   /* cudaErrorInvalidDeviceFunction in NVIDIA's runtime */
    }
    pthread_mutex_lock(&reg_mu);
    CUresult r = kernel_function(k);
    pthread_mutex_unlock(&reg_mu);
    if (r != CUDA_SUCCESS) return ret(r);
    unsigned g[3] = {grid.x, grid.y, grid.z}, b[3] = {block.x, block.y, block.z};
    return ret(rlaunch(k->fn, g, b, (unsigned)shmem, U64(s), args, NULL));
}

API cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void **args, size_t shmem,
                                   cudaStream_t s) {
    return launch((struct kernel *)kernel, grid, block, args, shmem, s);
}
API cudaError_t r_launch_kernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void **args, size_t shmem,
                                     cudaStream_t s) __asm__("__cudaLaunchKernel_ptsz");
API cudaError_t r_launch_kernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void **args, size_t shmem,
                                     cudaStream_t s) {
    return launch((struct kernel *)kernel, grid, block, args, shmem, s ? s : cudaStreamPerThread);
}
API cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shmem, cudaStream_t s) {
    pthread_mutex_lock(&reg_mu);
    struct kernel *k = kernel_for(func);
    pthread_mutex_unlock(&reg_mu);
    return launch(k, grid, block, args, shmem, s);
}
API cudaError_t r_launch_ptsz(const void *func, dim3 grid, dim3 block, void **args, size_t shmem, cudaStream_t s)
    __asm__("cudaLaunchKernel_ptsz");
API cudaError_t r_launch_ptsz(const void *func, dim3 grid, dim3 block, void **args, size_t shmem, cudaStream_t s) {
    return cudaLaunchKernel(func, grid, block, args, shmem, s ? s : cudaStreamPerThread);
}

/* ---- device ---- */
API cudaError_t cudaGetDeviceCount(int *n) { return ret(cuDeviceGetCount(n)); }
API cudaError_t cudaSetDevice(int d) {
    CUresult r = rconnect();
    if (r) return ret(r);
    return d == 0 ? cudaSuccess : ret(CUDA_ERROR_INVALID_DEVICE);
}
API cudaError_t cudaGetDevice(int *d) {
    if (!d) return ret(CUDA_ERROR_INVALID_VALUE);
    *d = 0;
    return cudaSuccess;
}
API cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d) {
    /* the runtime's attribute numbers are the driver's */
    return ret(cuDeviceGetAttribute(v, (CUdevice_attribute)a, d));
}
API cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    if (!p) return ret(CUDA_ERROR_INVALID_VALUE);
    CUresult r = rconnect();
    if (r) return ret(r);
    if (d != 0) return ret(CUDA_ERROR_INVALID_DEVICE);
    memset(p, 0, sizeof *p);
    const struct wire_hello_rep *dev = rdevice();
    snprintf(p->name, sizeof p->name, "%s", dev->name);
    memcpy(&p->uuid, dev->uuid, sizeof p->uuid);
    p->totalGlobalMem = (size_t)dev->total_mem;
    static const struct {
        CUdevice_attribute a;
        size_t off;
    } attrs[] = {
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, offsetof(struct cudaDeviceProp, major)},
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, offsetof(struct cudaDeviceProp, minor)},
        {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, offsetof(struct cudaDeviceProp, multiProcessorCount)},
        {CU_DEVICE_ATTRIBUTE_WARP_SIZE, offsetof(struct cudaDeviceProp, warpSize)},
        {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, offsetof(struct cudaDeviceProp, maxThreadsPerBlock)},
        {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, offsetof(struct cudaDeviceProp, maxThreadsPerMultiProcessor)},
        {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, offsetof(struct cudaDeviceProp, maxThreadsDim)},
        {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, offsetof(struct cudaDeviceProp, maxThreadsDim) + sizeof(int)},
        {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, offsetof(struct cudaDeviceProp, maxThreadsDim) + 2 * sizeof(int)},
        {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, offsetof(struct cudaDeviceProp, maxGridSize)},
        {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, offsetof(struct cudaDeviceProp, maxGridSize) + sizeof(int)},
        {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, offsetof(struct cudaDeviceProp, maxGridSize) + 2 * sizeof(int)},
        {CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, offsetof(struct cudaDeviceProp, pciBusID)},
        {CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, offsetof(struct cudaDeviceProp, pciDeviceID)},
        {CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, offsetof(struct cudaDeviceProp, pciDomainID)},
    };
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        int v = 0;
        if (cuDeviceGetAttribute(&v, attrs[i].a, 0) == CUDA_SUCCESS) memcpy((char *)p + attrs[i].off, &v, sizeof v);
    }
    return cudaSuccess;
}
API cudaError_t cudaDeviceSynchronize(void) { return ret(cuCtxSynchronize()); }
API cudaError_t cudaDeviceReset(void) {
    /* what the process allocated stays until it exits (the server frees it then) */
    return ret(cuCtxSynchronize());
}
API cudaError_t cudaDriverGetVersion(int *v) { return ret(cuDriverGetVersion(v)); }
API cudaError_t cudaRuntimeGetVersion(int *v) {
    if (!v) return ret(CUDA_ERROR_INVALID_VALUE);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

/* ---- memory ---- */
static pthread_mutex_t ranges_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { uint64_t base, size; } *ranges;
static size_t nranges, ranges_cap;

static void track(uint64_t base, uint64_t size) {
    pthread_mutex_lock(&ranges_mu);
    if (nranges == ranges_cap) {
        size_t cap = ranges_cap ? ranges_cap * 2 : 256;
        void *n = realloc(ranges, cap * sizeof *ranges);
        if (n) {
            ranges = n;
            ranges_cap = cap;
        }
    }
    if (nranges < ranges_cap) {
        ranges[nranges].base = base;
        ranges[nranges++].size = size;
    }
    pthread_mutex_unlock(&ranges_mu);
}
static void untrack(uint64_t base) {
    pthread_mutex_lock(&ranges_mu);
    for (size_t i = 0; i < nranges; i++)
        if (ranges[i].base == base) {
            ranges[i] = ranges[--nranges];
            break;
        }
    pthread_mutex_unlock(&ranges_mu);
}
static int is_device(const void *p) {
    uint64_t a = U64(p);
    int found = 0;
    pthread_mutex_lock(&ranges_mu);
    for (size_t i = 0; i < nranges && !found; i++) found = a >= ranges[i].base && a - ranges[i].base < ranges[i].size;
    pthread_mutex_unlock(&ranges_mu);
    return found;
}

API cudaError_t cudaMalloc(void **p, size_t n) {
    if (!p) return ret(CUDA_ERROR_INVALID_VALUE);
    if (!n) {
        *p = NULL;
        return cudaSuccess;
    }
    CUdeviceptr d;
    CUresult r = cuMemAlloc_v2(&d, n);
    if (r) return ret(r);
    *p = (void *)(uintptr_t)d;
    track(d, n);
    return cudaSuccess;
}
API cudaError_t cudaFree(void *p) {
    if (!p) return ret(rconnect());   /* cudaFree(0): the idiom that starts the runtime */
    CUresult r = cuMemFree_v2(U64(p));
    if (!r) untrack(U64(p));
    return ret(r);
}
API cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total) { return ret(cuMemGetInfo_v2(free_b, total)); }
API cudaError_t cudaMallocHost(void **p, size_t n) { return ret(cuMemAllocHost_v2(p, n)); }
API cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags) { return ret(cuMemHostAlloc(p, n, flags)); }
API cudaError_t cudaFreeHost(void *p) { return ret(cuMemFreeHost(p)); }

static cudaError_t copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s, int async) {
    if (kind == cudaMemcpyDefault) {
        int d = is_device(dst), sd = is_device(src);
        kind = d && sd ? cudaMemcpyDeviceToDevice : d ? cudaMemcpyHostToDevice : sd ? cudaMemcpyDeviceToHost
                                                                                   : cudaMemcpyHostToHost;
    }
    switch (kind) {
    case cudaMemcpyHostToHost:
        if (n) memmove(dst, src, n);
        return cudaSuccess;
    case cudaMemcpyHostToDevice:
        return ret(rcopy_htod(U64(dst), src, n, U64(s), async));
    case cudaMemcpyDeviceToHost:
        return ret(rcopy_dtoh(dst, U64(src), n, U64(s), async));
    case cudaMemcpyDeviceToDevice:
        return ret(async ? cuMemcpyDtoDAsync_v2(U64(dst), U64(src), n, (CUstream)s)
                         : cuMemcpyDtoD_v2(U64(dst), U64(src), n));
    default:
        return ret(CUDA_ERROR_INVALID_VALUE);   /* cudaErrorInvalidMemcpyDirection in NVIDIA's runtime */
    }
}
API cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    return copy(dst, src, n, kind, NULL, 0);
}
API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s) {
    return copy(dst, src, n, kind, s, 1);
}
API cudaError_t r_memcpy_ptds(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) __asm__("cudaMemcpy_ptds");
API cudaError_t r_memcpy_ptds(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    return copy(dst, src, n, kind, cudaStreamPerThread, 0);
}
API cudaError_t r_memcpy_async_ptsz(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s)
    __asm__("cudaMemcpyAsync_ptsz");
API cudaError_t r_memcpy_async_ptsz(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s) {
    return copy(dst, src, n, kind, s ? s : cudaStreamPerThread, 1);
}
API cudaError_t cudaMemset(void *p, int v, size_t n) { return ret(cuMemsetD8_v2(U64(p), (unsigned char)v, n)); }
API cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    return ret(cuMemsetD8Async(U64(p), (unsigned char)v, n, (CUstream)s));
}

/* ---- pitched memory and 2-D copies (row by row unless the rows are contiguous) ---- */
API cudaError_t cudaMallocPitch(void **p, size_t *pitch, size_t width, size_t height) {
    if (!p || !pitch) return ret(CUDA_ERROR_INVALID_VALUE);
    size_t row = (width + 511) & ~(size_t)511;   /* the widest alignment devices ask of rows */
    if (height && row > SIZE_MAX / height) return ret(CUDA_ERROR_OUT_OF_MEMORY);
    *pitch = row;
    return cudaMalloc(p, row * height);
}
static cudaError_t copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                          enum cudaMemcpyKind kind, cudaStream_t s, int async) {
    if (width > dpitch || width > spitch) return ret(CUDA_ERROR_INVALID_VALUE);   /* cudaErrorInvalidPitchValue */
    if (dpitch == width && spitch == width) return copy(dst, src, width * height, kind, s, async);
    for (size_t r = 0; r < height; r++) {
        cudaError_t e = copy((char *)dst + r * dpitch, (const char *)src + r * spitch, width, kind, s, async);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}
API cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                             enum cudaMemcpyKind kind) {
    return copy2d(dst, dpitch, src, spitch, width, height, kind, NULL, 0);
}
API cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                  size_t height, enum cudaMemcpyKind kind, cudaStream_t s) {
    return copy2d(dst, dpitch, src, spitch, width, height, kind, s, 1);
}
API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
    if (!a) return ret(CUDA_ERROR_INVALID_VALUE);
    memset(a, 0, sizeof *a);
    if (is_device(p)) {
        a->type = cudaMemoryTypeDevice;
        a->devicePointer = (void *)p;
    } else {
        a->type = cudaMemoryTypeUnregistered;   /* host memory here is never registered with the device */
        a->device = -2;
        a->hostPointer = (void *)p;
    }
    return cudaSuccess;
}

/* ---- streams and events ---- */
API cudaError_t cudaStreamCreate(cudaStream_t *s) { return ret(cuStreamCreate((CUstream *)s, 0)); }
API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) { return ret(cuStreamCreate((CUstream *)s, flags)); }
API cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int prio) {
    return ret(cuStreamCreateWithPriority((CUstream *)s, flags, prio));
}
API cudaError_t cudaStreamDestroy(cudaStream_t s) { return ret(cuStreamDestroy_v2((CUstream)s)); }
API cudaError_t cudaStreamSynchronize(cudaStream_t s) { return ret(cuStreamSynchronize((CUstream)s)); }
API cudaError_t r_stream_sync_ptsz(cudaStream_t s) __asm__("cudaStreamSynchronize_ptsz");
API cudaError_t r_stream_sync_ptsz(cudaStream_t s) { return ret(cuStreamSynchronize((CUstream)(s ? s : cudaStreamPerThread))); }
API cudaError_t cudaStreamQuery(cudaStream_t s) { return ret(cuStreamQuery((CUstream)s)); }
API cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    return ret(cuStreamWaitEvent((CUstream)s, (CUevent)e, flags));
}
API cudaError_t cudaEventCreate(cudaEvent_t *e) { return ret(cuEventCreate((CUevent *)e, 0)); }
API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) { return ret(cuEventCreate((CUevent *)e, flags)); }
API cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { return ret(cuEventRecord((CUevent)e, (CUstream)s)); }
API cudaError_t cudaEventSynchronize(cudaEvent_t e) { return ret(cuEventSynchronize((CUevent)e)); }
API cudaError_t cudaEventQuery(cudaEvent_t e) { return ret(cuEventQuery((CUevent)e)); }
API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    return ret(cuEventElapsedTime_v2(ms, (CUevent)a, (CUevent)b));
}
API cudaError_t cudaEventDestroy(cudaEvent_t e) { return ret(cuEventDestroy_v2((CUevent)e)); }

/* ---- errors ---- */
API cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
API cudaError_t cudaPeekAtLastError(void) { return last_error; }
API const char *cudaGetErrorString(cudaError_t e) {
    const char *s = NULL;
    if (cuGetErrorString((CUresult)e, &s) == CUDA_SUCCESS && s) return s;
    return "unrecognized error code";
}
API const char *cudaGetErrorName(cudaError_t e) {
    const char *s = NULL;
    if (cuGetErrorName((CUresult)e, &s) == CUDA_SUCCESS && s) return s;
    return "cudaErrorUnknown";
}

/* ---- refused on a remote share, with a reason (README.md, "What does not work") ---- */
static cudaError_t refuse(const char *what) { return ret(rnot_supported(what)); }
/* Host functions on a stream run here, on the caller's thread, once the stream's earlier work is done:
 * later work on the stream is queued only after they return, so the order CUDA promises holds (the
 * caller waits for the stream, where CUDA would return at once). */
API cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *data) {
    if (!fn) return ret(CUDA_ERROR_INVALID_VALUE);
    cudaError_t e = cudaStreamSynchronize(s);
    if (e == cudaSuccess) fn(data);
    return e;
}
API cudaError_t cudaStreamAddCallback(cudaStream_t s, cudaStreamCallback_t cb, void *data, unsigned flags) {
    if (!cb || flags) return ret(CUDA_ERROR_INVALID_VALUE);
    cudaError_t e = cudaStreamSynchronize(s);
    cb(s, e, data);
    return cudaSuccess;
}
API cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned flags) {
    if (flags) return refuse("event record flags (cudaEventRecordExternal)");
    return cudaEventRecord(e, s);
}
/* How the host thread waits (spin, yield, block) means nothing across a network: kept, not forwarded. */
static unsigned device_flags;
API cudaError_t cudaSetDeviceFlags(unsigned flags) {
    device_flags = flags;
    return cudaSuccess;
}
API cudaError_t cudaGetDeviceFlags(unsigned *flags) {
    if (!flags) return ret(CUDA_ERROR_INVALID_VALUE);
    *flags = device_flags;
    return cudaSuccess;
}
/* A cache preference is a hint a device may ignore; attributes change what a launch may do. */
API cudaError_t cudaFuncSetCacheConfig(const void *func, enum cudaFuncCache config) {
    (void)func; (void)config;
    return cudaSuccess;
}
API cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
    (void)func; (void)attr; (void)value;
    return refuse("kernel attributes (cudaFuncSetAttribute)");
}
API cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func) {
    (void)attr; (void)func;
    return refuse("kernel attributes (cudaFuncGetAttributes)");
}

API cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p) { (void)h; (void)p; return refuse("CUDA IPC handles"); }
API cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned f) { (void)p; (void)h; (void)f; return refuse("CUDA IPC handles"); }
API cudaError_t cudaGraphCreate(cudaGraph_t *g, unsigned f) { (void)g; (void)f; return refuse("CUDA graphs"); }
API cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long f) { (void)e; (void)g; (void)f; return refuse("CUDA graphs"); }
API cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) { (void)e; (void)s; return refuse("CUDA graphs"); }
API cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode m) { (void)s; (void)m; return refuse("stream capture (CUDA graphs)"); }
API cudaError_t cudaMallocManaged(void **p, size_t n, unsigned f) { (void)p; (void)n; (void)f; return refuse("managed (unified) memory"); }
API cudaError_t cudaHostRegister(void *p, size_t n, unsigned f) { (void)p; (void)n; (void)f; return refuse("registering host memory with the device"); }
API cudaError_t cudaMemcpyToSymbol(const void *sym, const void *src, size_t n, size_t off, enum cudaMemcpyKind k) {
    (void)sym; (void)src; (void)n; (void)off; (void)k;
    return refuse("__device__ variables (cudaMemcpyToSymbol)");
}
API cudaError_t cudaMemcpyFromSymbol(void *dst, const void *sym, size_t n, size_t off, enum cudaMemcpyKind k) {
    (void)dst; (void)sym; (void)n; (void)off; (void)k;
    return refuse("__device__ variables (cudaMemcpyFromSymbol)");
}
API cudaError_t cudaLaunchCooperativeKernel(const void *f, dim3 g, dim3 b, void **a, size_t sh, cudaStream_t s) {
    (void)f; (void)g; (void)b; (void)a; (void)sh; (void)s;
    return refuse("cooperative launches");
}
static cudaError_t no_entry_point(void **fn, enum cudaDriverEntryPointQueryResult *st) {
    if (fn) *fn = NULL;
    if (st) *st = cudaDriverEntryPointSymbolNotFound;
    return refuse("driver entry points through the runtime (cudaGetDriverEntryPoint)");
}
API cudaError_t cudaGetDriverEntryPoint(const char *sym, void **fn, unsigned long long flags,
                                        enum cudaDriverEntryPointQueryResult *st) {
    (void)sym; (void)flags;
    return no_entry_point(fn, st);
}
API cudaError_t cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned v, unsigned long long flags,
                                                 enum cudaDriverEntryPointQueryResult *st) {
    (void)sym; (void)v; (void)flags;
    return no_entry_point(fn, st);
}
