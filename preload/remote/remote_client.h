/* The client core (client.c), shared by the driver API (driver.c) and runtime API (cudart.c) entry
 * points of the remote GPU client libraries. */
#ifndef TESSERA_REMOTE_CLIENT_H
#define TESSERA_REMOTE_CLIENT_H

#include <cuda.h>

#include "wire.h"

/* Exported from the client libcuda.so.1 for its libcudart, under names that cannot clash. */
#define rlog tessera_remote_log
#define rnot_supported tessera_remote_not_supported
#define rconnect tessera_remote_connect
#define rdevice tessera_remote_device
#define rcall tessera_remote_call
#define rcall_sync tessera_remote_call_sync
#define rcopy_htod tessera_remote_copy_htod
#define rcopy_dtoh tessera_remote_copy_dtoh
#define rmodule_load tessera_remote_module_load
#define rfunction_get tessera_remote_function_get
#define rlaunch tessera_remote_launch
#pragma GCC visibility push(default)

#define RLOG_ERROR 0
#define RLOG_WARN 1
#define RLOG_INFO 2
void rlog(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Logs that `what` is not available remotely; CUDA_ERROR_NOT_SUPPORTED. */
CUresult rnot_supported(const char *what);

CUresult rconnect(void);
const struct wire_hello_rep *rdevice(void);
/* One request and its reply: `len` argument bytes out, at most `cap` result bytes into `out`. */
CUresult rcall(uint32_t op, const void *args, uint32_t len, void *out, uint32_t cap, uint32_t *got);
/* The same for a call that synchronizes: also returns a launch failure reported since the last one. */
CUresult rcall_sync(uint32_t op, const void *args, uint32_t len);
CUresult rcopy_htod(uint64_t dst, const void *src, uint64_t n, uint64_t stream, int async);
CUresult rcopy_dtoh(void *dst, uint64_t src, uint64_t n, uint64_t stream, int async);
CUresult rmodule_load(const void *image, uint64_t size, uint64_t *module);

struct rfunction {
    uint64_t handle;
    uint32_t nparams;   /* WIRE_PARAMS_UNKNOWN: launches need the `extra` buffer */
    uint32_t area;      /* bytes of the parameter area */
    char name[256];
    struct wire_param params[];
};
/* NULL on failure, with the reason in *err. */
struct rfunction *rfunction_get(uint64_t module, const char *name, CUresult *err);
CUresult rlaunch(const struct rfunction *f, const unsigned grid[3], const unsigned block[3], unsigned shmem,
                 uint64_t stream, void **params, void **extra);

#pragma GCC visibility pop

#endif
