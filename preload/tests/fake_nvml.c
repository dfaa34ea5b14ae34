/* A fake libnvidia-ml.so.1: one device whose memory matches the fake driver's card. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;

static int device;
static unsigned long long card(void) {
    const char *v = getenv("FAKE_GPU_MEMORY");
    return v ? strtoull(v, NULL, 10) : 16ull << 30;
}
nvmlReturn_t nvmlInit(void) { return 0; }
nvmlReturn_t nvmlInit_v2(void) { return 0; }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return 0; }
nvmlReturn_t nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(nvmlReturn_t r) { return r ? "fake NVML error" : "Success"; }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { *n = 1; return 0; }
nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { *n = 1; return 0; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (i) return 2;
    *d = (nvmlDevice_t)&device;
    return 0;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return nvmlDeviceGetHandleByIndex_v2(i, d); }
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) { (void)d; snprintf(name, len, "Tessera Fake GPU"); return 0; }
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
    (void)d;
    const char *v = getenv("FAKE_GPU_UUID");
    snprintf(uuid, len, "%s", v && *v ? v : "GPU-fake-0");
    return 0;
}
/* the whole card: 1 GiB already in use by someone else */
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    (void)d;
    m->total = card();
    m->used = 1ull << 30;
    m->free = m->total - m->used;
    return 0;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    (void)d;
    m->total = card();
    m->reserved = 0;
    m->used = 1ull << 30;
    m->free = m->total - m->used;
    return 0;
}
