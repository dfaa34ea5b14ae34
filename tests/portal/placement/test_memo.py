"""Cycles skip reservations that could not be placed while nothing has freed capacity since, and
look at them again as soon as something does."""

from __future__ import annotations

import time

import pytest

from portal.placement import cycle as cycle_module
from portal.placement import memo
from portal.reservations.models import Reservation
from portal.reservations.states import State


@pytest.fixture
def redis_memo(settings, cluster, lock_redis):
    settings.TESSERA_LOCK_REDIS_URL = lock_redis


def test_unplaceable_request_is_skipped_until_capacity_is_freed(client_for, reservation_body, redis_memo,
                                                               placement_loop, monkeypatch,
                                                               django_capture_on_commit_callbacks):
    looked_at: list[set[str]] = []
    real = cycle_module.core.schedule

    def recording(snapshot, pending, policy):
        looked_at.append({r.id for r in pending})
        return real(snapshot, pending, policy)

    monkeypatch.setattr(cycle_module.core, "schedule", recording)
    whole_t4 = dict(gpu_request=1.0, gpu_memory_mib=15_000, gpu_model="T4")
    alice = client_for("alice")
    first, second = (alice.post("/api/v1/reservations/", reservation_body(**whole_t4), format="json").json()["id"]
                     for _ in range(2))
    placement_loop()
    late = client_for("bob").post("/api/v1/reservations/", reservation_body(team="nlp", **whole_t4),
                                  format="json").json()["id"]
    placement_loop()
    assert Reservation.objects.get(pk=late).state == State.PENDING
    assert str(late) in memo.load()[1]
    looked_at.clear()
    placement_loop()
    assert all(str(late) not in ids for ids in looked_at)  # nothing changed: not looked at again
    with django_capture_on_commit_callbacks(execute=True):
        alice.post(f"/api/v1/reservations/{first}/cancel/", {}, format="json")
    placement_loop()
    assert Reservation.objects.get(pk=late).state == State.RUNNING
    assert Reservation.objects.get(pk=second).state == State.RUNNING


def test_a_request_waiting_for_quota_is_looked_at_again_when_quotas_change(
        client_for, reservation_body, teams, redis_memo, placement_loop, django_capture_on_commit_callbacks):
    from portal.audit import services as audit
    from portal.tenancy import quotas

    no_lending = {"gpu_share": "0", "gpu_memory_gib": "0", "gpus": 0}
    for team in ("vision", "nlp"):
        quotas.replace_quotas(teams[team], audit.cli("test"), [
            {"gpu_model": "T4", "gpu_share": "1", "gpu_memory_gib": "16", "gpus": 1, "lending_limit": no_lending}])
    whole_t4 = dict(gpu_request=1.0, gpu_memory_mib=15_000, gpu_model="T4")
    alice = client_for("alice")
    ids = [alice.post("/api/v1/reservations/", reservation_body(**whole_t4), format="json").json()["id"]
           for _ in range(2)]
    placement_loop()
    assert Reservation.objects.get(pk=ids[1]).state == State.PENDING
    assert str(ids[1]) in memo.load()[1]
    with django_capture_on_commit_callbacks(execute=True):  # nlp lends its idle T4 now
        quotas.replace_quotas(teams["nlp"], audit.cli("test"), [
            {"gpu_model": "T4", "gpu_share": "1", "gpu_memory_gib": "16", "gpus": 1}])
    assert str(ids[1]) not in memo.load()[1]
    placement_loop()
    second = Reservation.objects.get(pk=ids[1])
    assert second.state == State.RUNNING and second.admission == "borrowed"


def _remembered() -> set[str]:
    epoch, _, _ = memo.load()
    memo.save(epoch, {"42"}, time.time())
    return memo.load()[1]


def test_writes_through_updates_not_saves_clear_the_memo_too(redis_memo, teams, people,
                                                             django_capture_on_commit_callbacks):
    """The fleet's services write a node's resources and a GPU's health with `.update()` (no
    post_save): their notice after commit still makes the next cycle look at everything."""
    from portal.audit import services as audit
    from portal.fleet import services as fleet_services
    from portal.fleet.models import Node
    from portal.tenancy import policy

    node = Node.objects.order_by("pk").first()
    changes = [
        lambda: fleet_services.record_resources(node.pk, (node.cpu_milli or 0) + 1000, (node.memory_mib or 0) + 1024),
        lambda: policy.set_policy(teams["vision"], audit.cli("test"), {"allow_remote": True}),
    ]
    for change in changes:
        assert _remembered() == {"42"}
        with django_capture_on_commit_callbacks(execute=True):
            change()
        assert memo.load()[1] == set()


def test_a_submission_or_a_placement_frees_nothing(redis_memo, client_for, reservation_body, placement_loop,
                                                   django_capture_on_commit_callbacks):
    """Taking capacity (a new request, its placement written in bulk, its pod running) cannot make
    a waiting one fit: the capacity epoch stays, so the memo a cycle writes stays valid."""
    epoch = memo.load()[0]
    with django_capture_on_commit_callbacks(execute=True):
        client_for("alice").post("/api/v1/reservations/", reservation_body(gpu_request=0.25), format="json")
    placement_loop()
    assert Reservation.objects.get().state == State.RUNNING
    assert memo.load()[0] == epoch
