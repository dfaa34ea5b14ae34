"""Publishing readings to the groups somebody watches, after each commit, in their own task.

Only watched groups are published to: at 4,000 GPUs, sending every reading to a group nobody
listens to would cost the portal more than storing it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from portal.telemetry import conf

from .groups import parse_group
from .messages import Latest, messages_for
from .watching import store

WATCH_CACHE_S = 1.0  # publishers re-read the watched set at most this often

log = logging.getLogger(__name__)


class Publisher:
    """Sends a batch of newest readings to the groups somebody watches (one per event loop)."""

    def __init__(self) -> None:
        self._watched: set[str] = set()
        self._read_at = 0.0

    async def publish(self, latest_readings: list[Latest]) -> int:
        from channels.layers import get_channel_layer

        if time.monotonic() - self._read_at > WATCH_CACHE_S:
            self._watched = await store().watched()
            self._read_at = time.monotonic()
        if not self._watched:
            return 0
        outgoing = messages_for(latest_readings, self._watched)
        if not outgoing:
            return 0
        names = list(outgoing)
        seqs = await store().next_seqs(names)
        layer = get_channel_layer()

        async def send(name: str) -> None:
            text = json.dumps({"group": name, "seq": seqs[name], **outgoing[name]}, separators=(",", ":"))
            await layer.group_send(parse_group(name).channel_group,
                                   {"type": "live.message", "group": name, "text": text})

        # A group_send is several Redis round trips; one after another they add up to tens of
        # milliseconds per commit. Each group still gets its messages in order: the next
        # publish starts when this one is done.
        await asyncio.gather(*(send(name) for name in names))
        return len(names)


class Fanout:
    """Publishes the newest readings of each commit, after it, in its own task: the ingest writer
    hands them over and goes on with the next commit instead of waiting on Redis. Publishes are
    at least `every_s` apart (TESSERA_TELEMETRY_LIVE_EVERY_S); readings that arrive meanwhile go
    out together, the newest per node: a browser wants the current value, and the sequence
    numbers stay consecutive whatever is merged. Why the spacing: channels-redis hands a
    process its messages one at a time, two Redis round trips each, so every message per
    second saved on a busy portal is latency saved for every browser of that process."""

    def __init__(self, publisher: Publisher | None = None, every_s: float | None = None) -> None:
        self._publisher = publisher or Publisher()
        self._every_s = conf.live_publish_every_s() if every_s is None else every_s
        self._pending: dict[int, Latest] = {}
        self._ready = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def put(self, latest_readings: list[Latest]) -> None:
        for reading in latest_readings:
            self._pending.pop(reading.node, None)  # re-inserted last: newest readings last
            self._pending[reading.node] = reading
        if latest_readings:
            self._ready.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last_start = float("-inf")
        while True:
            await self._ready.wait()
            wait = last_start + self._every_s - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            last_start = loop.time()
            self._ready.clear()
            readings, self._pending = list(self._pending.values()), {}
            try:
                await self._publisher.publish(readings)
            except Exception:
                # The live view is best effort (browsers re-fetch on a gap); storage is not.
                log.exception("publishing live readings failed")
