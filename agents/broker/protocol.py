"""Messages of the broker's line protocol (preload/PROTOCOL.md), parsed and validated.

Every line is ASCII: a verb, then ``key=value`` fields separated by single spaces. Anything else is
a :class:`ProtocolError` with a message that says what is wrong; the connection answers ``ERR``.

The node agent's control socket takes two more messages: ``TERMS <json>`` (every share's terms and
who may join it, replacing what it said before) and ``QUERY``.
"""

from __future__ import annotations

import json
import math
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator

PROTOCOL_VERSION = 1
MAX_LINE_BYTES = 1024
MAX_USED_US = 3_600_000_000  # one hour of GPU time in one token is not a measurement, it is a bug

_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class ProtocolError(ValueError):
    """A line that is not a valid message."""


@dataclass(frozen=True)
class Hello:
    """What a process says it is. Only ``share`` and ``gpu`` count: its pid comes from the socket's
    peer credentials, and the terms from the node agent. The other fields are parsed for the
    libraries that send them, and ignored."""

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


MAX_CONTROL_LINE_BYTES = 4 * 1024 * 1024
MAX_TERMS = 4096
MAX_SESSIONS = 64
_POD_UID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"


class ShareTerms(BaseModel):
    """One share on one GPU as the node agent knows it from the portal's placements: its terms, and
    whose processes may join it (the pod, found from a process's cgroup; or, where pods are plain
    local processes, the sessions the agent started them in)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    share: Annotated[str, Field(pattern=_ID_RE.pattern)]
    gpu: Annotated[str, Field(pattern=_ID_RE.pattern)]
    request: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]
    limit: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)]
    priority: Literal["high", "normal", "low"]
    pod_uid: Annotated[str, Field(pattern=_POD_UID_PATTERN)] | None = None
    sessions: Annotated[list[Annotated[StrictInt, Field(ge=1, le=2**31 - 1)]],
                        Field(max_length=MAX_SESSIONS)] = []

    @model_validator(mode="after")
    def _limit_covers_request(self) -> ShareTerms:
        if self.limit < self.request:
            raise ValueError(f"limit {self.limit} is below request {self.request}")
        return self

    @property
    def high_priority(self) -> bool:
        return self.priority == "high"


class _TermsMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    shares: Annotated[list[ShareTerms], Field(max_length=MAX_TERMS)]

    @model_validator(mode="after")
    def _once_each(self) -> _TermsMessage:
        keys = [(t.gpu, t.share) for t in self.shares]
        if len(set(keys)) != len(keys):
            raise ValueError("the same share twice on one GPU")
        return self


@dataclass(frozen=True)
class Terms:
    """The control socket's TERMS: the whole table of shares, replacing the previous one."""

    shares: tuple[ShareTerms, ...]


ControlMessage = Terms | Query


def parse_control_line(raw: bytes) -> ControlMessage:
    """One line of the node agent's control socket: ``TERMS <json>`` or ``QUERY``."""
    if len(raw) > MAX_CONTROL_LINE_BYTES:
        raise ProtocolError(f"line longer than {MAX_CONTROL_LINE_BYTES} bytes")
    try:
        text = raw.decode("ascii").rstrip("\r\n")
    except UnicodeDecodeError:
        raise ProtocolError("line is not ASCII") from None
    verb, _, body = text.partition(" ")
    if verb == "QUERY" and not body:
        return Query()
    if verb != "TERMS":
        raise ProtocolError(f"unknown control message {verb[:32]!r}")
    try:
        message = _TermsMessage.model_validate_json(body)
    except ValidationError as exc:
        where = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'TERMS'}: {e['msg']}" for e in exc.errors()[:3])
        raise ProtocolError(f"TERMS: {where}") from None
    return Terms(tuple(message.shares))


def terms_line(shares: Iterable[ShareTerms]) -> bytes:
    body = json.dumps({"shares": [t.model_dump(exclude_defaults=True) for t in shares]},
                      separators=(",", ":"), sort_keys=True)
    return f"TERMS {body}\n".encode("ascii")


def grant_line(quota_s: float) -> bytes:
    return f"GRANT quota_us={max(1, round(quota_s * 1e6))}\n".encode()


def error_line(reason: str) -> bytes:
    clean = reason.replace("\n", " ")[:200]
    return f"ERR {clean}\n".encode()


MAX_STATS_BYTES = 4 * 1024 * 1024


def query_stats(socket_path: str | Path, timeout_s: float,
                terms: Iterable[ShareTerms] | None = None) -> dict:
    """The broker's STATS answer to QUERY on its control socket (bounded; ValueError when malformed),
    with ``terms``: after telling it every share's terms (TERMS) on the same connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(socket_path))
        sock.sendall((terms_line(terms) if terms is not None else b"") + b"QUERY\n")
        data = b""
        while data.count(b"\n") < (2 if terms is not None else 1):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            if len(data) > MAX_STATS_BYTES:
                raise ValueError("STATS answer too long")
    text = data.decode("ascii", "replace")
    if terms is not None:
        first, _, text = text.partition("\n")
        if not first.startswith("OK"):
            raise ValueError(f"the broker refused the terms: {first[:200]!r}")
    line = text.strip()
    if not line.startswith("STATS "):
        raise ValueError(f"unexpected answer {line[:80]!r}")
    stats = json.loads(line.removeprefix("STATS "))
    if not isinstance(stats, dict) or not isinstance(stats.get("gpus"), dict):
        raise ValueError("STATS without a gpus object")
    return stats
