"""Open a notebook in one click: alice requests the team's notebook preset in Chromium against the
whole stack (Daphne, a Celery worker and beat, the simulated cluster whose pod runs a real
jupyter-server with Jupyter Notebook 7's pages), finds Open on her reservation's page once it runs,
and in the tab it opens, on the portal's own origin, she uses the notebook as a person does: New →
Python 3 makes a notebook, she types `print(6*7)` in its first cell, runs it, and sees 42 under it
(the page, its REST calls and the kernel's WebSocket all through the proxy). Bob, of another team,
gets 404 there."""

from __future__ import annotations

from decimal import Decimal
from urllib.parse import urlsplit

import pytest
from django.contrib.auth import get_user_model

from portal.fleet import inventory
from portal.reservations.models import Reservation
from portal.reservations.states import State
from portal.tenancy.models import Membership, Preset, Role
from tests.integration.conftest import INVENTORY
from tests.teams import make_team
from tests.waiting import until, wait_for

from .stack import ARTIFACTS, shoot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


def shoot_app(page, name: str) -> None:
    """The app's page at 1440 px and at 390 px (a phone), as the browser shows it (Jupyter's pages
    scroll inside themselves: the viewport is the page)."""
    ARTIFACTS.mkdir(exist_ok=True)
    size = page.viewport_size
    for label, width in (("1440", 1440), ("390", 390)):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(400)  # Jupyter lays its panels out again on resize
        page.screenshot(path=str(ARTIFACTS / f"{name}-{label}.png"))
    page.set_viewport_size(size)


@pytest.fixture
def people(stack):
    inventory.load(INVENTORY)
    vision = make_team("vision", "Vision", quota_gpu_share=Decimal(2), quota_memory_mib=200_000, quota_max_gpus=4)
    nlp = make_team("nlp", "NLP", quota_gpu_share=Decimal(2))
    Preset.objects.create(team=vision, name="Notebook", kind="interactive", gpu_request=Decimal("0.25"),
                          gpu_limit=Decimal("0.5"), gpu_memory_mib=4096, max_duration_s=2 * 3600,
                          image="jupyter/base-notebook:2024", app="jupyter")
    users = get_user_model().objects
    alice = users.create_user("alice", password="alice-pw")
    bob = users.create_user("bob", password="bob-pw")
    Membership.objects.create(user=alice, team=vision, role=Role.MEMBER)
    Membership.objects.create(user=bob, team=nlp, role=Role.MEMBER)
    yield {"alice": alice, "bob": bob}
    from portal.placement.backend import get_backend

    get_backend().stop_apps()  # the notebook servers the worker's binds started


def test_alice_opens_her_notebook_and_runs_a_cell_bob_gets_404(chromium, stack, people):
    base = stack["portal"].url
    stack["worker"].start()
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(20_000)
    sign_in(page, base, "alice", "alice-pw")
    page.goto(f"{base}/reservations/new/")
    page.click("article.preset:has-text('Notebook') button:has-text('Request')")  # the preset's one-click request
    reservation = wait_for(lambda: Reservation.objects.filter(owner=people["alice"]).first(), 30, "the request")
    assert reservation.app == "jupyter" and reservation.app_port == 8888
    page.goto(f"{base}/reservations/{reservation.pk}/")
    page.wait_for_selector("#connect")  # pending or placed: Open comes once the pod runs, without a reload
    wait_for(lambda: Reservation.objects.filter(pk=reservation.pk, state=State.RUNNING).exists(), 60, "the pod to run")
    open_link = page.wait_for_selector("a[data-connect]", timeout=30_000)
    assert open_link.inner_text().strip() == "Open"
    shoot(page, "connect-reservation")

    # Open leads to the notebook's file browser; its server starts in the pod a few seconds after the
    # pod runs, and until it answers the proxy says so (503): reload, as a person would.
    with context.expect_page() as opened:
        page.click("a[data-connect]")
    tree = opened.value
    tree.set_default_timeout(60_000)
    tree.wait_for_load_state()
    assert urlsplit(tree.url).netloc == urlsplit(base).netloc  # the portal's own origin
    assert urlsplit(tree.url).path == f"/connect/{reservation.pk}/tree"
    wait_for(lambda: getattr(tree.reload(), "status", None) == 200, 60, "the notebook server to answer",
             every=0.5, sleep=lambda s: tree.wait_for_timeout(s * 1000))
    new_menu = tree.wait_for_selector(".lm-MenuBar-item:has-text('New')")  # Notebook 7's Files page, drawn
    from portal.connect.access import app_token
    token = app_token(reservation.pk)
    assert token not in tree.content()  # the app's token stays between portal and pod
    shoot_app(tree, "connect-notebook-files")

    # New → Python 3 (ipykernel): a notebook, in a tab of its own, with a kernel started for it.
    new_menu.click()
    with context.expect_page() as created:
        tree.click(".lm-Menu-itemLabel:has-text('Python 3')")
    notebook = created.value
    notebook.set_default_timeout(60_000)
    notebook.wait_for_load_state()
    assert urlsplit(notebook.url).netloc == urlsplit(base).netloc
    assert urlsplit(notebook.url).path == f"/connect/{reservation.pk}/notebooks/Untitled.ipynb"
    notebook.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']")  # the kernel is up
    notebook.click(".jp-Notebook .jp-Cell .cm-content")
    notebook.keyboard.type("print(6*7)")
    notebook.keyboard.press("Shift+Enter")
    # What she sees: the cell's output under it, and the cell numbered as run.
    output = notebook.wait_for_selector(".jp-Notebook .jp-Cell .jp-OutputArea-output")
    until(notebook, lambda: output.inner_text().strip() == "42", "42 under the cell")
    assert notebook.locator(".jp-Notebook .jp-Cell").first.locator(".jp-InputPrompt").inner_text().strip() == "[1]:"
    assert token not in notebook.content()
    shoot_app(notebook, "connect-notebook")
    # The notebook was saved in the pod, through the proxy's REST path as well.
    listing = notebook.evaluate(
        "async (base) => (await (await fetch(base + 'api/contents')).json()).content.map(f => f.name)",
        f"/connect/{reservation.pk}/")
    assert "Untitled.ipynb" in listing

    # Bob, signed in, in another team: nothing there, and no Open on a page he cannot see anyway.
    other = chromium.new_context()
    bob = other.new_page()
    sign_in(bob, base, "bob", "bob-pw")
    for path in ("", "tree", "notebooks/Untitled.ipynb"):
        assert bob.goto(f"{base}/connect/{reservation.pk}/{path}").status == 404
    answer = bob.goto(f"{base}/connect/{reservation.pk}/api/kernels")
    assert answer.status == 404
    assert bob.goto(f"{base}/reservations/{reservation.pk}/").status == 404
    other.close()
    context.close()
