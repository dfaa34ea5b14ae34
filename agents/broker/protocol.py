"""Messages of the broker's line protocol (preload/PROTOCOL.md), parsed and validated.

Every line is ASCII: a verb, then ``key=value`` fields separated by single spaces. Anything else is
a :class:`ProtocolError` with a message that says what is wrong; the connection answers ``ERR``.
"""

from __future__ import annotations

import json
import math
import re
import socket
from dataclasses import dataclass
from pathlib import Path

PROTOCOL_VERSION = 1
MAX_LINE_BYTES = 1024
MAX_USED_US = 3_600_000_000  # one hour of GPU time in one token is not a measurement, it is a bug

_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class ProtocolError(ValueError):
    """A line that is not a valid message."""


@dataclass(frozen=True)
class Hello:
    share: str
    gpu: str
    pid: int
    request: float
    limit: float
    high_priority: bool


@dataclass(frozen=True)
class Acquire:
    used_s: float
    idle: bool


@dataclass(frozen=True)
class Release:
    used_s: float
    idle: bool


@dataclass(frozen=True)
class Drain:
    """The holder's quantum is over (or it stopped launching) and it waits for work it already queued:
    the GPU is still busy with this share, so the token must not be handed on yet."""


@dataclass(frozen=True)
class Query:
    pass


Message = Hello | Acquire | Release | Drain | Query

_FIELDS: dict[str, set[str]] = {
    "HELLO": {"v", "share", "gpu", "pid", "request", "limit", "priority"},
    "ACQUIRE": {"used_us", "idle"},
    "RELEASE": {"used_us", "idle"},
    "DRAIN": set(),
    "QUERY": set(),
}


def _share(fields: dict[str, str], key: str) -> float:
    try:
        value = float(fields[key])
    except ValueError:
        raise ProtocolError(f"{key} must be a number, got {fields[key]!r}") from None
    if not math.isfinite(value) or not 0 < value <= 1:
        raise ProtocolError(f"{key} must be in (0, 1], got {fields[key]}")
    return value


def _int(fields: dict[str, str], key: str, low: int, high: int) -> int:
    text = fields[key]
    if not text.isdigit():
        raise ProtocolError(f"{key} must be a non-negative integer, got {text!r}")
    value = int(text)
    if not low <= value <= high:
        raise ProtocolError(f"{key} must be between {low} and {high}, got {value}")
    return value


def _ident(fields: dict[str, str], key: str) -> str:
    if not _ID_RE.match(fields[key]):
        raise ProtocolError(f"{key} must be 1-128 letters, digits or . _ : -, got {fields[key]!r}")
    return fields[key]


def parse_line(raw: bytes) -> Message:
    """Parses one line (with or without its newline)."""
    if len(raw) > MAX_LINE_BYTES:
        raise ProtocolError(f"line longer than {MAX_LINE_BYTES} bytes")
    try:
        text = raw.decode("ascii").rstrip("\r\n")
    except UnicodeDecodeError:
        raise ProtocolError("line is not ASCII") from None
    parts = text.split(" ")
    verb = parts[0]
    if verb not in _FIELDS:
        raise ProtocolError(f"unknown message {verb[:32]!r}")
    fields: dict[str, str] = {}
    for part in parts[1:]:
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ProtocolError(f"field {part[:40]!r} is not key=value")
        if key not in _FIELDS[verb]:
            raise ProtocolError(f"{verb} has no field {key[:32]!r}")
        if key in fields:
            raise ProtocolError(f"field {key} given twice")
        fields[key] = value
    missing = _FIELDS[verb] - fields.keys()
    if missing:
        raise ProtocolError(f"{verb} is missing {', '.join(sorted(missing))}")

    if verb == "HELLO":
        if fields["v"] != str(PROTOCOL_VERSION):
            raise ProtocolError(
                f"protocol version {fields['v'][:16]!r} is not supported (this is {PROTOCOL_VERSION})"
            )
        request, limit = _share(fields, "request"), _share(fields, "limit")
        if request > limit:
            raise ProtocolError(f"request {request} exceeds limit {limit}")
        if fields["priority"] not in ("high", "low", "normal"):
            raise ProtocolError(f"priority must be high, normal or low, got {fields['priority'][:16]!r}")
        return Hello(
            share=_ident(fields, "share"),
            gpu=_ident(fields, "gpu"),
            pid=_int(fields, "pid", 1, 2**31 - 1),
            request=request,
            limit=limit,
            high_priority=fields["priority"] == "high",
        )
    if verb in ("ACQUIRE", "RELEASE"):
        used = _int(fields, "used_us", 0, MAX_USED_US) / 1e6
        if fields["idle"] not in ("0", "1"):
            raise ProtocolError(f"idle must be 0 or 1, got {fields['idle'][:16]!r}")
        cls = Acquire if verb == "ACQUIRE" else Release
        return cls(used_s=used, idle=fields["idle"] == "1")
    if verb == "DRAIN":
        return Drain()
    return Query()


def grant_line(quota_s: float) -> bytes:
    return f"GRANT quota_us={max(1, round(quota_s * 1e6))}\n".encode()


def error_line(reason: str) -> bytes:
    clean = reason.replace("\n", " ")[:200]
    return f"ERR {clean}\n".encode()


MAX_STATS_BYTES = 4 * 1024 * 1024


def query_stats(socket_path: str | Path, timeout_s: float) -> dict:
    """The broker's STATS answer to QUERY on its socket (bounded; ValueError when malformed)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(socket_path))
        sock.sendall(b"QUERY\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            if len(data) > MAX_STATS_BYTES:
                raise ValueError("STATS answer too long")
    line = data.decode("ascii", "replace").strip()
    if not line.startswith("STATS "):
        raise ValueError(f"unexpected answer {line[:80]!r}")
    stats = json.loads(line.removeprefix("STATS "))
    if not isinstance(stats, dict) or not isinstance(stats.get("gpus"), dict):
        raise ValueError("STATS without a gpus object")
    return stats
