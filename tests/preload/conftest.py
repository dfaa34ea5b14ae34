"""Fixtures for the preload tests: the library, the fake driver and test programs built with make
(rebuilt when stale) and an environment that loads them. The share broker process they run beside
the library is tests/agents/broker/process.py."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRELOAD = REPO / "preload"
BUILD = PRELOAD / "build"
TEST_BIN = BUILD / "test"
LIBRARY = BUILD / "libtessera_preload.so"
MiB = 1 << 20
GiB = 1 << 30


def make(*targets: str) -> None:
    result = subprocess.run(["make", "-s", "-C", str(PRELOAD), *targets], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"make {' '.join(targets)} failed:\n{result.stdout}\n{result.stderr}")


@pytest.fixture(scope="session")
def built() -> Path:
    make("test-bins")
    return TEST_BIN


@dataclass
class Env:
    """An environment that runs a test program on the fake driver, with or without the library."""

    root: Path
    vars: dict[str, str]

    def with_(self, **extra: str | None) -> Env:
        merged = dict(self.vars)
        for key, value in extra.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        return Env(self.root, merged)

    def run(self, program: str, *args: str | int, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = [program if program == sys.executable else str(TEST_BIN / program), *map(str, args)]
        return subprocess.run(cmd, env=self.vars, capture_output=True, text=True, timeout=timeout)

    def popen(self, program: str, *args: str | int) -> subprocess.Popen[str]:
        cmd = [program if program == sys.executable else str(TEST_BIN / program), *map(str, args)]
        return subprocess.Popen(cmd, env=self.vars, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def fake_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "FAKE_", "LD_"))}
    env.update(
        LD_LIBRARY_PATH=str(TEST_BIN),
        FAKE_CUDA_STATE_DIR=str(root),
        TESSERA_BUDGET_PATH=str(root / "budget"),
        TESSERA_BROKER_SOCKET=str(root / "no-broker.sock"),
    )
    return env


@pytest.fixture
def bare(built: Path, tmp_path: Path) -> Env:
    """The fake driver without the library."""
    return Env(tmp_path, fake_env(tmp_path))


@pytest.fixture
def capped(bare: Env) -> Env:
    """The fake driver with the library preloaded (no limits set yet)."""
    return bare.with_(LD_PRELOAD=str(LIBRARY))


def parse_kv(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.split():
        key, _, value = line.partition("=")
        if value.lstrip("-").isdigit():
            out[key] = int(value)
    return out


