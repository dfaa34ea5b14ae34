/* Launches fake kernels and reports the device time it got, as one JSON line.
 *   kernel_loop --seconds S --kernel-us K [--path P] [--burst N --pause-ms M] [--start-at EPOCH] [--threads T]
 *               [--stall-ms D]
 * path: launch launch_ptsz ex ex_ptsz coop coop_ptsz graph graph_ptsz. With --burst, work comes in
 * bursts of N kernels separated by M ms of idle time; "bursts" counts the finished ones. With --stall-ms,
 * every 4 D ms each launching thread is held up for D ms (a signal handler that sleeps), as a thread of
 * a busy machine is when the scheduler runs others: it may wake late to a token it waited for. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                        unsigned, CUstream, void **);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);
uint64_t fakeBusyNs(void);
uint64_t fakeKernels(void);
CUgraphExec fakeGraphCreate(uint64_t us);

static double seconds = 5, pause_ms = 0, start_at = 0, stall_ms = 0;
static unsigned long long kernel_us = 1000, burst = 0;
static const char *path = "launch";
static int threads = 1;
static volatile int stop;
static unsigned long long bursts_done;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void stall(int sig) {
    (void)sig;
    struct timespec ts = {(time_t)(stall_ms / 1000), (long)(stall_ms * 1e6) % 1000000000L};
    nanosleep(&ts, NULL);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static CUresult launch(CUfunction f, CUgraphExec g) {
    uint64_t us = kernel_us;
    void *params[] = {&us};
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
    if (!strcmp(path, "launch")) return cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
    if (!strcmp(path, "launch_ptsz")) return cuLaunchKernel_ptsz(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
    if (!strcmp(path, "ex")) return cuLaunchKernelEx(&cfg, f, params, NULL);
    if (!strcmp(path, "ex_ptsz")) return cuLaunchKernelEx_ptsz(&cfg, f, params, NULL);
    if (!strcmp(path, "coop")) return cuLaunchCooperativeKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, params);
    if (!strcmp(path, "coop_ptsz")) return cuLaunchCooperativeKernel_ptsz(f, 1, 1, 1, 1, 1, 1, 0, NULL, params);
    if (!strcmp(path, "graph")) return cuGraphLaunch(g, NULL);
    if (!strcmp(path, "graph_ptsz")) return cuGraphLaunch_ptsz(g, NULL);
    fprintf(stderr, "kernel_loop: unknown path %s\n", path);
    exit(2);
}

static void *worker(void *arg) {
    (void)arg;
    CUcontext ctx;
    CUdevice dev;
    cuDeviceGet(&dev, 0);
    cuDevicePrimaryCtxRetain(&ctx, dev);
    cuCtxSetCurrent(ctx);
    CUmodule m;
    CUfunction f;
    cuModuleLoadData(&m, "fake");
    cuModuleGetFunction(&f, m, "spin");
    CUgraphExec g = fakeGraphCreate(kernel_us);
    while (!stop) {
        unsigned long long n = burst ? burst : 1;
        for (unsigned long long i = 0; i < n && !stop; i++) {
            if (launch(f, g) != CUDA_SUCCESS) {
                fprintf(stderr, "kernel_loop: launch failed\n");
                exit(1);
            }
        }
        if (burst && !stop) {
            cuCtxSynchronize();
            pthread_mutex_lock(&mu);
            bursts_done++;
            pthread_mutex_unlock(&mu);
            usleep((useconds_t)(pause_ms * 1000));
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--kernel-us")) kernel_us = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--path")) path = argv[i + 1];
        else if (!strcmp(argv[i], "--burst")) burst = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--pause-ms")) pause_ms = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--start-at")) start_at = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--stall-ms")) stall_ms = atof(argv[i + 1]);
        else {
            fprintf(stderr, "kernel_loop: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    cuInit(0);
    double wait = start_at - now_s();
    if (wait > 0) usleep((useconds_t)(wait * 1e6));
    uint64_t busy0 = fakeBusyNs(), k0 = fakeKernels();
    double t0 = now_s();
    pthread_t tids[64];
    if (threads < 1 || threads > 64) return 2;
    if (stall_ms > 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = stall;
        sa.sa_flags = SA_RESTART;
        sigaction(SIGUSR1, &sa, NULL);
    }
    for (int i = 0; i < threads; i++) pthread_create(&tids[i], NULL, worker, NULL);
    if (stall_ms > 0) {
        while (now_s() - t0 < seconds) {
            usleep((useconds_t)(stall_ms * 4000));
            for (int i = 0; i < threads; i++) pthread_kill(tids[i], SIGUSR1);
        }
    } else {
        usleep((useconds_t)(seconds * 1e6));
    }
    /* measure at the deadline: work still running after it is not counted */
    uint64_t busy = fakeBusyNs() - busy0, kernels = fakeKernels() - k0;
    double wall = now_s() - t0;
    pthread_mutex_lock(&mu);
    unsigned long long bursts = bursts_done;
    pthread_mutex_unlock(&mu);
    printf("{\"busy_s\": %.6f, \"wall_s\": %.6f, \"kernels\": %llu, \"bursts\": %llu}\n", busy / 1e9, wall,
           (unsigned long long)kernels, bursts);
    fflush(stdout);
    _exit(0);   /* do not wait for a kernel in flight */
}
