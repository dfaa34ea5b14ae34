"""A person opens the terminal of their running reservation in Chromium against the whole stack
(Daphne, a Celery worker and beat on Redis, the simulated cluster whose pods get a real shell on a
real PTY), types `echo $TESSERA_GPU_REQUEST` and reads the share back; the page breaks no rule of
the Content-Security-Policy; another team's user gets no terminal; cancelling closes it."""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from portal.fleet import inventory
from portal.reservations import services
from portal.reservations.models import Reservation, StateTransition
from portal.tenancy.models import Membership, Role
from tests.integration.conftest import INVENTORY, wait_for
from tests.reservations import submitted
from tests.teams import make_team
from tests.waiting import until

from .stack import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]
SHOTS = Path(os.environ.get("TESSERA_SHOTS", "/tmp/shots-terminal"))


@pytest.fixture
def people(stack):
    inventory.load(INVENTORY)
    vision = make_team("vision", "Vision", quota_gpu_share=Decimal(2), quota_memory_mib=200_000, quota_max_gpus=4)
    nlp = make_team("nlp", "NLP", quota_gpu_share=Decimal(2))
    users = get_user_model().objects
    alice = users.create_user("alice", password="alice-pw")
    bob = users.create_user("bob", password="bob-pw")
    Membership.objects.create(user=alice, team=vision, role=Role.MEMBER)
    Membership.objects.create(user=bob, team=nlp, role=Role.MEMBER)
    return {"alice": alice, "bob": bob, "vision": vision}




def shots(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    size = page.viewport_size
    for label, width in (("desktop", 1280), ("390", 390)):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(400)  # the terminal refits 150 ms after a resize
        page.locator("#terminal").scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / f"{name}-{label}.png"), full_page=True)
        page.locator("#terminal").screenshot(path=str(SHOTS / f"{name}-{label}-section.png"))
    page.set_viewport_size(size)


def screen_text(page) -> str:
    return page.inner_text("#terminal .xterm-rows")


def test_owner_types_in_the_terminal_and_reads_the_share(chromium, stack, people):
    portal, worker = stack["portal"], stack["worker"]
    base = portal.url
    worker.start()
    r = submitted(people["alice"], people["vision"], image="img", gpu_request=Decimal("0.25"),
                  gpu_memory_mib=4096, kind="interactive")
    wait_for(lambda: Reservation.objects.get(pk=r.pk).state == "running", 90, "the reservation to run")

    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(30_000)
    problems = []
    page.on("console", lambda m: problems.append(m.text) if "Content Security Policy" in m.text else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    sign_in(page, base, "alice", "alice-pw")
    page.goto(f"{base}/reservations/{r.pk}/")
    assert page.inner_text("#terminal [data-terminal-status]") == "Not connected."
    shots(page, "terminal-idle")

    # Keyboard only: focus the button, Enter.
    page.get_by_role("button", name="Connect terminal").focus()
    page.keyboard.press("Enter")
    page.wait_for_selector("#terminal[data-terminal-state=open]")
    assert "Connected to tessera-r" in page.inner_text("#terminal [data-terminal-status]")
    page.keyboard.type("echo $TESSERA_GPU_REQUEST")
    page.keyboard.press("Enter")
    until(page, lambda: "0.25" in screen_text(page).split("\n"), "the share on a line of its own")
    assert StateTransition.objects.filter(reservation_id=r.pk, reason="terminal opened").count() == 1
    # xterm's own style elements took the response's nonce: the rows are laid out, not stacked.
    assert page.evaluate("getComputedStyle(document.querySelector('#terminal .xterm-rows > div')).height") != "auto"
    shots(page, "terminal-open")

    # Shift+Tab leaves the terminal for the page.
    page.keyboard.press("Shift+Tab")
    assert page.evaluate("document.activeElement.className") != "xterm-helper-textarea"

    # Bob, of another team: no page, and the socket is refused as for a reservation that does not exist.
    other = chromium.new_context()
    bob = other.new_page()
    sign_in(bob, base, "bob", "bob-pw")
    assert bob.goto(f"{base}/reservations/{r.pk}/").status == 404
    code = bob.evaluate("""id => new Promise(done => {
        const ws = new WebSocket(`ws://${location.host}/ws/terminal/${id}/`);
        ws.onopen = () => done('open'); ws.onclose = e => done(e.code); })""", r.pk)
    assert code == 1006
    other.close()

    # The reservation is cancelled: the terminal says so and closes.
    services.cancel(r.pk, people["alice"])
    page.wait_for_selector("#terminal[data-terminal-state=closed]")
    assert "is cancelled" in page.inner_text("#terminal [data-terminal-status]")
    assert not page.get_by_role("button", name="Connect again").is_visible()  # nothing left to connect to
    shots(page, "terminal-closed")
    assert problems == []
    context.close()
