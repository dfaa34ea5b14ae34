/* The remote GPU server on a GPU node: accepts client connections, checks each one's share token
 * against this node's secret, and hands the connection to a fresh worker process that runs under
 * the share's terms on the token's GPU (see worker.c). One worker per client process: a client that
 * dies or misbehaves takes down only its own worker, and the OS and the preload library's budget
 * reclaim what it held.
 *
 *   tessera-remote-server --listen HOST:PORT --secret-file PATH --worker PATH [--preload PATH]
 *                         (--gpu UUID | --gpu-file PATH)... [--budget-dir DIR] [--max-clients N]
 *                         [--max-unauthenticated N] [--max-unauthenticated-per-address N]
 *                         [--hello-timeout-ms MS] [--port-file PATH] [--revoked-file PATH]
 *
 * Slots cannot be taken before authentication: the listener reads every hello itself, without
 * blocking, each within an absolute deadline from its accept however slowly its bytes come; only an
 * authenticated client gets a worker, and only workers count against --max-clients. Connections
 * still in their hello (or in a link probe) are capped apart, in all and per source address; when a
 * cap is reached the oldest such connection (of that address, or in all) is closed to make room, so a
 * client that sends its hello at once is served whatever others trickle. The listener itself never
 * touches the driver.
 *
 * Revocation: --revoked-file names a file the node agent writes (one "<share id> <unix seconds>
 * <attempt>" a line, for shares the portal released here): the tokens of that share issued for a
 * placement before <attempt> are void (a share placed here again keeps its entry, and only its new
 * token works; an ended share's <attempt> is past its last). A line without <attempt> voids every
 * token of the share. The listener reloads it when it changes, checked before every hello and at
 * least once a second: a void token's hello is refused and the workers it started are killed. A
 * missing file revokes nothing; an unreadable one keeps the list loaded before. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include "logline.h"
#include "wire.h"

#define MAX_GPUS 64       /* whole GPUs of one node, as the agent reports them */
#define HELLO_BYTES (sizeof(struct wire_req) + sizeof(struct wire_hello) + WIRE_MAX_TOKEN)
#define NOISY_LINES_PER_S 20

static const char *listen_addr, *secret_file, *worker_path, *preload_path, *budget_dir, *port_file, *revoked_file;
static char *gpus[MAX_GPUS];
static int ngpus, max_clients = 64, workers;
/* The running workers (max_clients entries; pid 0 = free) and their shares: a share's budget file
 * goes when its last worker does. */
struct worker {
    pid_t pid;
    char share[sizeof(((struct share_token *)0)->share)];
    uint32_t attempt;   /* of the token it was started with */
};
static struct worker *running;
static int max_unauth = 64, max_unauth_per_addr = 4, hello_timeout_ms = 10000;
static uint8_t secret[1024];
static size_t secret_len;
static int child_pipe[2] = {-1, -1};   /* SIGCHLD → a byte here, so that poll() wakes to reap */

/* A connection that has not authenticated: in its hello (read here, fd set) or in a link probe (run
 * by a child, probe set). */
struct pending {
    int fd;
    pid_t probe;
    int killed;
    uint8_t source[16];   /* the source's key: IPv4 address, or IPv6 /64 */
    char peer[INET6_ADDRSTRLEN + 8];
    uint64_t seq;         /* order of accept: the oldest goes first */
    int64_t deadline_ms;
    uint32_t have;
    uint8_t buf[HELLO_BYTES];
};
static struct pending *pend;
static uint64_t accepted;

static void slog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void slog(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    logline_write(700, "tessera-remote-server", NULL, fmt, ap);
    va_end(ap);
}

/* Lines about unauthenticated connections: at most NOISY_LINES_PER_S a second, the rest counted, so
 * that a flood of connections cannot flood the node's log too. */
static void nlog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void nlog(const char *fmt, ...) {
    static time_t second;
    static int lines;
    static unsigned long left_out;
    time_t t = time(NULL);
    if (t != second) {
        if (left_out) slog("%lu more lines about unauthenticated connections left out", left_out);
        second = t;
        lines = 0;
        left_out = 0;
    }
    if (lines++ >= NOISY_LINES_PER_S) {
        left_out++;
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    logline_write(700, "tessera-remote-server", NULL, fmt, ap);
    va_end(ap);
}

static void usage(const char *why) {
    fprintf(stderr, "tessera-remote-server: %s\n"
            "usage: tessera-remote-server --listen HOST:PORT --secret-file PATH --worker PATH [--preload PATH]\n"
            "       (--gpu UUID | --gpu-file PATH)... [--budget-dir DIR] [--max-clients N]\n"
            "       [--max-unauthenticated N] [--max-unauthenticated-per-address N] [--hello-timeout-ms MS]\n"
            "       [--port-file PATH] [--revoked-file PATH]\n", why);
    exit(2);
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
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

static void add_gpu(const char *uuid, const char *from) {
    if (!token_valid_id(uuid)) {
        fprintf(stderr, "tessera-remote-server: %s: GPU \"%.64s\" is not 1-128 of A-Za-z0-9._:-\n", from, uuid);
        exit(2);
    }
    for (int i = 0; i < ngpus; i++)
        if (!strcmp(gpus[i], uuid)) return;
    if (ngpus == MAX_GPUS) usage("more than 64 GPUs named");
    gpus[ngpus++] = strdup(uuid);
}

/* One GPU UUID a line (blank lines ignored), as agents/remote/gpus.py writes them. */
static void load_gpu_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "tessera-remote-server: cannot read the GPU file %s: %s\n", path, strerror(errno));
        exit(2);
    }
    char line[256];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (*line) add_gpu(line, path);
    }
    fclose(f);
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
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) || listen(fd, 256)) {
        fprintf(stderr, "tessera-remote-server: cannot listen on %s: %s\n", listen_addr, strerror(errno));
        exit(2);
    }
    freeaddrinfo(res);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    int port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    slog("listening on %s (port %d), serving %d GPU(s) (%s%s), worker %s", listen_addr, port, ngpus, gpus[0],
         ngpus > 1 ? ", ..." : "", worker_path);
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

/* A refusal with its reason. The listener's sockets do not block: a peer that reads nothing loses
 * the reason, not the listener's time. */
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

static void set_blocking(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
}

static void source_key(const struct sockaddr_storage *ss, uint8_t key[16]) {
    memset(key, 0, 16);
    if (ss->ss_family == AF_INET) {
        memcpy(key, &((const struct sockaddr_in *)ss)->sin_addr, 4);
    } else if (ss->ss_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a)) {
            memcpy(key, a->s6_addr + 12, 4);
        } else {   /* one host has a whole /64 to pick addresses from */
            memcpy(key, a->s6_addr, 8);
            key[15] = 6;
        }
    }
}

static void release(struct pending *p) {
    if (p->fd >= 0) close(p->fd);
    p->fd = -1;
    p->probe = 0;
}

static int in_use(const struct pending *p) { return p->fd >= 0 || p->probe > 0; }

/* Makes room for one more unauthenticated connection: closes the oldest of those from `source` when
 * that source holds its cap, else the oldest of all when all are taken. Returns a free entry. */
static struct pending *make_room(const uint8_t source[16], const char *peer) {
    struct pending *oldest_here = NULL, *oldest = NULL, *free_one = NULL;
    int here = 0;
    for (int i = 0; i < max_unauth; i++) {
        struct pending *p = &pend[i];
        if (!in_use(p)) {
            if (!free_one) free_one = p;
            continue;
        }
        if (!memcmp(p->source, source, 16)) {
            here++;
            if (!oldest_here || p->seq < oldest_here->seq) oldest_here = p;
        }
        if (!oldest || p->seq < oldest->seq) oldest = p;
    }
    struct pending *victim = NULL;
    if (here >= max_unauth_per_addr) {
        victim = oldest_here;
        nlog("%s: closed an unauthenticated connection from %s: %d from this address already", victim->peer, peer,
             here);
    } else if (!free_one) {
        victim = oldest;
        nlog("%s: closed an unauthenticated connection for one from %s: %d unauthenticated already", victim->peer,
             peer, max_unauth);
    } else {
        return free_one;
    }
    if (victim->probe > 0) kill(victim->probe, SIGKILL);   /* reaped as a probe: not a worker's pid */
    release(victim);
    return victim;
}

/* A link probe (node agents measure their network to this node), in its own process: `pings` 8-byte
 * echoes, then `bytes` bytes from here. Bounded, and it touches nothing but the socket, so it needs
 * no token; it still holds an unauthenticated entry and ends at its deadline. */
static void run_probe(int conn, const struct wire_probe *p, const char *peer) {
    struct wire_rep ok = {.result = CUDA_SUCCESS, .bulk = p->bytes};
    if (wire_send_all(conn, &ok, sizeof ok)) _exit(0);
    for (uint32_t i = 0; i < p->pings; i++) {
        uint64_t stamp;
        if (wire_recv_all(conn, &stamp, sizeof stamp) || wire_send_all(conn, &stamp, sizeof stamp)) _exit(0);
    }
    static char zeros[256 * 1024];
    for (uint64_t left = p->bytes; left;) {
        size_t n = left < sizeof zeros ? (size_t)left : sizeof zeros;
        if (wire_send_all(conn, zeros, n)) _exit(0);
        left -= n;
    }
    char end;
    (void)!recv(conn, &end, 1, 0);   /* the prober closes when it has everything */
    slog("%s: probe (%u pings, %llu bytes)", peer, p->pings, (unsigned long long)p->bytes);
    _exit(0);
}

static void start_probe(struct pending *e, int lfd) {
    struct wire_probe p;
    memcpy(&p, e->buf + sizeof(struct wire_req), sizeof p);
    if (p.magic != WIRE_MAGIC || p.pings > PROBE_MAX_PINGS || p.bytes > PROBE_MAX_BYTES) {
        refuse(e->fd, CUDA_ERROR_INVALID_VALUE, "a probe takes at most %u pings and %u bytes", PROBE_MAX_PINGS,
               PROBE_MAX_BYTES);
        release(e);
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        /* nothing of the listener's may outlive it here: a connection it closes must close */
        close(lfd);
        close(child_pipe[0]);
        close(child_pipe[1]);
        for (int i = 0; i < max_unauth; i++)
            if (pend[i].fd >= 0 && &pend[i] != e) close(pend[i].fd);
        signal(SIGCHLD, SIG_DFL);
        set_blocking(e->fd);
        run_probe(e->fd, &p, e->peer);
    }
    if (pid < 0) {
        slog("fork: %s", strerror(errno));
        release(e);
        return;
    }
    close(e->fd);
    e->fd = -1;
    e->probe = pid;
}

static void budget_path(char *out, size_t len, const char *share) {
    snprintf(out, len, "%s/tessera-budget-%s", budget_dir, share);
}

/* The share's worker, in a child: the environment comes from the verified claims only. */
static void start_worker(struct pending *e, const struct share_token *t) {
    pid_t pid = fork();
    if (pid < 0) {
        slog("fork: %s", strerror(errno));
        refuse(e->fd, CUDA_ERROR_NOT_INITIALIZED, "the GPU node could not start a worker");
        release(e);
        return;
    }
    if (pid > 0) {
        for (int i = 0; i < max_clients; i++)
            if (!running[i].pid) {
                running[i].pid = pid;
                memcpy(running[i].share, t->share, sizeof running[i].share);
                running[i].attempt = t->attempt;
                break;
            }
        workers++;
        slog("%s: share %s on GPU %s (memory cap %llu bytes, request %.2f, limit %.2f)", e->peer, t->share, t->gpu,
             (unsigned long long)t->mem, t->request, t->limit);
        release(e);
        return;
    }
    /* the listener's other descriptors are close-on-exec */
    signal(SIGCHLD, SIG_DFL);
    char num[64], path[512];
    setenv("CUDA_VISIBLE_DEVICES", t->gpu, 1);   /* the token's GPU, and no other */
    setenv("TESSERA_SHARE_ID", t->share, 1);
    setenv("TESSERA_GPU_UUID", t->gpu, 1);
    snprintf(num, sizeof num, "%llu", (unsigned long long)t->mem);
    set_or_unset("TESSERA_GPU_MEMORY_LIMIT", t->mem ? num : NULL);
    snprintf(num, sizeof num, "%.4f", t->request);
    setenv("TESSERA_GPU_REQUEST", num, 1);
    snprintf(num, sizeof num, "%.4f", t->limit);
    setenv("TESSERA_GPU_LIMIT", num, 1);
    setenv("TESSERA_PRIORITY", t->priority, 1);
    if (budget_dir) {
        budget_path(path, sizeof path, t->share);
        setenv("TESSERA_BUDGET_PATH", path, 1);
    } else {
        unsetenv("TESSERA_BUDGET_PATH");
    }
    set_or_unset("LD_PRELOAD", preload_path);
    set_blocking(e->fd);
    if (dup2(e->fd, 3) < 0) _exit(1);   /* dup2 clears close-on-exec on 3 */
    if (e->fd == 3) fcntl(3, F_SETFD, 0);
    char *argv[] = {(char *)worker_path, "--fd", "3", NULL};
    execv(worker_path, argv);
    slog("cannot start the worker %s: %s", worker_path, strerror(errno));
    refuse(3, CUDA_ERROR_NOT_INITIALIZED, "the GPU node could not start a worker");
    _exit(1);
}

#define MAX_REVOKED 8192   /* shares listed in --revoked-file; the agent keeps only recent ones */
struct revocation {
    char share[sizeof(((struct share_token *)0)->share)];
    uint32_t from_attempt;   /* tokens of earlier attempts are void; UINT32_MAX: all of them */
};
static struct revocation *revoked;
static int nrevoked;
static struct stat revoked_stat;   /* of the file as last loaded (st_ino 0: none loaded) */

/* Whether the token of `share` issued for placement `attempt` is void. */
static int is_revoked(const char *share, uint32_t attempt) {
    for (int i = 0; i < nrevoked; i++)
        if (!strcmp(revoked[i].share, share)) return attempt < revoked[i].from_attempt;
    return 0;
}

/* One line of the file into `out`: "<share> <unix seconds> [<attempt>]"; -1 if malformed. */
static int parse_revocation(char *line, struct revocation *out) {
    char *save = NULL, *share = strtok_r(line, " ", &save), *at = strtok_r(NULL, " ", &save),
         *attempt = strtok_r(NULL, " ", &save);
    if (!share || !token_valid_id(share) || strtok_r(NULL, " ", &save)) return -1;
    char *end;
    if (at) {
        errno = 0;
        (void)strtoull(at, &end, 10);
        if (errno || *end || *at < '0' || *at > '9') return -1;
    }
    out->from_attempt = UINT32_MAX;
    if (attempt) {
        errno = 0;
        unsigned long long a = strtoull(attempt, &end, 10);
        if (errno || *end || *attempt < '0' || *attempt > '9' || a > UINT32_MAX) return -1;
        out->from_attempt = (uint32_t)a;
    }
    memcpy(out->share, share, strlen(share) + 1);   /* token_valid_id: at most 128 bytes */
    return 0;
}

/* Reloads --revoked-file if it changed (atomically replaced by the agent: a new inode), then ends the
 * running workers of the shares it lists. */
static void reload_revoked(void) {
    if (!revoked_file) return;
    struct stat st;
    if (stat(revoked_file, &st)) {
        if (errno == ENOENT && revoked_stat.st_ino) {   /* gone: nothing revoked any more */
            memset(&revoked_stat, 0, sizeof revoked_stat);
            nrevoked = 0;
        }
        return;
    }
    if (st.st_ino == revoked_stat.st_ino && st.st_dev == revoked_stat.st_dev && st.st_size == revoked_stat.st_size &&
        st.st_mtim.tv_sec == revoked_stat.st_mtim.tv_sec && st.st_mtim.tv_nsec == revoked_stat.st_mtim.tv_nsec)
        return;
    FILE *f = fopen(revoked_file, "r");
    if (!f) {
        slog("cannot read the revoked-share file %s: %s; keeping %d revoked share(s)", revoked_file, strerror(errno),
             nrevoked);
        return;
    }
    int n = 0, bad = 0;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!*line || *line == '#') continue;
        if (n == MAX_REVOKED || parse_revocation(line, &revoked[n])) {
            bad++;
            continue;
        }
        n++;
    }
    fclose(f);
    nrevoked = n;
    revoked_stat = st;
    slog("revoked-share file %s: %d share(s)%s", revoked_file, n, bad ? " (lines left out: malformed or too many)" : "");
    for (int i = 0; i < max_clients; i++)
        if (running[i].pid && is_revoked(running[i].share, running[i].attempt)) {
            slog("share %s revoked: ending its worker %d (attempt %u)", running[i].share, (int)running[i].pid,
                 running[i].attempt);
            kill(running[i].pid, SIGKILL);   /* reaped as usual: the slot and budget file go with it */
        }
}

/* A complete hello: the token decides, then a worker takes the connection. */
static void finish_hello(struct pending *e) {
    struct wire_req rq;
    struct wire_hello hello;
    memcpy(&rq, e->buf, sizeof rq);
    memcpy(&hello, e->buf + sizeof rq, sizeof hello);
    uint32_t tlen = rq.len - (uint32_t)sizeof hello;
    if (hello.magic != WIRE_MAGIC || hello.token_len != tlen) {
        refuse(e->fd, CUDA_ERROR_INVALID_VALUE, "malformed hello");
        release(e);
        return;
    }
    if (hello.version != WIRE_VERSION) {
        refuse(e->fd, CUDA_ERROR_NOT_SUPPORTED, "protocol version %u is not served here (this server speaks %u)",
               hello.version, WIRE_VERSION);
        release(e);
        return;
    }
    char token[WIRE_MAX_TOKEN + 1];
    memcpy(token, e->buf + sizeof rq + sizeof hello, tlen);
    token[tlen] = 0;
    struct share_token t;
    char why[200];
    if (token_verify(token, secret, secret_len, (int64_t)time(NULL), &t, why, sizeof why)) {
        nlog("%s: refused: %s", e->peer, why);
        refuse(e->fd, CUDA_ERROR_NOT_PERMITTED, "share token refused: %s", why);
        release(e);
        return;
    }
    reload_revoked();
    if (is_revoked(t.share, t.attempt)) {
        slog("%s: refused: share %s was revoked (attempt %u: ended or placed again)", e->peer, t.share, t.attempt);
        refuse(e->fd, CUDA_ERROR_NOT_PERMITTED, "share token refused: share %s was revoked (attempt %u)", t.share,
               t.attempt);
        release(e);
        return;
    }
    int served = 0;
    for (int i = 0; i < ngpus; i++) served |= !strcmp(gpus[i], t.gpu);
    if (!served) {
        slog("%s: refused: share %s is for GPU %s, not served here", e->peer, t.share, t.gpu);
        refuse(e->fd, CUDA_ERROR_NOT_PERMITTED, "share token names GPU %s, which this node does not serve", t.gpu);
        release(e);
        return;
    }
    if (workers >= max_clients) {
        slog("%s: refused share %s: %d clients already", e->peer, t.share, workers);
        refuse(e->fd, CUDA_ERROR_OUT_OF_MEMORY, "the GPU node serves %d clients already", workers);
        release(e);
        return;
    }
    start_worker(e, &t);
}

/* How many bytes the opening message takes, from its header; 0 if it is no opening at all. */
static uint32_t opening_size(const struct wire_req *rq) {
    if (rq->bulk) return 0;
    if (rq->op == OP_PROBE && rq->len == sizeof(struct wire_probe)) return sizeof *rq + rq->len;
    if (rq->op == OP_HELLO && rq->len >= sizeof(struct wire_hello) && rq->len <= sizeof(struct wire_hello) + WIRE_MAX_TOKEN)
        return sizeof *rq + rq->len;
    return 0;
}

/* Whatever bytes of an opening have arrived. */
static void read_opening(struct pending *e, int lfd) {
    struct wire_req rq;
    uint32_t want = sizeof rq;
    if (e->have >= sizeof rq) {
        memcpy(&rq, e->buf, sizeof rq);
        want = opening_size(&rq);
    }
    ssize_t n = recv(e->fd, e->buf + e->have, want - e->have, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        release(e);   /* gone before it said anything worth a line */
        return;
    }
    if (n < 0) return;
    e->have += (uint32_t)n;
    if (e->have == sizeof rq && want == sizeof rq) {
        memcpy(&rq, e->buf, sizeof rq);
        want = opening_size(&rq);
        if (!want) {
            nlog("%s: not a Tessera remote client (first message op %u, %u bytes)", e->peer, rq.op, rq.len);
            refuse(e->fd, CUDA_ERROR_INVALID_VALUE, "first message must be a hello with a share token");
            release(e);
            return;
        }
    }
    if (e->have < want) return;
    if (rq.op == OP_PROBE) start_probe(e, lfd);
    else finish_hello(e);
}

static void accept_clients(int lfd) {
    for (int round = 0; round < 256; round++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int conn = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (conn < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) slog("accept: %s", strerror(errno));
            return;
        }
        char peer[INET6_ADDRSTRLEN + 8] = "?";
        if (getnameinfo((struct sockaddr *)&ss, sl, peer, sizeof peer, NULL, 0, NI_NUMERICHOST))
            snprintf(peer, sizeof peer, "?");
        uint8_t source[16];
        source_key(&ss, source);
        struct pending *e = make_room(source, peer);
        wire_tune_socket(conn, 20000);
        e->fd = conn;
        e->probe = 0;
        e->killed = 0;
        e->have = 0;
        memcpy(e->source, source, 16);
        memcpy(e->peer, peer, sizeof peer);
        e->seq = ++accepted;
        e->deadline_ms = now_ms() + hello_timeout_ms;
    }
}

/* Hellos and probes past their deadline, however much of them has come. */
static void expire(int64_t now) {
    for (int i = 0; i < max_unauth; i++) {
        struct pending *e = &pend[i];
        if (!in_use(e) || e->killed || now < e->deadline_ms) continue;
        if (e->probe > 0) {
            nlog("%s: probe not done within %d ms of the connection; ended", e->peer, hello_timeout_ms);
            kill(e->probe, SIGKILL);
            e->killed = 1;
            continue;
        }
        nlog("%s: hello not complete within %d ms of the connection (%u bytes came); closed", e->peer,
             hello_timeout_ms, e->have);
        release(e);
    }
}

static void on_child(int sig) {
    (void)sig;
    int saved = errno;
    (void)!write(child_pipe[1], "", 1);
    errno = saved;
}

static void reap(void) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        struct worker *w = NULL;
        for (int i = 0; i < max_clients && !w; i++)
            if (running[i].pid == pid) w = &running[i];
        if (w) {
            w->pid = 0;
            workers--;
            int others = 0;
            for (int i = 0; i < max_clients; i++) others |= running[i].pid && !strcmp(running[i].share, w->share);
            if (budget_dir && !others) {   /* the share's last process here: its budget starts afresh */
                char path[512];
                budget_path(path, sizeof path, w->share);
                unlink(path);
            }
        } else {   /* a probe; one killed to make room has given its entry away already */
            for (int i = 0; i < max_unauth; i++)
                if (pend[i].probe == pid) pend[i].probe = 0;
            continue;
        }
        if (WIFSIGNALED(status)) slog("worker %d died of signal %d", (int)pid, WTERMSIG(status));
    }
}

static int positive(const char *flag, const char *v) {
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n < 1 || n > 1000000) {
        fprintf(stderr, "tessera-remote-server: %s must be a whole number from 1\n", flag);
        exit(2);
    }
    return (int)n;
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
        else if (!strcmp(k, "--max-clients")) max_clients = positive(k, v);
        else if (!strcmp(k, "--max-unauthenticated")) max_unauth = positive(k, v);
        else if (!strcmp(k, "--max-unauthenticated-per-address")) max_unauth_per_addr = positive(k, v);
        else if (!strcmp(k, "--hello-timeout-ms")) hello_timeout_ms = positive(k, v);
        else if (!strcmp(k, "--gpu")) add_gpu(v, "--gpu");
        else if (!strcmp(k, "--gpu-file")) load_gpu_file(v);
        else if (!strcmp(k, "--revoked-file")) revoked_file = v;
        else usage("unknown option");
        i++;
    }
    if (!listen_addr || !secret_file || !worker_path) usage("--listen, --secret-file and --worker are required");
    if (!ngpus)
        usage("no GPU named: pass --gpu UUID for each GPU this node serves (or --gpu-file with one a line); "
              "each client runs on its token's GPU, which must be one of them");
    load_secret();
    pend = calloc((size_t)max_unauth, sizeof *pend);
    running = calloc((size_t)max_clients, sizeof *running);
    revoked = revoked_file ? calloc(MAX_REVOKED, sizeof *revoked) : NULL;
    struct pollfd *fds = calloc((size_t)max_unauth + 2, sizeof *fds);
    int *which = calloc((size_t)max_unauth + 2, sizeof *which);
    if (!pend || !running || !fds || !which || (revoked_file && !revoked) || pipe2(child_pipe, O_CLOEXEC | O_NONBLOCK)) {
        fprintf(stderr, "tessera-remote-server: out of memory\n");
        exit(2);
    }
    for (int i = 0; i < max_unauth; i++) pend[i].fd = -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_child;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGCHLD, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    int lfd = open_listener();
    for (;;) {
        reap();
        reload_revoked();
        int64_t now = now_ms();
        expire(now);
        int nfds = 2, timeout = revoked_file ? 1000 : -1;   /* a revocation ends running workers within 1 s */
        fds[0] = (struct pollfd){child_pipe[0], POLLIN, 0};
        fds[1] = (struct pollfd){lfd, POLLIN, 0};
        for (int i = 0; i < max_unauth; i++) {
            struct pending *e = &pend[i];
            if (!in_use(e) || e->killed) continue;
            int64_t left = e->deadline_ms - now;
            if (left < 0) left = 0;
            if (timeout < 0 || left < timeout) timeout = (int)left;
            if (e->fd < 0) continue;
            which[nfds] = i;
            fds[nfds++] = (struct pollfd){e->fd, POLLIN, 0};
        }
        if (poll(fds, (nfds_t)nfds, timeout) < 0) {
            if (errno != EINTR) slog("poll: %s", strerror(errno));
            continue;
        }
        if (fds[0].revents) {
            char drain[64];
            while (read(child_pipe[0], drain, sizeof drain) > 0) {}
        }
        for (int k = 2; k < nfds; k++)
            if (fds[k].revents && pend[which[k]].fd == fds[k].fd) read_opening(&pend[which[k]], lfd);
        if (fds[1].revents & POLLIN) accept_clients(lfd);
    }
}
