"""The agent <-> portal wire protocol, version 1: limits, message models and validation.

`wire/PROTOCOL.md` is the normative description; this module is its executable form and must
say the same thing. Both sides validate what they receive with these rules; the agent also builds
its outgoing messages so that they pass them (the tests check that).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from wire.share_tokens import MAX_ATTEMPT, SHARE_ID_PATTERN

PROTOCOL_VERSION = 1
AGENT_WS_PATH = "/ws/agents/"
# The node token travels in this header on the WebSocket handshake: "Authorization: Bearer <token>".
TOKEN_HEADER = "Authorization"
TOKEN_SCHEME = "Bearer"
TOKEN_PATTERN = r"^[\x21-\x7e]{1,512}$"  # printable ASCII without spaces: safe in an HTTP header

MAX_MESSAGE_BYTES = 1_048_576  # one text frame, UTF-8 encoded, either direction
MAX_SAMPLES_PER_BATCH = 60
MAX_GPUS_PER_NODE = 64
MAX_PROCESSES_PER_SAMPLE = 512
MAX_SHARES_PER_SAMPLE = 512
MAX_PLACEMENTS = 1024
MAX_NVLINK_PEERS = 18
MAX_LINKS = 64  # measured links in one `links` message (GPU nodes one node's agent probes)
MAX_RTT_MS = 60_000.0
MAX_BANDWIDTH_MBPS = 10_000_000.0  # 10 Tbit/s, far above any link
MAX_ERROR_MESSAGE_CHARS = 1024
# Shares listed in one `revoked_shares` message: half the remote server's MAX_REVOKED (8192); at
# about 40 bytes an entry the message stays far under MAX_MESSAGE_BYTES.
MAX_REVOKED_SHARES = 4096
# What an agent sends at most (token bucket): a steady rate and a burst. The portal allows at
# least PORTAL_MIN_ALLOWED_* so an agent that keeps to its side never trips the flood guard.
AGENT_MAX_MESSAGES_PER_S = 5.0
AGENT_MAX_BURST = 10
PORTAL_MIN_ALLOWED_MESSAGES_PER_S = 10.0
PORTAL_MIN_ALLOWED_BURST = 20
MAX_UNACKED_BATCHES = 4  # batches an agent may have in flight before it waits for an ack
WELCOME_TIMEOUT_S = 10.0

MAX_SEQ = 2**53 - 1  # stays exact in every JSON implementation
MIN_TS_MS = 1_500_000_000_000  # 2017-07-14
MAX_TS_MS = 4_102_444_800_000  # 2100-01-01
MAX_MEMORY_MIB = 4_194_304  # 4 TiB, far above any GPU
MAX_NODE_CPU_MILLI = 16_384_000  # 16,384 CPUs, far above any node
MAX_NODE_MEMORY_MIB = 268_435_456  # 256 TiB, far above any node
MAX_PID = 4_194_304  # Linux pid_max ceiling

NODE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"  # Kubernetes node name (DNS subdomain)
GPU_UUID_PATTERN = r"^(GPU|MIG)-[A-Za-z0-9/-]{1,92}$"
RESERVATION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"
POD_UID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
CONTAINER_ID_PATTERN = r"^[0-9a-f]{64}$"
STREAM_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
VERSION_PATTERN = r"^[0-9A-Za-z.+-]{1,32}$"
# host:port of a remote-share server: an IPv4 address or DNS name, or an IPv6 address in brackets.
SERVER_ADDRESS_PATTERN = r"^(\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9]([-A-Za-z0-9.]{0,251}[A-Za-z0-9])?):[0-9]{1,5}$"

ERROR_CODES = (
    "bad_json",  # not a JSON object
    "too_large",  # frame over MAX_MESSAGE_BYTES
    "unsupported_version",  # "v" is not a version the receiver speaks
    "invalid_message",  # fails the schema; `message` says which field and why
    "unexpected_message",  # valid but not allowed now (samples before hello, a second hello, ...)
    "node_mismatch",  # hello names another node than the token's
    "unknown_gpu",  # placements name a GPU the agent does not have
    "rate_limited",  # over the message rate
    "internal",  # the receiver failed; the sender may retry later
)

NodeName = Annotated[str, Field(pattern=NODE_NAME_PATTERN, max_length=253)]
GpuUuid = Annotated[str, Field(pattern=GPU_UUID_PATTERN, max_length=96)]
ReservationId = Annotated[str, Field(pattern=RESERVATION_PATTERN)]
PodUid = Annotated[str, Field(pattern=POD_UID_PATTERN)]
ContainerId = Annotated[str, Field(pattern=CONTAINER_ID_PATTERN)]
StreamId = Annotated[str, Field(pattern=STREAM_PATTERN)]
Seq = Annotated[StrictInt, Field(ge=1, le=MAX_SEQ)]
Percent = Annotated[StrictInt, Field(ge=0, le=100)]
MiB = Annotated[StrictInt, Field(ge=0, le=MAX_MEMORY_MIB)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False, strict=False)]


class _Strict(BaseModel):
    # Unknown fields are refused: a typo on either side shows up at once instead of being dropped.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _Message(_Strict):
    v: Literal[1]


class GpuInfo(_Strict):
    index: Annotated[StrictInt, Field(ge=0, lt=MAX_GPUS_PER_NODE)]
    uuid: GpuUuid
    model: Annotated[str, Field(min_length=1, max_length=96)]
    memory_mib: Annotated[StrictInt, Field(ge=1, le=MAX_MEMORY_MIB)]
    numa_node: Annotated[StrictInt, Field(ge=0, le=1023)] | None
    nvlink_peers: Annotated[list[GpuUuid], Field(max_length=MAX_NVLINK_PEERS)]
    mig_mode: Literal["disabled", "enabled", "unsupported"]

    @model_validator(mode="after")
    def _peers_are_others(self) -> GpuInfo:
        if len(set(self.nvlink_peers)) != len(self.nvlink_peers):
            raise ValueError("nvlink_peers: duplicate UUID")
        if self.uuid in self.nvlink_peers:
            raise ValueError("nvlink_peers: a GPU cannot be its own peer")
        return self


class NodeResources(_Strict):
    """What the node offers pods (its allocatable CPU and memory), counted by placement."""

    cpu_milli: Annotated[StrictInt, Field(ge=1, le=MAX_NODE_CPU_MILLI)]
    memory_mib: Annotated[StrictInt, Field(ge=1, le=MAX_NODE_MEMORY_MIB)]


class Hello(_Message):
    type: Literal["hello"]
    node: NodeName
    stream: StreamId
    agent_version: Annotated[str, Field(pattern=VERSION_PATTERN)]
    source: Literal["nvml", "simulated", "none"]
    driver_version: Annotated[str, Field(min_length=1, max_length=64)] | None
    interval_ms: Annotated[StrictInt, Field(ge=10, le=60_000)]
    gpus: Annotated[list[GpuInfo], Field(max_length=MAX_GPUS_PER_NODE)]
    # Absent from agents before 0.2 and from simulated ones (the inventory says it there).
    resources: NodeResources | None = None
    # The agent writes the remote server's revoked-share file (`--revoked-file`): only then does the
    # portal send it `revoked_shares` (older agents would refuse the message).
    revocations: StrictBool = False
    # The agent tells its share broker each share's priority: only then do placements carry it
    # (older agents would refuse the field).
    priorities: StrictBool = False

    @model_validator(mode="after")
    def _gpus_consistent(self) -> Hello:
        uuids = [g.uuid for g in self.gpus]
        if len(set(uuids)) != len(uuids):
            raise ValueError("gpus: duplicate uuid")
        indices = [g.index for g in self.gpus]
        if len(set(indices)) != len(indices):
            raise ValueError("gpus: duplicate index")
        known = set(uuids)
        for g in self.gpus:
            stray = [p for p in g.nvlink_peers if p not in known]
            if stray:
                raise ValueError(f"gpus[{g.index}].nvlink_peers: {stray[0]} is not a GPU of this node")
        return self


class GpuSample(_Strict):
    uuid: GpuUuid
    sm_util_pct: Percent | None
    mem_util_pct: Percent | None
    mem_used_mib: MiB
    power_w: Annotated[float, Field(ge=0.0, le=5000.0, allow_inf_nan=False, strict=False)] | None
    temp_c: Annotated[StrictInt, Field(ge=-40, le=150)] | None


class ProcessSample(_Strict):
    pid: Annotated[StrictInt, Field(ge=1, le=MAX_PID)]
    gpu_uuid: GpuUuid
    mem_used_mib: MiB | None
    sm_util_pct: Percent | None
    pod_uid: PodUid | None
    container_id: ContainerId | None
    reservation: ReservationId | None


class ShareSample(_Strict):
    reservation: ReservationId
    gpu_uuid: GpuUuid
    used_frac: Fraction  # GPU time this share used over the last interval, 0..1 of the GPU
    mem_used_mib: MiB | None


class Sample(_Strict):
    seq: Seq
    ts_ms: Annotated[StrictInt, Field(ge=MIN_TS_MS, le=MAX_TS_MS)]
    gpus: Annotated[list[GpuSample], Field(max_length=MAX_GPUS_PER_NODE)]
    processes: Annotated[list[ProcessSample], Field(max_length=MAX_PROCESSES_PER_SAMPLE)]
    shares: Annotated[list[ShareSample], Field(max_length=MAX_SHARES_PER_SAMPLE)]

    @model_validator(mode="after")
    def _gpus_unique(self) -> Sample:
        if len({g.uuid for g in self.gpus}) != len(self.gpus):
            raise ValueError("gpus: duplicate uuid in one sample")
        return self


class Samples(_Message):
    type: Literal["samples"]
    stream: StreamId
    dropped: Annotated[StrictInt, Field(ge=0, le=MAX_SEQ)]
    samples: Annotated[list[Sample], Field(min_length=1, max_length=MAX_SAMPLES_PER_BATCH)]

    @model_validator(mode="after")
    def _seqs_consecutive(self) -> Samples:
        first = self.samples[0].seq
        for offset, sample in enumerate(self.samples):
            if sample.seq != first + offset:
                raise ValueError(
                    f"samples[{offset}].seq: expected {first + offset} (consecutive), got {sample.seq}"
                )
        return self


class LinkReading(_Strict):
    gpu_node: NodeName
    rtt_ms: Annotated[float, Field(gt=0.0, le=MAX_RTT_MS, allow_inf_nan=False, strict=False)]
    bandwidth_mbps: Annotated[float, Field(ge=0.0, le=MAX_BANDWIDTH_MBPS, allow_inf_nan=False, strict=False)]
    ts_ms: Annotated[StrictInt, Field(ge=MIN_TS_MS, le=MAX_TS_MS)]


class Links(_Message):
    """The network from this node to GPU nodes' remote servers (agents/remote/probe.py): the
    complete set the agent measured lately, replacing what the portal had for this node."""

    type: Literal["links"]
    links: Annotated[list[LinkReading], Field(max_length=MAX_LINKS)]

    @model_validator(mode="after")
    def _one_per_node(self) -> Links:
        names = [link.gpu_node for link in self.links]
        if len(set(names)) != len(names):
            raise ValueError("links: the same gpu_node twice")
        return self


class RemoteServer(_Strict):
    """A GPU node's remote-share server an agent may probe (agents/remote/probe.py)."""

    node: NodeName
    address: Annotated[str, Field(pattern=SERVER_ADDRESS_PATTERN, max_length=300)]


class Welcome(_Message):
    type: Literal["welcome"]
    node: NodeName
    stream: StreamId
    acked_seq: Annotated[StrictInt, Field(ge=0, le=MAX_SEQ)]
    # Only in answer to a hello with `resources` (agents that measure links; older ones would refuse it).
    remote_servers: Annotated[list[RemoteServer], Field(max_length=MAX_LINKS)] | None = None


class Servers(_Message):
    """The GPU nodes' servers to probe, again during a session (a node came, went, or moved); only
    to agents whose hello had `resources`. Replaces the welcome's list."""

    type: Literal["servers"]
    remote_servers: Annotated[list[RemoteServer], Field(max_length=MAX_LINKS)]


class Ack(_Message):
    type: Literal["ack"]
    stream: StreamId
    seq: Seq


class PlacedShare(_Strict):
    """One share the portal placed on one of the agent's GPUs: an entry of `placements`."""

    reservation: ReservationId
    gpu_uuid: GpuUuid
    request: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False, strict=False)]
    limit: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False, strict=False)]
    memory_mib: Annotated[StrictInt, Field(ge=1, le=MAX_MEMORY_MIB)] | None
    pod_uid: PodUid | None
    # The broker's class for the share; only to agents whose hello had `priorities`.
    priority: Literal["high", "normal", "low"] | None = None

    @model_validator(mode="after")
    def _limit_covers_request(self) -> PlacedShare:
        if self.limit < self.request:
            raise ValueError(f"limit {self.limit} is below request {self.request}")
        return self


class Placements(_Message):
    type: Literal["placements"]
    revision: Annotated[StrictInt, Field(ge=0, le=MAX_SEQ)]
    placements: Annotated[list[PlacedShare], Field(max_length=MAX_PLACEMENTS)]

    @model_validator(mode="after")
    def _consistent(self) -> Placements:
        keys = [(p.reservation, p.gpu_uuid) for p in self.placements]
        if len(set(keys)) != len(keys):
            raise ValueError("placements: the same reservation twice on one GPU")
        totals: dict[str, float] = {}
        for p in self.placements:
            totals[p.gpu_uuid] = totals.get(p.gpu_uuid, 0.0) + p.request
        for gpu, total in totals.items():
            # A small tolerance for float sums such as 0.1 + 0.2 + 0.7.
            if total > 1.0 + 1e-6:
                raise ValueError(f"placements: requests on {gpu} add up to {total:.3f}, more than 1")
        return self


class RevokedShare(_Strict):
    share: Annotated[str, Field(pattern=SHARE_ID_PATTERN)]
    at: Annotated[StrictInt, Field(ge=MIN_TS_MS // 1000, le=MAX_TS_MS // 1000)]  # when it left, unix seconds
    # The share's tokens issued for an earlier placement (their `attempt` claim) are void; those of
    # this attempt and later are not (a share placed here again is served with its new token).
    from_attempt: Annotated[StrictInt, Field(ge=1, le=MAX_ATTEMPT + 1)]


class RevokedShares(_Message):
    """The remote shares that left this GPU node lately and the placement attempt from which their
    tokens stay valid (older tokens may not have expired yet): the complete list, replacing the
    previous one; the agent writes it to the remote server's `--revoked-file`. Only to agents whose
    hello had `revocations`."""

    type: Literal["revoked_shares"]
    shares: Annotated[list[RevokedShare], Field(max_length=MAX_REVOKED_SHARES)]

    @model_validator(mode="after")
    def _once_each(self) -> RevokedShares:
        ids = [s.share for s in self.shares]
        if len(set(ids)) != len(ids):
            raise ValueError("shares: the same share twice")
        return self


class Error(_Message):
    type: Literal["error"]
    code: Literal[ERROR_CODES]  # type: ignore[valid-type]
    message: Annotated[str, Field(max_length=MAX_ERROR_MESSAGE_CHARS)]
    fatal: StrictBool
    ref_seq: Annotated[StrictInt, Field(ge=1, le=MAX_SEQ)] | None = None


AGENT_MESSAGES: dict[str, type[_Message]] = {"hello": Hello, "samples": Samples, "links": Links, "error": Error}
PORTAL_MESSAGES: dict[str, type[_Message]] = {
    "welcome": Welcome,
    "ack": Ack,
    "placements": Placements,
    "servers": Servers,
    "revoked_shares": RevokedShares,
    "error": Error,
}


def _adapter(models: dict[str, type[_Message]]) -> TypeAdapter[Any]:
    union = Union[tuple(models.values())]  # noqa: UP007 - built at run time from the table
    return TypeAdapter(Annotated[union, Field(discriminator="type")])


# pydantic-core's own validators: TypeAdapter.validate_json adds Python work to every frame.
_FAST = {id(models): _adapter(models).validator for models in (AGENT_MESSAGES, PORTAL_MESSAGES)}


class ProtocolError(ValueError):
    """A received message was refused; `code` is one of ERROR_CODES, str() says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
        text = err["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {text}" if where else text)
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def parse(raw: str | bytes, allowed: dict[str, type[_Message]]) -> _Message:
    """Validate one received frame against the messages `allowed` in this direction.

    Raises ProtocolError with the code the receiver should answer with.
    """
    if isinstance(raw, bytes):
        raise ProtocolError("bad_json", "binary frames are not accepted; send JSON in a text frame")
    # A character is at most 4 UTF-8 bytes: a frame that short needs no encoding to be measured.
    if len(raw) > MAX_MESSAGE_BYTES // 4:
        size = len(raw.encode("utf-8"))
        if size > MAX_MESSAGE_BYTES:
            raise ProtocolError("too_large", f"message is {size} bytes, the limit is {MAX_MESSAGE_BYTES}")
    fast = _FAST.get(id(allowed))
    if fast is not None:
        # Parsing and validating in one pass (pydantic-core) costs less for a valid message;
        # anything it refuses goes the slow way, which finds the right code and message.
        try:
            return fast.validate_json(raw)  # type: ignore[no-any-return]
        except (ValidationError, RecursionError):
            pass
    try:
        return parse_slow(raw, allowed)
    except RecursionError:  # "[[[[…" within the size limit: refused like any other bad frame
        raise ProtocolError("bad_json", "not valid JSON: nested too deeply") from None


def parse_slow(raw: str, allowed: dict[str, type[_Message]]) -> _Message:
    try:
        data: Any = json.loads(raw)
    except ValueError as exc:
        raise ProtocolError("bad_json", f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError("bad_json", "a message must be a JSON object")
    if data.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(
            "unsupported_version", f"v must be {PROTOCOL_VERSION}, got {data.get('v')!r}"
        )
    kind = data.get("type")
    model = allowed.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise ProtocolError(
            "invalid_message", f"type must be one of {sorted(allowed)}, got {kind!r}"
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ProtocolError("invalid_message", f"{kind}: {_describe(exc)}") from None


def encode(message: _Message) -> str:
    """The compact JSON text of a message, as it goes on the wire. An optional field the sender left
    unset is not sent: a receiver older than the field would refuse it (unknown fields are)."""
    return message.model_dump_json(exclude_unset=True)


def error_message(code: str, message: str, *, fatal: bool = False, ref_seq: int | None = None) -> str:
    return encode(
        Error(
            v=PROTOCOL_VERSION,
            type="error",
            code=code,
            message=message[:MAX_ERROR_MESSAGE_CHARS],
            fatal=fatal,
            ref_seq=ref_seq,
        )
    )
