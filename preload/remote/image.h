/* Module images (fat binaries, cubins, PTX): their size, and the parameter layout of a kernel as the
 * compiler recorded it in the cubin's .nv.info.<kernel> section (EIATTR_KPARAM_INFO). */
#ifndef TESSERA_REMOTE_IMAGE_H
#define TESSERA_REMOTE_IMAGE_H

#include "wire.h"

#define FATBIN_MAGIC 0xBA55ED50u
#define FATBIN_WRAPPER_MAGIC 0x466243b1

/* Bytes the image at `image` spans (a fat binary, an ELF cubin or NUL-terminated PTX); 0 if unknown. */
uint64_t image_size(const void *image);
/* The parameter layout of kernel `name` in `image`: 0 and *n set (out[0..*n-1] each written), or -1
 * when no uncompressed cubin in it describes the kernel's parameters 0..n-1 each once (a PTX-only or
 * compressed image, or a malformed one). */
int image_kernel_params(const void *image, uint64_t len, const char *name, struct wire_param *out, uint32_t max,
                        uint32_t *n);

#endif
