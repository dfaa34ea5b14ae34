"""What a client sends that the worker must not trust: a cubin whose parameter numbering has a gap
(its layout must not be served half-written) and kernel names made to forge lines in the node's log."""

from __future__ import annotations

import socket
import struct

from .conftest import GpuHost, hello_bytes, read_reply

OP_MODULE_LOAD, OP_GET_FUNCTION = 11, 13
PARAMS_UNKNOWN = 0xFFFFFFFF


def _session(host: GpuHost) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", host.port), timeout=30)
    s.sendall(hello_bytes(host.token()))
    result, _ = read_reply(s)
    assert result == 0
    return s


def _load(s: socket.socket, image: bytes) -> int:
    s.sendall(struct.pack("<IIQ", OP_MODULE_LOAD, 0, len(image)) + image)
    result, data = read_reply(s)
    assert result == 0, data
    return struct.unpack("<Q", data)[0]


def _get_function(s: socket.socket, module: int, name: bytes) -> list[tuple[int, int]] | None:
    """The layout the worker serves for `name` (offset, size per parameter), None when unknown."""
    args = struct.pack("<Q", module) + name.ljust(1024, b"\0")
    s.sendall(struct.pack("<IIQ", OP_GET_FUNCTION, len(args), 0) + args)
    result, data = read_reply(s)
    assert result == 0, data
    _function, n, _pad = struct.unpack("<QII", data[:16])
    if n == PARAMS_UNKNOWN:
        return None
    return [struct.unpack("<II", data[16 + 8 * i:24 + 8 * i]) for i in range(n)]


def _kparam(ordinal: int, offset: int, size: int) -> bytes:
    # EIFMT_SVAL, EIATTR_KPARAM_INFO, 12 bytes: index, ordinal, offset, size in bits 18..31
    return struct.pack("<BBH", 4, 0x17, 12) + struct.pack("<IHHI", 0, ordinal, offset, size << 18)


def _cubin(kernel: str, params: list[tuple[int, int, int]]) -> bytes:
    """A minimal ELF64 cubin: a section-name table and the kernel's .nv.info section."""
    names = b"\0.shstrtab\0" + f".nv.info.{kernel}".encode() + b"\0"
    info = b"".join(_kparam(*p) for p in params)
    names_at, info_at = 64, 64 + len(names)
    shoff = (info_at + len(info) + 7) & ~7
    header = bytearray(64)
    header[:5] = b"\x7fELF\x02"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 1)  # section header size, count, names' index

    def section(name: int, kind: int, offset: int, size: int) -> bytes:
        sh = bytearray(64)
        struct.pack_into("<II", sh, 0, name, kind)
        struct.pack_into("<QQ", sh, 24, offset, size)
        return bytes(sh)

    body = bytes(header) + names + info
    body += b"\0" * (shoff - len(body))
    return body + bytes(64) + section(1, 3, names_at, len(names)) + section(11, 0x70000000, info_at, len(info))


def test_a_cubin_layout_is_served_only_when_it_numbers_every_parameter(gpu_host: GpuHost) -> None:
    with _session(gpu_host) as s:
        whole = _load(s, _cubin("k", [(0, 0, 8), (1, 8, 4), (2, 16, 8)]))
        assert _get_function(s, whole, b"k") == [(0, 8), (8, 4), (16, 8)]
        # ordinals 0 and 2 without 1: the entry for 1 would be whatever the worker's memory held
        gap = _load(s, _cubin("k", [(0, 0, 8), (2, 16, 8)]))
        assert _get_function(s, gap, b"k") is None
        twice = _load(s, _cubin("k", [(0, 0, 8), (0, 0, 8)]))
        assert _get_function(s, twice, b"k") is None


def test_kernel_names_cannot_forge_lines_in_the_nodes_log(gpu_host: GpuHost) -> None:
    forged = b"tessera-remote-server[1] 10.0.0.9: share res-admin on GPU GPU-fake-0"
    with _session(gpu_host) as s:
        ptx = _load(s, b".version 8.0\n.target sm_80\n\0")  # no cubin: the worker logs the unknown layout
        assert _get_function(s, ptx, b"k\n" + forged + b"\x1b[2J\\") is None
        _get_function(s, ptx, b"next")  # a round trip after the log line is written
    lines = gpu_host.log.splitlines()
    assert not any(line.startswith(forged.decode()) for line in lines)
    assert any("parameter layout of k\\x0a" + forged.decode() + "\\x1b[2J\\\\ unknown" in line for line in lines)
