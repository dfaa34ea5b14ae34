/* The GPU side of one remote client: executes its calls on the node's driver.
 *
 * The listener (server.c) verifies the client's share token, then starts one worker per connection
 * with the share's terms in the environment and the preload library in LD_PRELOAD, so every
 * allocation of the worker is counted against the share's memory cap and every launch waits for the
 * share's time token from the node's broker, exactly as for a local process of the share. The
 * worker owns the connection (fd 3): when the client goes away, mid-call or not, it frees what the
 * client left on the device and exits; the broker sees its connection close and settles the share.
 *
 * Every handle a client names (memory, module, function, stream, event) is checked against what
 * this worker created for it, so a client can neither crash the worker with a stale handle nor reach
 * another client's objects. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "logline.h"
#include "image.h"
#include "wire.h"

/* The driver is opened like the CUDA runtime opens it (dlopen + dlsym), so the worker needs no libcuda
 * at build time; under LD_PRELOAD the preload library answers these lookups with its hooks. */
#define DRIVER_CALLS(X)                                                                                         \
    X(cuInit) X(cuDeviceGet) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent) X(cuDeviceTotalMem_v2)              \
    X(cuDeviceGetName) X(cuDeviceGetUuid_v2) X(cuDeviceGetAttribute) X(cuMemGetInfo_v2) X(cuMemAlloc_v2)        \
    X(cuMemFree_v2) X(cuMemcpyHtoD_v2) X(cuMemcpyDtoH_v2) X(cuMemcpyDtoD_v2) X(cuMemcpyHtoDAsync_v2)             \
    X(cuMemcpyDtoHAsync_v2) X(cuMemcpyDtoDAsync_v2) X(cuMemsetD8_v2) X(cuMemsetD32_v2) X(cuMemsetD8Async)       \
    X(cuMemsetD32Async) X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) X(cuLaunchKernel)          \
    X(cuCtxSynchronize) X(cuStreamCreateWithPriority) X(cuStreamDestroy_v2) X(cuStreamSynchronize)              \
    X(cuStreamQuery) X(cuStreamWaitEvent) X(cuEventCreate) X(cuEventDestroy_v2) X(cuEventRecord)                \
    X(cuEventSynchronize) X(cuEventQuery)
#define DECLARE(name) static __typeof__(&name) p_##name;
DRIVER_CALLS(DECLARE)

static int load_driver(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) return -1;
#define LOAD(name)                                                 \
    if (!(p_##name = (__typeof__(&name))dlsym(h, #name))) return -1;
    DRIVER_CALLS(LOAD)
    return 0;
}
/* from here on the names mean the driver's entry points */
#define cuInit p_cuInit
#define cuDeviceGet p_cuDeviceGet
#define cuDevicePrimaryCtxRetain p_cuDevicePrimaryCtxRetain
#define cuCtxSetCurrent p_cuCtxSetCurrent
#define cuDeviceTotalMem_v2 p_cuDeviceTotalMem_v2
#define cuDeviceGetName p_cuDeviceGetName
#undef cuDeviceGetUuid_v2 /* CUDA 12 headers define it to itself */
#define cuDeviceGetUuid_v2 p_cuDeviceGetUuid_v2
#define cuDeviceGetAttribute p_cuDeviceGetAttribute
#define cuMemGetInfo_v2 p_cuMemGetInfo_v2
#define cuMemAlloc_v2 p_cuMemAlloc_v2
#define cuMemFree_v2 p_cuMemFree_v2
#define cuMemcpyHtoD_v2 p_cuMemcpyHtoD_v2
#define cuMemcpyDtoH_v2 p_cuMemcpyDtoH_v2
#define cuMemcpyDtoD_v2 p_cuMemcpyDtoD_v2
#define cuMemcpyHtoDAsync_v2 p_cuMemcpyHtoDAsync_v2
#define cuMemcpyDtoHAsync_v2 p_cuMemcpyDtoHAsync_v2
#define cuMemcpyDtoDAsync_v2 p_cuMemcpyDtoDAsync_v2
#define cuMemsetD8_v2 p_cuMemsetD8_v2
#define cuMemsetD32_v2 p_cuMemsetD32_v2
#define cuMemsetD8Async p_cuMemsetD8Async
#define cuMemsetD32Async p_cuMemsetD32Async
#define cuModuleLoadData p_cuModuleLoadData
#define cuModuleUnload p_cuModuleUnload
#define cuModuleGetFunction p_cuModuleGetFunction
#define cuLaunchKernel p_cuLaunchKernel
#define cuCtxSynchronize p_cuCtxSynchronize
#define cuStreamCreateWithPriority p_cuStreamCreateWithPriority
#define cuStreamDestroy_v2 p_cuStreamDestroy_v2
#define cuStreamSynchronize p_cuStreamSynchronize
#define cuStreamQuery p_cuStreamQuery
#define cuStreamWaitEvent p_cuStreamWaitEvent
#define cuEventCreate p_cuEventCreate
#define cuEventDestroy_v2 p_cuEventDestroy_v2
#define cuEventRecord p_cuEventRecord
#define cuEventSynchronize p_cuEventSynchronize
#define cuEventQuery p_cuEventQuery

static int fd = 3;
static CUresult deferred;   /* first failure of a one-way launch since the last reply */

static void wlog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void wlog(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    logline_write(600, "tessera-remote-worker", NULL, fmt, ap);
    va_end(ap);
}

/* ---- handle tables: open addressing on the handle value ---- */
enum kind { K_MEM = 1, K_MODULE, K_FUNCTION, K_STREAM, K_EVENT };
struct entry {
    uint64_t key;
    int kind;
    uint64_t size;          /* K_MEM: bytes; K_MODULE: image bytes */
    void *data;             /* K_MODULE: the image; K_FUNCTION: struct fn */
};
/* Modules and functions are named to the client by these records (the driver may answer one object
 * for several loads or names, as the fake one does). */
struct mod {
    CUmodule m;
};
struct fn {
    CUfunction f;
    struct mod *owner;
    uint32_t nparams;
    struct wire_param params[];
};
static struct entry *table;
static size_t cap, used, tombs;
#define TOMB ((uint64_t)-1)

static size_t slot_of(uint64_t key) { return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1); }

static struct entry *find(uint64_t key, int kind) {
    if (!cap || !key || key == TOMB) return NULL;
    for (size_t i = slot_of(key), n = 0; n < cap; i = (i + 1) & (cap - 1), n++) {
        if (!table[i].key) return NULL;
        if (table[i].key == key) return table[i].kind == kind ? &table[i] : NULL;
    }
    return NULL;
}

static int grow(void) {
    size_t old = cap;
    struct entry *prev = table;
    cap = cap ? cap * 2 : 1024;
    table = calloc(cap, sizeof *table);
    if (!table) {
        table = prev;
        cap = old;
        return -1;
    }
    used = tombs = 0;
    for (size_t i = 0; i < old; i++)
        if (prev[i].key && prev[i].key != TOMB) {
            size_t j = slot_of(prev[i].key);
            while (table[j].key) j = (j + 1) & (cap - 1);
            table[j] = prev[i];
            used++;
        }
    free(prev);
    return 0;
}

static int add(uint64_t key, int kind, uint64_t size, void *data) {
    if ((used + tombs + 1) * 2 > cap && grow()) return -1;
    size_t i = slot_of(key);
    while (table[i].key && table[i].key != TOMB) i = (i + 1) & (cap - 1);
    if (table[i].key == TOMB) tombs--;
    table[i] = (struct entry){key, kind, size, data};
    used++;
    return 0;
}

static void drop(struct entry *e) {
    e->key = TOMB;
    e->data = NULL;
    used--;
    tombs++;
}

static int valid_stream(uint64_t s) {
    return s == 0 || s == (uint64_t)(uintptr_t)CU_STREAM_LEGACY || s == (uint64_t)(uintptr_t)CU_STREAM_PER_THREAD ||
           find(s, K_STREAM);
}

/* A device range the client allocated through this worker. */
static int valid_range(uint64_t p, uint64_t n) {
    if (!cap) return 0;
    for (size_t i = 0; i < cap; i++) {
        struct entry *e = &table[i];
        if (e->kind == K_MEM && e->key && e->key != TOMB && p >= e->key && p - e->key <= e->size &&
            n <= e->size - (p - e->key))
            return 1;
    }
    return 0;
}

/* ---- input: buffered, so a stream of small one-way launches costs one read per many of them; large
 * reads (bulk chunks) go straight from the socket to their destination ---- */
static uint8_t inbuf[256 * 1024];
static size_t in_off, in_len;

static int in_read(void *dst, size_t n) {
    uint8_t *p = dst;
    while (n) {
        if (in_off < in_len) {
            size_t k = in_len - in_off < n ? in_len - in_off : n;
            memcpy(p, inbuf + in_off, k);
            in_off += k, p += k, n -= k;
            continue;
        }
        if (n >= sizeof inbuf / 4) return wire_recv_all(fd, p, n);
        ssize_t got = recv(fd, inbuf, sizeof inbuf, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            if (got == 0) errno = 0;
            return -1;
        }
        in_off = 0;
        in_len = (size_t)got;
    }
    return 0;
}

static int in_discard(uint64_t n) {
    uint8_t sink[16384];
    while (n) {
        size_t k = n < sizeof sink ? (size_t)n : sizeof sink;
        if (in_read(sink, k)) return -1;
        n -= k;
    }
    return 0;
}

/* ---- replies ---- */
static int reply(CUresult r, const void *data, uint32_t len) {
    struct wire_rep h = {.result = (int32_t)r, .deferred = (int32_t)deferred, .len = len};
    deferred = CUDA_SUCCESS;
    return wire_sendv2(fd, &h, sizeof h, data, len);
}

static int fail(CUresult r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(CUresult r, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return reply(r ? r : CUDA_ERROR_UNKNOWN, msg, (uint32_t)strlen(msg));
}

static int need(uint32_t len, size_t want) { return len == want; }

/* ---- optional driver entry points (newer drivers only) ---- */
static CUresult (*param_info)(CUfunction, size_t, size_t *, size_t *);
static CUresult (*elapsed)(float *, CUevent, CUevent);

static int function_layout(CUfunction f, struct entry *module, const char *name, struct fn *out) {
    if (param_info) {
        uint32_t n = 0;
        size_t off, size;
        CUresult r;
        while (n < WIRE_MAX_PARAMS && (r = param_info(f, n, &off, &size)) == CUDA_SUCCESS) {
            out->params[n].offset = (uint32_t)off;
            out->params[n].size = (uint32_t)size;
            n++;
        }
        if (n > 0 || r == CUDA_ERROR_INVALID_VALUE) {   /* INVALID_VALUE: past the last parameter */
            out->nparams = n;
            return 0;
        }
    }
    uint32_t n = 0;
    if (image_kernel_params(module->data, module->size, name, out->params, WIRE_MAX_PARAMS, &n) == 0) {
        out->nparams = n;
        return 0;
    }
    out->nparams = WIRE_PARAMS_UNKNOWN;
    return -1;
}

/* ---- the calls ---- */
static uint8_t args[WIRE_MAX_ARGS] __attribute__((aligned(16)));

/* ---- bulk copies, pipelined: a copier thread moves one chunk between its buffer and the device
 * while this thread moves the other chunk between the socket and its buffer, so the device copy
 * overlaps the network (with a real GPU the copier waits on DMA; with the fake one it copies) ---- */
static void *bufs[2];
static CUcontext worker_ctx;
static pthread_mutex_t copy_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t copy_cv = PTHREAD_COND_INITIALIZER;
static struct copy_job {
    int pending, busy, to_device, async;
    uint64_t dev;
    void *host;
    size_t n;
    CUstream stream;
    CUresult result;
} job;

static void *copier(void *arg) {
    (void)arg;
    cuCtxSetCurrent(worker_ctx);
    pthread_mutex_lock(&copy_mu);
    for (;;) {
        while (!job.pending) pthread_cond_wait(&copy_cv, &copy_mu);
        struct copy_job j = job;
        job.pending = 0;
        pthread_mutex_unlock(&copy_mu);
        CUresult r;
        if (j.to_device)
            r = j.async ? cuMemcpyHtoDAsync_v2(j.dev, j.host, j.n, j.stream) : cuMemcpyHtoD_v2(j.dev, j.host, j.n);
        else
            r = j.async ? cuMemcpyDtoHAsync_v2(j.host, j.dev, j.n, j.stream) : cuMemcpyDtoH_v2(j.host, j.dev, j.n);
        if (r == CUDA_SUCCESS && j.async) r = cuStreamSynchronize(j.stream);
        pthread_mutex_lock(&copy_mu);
        job.result = r;
        job.busy = 0;
        pthread_cond_broadcast(&copy_cv);
    }
    return NULL;
}

/* The copier thread's per-thread default stream is not this thread's: a copy on CU_STREAM_PER_THREAD
 * first waits for what this thread queued there, so it stays ordered after the client's launches. */
static CUresult order_per_thread(const struct wire_memcpy *a) {
    return a->stream == (uint64_t)(uintptr_t)CU_STREAM_PER_THREAD ? cuStreamSynchronize(CU_STREAM_PER_THREAD)
                                                                   : CUDA_SUCCESS;
}

static void copy_submit(int to_device, uint64_t dev, void *host, size_t n, const struct wire_memcpy *a) {
    pthread_mutex_lock(&copy_mu);
    job = (struct copy_job){1, 1, to_device, (int)a->async, dev, host, n, (CUstream)(uintptr_t)a->stream, CUDA_SUCCESS};
    pthread_cond_broadcast(&copy_cv);
    pthread_mutex_unlock(&copy_mu);
}

/* The result of the chunk in flight (success when none is). */
static CUresult copy_wait(void) {
    pthread_mutex_lock(&copy_mu);
    while (job.busy) pthread_cond_wait(&copy_cv, &copy_mu);
    CUresult r = job.result;
    job.result = CUDA_SUCCESS;
    pthread_mutex_unlock(&copy_mu);
    return r;
}

static int do_memcpy_htod(const struct wire_req *rq) {
    struct wire_memcpy a;
    memcpy(&a, args, sizeof a);
    CUresult r = CUDA_SUCCESS;
    const char *why = NULL;
    /* the framing itself is wrong, or the copy is larger than any device: drop the client rather than
     * read an unbounded stream it declared */
    if (rq->bulk != a.bytes || a.bytes > WIRE_MAX_COPY) return -1;
    if (!valid_range(a.dst, a.bytes)) r = CUDA_ERROR_INVALID_VALUE, why = "destination is not memory of this share";
    else if (!valid_stream(a.stream)) r = CUDA_ERROR_INVALID_HANDLE, why = "unknown stream";
    else if ((r = order_per_thread(&a)) != CUDA_SUCCESS) why = "the per-thread stream failed";
    uint64_t done = 0;
    int cur = 0;
    while (done < a.bytes) {
        size_t n = a.bytes - done < WIRE_CHUNK ? (size_t)(a.bytes - done) : WIRE_CHUNK;
        if (in_read(bufs[cur], n)) {
            copy_wait();
            return -1;
        }
        CUresult prev = copy_wait();   /* the other buffer's chunk is on the device now */
        if (r == CUDA_SUCCESS && prev != CUDA_SUCCESS) r = prev, why = "the driver refused the copy";
        if (r == CUDA_SUCCESS) copy_submit(1, a.dst + done, bufs[cur], n, &a);
        cur ^= 1;
        done += n;
    }
    CUresult last = copy_wait();
    if (r == CUDA_SUCCESS && last != CUDA_SUCCESS) r = last, why = "the driver refused the copy";
    return why ? fail(r, "%s", why) : reply(r, NULL, 0);
}

static int do_memcpy_dtoh(void) {
    struct wire_memcpy a;
    memcpy(&a, args, sizeof a);
    if (!valid_range(a.src, a.bytes)) return fail(CUDA_ERROR_INVALID_VALUE, "source is not memory of this share");
    if (!valid_stream(a.stream)) return fail(CUDA_ERROR_INVALID_HANDLE, "unknown stream");
    CUresult ordered = order_per_thread(&a);
    if (ordered != CUDA_SUCCESS) return fail(ordered, "the per-thread stream failed");
    struct wire_rep h = {.result = CUDA_SUCCESS, .deferred = (int32_t)deferred, .bulk = a.bytes};
    deferred = CUDA_SUCCESS;
    if (wire_send_all(fd, &h, sizeof h)) return -1;
    /* then the bytes, then the copy's own result (a failure half-way still sends every byte promised) */
    CUresult r = CUDA_SUCCESS;
    uint64_t done = 0;
    int cur = 0;
    size_t n = a.bytes < WIRE_CHUNK ? (size_t)a.bytes : WIRE_CHUNK;
    if (n) copy_submit(0, a.src, bufs[cur], n, &a);
    while (done < a.bytes) {
        CUresult got = copy_wait();   /* this chunk is in bufs[cur] */
        if (r == CUDA_SUCCESS) r = got;
        if (r != CUDA_SUCCESS) memset(bufs[cur], 0, n);
        uint64_t next = done + n;
        size_t n2 = a.bytes - next < WIRE_CHUNK ? (size_t)(a.bytes - next) : WIRE_CHUNK;
        if (next < a.bytes && r == CUDA_SUCCESS) copy_submit(0, a.src + next, bufs[cur ^ 1], n2, &a);
        if (wire_send_all(fd, bufs[cur], n)) {
            copy_wait();
            return -1;
        }
        cur ^= 1;
        done = next;
        n = n2;
    }
    int32_t tail = (int32_t)r;
    return wire_send_all(fd, &tail, sizeof tail);
}

static int do_module_load(const struct wire_req *rq) {
    if (rq->bulk == 0 || rq->bulk > WIRE_MAX_MODULE) return -1;
    uint8_t *image = malloc(rq->bulk + 1);
    if (!image) {
        if (in_discard(rq->bulk)) return -1;
        return fail(CUDA_ERROR_OUT_OF_MEMORY, "no host memory for a %llu-byte module", (unsigned long long)rq->bulk);
    }
    if (in_read(image, rq->bulk)) {
        free(image);
        return -1;
    }
    image[rq->bulk] = 0;   /* PTX must end in NUL */
    CUmodule m = NULL;
    CUresult r = cuModuleLoadData(&m, image);
    if (r != CUDA_SUCCESS) {
        free(image);
        return fail(r, "the driver refused the module image");
    }
    struct mod *rec = malloc(sizeof *rec);
    if (!rec || add((uint64_t)(uintptr_t)rec, K_MODULE, rq->bulk, image)) {
        free(rec);
        free(image);
        cuModuleUnload(m);
        return fail(CUDA_ERROR_OUT_OF_MEMORY, "no room for another module");
    }
    rec->m = m;
    uint64_t h = (uint64_t)(uintptr_t)rec;
    return reply(CUDA_SUCCESS, &h, sizeof h);
}

static int do_get_function(uint32_t len) {
    struct wire_get_function a;
    if (!need(len, sizeof a)) return -1;
    memcpy(&a, args, sizeof a);
    a.name[sizeof a.name - 1] = 0;
    struct entry *m = find(a.module, K_MODULE);
    if (!m) return fail(CUDA_ERROR_INVALID_HANDLE, "unknown module");
    CUfunction f = NULL;
    CUresult r = cuModuleGetFunction(&f, ((struct mod *)(uintptr_t)a.module)->m, a.name);
    if (r) return fail(r, "no kernel named %.200s in the module", a.name);
    struct fn *info = calloc(1, sizeof *info + WIRE_MAX_PARAMS * sizeof(struct wire_param));
    if (!info) return fail(CUDA_ERROR_OUT_OF_MEMORY, "no host memory");
    info->f = f;
    info->owner = (struct mod *)(uintptr_t)a.module;
    if (function_layout(f, m, a.name, info))
        wlog("parameter layout of %.200s unknown (PTX-only or compressed image, driver without cuFuncGetParamInfo):"
             " its launches need the `extra` parameter buffer", a.name);
    if (add((uint64_t)(uintptr_t)info, K_FUNCTION, 0, info)) {
        free(info);
        return fail(CUDA_ERROR_OUT_OF_MEMORY, "no room for another function");
    }
    uint32_t n = info->nparams == WIRE_PARAMS_UNKNOWN ? 0 : info->nparams;
    uint8_t out[sizeof(struct wire_function_rep) + WIRE_MAX_PARAMS * sizeof(struct wire_param)];
    struct wire_function_rep fr = {.function = (uint64_t)(uintptr_t)info, .nparams = info->nparams};
    memcpy(out, &fr, sizeof fr);
    memcpy(out + sizeof fr, info->params, n * sizeof(struct wire_param));
    return reply(CUDA_SUCCESS, out, (uint32_t)(sizeof fr + n * sizeof(struct wire_param)));
}

/* A client that died leaves its queued launches readable behind the end of the stream; they are not
 * run for nobody (a live client never shuts down its sending side). */
static int client_gone(void) {
    struct pollfd p = {fd, POLLRDHUP, 0};
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static int do_launch(uint32_t len) {
    struct wire_launch a;
    CUresult r = CUDA_SUCCESS;
    if (client_gone()) {
        errno = ECONNRESET;
        return -1;
    }
    if (len < sizeof a) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    memcpy(&a, args, sizeof a);
    uint8_t *area = args + sizeof a;
    if (a.param_bytes != len - sizeof a || a.param_bytes > WIRE_MAX_PARAM_BYTES) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    struct entry *e = find(a.function, K_FUNCTION);
    if (!e || !valid_stream(a.stream)) {
        r = CUDA_ERROR_INVALID_HANDLE;
        goto out;
    }
    struct fn *info = e->data;
    CUstream s = (CUstream)(uintptr_t)a.stream;
    if (a.flags & LAUNCH_FROM_EXTRA) {
        size_t size = a.param_bytes;
        void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, area, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
        r = cuLaunchKernel(info->f, a.grid[0], a.grid[1], a.grid[2], a.block[0], a.block[1], a.block[2], a.shmem, s,
                           NULL, extra);
        goto out;
    }
    if (info->nparams == WIRE_PARAMS_UNKNOWN) {
        r = CUDA_ERROR_NOT_SUPPORTED;
        goto out;
    }
    void *params[WIRE_MAX_PARAMS];
    for (uint32_t i = 0; i < info->nparams; i++) {
        if (info->params[i].offset + (uint64_t)info->params[i].size > a.param_bytes) {
            r = CUDA_ERROR_INVALID_VALUE;
            goto out;
        }
        params[i] = area + info->params[i].offset;
    }
    r = cuLaunchKernel(info->f, a.grid[0], a.grid[1], a.grid[2], a.block[0], a.block[1], a.block[2], a.shmem, s,
                       info->nparams ? params : NULL, NULL);
out:
    if (r != CUDA_SUCCESS && deferred == CUDA_SUCCESS) deferred = r;
    return 0;
}

static int dispatch(const struct wire_req *rq) {
    uint32_t len = rq->len;
    switch (rq->op) {
    case OP_PING:
        return reply(CUDA_SUCCESS, NULL, 0);
    case OP_MEM_GET_INFO: {
        size_t free_b = 0, total = 0;
        CUresult r = cuMemGetInfo_v2(&free_b, &total);
        struct wire_u64x2 o = {free_b, total};
        return reply(r, &o, sizeof o);
    }
    case OP_DEVICE_ATTR: {
        int32_t attr, value = 0;
        if (!need(len, sizeof attr)) return -1;
        memcpy(&attr, args, sizeof attr);
        CUdevice dev;
        CUresult r = cuDeviceGet(&dev, 0);
        if (!r) r = cuDeviceGetAttribute(&value, (CUdevice_attribute)attr, dev);
        return reply(r, &value, sizeof value);
    }
    case OP_MEM_ALLOC: {
        uint64_t bytes;
        if (!need(len, sizeof bytes)) return -1;
        memcpy(&bytes, args, sizeof bytes);
        CUdeviceptr p = 0;
        CUresult r = cuMemAlloc_v2(&p, (size_t)bytes);
        if (r) return fail(r, r == CUDA_ERROR_OUT_OF_MEMORY ? "over the share's memory cap (or the card's memory)"
                                                             : "the driver refused the allocation");
        if (add(p, K_MEM, bytes, NULL)) {
            cuMemFree_v2(p);
            return fail(CUDA_ERROR_OUT_OF_MEMORY, "no room to track another allocation");
        }
        uint64_t out = p;
        return reply(CUDA_SUCCESS, &out, sizeof out);
    }
    case OP_MEM_FREE: {
        uint64_t p;
        if (!need(len, sizeof p)) return -1;
        memcpy(&p, args, sizeof p);
        struct entry *e = find(p, K_MEM);
        if (!e) return fail(CUDA_ERROR_INVALID_VALUE, "not an allocation of this share");
        CUresult r = cuMemFree_v2(p);
        if (!r) drop(e);
        return reply(r, NULL, 0);
    }
    case OP_MEMCPY_HTOD:
        if (!need(len, sizeof(struct wire_memcpy))) return -1;
        return do_memcpy_htod(rq);
    case OP_MEMCPY_DTOH:
        if (!need(len, sizeof(struct wire_memcpy))) return -1;
        return do_memcpy_dtoh();
    case OP_MEMCPY_DTOD: {
        struct wire_memcpy a;
        if (!need(len, sizeof a)) return -1;
        memcpy(&a, args, sizeof a);
        if (!valid_range(a.dst, a.bytes) || !valid_range(a.src, a.bytes))
            return fail(CUDA_ERROR_INVALID_VALUE, "a range is not memory of this share");
        if (!valid_stream(a.stream)) return fail(CUDA_ERROR_INVALID_HANDLE, "unknown stream");
        CUresult r = a.async ? cuMemcpyDtoDAsync_v2(a.dst, a.src, a.bytes, (CUstream)(uintptr_t)a.stream)
                             : cuMemcpyDtoD_v2(a.dst, a.src, a.bytes);
        return reply(r, NULL, 0);
    }
    case OP_MEMSET_D8:
    case OP_MEMSET_D32: {
        struct wire_memset a;
        if (!need(len, sizeof a)) return -1;
        memcpy(&a, args, sizeof a);
        uint64_t unit = rq->op == OP_MEMSET_D8 ? 1 : 4;
        if (a.count > UINT64_MAX / unit || !valid_range(a.dst, a.count * unit))
            return fail(CUDA_ERROR_INVALID_VALUE, "the range is not memory of this share");
        if (!valid_stream(a.stream)) return fail(CUDA_ERROR_INVALID_HANDLE, "unknown stream");
        CUstream s = (CUstream)(uintptr_t)a.stream;
        CUresult r;
        if (rq->op == OP_MEMSET_D8)
            r = a.async ? cuMemsetD8Async(a.dst, (unsigned char)a.value, a.count, s) : cuMemsetD8_v2(a.dst, (unsigned char)a.value, a.count);
        else
            r = a.async ? cuMemsetD32Async(a.dst, a.value, a.count, s) : cuMemsetD32_v2(a.dst, a.value, a.count);
        return reply(r, NULL, 0);
    }
    case OP_MODULE_LOAD:
        if (len != 0) return -1;
        return do_module_load(rq);
    case OP_MODULE_UNLOAD: {
        uint64_t m;
        if (!need(len, sizeof m)) return -1;
        memcpy(&m, args, sizeof m);
        struct entry *e = find(m, K_MODULE);
        if (!e) return fail(CUDA_ERROR_INVALID_HANDLE, "unknown module");
        CUresult r = cuModuleUnload(((struct mod *)(uintptr_t)m)->m);
        if (!r) {
            free(e->data);
            drop(e);
            for (size_t i = 0; i < cap; i++)   /* its functions go with it */
                if (table[i].kind == K_FUNCTION && table[i].key && table[i].key != TOMB &&
                    ((struct fn *)table[i].data)->owner == (struct mod *)(uintptr_t)m) {
                    free(table[i].data);
                    drop(&table[i]);
                }
            free((void *)(uintptr_t)m);
        }
        return reply(r, NULL, 0);
    }
    case OP_GET_FUNCTION:
        return do_get_function(len);
    case OP_LAUNCH:
        return do_launch(len);
    case OP_CTX_SYNC:
        return reply(cuCtxSynchronize(), NULL, 0);
    case OP_STREAM_CREATE: {
        uint32_t a[2];   /* flags, priority */
        if (!need(len, sizeof a)) return -1;
        memcpy(a, args, sizeof a);
        CUstream s = NULL;
        CUresult r = cuStreamCreateWithPriority(&s, a[0], (int)a[1]);
        if (!r && add((uint64_t)(uintptr_t)s, K_STREAM, 0, NULL)) {
            cuStreamDestroy_v2(s);
            return fail(CUDA_ERROR_OUT_OF_MEMORY, "no room for another stream");
        }
        uint64_t h = (uint64_t)(uintptr_t)s;
        return reply(r, &h, sizeof h);
    }
    case OP_STREAM_DESTROY:
    case OP_STREAM_SYNC:
    case OP_STREAM_QUERY: {
        uint64_t s;
        if (!need(len, sizeof s)) return -1;
        memcpy(&s, args, sizeof s);
        if (rq->op == OP_STREAM_DESTROY) {
            struct entry *e = find(s, K_STREAM);
            if (!e) return fail(CUDA_ERROR_INVALID_HANDLE, "unknown stream");
            CUresult r = cuStreamDestroy_v2((CUstream)(uintptr_t)s);
            if (!r) drop(e);
            return reply(r, NULL, 0);
        }
        if (!valid_stream(s)) return fail(CUDA_ERROR_INVALID_HANDLE, "unknown stream");
        return reply(rq->op == OP_STREAM_SYNC ? cuStreamSynchronize((CUstream)(uintptr_t)s)
                                              : cuStreamQuery((CUstream)(uintptr_t)s), NULL, 0);
    }
    case OP_STREAM_WAIT_EVENT: {
        struct wire_u64x2 a;
        if (!need(len, sizeof a)) return -1;
        memcpy(&a, args, sizeof a);
        if (!valid_stream(a.a) || !find(a.b, K_EVENT)) return fail(CUDA_ERROR_INVALID_HANDLE, "unknown stream or event");
        return reply(cuStreamWaitEvent((CUstream)(uintptr_t)a.a, (CUevent)(uintptr_t)a.b, 0), NULL, 0);
    }
    case OP_EVENT_CREATE: {
        uint32_t flags;
        if (!need(len, sizeof flags)) return -1;
        memcpy(&flags, args, sizeof flags);
        CUevent e = NULL;
        CUresult r = cuEventCreate(&e, flags);
        if (!r && add((uint64_t)(uintptr_t)e, K_EVENT, 0, NULL)) {
            cuEventDestroy_v2(e);
            return fail(CUDA_ERROR_OUT_OF_MEMORY, "no room for another event");
        }
        uint64_t h = (uint64_t)(uintptr_t)e;
        return reply(r, &h, sizeof h);
    }
    case OP_EVENT_DESTROY:
    case OP_EVENT_SYNC:
    case OP_EVENT_QUERY: {
        uint64_t ev;
        if (!need(len, sizeof ev)) return -1;
        memcpy(&ev, args, sizeof ev);
        struct entry *e = find(ev, K_EVENT);
        if (!e) return fail(CUDA_ERROR_INVALID_HANDLE, "unknown event");
        CUresult r;
        if (rq->op == OP_EVENT_DESTROY) {
            r = cuEventDestroy_v2((CUevent)(uintptr_t)ev);
            if (!r) drop(e);
        } else {
            r = rq->op == OP_EVENT_SYNC ? cuEventSynchronize((CUevent)(uintptr_t)ev) : cuEventQuery((CUevent)(uintptr_t)ev);
        }
        return reply(r, NULL, 0);
    }
    case OP_EVENT_RECORD: {
        struct wire_u64x2 a;   /* event, stream */
        if (!need(len, sizeof a)) return -1;
        memcpy(&a, args, sizeof a);
        if (!find(a.a, K_EVENT) || !valid_stream(a.b)) return fail(CUDA_ERROR_INVALID_HANDLE, "unknown event or stream");
        return reply(cuEventRecord((CUevent)(uintptr_t)a.a, (CUstream)(uintptr_t)a.b), NULL, 0);
    }
    case OP_EVENT_ELAPSED: {
        struct wire_u64x2 a;
        if (!need(len, sizeof a)) return -1;
        memcpy(&a, args, sizeof a);
        if (!find(a.a, K_EVENT) || !find(a.b, K_EVENT)) return fail(CUDA_ERROR_INVALID_HANDLE, "unknown event");
        float ms = 0;
        CUresult r = elapsed ? elapsed(&ms, (CUevent)(uintptr_t)a.a, (CUevent)(uintptr_t)a.b) : CUDA_ERROR_NOT_SUPPORTED;
        return reply(r, &ms, sizeof ms);
    }
    default:
        return -1;
    }
}

/* What the client left behind: memory back to the share's budget, streams, events and modules. */
static void cleanup(void) {
    cuCtxSynchronize();
    size_t freed = 0;
    for (size_t i = 0; i < cap; i++) {
        struct entry *e = &table[i];
        if (!e->key || e->key == TOMB) continue;
        switch (e->kind) {
        case K_MEM: cuMemFree_v2(e->key); freed += e->size; break;
        case K_STREAM: cuStreamDestroy_v2((CUstream)(uintptr_t)e->key); break;
        case K_EVENT: cuEventDestroy_v2((CUevent)(uintptr_t)e->key); break;
        case K_MODULE:
            cuModuleUnload(((struct mod *)(uintptr_t)e->key)->m);
            free(e->data);
            free((void *)(uintptr_t)e->key);
            break;
        case K_FUNCTION: free(e->data); break;
        }
    }
    if (freed) wlog("freed %zu bytes the client left allocated", freed);
}

static int hello(void) {
    struct wire_hello_rep h;
    memset(&h, 0, sizeof h);
    h.version = WIRE_VERSION;
    CUdevice dev;
    CUcontext ctx;
    CUresult r = cuInit(0);
    if (!r) r = cuDeviceGet(&dev, 0);
    if (!r) r = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (!r) r = cuCtxSetCurrent(ctx);
    if (r) return fail(r, "the GPU node's driver did not start (CUresult %d)", (int)r);
    worker_ctx = ctx;
    pthread_t t;
    if (pthread_create(&t, NULL, copier, NULL)) return fail(CUDA_ERROR_OUT_OF_MEMORY, "cannot start the copier thread");
    size_t total = 0;
    cuDeviceTotalMem_v2(&total, dev);
    h.total_mem = total;
    cuDeviceGetName(h.name, sizeof h.name, dev);
    CUuuid uuid;
    if (cuDeviceGetUuid_v2(&uuid, dev) == CUDA_SUCCESS) memcpy(h.uuid, uuid.bytes, 16);
    const char *share = getenv("TESSERA_SHARE_ID");
    snprintf(h.share, sizeof h.share, "%s", share ? share : "");
    return reply(CUDA_SUCCESS, &h, sizeof h);
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i += 2)
        if (!strcmp(argv[i], "--fd")) fd = atoi(argv[i + 1]);
    if (posix_memalign(&bufs[0], 4096, WIRE_CHUNK) || posix_memalign(&bufs[1], 4096, WIRE_CHUNK)) return 1;
    if (load_driver()) {
        wlog("cannot load the driver (libcuda.so.1): %s", dlerror());
        fail(CUDA_ERROR_NO_DEVICE, "the GPU node has no usable driver");
        return 1;
    }
    param_info = (CUresult (*)(CUfunction, size_t, size_t *, size_t *))dlsym(RTLD_DEFAULT, "cuFuncGetParamInfo");
    elapsed = (CUresult (*)(float *, CUevent, CUevent))dlsym(RTLD_DEFAULT, "cuEventElapsedTime_v2");
    if (!elapsed) elapsed = (CUresult (*)(float *, CUevent, CUevent))dlsym(RTLD_DEFAULT, "cuEventElapsedTime");
    if (hello()) return 1;
    int why = 0;
    for (;;) {
        struct wire_req rq;
        if (in_read(&rq, sizeof rq)) {
            why = errno;
            break;
        }
        if (rq.op == 0 || rq.op >= OP_MAX || rq.op == OP_HELLO || rq.len > WIRE_MAX_ARGS ||
            (rq.bulk && rq.op != OP_MEMCPY_HTOD && rq.op != OP_MODULE_LOAD)) {
            wlog("protocol error: op %u len %u bulk %llu; closing", rq.op, rq.len, (unsigned long long)rq.bulk);
            break;
        }
        if (rq.len && in_read(args, rq.len)) {
            why = errno;
            break;
        }
        errno = 0;
        if (dispatch(&rq)) {
            why = errno;
            if (why) break;
            wlog("protocol error in %s; closing", wire_op_name(rq.op));
            break;
        }
    }
    if (why) wlog("client connection lost (%s)", strerror(why));
    cleanup();
    return 0;
}
