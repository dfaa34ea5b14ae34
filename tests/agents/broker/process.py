"""The share broker run as a real process (`python -m agents.broker`), for the broker's tests and
the preload tests that put a broker beside the library."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from agents.broker.protocol import query_stats

REPO = Path(__file__).resolve().parents[3]


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
        return query_broker(self.socket_path)


def query_broker(socket_path: Path) -> dict:
    """The broker's STATS answer to QUERY on its socket, read as the agent reads it."""
    return query_stats(socket_path, timeout_s=10)
