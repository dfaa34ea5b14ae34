"""A tab keeps ONE WebSocket to /ws/live/: the header's bell and the page's own live updates share it
(static/js/live.js), and both still arrive over it: a teammate's new reservation appears on the home
page and a notification lights the bell, without a reload. Against the whole stack (Daphne, Redis,
PostgreSQL)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model

from portal.fleet import inventory
from portal.notifications.services import Occurrence, notify
from portal.reservations import rules, services
from portal.tenancy.models import Membership, Role
from tests.integration.conftest import INVENTORY
from tests.teams import make_team
from tests.waiting import until

from .stack import ARTIFACTS, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


def _request(user, team, name: str):
    return services.submit(user, rules.ReservationSpec(team=team, image="img", name=name, gpu_model="T4",
                                                       gpu_request=Decimal("0.5"), gpu_memory_mib=4096,
                                                       max_duration_s=7200))


def _bell(page) -> int:
    return int(page.get_attribute("[data-bell]", "data-unread") or 0)


def _shoot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    size = page.viewport_size
    for width in (1440, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(250)  # charts resize after 150 ms
        page.screenshot(path=str(ARTIFACTS / f"{name}-{width}.png"), full_page=True)
    page.set_viewport_size(size)


def test_the_bell_and_the_page_share_one_live_socket(chromium, stack):
    portal = stack["portal"]
    inventory.load(INVENTORY)
    vision = make_team("vision", "Vision", quota_gpu_share=Decimal(2), quota_memory_mib=200_000, quota_max_gpus=4)
    alice = get_user_model().objects.create_user("alice", password="alice-pw", email="alice@example.com")
    Membership.objects.create(user=alice, team=vision, role=Role.MEMBER)
    held = _request(alice, vision, "train-resnet")  # placed at once (the cycle runs after the commit)

    context = chromium.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    page.set_default_timeout(30_000)
    errors, sockets, frames = [], [], []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    def opened(ws) -> None:
        sockets.append(ws.url)
        ws.on("framereceived", lambda payload: frames.append(payload))

    page.on("websocket", opened)
    sign_in(page, portal.url, "alice", "alice-pw")
    page.wait_for_selector("html[data-live=open]", state="attached")
    until(page, lambda: any('"subscribed"' in str(f) and "user:" in str(f) for f in frames)
          and any('"subscribed"' in str(f) and "team:" in str(f) for f in frames),
          "the bell's and the page's groups subscribed")
    navigations = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url) if frame == page.main_frame else None)

    # The page's live update: a request she made elsewhere (the API, another tab) shows up.
    fresh = _request(alice, vision, "eval-vit")
    until(page, lambda: page.locator(f"#reservation-{fresh.pk}").count() == 1, "the new card, live")
    # The team quota beside it follows to the last change (two 0.5 shares of its 2 GPUs held).
    until(page, lambda: "1 left" in page.locator("#home-side").inner_text(), "the team quota, live")
    # The bell's: a notification of the first one.
    notify([Occurrence(key=f"idle:{held.pk}", event="idle", reservation=held, model="T4", node="t4-node-1")])
    until(page, lambda: _bell(page) == 1, "the bell to count the notification")

    assert navigations == []  # no reload
    assert sockets == [f"{portal.url.replace('http', 'ws', 1)}/ws/live/"], sockets
    assert page.locator("[data-bell-count]").inner_text() == "1"
    _shoot(page, "one-live-socket-home")

    # Another page with live updates (the reservation's own), opened from the bell's list: again one
    # socket for this page, and the bell still follows.
    page.click("[data-bell]")
    page.wait_for_url(f"{portal.url}/notifications/")
    _shoot(page, "one-live-socket-bell-open")
    sockets.clear()
    page.locator(".note button[name=open]").first.click()
    page.wait_for_url(f"{portal.url}/reservations/{held.pk}/")
    page.wait_for_selector("html[data-live=open]", state="attached")
    assert _bell(page) == 0
    notify([Occurrence(key=f"idle-again:{held.pk}", event="idle", reservation=held, model="T4", node="t4-node-1")])
    until(page, lambda: _bell(page) == 1, "the bell on the reservation page")
    assert len(sockets) == 1 and sockets[0].endswith("/ws/live/"), sockets
    assert errors == []
    context.close()
