/* The remote GPU wire protocol (version 1), shared by the client libraries and the server.
 * See PROTOCOL.md next to this file. Fixed-width little-endian fields; both ends are x86-64 or
 * AArch64 Linux, so the structs below are the bytes on the wire (checked by static asserts). */
#ifndef TESSERA_REMOTE_WIRE_H
#define TESSERA_REMOTE_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define WIRE_VERSION 1u
#define WIRE_MAGIC 0x31525354u          /* "TSR1" */
#define WIRE_MAX_ARGS (64u * 1024)      /* fixed arguments of any message, either way */
#define WIRE_MAX_TOKEN 2048u
#define WIRE_MAX_MODULE (256ull << 20)  /* a module image (fat binary, cubin, PTX) */
#define WIRE_MAX_PARAMS 1024u           /* kernel parameters per function */
#define WIRE_MAX_PARAM_BYTES 32764u     /* the driver's own limit on a kernel's parameter area */
#define WIRE_MAX_COPY (1ull << 40)      /* one host-to-device copy: more than any device holds */
#define WIRE_CHUNK (1u << 20)           /* bulk copies move through the server in chunks of this */
#define WIRE_PARAMS_UNKNOWN 0xffffffffu

enum wire_op {
    OP_HELLO = 1,          /* token → device facts */
    OP_MEM_GET_INFO,       /* → free, total (the share's view: the cap) */
    OP_DEVICE_ATTR,        /* attribute → value */
    OP_MEM_ALLOC,          /* bytes → device pointer */
    OP_MEM_FREE,           /* device pointer */
    OP_MEMCPY_HTOD,        /* dst, stream, async + bulk from the client */
    OP_MEMCPY_DTOH,        /* src, bytes, stream, async → bulk to the client */
    OP_MEMCPY_DTOD,        /* dst, src, bytes, stream, async */
    OP_MEMSET_D8,          /* dst, value, count, stream, async */
    OP_MEMSET_D32,
    OP_MODULE_LOAD,        /* bulk image → module */
    OP_MODULE_UNLOAD,
    OP_GET_FUNCTION,       /* module, name → function + parameter layout */
    OP_LAUNCH,             /* one-way: no reply; a failure is reported with the next reply */
    OP_CTX_SYNC,
    OP_STREAM_CREATE,      /* flags, priority → stream */
    OP_STREAM_DESTROY,
    OP_STREAM_SYNC,
    OP_STREAM_QUERY,
    OP_STREAM_WAIT_EVENT,
    OP_EVENT_CREATE,       /* flags → event */
    OP_EVENT_DESTROY,
    OP_EVENT_RECORD,
    OP_EVENT_SYNC,
    OP_EVENT_QUERY,
    OP_EVENT_ELAPSED,      /* start, end → milliseconds */
    OP_PING,               /* nothing → nothing (round-trip probes) */
    OP_PROBE,              /* first message instead of a hello: a bounded link probe, no token (PROTOCOL.md) */
    OP_MAX
};

/* Every request: this header, `len` bytes of arguments, then `bulk` raw bytes (only OP_MEMCPY_HTOD
 * and OP_MODULE_LOAD carry bulk). */
struct wire_req {
    uint32_t op, len;
    uint64_t bulk;
};
/* Every reply: the CUresult, `len` bytes of results (on failure: a message, not NUL-terminated),
 * then `bulk` raw bytes (OP_MEMCPY_DTOH). `deferred` is the first failure of a one-way launch since
 * the previous reply (0 if none), reported once. */
struct wire_rep {
    int32_t result, deferred;
    uint32_t len, pad;
    uint64_t bulk;
};
_Static_assert(OP_PROBE == 28, "agents/remote/probe.py speaks this number");
_Static_assert(sizeof(struct wire_req) == 16, "wire_req");
_Static_assert(sizeof(struct wire_rep) == 24, "wire_rep");

struct wire_hello {
    uint32_t magic, version, token_len, pad;
    /* token_len bytes of token follow */
};
struct wire_hello_rep {
    uint32_t version, pad;
    uint64_t total_mem;    /* cuDeviceTotalMem on the server: the share's cap when capped */
    uint8_t uuid[16];
    char name[256];
    char share[128];
};

#define PROBE_MAX_PINGS 32u
#define PROBE_MAX_BYTES (16u << 20)
struct wire_probe {
    uint32_t magic, version, pings, pad;
    uint64_t bytes;        /* then the server sends this many bytes */
};

struct wire_memcpy {
    uint64_t dst, src, bytes, stream;
    uint32_t async, pad;
};
struct wire_memset {
    uint64_t dst, count, stream;
    uint32_t value, async;
};
struct wire_get_function {
    uint64_t module;
    char name[1024];       /* NUL-terminated */
};
struct wire_param {
    uint32_t offset, size;
};
struct wire_function_rep {
    uint64_t function;
    uint32_t nparams;      /* WIRE_PARAMS_UNKNOWN: the layout could not be learnt */
    uint32_t pad;
    /* nparams wire_param follow */
};
struct wire_launch {
    uint64_t function, stream;
    uint32_t grid[3], block[3], shmem;
    uint32_t param_bytes;  /* the parameter area (offsets as in the layout) follows */
    uint32_t flags, pad;   /* LAUNCH_FROM_EXTRA: the area is the `extra` buffer, passed as such */
};
#define LAUNCH_FROM_EXTRA 1u
struct wire_u64x2 {
    uint64_t a, b;
};

/* ---- helpers (wire.c) ---- */
/* 0 on success; -1 on error or end of stream (errno set, 0 at end of stream). */
int wire_send_all(int fd, const void *buf, size_t len);
int wire_recv_all(int fd, void *buf, size_t len);
int wire_sendv2(int fd, const void *a, size_t alen, const void *b, size_t blen);
/* Reads and throws away `len` bytes. */
int wire_discard(int fd, uint64_t len);
/* Options for a connection that must fail, not hang, when the peer vanishes (wire.c). */
void wire_tune_socket(int fd, int timeout_ms);
const char *wire_op_name(uint32_t op);

/* SHA-256 and HMAC-SHA256 (sha256.c) */
void sha256(const void *data, size_t len, uint8_t out[32]);
void hmac_sha256(const void *key, size_t key_len, const void *data, size_t len, uint8_t out[32]);

/* Tokens (token.c). */
struct share_token {
    char share[129];
    uint32_t attempt;      /* the placement it was issued for: 1, 2, ... */
    char gpu[129];
    uint64_t mem;          /* bytes; 0 = no cap */
    double request, limit;
    char priority[8];
    int64_t expires;       /* unix seconds */
};
/* An id as tokens carry them (share, GPU UUID): 1-128 of A-Za-z0-9._:- */
int token_valid_id(const char *s);
/* 0 and `out` filled when `token` is well-formed, signed with `secret` and not expired at `now`;
 * else -1 and a reason in `why`. */
int token_verify(const char *token, const void *secret, size_t secret_len, int64_t now, struct share_token *out,
                 char *why, size_t why_len);

#endif
