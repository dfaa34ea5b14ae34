"""Which groups anyone watches, and each group's sequence numbers: in this process without
Redis (the quickstart), shared by every portal process through Redis otherwise.

Every message of a group has the next number of that group's sequence. channels-redis drops
messages for a full channel, so a browser that sees a gap asks `/telemetry/live/state/` for the
current state, which carries the sequence number it is current up to (the counter is read before
the database, and bumped only after the commit, so nothing in between is lost).
"""

from __future__ import annotations

import threading
import time

from django.conf import settings

WATCH_TTL_S = 90  # a browser consumer renews its groups every 30 s
_KEY = "tessera:live:"


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
_store_url: str | None = None
_store_lock = threading.Lock()


def store() -> _MemoryStore | _RedisStore:
    """The store for the Redis that settings name now: one made for another (a process whose
    settings changed, as the test suite's do) would count watchers nobody sends to."""
    global _store, _store_url
    url = settings.REDIS_URL or None
    with _store_lock:
        if _store is None or _store_url != url:
            _store, _store_url = (_RedisStore(url) if url else _MemoryStore()), url
        return _store


def forget() -> None:
    """The next store() starts empty (tests that run in memory start with nobody watching)."""
    global _store, _store_url
    with _store_lock:
        _store = _store_url = None
