"""Open a notebook in one click: alice requests the team's notebook preset in Chromium against the
whole stack (Daphne, a Celery worker and beat, the simulated cluster whose pod runs a real
jupyter-server), finds Open on her reservation's page once it runs, and in the tab it opens, on
the portal's own origin, a real kernel runs `print(6*7)` through the proxy (Jupyter's REST API
and its kernel WebSocket, driven from that page). Bob, of another team, gets 404 there."""

from __future__ import annotations

import time
from decimal import Decimal
from urllib.parse import urlsplit

import pytest
from django.contrib.auth import get_user_model

from portal.fleet import inventory
from portal.reservations.models import Reservation
from portal.reservations.states import State
from portal.tenancy.models import Membership, Preset, Role
from tests.integration.conftest import INVENTORY, wait_for
from tests.teams import make_team

from .stack import shoot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

# Runs in the notebook's tab: a kernel through the proxied REST API, then a cell over the proxied
# kernel WebSocket; what the cell printed is shown on the page (for the screenshot) and returned.
RUN_CELL = """async (code) => {
  const base = location.pathname.replace(/^(\\/connect\\/\\d+\\/).*$/, "$1");
  const started = await fetch(base + "api/kernels", {method: "POST", headers: {"Content-Type": "application/json"},
                                                   body: JSON.stringify({name: "python3"})});
  if (started.status !== 201) return "kernel: HTTP " + started.status;
  const kernel = await started.json();
  const ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + base +
                           "api/kernels/" + kernel.id + "/channels");
  const msgId = "cell-" + Date.now();
  const printed = await new Promise((resolve, reject) => {
    let out = "";
    ws.onerror = () => reject(new Error("kernel WebSocket failed"));
    ws.onopen = () => ws.send(JSON.stringify({
      header: {msg_id: msgId, username: "", session: "browser", msg_type: "execute_request", version: "5.3", date: ""},
      parent_header: {}, metadata: {}, channel: "shell", buffers: [],
      content: {code: code, silent: false, store_history: true, user_expressions: {}, allow_stdin: false,
                stop_on_error: true}}));
    ws.onmessage = (event) => {
      const msg = JSON.parse(event.data);
      if (!msg.parent_header || msg.parent_header.msg_id !== msgId) return;
      if (msg.msg_type === "stream") out += msg.content.text;
      if (msg.msg_type === "status" && msg.content.execution_state === "idle") resolve(out);
    };
  });
  ws.close();
  const shown = document.createElement("pre");
  shown.id = "cell-output";
  shown.style.cssText = "font: 16px monospace; padding: 1rem; border: 1px solid #888; margin: 1rem; " +
                        "white-space: pre-wrap";
  shown.textContent = "kernel " + kernel.id + " (" + kernel.name + ")\\nIn:  " + code + "\\nOut: " + printed;
  document.body.prepend(shown);
  return printed;
}"""


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

    # The notebook server starts in the pod a few seconds after it runs: the proxy says so until then.
    deadline = time.monotonic() + 60
    with context.expect_page() as opened:
        page.click("a[data-connect]")
    notebook = opened.value
    notebook.wait_for_load_state()
    while "Jupyter" not in (notebook.title() + notebook.content()) and time.monotonic() < deadline:
        notebook.wait_for_timeout(500)
        notebook.reload()
    assert urlsplit(notebook.url).netloc == urlsplit(base).netloc  # the portal's own origin
    assert urlsplit(notebook.url).path.startswith(f"/connect/{reservation.pk}/")
    from portal.connect.access import app_token
    assert app_token(reservation.pk) not in notebook.content()  # the app's token stays between portal and pod
    printed = notebook.evaluate(RUN_CELL, "print(6*7)")
    assert printed == "42\n"
    shoot(notebook, "connect-notebook")

    # Bob, signed in, in another team: nothing there, and no Open on a page he cannot see anyway.
    other = chromium.new_context()
    bob = other.new_page()
    sign_in(bob, base, "bob", "bob-pw")
    answer = bob.goto(f"{base}/connect/{reservation.pk}/")
    assert answer.status == 404
    answer = bob.goto(f"{base}/connect/{reservation.pk}/api/kernels")
    assert answer.status == 404
    assert bob.goto(f"{base}/reservations/{reservation.pk}/").status == 404
    other.close()
    context.close()
