"""Reading the Alibaba GPU trace (cluster-trace-gpu-v2023, "openb") with row-level validation.

A bad row (missing column, not a number, negative, impossible GPU shape) is reported with its
file and line and skipped; reading goes on. A file that cannot be read at all raises TraceError.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar


def _find_trace_dir() -> Path:
    """TESSERA_TRACE_DIR, else the nearest `shared/traces/alibaba-gpu-v2023` above this checkout
    (the trace lives beside the repository, not in it)."""
    if os.environ.get("TESSERA_TRACE_DIR"):
        return Path(os.environ["TESSERA_TRACE_DIR"])
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "shared" / "traces" / "alibaba-gpu-v2023"
        if candidate.is_dir():
            return candidate
    return here.parents[3] / "shared" / "traces" / "alibaba-gpu-v2023"


DEFAULT_TRACE_DIR = _find_trace_dir()
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")  # gpu_spec is optional
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")


class TraceError(ValueError):
    pass


@dataclass(frozen=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU
    gpu_spec: str  # "" or "A|B"


@dataclass(frozen=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


T = TypeVar("T")


@dataclass
class Loaded(Generic[T]):
    rows: list[T]
    problems: list[str] = field(default_factory=list)  # "file:line: what is wrong"


def resolve_trace(name_or_path: str, trace_dir: Path = DEFAULT_TRACE_DIR) -> Path:
    """A shipped trace name ("default", "gpushare40", "openb_pod_list_default") or a CSV path."""
    path = Path(name_or_path)
    if path.suffix == ".csv" or path.exists():
        if not path.is_file():
            raise TraceError(f"trace file {path} does not exist")
        return path
    stem = name_or_path if name_or_path.startswith("openb_pod_list_") else f"openb_pod_list_{name_or_path}"
    candidate = trace_dir / "csv" / f"{stem}.csv"
    if not candidate.is_file():
        raise TraceError(f"no trace named {name_or_path!r} in {trace_dir / 'csv'}")
    return candidate


def shipped_traces(trace_dir: Path = DEFAULT_TRACE_DIR) -> list[str]:
    names = sorted(
        p.stem.removeprefix("openb_pod_list_") for p in (trace_dir / "csv").glob("openb_pod_list_*.csv")
    )
    return names


def _int(row: dict[str, str | None], key: str) -> int:
    raw = row.get(key)
    if raw is None or raw.strip() == "":
        raise ValueError(f"column {key} is empty")
    try:
        value = int(float(raw))
    except ValueError:
        raise ValueError(f"column {key} is not a number: {raw!r}") from None
    if value < 0:
        raise ValueError(f"column {key} is negative: {value}")
    return value


def _open(path: Path, columns: tuple[str, ...]) -> tuple[csv.DictReader, object]:
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror}") from exc
    reader = csv.DictReader(handle)
    missing = [c for c in columns if c not in (reader.fieldnames or [])]
    if missing:
        handle.close()
        raise TraceError(f"{path}:1: missing column(s) {', '.join(missing)}")
    return reader, handle


def _load(path: Path, columns: tuple[str, ...] | list[str], parse: Callable[[dict, int], T]) -> Loaded[T]:
    """Parse every row; a bad row is reported with file and line and skipped, never fatal."""
    reader, handle = _open(path, columns)
    out: Loaded[T] = Loaded([])
    with handle:  # type: ignore[attr-defined]
        for row in reader:
            try:
                if None in row.values() or None in row:
                    raise ValueError("wrong number of fields")
                out.rows.append(parse(row, reader.line_num))
            except ValueError as exc:
                out.problems.append(f"{path}:{reader.line_num}: {exc}")
    return out


def _pod(row: dict, line: int) -> TracePod:
    pod = TracePod(
        name=(row["name"] or f"line-{line}").strip(),
        cpu_milli=_int(row, "cpu_milli"),
        memory_mib=_int(row, "memory_mib"),
        num_gpu=_int(row, "num_gpu"),
        gpu_milli=_int(row, "gpu_milli") if row.get("gpu_milli", "").strip() else 0,
        gpu_spec=(row.get("gpu_spec") or "").strip(),
    )
    if pod.num_gpu > 0 and not 0 < pod.gpu_milli <= 1000:
        raise ValueError(f"gpu_milli must be in 1..1000 for a GPU pod, got {pod.gpu_milli}")
    if pod.num_gpu > 1 and pod.gpu_milli != 1000:
        raise ValueError("a pod with several GPUs must take whole GPUs (gpu_milli 1000)")
    return pod


def _node(row: dict, line: int) -> TraceNode:
    node = TraceNode(
        name=(row["sn"] or "").strip(),
        cpu_milli=_int(row, "cpu_milli"),
        memory_mib=_int(row, "memory_mib"),
        gpus=_int(row, "gpu"),
        model=(row.get("model") or "").strip(),
    )
    if not node.name:
        raise ValueError("column sn is empty")
    if node.gpus > 0 and not node.model:
        raise ValueError("a GPU node needs a model")
    return node


def load_pods(path: Path) -> Loaded[TracePod]:
    return _load(path, POD_COLUMNS, _pod)


def load_nodes(path: Path) -> Loaded[TraceNode]:
    return _load(path, NODE_COLUMNS, _node)
