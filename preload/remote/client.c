/* The client side of remote GPU shares: a libcuda.so.1 for a process on a node without a GPU. Each
 * driver API call it implements is forwarded over one TCP connection per process to the remote
 * server on the GPU node (TESSERA_REMOTE_SERVER=host:port, authenticated with TESSERA_REMOTE_TOKEN or
 * TESSERA_REMOTE_TOKEN_FILE), where a worker runs it under the share's memory cap and compute share.
 * The runtime replacement (cudart.c) is built on these same entry points.
 *
 * Handles: device pointers, streams and events are the server's values, opaque here; modules and
 * functions are records of this library (a function carries its parameter layout, so a launch's
 * arguments can be packed without asking the server). Launches are one-way messages (a launch
 * failure comes back with the next reply and is returned by the next synchronizing call); every
 * other call waits for its reply. Calls from several threads take turns on the connection.
 *
 * A lost server (the connection fails or closes) is CUDA_ERROR_DEVICE_UNAVAILABLE from then on, said
 * once on stderr; TCP keepalive and a user timeout turn a silent peer into that error too. What is not
 * forwarded answers CUDA_ERROR_NOT_SUPPORTED with a message (see README.md). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
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
#include "remote_client.h"
#include "wire.h"

#define EXPORT __attribute__((visibility("default")))

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int sock = -1, state;   /* 0: not connected yet; 1: connected; -1: failed or lost for good */
static CUresult state_error = CUDA_ERROR_NOT_INITIALIZED;
static CUresult pending;       /* a launch failure reported by the server, for the next synchronizing call */
static struct wire_hello_rep device;
static int log_level = 1;      /* 0 error, 1 warn, 2 info, 3 debug */
/* Buffers used under mu (not on the stack: a program's threads may have small stacks). */
static char scratch[WIRE_MAX_ARGS];
static struct {
    struct wire_req rq;
    struct wire_launch a;
    uint8_t area[WIRE_MAX_PARAM_BYTES];
} launch_msg;

void rlog(int level, const char *fmt, ...) {
    if (level > log_level) return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    va_list ap;
    va_start(ap, fmt);
    logline_write(900, "tessera-remote", names[level], fmt, ap);
    va_end(ap);
}

CUresult rnot_supported(const char *what) {
    rlog(0, "%s is not supported on a remote GPU share (see preload/remote/README.md)", what);
    return CUDA_ERROR_NOT_SUPPORTED;
}

static void lose(const char *what, int err) {
    if (state == -1) return;
    rlog(0, "lost the GPU server during %s (%s): device memory, modules, streams and events of this process are "
            "gone; every CUDA call now fails with CUDA_ERROR_DEVICE_UNAVAILABLE", what, err ? strerror(err) : "connection closed");
    if (sock >= 0) close(sock);
    sock = -1;
    state = -1;
    state_error = CUDA_ERROR_DEVICE_UNAVAILABLE;
}

static int connect_to(const char *addr, int timeout_ms) {
    char host[256];
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host) {
        rlog(0, "TESSERA_REMOTE_SERVER=\"%s\" is not host:port", addr);
        return -1;
    }
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    char *h = host;
    if (*h == '[' && h[strlen(h) - 1] == ']') {
        h++;
        h[strlen(h) - 1] = 0;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *ai;
    int rc = getaddrinfo(h, colon + 1, &hints, &res);
    if (rc) {
        rlog(0, "cannot resolve the GPU server %s: %s", addr, gai_strerror(rc));
        return -1;
    }
    int fd = -1, err = 0;
    for (ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) continue;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
        if (errno == EINPROGRESS) {
            struct pollfd p = {fd, POLLOUT, 0};
            socklen_t el = sizeof err;
            if (poll(&p, 1, timeout_ms) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && !err) break;
            if (!err) err = ETIMEDOUT;
        } else {
            err = errno;
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        rlog(0, "cannot reach the GPU server %s: %s", addr, strerror(err ? err : ECONNREFUSED));
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK)) {
        close(fd);
        return -1;
    }
    const char *t = getenv("TESSERA_REMOTE_TIMEOUT_MS");
    wire_tune_socket(fd, t && atoi(t) >= 1000 ? atoi(t) : 20000);
    return fd;
}

static char *read_token(void) {
    const char *t = getenv("TESSERA_REMOTE_TOKEN");
    if (t && *t) return strdup(t);
    const char *path = getenv("TESSERA_REMOTE_TOKEN_FILE");
    if (!path || !*path) return NULL;
    FILE *f = fopen(path, "r");
    if (!f) {
        rlog(0, "cannot read TESSERA_REMOTE_TOKEN_FILE=%s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = calloc(1, WIRE_MAX_TOKEN + 2);
    size_t n = buf ? fread(buf, 1, WIRE_MAX_TOKEN + 1, f) : 0;
    fclose(f);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = 0;
    return buf;
}

/* Under mu. */
static CUresult ensure_connected(void) {
    if (state == 1) return CUDA_SUCCESS;
    if (state == -1) return state_error;
    state = -1;   /* one attempt per process: a failed start is not retried behind the program's back */
    const char *lvl = getenv("TESSERA_LOG_LEVEL");
    if (lvl) log_level = !strcmp(lvl, "error") ? 0 : !strcmp(lvl, "info") ? 2 : !strcmp(lvl, "debug") ? 3 : 1;
    const char *addr = getenv("TESSERA_REMOTE_SERVER");
    if (!addr || !*addr) {
        rlog(0, "TESSERA_REMOTE_SERVER is not set: this process has no GPU server to use");
        return state_error = CUDA_ERROR_NO_DEVICE;
    }
    char *token = read_token();
    if (!token || !*token || strlen(token) > WIRE_MAX_TOKEN) {
        rlog(0, "no share token (TESSERA_REMOTE_TOKEN or TESSERA_REMOTE_TOKEN_FILE, at most %u bytes)", WIRE_MAX_TOKEN);
        free(token);
        return state_error = CUDA_ERROR_NOT_PERMITTED;
    }
    const char *to = getenv("TESSERA_REMOTE_CONNECT_TIMEOUT_MS");
    int fd = connect_to(addr, to ? atoi(to) : 10000);
    if (fd < 0) {
        free(token);
        return state_error = CUDA_ERROR_NO_DEVICE;
    }
    uint32_t tlen = (uint32_t)strlen(token);
    struct {
        struct wire_req rq;
        struct wire_hello h;
    } msg = {{OP_HELLO, (uint32_t)sizeof(struct wire_hello) + tlen, 0}, {WIRE_MAGIC, WIRE_VERSION, tlen, 0}};
    struct wire_rep rep;
    int bad = wire_sendv2(fd, &msg, sizeof msg, token, tlen) || wire_recv_all(fd, &rep, sizeof rep);
    free(token);
    if (bad || rep.len > WIRE_MAX_ARGS) {
        rlog(0, "the GPU server %s closed the connection during the hello", addr);
        close(fd);
        return state_error = CUDA_ERROR_NO_DEVICE;
    }
    char *buf = scratch;
    if (rep.len && wire_recv_all(fd, buf, rep.len)) {
        close(fd);
        return state_error = CUDA_ERROR_NO_DEVICE;
    }
    if (rep.result != CUDA_SUCCESS) {
        rlog(0, "the GPU server %s refused this process: %.*s", addr, (int)rep.len, buf);
        close(fd);
        return state_error = (CUresult)rep.result;
    }
    if (rep.len != sizeof device) {
        rlog(0, "the GPU server %s answered the hello with %u bytes, not %zu", addr, rep.len, sizeof device);
        close(fd);
        return state_error = CUDA_ERROR_NO_DEVICE;
    }
    memcpy(&device, buf, sizeof device);
    device.name[sizeof device.name - 1] = 0;
    device.share[sizeof device.share - 1] = 0;
    rlog(2, "connected to %s: %s, share %s, %llu bytes", addr, device.name, device.share,
         (unsigned long long)device.total_mem);
    sock = fd;
    state = 1;
    return CUDA_SUCCESS;
}

static void after_fork_child(void) {
    /* the connection belongs to the parent: a child that used it would interleave with it */
    pthread_mutex_init(&mu, NULL);
    if (sock >= 0) close(sock);
    sock = -1;
    if (state == 1) {
        state = -1;
        state_error = CUDA_ERROR_NOT_INITIALIZED;
    }
}

__attribute__((constructor)) static void client_init(void) { pthread_atfork(NULL, NULL, after_fork_child); }

/* Reads a reply's header and `len` bytes into out (at most cap; a failure's message is logged). */
static CUresult read_reply(uint32_t op, void *out, uint32_t cap, uint32_t *got, struct wire_rep *rep) {
    if (wire_recv_all(sock, rep, sizeof *rep)) {
        lose(wire_op_name(op), errno);
        return state_error;
    }
    if (rep->len > WIRE_MAX_ARGS) {
        rlog(0, "the GPU server sent a %u-byte reply", rep->len);
        lose(wire_op_name(op), EPROTO);
        return state_error;
    }
    char *msg = scratch;
    char *dst = rep->result == CUDA_SUCCESS && rep->len <= cap ? out : msg;
    if (rep->len && wire_recv_all(sock, dst, rep->len)) {
        lose(wire_op_name(op), errno);
        return state_error;
    }
    if (got) *got = dst == out ? rep->len : 0;
    if (rep->deferred != CUDA_SUCCESS) {
        rlog(0, "a kernel launch failed on the GPU server (CUresult %d); reported by the next synchronizing call",
             rep->deferred);
        if (pending == CUDA_SUCCESS) pending = (CUresult)rep->deferred;
    }
    if (rep->result != CUDA_SUCCESS && rep->len && dst == msg)
        rlog(1, "%s: %.*s", wire_op_name(op), (int)rep->len, msg);
    return (CUresult)rep->result;
}

CUresult rcall(uint32_t op, const void *args, uint32_t len, void *out, uint32_t cap, uint32_t *got) {
    pthread_mutex_lock(&mu);
    CUresult r = ensure_connected();
    if (r == CUDA_SUCCESS) {
        struct wire_req rq = {op, len, 0};
        struct wire_rep rep;
        if (wire_sendv2(sock, &rq, sizeof rq, args, len)) {
            lose(wire_op_name(op), errno);
            r = state_error;
        } else {
            r = read_reply(op, out, cap, got, &rep);
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

/* A synchronizing call also returns a launch failure the server reported since the last one. */
CUresult rcall_sync(uint32_t op, const void *args, uint32_t len) {
    CUresult r = rcall(op, args, len, NULL, 0, NULL);
    pthread_mutex_lock(&mu);
    if (r == CUDA_SUCCESS && pending != CUDA_SUCCESS) r = pending;
    pending = CUDA_SUCCESS;
    pthread_mutex_unlock(&mu);
    return r;
}

CUresult rconnect(void) {
    pthread_mutex_lock(&mu);
    CUresult r = ensure_connected();
    pthread_mutex_unlock(&mu);
    return r;
}

const struct wire_hello_rep *rdevice(void) { return state == 1 ? &device : NULL; }

/* ---- bulk copies: the host bytes go to or come from the socket directly ---- */
CUresult rcopy_htod(uint64_t dst, const void *src, uint64_t n, uint64_t stream, int async) {
    if (!n) return CUDA_SUCCESS;
    if (!src) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = ensure_connected();
    if (r == CUDA_SUCCESS) {
        struct {
            struct wire_req rq;
            struct wire_memcpy a;
        } m = {{OP_MEMCPY_HTOD, sizeof(struct wire_memcpy), n}, {dst, 0, n, stream, (uint32_t)async, 0}};
        struct wire_rep rep;
        if (wire_send_all(sock, &m, sizeof m) || wire_send_all(sock, src, n)) {
            lose("cuMemcpyHtoD", errno);
            r = state_error;
        } else {
            r = read_reply(OP_MEMCPY_HTOD, NULL, 0, NULL, &rep);
        }
    }
    if (r == CUDA_SUCCESS && pending != CUDA_SUCCESS) r = pending;
    pending = CUDA_SUCCESS;
    pthread_mutex_unlock(&mu);
    return r;
}

CUresult rcopy_dtoh(void *dst, uint64_t src, uint64_t n, uint64_t stream, int async) {
    if (!n) return CUDA_SUCCESS;
    if (!dst) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult r = ensure_connected();
    if (r == CUDA_SUCCESS) {
        struct {
            struct wire_req rq;
            struct wire_memcpy a;
        } m = {{OP_MEMCPY_DTOH, sizeof(struct wire_memcpy), 0}, {0, src, n, stream, (uint32_t)async, 0}};
        struct wire_rep rep;
        if (wire_send_all(sock, &m, sizeof m)) {
            lose("cuMemcpyDtoH", errno);
            r = state_error;
        } else if ((r = read_reply(OP_MEMCPY_DTOH, NULL, 0, NULL, &rep)) == CUDA_SUCCESS) {
            int32_t tail;
            if (rep.bulk != n) {
                rlog(0, "the GPU server sent %llu bytes for a %llu-byte copy", (unsigned long long)rep.bulk,
                     (unsigned long long)n);
                lose("cuMemcpyDtoH", EPROTO);
                r = state_error;
            } else if (wire_recv_all(sock, dst, n) || wire_recv_all(sock, &tail, sizeof tail)) {
                lose("cuMemcpyDtoH", errno);
                r = state_error;
            } else {
                r = (CUresult)tail;
            }
        }
    }
    if (r == CUDA_SUCCESS && pending != CUDA_SUCCESS) r = pending;
    pending = CUDA_SUCCESS;
    pthread_mutex_unlock(&mu);
    return r;
}

CUresult rmodule_load(const void *image, uint64_t size, uint64_t *module) {
    if (!image || !module) return CUDA_ERROR_INVALID_VALUE;
    if (!size || size > WIRE_MAX_MODULE) {
        rlog(0, "cuModuleLoadData: cannot tell the image's size, or it is over %llu bytes",
             (unsigned long long)WIRE_MAX_MODULE);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    pthread_mutex_lock(&mu);
    CUresult r = ensure_connected();
    if (r == CUDA_SUCCESS) {
        struct wire_req rq = {OP_MODULE_LOAD, 0, size};
        struct wire_rep rep;
        uint32_t got = 0;
        if (wire_send_all(sock, &rq, sizeof rq) || wire_send_all(sock, image, size)) {
            lose("cuModuleLoadData", errno);
            r = state_error;
        } else if ((r = read_reply(OP_MODULE_LOAD, module, sizeof *module, &got, &rep)) == CUDA_SUCCESS &&
                   got != sizeof *module) {
            r = CUDA_ERROR_UNKNOWN;
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}

/* ---- functions and launches ---- */
struct rmodule {
    uint64_t handle;
};

struct rfunction *rfunction_get(uint64_t module, const char *name, CUresult *err) {
    struct wire_get_function a;
    *err = CUDA_ERROR_INVALID_VALUE;
    memset(&a, 0, sizeof a);
    a.module = module;
    if (strlen(name) >= sizeof a.name) return NULL;
    strcpy(a.name, name);
    size_t outcap = sizeof(struct wire_function_rep) + WIRE_MAX_PARAMS * sizeof(struct wire_param);
    uint8_t *out = malloc(outcap);
    if (!out) {
        *err = CUDA_ERROR_OUT_OF_MEMORY;
        return NULL;
    }
    uint32_t got = 0;
    CUresult r = rcall(OP_GET_FUNCTION, &a, sizeof a, out, (uint32_t)outcap, &got);
    *err = r ? r : CUDA_ERROR_UNKNOWN;
    if (r != CUDA_SUCCESS || got < sizeof(struct wire_function_rep)) {
        free(out);
        return NULL;
    }
    struct wire_function_rep fr;
    memcpy(&fr, out, sizeof fr);
    uint32_t n = fr.nparams == WIRE_PARAMS_UNKNOWN ? 0 : fr.nparams;
    struct rfunction *f = NULL;
    if (n <= WIRE_MAX_PARAMS && got == sizeof fr + n * sizeof(struct wire_param))
        f = calloc(1, sizeof *f + n * sizeof(struct wire_param));
    if (!f) {
        free(out);
        *err = n > WIRE_MAX_PARAMS ? CUDA_ERROR_UNKNOWN : CUDA_ERROR_OUT_OF_MEMORY;
        return NULL;
    }
    *err = CUDA_SUCCESS;
    f->handle = fr.function;
    f->nparams = fr.nparams;
    snprintf(f->name, sizeof f->name, "%s", name);
    memcpy(f->params, out + sizeof fr, n * sizeof(struct wire_param));
    free(out);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t end = (uint64_t)f->params[i].offset + f->params[i].size;
        if (end > WIRE_MAX_PARAM_BYTES) {   /* not a layout any driver accepts: do not trust it */
            rlog(0, "the GPU server described kernel %s with a parameter beyond %u bytes", name, WIRE_MAX_PARAM_BYTES);
            free(f);
            *err = CUDA_ERROR_INVALID_IMAGE;
            return NULL;
        }
        if (end > f->area) f->area = (uint32_t)end;
    }
    return f;
}

CUresult rlaunch(const struct rfunction *f, const unsigned grid[3], const unsigned block[3], unsigned shmem,
                 uint64_t stream, void **params, void **extra) {
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    void *buf = NULL;
    size_t size = 0;
    if (extra) {
        for (int i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
            if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buf = extra[i + 1];
            else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) size = extra[i + 1] ? *(size_t *)extra[i + 1] : 0;
            else return rnot_supported("a cuLaunchKernel `extra` option other than the parameter buffer");
        }
        if ((!buf && size) || size > WIRE_MAX_PARAM_BYTES) return CUDA_ERROR_INVALID_VALUE;
    } else if (f->nparams == WIRE_PARAMS_UNKNOWN) {
        rlog(0, "cannot launch %s with kernelParams: the GPU server could not learn its parameter layout "
                "(a PTX-only or compressed image on a driver without cuFuncGetParamInfo); pass the `extra` "
                "parameter buffer instead", f->name);
        return CUDA_ERROR_NOT_SUPPORTED;
    } else if (f->nparams && !params) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&mu);
    CUresult r = ensure_connected();
    if (r == CUDA_SUCCESS) {
        struct wire_launch *a = &launch_msg.a;
        memset(a, 0, sizeof *a);
        a->function = f->handle;
        a->stream = stream;
        memcpy(a->grid, grid, sizeof a->grid);
        memcpy(a->block, block, sizeof a->block);
        a->shmem = shmem;
        if (extra) {
            if (size) memcpy(launch_msg.area, buf, size);
            a->param_bytes = (uint32_t)size;
            a->flags = LAUNCH_FROM_EXTRA;
        } else {
            memset(launch_msg.area, 0, f->area);
            for (uint32_t i = 0; i < f->nparams; i++)
                memcpy(launch_msg.area + f->params[i].offset, params[i], f->params[i].size);
            a->param_bytes = f->area;
        }
        launch_msg.rq = (struct wire_req){OP_LAUNCH, (uint32_t)sizeof *a + a->param_bytes, 0};
        if (wire_send_all(sock, &launch_msg, sizeof launch_msg.rq + sizeof *a + a->param_bytes)) {
            lose("cuLaunchKernel", errno);
            r = state_error;
        }
    }
    pthread_mutex_unlock(&mu);
    return r;
}
