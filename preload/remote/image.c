/* Reading module images without the driver. The fat-binary container is undocumented; its layout here
 * is the one the open CUDA remoting projects (cricket, gpgpu-sim) read: a 16-byte header (magic,
 * version, header size, payload size) and entries, each with its own header (kind 2 = ELF cubin,
 * 1 = PTX; flag 0x2000 = compressed). A cubin is an ordinary ELF64 file; the compiler describes each
 * kernel's parameters in `.nv.info.<kernel>` as attributes (format byte, attribute byte, value):
 * EIATTR_KPARAM_INFO (0x17) holds ordinal, offset and size (bits 18..31 of its last word). A layout
 * is taken only when it numbers its parameters 0..n-1, each once. */
#include "image.h"

#include <stdio.h>
#include <string.h>

#define FATBIN_FLAG_COMPRESSED 0x2000ull
#define EIFMT_NVAL 1
#define EIFMT_BVAL 2
#define EIFMT_HVAL 3
#define EIFMT_SVAL 4
#define EIATTR_KPARAM_INFO 0x17

static uint16_t u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint32_t u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static int is_elf(const uint8_t *p) { return p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F' && p[4] == 2; }

static uint64_t elf_size(const uint8_t *p) {
    uint64_t shoff = u64(p + 0x28), phoff = u64(p + 0x20);
    uint16_t phentsize = u16(p + 0x36), phnum = u16(p + 0x38), shentsize = u16(p + 0x3a), shnum = u16(p + 0x3c);
    uint64_t end = shoff + (uint64_t)shentsize * shnum;
    if (phoff + (uint64_t)phentsize * phnum > end) end = phoff + (uint64_t)phentsize * phnum;
    for (uint16_t i = 0; i < shnum && shentsize >= 64; i++) {
        const uint8_t *sh = p + shoff + (uint64_t)i * shentsize;
        if (u32(sh + 4) == 8) continue;   /* SHT_NOBITS takes no room in the file */
        uint64_t e = u64(sh + 24) + u64(sh + 32);
        if (e > end) end = e;
    }
    return end;
}

uint64_t image_size(const void *image) {
    const uint8_t *p = image;
    if (!p) return 0;
    if (u32(p) == FATBIN_MAGIC) return (uint64_t)u16(p + 6) + u64(p + 8);
    if (is_elf(p)) return elf_size(p);
    /* PTX is text */
    size_t n = strnlen((const char *)p, WIRE_MAX_MODULE);
    return n < WIRE_MAX_MODULE ? n + 1 : 0;
}

static int cubin_params(const uint8_t *p, uint64_t len, const char *name, struct wire_param *out, uint32_t max,
                        uint32_t *n) {
    if (len < 64 || !is_elf(p)) return -1;
    uint64_t shoff = u64(p + 0x28);
    uint16_t shentsize = u16(p + 0x3a), shnum = u16(p + 0x3c), shstrndx = u16(p + 0x3e);
    if (shentsize < 64 || shstrndx >= shnum || shoff > len || (uint64_t)shentsize * shnum > len - shoff) return -1;
    const uint8_t *strsh = p + shoff + (uint64_t)shstrndx * shentsize;
    uint64_t stroff = u64(strsh + 24), strsize = u64(strsh + 32);
    if (stroff > len || strsize > len - stroff) return -1;
    char want[1100];
    size_t wlen = (size_t)snprintf(want, sizeof want, ".nv.info.%s", name);
    if (wlen >= sizeof want) return -1;
    for (uint16_t i = 0; i < shnum; i++) {
        const uint8_t *sh = p + shoff + (uint64_t)i * shentsize;
        uint32_t nameoff = u32(sh);
        if (nameoff >= strsize || strsize - nameoff <= wlen) continue;
        if (memcmp(p + stroff + nameoff, want, wlen + 1) != 0) continue;
        uint64_t off = u64(sh + 24), size = u64(sh + 32);
        if (off > len || size > len - off) return -1;
        const uint8_t *a = p + off, *end = a + size;
        uint32_t count = 0, described = 0;
        uint8_t seen[WIRE_MAX_PARAMS / 8] = {0};
        while (a + 2 <= end) {
            uint8_t fmt = a[0], attr = a[1];
            /* every entry has a 4-byte head (format, attribute, a 16-bit value); an SVAL's value is the
             * length of the bytes that follow it */
            if (a + 4 > end) return -1;
            uint32_t vlen = fmt == EIFMT_SVAL ? u16(a + 2) : 0;
            if (fmt != EIFMT_SVAL && fmt != EIFMT_NVAL && fmt != EIFMT_BVAL && fmt != EIFMT_HVAL) return -1;
            a += 4;
            if (a + vlen > end) return -1;
            if (fmt == EIFMT_SVAL && attr == EIATTR_KPARAM_INFO && vlen >= 12) {
                uint16_t ordinal = u16(a + 4), offset = u16(a + 6);
                uint32_t psize = (u32(a + 8) >> 18) & 0x3fff;
                if (ordinal >= max || ordinal >= WIRE_MAX_PARAMS || (seen[ordinal / 8] & (1u << ordinal % 8)))
                    return -1;
                seen[ordinal / 8] |= (uint8_t)(1u << ordinal % 8);
                described++;
                out[ordinal].offset = offset;
                out[ordinal].size = psize;
                if ((uint32_t)ordinal + 1 > count) count = (uint32_t)ordinal + 1;
            }
            a += vlen;
        }
        /* every parameter is described exactly once: a gap in the numbering is no layout at all
         * (its entry would be whatever `out` held) */
        if (described != count) return -1;
        *n = count;
        return 0;
    }
    return -1;
}

int image_kernel_params(const void *image, uint64_t len, const char *name, struct wire_param *out, uint32_t max,
                        uint32_t *n) {
    const uint8_t *p = image;
    if (len < 16) return -1;
    if (is_elf(p)) return cubin_params(p, len, name, out, max, n);
    if (u32(p) != FATBIN_MAGIC) return -1;
    uint64_t hdr = u16(p + 6), total = u64(p + 8);
    if (hdr > len || total > len - hdr) return -1;
    const uint8_t *e = p + hdr, *end = p + hdr + total;
    while (e + 64 <= end) {
        uint16_t kind = u16(e);
        uint32_t ehdr = u32(e + 4);
        uint64_t esize = u64(e + 8), flags = u64(e + 0x28);
        if (ehdr < 64 || ehdr > (uint64_t)(end - e) || esize > (uint64_t)(end - e) - ehdr) return -1;
        if (kind == 2 && !(flags & FATBIN_FLAG_COMPRESSED) && cubin_params(e + ehdr, esize, name, out, max, n) == 0)
            return 0;
        e += ehdr + esize;
    }
    return -1;
}
