"""Layout checks in Chromium, desktop and 390 px: the memory chart's value axis is as wide as its
labels ("12.5 GiB" not clipped to "2.5 GiB") and its time ticks are whole seconds (no ":01.500");
a stat tile never breaks "a100-node-1" at its hyphen; a toast never covers the charts; the presets
table keeps its Delete buttons in view at 1440 px. Screenshots go to tests/browser/artifacts/."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from portal.fleet import inventory
from portal.fleet.models import Gpu
from portal.reservations import services
from portal.reservations.states import State
from portal.tenancy.models import Membership, Preset, Role
from tests.reservations import SYSTEM, running, submitted
from tests.teams import make_team

from .stack import ARTIFACTS, sign_in

pytestmark = pytest.mark.browser
DEMO = Path(__file__).resolve().parents[2] / "deploy" / "inventory" / "demo.yaml"
WIDTHS = (1440, 390)


@pytest.fixture
def world(chromium, transactional_db, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    inventory.load(DEMO)
    vision = make_team("vision", "Vision", quota_gpu_share=4)
    users = {}
    for name, role in (("carol", Role.ADMIN), ("alice", Role.MEMBER)):
        users[name] = get_user_model().objects.create_user(name, password=f"s3cret-{name}")
        Membership.objects.create(user=users[name], team=vision, role=role)
    r = submitted(users["alice"], vision, image="jupyter/base-notebook:latest", gpu_request=Decimal("0.5"),
                  gpu_memory_mib=12800, kind="interactive", gpu_model="A100-80GB")
    r.refresh_from_db()
    if r.state == State.PENDING:  # no worker placed it on submit
        r = running(r, Gpu.objects.get(node__name="a100-node-1", index=3))
    elif r.state == State.PLACED:
        services.move(r.pk, State.PLACED, State.RUNNING, "its pod runs", SYSTEM)
    r.refresh_from_db()
    assert r.state == State.RUNNING and r.node.name.startswith("a100-node-")
    for i, (name, command) in enumerate((
            ("Notebook, half an A100", ""),
            ("PyTorch training with a long command line", "python -c 'import torch; print(torch.cuda.is_available())'"),
            ("Inference server", "tritonserver --model-repository=/models --strict-model-config=false"))):
        Preset.objects.create(team=vision, name=name, gpu_model="A100-80GB", gpu_request=Decimal("0.5"),
                              gpu_limit=Decimal("0.5"), gpu_memory_mib=24576, max_duration_s=8 * 3600,
                              image=f"registry.example.org/research/vision/pytorch-cuda12-{i}:2026.11.1",
                              command=command.split() if command else [])
    return {"reservation": r}


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"rough-{name}.png"), full_page=True)


def _boxes_overlap(a: dict, b: dict) -> bool:
    return not (a["x"] + a["width"] <= b["x"] or b["x"] + b["width"] <= a["x"]
                or a["y"] + a["height"] <= b["y"] or b["y"] + b["height"] <= a["y"])


AXES = """(figure) => {
  const u = figure.uplot, y = u.axes[1], x = u.axes[0];
  const ctx = document.createElement("canvas").getContext("2d");
  ctx.font = y.font[0];
  const px = window.devicePixelRatio || 1;
  const widest = Math.max(...(y._values || []).map(v => ctx.measureText(String(v)).width / px));
  return {y: (y._values || []).map(String), room: y._size, widest: widest, x: (x._values || []).map(String)};
}"""

# A chart of live points one second apart, as the reservation page's socket gives them, drawn by the
# page's own chart code beside the real ones.
LIVE_CHART = """() => {
  const figure = document.querySelector('figure[data-chart="chart-memory"]').cloneNode(true);
  figure.setAttribute("data-chart", "chart-live");
  figure.querySelector("script").id = "chart-live";
  const now = Math.floor(Date.now() / 1000);
  figure.querySelector("script").textContent = JSON.stringify({id: "chart-live", title: "GPU memory used (GiB)",
    unit: "GiB", x: [now, now + 1, now + 2, now + 3], ymax: 12.5, series: [
      {key: "memory", label: "used", values: [12.1, 12.5, 12.4, 12.5]},
      {key: "limit", label: "cap", values: [12.5, 12.5, 12.5, 12.5], dash: true}]});
  figure.querySelector(".chart-plot").replaceChildren();
  const card = document.createElement("div");
  card.className = "card";
  card.appendChild(figure);
  document.querySelector(".charts").after(card);
  window.Tessera.chart(figure);
  return true;
}"""


def test_charts_tiles_and_toasts_on_the_reservation_page(page, live_server, world):
    r = world["reservation"]
    sign_in(page, live_server.url, "alice", "s3cret-alice")
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{live_server.url}/reservations/{r.pk}/")
        page.locator('figure[data-chart="chart-memory"] canvas').wait_for()  # uPlot drew it
        page.evaluate(LIVE_CHART)
        memory = page.evaluate(AXES, page.query_selector('figure[data-chart="chart-memory"]'))
        assert "12.5 GiB" in memory["y"], memory
        assert memory["widest"] <= memory["room"], memory  # "12.5 GiB" fits: not clipped to "2.5 GiB"
        live = page.evaluate(AXES, page.query_selector('figure[data-chart="chart-live"]'))
        assert live["widest"] <= live["room"], live
        assert live["x"] and all("." not in v for v in live["x"]), live  # whole seconds, no ":01.500"
        # The Node tile: "a100-node-N" on one line, never broken after "a100-".
        node = page.locator(".stat", has_text="Node").locator(".stat-value")
        assert node.inner_text() == r.node.name and node.get_attribute("title") == r.node.name
        lines = page.evaluate("(el) => { const r = document.createRange(); r.selectNodeContents(el);"
                              " return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size; }",
                              node.element_handle())
        assert lines == 1
        assert page.evaluate("(el) => el.scrollWidth <= el.clientWidth", node.element_handle())  # no ellipsis
        # A toast (the state change, an extend) never sits over the charts.
        page.evaluate(f"window.Tessera.toast('Reservation {r.pk} is running.', 'info')")
        for figure in page.locator("figure.chart").all():
            for block in ("start", "end"):  # the chart at the top, then at the bottom of the window
                figure.evaluate(f"el => el.scrollIntoView({{block: '{block}'}})")
                toast = page.locator(".toast").last.bounding_box()
                assert not _boxes_overlap(toast, figure.bounding_box()), (block, toast, figure.bounding_box())
        _shot(page, f"reservation-{width}")


def test_presets_table_keeps_its_delete_buttons_in_view(page, live_server, world):
    sign_in(page, live_server.url, "carol", "s3cret-carol")
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{live_server.url}/team/vision/presets/")
        wrap = page.locator(".table-wrap").first
        box = wrap.bounding_box()
        assert page.evaluate("(el) => el.scrollWidth <= el.clientWidth + 1", wrap.element_handle())
        buttons = page.locator("table.presets button.danger").all()
        assert len(buttons) == 3
        for button in buttons:
            b = button.bounding_box()
            assert b["x"] >= box["x"] and b["x"] + b["width"] <= box["x"] + box["width"] + 1
            assert b["x"] + b["width"] <= width
        _shot(page, f"presets-{width}")
