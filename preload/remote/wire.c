/* Socket helpers of the remote GPU protocol: whole-buffer sends and receives that survive signals,
 * and the socket options that turn a silent peer into an error instead of a hang. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "wire.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

int wire_send_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int wire_recv_all(int fd, void *buf, size_t len) {
    char *p = buf;
    while (len) {
        ssize_t n = recv(fd, p, len, MSG_WAITALL);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (n == 0) {
            errno = 0;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Two buffers in one system call where possible (a header and its arguments). */
int wire_sendv2(int fd, const void *a, size_t alen, const void *b, size_t blen) {
    struct iovec iov[2] = {{(void *)a, alen}, {(void *)b, blen}};
    int cnt = blen ? 2 : 1;
    struct iovec *v = iov;
    while (cnt) {
        struct msghdr msg = {.msg_iov = v, .msg_iovlen = (size_t)cnt};
        ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        while (cnt && (size_t)n >= v->iov_len) {
            n -= (ssize_t)v->iov_len;
            v++;
            cnt--;
        }
        if (cnt) {
            v->iov_base = (char *)v->iov_base + n;
            v->iov_len -= (size_t)n;
        }
    }
    return 0;
}

int wire_discard(int fd, uint64_t len) {
    char buf[16384];
    while (len) {
        size_t n = len < sizeof buf ? (size_t)len : sizeof buf;
        if (wire_recv_all(fd, buf, n)) return -1;
        len -= n;
    }
    return 0;
}

/* No Nagle (calls are small and latency-bound); keepalive probes and a user timeout so that a peer
 * that vanished without closing (a cut link, a powered-off node) fails the connection within about
 * `timeout_ms` rather than never: unacknowledged data fails after the user timeout, an idle wait for a
 * reply after keepalive's idle time plus three probes. Socket buffers are left to the kernel's
 * autotuning: a fixed SO_SNDBUF/SO_RCVBUF turns it off and measured slower for bulk copies. */
void wire_tune_socket(int fd, int timeout_ms) {
    int one = 1;
    int idle = timeout_ms / 2000, intvl = timeout_ms / 6000, cnt = 3;
    if (idle < 1) idle = 1;
    if (intvl < 1) intvl = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    if (timeout_ms > 0) setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout_ms, sizeof timeout_ms);
}

const char *wire_op_name(uint32_t op) {
    static const char *names[OP_MAX] = {
        [OP_HELLO] = "hello", [OP_MEM_GET_INFO] = "cuMemGetInfo", [OP_DEVICE_ATTR] = "cuDeviceGetAttribute",
        [OP_MEM_ALLOC] = "cuMemAlloc", [OP_MEM_FREE] = "cuMemFree", [OP_MEMCPY_HTOD] = "cuMemcpyHtoD",
        [OP_MEMCPY_DTOH] = "cuMemcpyDtoH", [OP_MEMCPY_DTOD] = "cuMemcpyDtoD", [OP_MEMSET_D8] = "cuMemsetD8",
        [OP_MEMSET_D32] = "cuMemsetD32", [OP_MODULE_LOAD] = "cuModuleLoadData", [OP_MODULE_UNLOAD] = "cuModuleUnload",
        [OP_GET_FUNCTION] = "cuModuleGetFunction", [OP_LAUNCH] = "cuLaunchKernel", [OP_CTX_SYNC] = "cuCtxSynchronize",
        [OP_STREAM_CREATE] = "cuStreamCreate", [OP_STREAM_DESTROY] = "cuStreamDestroy",
        [OP_STREAM_SYNC] = "cuStreamSynchronize", [OP_STREAM_QUERY] = "cuStreamQuery",
        [OP_STREAM_WAIT_EVENT] = "cuStreamWaitEvent", [OP_EVENT_CREATE] = "cuEventCreate",
        [OP_EVENT_DESTROY] = "cuEventDestroy", [OP_EVENT_RECORD] = "cuEventRecord",
        [OP_EVENT_SYNC] = "cuEventSynchronize", [OP_EVENT_QUERY] = "cuEventQuery",
        [OP_EVENT_ELAPSED] = "cuEventElapsedTime", [OP_PING] = "ping", [OP_PROBE] = "probe",
    };
    return op < OP_MAX && names[op] ? names[op] : "unknown";
}
