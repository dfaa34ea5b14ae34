/* Start-up: configuration once per process, and fork handlers that keep the child consistent. */
#include "tessera.h"

#include <pthread.h>

atomic_int g_ready;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void fork_prepare(void) {
    gate_fork_prepare();
    alloc_fork_prepare();
}

static void fork_parent(void) {
    alloc_fork_parent();
    gate_fork_parent();
}

static void fork_child(void) {
    alloc_after_fork_child();
    gate_after_fork_child();
    token_after_fork_child();
    budget_after_fork_child();
}

static void init_once(void) {
    config_load();
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    atomic_store_explicit(&g_ready, 1, memory_order_release);
}

void tessera_init_slow(void) { pthread_once(&once, init_once); }

/* Only the environment is read here: no dlopen and no driver calls in a constructor. */
__attribute__((constructor)) static void tessera_constructor(void) { tessera_init_slow(); }
