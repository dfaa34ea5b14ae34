"""A data scientist in a real browser against the whole stack (Daphne, Celery worker and beat on
Redis, Channels over Redis, PostgreSQL, simulated agents): requests from a preset and from the
custom form, watches the preview follow the fields, sees pending → placed → running and the
charts fill without reloading, extends, reads the log, cancels after confirming. Bob, of another
team, sees none of it: not the pages, not the fragments, not the live messages."""

from __future__ import annotations

import json
import re
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model

from portal.fleet import inventory
from portal.fleet.models import Node
from portal.fleet.services import issue_node_token
from portal.reservations.models import Reservation
from portal.tenancy.models import Membership, Preset, Role, TeamPolicy
from tests.integration.conftest import INVENTORY
from tests.teams import make_team
from tests.waiting import until

from .stack import shoot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


@pytest.fixture
def people(stack):
    # The default password hasher: Daphne, another process, checks the passwords with its own settings.
    inventory.load(INVENTORY)
    vision = make_team("vision", "Vision", quota_gpu_share=Decimal(2), quota_memory_mib=200_000,
                                 quota_max_gpus=4)
    nlp = make_team("nlp", "NLP", quota_gpu_share=Decimal(2))
    TeamPolicy.objects.create(team=vision, max_duration_s=6 * 3600)
    Preset.objects.create(team=vision, name="Quarter T4, 4 GiB, 2 h", kind="interactive", gpu_model="T4",
                          gpu_request=Decimal("0.25"), gpu_limit=Decimal("0.5"), gpu_memory_mib=4096,
                          max_duration_s=2 * 3600, image="jupyter/base-notebook:2024")
    users = get_user_model().objects
    alice = users.create_user("alice", password="alice-pw")
    bob = users.create_user("bob", password="bob-pw")
    Membership.objects.create(user=alice, team=vision, role=Role.MEMBER)
    Membership.objects.create(user=bob, team=nlp, role=Role.MEMBER)
    return {"alice": alice, "bob": bob, "vision": vision}


def card_state(page, pk) -> str:
    return page.get_attribute(f"#reservation-{pk}", "data-state") or ""


def points(page, selector: str) -> int:
    return int(page.get_attribute(selector, "data-points") or 0)


def live_open(page, timeout_ms: int = 30_000) -> None:
    page.wait_for_selector("html[data-live=open]", state="attached", timeout=timeout_ms)




def test_alice_requests_watches_extends_reads_and_cancels(chromium, stack, people):
    portal, worker, agents = stack["portal"], stack["worker"], stack["agents"]
    base = portal.url
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(30_000)
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    sign_in(page, base, "alice", "alice-pw")
    shoot(page, "home-empty")

    # A preset, one click; the worker is not running yet, so it waits in the queue.
    page.click("nav >> text=Request GPU")
    page.wait_for_selector("#preview .preview")  # the preview of the form's initial values
    shoot(page, "request")
    page.click("article.preset >> button:has-text('Request')")
    page.wait_for_url(re.compile(r"/reservations/\d+/$"))
    first = Reservation.objects.get()
    assert first.state == "pending" and first.gpu_model == "T4"
    assert page.locator("#summary .page-head .badge").inner_text() == "pending"
    page.goto(f"{base}/")
    page.wait_for_selector(f"#reservation-{first.pk}")
    assert card_state(page, first.pk) == "pending"
    live_open(page)
    shoot(page, "home-pending")

    # The worker starts: the queued cycle places it, the pod watch sees it run. No reload.
    node = Node.objects.get(name="t4-node-1")
    agents.start(node.name, issue_node_token(node), interval=0.3)
    worker.start()
    seen = []
    navigations = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url) if frame == page.main_frame else None)

    def state_now() -> bool:
        state = card_state(page, first.pk)
        if not seen or seen[-1] != state:
            seen.append(state)
        return state == "running"

    until(page, state_now, "the card to say running")
    assert seen[0] == "pending" and seen[-1] == "running", seen  # placed may pass between two looks
    assert navigations == []  # all of it without a reload
    assert "t4-node-1" in page.inner_text(f"#reservation-{first.pk}")
    # The sparkline gets points from the agent's readings.
    until(page, lambda: points(page, f"#reservation-{first.pk} [data-spark=compute]") >= 3, "sparkline points")
    assert "% of a GPU" in page.inner_text(f"#reservation-{first.pk} [data-live-now]")
    shoot(page, "home-running", dark=True)

    # The reservation page: chart receives live points, the log, connection details, extend.
    page.click(f"#reservation-{first.pk} h3 a")
    page.wait_for_selector("figure[data-chart=chart-compute]")
    before = int(page.get_attribute("figure[data-chart=chart-compute]", "data-points") or 0)
    until(page, lambda: points(page, "figure[data-chart=chart-compute]") >= before + 3, "live chart points")
    page.wait_for_selector("#pod-log pre")
    assert "[simulated] started" in page.inner_text("#pod-log pre")
    assert "kubectl port-forward -n" in page.inner_text("body")
    page.fill("#id_hours", "9")
    page.click("form.extend button[type=submit]")
    page.wait_for_selector("form.extend .error")
    assert "at most 6 h" in page.inner_text("form.extend .error")
    page.fill("#id_hours", "1")
    page.click("form.extend button[type=submit]")
    page.wait_for_selector("text=extended by 1 h to 3 h")
    first.refresh_from_db()
    assert first.max_duration_s == 3 * 3600
    shoot(page, "reservation", dark=True)

    # The custom form: the preview follows the fields.
    page.goto(f"{base}/reservations/new/")
    page.wait_for_selector("#preview [data-fits=yes]")
    page.select_option("#id_gpu_model", "T4")
    page.fill("#id_memory_gib", "40")
    page.wait_for_selector("#preview [data-fits=invalid]")
    assert "more than a T4 card holds" in page.inner_text("#preview")
    page.fill("#id_memory_gib", "6")
    page.fill("#id_gpu_request", "0.5")
    page.fill("#id_gpu_limit", "0.75")
    page.fill("#id_hours", "1.5")
    page.fill("#id_command", "python train.py --tag 'first try'")
    page.wait_for_selector("#preview [data-fits=yes]")
    assert "T4" in page.inner_text("#preview") and "Guaranteed" in page.inner_text("#preview")
    assert "Your team's quota" in page.inner_text("#preview")
    page.click("text=Advanced: priority")
    page.fill("#id_priority", "40")
    shoot(page, "request-custom")
    page.click("button:has-text('Submit request')")
    page.wait_for_url(re.compile(r"/reservations/\d+/$"))
    second = Reservation.objects.exclude(pk=first.pk).get()
    assert (second.gpu_memory_mib, second.max_duration_s, second.priority) == (6144, 5400, 40)
    assert second.command == ["python", "train.py", "--tag", "first try"]

    # Cancel the first, after saying no once and then yes; the page follows without a reload.
    page.goto(f"{base}/reservations/{first.pk}/")
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.click("button:has-text('Cancel reservation')")
    page.wait_for_timeout(500)
    first.refresh_from_db()
    assert first.state == "running"
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button:has-text('Cancel reservation')")
    page.wait_for_selector("#summary .page-head .badge:has-text('cancelled')")
    first.refresh_from_db()
    assert first.state == "cancelled"

    # A home page left open shows a cancellation made elsewhere, live.
    page.goto(f"{base}/")
    page.wait_for_selector(f"#reservation-{second.pk}")
    live_open(page)
    from portal.reservations import services

    services.cancel(second.pk, people["alice"])
    page.wait_for_selector(f"#reservation-{second.pk}[data-state=cancelled]")

    # The socket drops (portal restart): the page says so, then reconnects.
    portal.stop()
    page.wait_for_selector("#connection:not([hidden])")
    assert "Live updates lost" in page.inner_text("#connection")
    shoot(page, "home-disconnected")
    portal.start()
    live_open(page, 60_000)
    assert errors == [], errors
    context.close()


def test_bob_sees_none_of_alices(chromium, stack, people):
    from portal.reservations import rules, services

    base = stack["portal"].url
    mine = services.submit(people["alice"], rules.ReservationSpec(team=people["vision"], image="busybox:1",
                                                                  gpu_request=Decimal("0.2"), gpu_memory_mib=1024))
    context = chromium.new_context()
    page = context.new_page()
    page.set_default_timeout(30_000)
    sign_in(page, base, "bob", "bob-pw")
    assert f"reservation-{mine.pk}" not in page.content()
    for path in (f"/reservations/{mine.pk}/", f"/reservations/{mine.pk}/card/", f"/reservations/{mine.pk}/log/",
                 f"/reservations/{mine.pk}/?part=summary", f"/reservations/new/?again={mine.pk}"):
        assert page.goto(f"{base}{path}").status == 404, path
    status = page.evaluate(f"""() => fetch('/reservations/{mine.pk}/extend/', {{method: 'POST',
        headers: {{'X-CSRFToken': document.cookie.replace(/.*csrftoken=([^;]+).*/, '$1')}},
        body: new URLSearchParams({{hours: '1'}})}}).then(r => r.status)""")
    assert status in (403, 404)
    # Live: the socket refuses alice's groups, and nothing of hers arrives.
    page.goto(f"{base}/")
    wanted = json.dumps([f"reservation:{mine.pk}", f"team:{people['vision'].pk}"])
    answer = page.evaluate(f"""() => new Promise((resolve) => {{
        const ws = new WebSocket('ws://' + location.host + '/ws/live/');
        const got = [];
        ws.onopen = () => ws.send(JSON.stringify({{subscribe: {wanted}}}));
        ws.onmessage = (e) => got.push(JSON.parse(e.data));
        setTimeout(() => {{ ws.close(); resolve(got); }}, 2500);
    }})""")
    services.cancel(mine.pk, people["alice"])
    subscribed = [m for m in answer if m.get("type") == "subscribed"]
    assert subscribed and subscribed[0]["groups"] == []
    assert set(subscribed[0]["refused"]) == {f"reservation:{mine.pk}", f"team:{people['vision'].pk}"}
    assert not [m for m in answer if m.get("group")]
    context.close()
