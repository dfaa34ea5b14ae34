"""The broker process: a Unix-socket server with one token scheduler per GPU.

Each connection is one process of one share (after its HELLO) or a telemetry reader (QUERY only).
A bad line is answered with ``ERR`` and logged; it never takes the broker down. A client that
disconnects, even while holding a token, is forgotten and its token goes to the next in line.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import time
from pathlib import Path

from agents.broker.policy import BrokerSettings, GpuScheduler
from agents.broker.protocol import (
    MAX_LINE_BYTES,
    PROTOCOL_VERSION,
    Acquire,
    Hello,
    ProtocolError,
    Query,
    Release,
    error_line,
    grant_line,
    parse_line,
)

log = logging.getLogger("agents.broker")

MAX_ERRORS_PER_CONNECTION = 20


class _Gpu:
    """A scheduler plus the task that hands out its tokens."""

    def __init__(self, gpu: str, settings: BrokerSettings) -> None:
        self.scheduler = GpuScheduler(gpu, settings)
        self.writers: dict[int, asyncio.StreamWriter] = {}
        self.changed = asyncio.Event()
        self.task = asyncio.create_task(self._run(), name=f"broker-gpu-{gpu}")

    def poke(self) -> None:
        self.changed.set()

    async def _run(self) -> None:
        scheduler = self.scheduler
        while True:
            now = time.monotonic()
            revoked = scheduler.expire_holder(now)
            if revoked is not None:
                log.warning("gpu %s: pid %d of share %s did not report in time; token revoked",
                            scheduler.gpu, revoked.pid, revoked.share.share_id)
            grant, wake = scheduler.schedule(now)
            if grant is not None:
                writer = self.writers.get(grant.client_id)
                if writer is not None:
                    writer.write(grant_line(grant.quota_s))
                continue
            timeout = None if wake is None else max(0.0, wake - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), timeout)
            self.changed.clear()


class Broker:
    """All GPUs of a node. Create inside a running event loop."""

    def __init__(self, settings: BrokerSettings | None = None) -> None:
        self.settings = settings or BrokerSettings()
        self.gpus: dict[str, _Gpu] = {}
        self._ids = itertools.count(1)
        self.rejected_lines = 0

    def snapshot(self) -> dict[str, object]:
        """Per-share GPU time (telemetry for the node agent)."""
        now = time.monotonic()
        return {
            "window_s": self.settings.window_s,
            "gpus": {
                gpu: {"revocations": g.scheduler.revocations, "shares": g.scheduler.snapshot(now)}
                for gpu, g in self.gpus.items()
            },
            "rejected_lines": self.rejected_lines,
        }

    def define_share(self, gpu: str, share_id: str, request: float, limit: float,
                     high_priority: bool) -> None:
        """The node agent's word on a share's terms (from its reservation); processes cannot change them."""
        self._gpu(gpu).scheduler.define_share(share_id, request, limit, high_priority, time.monotonic())
        self._gpu(gpu).poke()

    def _gpu(self, name: str) -> _Gpu:
        gpu = self.gpus.get(name)
        if gpu is None:
            gpu = self.gpus[name] = _Gpu(name, self.settings)
        return gpu

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client_id: int | None = None
        gpu: _Gpu | None = None
        errors = 0
        try:
            while errors < MAX_ERRORS_PER_CONNECTION:
                try:
                    raw = await reader.readuntil(b"\n")
                except asyncio.LimitOverrunError:
                    log.warning("rejected a line longer than %d bytes; closing", MAX_LINE_BYTES)
                    self.rejected_lines += 1
                    writer.write(error_line(f"line longer than {MAX_LINE_BYTES} bytes"))
                    break
                except asyncio.IncompleteReadError:
                    break
                try:
                    message = parse_line(raw)
                    if isinstance(message, Hello):
                        if client_id is not None:
                            raise ProtocolError("HELLO was already sent on this connection")
                        gpu = self._gpu(message.gpu)
                        if gpu.scheduler.terms_conflict(message.share, message.request, message.limit,
                                                        message.high_priority):
                            log.warning("share %s: pid %d announced other terms than the share has; "
                                        "the share's terms stay", message.share, message.pid)
                        client_id = next(self._ids)
                        gpu.scheduler.add_client(client_id, message.share, message.request, message.limit,
                                                 message.high_priority, message.pid, time.monotonic())
                        gpu.writers[client_id] = writer
                        log.info("gpu %s: pid %d joined share %s (request %.3f, limit %.3f, %s priority)",
                                 message.gpu, message.pid, message.share, message.request, message.limit,
                                 "high" if message.high_priority else "low")
                        window_ms = round(self.settings.window_s * 1000)
                        writer.write(f"OK v={PROTOCOL_VERSION} window_ms={window_ms}\n".encode())
                    elif isinstance(message, Query):
                        writer.write(b"STATS " + json.dumps(self.snapshot(), sort_keys=True).encode() + b"\n")
                    elif client_id is None or gpu is None:
                        raise ProtocolError("send HELLO first")
                    elif isinstance(message, Acquire):
                        gpu.scheduler.acquire(client_id, message.used_s, message.idle, time.monotonic())
                        gpu.poke()
                    elif isinstance(message, Release):
                        gpu.scheduler.release(client_id, message.used_s, message.idle, time.monotonic())
                        gpu.poke()
                except ProtocolError as exc:
                    errors += 1
                    self.rejected_lines += 1
                    log.warning("rejected a message: %s", exc)
                    writer.write(error_line(str(exc)))
                await writer.drain()
        except (ConnectionError, OSError) as exc:
            log.debug("connection ended: %s", exc)
        except Exception:  # a bug must cost one connection, never the broker
            log.exception("unexpected error on a broker connection")
        finally:
            if client_id is not None and gpu is not None:
                gpu.scheduler.remove_client(client_id, time.monotonic())
                gpu.writers.pop(client_id, None)
                gpu.poke()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def serve(socket_path: str | os.PathLike[str], settings: BrokerSettings | None = None,
                ready: asyncio.Event | None = None, broker: Broker | None = None) -> None:
    """Runs the broker on a Unix socket until cancelled. Pass a :class:`Broker` to keep a handle on it
    (``snapshot()`` for telemetry, ``define_share()`` for terms)."""
    path = Path(socket_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a stale socket from a previous run
    broker = broker or Broker(settings)
    server = await asyncio.start_unix_server(broker.handle, path=str(path), limit=MAX_LINE_BYTES)
    # workload containers run as any user; the socket is only mounted where shares are meant to reach it
    os.chmod(path, 0o666)  # noqa: S103
    log.info("share broker listening on %s (window %.1f s)", path, broker.settings.window_s)
    if ready is not None:
        ready.set()
    try:
        async with server:
            await server.serve_forever()
    finally:
        for gpu in broker.gpus.values():
            gpu.task.cancel()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
