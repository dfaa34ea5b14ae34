"""One placement cycle at a time per cluster, however many workers run; and the seam between the
two ways tasks run: with Redis (REDIS_URL: workers apart) or in-process (the quickstart).
`cluster_lock()` gives a RedisLock or a ProcessLock, and both answer every question the rest
asks (the lease, claims that dedupe queued tasks, single-flight sections, the store the memo
shares between processes), so nothing else asks which one it is.

With Redis: a lease key set with NX and an expiry holds a fencing token (INCR of a counter); the
holder renews it between decisions and deletes it only if it still holds it. If a holder dies
the lease expires and the next cycle takes over. In-process a process-wide lock stands in, and
tokens come from the database.

Whoever asks for a cycle first marks the cluster "dirty", then enqueues a cycle task unless one is
already queued and not yet started (`claim_queued`); the task clears that mark when it starts and
tries the lock; the holder runs cycles until nobody has marked it dirty since, and looks once more
after releasing. So a request that arrives while a cycle runs is never lost, and a burst of 500
submissions costs a handful of tasks and cycles, not 500.

Fencing: each decision commits only if `fence(token)` accepts the token (database row, see
models.Fence), so a holder whose lease expired can never commit after a newer one.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.conf import settings
from django.db.models import F

from portal.precompiled import Precompiled

from .models import Fence

LEASE_KEY = "tessera:placement:lease"
COUNTER_KEY = "tessera:placement:fence"
DIRTY_KEY = "tessera:placement:dirty"
QUEUED_KEY = "tessera:placement:queued"
QUEUED_TTL_S = 30  # a queued cycle task lost with its broker is forgotten after this (beat covers it)

_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
_RENEW = ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) "
          "else return 0 end")


class FencedOut(Exception):
    """A newer lock holder has committed: this cycle must stop writing."""


@dataclass(frozen=True)
class Lease:
    token: int
    value: str  # what the lease key holds: token and a random tag


def fence(token: int) -> None:
    """Inside a decision's transaction: accept `token` (raising the fence) or raise FencedOut.
    The conditional UPDATE holds the fence row's lock until the transaction ends."""
    if not Fence.objects.filter(pk=1, accepted__lte=token).update(accepted=token):
        if not Fence.objects.filter(pk=1).exists():
            Fence.objects.get_or_create(pk=1)
            return fence(token)
        raise FencedOut(f"fencing token {token} is older than the last committed one")


def _db_token() -> int:
    Fence.objects.get_or_create(pk=1)
    Fence.objects.filter(pk=1).update(issued=F("issued") + 1)
    return Fence.objects.values_list("issued", flat=True).get(pk=1)


# Read by every lease taken: compiled once (portal.precompiled).
_ACCEPTED = Precompiled(lambda: Fence.objects.filter(pk=1).order_by().values_list("accepted", flat=True))


def _accepted() -> int:
    return next(iter(_ACCEPTED.all()), 0) or 0


class RedisLock:
    # Short, because a holder that dies stalls placement this long; safe, because the fence stops a
    # holder whose lease lapsed (say, in a long engine run) from writing after its successor.
    def __init__(self, url: str, ttl_s: float = 10.0):
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self.ttl_ms = int(ttl_s * 1000)
        self._release = self.client.register_script(_RELEASE)
        self._renew = self.client.register_script(_RENEW)

    def acquire(self) -> Lease | None:
        token = int(self.client.incr(COUNTER_KEY))
        value = f"{token}:{uuid.uuid4().hex}"
        if not self.client.set(LEASE_KEY, value, nx=True, px=self.ttl_ms):
            return None
        floor = _accepted()
        if token <= floor:  # the counter was lost (Redis restarted): move past the fence
            token = int(self.client.incrby(COUNTER_KEY, floor - token + 1))
            value = f"{token}:{uuid.uuid4().hex}"
            self.client.set(LEASE_KEY, value, px=self.ttl_ms)
        return Lease(token, value)

    def renew(self, lease: Lease) -> bool:
        return bool(self._renew(keys=[LEASE_KEY], args=[lease.value, self.ttl_ms]))

    def release(self, lease: Lease) -> None:
        self._release(keys=[LEASE_KEY], args=[lease.value])

    def mark_dirty(self) -> None:
        self.client.set(DIRTY_KEY, "1", ex=3600)

    def take_dirty(self) -> bool:
        return self.client.getdel(DIRTY_KEY) is not None

    def claim_queued(self) -> bool:
        return bool(self.client.set(QUEUED_KEY, "1", nx=True, ex=QUEUED_TTL_S))

    def clear_queued(self) -> None:
        self.client.delete(QUEUED_KEY)

    # Workers apart: a holder runs one cycle, then queues the next behind the binds it sent.
    one_cycle_per_task = True

    @property
    def shared(self):
        """A store every process sees (the memo's): this Redis."""
        return self.client

    def claim(self, key: str, ttl_s: int) -> bool:
        """Whether this caller is the first to claim `key` in the last `ttl_s` (e.g. to queue a task once)."""
        return bool(self.client.set(key, "1", nx=True, ex=ttl_s))

    def unclaim(self, key: str) -> None:
        self.client.delete(key)

    @contextmanager
    def single_flight(self, name: str, ttl_s: float) -> Iterator[bool]:
        key, value = f"tessera:single-flight:{name}", uuid.uuid4().hex
        held = bool(self.client.set(key, value, nx=True, px=int(ttl_s * 1000)))
        try:
            yield held
        finally:
            if held:
                self._release(keys=[key], args=[value])

    def close(self) -> None:
        self.client.close()


class ProcessLock:
    """Stand-in without Redis: one cycle at a time in this process; tokens from the database."""

    _mutex = threading.Lock()
    _dirty = threading.Event()
    _mutexes: dict[str, threading.Lock] = {}  # single-flight sections by name

    def acquire(self) -> Lease | None:
        if not self._mutex.acquire(blocking=False):
            return None
        try:
            token = _db_token()
        except BaseException:
            self._mutex.release()
            raise
        return Lease(token, str(token))

    def renew(self, lease: Lease) -> bool:
        return True

    def release(self, lease: Lease) -> None:
        self._mutex.release()

    def mark_dirty(self) -> None:
        self._dirty.set()

    def take_dirty(self) -> bool:
        was = self._dirty.is_set()
        self._dirty.clear()
        return was

    def claim_queued(self) -> bool:
        return True  # in-process: the request runs the cycle itself

    def clear_queued(self) -> None:
        pass

    one_cycle_per_task = False  # in-process: the holder loops while more is asked
    shared = None  # no store other processes see: the memo is off

    def claim(self, key: str, ttl_s: int) -> bool:
        return True  # in-process: each request runs its task itself

    def unclaim(self, key: str) -> None:
        pass

    @contextmanager
    def single_flight(self, name: str, ttl_s: float) -> Iterator[bool]:
        mutex = self._mutexes.setdefault(name, threading.Lock())
        held = mutex.acquire(blocking=False)
        try:
            yield held
        finally:
            if held:
                mutex.release()

    def close(self) -> None:
        self._dirty.clear()


_locks: dict[str, RedisLock | ProcessLock] = {}


def forget_locks() -> None:
    """Close and drop the cached locks, and forget an in-process request for a cycle (tests that
    switch Redis databases or start from a clean slate)."""
    for lock in _locks.values():
        lock.close()
    _locks.clear()
    ProcessLock().close()


def cluster_lock() -> RedisLock | ProcessLock:
    url = getattr(settings, "TESSERA_LOCK_REDIS_URL", None) or settings.REDIS_URL
    if url not in _locks:
        _locks[url] = RedisLock(url) if url else ProcessLock()
    return _locks[url]


def single_flight(name: str, ttl_s: float):
    """At most one holder of `name` at a time, across workers with Redis (a key that expires after
    `ttl_s`, so a holder that died frees it), in this process without. Yields whether this caller
    holds it; one that does not should skip its work: the holder is doing it."""
    return cluster_lock().single_flight(name, ttl_s)
