"""What the kubernetes benchmarks share: the test suite's fake API server, and percentiles."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fake_apiserver_module():
    spec = importlib.util.spec_from_file_location(
        "fake_apiserver", ROOT / "tests" / "scheduler" / "backends" / "fake_apiserver.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fake_apiserver"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]
