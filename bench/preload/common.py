"""Shared pieces of the preload benchmarks: building, the fake-driver environment, a broker."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRELOAD = REPO / "preload"
BUILD = PRELOAD / "build"
TEST_BIN = BUILD / "test"
LIBRARY = BUILD / "libtessera_preload.so"
RESULTS = REPO / "bench" / "results" / "preload"


def build() -> None:
    subprocess.run(["make", "-s", "-C", str(PRELOAD), "test-bins"], check=True)


def fake_env(root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "FAKE_", "LD_"))}
    env.update(LD_LIBRARY_PATH=str(TEST_BIN), FAKE_CUDA_STATE_DIR=str(root),
               TESSERA_BUDGET_PATH=str(root / "budget"), TESSERA_BROKER_SOCKET=str(root / "absent.sock"))
    env.update(extra)
    return env


class Broker:
    def __init__(self, path: Path, *args: str) -> None:
        self.path = path
        if path.exists():
            path.unlink()
        self.proc = subprocess.Popen([sys.executable, "-m", "agents.broker", "--socket", str(path),
                                      "--log-level", "WARNING", *args], cwd=REPO)
        for _ in range(400):
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(path))
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("broker did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def command_line() -> str:
    return " ".join([Path(sys.executable).name if "python" in sys.executable else sys.executable,
                     *[str(Path(a).relative_to(REPO)) if a.startswith(str(REPO)) else a for a in sys.argv]])
