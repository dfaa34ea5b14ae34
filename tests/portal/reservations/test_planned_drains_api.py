"""Planned drains through the API: site admins plan and cancel, others read; refusals by field,
409 naming the bookings a drain would break, and bookings refused over a drain."""

from __future__ import annotations

from datetime import timedelta

import pytest

from portal.fleet.models import NodeStatus, PlannedDrain

DRAINS = "/api/v1/nodes/t4-node-1/drains/"


def _iso(at) -> str:
    return at.isoformat().replace("+00:00", "Z")


@pytest.fixture
def body(day):
    def make(**overrides):
        return {"starts_at": _iso(day), "ends_at": _iso(day + timedelta(hours=3)), "reason": "new power supply",
                **overrides}
    return make


@pytest.mark.parametrize("who", ["alice", "dave", "carol"])
def test_only_site_admins_plan_a_drain(client_for, fleet, body, who):
    r = client_for(who).post(DRAINS, body(), format="json")
    assert r.status_code == 403, r.content
    assert not PlannedDrain.objects.exists()


def test_a_site_admin_plans_a_drain_and_members_read_it(client_for, fleet, body, day):
    r = client_for("admin").post(DRAINS, body(), format="json")
    assert r.status_code == 201, r.content
    plan = r.json()
    assert plan["node"] == "t4-node-1" and plan["state"] == "planned" and plan["starts_at"] == _iso(day)
    listed = client_for("alice").get(DRAINS)
    assert listed.status_code == 200 and [p["id"] for p in listed.json()] == [plan["id"]]
    one = client_for("bob").get(f"{DRAINS}{plan['id']}/")
    assert one.status_code == 200 and one.json()["reason"] == "new power supply"


def test_a_member_cannot_cancel_a_drain_and_an_admin_can(client_for, fleet, body):
    plan = client_for("admin").post(DRAINS, body(), format="json").json()
    assert client_for("alice").delete(f"{DRAINS}{plan['id']}/").status_code == 403
    r = client_for("admin").delete(f"{DRAINS}{plan['id']}/")
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert client_for("alice").get(DRAINS).json() == []
    assert [p["state"] for p in client_for("alice").get(DRAINS + "?all=true").json()] == ["cancelled"]


def test_a_drain_starting_now_drains_the_node(client_for, fleet, body, day):
    from django.utils import timezone

    r = client_for("admin").post(DRAINS, body(starts_at=_iso(timezone.now()), ends_at=None), format="json")
    assert r.status_code == 201 and r.json()["state"] == "active" and r.json()["ends_at"] is None
    node = client_for("alice").get("/api/v1/nodes/t4-node-1/").json()
    assert node["status"] == NodeStatus.DRAINING


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"starts_at": "2020-01-01T09:00:00Z"}, "starts_at", "must be now or in the future"),
    ({"starts_at": "2099-01-01T09:00:00Z"}, "starts_at", "at most 90 days ahead"),
    ({"ends_at": "START"}, "ends_at", "at least a minute after the start"),
    ({"reason": ""}, "reason", "may not be blank"),
    ({"reason": "x" * 300}, "reason", "keep it to 200"),
    ({"force": "yes please"}, "force", "must be true or false"),
    ({"until": "later"}, "until", "unknown field"),
])
def test_a_bad_plan_is_refused_by_field(client_for, fleet, body, day, fields, field, words):
    sent = body(**{k: (_iso(day) if v == "START" else v) for k, v in fields.items()})
    r = client_for("admin").post(DRAINS, sent, format="json")
    assert r.status_code == 400, r.content
    assert words in " ".join(r.json()[field]), r.json()
    assert not PlannedDrain.objects.exists()


def test_an_unknown_node_is_404(client_for, fleet, body):
    assert client_for("admin").post("/api/v1/nodes/nope/drains/", body(), format="json").status_code == 404


def test_a_drain_over_bookings_answers_409_naming_them_unless_forced(client_for, fleet, body, reservation_body,
                                                                     day):
    booking = client_for("alice").post("/api/v1/reservations/", reservation_body(
        gpu_model="T4", gpu_request=1.0, starts_at=_iso(day + timedelta(hours=1)), duration_s=3600), format="json")
    assert booking.status_code == 201, booking.content
    admin = client_for("admin")
    r = admin.post(DRAINS, body(), format="json")
    assert r.status_code == 409, r.content
    assert r.json()["code"] == "drain_breaks_bookings"
    assert [(b["id"], b["team"], b["owner"]) for b in r.json()["bookings"]] == [(booking.json()["id"], "vision",
                                                                                   "alice")]
    assert admin.post(DRAINS, body(force=True), format="json").status_code == 201


def test_a_booking_over_a_drain_answers_409_naming_it_with_free_windows_outside(client_for, fleet, body,
                                                                                 reservation_body, day):
    assert client_for("admin").post(DRAINS, body(), format="json").status_code == 201
    r = client_for("alice").post("/api/v1/reservations/", reservation_body(
        gpu_model="T4", starts_at=_iso(day + timedelta(hours=1)), duration_s=3600), format="json")
    assert r.status_code == 409, r.content
    assert r.json()["code"] == "booking_conflict" and "t4-node-1 is drained for maintenance" in r.json()["detail"]
    assert r.json()["free_windows"][0] == {"starts_at": _iso(day + timedelta(hours=3)),
                                           "ends_at": _iso(day + timedelta(hours=4))}
