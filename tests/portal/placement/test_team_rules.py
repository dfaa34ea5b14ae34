"""Team rules in placement: exclusion groups belong to their team (two teams' groups of the same
name never share a GPU), a cordoned GPU takes no new share, and idle reservations are warned before
they are reclaimed."""

from portal.fleet.models import Gpu
from portal.reservations.models import Reservation
from portal.tenancy.models import ExclusionGroup
from tests.reservations import clock_at


def test_same_group_name_in_two_teams_does_not_share_a_gpu(client_for, reservation_body, teams, cluster,
                                                          placement_loop):
    ExclusionGroup.objects.create(team=teams["nlp"], label="secure")
    Gpu.objects.filter(node__name="t4-node-1", index=1).update(cordoned=True)  # one T4 left
    body = {"gpu_model": "T4", "gpu_request": 0.25, "gpu_memory_mib": 2048, "exclusion": "secure"}
    ours = client_for("alice").post("/api/v1/reservations/", reservation_body(**body), format="json").json()["id"]
    placement_loop()
    theirs = client_for("bob").post("/api/v1/reservations/", reservation_body(team="nlp", **body),
                                    format="json").json()["id"]
    placement_loop()
    assert Reservation.objects.get(pk=ours).state == "running"
    waiting = Reservation.objects.get(pk=theirs)
    assert waiting.state == "pending" and "exclusion" in waiting.state_reason
    # A request of vision's own group joins its GPU.
    again = client_for("alice").post("/api/v1/reservations/", reservation_body(**body), format="json").json()["id"]
    placement_loop()
    assert Reservation.objects.get(pk=again).node.name == "t4-node-1"


def test_idle_reservation_is_warned_before_it_is_reclaimed(client_for, reservation_body, cluster, placement_loop,
                                                           teams):
    from datetime import timedelta
    from decimal import Decimal

    from django.utils import timezone

    from portal.placement.idle import check_idle
    from portal.reservations import services
    from portal.reservations.states import State

    team = teams["vision"]
    team.idle_threshold, team.idle_after_s, team.idle_reclaim = Decimal("0.05"), 600, True
    team.save()
    rid = client_for("alice").post("/api/v1/reservations/", reservation_body(gpu_request=0.25, gpu_memory_mib=2048),
                                   format="json").json()["id"]
    placement_loop()

    def measure(ids, since):
        return dict.fromkeys(ids, 0.01)

    hour_later = timezone.now() + timedelta(hours=1)  # running an hour, idle all along
    with clock_at(hour_later):
        assert check_idle(cluster, measure) == (1, 0)  # warned: flagged idle, still running
    r = Reservation.objects.get(pk=rid)
    assert r.state == State.RUNNING and r.idle_since is not None
    with clock_at(hour_later + timedelta(minutes=1)):
        assert check_idle(cluster, measure) == (0, 0)  # still idle at the next check: within the warning period
    assert services.idle_reclaim_at(r.idle_since, team) == r.idle_since + timedelta(seconds=team.idle_warning_s)
    with clock_at(r.idle_since + timedelta(seconds=team.idle_warning_s)):
        assert check_idle(cluster, measure) == (0, 1)  # still idle when the warning period is over: reclaimed
    assert Reservation.objects.get(pk=rid).state == State.EXPIRED
