"""The share broker run as a real process (`python -m agents.broker`), for the broker's tests and
the preload tests that put a broker beside the library.

The broker serves only shares the node agent named, to processes tied to them: here the test plays
the agent (``define``) and ties shares to sessions (``--identity session``), by default the test's
own session, which the processes it starts inherit."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from agents.broker.protocol import ShareTerms, query_stats

REPO = Path(__file__).resolve().parents[3]


class BrokerProcess:
    def __init__(self, socket_path: Path, log_path: Path, *args: str) -> None:
        self.socket_path = socket_path
        self.control_path = control_path(socket_path)
        self.log_path = log_path
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        self.terms: dict[tuple[str, str], ShareTerms] = {}

    def start(self) -> BrokerProcess:
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the life of the process
        self.proc = subprocess.Popen(
            [*broker_command(self.socket_path), "--log-level", "INFO", *self.args],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.socket_path.exists():
                with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(self.control_path))
                    if self.terms:  # a restarted broker hears the terms again, as from the agent
                        self.send_terms()
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
        return query_broker(self.control_path)

    def define(self, share: str, gpu: str, request: float, limit: float, priority: str = "low",
               sessions: list[int] | None = None, **more: object) -> None:
        """Tells the broker a share's terms, as the node agent does (every share it knows, each time)."""
        self.terms[(gpu, share)] = ShareTerms(share=share, gpu=gpu, request=request, limit=limit, priority=priority,
                                              sessions=[os.getsid(0)] if sessions is None else sessions, **more)
        self.send_terms()

    def forget(self, share: str, gpu: str) -> None:
        del self.terms[(gpu, share)]
        self.send_terms()

    def send_terms(self) -> None:
        query_stats(self.control_path, timeout_s=10, terms=self.terms.values())


def control_path(socket_path: Path) -> Path:
    return socket_path.with_name(socket_path.stem + "-control.sock")


def broker_command(socket_path: Path) -> list[str]:
    """A broker on ``socket_path`` (and its control socket beside it) that ties processes to shares
    by session."""
    return [sys.executable, "-m", "agents.broker", "--socket", str(socket_path),
            "--control-socket", str(control_path(socket_path)), "--identity", "session"]


def query_broker(control: Path) -> dict:
    """The broker's STATS answer to QUERY on its control socket, read as the agent reads it."""
    return query_stats(control, timeout_s=10)
