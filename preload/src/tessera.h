/* Internal interfaces of the Tessera preload library. */
#ifndef TESSERA_H
#define TESSERA_H

#include <cuda.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define TLOG_ERROR 0
#define TLOG_WARN 1
#define TLOG_INFO 2
#define TLOG_DEBUG 3

#define TESSERA_NO_LIMIT UINT64_MAX

struct tessera_config {
    uint64_t mem_limit;        /* bytes; TESSERA_NO_LIMIT when unset */
    int compute_enabled;       /* a request or limit was given */
    double request, limit;     /* 0 < request <= limit <= 1 */
    int priority_high;
    int log_level;
    char broker_socket[108];
    char share_id[128];
    char gpu[128];
    char budget_path[256];
};

extern struct tessera_config g_cfg;

void tlog(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void config_load(void);
/* Parses "123", "4Ki", "2Gi" (also K/M/G/T = powers of 1024). 0 on success. */
int parse_bytes(const char *text, uint64_t *out);
uint64_t now_ns(void);

/* Library start-up: configuration, real symbols, fork handlers. Cheap once done. */
extern atomic_int g_ready;
void tessera_init_slow(void);
static inline void tessera_init(void) {
    if (__builtin_expect(!atomic_load_explicit(&g_ready, memory_order_acquire), 0))
        tessera_init_slow();
}

/* Real driver / NVML entry points, resolved on the libraries' own handles. */
void *real_dlsym(void *handle, const char *symbol);
void *real_cuda(const char *symbol);
void *real_nvml(const char *symbol);

struct hook {
    const char *name;
    void *fn;        /* our replacement */
    void *real;      /* the library's own address, filled at start-up */
    int nvml;
};
extern struct hook g_hooks[];
const struct hook *hook_by_name(const char *name);
void hooks_resolve(void);
/* Our replacement for a real driver pointer, or the pointer itself. */
void *hook_for_real(void *pfn);

/* Container-wide memory budget (budget.c). */
int budget_reserve(uint64_t bytes);   /* 0: reserved; -1: over the cap */
void budget_release(uint64_t bytes);
uint64_t budget_used(void);
void budget_after_fork_child(void);

/* Process-local record of allocation sizes (alloc_table.c). */
enum alloc_kind { ALLOC_PTR = 0, ALLOC_VMM = 1, ALLOC_ARRAY = 2 };
void alloc_track(enum alloc_kind kind, uint64_t key, uint64_t size);
uint64_t alloc_untrack(enum alloc_kind kind, uint64_t key);   /* size, 0 if unknown */
void alloc_after_fork_child(void);
void alloc_fork_prepare(void);
void alloc_fork_parent(void);

/* Compute gate (gate.c): bit 0 = token valid, bit 1 = a launch was seen this period. */
#define GATE_VALID 1u
#define GATE_SEEN 2u
extern atomic_uint g_gate;
void gate_wait_slow(void);
static inline void gate_enter(void) {
    if (!g_cfg.compute_enabled) return;
    if (__builtin_expect(atomic_load_explicit(&g_gate, memory_order_acquire) == (GATE_VALID | GATE_SEEN), 1))
        return;
    gate_wait_slow();
}
void gate_fork_prepare(void);
void gate_fork_parent(void);
void gate_after_fork_child(void);

/* Token source (token.c): the broker, or the local bucket when it is away. */
struct token_client;
uint64_t token_acquire(uint64_t prev_used_ns, int prev_idle);   /* quota in ns */
void token_release(uint64_t used_ns, int idle);
void token_draining(void);   /* the holder waits for the work it queued (a broker that offers DRAIN) */
void token_after_fork_child(void);

#endif
