"""Booking through the API: POST /api/v1/reservations/ with a future `starts_at`, the 409 with free
windows, and GET /api/v1/bookings/ scoped to the teams a user may see."""

from __future__ import annotations

from datetime import timedelta

import pytest
from rest_framework.test import APIClient

from portal.reservations.models import Reservation

URL = "/api/v1/reservations/"
BOOKINGS = "/api/v1/bookings/"


def _iso(at) -> str:
    return at.isoformat().replace("+00:00", "Z")


@pytest.fixture
def alice(client_for, fleet):
    return client_for("alice")


def test_a_future_start_is_booked(alice, reservation_body, day):
    r = alice.post(URL, reservation_body(gpu_model="T4", starts_at=_iso(day), ends_at=_iso(day + timedelta(hours=2))),
                   format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["state"] == "booked" and body["starts_at"] == _iso(day)
    assert body["ends_at"] == _iso(day + timedelta(hours=2)) and body["booking_series"] is None
    assert body["max_duration_s"] == 7200 and body["allocations"] == []


def test_a_length_and_weekly_repeats(alice, reservation_body, day):
    r = alice.post(URL, reservation_body(gpu_model="T4", starts_at=_iso(day), duration_s=3600, repeat_weeks=3),
                   format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert "duration_s" not in body and "repeat_weeks" not in body
    series = Reservation.objects.filter(booking_series=body["booking_series"]).order_by("starts_at")
    assert [s.starts_at for s in series] == [day + timedelta(days=7 * i) for i in range(3)]


def test_a_window_that_does_not_fit_answers_409_with_free_windows(alice, client_for, reservation_body, day):
    taken = reservation_body(gpu_model="T4", gpu_count=2, gpu_request=1.0, starts_at=_iso(day), duration_s=7200)
    assert alice.post(URL, taken, format="json").status_code == 201
    r = client_for("bob").post(URL, reservation_body(team="nlp", gpu_model="T4", starts_at=_iso(day),
                                                     duration_s=3600), format="json")
    assert r.status_code == 409, r.content
    body = r.json()
    assert body["code"] == "booking_conflict" and "T4 is fully booked for" in body["detail"]
    # nearest first: the hour before the taken window, then earlier quarter hours
    assert body["free_windows"] == [{"starts_at": _iso(day - timedelta(minutes=m)),
                                     "ends_at": _iso(day - timedelta(minutes=m) + timedelta(hours=1))}
                                    for m in (60, 75, 90)]


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"starts_at": "2020-01-01T09:00:00Z", "duration_s": 3600}, "starts_at", "must be in the future"),
    ({"ends_at": "2099-01-01T09:00:00Z"}, "ends_at", "only with starts_at"),
    ({"starts_at": "soon", "duration_s": 3600}, "starts_at", "Datetime has wrong format"),
    ({"starts_at": "DAY", "duration_s": 3600, "max_duration_s": 600}, "max_duration_s", "lasts its window"),
    ({"starts_at": "DAY", "duration_s": 30}, "duration_s", "greater than or equal to 60"),
    ({"starts_at": "DAY", "duration_s": 3600, "repeat_weeks": 13}, "repeat_weeks", "less than or equal to 12"),
    ({"starts_at": "DAY", "duration_s": 3600, "repeats": 2}, "repeats", "unknown field"),
    ({"starts_at": "DAY", "duration_s": 3600, "gpu_model": ""}, "gpu_model", "a booking names one GPU model"),
])
def test_a_bad_booking_is_refused_by_field(alice, reservation_body, day, fields, field, words):
    body = reservation_body(gpu_model="T4") | {k: (_iso(day) if v == "DAY" else v) for k, v in fields.items()}
    r = alice.post(URL, body, format="json")
    assert r.status_code == 400, r.content
    assert words in " ".join(r.json()[field])
    assert not Reservation.objects.exists()


def test_booked_capacity_is_listed_per_team_scope(client_for, fleet, people, teams, booked, day):
    from decimal import Decimal

    booked(people["alice"], teams["vision"], day, 2, gpu_request=Decimal("0.5"))
    booked(people["bob"], teams["nlp"], day + timedelta(hours=1), 2, gpu_request=Decimal("1"))
    span = {"from": _iso(day - timedelta(hours=1)), "to": _iso(day + timedelta(days=1)), "gpu_model": "T4"}
    mine = client_for("alice").get(BOOKINGS, span).json()
    assert [(b["team"], b["state"]) for b in mine["bookings"]] == [("vision", "booked")]
    assert mine["models"] == [{"gpu_model": "T4", "gpus": 2, "memory_gib": 30, "peak_gpu_share": 0.5,
                               "peak_memory_gib": 8, "peak_gpus": 1}]
    everyone = client_for("admin").get(BOOKINGS, span).json()
    assert [b["team"] for b in everyone["bookings"]] == ["vision", "nlp"]
    assert everyone["models"][0]["peak_gpu_share"] == 1.5
    manager = client_for("dave").get(BOOKINGS, span).json()
    assert [b["team"] for b in manager["bookings"]] == ["vision"]
    later = client_for("admin").get(BOOKINGS, {"from": _iso(day + timedelta(days=1)),
                                               "to": _iso(day + timedelta(days=2))}).json()
    assert later["bookings"] == [] and {m["gpu_model"] for m in later["models"]} == {"A100-80GB", "T4", "V100-32GB"}


@pytest.mark.parametrize(("query", "field", "words"), [
    ({"frm": "2030-01-01T00:00:00Z"}, "frm", "unknown query parameter"),
    ({"from": "2030-01-02T00:00:00Z", "to": "2030-01-01T00:00:00Z"}, "to", "must be after from"),
    ({"from": "2030-01-01T00:00:00Z", "to": "2030-06-01T00:00:00Z"}, "to", "at most 92 days"),
    ({"to": ""}, "to", "must not be empty"),
])
def test_a_bad_bookings_query_is_refused(alice, query, field, words):
    r = alice.get(BOOKINGS, query)
    assert r.status_code == 400, r.content
    assert words in " ".join(r.json()[field])


def test_bookings_need_a_signed_in_user(db):
    assert APIClient().get(BOOKINGS).status_code in (401, 403)


def test_the_schema_states_the_booking_fields(alice):
    schema = alice.get("/api/schema/", {"format": "json"})
    assert schema.status_code == 200
    doc = schema.json()
    fields = doc["components"]["schemas"]["ReservationRequest"]["properties"]
    assert {"starts_at", "ends_at", "duration_s", "repeat_weeks"} <= set(fields)
    assert "/api/v1/bookings/" in doc["paths"]
    params = {p["name"] for p in doc["paths"]["/api/v1/bookings/"]["get"]["parameters"]}
    assert {"from", "to", "gpu_model", "mine"} <= params


def test_a_booking_window_is_moved_by_its_owner_and_rechecked(client_for, fleet, people, teams, booked, day):
    from decimal import Decimal

    [mine] = booked(people["alice"], teams["vision"], day, 2, gpu_count=2)
    [theirs] = booked(people["bob"], teams["nlp"], day + timedelta(hours=3), 1, gpu_request=Decimal("0.5"))
    url = f"{URL}{mine.pk}/window/"
    r = client_for("alice").post(url, {"starts_at": _iso(day + timedelta(hours=1)),
                                       "ends_at": _iso(day + timedelta(hours=3))}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["starts_at"] == _iso(day + timedelta(hours=1))
    r = client_for("alice").post(url, {"starts_at": _iso(day + timedelta(hours=2)),
                                       "ends_at": _iso(day + timedelta(hours=4))}, format="json")
    assert r.status_code == 409 and r.json()["code"] == "booking_conflict"
    assert client_for("dave").post(url, {"starts_at": _iso(day), "ends_at": _iso(day + timedelta(hours=1))},
                                   format="json").status_code == 403
    assert client_for("alice").post(f"{URL}{theirs.pk}/window/", {"starts_at": _iso(day), "ends_at": _iso(day)},
                                    format="json").status_code == 404
    assert client_for("alice").post(url, {"starts_at": _iso(day), "end": _iso(day)},
                                    format="json").status_code == 400
    client_for("alice").post(f"{URL}{mine.pk}/cancel/")
    r = client_for("alice").post(url, {"starts_at": _iso(day), "ends_at": _iso(day + timedelta(hours=1))},
                                 format="json")
    assert r.status_code == 409 and r.json()["code"] == "illegal_transition"


def test_a_span_at_the_end_of_time_is_refused_not_a_server_error(alice):
    r = alice.get(BOOKINGS, {"from": "9999-12-31T00:00:00Z"})
    assert r.status_code == 400 and r.json()["from"] == ["too far ahead"]


def test_only_mine_lists_ones_own_bookings(client_for, fleet, people, teams, booked, day):
    from decimal import Decimal

    booked(people["alice"], teams["vision"], day, 1, gpu_request=Decimal("0.5"))
    booked(people["alice2"], teams["vision"], day, 1, gpu_request=Decimal("0.5"))
    assert len(client_for("alice").get(BOOKINGS).json()["bookings"]) == 2
    assert [b["owner"] for b in client_for("alice").get(BOOKINGS, {"mine": "true"}).json()["bookings"]] == ["alice"]
    assert client_for("alice").get(BOOKINGS, {"mine": "0"}).status_code == 400


def test_planned_drains_over_the_span_are_listed_to_site_admins_and_managers_only(client_for, fleet, people, day):
    from portal.audit import services as audit
    from portal.fleet import drain_plans
    from portal.fleet.models import Node
    from portal.reservations import drain_effects

    by = audit.web(people["admin"])
    for node, start, end, reason in [("t4-node-1", day + timedelta(hours=3), day + timedelta(hours=5), "new PSU"),
                                     ("v100-node-1", day, None, "retired"),
                                     ("a100-node-2", day + timedelta(days=3), day + timedelta(days=4), "later")]:
        drain_effects.plan_drain(Node.objects.get(name=node), by, drain_plans.window_of(start, end, reason))
    span = {"from": _iso(day - timedelta(hours=1)), "to": _iso(day + timedelta(days=1))}
    t4 = {"id": 1, "node": "t4-node-1", "gpu_model": "T4", "gpus": 2, "starts_at": _iso(day + timedelta(hours=3)),
          "ends_at": _iso(day + timedelta(hours=5)), "reason": "new PSU"}

    everyone = client_for("admin").get(BOOKINGS, span).json()["drains"]
    assert [(d["node"], d["gpu_model"], d["gpus"], d["ends_at"]) for d in everyone] == [
        ("v100-node-1", "V100-32GB", 4, None), ("t4-node-1", "T4", 2, _iso(day + timedelta(hours=5)))]
    manager = client_for("dave").get(BOOKINGS, {**span, "gpu_model": "T4"}).json()["drains"]
    assert [{**d, "id": 1} for d in manager] == [t4]
    member = client_for("alice").get(BOOKINGS, {**span, "gpu_model": "T4"}).json()
    assert member["drains"] == []  # members see their team's bookings, not the fleet's maintenance
