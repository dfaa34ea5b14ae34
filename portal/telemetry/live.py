"""Live fan-out to browsers: group names, who may join which group, which groups anyone watches,
and per-group sequence numbers.

Groups: `gpu:<id>` (the GPU's own numbers: staff only, since a card's load includes other teams'
work; the same rule as the utilization reports), `team:<id>` (the shares of a team's reservations:
its members, in any role, and staff) and `reservation:<id>` (as its team). GPU messages carry no
share; team and reservation messages carry only that team's shares.

Every message of a group has the next number of that group's sequence. channels-redis drops
messages for a full channel, so a browser that sees a gap asks `/telemetry/live/state/` for
the current state, which carries the sequence number it is current up to (the counter is read
before the database, and bumped only after the commit, so nothing in between is lost).

Only watched groups are published to: at 4,000 GPUs, sending every reading to a group nobody
listens to would cost the portal more than storing it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from dataclasses import dataclass

from django.conf import settings

from portal.fleet.models import Gpu
from portal.reservations.models import Reservation
from portal.tenancy import roles

from . import conf

GROUP_PATTERN = re.compile(r"^(gpu|team|reservation):([1-9][0-9]{0,17})$")
WATCH_TTL_S = 90  # a browser consumer renews its groups every 30 s
WATCH_CACHE_S = 1.0  # publishers re-read the watched set at most this often
_KEY = "tessera:live:"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Group:
    kind: str
    id: int

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.id}"

    @property
    def channel_group(self) -> str:
        # Channels group names allow only ASCII letters, digits, hyphens, underscores and periods.
        return f"live.{self.kind}.{self.id}"


def parse_group(name: object) -> Group | None:
    if not isinstance(name, str):
        return None
    m = GROUP_PATTERN.match(name)
    return Group(m.group(1), int(m.group(2))) if m else None


def may_see(user, group: Group) -> bool:
    """Whether `user` may receive `group`'s messages (re-checked while subscribed)."""
    if not user.is_authenticated or not user.is_active:
        return False
    if group.kind == "gpu":
        return user.is_staff and Gpu.objects.filter(pk=group.id).exists()
    if user.is_staff:
        if group.kind == "team":
            return True
        return Reservation.objects.filter(pk=group.id).exists()
    teams = roles.team_roles(user)
    if group.kind == "team":
        return group.id in teams
    team_id = Reservation.objects.filter(pk=group.id).values_list("team_id", flat=True).first()
    return team_id is not None and team_id in teams


def messages_for(latest_readings: list[dict], watched: set[str] | None = None) -> dict[str, dict]:
    """group name → message data for the newest readings of one commit (see
    ingest._latest_reading): one message per group, however many nodes reported in it. With
    `watched`, only those groups (the rest would be built to be thrown away)."""
    out: dict[str, dict] = {}
    for latest in latest_readings:
        for reading in latest["gpus"]:
            name = f"gpu:{reading['gpu']}"
            if watched is None or name in watched:
                out[name] = {"type": "gpu", "data": {**reading, "ts_ms": latest["ts_ms"]}}
        for share in latest["shares"]:
            for name in (f"team:{share['team']}", f"reservation:{share['reservation']}"):
                if watched is not None and name not in watched:
                    continue
                message = out.setdefault(name, {"type": "shares", "data": {"ts_ms": 0, "shares": []}})
                message["data"]["shares"].append(share)
                message["data"]["ts_ms"] = max(message["data"]["ts_ms"], latest["ts_ms"])
    return out


class _MemoryStore:
    """Watched groups and sequence numbers for one process (no Redis: the quickstart)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watch: dict[str, float] = {}
        self._seq: dict[str, int] = {}

    async def watch(self, names: list[str]) -> None:
        self.watch_sync(names)

    def watch_sync(self, names: list[str]) -> None:
        with self._lock:
            for n in names:
                self._watch[n] = time.time() + WATCH_TTL_S

    async def watched(self) -> set[str]:
        now = time.time()
        with self._lock:
            return {n for n, until in self._watch.items() if until > now}

    async def next_seqs(self, names: list[str]) -> dict[str, int]:
        with self._lock:
            for n in names:
                self._seq[n] = self._seq.get(n, 0) + 1
            return {n: self._seq[n] for n in names}

    def current_seqs(self, names: list[str]) -> dict[str, int]:
        with self._lock:
            return {n: self._seq.get(n, 0) for n in names}


class _RedisStore:
    """The same, shared by every portal process through Redis."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._clients: dict[int, object] = {}
        self._sync = None

    def _client(self):
        import asyncio

        import redis.asyncio as aioredis

        loop = asyncio.get_running_loop()
        client = self._clients.get(id(loop))
        if client is None:
            client = self._clients[id(loop)] = aioredis.Redis.from_url(self._url)
        return client

    def _sync_client(self):
        import redis

        if self._sync is None:
            self._sync = redis.Redis.from_url(self._url)
        return self._sync

    async def watch(self, names: list[str]) -> None:
        if names:
            await self._client().zadd(_KEY + "watched", {n: time.time() + WATCH_TTL_S for n in names})

    def watch_sync(self, names: list[str]) -> None:
        if names:
            self._sync_client().zadd(_KEY + "watched", {n: time.time() + WATCH_TTL_S for n in names})

    async def watched(self) -> set[str]:
        client = self._client()
        now = time.time()
        pipe = client.pipeline()
        pipe.zremrangebyscore(_KEY + "watched", "-inf", now)
        pipe.zrange(_KEY + "watched", 0, -1)
        _, names = await pipe.execute()
        return {n.decode() for n in names}

    async def next_seqs(self, names: list[str]) -> dict[str, int]:
        pipe = self._client().pipeline(transaction=False)
        for n in names:
            pipe.incr(_KEY + "seq:" + n)
        return dict(zip(names, await pipe.execute(), strict=True))

    def current_seqs(self, names: list[str]) -> dict[str, int]:
        values = self._sync_client().mget([_KEY + "seq:" + n for n in names]) if names else []
        return {n: int(v or 0) for n, v in zip(names, values, strict=True)}


_store: _MemoryStore | _RedisStore | None = None
_store_lock = threading.Lock()


def store() -> _MemoryStore | _RedisStore:
    global _store
    with _store_lock:
        if _store is None:
            _store = _RedisStore(settings.REDIS_URL) if settings.REDIS_URL else _MemoryStore()
        return _store


class Publisher:
    """Sends a batch of newest readings to the groups somebody watches (one per event loop)."""

    def __init__(self) -> None:
        self._watched: set[str] = set()
        self._read_at = 0.0

    async def publish(self, latest_readings: list[dict]) -> int:
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
        self._pending: dict[int, dict] = {}
        self._ready = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def put(self, latest_readings: list[dict]) -> None:
        for reading in latest_readings:
            self._pending.pop(reading["node"], None)  # re-inserted last: newest readings last
            self._pending[reading["node"]] = reading
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
