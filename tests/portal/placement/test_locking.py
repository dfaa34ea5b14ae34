"""The single-flight lock and the fence: one holder at a time, a lease that outlives a dead holder
only until it expires, tokens that survive a Redis restart, and a stale holder that cannot commit."""

from __future__ import annotations

import time

import pytest

from portal.placement import tasks
from portal.placement.locking import COUNTER_KEY, FencedOut, Lease, RedisLock, fence
from portal.placement.models import Fence
from portal.reservations.models import Reservation
from portal.reservations.states import State


@pytest.fixture
def redis_lock(db, lock_redis):
    made: list[RedisLock] = []

    def make(ttl_s: float = 30.0) -> RedisLock:
        made.append(RedisLock(lock_redis, ttl_s=ttl_s))
        return made[-1]

    yield make
    for lock in made:
        lock.client.close()


def test_one_holder_at_a_time_and_only_the_holder_releases(redis_lock):
    a, b = redis_lock(), redis_lock()
    first = a.acquire()
    assert first is not None and b.acquire() is None
    b.release(Lease(first.token, "someone else"))  # not the holder: changes nothing
    assert b.acquire() is None
    a.release(first)
    second = b.acquire()
    assert second is not None and second.token > first.token


def test_lease_of_a_dead_holder_expires(redis_lock):
    dead = redis_lock(ttl_s=0.3).acquire()
    assert dead is not None and redis_lock().acquire() is None
    time.sleep(0.5)
    taken = redis_lock().acquire()
    assert taken is not None and taken.token > dead.token
    assert not redis_lock().renew(dead)  # the dead holder cannot extend what is no longer its


def test_tokens_move_past_the_fence_after_redis_forgets_the_counter(redis_lock):
    lock = redis_lock()
    Fence.objects.update_or_create(pk=1, defaults={"accepted": 500})
    lock.client.delete(COUNTER_KEY)  # as after a Redis restart without persistence
    lease = lock.acquire()
    assert lease.token > 500
    fence(lease.token)  # accepted


def test_stale_holder_is_fenced_out(db):
    Fence.objects.update_or_create(pk=1, defaults={"accepted": 0})
    fence(7)
    fence(7)  # the same holder commits again
    with pytest.raises(FencedOut):
        fence(6)


def test_stale_cycle_places_nothing(client_for, reservation_body, cluster):
    rid = client_for("alice").post("/api/v1/reservations/", reservation_body(), format="json").json()["id"]
    Fence.objects.update_or_create(pk=1, defaults={"accepted": 10**9})
    from portal.placement.cycle import run_cycle

    with pytest.raises(FencedOut):
        run_cycle(Lease(1, "1"), on_bind=lambda _ids, _evicted: None)
    assert Reservation.objects.get(pk=rid).state == State.PENDING


def test_request_during_a_cycle_is_not_lost_without_redis(client_for, reservation_body, cluster, monkeypatch):
    alice = client_for("alice")
    first = alice.post("/api/v1/reservations/", reservation_body(), format="json").json()["id"]
    real_cycle, during = tasks.run_cycle, []

    def cycle_while_someone_submits(*args, **kwargs):
        report = real_cycle(*args, **kwargs)
        if not during:  # a request arrives while this cycle holds the lock
            during.append(alice.post("/api/v1/reservations/", reservation_body(), format="json").json()["id"])
            during.append(tasks.run_cycles("submitted meanwhile"))
        return report

    monkeypatch.setattr(tasks, "run_cycle", cycle_while_someone_submits)
    assert tasks.run_cycles("submitted") == 2  # the holder ran again for the request it turned away
    second, busy = during
    assert busy == 0
    assert {Reservation.objects.get(pk=i).state for i in (first, second)} == {State.PLACED}
