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
    Drain,
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
    """A scheduler plus the writers its grants go to.

    Grants are handed out synchronously, from the very callback that freed the token (a report, a
    disconnect) or from a timer at the time the policy names: while the hand-off runs the GPU idles,
    so it must not wait for another task to be scheduled on the event loop."""

    def __init__(self, gpu: str, settings: BrokerSettings) -> None:
        self.scheduler = GpuScheduler(gpu, settings)
        self.writers: dict[int, asyncio.Transport] = {}
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None

    def dispatch(self) -> None:
        """Takes the token from a holder past its deadline, grants it if someone may have it, and
        arranges to look again when the policy says."""
        scheduler = self.scheduler
        while True:
            now = time.monotonic()
            revoked = scheduler.expire_holder(now)
            if revoked is not None:
                log.warning("gpu %s: pid %d of share %s did not report in time; token revoked",
                            scheduler.gpu, revoked.pid, revoked.share.share_id)
            grant, wake = scheduler.schedule(now)
            if grant is None:
                break
            writer = self.writers.get(grant.client_id)
            if writer is not None:
                writer.write(grant_line(grant.quota_s))
        if self._timer is not None:
            if wake is not None and self._timer.when() == wake:
                return
            self._timer.cancel()
        # the loop's clock is time.monotonic(), the scheduler's
        self._timer = None if wake is None else self._loop.call_at(wake, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None  # this one has fired: dispatch must not take it for the next
        self.dispatch()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


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
        self.gpu(gpu).scheduler.define_share(share_id, request, limit, high_priority, time.monotonic())
        self.gpu(gpu).dispatch()

    def new_client_id(self) -> int:
        return next(self._ids)

    def gpu(self, name: str) -> _Gpu:
        """The GPU of that name, created on first use."""
        gpu = self.gpus.get(name)
        if gpu is None:
            gpu = self.gpus[name] = _Gpu(name, self.settings)
        return gpu


class _Connection(asyncio.Protocol):
    """One connection: a process of one share (after its HELLO) or a telemetry reader (QUERY only).

    Lines are handled in the event loop's read callback itself, and a report that frees the token
    grants it from there too: the GPU idles for as long as the hand-off takes."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.transport: asyncio.Transport | None = None
        self.pending = bytearray()
        self.client_id: int | None = None
        self.gpu: _Gpu | None = None
        self.errors = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        transport = self.transport
        assert transport is not None
        self.pending += data
        while not transport.is_closing():
            end = self.pending.find(b"\n")
            if end > MAX_LINE_BYTES or (end < 0 and len(self.pending) > MAX_LINE_BYTES):
                log.warning("rejected a line longer than %d bytes; closing", MAX_LINE_BYTES)
                self.broker.rejected_lines += 1
                transport.write(error_line(f"line longer than {MAX_LINE_BYTES} bytes"))
                transport.close()
                return
            if end < 0:
                return
            raw = bytes(self.pending[: end + 1])
            del self.pending[: end + 1]
            try:
                self._handle_line(raw, transport)
            except ProtocolError as exc:
                self.errors += 1
                self.broker.rejected_lines += 1
                log.warning("rejected a message: %s", exc)
                transport.write(error_line(str(exc)))
                if self.errors >= MAX_ERRORS_PER_CONNECTION:
                    transport.close()
            except Exception:  # a bug must cost one connection, never the broker
                log.exception("unexpected error on a broker connection")
                transport.close()

    def _handle_line(self, raw: bytes, transport: asyncio.Transport) -> None:
        broker = self.broker
        message = parse_line(raw)
        if isinstance(message, Hello):
            if self.client_id is not None:
                raise ProtocolError("HELLO was already sent on this connection")
            gpu = broker.gpu(message.gpu)
            if gpu.scheduler.terms_conflict(message.share, message.request, message.limit,
                                            message.high_priority):
                log.warning("share %s: pid %d announced other terms than the share has; "
                            "the share's terms stay", message.share, message.pid)
            self.client_id, self.gpu = broker.new_client_id(), gpu
            gpu.scheduler.add_client(self.client_id, message.share, message.request, message.limit,
                                     message.high_priority, message.pid, time.monotonic())
            gpu.writers[self.client_id] = transport
            log.info("gpu %s: pid %d joined share %s (request %.3f, limit %.3f, %s priority)",
                     message.gpu, message.pid, message.share, message.request, message.limit,
                     "high" if message.high_priority else "low")
            window_ms = round(broker.settings.window_s * 1000)
            transport.write(f"OK v={PROTOCOL_VERSION} window_ms={window_ms} drain=1\n".encode())
        elif isinstance(message, Query):
            transport.write(b"STATS " + json.dumps(broker.snapshot(), sort_keys=True).encode() + b"\n")
        elif self.client_id is None or self.gpu is None:
            raise ProtocolError("send HELLO first")
        elif isinstance(message, Acquire):
            self.gpu.scheduler.acquire(self.client_id, message.used_s, message.idle, time.monotonic())
            self.gpu.dispatch()
        elif isinstance(message, Release):
            self.gpu.scheduler.release(self.client_id, message.used_s, message.idle, time.monotonic())
            self.gpu.dispatch()
        elif isinstance(message, Drain):
            self.gpu.scheduler.draining(self.client_id, time.monotonic())
            self.gpu.dispatch()  # the timer waits for the new deadline

    def pause_writing(self) -> None:
        # a reader that does not read (QUERY after QUERY) gets no more answers buffered for it
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            log.debug("connection ended: %s", exc)
        if self.client_id is not None and self.gpu is not None:
            # a holder that went away (even one that died) gives the token up at once
            self.gpu.scheduler.remove_client(self.client_id, time.monotonic())
            self.gpu.writers.pop(self.client_id, None)
            self.gpu.dispatch()
        self.transport = None


async def serve(socket_path: str | os.PathLike[str], settings: BrokerSettings | None = None,
                ready: asyncio.Event | None = None, broker: Broker | None = None) -> None:
    """Runs the broker on a Unix socket until cancelled. Pass a :class:`Broker` to keep a handle on it
    (``snapshot()`` for telemetry, ``define_share()`` for terms)."""
    path = Path(socket_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a stale socket from a previous run
    broker = broker or Broker(settings)
    loop = asyncio.get_running_loop()
    server = await loop.create_unix_server(lambda: _Connection(broker), path=str(path))
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
            gpu.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
