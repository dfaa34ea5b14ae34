/* The remote GPU server on a GPU node: accepts client connections, checks each one's share token
 * against this node's secret, and hands the connection to a fresh worker process that runs under
 * the share's terms (see worker.c). One worker per client process: a client that dies or misbehaves
 * takes down only its own worker, and the OS and the preload library's budget reclaim what it held.
 *
 *   tessera-remote-server --listen HOST:PORT --secret-file PATH --worker PATH [--preload PATH]
 *                         [--gpu UUID]... [--budget-dir DIR] [--max-clients N] [--port-file PATH]
 *
 * The listener itself never touches the driver. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include "logline.h"
#include "wire.h"

#define MAX_GPUS 16

static const char *listen_addr, *secret_file, *worker_path, *preload_path, *budget_dir, *port_file;
static const char *gpus[MAX_GPUS];
static int ngpus, max_clients = 64, children;
static uint8_t secret[1024];
static size_t secret_len;

static void slog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void slog(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    logline_write(700, "tessera-remote-server", NULL, fmt, ap);
    va_end(ap);
}

static void usage(const char *why) {
    fprintf(stderr, "tessera-remote-server: %s\n"
            "usage: tessera-remote-server --listen HOST:PORT --secret-file PATH --worker PATH [--preload PATH]\n"
            "       [--gpu UUID]... [--budget-dir DIR] [--max-clients N] [--port-file PATH]\n", why);
    exit(2);
}

static void load_secret(void) {
    FILE *f = fopen(secret_file, "rb");
    if (!f) {
        fprintf(stderr, "tessera-remote-server: cannot read the secret file %s: %s\n", secret_file, strerror(errno));
        exit(2);
    }
    secret_len = fread(secret, 1, sizeof secret, f);
    fclose(f);
    while (secret_len && (secret[secret_len - 1] == '\n' || secret[secret_len - 1] == '\r' ||
                          secret[secret_len - 1] == ' '))
        secret_len--;
    if (secret_len < 16) {
        fprintf(stderr, "tessera-remote-server: the secret in %s is shorter than 16 bytes\n", secret_file);
        exit(2);
    }
}

static int open_listener(void) {
    char host[256];
    const char *colon = strrchr(listen_addr, ':');
    if (!colon || (size_t)(colon - listen_addr) >= sizeof host) usage("--listen needs HOST:PORT");
    memcpy(host, listen_addr, (size_t)(colon - listen_addr));
    host[colon - listen_addr] = 0;
    char *h = host;
    if (*h == '[') {   /* [v6]:port */
        h++;
        h[strlen(h) - 1] = 0;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res;
    int rc = getaddrinfo(*h ? h : NULL, colon + 1, &hints, &res);
    if (rc) {
        fprintf(stderr, "tessera-remote-server: cannot use %s: %s\n", listen_addr, gai_strerror(rc));
        exit(2);
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) || listen(fd, 64)) {
        fprintf(stderr, "tessera-remote-server: cannot listen on %s: %s\n", listen_addr, strerror(errno));
        exit(2);
    }
    freeaddrinfo(res);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    int port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    slog("listening on %s (port %d), %d GPU(s) named, worker %s", listen_addr, port, ngpus, worker_path);
    if (port_file) {
        char tmp[512];
        snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) || rename(tmp, port_file)) {
            fprintf(stderr, "tessera-remote-server: cannot write %s\n", port_file);
            exit(2);
        }
    }
    return fd;
}

static void refuse(int fd, CUresult r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void refuse(int fd, CUresult r, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct wire_rep h = {.result = (int32_t)r, .len = (uint32_t)strlen(msg)};
    wire_sendv2(fd, &h, sizeof h, msg, h.len);
}

static void set_or_unset(const char *name, const char *value) {
    if (value) setenv(name, value, 1);
    else unsetenv(name);
}

/* A link probe (node agents measure their network to this node): `pings` 8-byte echoes, then `bytes`
 * bytes from here. Bounded, and it touches nothing but the socket, so it needs no token. */
static void probe(int conn, const char *peer, uint32_t len) {
    struct wire_probe p;
    if (len != sizeof p || wire_recv_all(conn, &p, sizeof p)) _exit(0);
    if (p.magic != WIRE_MAGIC || p.pings > PROBE_MAX_PINGS || p.bytes > PROBE_MAX_BYTES) {
        refuse(conn, CUDA_ERROR_INVALID_VALUE, "a probe takes at most %u pings and %u bytes", PROBE_MAX_PINGS,
               PROBE_MAX_BYTES);
        _exit(0);
    }
    struct wire_rep ok = {.result = CUDA_SUCCESS, .bulk = p.bytes};
    if (wire_send_all(conn, &ok, sizeof ok)) _exit(0);
    for (uint32_t i = 0; i < p.pings; i++) {
        uint64_t stamp;
        if (wire_recv_all(conn, &stamp, sizeof stamp) || wire_send_all(conn, &stamp, sizeof stamp)) _exit(0);
    }
    static char zeros[256 * 1024];
    for (uint64_t left = p.bytes; left;) {
        size_t n = left < sizeof zeros ? (size_t)left : sizeof zeros;
        if (wire_send_all(conn, zeros, n)) _exit(0);
        left -= n;
    }
    char end;
    (void)!recv(conn, &end, 1, 0);   /* the prober closes when it has everything */
    slog("%s: probe (%u pings, %llu bytes)", peer, p.pings, (unsigned long long)p.bytes);
    _exit(0);
}

/* In the forked child: the client's first message, its token, then the worker. */
static void serve(int conn, const char *peer) {
    struct timeval tv = {10, 0};
    setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct wire_req rq;
    struct wire_hello hello;
    char token[WIRE_MAX_TOKEN + 1];
    if (wire_recv_all(conn, &rq, sizeof rq)) _exit(0);
    if (rq.op == OP_PROBE && !rq.bulk) probe(conn, peer, rq.len);
    if (rq.op != OP_HELLO || rq.bulk || rq.len < sizeof hello || rq.len > sizeof hello + WIRE_MAX_TOKEN) {
        slog("%s: not a Tessera remote client (first message op %u, %u bytes)", peer, rq.op, rq.len);
        refuse(conn, CUDA_ERROR_INVALID_VALUE, "first message must be a hello with a share token");
        _exit(0);
    }
    if (wire_recv_all(conn, &hello, sizeof hello)) _exit(0);
    uint32_t tlen = rq.len - (uint32_t)sizeof hello;
    if (hello.magic != WIRE_MAGIC || hello.token_len != tlen) {
        refuse(conn, CUDA_ERROR_INVALID_VALUE, "malformed hello");
        _exit(0);
    }
    if (hello.version != WIRE_VERSION) {
        refuse(conn, CUDA_ERROR_NOT_SUPPORTED, "protocol version %u is not served here (this server speaks %u)",
               hello.version, WIRE_VERSION);
        _exit(0);
    }
    if (wire_recv_all(conn, token, tlen)) _exit(0);
    token[tlen] = 0;
    struct share_token t;
    char why[200];
    if (token_verify(token, secret, secret_len, (int64_t)time(NULL), &t, why, sizeof why)) {
        slog("%s: refused: %s", peer, why);
        refuse(conn, CUDA_ERROR_NOT_PERMITTED, "share token refused: %s", why);
        _exit(0);
    }
    if (ngpus) {
        int ok = 0;
        for (int i = 0; i < ngpus; i++) ok |= !strcmp(gpus[i], t.gpu);
        if (!ok) {
            slog("%s: refused: share %s is for GPU %s, not served here", peer, t.share, t.gpu);
            refuse(conn, CUDA_ERROR_NOT_PERMITTED, "share token names GPU %s, which this node does not serve", t.gpu);
            _exit(0);
        }
        setenv("CUDA_VISIBLE_DEVICES", t.gpu, 1);
    }
    tv.tv_sec = 0;
    setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);

    char num[64], path[512];
    setenv("TESSERA_SHARE_ID", t.share, 1);
    setenv("TESSERA_GPU_UUID", t.gpu, 1);
    snprintf(num, sizeof num, "%llu", (unsigned long long)t.mem);
    set_or_unset("TESSERA_GPU_MEMORY_LIMIT", t.mem ? num : NULL);
    snprintf(num, sizeof num, "%.4f", t.request);
    setenv("TESSERA_GPU_REQUEST", num, 1);
    snprintf(num, sizeof num, "%.4f", t.limit);
    setenv("TESSERA_GPU_LIMIT", num, 1);
    setenv("TESSERA_PRIORITY", t.priority, 1);
    if (budget_dir) {
        snprintf(path, sizeof path, "%s/tessera-budget-%s", budget_dir, t.share);
        setenv("TESSERA_BUDGET_PATH", path, 1);
    } else {
        unsetenv("TESSERA_BUDGET_PATH");
    }
    set_or_unset("LD_PRELOAD", preload_path);
    if (conn != 3) {
        if (dup2(conn, 3) < 0) _exit(1);
        close(conn);
    }
    slog("%s: share %s on GPU %s (memory cap %llu bytes, request %.2f, limit %.2f)", peer, t.share, t.gpu,
         (unsigned long long)t.mem, t.request, t.limit);
    char *argv[] = {(char *)worker_path, "--fd", "3", NULL};
    execv(worker_path, argv);
    slog("cannot start the worker %s: %s", worker_path, strerror(errno));
    refuse(3, CUDA_ERROR_NOT_INITIALIZED, "the GPU node could not start a worker");
    _exit(1);
}

static void on_child(int sig) { (void)sig; }

static void reap(void) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        children--;
        if (WIFSIGNALED(status)) slog("worker %d died of signal %d", (int)pid, WTERMSIG(status));
    }
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) usage("an option lacks its value");
        if (!strcmp(k, "--listen")) listen_addr = v;
        else if (!strcmp(k, "--secret-file")) secret_file = v;
        else if (!strcmp(k, "--worker")) worker_path = v;
        else if (!strcmp(k, "--preload")) preload_path = v;
        else if (!strcmp(k, "--budget-dir")) budget_dir = v;
        else if (!strcmp(k, "--port-file")) port_file = v;
        else if (!strcmp(k, "--max-clients")) max_clients = atoi(v);
        else if (!strcmp(k, "--gpu")) {
            if (ngpus == MAX_GPUS) usage("too many --gpu");
            gpus[ngpus++] = v;
        } else usage("unknown option");
        i++;
    }
    if (!listen_addr || !secret_file || !worker_path) usage("--listen, --secret-file and --worker are required");
    if (max_clients < 1) usage("--max-clients must be at least 1");
    load_secret();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_child;   /* no SA_RESTART: accept() returns so that children are reaped */
    sigaction(SIGCHLD, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    int lfd = open_listener();
    for (;;) {
        reap();
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int conn = accept4(lfd, (struct sockaddr *)&ss, &sl, 0);
        if (conn < 0) {
            if (errno != EINTR && errno != ECONNABORTED) slog("accept: %s", strerror(errno));
            continue;
        }
        char peer[INET6_ADDRSTRLEN + 8] = "?";
        if (getnameinfo((struct sockaddr *)&ss, sl, peer, sizeof peer, NULL, 0, NI_NUMERICHOST)) snprintf(peer, sizeof peer, "?");
        reap();
        if (children >= max_clients) {
            slog("%s: refused: %d clients already", peer, children);
            refuse(conn, CUDA_ERROR_OUT_OF_MEMORY, "the GPU node serves %d clients already", children);
            close(conn);
            continue;
        }
        wire_tune_socket(conn, 20000);
        pid_t pid = fork();
        if (pid == 0) {
            close(lfd);
            signal(SIGCHLD, SIG_DFL);
            signal(SIGPIPE, SIG_DFL);
            serve(conn, peer);
        }
        if (pid > 0) children++;
        else slog("fork: %s", strerror(errno));
        close(conn);
    }
}
