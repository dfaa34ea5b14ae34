/* Symbol resolution: the real driver/NVML entry points, our dlsym, and cuGetProcAddress.
 *
 * The CUDA runtime loads libcuda.so.1 with dlopen and looks up cuGetProcAddress_v2 with dlsym on
 * that handle, then takes every other entry point from cuGetProcAddress. Symbol interposition alone
 * never sees those calls, so we replace dlsym itself (the real one comes from dlvsym) and translate
 * every pointer cuGetProcAddress hands out into our hook for the same variant. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "tessera.h"
#include "hooks.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define HOOK(n) {#n, (void *)&n, NULL, 0}
#define NVML_HOOK(n) {#n, (void *)&n, NULL, 1}

struct hook g_hooks[] = {
    HOOK(cuMemAlloc_v2), HOOK(cuMemAllocPitch_v2), HOOK(cuMemAllocManaged),
    HOOK(cuMemAllocAsync), HOOK(cuMemAllocAsync_ptsz), HOOK(cuMemAllocFromPoolAsync),
    HOOK(cuMemAllocFromPoolAsync_ptsz), HOOK(cuMemFree_v2), HOOK(cuMemFreeAsync),
    HOOK(cuMemFreeAsync_ptsz), HOOK(cuMemCreate), HOOK(cuMemRelease), HOOK(cuArrayCreate_v2),
    HOOK(cuArray3DCreate_v2), HOOK(cuArrayDestroy), HOOK(cuMipmappedArrayCreate), HOOK(cuMipmappedArrayDestroy),
    HOOK(cuMemGetInfo_v2), HOOK(cuDeviceTotalMem_v2),
    HOOK(cuLaunchKernel), HOOK(cuLaunchKernel_ptsz), HOOK(cuLaunchKernelEx), HOOK(cuLaunchKernelEx_ptsz),
    HOOK(cuLaunchCooperativeKernel), HOOK(cuLaunchCooperativeKernel_ptsz), HOOK(cuGraphLaunch),
    HOOK(cuGraphLaunch_ptsz), {"cuGetProcAddress", (void *)&tessera_cuGetProcAddress_v1, NULL, 0},
    HOOK(cuGetProcAddress_v2), NVML_HOOK(nvmlDeviceGetMemoryInfo), NVML_HOOK(nvmlDeviceGetMemoryInfo_v2),
    {NULL, NULL, NULL, 0},
};

/* ---- the real dlsym ----
 * Sanitizer runtimes call dlsym while they initialise, before their instrumentation can run: the
 * code on this path is left uninstrumented and calls nothing the sanitizers intercept. */
#define EARLY __attribute__((no_sanitize_address, no_sanitize_thread, no_instrument_function))

__attribute__((visibility("hidden"))) void *(*tessera_real_dlsym_ptr)(void *, const char *);

EARLY static void real_dlsym_init(void) {
    void *(*fn)(void *, const char *) = __atomic_load_n(&tessera_real_dlsym_ptr, __ATOMIC_ACQUIRE);
    if (fn) return;
    fn = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    /* before glibc 2.34 dlsym lived in libdl, at the architecture's first symbol version */
    if (!fn) fn = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (!fn) fn = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");
    __atomic_store_n(&tessera_real_dlsym_ptr, fn, __ATOMIC_RELEASE);
}

void *real_dlsym(void *handle, const char *symbol) {
    real_dlsym_init();
    return tessera_real_dlsym_ptr ? tessera_real_dlsym_ptr(handle, symbol) : NULL;
}

EARLY static int same(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}

EARLY const struct hook *hook_by_name(const char *name) {
    for (const struct hook *h = g_hooks; h->name; h++)
        if (same(h->name, name)) return h;
    return NULL;
}

/* Decides whether dlsym(handle, symbol) should answer with our hook. Called from the dlsym stub
 * before anything else, possibly before our constructor ran (sanitizer runtimes call dlsym early). */
EARLY __attribute__((visibility("hidden"), used)) void *tessera_dlsym_filter(void *handle, const char *symbol) {
    real_dlsym_init();
    if (!symbol || (symbol[0] != 'c' && symbol[0] != 'n')) return NULL;
    const struct hook *h = hook_by_name(symbol);
    if (!h) return NULL;
    if (handle == RTLD_DEFAULT || handle == RTLD_NEXT) return h->fn;
    /* a concrete handle: answer only if that library really provides the symbol */
    return tessera_real_dlsym_ptr(handle, symbol) ? h->fn : NULL;
}

#if defined(__x86_64__)
/* dlsym must reach the real one by a tail jump: glibc resolves RTLD_NEXT relative to the return
 * address, which has to stay the caller's. */
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        "dlsym:\n"
        "  .cfi_startproc\n"
        "  pushq %rdi\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  pushq %rsi\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  subq $8, %rsp\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  call tessera_dlsym_filter\n"
        "  addq $8, %rsp\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  popq %rsi\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  popq %rdi\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  testq %rax, %rax\n"
        "  jz 1f\n"
        "  ret\n"
        "1:\n"
        "  jmp *tessera_real_dlsym_ptr(%rip)\n"
        "  .cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#elif defined(__aarch64__)
/* The same on AArch64 (Grace Hopper and other Arm GPU nodes): the link register is restored
 * before the tail branch, so the real dlsym sees the caller's return address. x16 is the
 * intra-procedure-call scratch register, free to clobber at a branch. */
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, %function\n"
        ".p2align 2\n"
        "dlsym:\n"
        "  .cfi_startproc\n"
        "  stp x29, x30, [sp, #-32]!\n"
        "  .cfi_def_cfa_offset 32\n"
        "  .cfi_offset 29, -32\n"
        "  .cfi_offset 30, -24\n"
        "  mov x29, sp\n"
        "  stp x0, x1, [sp, #16]\n"
        "  bl tessera_dlsym_filter\n"
        "  cbz x0, 1f\n"
        "  ldp x29, x30, [sp], #32\n"
        "  .cfi_remember_state\n"
        "  .cfi_def_cfa_offset 0\n"
        "  .cfi_restore 29\n"
        "  .cfi_restore 30\n"
        "  ret\n"
        "  .cfi_restore_state\n"
        "1:\n"
        "  ldp x0, x1, [sp, #16]\n"
        "  ldp x29, x30, [sp], #32\n"
        "  .cfi_def_cfa_offset 0\n"
        "  .cfi_restore 29\n"
        "  .cfi_restore 30\n"
        "  adrp x16, tessera_real_dlsym_ptr\n"
        "  ldr x16, [x16, :lo12:tessera_real_dlsym_ptr]\n"
        "  br x16\n"
        "  .cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#else
#error "the dlsym stub is written for x86-64 and AArch64 only"
#endif

/* ---- the real libraries ---- */

static void *open_lib(void *_Atomic *slot, const char *soname) {
    void *h = atomic_load_explicit(slot, memory_order_acquire);
    if (h) return h;
    h = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) h = dlopen(soname, RTLD_LAZY);
    if (h) atomic_store_explicit(slot, h, memory_order_release);
    return h;
}

static void *_Atomic cuda_handle, *_Atomic nvml_handle;

void *real_cuda(const char *symbol) {
    void *h = open_lib(&cuda_handle, "libcuda.so.1");
    return h ? real_dlsym(h, symbol) : NULL;
}

void *real_nvml(const char *symbol) {
    void *h = open_lib(&nvml_handle, "libnvidia-ml.so.1");
    return h ? real_dlsym(h, symbol) : NULL;
}

static pthread_mutex_t resolve_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int resolved;

void hooks_resolve(void) {
    if (atomic_load_explicit(&resolved, memory_order_acquire)) return;
    pthread_mutex_lock(&resolve_mu);
    if (!atomic_load_explicit(&resolved, memory_order_relaxed)) {
        int ok = 1;
        for (struct hook *h = g_hooks; h->name; h++) {
            if (h->nvml) continue;
            void *r = real_cuda(h->name);
            __atomic_store_n(&h->real, r, __ATOMIC_RELAXED);
            if (!atomic_load(&cuda_handle)) ok = 0;
        }
        if (ok) atomic_store_explicit(&resolved, 1, memory_order_release);
    }
    pthread_mutex_unlock(&resolve_mu);
}

void *hook_for_real(void *pfn) {
    hooks_resolve();
    for (struct hook *h = g_hooks; h->name; h++) {
        if (h->fn == pfn) return pfn;
        if (!h->nvml && __atomic_load_n(&h->real, __ATOMIC_RELAXED) == pfn) return h->fn;
    }
    return pfn;
}

/* ---- cuGetProcAddress: hand out our pointers, by variant ---- */

typedef CUresult (*gpa_v1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

/* Our hook for what the caller asked, by the driver's own rules: _ptsz for per-thread default
 * stream lookups, _v2 from CUDA 3.2 on where a _v2 exists, cuGetProcAddress_v2 from 12.0. */
static void *hook_by_request(const char *symbol, int version, cuuint64_t flags) {
    char name[128];
    const struct hook *h = NULL;
    if (strlen(symbol) > 100) return NULL;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        snprintf(name, sizeof name, "%s_ptsz", symbol);
        h = hook_by_name(name);
    }
    if (!h && !strcmp(symbol, "cuGetProcAddress")) h = hook_by_name(version >= 12000 ? "cuGetProcAddress_v2" : symbol);
    if (!h && version >= 3020) {
        snprintf(name, sizeof name, "%s_v2", symbol);
        h = hook_by_name(name);
    }
    if (!h) h = hook_by_name(symbol);
    return h && !h->nvml && real_cuda(h->name) ? h->fn : NULL;
}

static void translate(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    void *mine = hook_for_real(*pfn);
    if (mine == *pfn) {
        /* a pointer we do not know (the driver may hand out internal entry points): a call we count
         * must never slip past uncounted, so fall back to the hook for the name and variant asked */
        void *by_name = hook_by_request(symbol, version, flags);
        if (by_name && by_name != *pfn) {
            tlog(TLOG_INFO, "cuGetProcAddress(%s, %d, %llu): unknown driver pointer, hooked by name", symbol,
                 version, (unsigned long long)flags);
            mine = by_name;
        }
    }
    if (mine != *pfn)
        tlog(TLOG_DEBUG, "cuGetProcAddress(%s, %d, %llu): hooked", symbol, version, (unsigned long long)flags);
    *pfn = mine;
}

CUresult tessera_cuGetProcAddress_v1(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    tessera_init();
    gpa_v1_fn real = (gpa_v1_fn)real_cuda("cuGetProcAddress");
    if (!real) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(symbol, pfn, version, flags);
    if (r == CUDA_SUCCESS && pfn && *pfn) translate(symbol, pfn, version, flags);
    return r;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
    tessera_init();
    gpa_v2_fn real = (gpa_v2_fn)real_cuda("cuGetProcAddress_v2");
    if (!real) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(symbol, pfn, version, flags, status);
    if (r == CUDA_SUCCESS && pfn && *pfn) translate(symbol, pfn, version, flags);
    return r;
}
