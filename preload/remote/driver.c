/* Driver API entry points of the remote client libcuda.so.1 (see client.c for how calls travel).
 * One device (the share's GPU), one context per process: contexts are bookkeeping here, the
 * server's worker holds the real one. Names the server cannot serve answer CUDA_ERROR_NOT_SUPPORTED
 * with a message, never a crash. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image.h"
#include "remote_client.h"
#include "wire.h"

#define API __attribute__((visibility("default")))
#define U64(h) ((uint64_t)(uintptr_t)(h))

static struct { int dummy; } the_context;
static __thread CUcontext current;

static CUresult ready(void) { return rconnect(); }

/* ---- initialization, device ---- */
API CUresult cuInit(unsigned flags) {
    if (flags) return CUDA_ERROR_INVALID_VALUE;
    return ready();
}
API CUresult cuDriverGetVersion(int *v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = CUDA_VERSION;
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetCount(int *n) {
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = ready();
    *n = r == CUDA_SUCCESS ? 1 : 0;
    return r;
}
API CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    CUresult r = ready();
    if (r) return r;
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *d = 0;
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    CUresult r = ready();
    if (r) return r;
    if (!name || len <= 0 || d != 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", rdevice()->name);
    return CUDA_SUCCESS;
}
API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    CUresult r = ready();
    if (r) return r;
    if (!bytes || d != 0) return CUDA_ERROR_INVALID_VALUE;
    *bytes = (size_t)rdevice()->total_mem;
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) {
    CUresult r = ready();
    if (r) return r;
    if (!u || d != 0) return CUDA_ERROR_INVALID_VALUE;
    memcpy(u->bytes, rdevice()->uuid, 16);
    return CUDA_SUCCESS;
}
API CUresult r_uuid_v1(CUuuid *u, CUdevice d) __asm__("cuDeviceGetUuid");
API CUresult r_uuid_v1(CUuuid *u, CUdevice d) { return cuDeviceGetUuid_v2(u, d); }

#define ATTR_CACHE 512
static int attr_cache[ATTR_CACHE];
static unsigned char attr_known[ATTR_CACHE];
static pthread_mutex_t attr_mu = PTHREAD_MUTEX_INITIALIZER;

API CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
    if (!v || d != 0) return CUDA_ERROR_INVALID_VALUE;
    int idx = (int)a;
    if (idx >= 0 && idx < ATTR_CACHE) {
        pthread_mutex_lock(&attr_mu);
        int known = attr_known[idx], val = attr_cache[idx];
        pthread_mutex_unlock(&attr_mu);
        if (known) {
            *v = val;
            return CUDA_SUCCESS;
        }
    }
    int32_t arg = idx, out = 0;
    uint32_t got = 0;
    CUresult r = rcall(OP_DEVICE_ATTR, &arg, sizeof arg, &out, sizeof out, &got);
    if (r) return r;
    *v = out;
    if (idx >= 0 && idx < ATTR_CACHE) {   /* attributes of a device do not change */
        pthread_mutex_lock(&attr_mu);
        attr_cache[idx] = out;
        attr_known[idx] = 1;
        pthread_mutex_unlock(&attr_mu);
    }
    return CUDA_SUCCESS;
}
API CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice d) {
    CUresult r = cuDeviceGetAttribute(major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d);
    return r ? r : cuDeviceGetAttribute(minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d);
}

/* ---- contexts ---- */
API CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    CUresult r = ready();
    if (r) return r;
    if (!c || d != 0) return CUDA_ERROR_INVALID_VALUE;
    *c = (CUcontext)&the_context;
    return CUDA_SUCCESS;
}
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return d == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE; }
API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned flags) { (void)flags; return d == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE; }
API CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned *flags, int *active) {
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (flags) *flags = 0;
    if (active) *active = 1;
    return CUDA_SUCCESS;
}
API CUresult cuCtxCreate_v4(CUcontext *c, CUctxCreateParams *p, unsigned flags, CUdevice d) {
    (void)flags;
    if (p && (p->execAffinityParams || p->cigParams)) return rnot_supported("cuCtxCreate with affinity or CIG parameters");
    CUresult r = cuDevicePrimaryCtxRetain(c, d);
    if (!r) current = *c;
    return r;
}
API CUresult r_ctx_create_v2(CUcontext *c, unsigned flags, CUdevice d) __asm__("cuCtxCreate_v2");
API CUresult r_ctx_create_v2(CUcontext *c, unsigned flags, CUdevice d) { return cuCtxCreate_v4(c, NULL, flags, d); }
API CUresult cuCtxDestroy_v2(CUcontext c) {
    if (c != (CUcontext)&the_context) return CUDA_ERROR_INVALID_CONTEXT;
    if (current == c) current = NULL;
    return CUDA_SUCCESS;
}
API CUresult cuCtxGetCurrent(CUcontext *c) {
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    *c = current;
    return CUDA_SUCCESS;
}
API CUresult cuCtxSetCurrent(CUcontext c) {
    if (c && c != (CUcontext)&the_context) return CUDA_ERROR_INVALID_CONTEXT;
    current = c;
    return CUDA_SUCCESS;
}
API CUresult cuCtxPushCurrent_v2(CUcontext c) { return cuCtxSetCurrent(c); }
API CUresult cuCtxPopCurrent_v2(CUcontext *c) {
    if (c) *c = current;
    current = NULL;
    return CUDA_SUCCESS;
}
API CUresult cuCtxGetDevice(CUdevice *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    *d = 0;
    return CUDA_SUCCESS;
}
API CUresult cuCtxSynchronize(void) { return rcall_sync(OP_CTX_SYNC, NULL, 0); }
API CUresult cuCtxGetApiVersion(CUcontext c, unsigned *v) {
    (void)c;
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = 3020;
    return CUDA_SUCCESS;
}

/* ---- memory ---- */
API CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total) {
    struct wire_u64x2 o = {0, 0};
    uint32_t got = 0;
    CUresult r = rcall(OP_MEM_GET_INFO, NULL, 0, &o, sizeof o, &got);
    if (r) return r;
    if (free_b) *free_b = (size_t)o.a;
    if (total) *total = (size_t)o.b;
    return CUDA_SUCCESS;
}
API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    uint64_t n = bytes, out = 0;
    uint32_t got = 0;
    CUresult r = rcall(OP_MEM_ALLOC, &n, sizeof n, &out, sizeof out, &got);
    if (r == CUDA_SUCCESS) *p = (CUdeviceptr)out;
    return r;
}
API CUresult cuMemFree_v2(CUdeviceptr p) {
    if (!p) return CUDA_SUCCESS;
    uint64_t a = p;
    return rcall(OP_MEM_FREE, &a, sizeof a, NULL, 0, NULL);
}
API CUresult cuMemAllocHost_v2(void **p, size_t n) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    *p = malloc(n ? n : 1);   /* host memory stays on this node: nothing to pin here */
    return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
API CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags) {
    if (flags & CU_MEMHOSTALLOC_DEVICEMAP) return rnot_supported("mapped host memory (CU_MEMHOSTALLOC_DEVICEMAP)");
    return cuMemAllocHost_v2(p, n);
}
API CUresult cuMemFreeHost(void *p) {
    free(p);
    return CUDA_SUCCESS;
}
API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) { return rcopy_htod(dst, src, n, 0, 0); }
API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { return rcopy_dtoh(dst, src, n, 0, 0); }
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    return rcopy_htod(dst, src, n, U64(s), 1);
}
API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    return rcopy_dtoh(dst, src, n, U64(s), 1);
}
static CUresult dtod(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s, int async) {
    if (!n) return CUDA_SUCCESS;
    struct wire_memcpy a = {dst, src, n, U64(s), (uint32_t)async, 0};
    return rcall(OP_MEMCPY_DTOD, &a, sizeof a, NULL, 0, NULL);
}
API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) { return dtod(dst, src, n, NULL, 0); }
API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) { return dtod(dst, src, n, s, 1); }
static CUresult memset_op(uint32_t op, CUdeviceptr dst, unsigned value, size_t count, CUstream s, int async) {
    if (!count) return CUDA_SUCCESS;
    struct wire_memset a = {dst, count, U64(s), value, (uint32_t)async};
    return rcall(op, &a, sizeof a, NULL, 0, NULL);
}
API CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { return memset_op(OP_MEMSET_D8, d, v, n, NULL, 0); }
API CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned v, size_t n) { return memset_op(OP_MEMSET_D32, d, v, n, NULL, 0); }
API CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { return memset_op(OP_MEMSET_D8, d, v, n, s, 1); }
API CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, CUstream s) { return memset_op(OP_MEMSET_D32, d, v, n, s, 1); }

/* ---- modules and launches ---- */
struct rmod {
    uint64_t handle;
};
API CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    if (!m || !image) return CUDA_ERROR_INVALID_VALUE;
    const void *data = image;
    /* a fat binary wrapper (what the compiler emits for the runtime) points at the fat binary */
    if (*(const int *)image == FATBIN_WRAPPER_MAGIC) data = *(const void *const *)((const char *)image + 8);
    uint64_t handle = 0;
    CUresult r = rmodule_load(data, image_size(data), &handle);
    if (r) return r;
    struct rmod *rm = malloc(sizeof *rm);
    if (!rm) return CUDA_ERROR_OUT_OF_MEMORY;
    rm->handle = handle;
    *m = (CUmodule)rm;
    return CUDA_SUCCESS;
}
API CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, CUjit_option *o, void **v) {
    (void)n; (void)o; (void)v;   /* JIT options tune the server's compiler; they are not forwarded */
    return cuModuleLoadData(m, image);
}
API CUresult cuModuleLoadFatBinary(CUmodule *m, const void *fatbin) { return cuModuleLoadData(m, fatbin); }
API CUresult cuModuleLoad(CUmodule *m, const char *path) {
    if (!m || !path) return CUDA_ERROR_INVALID_VALUE;
    FILE *f = fopen(path, "rb");
    if (!f) return CUDA_ERROR_FILE_NOT_FOUND;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (size <= 0 || (uint64_t)size > WIRE_MAX_MODULE) {
        fclose(f);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    char *buf = calloc(1, (size_t)size + 1);
    size_t got = buf ? fread(buf, 1, (size_t)size, f) : 0;
    fclose(f);
    CUresult r = got == (size_t)size ? cuModuleLoadData(m, buf) : CUDA_ERROR_FILE_NOT_FOUND;
    free(buf);
    return r;
}
API CUresult cuModuleUnload(CUmodule m) {
    if (!m) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t h = ((struct rmod *)m)->handle;
    CUresult r = rcall(OP_MODULE_UNLOAD, &h, sizeof h, NULL, 0, NULL);
    if (!r) free(m);
    return r;
}
API CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    if (!f || !m || !name) return CUDA_ERROR_INVALID_VALUE;
    CUresult r;
    struct rfunction *fn = rfunction_get(((struct rmod *)m)->handle, name, &r);
    if (!fn) return r;
    *f = (CUfunction)fn;
    return CUDA_SUCCESS;
}
API CUresult cuFuncGetParamInfo(CUfunction f, size_t i, size_t *off, size_t *size) {
    const struct rfunction *fn = (const struct rfunction *)f;
    if (!fn || !off || !size) return CUDA_ERROR_INVALID_VALUE;
    if (fn->nparams == WIRE_PARAMS_UNKNOWN) return CUDA_ERROR_NOT_SUPPORTED;
    if (i >= fn->nparams) return CUDA_ERROR_INVALID_VALUE;
    *off = fn->params[i].offset;
    *size = fn->params[i].size;
    return CUDA_SUCCESS;
}
API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                            unsigned bz, unsigned shmem, CUstream s, void **params, void **extra) {
    unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    return rlaunch((const struct rfunction *)f, grid, block, shmem, U64(s), params, extra);
}

/* ---- streams and events ---- */
API CUresult cuStreamCreateWithPriority(CUstream *s, unsigned flags, int priority) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    uint32_t a[2] = {flags, (uint32_t)priority};
    uint64_t h = 0;
    uint32_t got = 0;
    CUresult r = rcall(OP_STREAM_CREATE, a, sizeof a, &h, sizeof h, &got);
    if (!r) *s = (CUstream)(uintptr_t)h;
    return r;
}
API CUresult cuStreamCreate(CUstream *s, unsigned flags) { return cuStreamCreateWithPriority(s, flags, 0); }
API CUresult cuStreamDestroy_v2(CUstream s) {
    uint64_t h = U64(s);
    return rcall(OP_STREAM_DESTROY, &h, sizeof h, NULL, 0, NULL);
}
API CUresult cuStreamSynchronize(CUstream s) {
    uint64_t h = U64(s);
    return rcall_sync(OP_STREAM_SYNC, &h, sizeof h);
}
API CUresult cuStreamQuery(CUstream s) {
    uint64_t h = U64(s);
    return rcall(OP_STREAM_QUERY, &h, sizeof h, NULL, 0, NULL);
}
API CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags) {
    (void)flags;
    struct wire_u64x2 a = {U64(s), U64(e)};
    return rcall(OP_STREAM_WAIT_EVENT, &a, sizeof a, NULL, 0, NULL);
}
API CUresult cuEventCreate(CUevent *e, unsigned flags) {
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    uint32_t f = flags;
    uint64_t h = 0;
    uint32_t got = 0;
    CUresult r = rcall(OP_EVENT_CREATE, &f, sizeof f, &h, sizeof h, &got);
    if (!r) *e = (CUevent)(uintptr_t)h;
    return r;
}
API CUresult cuEventDestroy_v2(CUevent e) {
    uint64_t h = U64(e);
    return rcall(OP_EVENT_DESTROY, &h, sizeof h, NULL, 0, NULL);
}
API CUresult cuEventRecord(CUevent e, CUstream s) {
    struct wire_u64x2 a = {U64(e), U64(s)};
    return rcall(OP_EVENT_RECORD, &a, sizeof a, NULL, 0, NULL);
}
API CUresult cuEventSynchronize(CUevent e) {
    uint64_t h = U64(e);
    return rcall_sync(OP_EVENT_SYNC, &h, sizeof h);
}
API CUresult cuEventQuery(CUevent e) {
    uint64_t h = U64(e);
    return rcall(OP_EVENT_QUERY, &h, sizeof h, NULL, 0, NULL);
}
API CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) {
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    struct wire_u64x2 arg = {U64(a), U64(b)};
    float out = 0;
    uint32_t got = 0;
    CUresult r = rcall(OP_EVENT_ELAPSED, &arg, sizeof arg, &out, sizeof out, &got);
    if (!r) *ms = out;
    return r;
}
API CUresult r_elapsed_v1(float *ms, CUevent a, CUevent b) __asm__("cuEventElapsedTime");
API CUresult r_elapsed_v1(float *ms, CUevent a, CUevent b) { return cuEventElapsedTime_v2(ms, a, b); }

/* ---- errors ---- */
static const struct {
    CUresult code;
    const char *name, *text;
} errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected (no remote GPU server reached)"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE", "the remote GPU server was lost"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted (share token refused)"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported on a remote GPU share"},
    {CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};
API CUresult cuGetErrorString(CUresult e, const char **s) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == e) {
            *s = errors[i].text;
            return CUDA_SUCCESS;
        }
    *s = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}
API CUresult cuGetErrorName(CUresult e, const char **s) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == e) {
            *s = errors[i].name;
            return CUDA_SUCCESS;
        }
    *s = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- what a remote share refuses ---- */
API CUresult cuGetExportTable(const void **table, const CUuuid *id) {
    (void)table; (void)id;
    return rnot_supported("the driver's private export tables (cuGetExportTable: NVIDIA's libcudart and other "
                          "closed libraries; use the remote libcudart instead)");
}
API CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) { (void)h; (void)p; return rnot_supported("CUDA IPC handles"); }
API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned f) { (void)p; (void)h; (void)f; return rnot_supported("CUDA IPC handles"); }
API CUresult cuIpcGetEventHandle(CUipcEventHandle *h, CUevent e) { (void)h; (void)e; return rnot_supported("CUDA IPC handles"); }
API CUresult cuGraphCreate(CUgraph *g, unsigned f) { (void)g; (void)f; return rnot_supported("CUDA graphs"); }
API CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { (void)g; (void)s; return rnot_supported("CUDA graphs"); }
API CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode m) { (void)s; (void)m; return rnot_supported("stream capture (CUDA graphs)"); }
API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned f) { (void)p; (void)n; (void)f; return rnot_supported("managed (unified) memory"); }
API CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned f) { (void)p; (void)n; (void)f; return rnot_supported("registering host memory with the device"); }
API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                       unsigned bz, unsigned sh, CUstream s, void **p) {
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)sh; (void)s; (void)p;
    return rnot_supported("cooperative launches");
}

/* cuGetProcAddress hands out this library's own entry points; anything else is not found (and the
 * caller is told), so a program never calls into a driver that is not there. */
static void *self_symbol(const char *name) {
    static void *self;
    if (!self) {
        Dl_info info;
        if (dladdr((void *)&cuInit, &info)) self = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    }
    return self ? dlsym(self, name) : NULL;
}
API CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int version, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status) {
    (void)flags;
    if (!sym || !pfn) return CUDA_ERROR_INVALID_VALUE;
    char buf[200];
    *pfn = NULL;
    if (strlen(sym) < 150) {
        for (int v = 4; v >= 2 && !*pfn; v--) {
            snprintf(buf, sizeof buf, "%s_v%d", sym, v);
            if (version >= 3020) *pfn = self_symbol(buf);
        }
        if (!*pfn) *pfn = self_symbol(sym);
    }
    if (status) *status = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (!*pfn) rlog(RLOG_INFO, "cuGetProcAddress(%s): not available on a remote GPU share", sym);
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
API CUresult r_gpa_v1(const char *, void **, int, cuuint64_t) __asm__("cuGetProcAddress");
API CUresult r_gpa_v1(const char *sym, void **pfn, int version, cuuint64_t flags) {
    return cuGetProcAddress_v2(sym, pfn, version, flags, NULL);
}
