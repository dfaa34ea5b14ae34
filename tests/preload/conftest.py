"""Fixtures for the preload tests: the library, the fake driver and test programs built with make
(rebuilt when stale), an environment that loads them, and a share broker run as a real process."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
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


class BrokerProcess:
    def __init__(self, socket_path: Path, log_path: Path, *args: str) -> None:
        self.socket_path = socket_path
        self.log_path = log_path
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> BrokerProcess:
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the life of the process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agents.broker", "--socket", str(self.socket_path), "--log-level", "INFO",
             *self.args],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.socket_path.exists():
                with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(self.socket_path))
                    return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"broker did not start:\n{self.log_path.read_text()}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def query(self) -> dict:
        import json

        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(str(self.socket_path))
            s.sendall(b"QUERY\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        assert data.startswith(b"STATS "), data
        return json.loads(data[6:])


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "broker.sock", tmp_path / "broker.log").start()
    yield proc
    proc.stop()
