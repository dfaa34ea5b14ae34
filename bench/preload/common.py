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

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from agents.broker.protocol import ShareTerms, query_stats  # noqa: E402


def build() -> None:
    subprocess.run(["make", "-s", "-C", str(PRELOAD), "test-bins"], check=True)


def fake_env(root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "FAKE_", "LD_"))}
    env.update(LD_LIBRARY_PATH=str(TEST_BIN), FAKE_CUDA_STATE_DIR=str(root),
               TESSERA_BUDGET_PATH=str(root / "budget"), TESSERA_BROKER_SOCKET=str(root / "absent.sock"))
    env.update(extra)
    return env


class Broker:
    """The broker, with this benchmark as the node's agent: ``define`` gives a share's terms (its
    processes are this benchmark's session, which its children inherit)."""

    def __init__(self, path: Path, *args: str, identity: str = "session") -> None:
        self.path = path
        self.control = path.with_name(path.stem + "-control.sock")
        self.terms: dict[tuple[str, str], ShareTerms] = {}
        if path.exists():
            path.unlink()
        self.proc = subprocess.Popen([sys.executable, "-m", "agents.broker", "--socket", str(path),
                                      "--control-socket", str(self.control), "--identity", identity,
                                      "--log-level", "WARNING", *args], cwd=REPO)
        for _ in range(400):
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(self.control))
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("broker did not start")

    def define(self, share: str, gpu: str, request: float, limit: float, priority: str = "low",
               pod_uid: str | None = None) -> None:
        self.terms[(gpu, share)] = ShareTerms(share=share, gpu=gpu, request=request, limit=limit, priority=priority,
                                              sessions=[os.getsid(0)], pod_uid=pod_uid)
        query_stats(self.control, timeout_s=10, terms=self.terms.values())

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def command_line() -> str:
    return " ".join([Path(sys.executable).name if "python" in sys.executable else sys.executable,
                     *[str(Path(a).relative_to(REPO)) if a.startswith(str(REPO)) else a for a in sys.argv]])
