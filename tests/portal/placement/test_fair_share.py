"""Fair share in the portal, as users meet it through the API and the placement cycle: a request
beyond its team's quota is accepted and borrows or waits with its reason, only one that can never
run is refused (409), quota is charged per GPU model when placed, and a team that wants back what
it lent gets it after the borrower's warning."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from portal.audit import services as audit
from portal.reservations.models import Reservation
from portal.reservations.quota import held, usage_of
from portal.reservations.states import HOLDS_GPU, State
from portal.tenancy import policy, quotas
from scheduler.core.fairqueue import MIN_RUN_S
from tests.reservations import clock_at

URL = "/api/v1/reservations/"
T4 = {"gpu_model": "T4", "gpu_request": 1.0, "gpu_memory_mib": 15_000}
ADMIN = audit.cli("test")


def set_quotas(team, *rows):
    quotas.replace_quotas(team, ADMIN, list(rows))


def quota_row(model, share, *, memory_gib=None, gpus=None, lend=None, borrow=None):
    return {"gpu_model": model, "gpu_share": str(share), "gpu_memory_gib": str(memory_gib or 16 * share),
            "gpus": gpus if gpus is not None else int(share), "lending_limit": lend, "borrowing_limit": borrow}


NO_LENDING = {"gpu_share": "0", "gpu_memory_gib": "0", "gpus": 0}


def post_reservation(client, body) -> dict:
    r = client.post(URL, body, format="json")
    assert r.status_code == 201, r.content
    return r.json()


def get_reservation(client, rid) -> dict:
    return client.get(f"{URL}{rid}/").json()


def test_beyond_its_quota_a_request_is_accepted_and_borrows_what_others_lend(
        client_for, reservation_body, teams, placement_loop):
    alice = client_for("alice")
    ids = [post_reservation(alice, reservation_body(gpu_request=1.0, gpu_memory_mib=20_000,
                                                    gpu_model="A100-80GB"))["id"] for _ in range(3)]
    placement_loop()
    got = [get_reservation(alice, i) for i in ids]
    assert [r["state"] for r in got] == ["running"] * 3
    assert [r["admission"] for r in got] == ["guaranteed", "guaranteed", "borrowed"]
    placed = Reservation.objects.get(pk=ids[2]).transitions.get(to_state="placed")
    assert "borrowed beyond the team's quota: may be reclaimed" in placed.reason
    assert got[2]["opportunistic"] is False
    assert usage_of(teams["vision"]).gpu_share == Decimal("3.000")  # borrowed counts: it is held


def test_when_nobody_lends_it_waits_saying_whose_quota_and_where_in_the_queue(
        client_for, reservation_body, teams, placement_loop):
    set_quotas(teams["vision"], quota_row("T4", 1))
    set_quotas(teams["nlp"], quota_row("T4", 1, lend=NO_LENDING))
    alice = client_for("alice")
    first, second = (post_reservation(alice, reservation_body(**T4))["id"] for _ in range(2))
    placement_loop()
    assert get_reservation(alice, first)["admission"] == "guaranteed"
    waiting = get_reservation(alice, second)
    assert waiting["state"] == "pending"
    assert "vision holds 1.0 of its 1.0 T4 GPU share quota and this needs 1.0" in waiting["state_reason"]
    assert "others lend only 0.0 GPU share of T4 now" in waiting["state_reason"]
    assert waiting["queue_position"] == 1
    # nlp's T4 sits idle but is not lent: the GPU stays free for nlp.
    assert Reservation.objects.filter(state__in=HOLDS_GPU).count() == 1


def test_only_a_request_that_can_never_run_is_refused_and_it_says_why(client_for, reservation_body, teams, fleet):
    set_quotas(teams["nlp"], quota_row("*", 1.5, gpus=3,
                                       borrow={"gpu_share": "0.5", "gpu_memory_gib": None, "gpus": None}))
    bob = client_for("bob")
    r = bob.post(URL, reservation_body(team="nlp", gpu_request=1.0, gpu_count=3, gpu_memory_mib=1000), format="json")
    assert r.status_code == 409
    body = r.json()
    assert body["code"] == "never_fits" and body["team"] == "nlp"
    assert "can never run as asked" in body["detail"]
    assert "team nlp may hold at most 2.0 (quota 1.5 + borrowing limit 0.5)" in body["detail"]
    assert not Reservation.objects.filter(team=teams["nlp"]).exists()
    # Within the hard limit it is accepted, beyond the quota or not.
    ok = bob.post(URL, reservation_body(team="nlp", gpu_request=1.0, gpu_count=2, gpu_memory_mib=1000), format="json")
    assert ok.status_code == 201 and ok.json()["admission"] == "borrowed"


def test_quota_is_per_gpu_model(client_for, reservation_body, teams, fleet, placement_loop):
    """vision: 1 A100 of its own and nothing else. Its T4 request borrows the T4s nobody's quota
    covers; once nlp's quota covers any model and nlp lends nothing, a second one waits."""
    set_quotas(teams["vision"], quota_row("A100-80GB", 1))
    set_quotas(teams["nlp"], quota_row("A100-80GB", 1.5, gpus=2, lend=NO_LENDING))
    alice = client_for("alice")
    a100 = post_reservation(alice, reservation_body(gpu_model="A100-80GB", gpu_request=1.0, gpu_memory_mib=1000))["id"]
    t4 = post_reservation(alice, reservation_body(**T4))["id"]
    placement_loop()
    assert get_reservation(alice, a100)["admission"] == "guaranteed"
    t4_row = get_reservation(alice, t4)
    assert t4_row["state"] == "running" and t4_row["admission"] == "borrowed"
    by_model = {(model, adm): use.gpu_share for (_, model, adm), use in held(teams["vision"].pk).items()}
    assert by_model == {("A100-80GB", "guaranteed"): Decimal("1.000"), ("T4", "borrowed"): Decimal("1.000")}
    # nlp may now hold 3 GPUs of any model and lends none of them: the last T4 is kept for it.
    set_quotas(teams["nlp"], quota_row("*", 1.5, gpus=3, lend=NO_LENDING))
    second = post_reservation(alice, reservation_body(**T4))["id"]
    placement_loop()
    waiting = get_reservation(alice, second)
    assert waiting["state"] == "pending" and "others lend only" in waiting["state_reason"]


def test_a_lender_within_its_quota_reclaims_after_the_borrowers_warning(
        client_for, reservation_body, teams, placement_loop, cluster):
    """nlp borrowed both T4s from vision's idle quota. vision asks for one within its quota: the
    newest borrowed one is warned (reclaim_at, its pod gets SIGTERM with nlp's grace), and once
    its pod has gone the cycle places vision's request as guaranteed; the reclaimed one is
    requeued as its owner asked."""
    set_quotas(teams["vision"], quota_row("T4", 2))
    set_quotas(teams["nlp"], quota_row("T4", 0))
    policy.set_policy(teams["nlp"], ADMIN, {"reclaim_grace_s": 600})
    bob, alice = client_for("bob"), client_for("alice")
    borrowed = [post_reservation(bob, reservation_body(team="nlp", requeue_on_preempt=True, **T4))["id"]
                for _ in range(2)]
    placement_loop()
    assert [get_reservation(bob, b)["admission"] for b in borrowed] == ["borrowed", "borrowed"]
    mine = post_reservation(alice, reservation_body(**T4))["id"]
    before = timezone.now()
    placement_loop(sync=False)
    victim = Reservation.objects.get(pk=borrowed[1])  # the newest
    assert victim.state == State.RUNNING and victim.reclaim_at is not None
    assert timedelta(seconds=590) < victim.reclaim_at - before < timedelta(seconds=610)
    assert "to be reclaimed at" in victim.state_reason and "team vision needs the capacity it lent" in \
        victim.state_reason
    assert Reservation.objects.get(pk=borrowed[0]).reclaim_at is None
    waiting = get_reservation(alice, mine)
    assert waiting["state"] == "pending" and f"reservation {victim.pk} (team nlp)" in waiting["state_reason"]
    assert victim.pod_name not in {p.name for p in cluster.list_pods()}  # SIGTERM: the pod is on its way out
    placement_loop()  # its end comes back from the cluster: reclaimed, and the capacity goes to vision
    placement_loop()
    victim.refresh_from_db()
    assert victim.state == State.PENDING  # requeued, as its owner asked
    assert victim.transitions.filter(to_state="preempted", reason__startswith="reclaimed").exists()
    placed = get_reservation(alice, mine)
    assert placed["state"] == "running" and placed["admission"] == "guaranteed"


def test_the_cycle_reclaims_at_the_due_time_even_if_the_pod_never_ends(
        client_for, reservation_body, teams, placement_loop, cluster, monkeypatch):
    set_quotas(teams["vision"], quota_row("T4", 2))
    set_quotas(teams["nlp"], quota_row("T4", 0))
    bob, alice = client_for("bob"), client_for("alice")
    borrowed = [post_reservation(bob, reservation_body(team="nlp", **T4))["id"] for _ in range(2)]
    placement_loop()
    # A pod that ignores SIGTERM: its deletion never reaches us before the due time.
    from portal.placement import pods

    monkeypatch.setattr(pods, "delete_quietly", lambda *args, **kwargs: None)
    mine = post_reservation(alice, reservation_body(**T4))["id"]
    placement_loop()
    victim = Reservation.objects.get(pk=borrowed[1])
    assert victim.state == State.RUNNING and victim.reclaim_at is not None
    with clock_at(victim.reclaim_at + timedelta(seconds=1)):
        placement_loop()
    victim.refresh_from_db()
    assert victim.state == State.PREEMPTED
    assert get_reservation(alice, mine)["admission"] == "guaranteed"


def test_reclaim_with_no_grace_is_immediate(client_for, reservation_body, teams, placement_loop):
    set_quotas(teams["vision"], quota_row("T4", 2))
    set_quotas(teams["nlp"], quota_row("T4", 0))
    policy.set_policy(teams["nlp"], ADMIN, {"reclaim_grace_s": 0})
    bob, alice = client_for("bob"), client_for("alice")
    borrowed = [post_reservation(bob, reservation_body(team="nlp", **T4))["id"] for _ in range(2)]
    placement_loop()
    mine = post_reservation(alice, reservation_body(**T4))["id"]
    placement_loop()
    assert get_reservation(alice, mine)["admission"] == "guaranteed"
    assert Reservation.objects.get(pk=borrowed[1]).state == State.PREEMPTED
    assert Reservation.objects.get(pk=borrowed[0]).state == State.RUNNING


def test_a_team_below_its_fair_share_takes_back_borrowed_capacity_saying_why(
        client_for, reservation_body, teams, placement_loop):
    """Neither team has T4 quota: nlp borrowed both T4s; vision, below its fair share (one of
    two), takes one back as borrowed, and nlp's owner reads why."""
    set_quotas(teams["vision"], quota_row("T4", 0))
    set_quotas(teams["nlp"], quota_row("T4", 0))
    policy.set_policy(teams["nlp"], ADMIN, {"reclaim_grace_s": 0})
    bob, alice = client_for("bob"), client_for("alice")
    borrowed = [post_reservation(bob, reservation_body(team="nlp", **T4))["id"] for _ in range(2)]
    placement_loop()
    mine = post_reservation(alice, reservation_body(**T4))["id"]
    placement_loop()
    # Work that has run less than the minimum time is not taken for a borrowed request.
    assert get_reservation(alice, mine)["state"] == "pending"
    assert all(Reservation.objects.get(pk=b).state == State.RUNNING for b in borrowed)
    with clock_at(timezone.now() + timedelta(seconds=MIN_RUN_S + 60)):
        placement_loop()
    assert get_reservation(alice, mine)["admission"] == "borrowed"
    victim = Reservation.objects.get(pk=borrowed[1])
    assert victim.state == State.PREEMPTED
    assert victim.transitions.filter(
        to_state="preempted", reason__contains="taken back for team vision, which is below its fair share").exists()
    assert Reservation.objects.get(pk=borrowed[0]).state == State.RUNNING


def test_a_reclaim_by_fair_share_warns_the_borrower_saying_why(
        client_for, reservation_body, teams, placement_loop):
    """With a grace, the borrower is warned that vision, below its fair share, takes the GPU back
    (not that vision wants back quota it lent: it lent none), and vision's request says so."""
    set_quotas(teams["vision"], quota_row("T4", 0))
    set_quotas(teams["nlp"], quota_row("T4", 0))
    policy.set_policy(teams["nlp"], ADMIN, {"reclaim_grace_s": 600})
    bob, alice = client_for("bob"), client_for("alice")
    borrowed = [post_reservation(bob, reservation_body(team="nlp", **T4))["id"] for _ in range(2)]
    placement_loop()
    mine = post_reservation(alice, reservation_body(**T4))["id"]
    with clock_at(timezone.now() + timedelta(seconds=MIN_RUN_S + 60)):
        placement_loop(sync=False)
    victim = Reservation.objects.get(pk=borrowed[1])
    assert victim.state == State.RUNNING and victim.reclaim_at is not None
    assert "taken back for team vision, which is below its fair share" in victim.state_reason
    assert "needs the capacity it lent" not in victim.state_reason
    waiting = get_reservation(alice, mine)
    assert waiting["state"] == "pending" and "below its fair share: capacity others borrowed is being reclaimed " \
        f"from reservation {victim.pk} (team nlp)" in waiting["state_reason"]


def test_a_job_evicted_twice_within_the_hour_is_left_alone_and_another_is_taken(
        client_for, reservation_body, teams, placement_loop):
    """nlp's newest borrowed job would go first, but it was preempted (and requeued) twice in the
    last hour: the fair-share reclaim takes nlp's other borrowed job instead."""
    set_quotas(teams["vision"], quota_row("T4", 0))
    set_quotas(teams["nlp"], quota_row("T4", 0))
    policy.set_policy(teams["nlp"], ADMIN, {"reclaim_grace_s": 0})
    bob, alice = client_for("bob"), client_for("alice")
    borrowed = [post_reservation(bob, reservation_body(team="nlp", **T4))["id"] for _ in range(2)]
    placement_loop()
    twice = Reservation.objects.get(pk=borrowed[1])
    for minutes in (20, 10):
        row = twice.transitions.create(from_state=State.RUNNING, to_state=State.PREEMPTED, actor_label="test")
        type(row).objects.filter(pk=row.pk).update(at=timezone.now() - timedelta(minutes=minutes))
    mine = post_reservation(alice, reservation_body(**T4))["id"]
    with clock_at(timezone.now() + timedelta(seconds=MIN_RUN_S + 60)):
        placement_loop()
    assert get_reservation(alice, mine)["admission"] == "borrowed"
    assert Reservation.objects.get(pk=borrowed[1]).state == State.RUNNING
    assert Reservation.objects.get(pk=borrowed[0]).state == State.PREEMPTED
