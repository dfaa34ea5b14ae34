/* Raw TCP throughput on a link, the baseline remote copies are measured against: the same socket
 * options as the remote GPU wire (TCP_NODELAY, buffers autotuned), one buffer sent whole and acknowledged.
 *   tcp_raw serve HOST PORT_FILE          accept one connection; per round: read BYTES, answer one byte;
 *                                          then send BYTES back, for the other direction
 *   tcp_raw send HOST:PORT BYTES REPEATS  prints send_s= and recv_s= (best of REPEATS) */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}
static void tune(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}
static int all(int fd, char *p, size_t n, int sending) {
    while (n) {
        ssize_t k = sending ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, MSG_WAITALL);
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "serve")) {
        int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        struct sockaddr_in a = {.sin_family = AF_INET};
        inet_pton(AF_INET, argv[2], &a.sin_addr);
        socklen_t al = sizeof a;
        if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1)) return 1;
        getsockname(l, (struct sockaddr *)&a, &al);
        FILE *f = fopen(argv[3], "w");
        fprintf(f, "%d\n", ntohs(a.sin_port));
        fclose(f);
        int c = accept(l, NULL, NULL);
        tune(c);
        uint64_t hdr[2];   /* bytes, repeats */
        if (all(c, (char *)hdr, sizeof hdr, 0)) return 1;
        char *buf = malloc(hdr[0]);
        memset(buf, 2, hdr[0]);
        for (uint64_t i = 0; i < hdr[1]; i++) {
            char ack = 1;
            if (all(c, buf, hdr[0], 0) || all(c, &ack, 1, 1)) return 1;
            if (all(c, &ack, 1, 0) || all(c, buf, hdr[0], 1)) return 1;
        }
        return 0;
    }
    if (argc >= 5 && !strcmp(argv[1], "send")) {
        char host[64];
        const char *colon = strrchr(argv[2], ':');
        snprintf(host, sizeof host, "%.*s", (int)(colon - argv[2]), argv[2]);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
        inet_pton(AF_INET, host, &a.sin_addr);
        int c = socket(AF_INET, SOCK_STREAM, 0);
        tune(c);
        if (connect(c, (struct sockaddr *)&a, sizeof a)) return 1;
        uint64_t hdr[2] = {strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10)};
        char *buf = malloc(hdr[0]);
        memset(buf, 1, hdr[0]);
        if (all(c, (char *)hdr, sizeof hdr, 1)) return 1;
        double best_send = 1e9, best_recv = 1e9;
        for (uint64_t i = 0; i < hdr[1]; i++) {
            char ack;
            double t0 = now_s();
            if (all(c, buf, hdr[0], 1) || all(c, &ack, 1, 0)) return 1;
            double t1 = now_s();
            if (all(c, &ack, 1, 1) || all(c, buf, hdr[0], 0)) return 1;
            double t2 = now_s();
            if (t1 - t0 < best_send) best_send = t1 - t0;
            if (t2 - t1 < best_recv) best_recv = t2 - t1;
        }
        printf("send_s=%.6f\nrecv_s=%.6f\n", best_send, best_recv);
        return 0;
    }
    return 2;
}
