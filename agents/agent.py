"""The agent: a sampling loop that never waits for the network, and the stream that drains it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from dataclasses import dataclass

from agents import __version__
from agents.buffer import SampleBuffer
from agents.cgroup import CgroupResolver
from agents.gpus.base import GpuSource
from agents.pacing import Backoff
from agents.placements import PlacementTable
from agents.remote.probe import LinkTable
from agents.remote.revocations import RevokedFile
from agents.sampling import Sampler
from agents.share_usage import BrokerUsage
from agents.stream import PortalStream
from wire.agent_portal import MAX_GPUS_PER_NODE, PROTOCOL_VERSION, Hello, RemoteServer, encode

log = logging.getLogger(__name__)

DEFAULT_BUFFER_SECONDS = 900.0
# 64 MiB holds 15 minutes of 8 GPUs with ~100 processes each second (about 20 KiB a sample).
DEFAULT_BUFFER_BYTES = 64 * 1024 * 1024


@dataclass
class AgentSettings:
    url: str  # the agents WebSocket endpoint (see stream.websocket_url)
    token: str
    node: str
    interval_s: float = 1.0
    buffer_seconds: float = DEFAULT_BUFFER_SECONDS
    buffer_bytes: int = DEFAULT_BUFFER_BYTES
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 30.0
    stable_after_s: float = 10.0
    drain_timeout_s: float = 3.0  # on shutdown, how long to wait for the portal to ack what is left
    link_check_s: float = 5.0  # how often the link table is asked whether a probe is due


def next_tick(due: float, now: float, interval: float) -> float:
    """When the next sample is due on the grid of `interval` through `due`: `due` itself unless it
    has passed (a stalled read), else the first grid point after `now`, so the missed ticks are
    skipped rather than made up in a burst."""
    if due >= now:
        return due
    return now + interval - (now - due) % interval


class StopAwareSleep:
    """Sleeps until a loop time or until `stop` is set, whichever comes first.

    One future and one timer a tick: `asyncio.wait_for(stop.wait(), ...)` makes a task and several
    futures every time, which a fleet of hundreds of agents in one process pays every second.
    """

    def __init__(self, stop: asyncio.Event) -> None:
        self._stop = stop
        self._loop = asyncio.get_running_loop()
        self._sleeping: asyncio.Future[None] | None = None
        self._watch = asyncio.ensure_future(stop.wait())  # one task for the whole loop, not one a tick
        self._watch.add_done_callback(self._wake)

    def _wake(self, _: object = None) -> None:
        if self._sleeping is not None and not self._sleeping.done():
            self._sleeping.set_result(None)

    async def until(self, when: float) -> None:
        if self._stop.is_set():
            return
        self._sleeping = self._loop.create_future()
        timer = self._loop.call_at(when, self._wake)
        try:
            await self._sleeping
        finally:
            timer.cancel()
            self._sleeping = None

    def close(self) -> None:
        self._watch.cancel()


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        source: GpuSource,
        placements: PlacementTable,
        resolver: CgroupResolver | None = None,
        share_usage: BrokerUsage | None = None,
        links: LinkTable | None = None,
        resources: dict[str, int] | None = None,
        revoked: RevokedFile | None = None,
    ) -> None:
        self.settings = settings
        self.links = links  # remote GPU shares: the network to GPU nodes' servers, reported to the portal
        self.source = source
        self.placements = placements
        self.stream_id = str(uuid.uuid4())
        devices = source.devices()
        if len(devices) > MAX_GPUS_PER_NODE:
            raise ValueError(f"{len(devices)} GPUs; the protocol allows {MAX_GPUS_PER_NODE}")
        self.hello = Hello(
            v=PROTOCOL_VERSION,
            type="hello",
            node=settings.node,
            stream=self.stream_id,
            agent_version=__version__,
            source=source.kind,
            driver_version=source.driver_version(),
            interval_ms=round(settings.interval_s * 1000),
            gpus=[
                {
                    "index": d.index,
                    "uuid": d.uuid,
                    "model": d.model,
                    "memory_mib": d.memory_mib,
                    "numa_node": d.numa_node,
                    "nvlink_peers": list(d.nvlink_peers),
                    "mig_mode": d.mig_mode,
                }
                for d in devices
            ],
            resources=resources,  # the node's allocatable CPU and memory (agents.node_resources)
            revocations=revoked is not None,  # the portal sends ended remote shares only if asked
            # the broker's terms need each share's priority; the portal sends it only if asked
            priorities=share_usage is not None and share_usage.placements is not None,
        )
        self.buffer = SampleBuffer(
            max_samples=max(1, math.ceil(settings.buffer_seconds / settings.interval_s)),
            max_bytes=settings.buffer_bytes,
        )
        self.sampler = Sampler(source, placements, resolver, share_usage)
        self.stream = PortalStream(
            url=settings.url,
            token=settings.token,
            hello=encode(self.hello),
            node=settings.node,
            stream_id=self.stream_id,
            buffer=self.buffer,
            placements=placements,
            backoff=Backoff(settings.backoff_base_s, settings.backoff_cap_s),
            stable_after_s=settings.stable_after_s,
        )
        if links is not None:
            self.stream.on_servers = self._servers_named
        if revoked is not None:  # this GPU node's remote server reads the file (--revoked-file)
            self.stream.on_revoked = revoked.apply

    def _servers_named(self, servers: list[RemoteServer]) -> None:
        """The portal named the GPU nodes' servers to probe (its welcome, and again when they change
        as nodes come and go); a link dropped with its server must leave the portal's table too."""
        if self.links is not None and self.links.offer({s.node: s.address for s in servers}):
            self.stream.set_links(self.links.message())

    async def _sample_loop(self, stop: asyncio.Event) -> None:
        interval = self.settings.interval_s
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        sleep = StopAwareSleep(stop)
        try:
            while not stop.is_set():
                try:
                    if self.source.kind == "nvml":
                        # NVML calls block for a few milliseconds; keep them off the event loop.
                        seq, text = await asyncio.to_thread(self.sampler.take)
                    else:
                        seq, text = self.sampler.take()
                except Exception:
                    log.exception("reading the GPUs failed; trying again next interval")
                else:
                    dropped = self.buffer.append(seq, text)
                    # Log the first drop and then one in a hundred, not every second.
                    total = self.buffer.dropped
                    if dropped and (total == dropped or total % 100 < dropped):
                        log.warning("buffer full: %d samples dropped so far (oldest first)", total)
                    self.stream.wake()
                next_at = next_tick(next_at + interval, loop.time(), interval)
                await sleep.until(next_at)
        finally:
            sleep.close()

    async def _link_loop(self, stop: asyncio.Event) -> None:
        """Probe one due link at a time (bounded, slow: LinkTable) off the event loop; report the
        whole table to the portal after each probe."""
        while not stop.is_set():
            try:
                if await asyncio.to_thread(self.links.refresh) is not None:
                    self.stream.set_links(self.links.message())
            except Exception:
                log.exception("probing the links to GPU nodes failed; trying again later")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.link_check_s)

    async def run(self, stop: asyncio.Event) -> None:
        """Sample and stream until `stop` is set; then try briefly to deliver what is buffered."""
        stream_stop = asyncio.Event()
        sampling = asyncio.create_task(self._sample_loop(stop))
        streaming = asyncio.create_task(self.stream.run(stream_stop))
        probing = asyncio.create_task(self._link_loop(stop)) if self.links is not None else None
        try:
            await stop.wait()
            await sampling
            deadline = time.monotonic() + self.settings.drain_timeout_s
            while len(self.buffer) and self.stream.connected and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            stream_stop.set()
            sampling.cancel()
            # A connection attempt to a portal that does not answer can take open_timeout; don't wait.
            _, pending = await asyncio.wait({streaming}, timeout=self.settings.drain_timeout_s + 5.0)
            for task in pending:
                task.cancel()
            if probing is not None:
                probing.cancel()
            await asyncio.gather(sampling, streaming, *([probing] if probing else []), return_exceptions=True)
            self.source.close()
