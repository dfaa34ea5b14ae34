"""The broker process: two Unix-socket servers and one token scheduler per GPU.

On the workloads' socket each connection is one process of one share (after its HELLO); on the
control socket, the node agent gives every share's terms and reads telemetry.
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
from collections.abc import Callable, Iterable
from pathlib import Path

from agents.broker.identity import CgroupIdentity, PeerIdentity, peer_credentials
from agents.broker.policy import BrokerSettings, GpuScheduler
from agents.broker.protocol import (
    MAX_CONTROL_LINE_BYTES,
    MAX_LINE_BYTES,
    PROTOCOL_VERSION,
    Acquire,
    Drain,
    Hello,
    ProtocolError,
    Query,
    Release,
    ShareTerms,
    Terms,
    error_line,
    grant_line,
    parse_control_line,
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
    """All GPUs of a node. Create inside a running event loop.

    Terms come only from the node agent (``set_terms``, the control socket's TERMS); a process joins
    a share only if the agent named it and ``identity`` ties the process to it."""

    def __init__(self, settings: BrokerSettings | None = None, identity: PeerIdentity | None = None) -> None:
        self.settings = settings or BrokerSettings()
        self.identity: PeerIdentity = identity or CgroupIdentity()
        self.gpus: dict[str, _Gpu] = {}
        self.terms: dict[tuple[str, str], ShareTerms] = {}  # (gpu, share) -> what the agent said
        self._ids = itertools.count(1)
        self.rejected_lines = 0
        self.refused_hellos = 0
        # (pid, gpu, share) refusals already logged as warnings: a refused library asks again every second
        self.refusals_logged: set[tuple[int, str, str]] = set()

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
            "refused_hellos": self.refused_hellos,
        }

    def set_terms(self, shares: Iterable[ShareTerms]) -> None:
        """The node agent's whole table of shares: new ones defined, changed ones updated, those it no
        longer names dropped with their processes. A process that no longer matches its share's
        identity (the share's pod changed) is dropped too."""
        new = {(t.gpu, t.share): t for t in shares}
        now = time.monotonic()
        touched: set[str] = set()
        for (gpu_name, share), old in self.terms.items():
            gpu = self.gpus.get(gpu_name)
            if gpu is None:
                continue
            terms = new.get((gpu_name, share))
            if terms is None:
                gone = gpu.scheduler.forget_share(share, now)
            elif (terms.pod_uid, terms.sessions) != (old.pod_uid, old.sessions):
                gone = [c.client_id for c in list(gpu.scheduler.clients.values())
                        if c.share.share_id == share and self.identity.refusal(c.pid, terms) is not None]
                for client_id in gone:
                    gpu.scheduler.remove_client(client_id, now)
            else:
                continue
            for client_id in gone:
                transport = gpu.writers.pop(client_id, None)
                if transport is not None:
                    transport.write(error_line(f"share {share} is no longer this process's on this node"))
                    transport.close()
            touched.add(gpu_name)
        for terms in new.values():
            self.gpu(terms.gpu).scheduler.define_share(terms.share, terms.request, terms.limit,
                                                       terms.high_priority, now)
            touched.add(terms.gpu)
        self.terms = new
        for gpu_name in touched:
            self.gpu(gpu_name).dispatch()

    def new_client_id(self) -> int:
        return next(self._ids)

    def gpu(self, name: str) -> _Gpu:
        """The GPU of that name, created on first use."""
        gpu = self.gpus.get(name)
        if gpu is None:
            gpu = self.gpus[name] = _Gpu(name, self.settings)
        return gpu


class _LineConnection(asyncio.Protocol):
    """Splits a byte stream into bounded lines; a bad line is answered ERR, never fatal to the broker."""

    max_line = MAX_LINE_BYTES

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.transport: asyncio.Transport | None = None
        self.pending = bytearray()
        self.errors = 0
        self.peer_pid = 0
        self.peer_uid = -1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        with contextlib.suppress(OSError, AttributeError):
            self.peer_pid, self.peer_uid = peer_credentials(sock)

    def data_received(self, data: bytes) -> None:
        transport = self.transport
        assert transport is not None
        self.pending += data
        while not transport.is_closing():
            end = self.pending.find(b"\n")
            if end > self.max_line or (end < 0 and len(self.pending) > self.max_line):
                log.warning("rejected a line longer than %d bytes; closing", self.max_line)
                self.broker.rejected_lines += 1
                transport.write(error_line(f"line longer than {self.max_line} bytes"))
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
        raise NotImplementedError

    def pause_writing(self) -> None:
        # a reader that does not read (QUERY after QUERY) gets no more answers buffered for it
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()


class _Connection(_LineConnection):
    """One process of one share, after its HELLO.

    Lines are handled in the event loop's read callback itself, and a report that frees the token
    grants it from there too: the GPU idles for as long as the hand-off takes."""

    def __init__(self, broker: Broker) -> None:
        super().__init__(broker)
        self.client_id: int | None = None
        self.gpu: _Gpu | None = None

    def _handle_line(self, raw: bytes, transport: asyncio.Transport) -> None:
        message = parse_line(raw)
        if isinstance(message, Hello):
            if self.client_id is not None:
                raise ProtocolError("HELLO was already sent on this connection")
            self._hello(message, transport)
        elif isinstance(message, Query):
            raise ProtocolError("QUERY is answered to the node agent only, on the broker's control socket")
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

    def _hello(self, message: Hello, transport: asyncio.Transport) -> None:
        broker = self.broker
        terms = broker.terms.get((message.gpu, message.share))
        if terms is None:
            reason = f"share {message.share} has no terms on GPU {message.gpu} (the node agent did not place it here)"
        else:
            reason = broker.identity.refusal(self.peer_pid, terms)
        if reason is not None:
            broker.refused_hellos += 1
            key = (self.peer_pid, message.gpu, message.share)
            if len(broker.refusals_logged) >= 4096:
                broker.refusals_logged.clear()
            level = logging.DEBUG if key in broker.refusals_logged else logging.WARNING
            broker.refusals_logged.add(key)
            log.log(level, "refused pid %d (says %d) for share %s on gpu %s: %s",
                    self.peer_pid, message.pid, message.share, message.gpu, reason)
            transport.write(error_line(f"refused: {reason}"))
            transport.close()
            return
        assert terms is not None
        gpu = broker.gpu(message.gpu)
        self.client_id, self.gpu = broker.new_client_id(), gpu
        gpu.scheduler.add_client(self.client_id, message.share, self.peer_pid, time.monotonic())
        gpu.writers[self.client_id] = transport
        log.info("gpu %s: pid %d joined share %s (request %.3f, limit %.3f, %s priority, from the agent)",
                 message.gpu, self.peer_pid, message.share, terms.request, terms.limit,
                 "high" if terms.high_priority else "low")
        window_ms = round(broker.settings.window_s * 1000)
        transport.write(f"OK v={PROTOCOL_VERSION} window_ms={window_ms} drain=1\n".encode())

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            log.debug("connection ended: %s", exc)
        if self.client_id is not None and self.gpu is not None:
            # a holder that went away (even one that died) gives the token up at once
            self.gpu.scheduler.remove_client(self.client_id, time.monotonic())
            self.gpu.writers.pop(self.client_id, None)
            self.gpu.dispatch()
        self.transport = None


class _ControlConnection(_LineConnection):
    """The node agent: TERMS (every share's terms) and QUERY (telemetry). Only root, the broker's own
    user and the agent's users (``--agent-uid``) get an answer, by the socket's peer credentials."""

    max_line = MAX_CONTROL_LINE_BYTES

    def __init__(self, broker: Broker, allowed_uids: frozenset[int]) -> None:
        super().__init__(broker)
        self.allowed_uids = allowed_uids

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self.peer_uid not in self.allowed_uids:
            log.warning("refused a control connection from uid %d (pid %d)", self.peer_uid, self.peer_pid)
            assert self.transport is not None
            self.transport.write(error_line("refused: the control socket is the node agent's"))
            self.transport.close()

    def _handle_line(self, raw: bytes, transport: asyncio.Transport) -> None:
        message = parse_control_line(raw)
        if isinstance(message, Terms):
            self.broker.set_terms(message.shares)
            transport.write(f"OK shares={len(message.shares)}\n".encode())
        else:
            transport.write(b"STATS " + json.dumps(self.broker.snapshot(), sort_keys=True).encode() + b"\n")

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def _unix_server(path: Path, factory: Callable[[], asyncio.Protocol], mode: int) -> asyncio.Server:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a stale socket from a previous run
    server = await asyncio.get_running_loop().create_unix_server(factory, path=str(path))
    os.chmod(path, mode)
    return server


async def serve(socket_path: str | os.PathLike[str], settings: BrokerSettings | None = None,
                ready: asyncio.Event | None = None, broker: Broker | None = None, *,
                control_path: str | os.PathLike[str], agent_uids: Iterable[int] = ()) -> None:
    """Runs the broker on its two Unix sockets until cancelled: ``socket_path`` for the workloads'
    processes, ``control_path`` for the node agent. Pass a :class:`Broker` to keep a handle on it."""
    path, control = Path(socket_path), Path(control_path)
    broker = broker or Broker(settings)
    allowed = frozenset({0, os.geteuid(), *agent_uids})
    # Workload containers run as any user and must connect; they cannot replace the socket because
    # its directory reaches them read-only. The control socket is the agent's alone: 0600 when the
    # agent runs as the broker's user, else open to connect and checked by peer credentials.
    server = await _unix_server(path, lambda: _Connection(broker), 0o666)
    control_server = await _unix_server(control, lambda: _ControlConnection(broker, allowed),
                                        0o600 if allowed <= {0, os.geteuid()} else 0o666)
    log.info("share broker listening on %s, agent on %s (window %.1f s, identity by %s)",
             path, control, broker.settings.window_s, broker.identity.name)
    if ready is not None:
        ready.set()
    try:
        async with server, control_server:
            await asyncio.gather(server.serve_forever(), control_server.serve_forever())
    finally:
        for gpu in broker.gpus.values():
            gpu.close()
        for p in (path, control):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
