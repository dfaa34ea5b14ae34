"""The bell's count over a real Daphne and Redis: a person's `user:<id>` group on ws/live/ hears their
unread count when a reservation of theirs changes, and nobody else may join it."""

from __future__ import annotations

import pytest

from portal.notifications import services as notifications
from portal.notifications.models import Notification
from portal.reservations import services
from portal.reservations.states import State
from portal.telemetry.background_sends import sender
from tests.waiting import wait_for

from .test_live_socket import collect, live_socket, subscribe

pytestmark = pytest.mark.timeout(120)


def counts(ws) -> list[int]:
    return [m["data"]["unread"] for m in collect(ws, 0.5) if m.get("type") == "notifications"]


def test_the_unread_count_reaches_its_owner_live(portal, world):
    alice, bob = world["people"]["alice"], world["people"]["bob"]
    mine = world["reservations"]["vision"]
    # The world's reservations were running when the test began: one notification each.
    assert Notification.objects.filter(user=alice).count() == 1
    with live_socket(portal, alice) as a, live_socket(portal, bob) as b:
        assert subscribe(a, [f"user:{alice.pk}"])["groups"] == [f"user:{alice.pk}"]
        refused = subscribe(b, [f"user:{alice.pk}", f"user:{bob.pk}"])
        assert refused["groups"] == [f"user:{bob.pk}"] and f"user:{alice.pk}" in refused["refused"]
        services.release(mine.pk, State.SUCCEEDED, "its pod completed", "system:test")
        assert sender.flush(5.0)
        seen = wait_for(lambda: counts(a), 10, "alice's unread count")
        assert seen[-1] == 2
        assert counts(b) == []  # bob's own count did not change, and alice's is not his
        # Reading them brings the count down, live.
        notifications.mark_all_read(alice)
        sender.flush(5.0)
        assert wait_for(lambda: counts(a), 10, "alice's count after reading")[-1] == 0
