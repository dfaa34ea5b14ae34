/* Compute: every launch passes the gate. With a time token held the gate is one atomic load; without
 * one the launching thread waits while the token thread asks the broker (or the local bucket) for the
 * next token. At the end of each token the token thread drains the device (the GPU time really used
 * by this token ends when its last kernel does), reports that time, and asks again if work remains. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "tessera.h"
#include "hooks.h"

#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>

/* A token held with no launch for this long is handed back early (the process went idle). */
#define IDLE_CHECK_NS (5ull * 1000 * 1000)

atomic_uint g_gate;
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t launch_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t thread_cv = PTHREAD_COND_INITIALIZER;
static int demand;             /* a launcher waits for a token; guarded by gate_mu */
static int thread_running;     /* guarded by gate_mu */
static CUcontext _Atomic launch_ctx;

static void sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) != 0) {
    }
}

/* Waits until the work this process queued has finished, so the token's end is real. */
static void drain_device(void) {
    CUcontext ctx = atomic_load_explicit(&launch_ctx, memory_order_acquire);
    CUresult (*push)(CUcontext) = (CUresult (*)(CUcontext))real_cuda("cuCtxPushCurrent_v2");
    CUresult (*pop)(CUcontext *) = (CUresult (*)(CUcontext *))real_cuda("cuCtxPopCurrent_v2");
    CUresult (*sync)(void) = (CUresult (*)(void))real_cuda("cuCtxSynchronize");
    if (!ctx || !push || !pop || !sync) return;
    if (push(ctx) != CUDA_SUCCESS) return;
    sync();
    CUcontext ignored;
    pop(&ignored);
}

static void *token_thread(void *arg) {
    (void)arg;
    /* our drains must not count as unsafe calls against another thread's CUDA graph capture */
    CUresult (*exchange)(CUstreamCaptureMode *) =
        (CUresult (*)(CUstreamCaptureMode *))real_cuda("cuThreadExchangeStreamCaptureMode");
    if (exchange) {
        CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        exchange(&mode);
    }
    uint64_t used = 0;
    int idle = 0;
    for (;;) {
        pthread_mutex_lock(&gate_mu);
        while (!demand) pthread_cond_wait(&thread_cv, &gate_mu);
        demand = 0;
        pthread_mutex_unlock(&gate_mu);

        uint64_t quota = token_acquire(used, idle);   /* also reports the previous token */
        uint64_t start = now_ns();
        pthread_mutex_lock(&gate_mu);
        atomic_store_explicit(&g_gate, GATE_VALID | GATE_SEEN, memory_order_release);
        pthread_cond_broadcast(&launch_cv);
        pthread_mutex_unlock(&gate_mu);

        /* Idle means no launch AND nothing of ours left on the GPU. A nap without a launch may only
         * mean the launcher waits for its own kernels (a long kernel, a graph, a synchronize): then
         * the device is drained and the token kept; only a further nap without a launch, after the
         * drain, is idle, and only the time since that drain is taken off what the token used. */
        idle = 0;
        uint64_t drained_at = 0, check = quota / 2 < IDLE_CHECK_NS ? quota / 2 : IDLE_CHECK_NS;
        if (check < 200000) check = 200000;
        for (;;) {
            uint64_t elapsed = now_ns() - start;
            if (elapsed >= quota) break;
            uint64_t nap = quota - elapsed < check ? quota - elapsed : check;
            sleep_ns(nap);
            if (now_ns() - start >= quota) break;
            unsigned before = atomic_fetch_and_explicit(&g_gate, ~GATE_SEEN, memory_order_acq_rel);
            if (before & GATE_SEEN) {
                drained_at = 0;
            } else if (drained_at) {
                idle = 1;
                break;
            } else {
                token_draining();
                drain_device();
                drained_at = now_ns();
            }
        }
        atomic_store_explicit(&g_gate, 0, memory_order_release);
        if (!idle) {
            token_draining();
            drain_device();
        }
        used = (idle ? drained_at : now_ns()) - start;

        pthread_mutex_lock(&gate_mu);
        /* a token that ran to its end while launches kept coming is renewed at once */
        int again = demand || !idle;
        demand = again;
        pthread_mutex_unlock(&gate_mu);
        if (!again) {
            token_release(used, idle);
            used = 0;
        }
    }
    return NULL;
}

void gate_wait_slow(void) {
    tessera_init();
    unsigned s = atomic_load_explicit(&g_gate, memory_order_acquire);
    if (s & GATE_VALID) {
        atomic_fetch_or_explicit(&g_gate, GATE_SEEN, memory_order_relaxed);
        return;
    }
    if (!atomic_load_explicit(&launch_ctx, memory_order_relaxed)) {
        CUresult (*current)(CUcontext *) = (CUresult (*)(CUcontext *))real_cuda("cuCtxGetCurrent");
        CUcontext ctx = NULL;
        if (current && current(&ctx) == CUDA_SUCCESS && ctx)
            atomic_store_explicit(&launch_ctx, ctx, memory_order_release);
    }
    pthread_mutex_lock(&gate_mu);
    if (!thread_running) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        /* the application's signals stay with the application's threads */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int err = pthread_create(&t, &attr, token_thread, NULL);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
        if (err) {
            /* better an ungated process than a hung one: the memory cap still holds */
            tlog(TLOG_ERROR, "cannot start the token thread (%s); launches are not gated", strerror(err));
            atomic_store_explicit(&g_gate, GATE_VALID | GATE_SEEN, memory_order_release);
            pthread_mutex_unlock(&gate_mu);
            return;
        }
        thread_running = 1;
    }
    /* Ask again after every wake-up without a token: a launcher that wakes late (descheduled on a busy
     * machine, or in a signal handler) may find that the token it asked for came and went as idle, and
     * its demand with it; waiting on without asking would wait for ever. */
    while (!(atomic_load_explicit(&g_gate, memory_order_acquire) & GATE_VALID)) {
        demand = 1;
        pthread_cond_signal(&thread_cv);
        pthread_cond_wait(&launch_cv, &gate_mu);
    }
    pthread_mutex_unlock(&gate_mu);
    atomic_fetch_or_explicit(&g_gate, GATE_SEEN, memory_order_relaxed);
}

void gate_fork_prepare(void) { pthread_mutex_lock(&gate_mu); }
void gate_fork_parent(void) { pthread_mutex_unlock(&gate_mu); }

void gate_after_fork_child(void) {
    /* the token thread and the parent's token stay with the parent */
    pthread_mutex_init(&gate_mu, NULL);
    pthread_cond_init(&launch_cv, NULL);
    pthread_cond_init(&thread_cv, NULL);
    demand = 0;
    thread_running = 0;
    atomic_store(&g_gate, 0);
    atomic_store(&launch_ctx, NULL);
}

/* ---- the launch paths ---- */

#define REAL_LAUNCH(name, type)                                                                      \
    static void *_Atomic name##_slot;                                                                \
    type real = (type)atomic_load_explicit(&name##_slot, memory_order_acquire);                      \
    if (__builtin_expect(!real, 0)) {                                                                \
        tessera_init();                                                                              \
        real = (type)real_cuda(#name);                                                               \
        atomic_store_explicit(&name##_slot, (void *)real, memory_order_release);                     \
        if (!real) return CUDA_ERROR_NOT_INITIALIZED;                                                \
    }                                                                                                \
    gate_enter()

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, CUstream, void **, void **);
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*coop_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            CUstream, void **);
typedef CUresult (*graph_fn)(CUgraphExec, CUstream);

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shmem, CUstream s, void **params, void **extra) {
    REAL_LAUNCH(cuLaunchKernel, launch_fn);
    return real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, unsigned shmem, CUstream s, void **params, void **extra) {
    REAL_LAUNCH(cuLaunchKernel_ptsz, launch_fn);
    return real(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
    REAL_LAUNCH(cuLaunchKernelEx, launch_ex_fn);
    return real(config, f, params, extra);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
    REAL_LAUNCH(cuLaunchKernelEx_ptsz, launch_ex_fn);
    return real(config, f, params, extra);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                   unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params) {
    REAL_LAUNCH(cuLaunchCooperativeKernel, coop_fn);
    return real(f, gx, gy, gz, bx, by, bz, shmem, s, params);
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                        unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params) {
    REAL_LAUNCH(cuLaunchCooperativeKernel_ptsz, coop_fn);
    return real(f, gx, gy, gz, bx, by, bz, shmem, s, params);
}

CUresult cuGraphLaunch(CUgraphExec exec, CUstream s) {
    REAL_LAUNCH(cuGraphLaunch, graph_fn);
    return real(exec, s);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s) {
    REAL_LAUNCH(cuGraphLaunch_ptsz, graph_fn);
    return real(exec, s);
}
