"""The inventory YAML: which nodes and GPUs a simulated fleet has (format in wire/PROTOCOL.md).

Read by the simulated agent (`--simulate FILE --node NAME`) and, with the same rules, by the
portal's demo seeding and the local backend, so a simulated GPU has the same UUID everywhere.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator

from wire.agent_portal import MAX_GPUS_PER_NODE, MAX_MEMORY_MIB, NODE_NAME_PATTERN

# Kubernetes label syntax: optional DNS prefix and "/", then a name of at most 63 characters.
LABEL_KEY_PATTERN = r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
LABEL_VALUE_PATTERN = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"
MAX_NODES = 10_000
SIMULATED_UUID_NAMESPACE = uuid.NAMESPACE_URL


def simulated_gpu_uuid(node: str, index: int) -> str:
    """The UUID of GPU `index` of a simulated `node`; stable, so portal and agent agree on it."""
    return "GPU-" + str(uuid.uuid5(SIMULATED_UUID_NAMESPACE, f"tessera-sim://{node}/{index}"))


class InventoryError(ValueError):
    """The inventory file is unusable; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class GpuGroupSpec(_Strict):
    model: Annotated[str, Field(min_length=1, max_length=96)]
    memory_mib: Annotated[StrictInt, Field(ge=1, le=MAX_MEMORY_MIB)]
    count: Annotated[StrictInt, Field(ge=1, le=MAX_GPUS_PER_NODE)] = 1
    # One NUMA node for the whole group, or a list with one per GPU (checked below, for a clear message).
    numa: Any = 0
    # Sets of GPU positions within this group (0..count-1) that are fully connected by NVLink.
    nvlink_groups: list[list[Annotated[StrictInt, Field(ge=0)]]] = []

    @model_validator(mode="after")
    def _shapes(self) -> GpuGroupSpec:
        numa = self.numa if isinstance(self.numa, list) else [self.numa]
        if not all(type(n) is int and 0 <= n <= 1023 for n in numa):
            raise ValueError(f"numa: must be a NUMA node number 0..1023 or a list of them, got {self.numa!r}")
        if isinstance(self.numa, list) and len(self.numa) != self.count:
            raise ValueError(f"numa: a list must have one entry per GPU ({self.count}), got {len(self.numa)}")
        seen: set[int] = set()
        for group in self.nvlink_groups:
            if len(group) < 2:
                raise ValueError("nvlink_groups: a group needs at least two GPUs")
            for pos in group:
                if pos >= self.count:
                    raise ValueError(f"nvlink_groups: GPU {pos} does not exist (count is {self.count})")
                if pos in seen:
                    raise ValueError(f"nvlink_groups: GPU {pos} is in more than one group")
                seen.add(pos)
        return self


class NodeSpec(_Strict):
    name: Annotated[str, Field(pattern=NODE_NAME_PATTERN, max_length=253)]
    labels: dict[
        Annotated[str, Field(pattern=LABEL_KEY_PATTERN, max_length=317)],
        Annotated[str, Field(pattern=LABEL_VALUE_PATTERN, max_length=63)],
    ] = {}
    gpus: Annotated[list[GpuGroupSpec], Field(min_length=1)]

    @model_validator(mode="after")
    def _gpu_total(self) -> NodeSpec:
        total = sum(g.count for g in self.gpus)
        if total > MAX_GPUS_PER_NODE:
            raise ValueError(f"gpus: {total} GPUs, at most {MAX_GPUS_PER_NODE} per node")
        return self


class InventorySpec(_Strict):
    version: Annotated[StrictInt, Field(ge=1, le=1)] = 1
    nodes: Annotated[list[NodeSpec], Field(min_length=1, max_length=MAX_NODES)]

    @model_validator(mode="after")
    def _unique_names(self) -> InventorySpec:
        seen: set[str] = set()
        for node in self.nodes:
            if node.name in seen:
                raise ValueError(f"nodes: node name {node.name!r} appears twice")
            seen.add(node.name)
        return self


@dataclass(frozen=True)
class InventoryGpu:
    index: int  # position on the node, counting across the node's GPU groups in file order
    uuid: str
    model: str
    memory_mib: int
    numa_node: int
    nvlink_peers: tuple[str, ...]


@dataclass(frozen=True)
class InventoryNode:
    name: str
    labels: dict[str, str]
    gpus: tuple[InventoryGpu, ...]


def _expand(spec: NodeSpec) -> InventoryNode:
    gpus: list[InventoryGpu] = []
    base = 0
    for group in spec.gpus:
        uuids = [simulated_gpu_uuid(spec.name, base + i) for i in range(group.count)]
        peers: dict[int, tuple[str, ...]] = {}
        for linked in group.nvlink_groups:
            for pos in linked:
                peers[pos] = tuple(uuids[p] for p in linked if p != pos)
        for i in range(group.count):
            numa = group.numa[i] if isinstance(group.numa, list) else group.numa
            gpus.append(
                InventoryGpu(
                    index=base + i,
                    uuid=uuids[i],
                    model=group.model,
                    memory_mib=group.memory_mib,
                    numa_node=numa,
                    nvlink_peers=peers.get(i, ()),
                )
            )
        base += group.count
    return InventoryNode(name=spec.name, labels=dict(spec.labels), gpus=tuple(gpus))


_PATTERN_HINTS = {
    NODE_NAME_PATTERN: "must be a Kubernetes node name: lowercase letters, digits, '-' and '.'",
    LABEL_KEY_PATTERN: "is not a valid Kubernetes label key",
    LABEL_VALUE_PATTERN: "is not a valid Kubernetes label value (at most 63 letters, digits, '-', '_', '.')",
}


def _field_path(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part == "[key]":
            path += " (key)"
        elif isinstance(part, str) and not part.isidentifier():
            path += f"[{part!r}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def _describe(err: Any) -> str:
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = "unknown field"
    elif err["type"] == "string_pattern_mismatch":
        message = _PATTERN_HINTS.get(err["ctx"]["pattern"], message)
    path = _field_path(err["loc"])
    # Model-level checks name their field first ("numa: ..."); fold it into the path.
    head, sep, rest = message.partition(": ")
    if sep and head.isidentifier():
        path, message = (f"{path}.{head}" if path else head), rest
    got = err.get("input")
    if err["type"] not in ("missing", "value_error") and not isinstance(got, dict | list):
        message += f" (got {got!r})"
    return f"{path or '(top level)'}: {message}"


def parse_inventory(text: str, source: str) -> list[InventoryNode]:
    """Parse inventory YAML; `source` names the file in error messages."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InventoryError(f"{source}: not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise InventoryError(f"{source}: the top level must be a mapping with a 'nodes' list")
    try:
        spec = InventorySpec.model_validate(data)
    except ValidationError as exc:
        more = exc.error_count() - 1
        tail = f" ({more} more problem(s) after this one)" if more else ""
        raise InventoryError(f"{source}: {_describe(exc.errors()[0])}{tail}") from None
    return [_expand(node) for node in spec.nodes]


def load_inventory(path: str | Path) -> list[InventoryNode]:
    """Read and validate an inventory file; raises InventoryError naming the file and field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InventoryError(f"{path}: cannot read: {exc}") from None
    return parse_inventory(text, str(path))


def pick_node(nodes: list[InventoryNode], name: str | None, source: str) -> InventoryNode:
    """The node an agent simulates: `name`, or the only node when the file has just one."""
    if name is None:
        if len(nodes) == 1:
            return nodes[0]
        names = ", ".join(n.name for n in nodes[:10]) + (", ..." if len(nodes) > 10 else "")
        raise InventoryError(f"{source}: has {len(nodes)} nodes ({names}); choose one with --node")
    for node in nodes:
        if node.name == name:
            return node
    names = ", ".join(n.name for n in nodes[:10]) + (", ..." if len(nodes) > 10 else "")
    raise InventoryError(f"{source}: no node named {name!r}; nodes are: {names}")
