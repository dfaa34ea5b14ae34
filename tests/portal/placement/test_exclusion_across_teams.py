"""Exclusion groups belong to their team: two teams' groups of the same name never share a GPU,
and a cordoned GPU takes no new share."""

from portal.fleet.models import Gpu
from portal.reservations.models import Reservation
from portal.tenancy.models import ExclusionGroup


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
