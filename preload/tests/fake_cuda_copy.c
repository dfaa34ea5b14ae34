/* The part of the fake libcuda.so.1 that the remote GPU server needs beyond allocation and launch:
 * copies in, out and within fake device memory (backed by host pages, see fake_alloc), memset,
 * streams and events. The fake device runs everything at once, in call order, so streams only have
 * to exist and an event records the moment its call was made. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void *fake_device_range(uint64_t addr, uint64_t len);

static void *dev(CUdeviceptr p, size_t n) { return n ? fake_device_range((uint64_t)p, (uint64_t)n) : (void *)1; }

/* FAKE_COPY_DELAY_US: every copy between host and device takes that much longer (a slow bus), so a
 * test can act while a copy is under way. */
static void bus_delay(void) {
    const char *v = getenv("FAKE_COPY_DELAY_US");
    long us = v ? atol(v) : 0;
    if (us > 0) {
        struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    void *d = dev(dst, n);
    if (!d || (!src && n)) return CUDA_ERROR_INVALID_VALUE;
    bus_delay();
    if (n) memcpy(d, src, n);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    void *s = dev(src, n);
    if (!s || (!dst && n)) return CUDA_ERROR_INVALID_VALUE;
    bus_delay();
    if (n) memcpy(dst, s, n);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    void *d = dev(dst, n), *s = dev(src, n);
    if (!d || !s) return CUDA_ERROR_INVALID_VALUE;
    if (n) memmove(d, s, n);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    (void)s;
    return cuMemcpyHtoD_v2(dst, src, n);
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    (void)s;
    return cuMemcpyDtoH_v2(dst, src, n);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    (void)s;
    return cuMemcpyDtoD_v2(dst, src, n);
}
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
    void *d = dev(dst, n);
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    if (n) memset(d, v, n);
    return CUDA_SUCCESS;
}
CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int v, size_t n) {
    if (n > SIZE_MAX / 4) return CUDA_ERROR_INVALID_VALUE;
    unsigned int *d = dev(dst, n * 4);
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < n; i++) d[i] = v;
    return CUDA_SUCCESS;
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) { (void)s; return cuMemsetD8_v2(dst, v, n); }
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s) { (void)s; return cuMemsetD32_v2(dst, v, n); }
CUresult cuMemAllocHost_v2(void **p, size_t n) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    *p = malloc(n ? n : 1);
    return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult cuMemFreeHost(void *p) { free(p); return CUDA_SUCCESS; }

/* ---- streams and events ---- */
struct fake_stream { int magic; };
struct fake_event { int magic, recorded; uint64_t ns; };
#define STREAM_MAGIC 0x57524d31
#define EVENT_MAGIC 0x45564e54

CUresult cuStreamCreate(CUstream *s, unsigned flags) {
    (void)flags;
    struct fake_stream *f = malloc(sizeof *f);
    if (!s || !f) { free(f); return CUDA_ERROR_INVALID_VALUE; }
    f->magic = STREAM_MAGIC;
    *s = (CUstream)f;
    return CUDA_SUCCESS;
}
CUresult cuStreamCreateWithPriority(CUstream *s, unsigned flags, int priority) { (void)priority; return cuStreamCreate(s, flags); }
CUresult cuStreamDestroy_v2(CUstream s) {
    struct fake_stream *f = (struct fake_stream *)s;
    if (!f || f->magic != STREAM_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    f->magic = 0;
    free(f);
    return CUDA_SUCCESS;
}
CUresult cuStreamQuery(CUstream s) { (void)s; return CUDA_SUCCESS; }
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags) { (void)s; (void)e; (void)flags; return CUDA_SUCCESS; }

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
CUresult cuEventCreate(CUevent *e, unsigned flags) {
    (void)flags;
    struct fake_event *f = calloc(1, sizeof *f);
    if (!e || !f) { free(f); return CUDA_ERROR_INVALID_VALUE; }
    f->magic = EVENT_MAGIC;
    *e = (CUevent)f;
    return CUDA_SUCCESS;
}
CUresult cuEventDestroy_v2(CUevent e) {
    struct fake_event *f = (struct fake_event *)e;
    if (!f || f->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    f->magic = 0;
    free(f);
    return CUDA_SUCCESS;
}
CUresult cuEventRecord(CUevent e, CUstream s) {
    (void)s;
    struct fake_event *f = (struct fake_event *)e;
    if (!f || f->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    f->recorded = 1;
    f->ns = mono_ns();
    return CUDA_SUCCESS;
}
CUresult cuEventSynchronize(CUevent e) {
    struct fake_event *f = (struct fake_event *)e;
    return f && f->magic == EVENT_MAGIC ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
CUresult cuEventQuery(CUevent e) { return cuEventSynchronize(e); }
CUresult cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end) {
    struct fake_event *a = (struct fake_event *)start, *b = (struct fake_event *)end;
    if (!ms || !a || !b || a->magic != EVENT_MAGIC || b->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    if (!a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
    *ms = (float)((double)(int64_t)(b->ns - a->ns) / 1e6);
    return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule m) { (void)m; return CUDA_SUCCESS; }
/* An older driver: parameter layouts are not available from the driver (the server reads the cubin). */
CUresult cuFuncGetParamInfo(CUfunction f, size_t i, size_t *off, size_t *size) {
    (void)f; (void)i; (void)off; (void)size;
    return CUDA_ERROR_NOT_SUPPORTED;
}
/* What the fake device lacks: IPC and graphs built by the program. */
CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) { (void)h; (void)p; return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuGraphCreate(CUgraph *g, unsigned flags) { (void)g; (void)flags; return CUDA_ERROR_NOT_SUPPORTED; }
