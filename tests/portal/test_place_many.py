"""`services.place_many`: many decisions in one commit, each unit whole or not at all, and the
set-based writers of `portal.bulk` it uses (PostgreSQL here; SQLite in a subprocess below)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, transaction

from portal.bulk import insert_rows, update_rows
from portal.fleet.models import Gpu, NodeStatus
from portal.reservations import rules, services
from portal.reservations.models import Allocation, Reservation, StateTransition
from portal.reservations.states import IllegalTransition, State
from tests.teams import set_any_quota


def _pending(people, teams, share="0.5", memory=1000, count=1) -> Reservation:
    return services.submit(people["alice"], rules.ReservationSpec(
        team=teams["vision"], image="busybox:1.36", gpu_request=Decimal(share), gpu_memory_mib=memory,
        gpu_count=count))


def _gpu(node: str, index: int) -> Gpu:
    return Gpu.objects.select_related("node").get(node__name=node, index=index)


def _decision(r: Reservation, *gpus: Gpu, share: str = "0.5", memory: int = 1000) -> services.Placing:
    return services.Placing(r.pk, gpus[0].node_id,
                            tuple(services.NewAllocation(g.pk, Decimal(share), memory) for g in gpus),
                            f"placed on {gpus[0].node.name}")


def test_places_many_and_writes_everything(fleet, people, teams):
    rs = [_pending(people, teams) for _ in range(4)]
    g0, g1 = _gpu("t4-node-1", 0), _gpu("t4-node-1", 1)
    placed, refused = services.place_many(
        [[_decision(rs[0], g0)], [_decision(rs[1], g0)], [_decision(rs[2], g1)], [_decision(rs[3], g1)]], "tester")
    assert refused == {} and [r.pk for r in placed] == [r.pk for r in rs]
    for r in rs:
        r.refresh_from_db()
        assert r.state == State.PLACED and r.node_id == g0.node_id and r.placed_at is not None
        assert r.state_reason == "placed on t4-node-1"
        last = StateTransition.objects.filter(reservation=r).latest("id")
        assert (last.from_state, last.to_state, last.actor_label) == (State.PENDING, State.PLACED, "tester")
    live = Allocation.objects.filter(released_at__isnull=True)
    assert sorted(live.values_list("gpu_id", "gpu_request", "gpu_limit", "gpu_memory_mib")) == [
        (g0.pk, Decimal("0.500"), Decimal("0.500"), 1000)] * 2 + [(g1.pk, Decimal("0.500"), Decimal("0.500"), 1000)] * 2
    assert live.filter(created_at__isnull=True).count() == 0


def test_the_number_of_queries_does_not_grow_with_the_batch(fleet, people, teams):
    """One decision or thirty: the same statements (the bulk writes included, which go through
    their own server-side bound cursor and must still be seen by Django's query log)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    gpus = list(Gpu.objects.select_related("node").order_by("pk"))
    counts = {}
    set_any_quota(teams["vision"], share=10, gpus=100)
    for n in (1, 30):
        rs = [_pending(people, teams, share="0.1", memory=100) for _ in range(n)]
        units = [[_decision(r, gpus[i % len(gpus)], share="0.1", memory=100)] for i, r in enumerate(rs)]
        with CaptureQueriesContext(connection) as queries:
            placed, refused = services.place_many(units, "tester")
        assert refused == {} and len(placed) == n
        counts[n] = len(queries)
        assert any("unnest" in q["sql"] for q in queries.captured_queries)  # the bulk writes are logged
    assert counts[1] == counts[30]


def test_a_decision_that_no_longer_fits_is_refused_alone(fleet, people, teams):
    a, b, c = (_pending(people, teams, share="0.5") for _ in range(3))
    g0 = _gpu("t4-node-1", 0)
    placed, refused = services.place_many([[_decision(a, g0)], [_decision(b, g0)], [_decision(c, g0)]])
    assert [r.pk for r in placed] == [a.pk, b.pk]
    assert isinstance(refused[c.pk], services.CapacityConflict) and "no longer has room" in str(refused[c.pk])
    c.refresh_from_db()
    assert c.state == State.PENDING and c.node_id is None
    assert not Allocation.objects.filter(reservation=c).exists()
    assert Allocation.objects.filter(gpu=g0, released_at__isnull=True).count() == 2


def test_memory_counts_too(fleet, people, teams):
    g0 = _gpu("t4-node-1", 0)
    a, b = _pending(people, teams, share="0.25", memory=g0.memory_mib - 100), _pending(people, teams, share="0.25")
    placed, refused = services.place_many([[_decision(a, g0, share="0.25", memory=g0.memory_mib - 100)],
                                           [_decision(b, g0, share="0.25", memory=200)]])
    assert [r.pk for r in placed] == [a.pk] and set(refused) == {b.pk}


def test_a_gang_is_placed_whole_or_not_at_all(fleet, people, teams):
    g0, g1 = _gpu("t4-node-1", 0), _gpu("t4-node-1", 1)
    filler = _pending(people, teams, share="0.75")
    services.place(filler.pk, g1.node_id, [services.NewAllocation(g1.pk, Decimal("0.75"), 1000)])
    x, y = _pending(people, teams), _pending(people, teams)
    placed, refused = services.place_many([[_decision(x, g0), _decision(y, g1)]])
    assert placed == [] and set(refused) == {x.pk, y.pk}
    assert not Allocation.objects.filter(reservation__in=[x, y]).exists()
    assert set(Reservation.objects.filter(pk__in=[x.pk, y.pk]).values_list("state", flat=True)) == {State.PENDING}


def test_not_pending_not_ready_and_wrong_node_are_refused(fleet, people, teams):
    g0 = _gpu("t4-node-1", 0)
    other = Gpu.objects.exclude(node=g0.node).first()
    cancelled, drained, misplaced, fine = (_pending(people, teams) for _ in range(4))
    services.cancel(cancelled.pk, people["alice"])
    drained_gpu = Gpu.objects.exclude(node__in=[g0.node, other.node]).first()
    drained_gpu.node.status = NodeStatus.DRAINING
    drained_gpu.node.save()
    wrong = services.Placing(misplaced.pk, g0.node_id, (services.NewAllocation(other.pk, Decimal("0.5"), 100),))
    placed, refused = services.place_many(
        [[_decision(cancelled, g0)], [_decision(drained, drained_gpu)], [wrong], [_decision(fine, g0)]])
    assert [r.pk for r in placed] == [fine.pk]
    assert isinstance(refused[cancelled.pk], IllegalTransition)
    assert "draining" in str(refused[drained.pk])
    assert f"GPU {other.pk} is not on node" in str(refused[misplaced.pk])


def test_the_same_reservation_twice_in_one_commit_is_placed_once(fleet, people, teams):
    r = _pending(people, teams, share="0.25")
    g0, g1 = _gpu("t4-node-1", 0), _gpu("t4-node-1", 1)
    placed, refused = services.place_many([[_decision(r, g0, share="0.25")], [_decision(r, g1, share="0.25")]])
    assert [p.pk for p in placed] == [r.pk] and isinstance(refused[r.pk], IllegalTransition)
    assert Allocation.objects.filter(reservation=r).count() == 1


def test_placing_counts_the_attempt_names_the_pod_and_sets_the_end(fleet, people, teams, settings):
    settings.TESSERA_NAMESPACE = "gpu-pods"
    teams["vision"].interactive_max_s = 7200
    teams["vision"].save()
    timed = services.submit(people["alice"], rules.ReservationSpec(
        team=teams["vision"], image="busybox:1.36", gpu_request=Decimal("0.25"), gpu_memory_mib=100,
        max_duration_s=600))
    notebook = services.submit(people["alice"], rules.ReservationSpec(
        team=teams["vision"], image="busybox:1.36", gpu_request=Decimal("0.25"), gpu_memory_mib=100,
        kind="interactive"))
    batch = _pending(people, teams, share="0.25")
    g0 = _gpu("t4-node-1", 0)
    services.place_many([[_decision(r, g0, share="0.25")] for r in (timed, notebook, batch)])
    rows = {r.pk: r for r in Reservation.objects.filter(pk__in=[timed.pk, notebook.pk, batch.pk])}
    for r in rows.values():
        assert (r.attempt, r.pod_namespace, r.pod_name) == (1, "gpu-pods", f"tessera-r{r.pk}-1")
    # Its own duration; the team's limit for a notebook without one; a batch job runs until done.
    assert rows[timed.pk].expires_at - rows[timed.pk].placed_at == timedelta(seconds=600)
    assert rows[notebook.pk].expires_at - rows[notebook.pk].placed_at == timedelta(seconds=7200)
    assert rows[batch.pk].expires_at is None


def test_place_raises_what_place_many_refused(fleet, people, teams):
    g0 = _gpu("t4-node-1", 0)
    big = _pending(people, teams, share="1.0")
    services.place(big.pk, g0.node_id, [services.NewAllocation(g0.pk, Decimal("1.0"), 100)])
    with pytest.raises(services.CapacityConflict):
        services.place(_pending(people, teams).pk, g0.node_id, [services.NewAllocation(g0.pk, Decimal("0.5"), 100)])
    with pytest.raises(Reservation.DoesNotExist):
        services.place(10**9, g0.node_id, [services.NewAllocation(g0.pk, Decimal("0.5"), 100)])


def test_update_and_insert_rows_round_trip_values(fleet, people, teams):
    rs = [_pending(people, teams) for _ in range(3)]
    rs[0].state_reason, rs[1].state_reason, rs[2].state_reason = "a", "b ' quote", "c ☃"
    rs[0].queue_position, rs[1].queue_position, rs[2].queue_position = 3, None, 1
    from django.utils import timezone
    now = timezone.now()
    assert update_rows(rs, ["state_reason", "queue_position"], {"estimated_start": now, "pod_name": ""}) == 3
    got = {r.pk: r for r in Reservation.objects.filter(pk__in=[r.pk for r in rs])}
    assert [(got[r.pk].state_reason, got[r.pk].queue_position, got[r.pk].estimated_start) for r in rs] == [
        ("a", 3, now), ("b ' quote", None, now), ("c ☃", 1, now)]
    assert update_rows([], ["state_reason"]) == 0
    # Compare-and-set: a row whose pod_name moved on (requeued meanwhile) keeps its uid.
    assert update_rows([Reservation(pk=rs[1].pk, pod_name="tessera-r-2")], ["pod_name"]) == 1
    for r in rs:
        r.pod_uid = f"uid-{r.pk}"
    assert update_rows(rs, ["pod_uid"], match=["pod_name"]) == 2
    assert dict(Reservation.objects.filter(pk__in=[r.pk for r in rs]).values_list("pk", "pod_uid")) == {
        rs[0].pk: f"uid-{rs[0].pk}", rs[1].pk: "", rs[2].pk: f"uid-{rs[2].pk}"}
    g0 = _gpu("t4-node-1", 0)
    assert insert_rows(Allocation, ["reservation", "gpu", "gpu_request", "gpu_limit", "gpu_memory_mib"],
                       [(rs[0].pk, g0.pk, Decimal("0.125"), Decimal("0.5"), 7)],
                       same={"created_at": now, "released_at": None}) == 1
    assert Allocation.objects.get(reservation=rs[0]).gpu_request == Decimal("0.125")
    # A constraint broken by a bulk write is Django's IntegrityError, and only its savepoint is lost.
    with pytest.raises(IntegrityError), transaction.atomic():
        insert_rows(Allocation, ["reservation", "gpu", "gpu_request", "gpu_limit", "gpu_memory_mib"],
                    [(rs[0].pk, g0.pk, Decimal("0.125"), Decimal("0.5"), 7)],
                    same={"created_at": now, "released_at": None})
    assert Allocation.objects.filter(reservation=rs[0]).count() == 1


def test_the_same_on_sqlite(on_sqlite):
    """The quickstart runs on SQLite: the same writes through its VALUES form."""
    lines = on_sqlite("""
        from decimal import Decimal
        from django.contrib.auth import get_user_model
        from django.db import transaction
        from portal.fleet import inventory
        from portal.fleet.models import Gpu
        from portal.reservations import rules, services
        from portal.reservations.models import Allocation, Reservation, StateTransition
        from portal.tenancy.models import Membership, Team
        from tests.teams import make_team
        inventory.load(os.environ["INVENTORY"])
        team = make_team("t", "T", quota_gpu_share=Decimal(10), quota_memory_mib=10**7,
                                   quota_max_gpus=10)
        user = get_user_model().objects.create_user("u")
        Membership.objects.create(user=user, team=team)
        g = Gpu.objects.order_by("pk").first()
        # One transaction: the placement cycle that submit() asks for runs in process here, after
        # the commit, when what is printed has been read.
        with transaction.atomic():
            rs = [services.submit(user, rules.ReservationSpec(team=team, image="busybox:1.36",
                                                              gpu_request=Decimal("0.5"), gpu_memory_mib=100))
                  for _ in range(3)]
            units = [[services.Placing(r.pk, g.node_id, (services.NewAllocation(g.pk, Decimal("0.5"), 100),),
                                       f"on {r.pk}")] for r in rs]
            placed, refused = services.place_many(units, "sqlite-test")
            print(len(placed), sorted(refused) == [rs[2].pk])
            print(Allocation.objects.filter(gpu=g, released_at__isnull=True).count(),
                  StateTransition.objects.filter(to_state="placed").count(),
                  sorted(Reservation.objects.filter(pk__in=[p.pk for p in placed]).values_list("state_reason",
                                                                                              flat=True)))
    """)
    placed_line, counts_line = lines[-2:]
    assert placed_line == "2 True"
    assert counts_line.startswith("2 2 ")
    assert "'on " in counts_line
