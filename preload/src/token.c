/* Where tokens come from: the node's share broker over its Unix socket (protocol in PROTOCOL.md),
 * or, while the broker is away, a local token bucket that holds the process to its request share.
 * Only the token thread calls these functions. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "tessera.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define LOCAL_QUOTA_NS (20ull * 1000 * 1000)
#define RECONNECT_NS (1000ull * 1000 * 1000)
#define REPLY_TIMEOUT_S 30

static int broker_fd = -1;
static int broker_drain;         /* the broker takes DRAIN notices (said in its OK line) */
static uint64_t last_attempt_ns;
static int fallback_logged;
static uint64_t local_next_ns;   /* the local bucket lets the next token start here */
static char rbuf[512];
static size_t rlen;

static void disconnect(const char *why) {
    if (broker_fd >= 0) {
        close(broker_fd);
        broker_fd = -1;
        tlog(TLOG_WARN, "lost the share broker (%s)", why);
        fallback_logged = 0;
    }
    rlen = 0;
}

static int send_line(const char *line) {
    size_t len = strlen(line), off = 0;
    while (off < len) {
        ssize_t n = send(broker_fd, line + off, len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        off += (size_t)n;
    }
    return 0;
}

/* One reply line without its newline, or -1 when the broker is gone or silent too long. */
static int read_line(char *out, size_t cap) {
    for (;;) {
        char *nl = memchr(rbuf, '\n', rlen);
        if (nl) {
            size_t n = (size_t)(nl - rbuf);
            if (n >= cap) return -1;
            memcpy(out, rbuf, n);
            out[n] = 0;
            memmove(rbuf, nl + 1, rlen - n - 1);
            rlen -= n + 1;
            return 0;
        }
        if (rlen == sizeof rbuf) return -1;   /* a line this long is not ours */
        ssize_t got = recv(broker_fd, rbuf + rlen, sizeof rbuf - rlen, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        rlen += (size_t)got;
    }
}

static void try_connect(void) {
    uint64_t now = now_ns();
    if (last_attempt_ns && now - last_attempt_ns < RECONNECT_NS) return;
    last_attempt_ns = now;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", g_cfg.broker_socket);
    struct timeval tv = {REPLY_TIMEOUT_S, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        int err = errno;
        close(fd);
        if (!fallback_logged) {
            tlog(TLOG_WARN, "share broker %s unreachable (%s); holding to the request share %.3f locally",
                 g_cfg.broker_socket, strerror(err), g_cfg.request);
            fallback_logged = 1;
        }
        return;
    }
    broker_fd = fd;
    rlen = 0;
    char line[512];
    snprintf(line, sizeof line, "HELLO v=1 share=%s gpu=%s pid=%d request=%.4f limit=%.4f priority=%s\n",
             g_cfg.share_id, g_cfg.gpu, (int)getpid(), g_cfg.request, g_cfg.limit,
             g_cfg.priority_high ? "high" : "low");
    if (send_line(line) || read_line(line, sizeof line)) {
        disconnect("no answer to HELLO");
        return;
    }
    if (strncmp(line, "OK", 2) != 0) {
        if (!fallback_logged)
            tlog(TLOG_ERROR, "share broker refused this process (%s); holding to the request share %.3f locally",
                 line, g_cfg.request);
        fallback_logged = 1;
        close(broker_fd);
        broker_fd = -1;
        return;
    }
    broker_drain = strstr(line, " drain=1") != NULL;
    tlog(TLOG_INFO, "connected to the share broker %s", g_cfg.broker_socket);
    fallback_logged = 0;
}

static void local_charge(uint64_t used_ns) {
    /* Hold the process to its request: a token that used `used` ns lets the next one start used / request
     * after this one was due to start. Counting from the token's end instead would add each hand-off's
     * own delays (oversleep, thread wake-ups) to the wait and leave the share short of its request. At
     * most one quantum of lateness carries over, so a process back from idle gets no burst. */
    uint64_t now = now_ns(), start = now > used_ns ? now - used_ns : 0;
    if (local_next_ns + LOCAL_QUOTA_NS < start) local_next_ns = start;
    local_next_ns += (uint64_t)((double)used_ns / g_cfg.request);
}

static uint64_t local_grant(void) {
    uint64_t now = now_ns();
    if (local_next_ns > now) {
        uint64_t wait = local_next_ns - now;
        struct timespec ts = {(time_t)(wait / 1000000000ull), (long)(wait % 1000000000ull)};
        while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) != 0) {
        }
    }
    return LOCAL_QUOTA_NS;
}

uint64_t token_acquire(uint64_t prev_used_ns, int prev_idle) {
    if (broker_fd < 0) try_connect();
    if (broker_fd >= 0) {
        char line[512];
        snprintf(line, sizeof line, "ACQUIRE used_us=%llu idle=%d\n",
                 (unsigned long long)(prev_used_ns / 1000), prev_idle);
        unsigned long long quota_us;
        if (send_line(line) == 0 && read_line(line, sizeof line) == 0 &&
            sscanf(line, "GRANT quota_us=%llu", &quota_us) == 1 && quota_us > 0) {
            return quota_us * 1000;
        }
        disconnect(line[0] ? line : "no grant");
    }
    local_charge(prev_used_ns);
    return local_grant();
}

void token_release(uint64_t used_ns, int idle) {
    if (broker_fd >= 0) {
        char line[128];
        snprintf(line, sizeof line, "RELEASE used_us=%llu idle=%d\n", (unsigned long long)(used_ns / 1000),
                 idle);
        if (send_line(line) == 0) return;
        disconnect("send failed");
    }
    local_charge(used_ns);
}

void token_draining(void) {
    if (broker_fd >= 0 && broker_drain && send_line("DRAIN\n") != 0) disconnect("send failed");
}

void token_after_fork_child(void) {
    /* the socket belongs to the parent's conversation with the broker */
    if (broker_fd >= 0) close(broker_fd);
    broker_fd = -1;
    rlen = 0;
    last_attempt_ns = 0;
    local_next_ns = 0;
}
