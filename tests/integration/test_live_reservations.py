"""ws/live/ carries reservation changes (state, reason, queue place) to the browsers of the
reservation's team, and to nobody else, over a real Daphne and Redis."""

from __future__ import annotations

import json

import pytest

from portal.reservations import services
from portal.reservations.states import State
from portal.telemetry.background_sends import sender
from tests.waiting import wait_for

from .test_live_socket import collect, live_socket, subscribe

pytestmark = pytest.mark.timeout(120)


def test_a_cancellation_reaches_the_teams_browsers_only(portal, world):
    vision, nlp = world["teams"]["vision"], world["teams"]["nlp"]
    mine, theirs = world["reservations"]["vision"], world["reservations"]["nlp"]
    alice, bob = world["people"]["alice"], world["people"]["bob"]
    with live_socket(portal, alice) as a, live_socket(portal, bob) as b:
        assert subscribe(a, [f"team:{vision.pk}", f"reservation:{mine.pk}"])["refused"] == {}
        assert subscribe(b, [f"team:{nlp.pk}", f"reservation:{mine.pk}"])["groups"] == [f"team:{nlp.pk}"]
        services.cancel(mine.pk, alice)
        assert sender.flush(5.0)
        got_a = wait_for(lambda: [m for m in collect(a, 0.5) if m.get("type") == "reservations"], 10,
                         "alice's reservation messages")
        got_b = [m for m in collect(b, 1.0) if m.get("type") == "reservations"]
    assert {m["group"] for m in got_a} <= {f"team:{vision.pk}", f"reservation:{mine.pk}"}
    assert all(m["data"]["changed"] == [mine.pk] for m in got_a)
    assert got_b == []
    # Bob's own team hears about its own reservations.
    with live_socket(portal, bob) as b:
        subscribe(b, [f"team:{nlp.pk}"])
        assert services.release(theirs.pk, State.SUCCEEDED, "done", "system:test")
        sender.flush(5.0)
        seen = wait_for(lambda: [m for m in collect(b, 0.5) if m.get("type") == "reservations"], 10,
                        "bob's reservation message")
    assert json.dumps(seen[0]["data"]["changed"]) == json.dumps([theirs.pk])
