/* The part of the fake libcuda.so.1 that NVIDIA's CUDA runtime (libcudart, shared and static) needs
 * before it will use a driver: the private export tables it asks for with cuGetExportTable, the
 * few driver calls it makes while creating its context, and an entry point for every other name it
 * resolves up front.
 *
 * The tables are undocumented. What each slot does, and the runtime's integrity check (an HMAC over
 * MD2 of a few facts about the process and its devices), are as the ZLUDA project describes them
 * (github.com/vosen/ZLUDA, dark_api); MD2 itself is RFC 1319. Only what the runtime uses to
 * allocate, free and query memory is implemented: loading kernels from fat binaries is refused
 * (CUDA_ERROR_NOT_SUPPORTED), so programs that launch through the runtime are out of reach here.
 *
 * Uses only the driver's public entry points (cuCtxGetCurrent, cuDeviceGetAttribute, ...), which
 * bind inside this library (-Bsymbolic), never through the preload library. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_cuda_runtime.h"

/* ---- the runtime's own interface: its primary context; modules are not supported ---- */
static CUresult rt_primary_context(CUcontext *ctx, CUdevice dev) {
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    return cuDevicePrimaryCtxRetain(ctx, dev);
}
static CUresult rt_module_from_fatbin(void) { return CUDA_ERROR_NOT_SUPPORTED; }
/* Slots whose purpose is unknown: the runtime calls some of them (tools TLS slot 2 from
 * cudaGetDeviceProperties, with a 0x78-byte record); doing nothing and answering success is what a
 * driver without tools attached amounts to. */
static CUresult rt_noop(void) { return CUDA_SUCCESS; }
static CUresult rt_load_compilers(void) { return CUDA_SUCCESS; }

#define TABLE_SIZE(n) ((const void *)((n) * sizeof(void *)))

#define NOOP ((const void *)rt_noop)
static const void *const cudart_interface[13] = {
    TABLE_SIZE(13), (const void *)rt_module_from_fatbin, (const void *)rt_primary_context, NOOP, NOOP, NOOP,
    (const void *)rt_module_from_fatbin, NOOP, (const void *)rt_module_from_fatbin, NOOP, NOOP, NOOP,
    (const void *)rt_load_compilers,
};

/* ---- tools hooks: two scratch buffers the runtime writes its callback state into ---- */
static unsigned char hooks_buffer1[1024], hooks_buffer2[14];
static void hooks_get_buffer1(void **ptr, size_t *size) { *ptr = hooks_buffer1; *size = sizeof hooks_buffer1; }
static void hooks_get_buffer2(void **ptr, size_t *size) { *ptr = hooks_buffer2; *size = sizeof hooks_buffer2; }
static const void *const tools_callback_hooks[7] = {
    TABLE_SIZE(7), NOOP, (const void *)hooks_get_buffer1, NOOP, NOOP, NOOP, (const void *)hooks_get_buffer2,
};
static const void *const tools_tls[4] = {TABLE_SIZE(4), NOOP, NOOP, NOOP};

/* ---- context-local storage: the runtime keeps its per-context state under its own keys ---- */
#define CLS_SLOTS 256
static pthread_mutex_t cls_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { CUcontext ctx; void *key, *value; } cls[CLS_SLOTS];

static CUcontext cls_context(CUcontext ctx) {
    if (!ctx) cuCtxGetCurrent(&ctx);
    return ctx;
}
static CUresult cls_put(CUcontext ctx, void *key, void *value, void *on_destroy) {
    (void)on_destroy;  /* contexts of the fake are never destroyed */
    if (!(ctx = cls_context(ctx))) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&cls_mu);
    int empty = -1;
    for (int i = 0; i < CLS_SLOTS; i++) {
        if (cls[i].key == key && cls[i].ctx == ctx) { empty = i; break; }
        if (!cls[i].key && empty < 0) empty = i;
    }
    if (empty >= 0) {
        cls[empty].ctx = ctx, cls[empty].key = key, cls[empty].value = value;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&cls_mu);
    return rc;
}
static CUresult cls_delete(CUcontext ctx, void *key) {
    if (!(ctx = cls_context(ctx))) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&cls_mu);
    for (int i = 0; i < CLS_SLOTS; i++)
        if (cls[i].key == key && cls[i].ctx == ctx) cls[i].key = NULL;
    pthread_mutex_unlock(&cls_mu);
    return CUDA_SUCCESS;
}
static CUresult cls_get(void **value, CUcontext ctx, void *key) {
    if (!(ctx = cls_context(ctx))) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult rc = CUDA_ERROR_INVALID_HANDLE;  /* nothing stored under this key yet */
    pthread_mutex_lock(&cls_mu);
    for (int i = 0; i < CLS_SLOTS; i++)
        if (cls[i].key == key && cls[i].ctx == ctx) { *value = cls[i].value; rc = CUDA_SUCCESS; break; }
    pthread_mutex_unlock(&cls_mu);
    return rc;
}
static const void *const context_local_storage[4] = {
    (const void *)cls_put, (const void *)cls_delete, (const void *)cls_get, NOOP,
};

/* ---- context checks: nothing to report ---- */
static CUresult check_context(CUcontext ctx, uint32_t *flags, const void **extra) {
    (void)ctx;
    if (flags) *flags = 0;
    if (extra) *extra = NULL;
    return CUDA_SUCCESS;
}
static uint32_t check_nothing(void) { return 0; }
static const void *const context_checks[4] = {
    TABLE_SIZE(4), NOOP, (const void *)check_context, (const void *)check_nothing,
};

/* ---- integrity check: HMAC-MD2 over the process, this library's tables and the devices ---- */
static const unsigned char MD2_S[256] = {
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19, 98, 167, 5, 243, 192, 199, 115, 140,
    152, 147, 43, 217, 188, 76, 130, 202, 30, 155, 87, 60, 253, 212, 224, 22, 103, 66, 111, 24, 138, 23, 229, 18,
    190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47, 238, 122, 169, 104, 121, 145, 21, 178, 7,
    63, 148, 194, 16, 137, 11, 34, 95, 33, 128, 127, 93, 154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3,
    255, 25, 48, 179, 72, 165, 181, 209, 215, 94, 146, 42, 172, 86, 170, 198, 79, 184, 56, 210, 150, 164, 125, 182,
    118, 252, 107, 226, 156, 116, 4, 241, 69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2,
    27, 96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15, 85, 71, 163, 35, 221, 81, 175, 58, 195,
    92, 249, 206, 186, 197, 234, 38, 44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205, 244, 65, 129, 77, 82, 106,
    220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74, 120, 136, 149, 139, 227, 99, 232, 109, 233,
    203, 213, 254, 59, 0, 29, 57, 242, 239, 183, 14, 102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10, 49,
    68, 80, 180, 143, 237, 31, 26, 219, 153, 141, 51, 159, 17, 131, 20,
};

typedef struct {
    unsigned char x[48], checksum[16], block[16];
    unsigned filled;
} md2_ctx;

static void md2_compress(md2_ctx *m, const unsigned char *block) {
    unsigned char last = m->checksum[15];
    for (int i = 0; i < 16; i++) {
        m->x[16 + i] = block[i];
        m->x[32 + i] = (unsigned char)(m->x[i] ^ block[i]);
        last = m->checksum[i] ^= MD2_S[block[i] ^ last];
    }
    unsigned t = 0;
    for (unsigned round = 0; round < 18; round++) {
        for (int k = 0; k < 48; k++) t = m->x[k] ^= MD2_S[t];
        t = (t + round) & 0xff;
    }
}
static void md2_update(md2_ctx *m, const void *data, size_t len) {
    for (const unsigned char *p = data; len--; p++) {
        m->block[m->filled++] = *p;
        if (m->filled == 16) {
            md2_compress(m, m->block);
            m->filled = 0;
        }
    }
}
static void md2_final(md2_ctx *m, unsigned char digest[16]) {
    unsigned char padding[16], checksum[16];
    unsigned pad = 16 - m->filled;
    memset(padding, (int)pad, sizeof padding);
    md2_update(m, padding, pad);
    memcpy(checksum, m->checksum, sizeof checksum);
    md2_update(m, checksum, sizeof checksum);
    memcpy(digest, m->x, 16);
}

/* The HMAC key: what the runtime's own first pass computes from constants. */
static const unsigned char INTEGRITY_KEY[16] = {0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52,
                                                0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f};

struct process_facts {
    uint32_t driver_version, version, pid, thread;
    const void *cudart_interface, *integrity_table, *integrity_fn;
    uint64_t unix_seconds;
};
struct device_facts {
    CUuuid uuid;
    int32_t pci_domain, pci_bus, pci_device;
};
/* Hashed byte for byte: no padding may creep in. */
_Static_assert(sizeof(struct process_facts) == 48, "process_facts layout");
_Static_assert(sizeof(struct device_facts) == 28, "device_facts layout");

static const void *const integrity_table[3];

static CUresult integrity_check(uint32_t version, uint64_t unix_seconds, uint64_t result[2]) {
    /* Two of the versions the runtime tries are answered with fixed values. */
    if (version % 10 == 0) {
        result[0] = 0x3341181c03cb675cull, result[1] = 0x8ed383aa1f4cd1e8ull;
        return CUDA_SUCCESS;
    }
    if (version % 10 == 1) {
        result[0] = 0x1841181c03cb675cull, result[1] = 0x8ed383aa1f4cd1e8ull;
        return CUDA_SUCCESS;
    }
    int driver = 0, devices = 0;
    cuDriverGetVersion(&driver);
    cuDeviceGetCount(&devices);
    struct process_facts facts = {
        (uint32_t)driver, version, (uint32_t)getpid(), (uint32_t)pthread_self(),
        cudart_interface, integrity_table, integrity_table[1], unix_seconds,
    };
    unsigned char pad[16], inner[16], digest[16];
    md2_ctx m;
    memset(&m, 0, sizeof m);
    for (int i = 0; i < 16; i++) pad[i] = INTEGRITY_KEY[i] ^ 0x36;
    md2_update(&m, pad, sizeof pad);
    md2_update(&m, &facts, sizeof facts);
    for (int d = 0; d < devices; d++) {
        struct device_facts dev;
        memset(&dev, 0, sizeof dev);
        cuDeviceGetUuid_v2(&dev.uuid, d);
        cuDeviceGetAttribute(&dev.pci_domain, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, d);
        cuDeviceGetAttribute(&dev.pci_bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d);
        cuDeviceGetAttribute(&dev.pci_device, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, d);
        md2_update(&m, &dev, sizeof dev);
    }
    md2_final(&m, inner);
    memset(&m, 0, sizeof m);
    for (int i = 0; i < 16; i++) pad[i] = INTEGRITY_KEY[i] ^ 0x5c;
    md2_update(&m, pad, sizeof pad);
    md2_update(&m, inner, sizeof inner);
    md2_final(&m, digest);
    memcpy(result, digest, sizeof digest);
    return CUDA_SUCCESS;
}
static const void *const integrity_table[3] = {TABLE_SIZE(3), (const void *)integrity_check, NOOP};

/* ---- lookup by id ---- */
static const struct {
    unsigned char id[16];
    const void *table;
} export_tables[] = {
    {{0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9}, cudart_interface},
    {{0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66},
     tools_callback_hooks},
    {{0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc}, tools_tls},
    {{0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93},
     context_local_storage},
    {{0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e}, context_checks},
    {{0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2}, integrity_table},
};

CUresult fake_export_table(const void **table, const CUuuid *id) {
    if (!table || !id) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof export_tables / sizeof export_tables[0]; i++) {
        if (memcmp(export_tables[i].id, id->bytes, 16) == 0) {
            *table = export_tables[i].table;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_NOT_SUPPORTED;  /* the runtime carries on without the others */
}

/* ---- driver calls the runtime makes while it sets up ---- */
CUresult cuCtxGetDevice(CUdevice *dev) {
    CUcontext ctx = NULL;
    cuCtxGetCurrent(&ctx);
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    *dev = 0;
    return CUDA_SUCCESS;
}
CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version) {
    (void)ctx;
    *version = 3020;
    return CUDA_SUCCESS;
}
CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode *mode) {
    *mode = CU_MODULE_EAGER_LOADING;
    return CUDA_SUCCESS;
}

/* The runtime resolves some 400 entry points when it starts and refuses a driver that lacks any it
 * counts on ("requires a newer driver"). Names this fake does not implement get this entry point,
 * which answers that the feature is not supported, as a real driver does for what a device lacks. */
CUresult fake_unimplemented(void) { return CUDA_ERROR_NOT_SUPPORTED; }
