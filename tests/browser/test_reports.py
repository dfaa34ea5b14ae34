"""dave, vision's manager, opens the reports overview and a 7-day team report in a real browser,
sees the charts drawn from data, downloads the CSV and finds the API's totals in it; alice and bob
(members) cannot open reports. Screenshots (desktop and 390 px wide) go to tests/browser/artifacts/."""

import csv
import io
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from portal.fleet import inventory
from portal.fleet.models import Gpu
from portal.reservations.models import Allocation
from portal.telemetry.models import ShareMinute
from portal.tenancy.models import Membership, Role
from tests.reservations import clock_at, ended, placed, submitted
from tests.teams import make_team

from .stack import sign_in

pytestmark = pytest.mark.browser
ARTIFACTS = Path(__file__).parent / "artifacts"
DEMO = Path(__file__).resolve().parents[2] / "deploy" / "inventory" / "demo.yaml"


@pytest.fixture
def world(chromium, transactional_db, settings):
    """Three days ago vision held half an A100 for 6 hours (using 0.2, then idle) and a T4 for 2
    hours (bursting to 0.8 of it); nlp held a whole A100 for 4 hours."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    inventory.load(DEMO)
    vision = make_team("vision", "Vision", quota_gpu_share=4)
    nlp = make_team("nlp", "NLP", quota_gpu_share=4)
    users = {}
    for name, team, role in (("dave", vision, Role.MANAGER), ("alice", vision, Role.MEMBER),
                             ("bob", nlp, Role.MEMBER)):
        users[name] = get_user_model().objects.create_user(name, password=f"s3cret-{name}")
        Membership.objects.create(user=users[name], team=team, role=role)
    start = (timezone.now() - timedelta(days=3)).replace(minute=0, second=0, microsecond=0)

    def held(who, team, model, share, hours, used):
        with clock_at(start):
            r = submitted(users[who], team, image="busybox:1", gpu_request=share, gpu_limit="1.0",
                          gpu_memory_mib=1024, gpu_model=model)
            if not Allocation.objects.filter(reservation=r).exists():  # placed on submit when no worker runs
                gpu = Gpu.objects.filter(model=model).exclude(allocations__released_at__isnull=True).first()
                placed(r, gpu, Decimal(share), 1024)
        with clock_at(start + timedelta(hours=hours)):
            ended(r)
        allocation = Allocation.objects.get(reservation=r)
        ShareMinute.objects.bulk_create([
            ShareMinute(reservation=r, gpu_id=allocation.gpu_id, team_id=team.pk, minute=start + timedelta(minutes=m),
                        samples=60, used_sum=60 * used(m), used_max=used(m)) for m in range(hours * 60)])

    held("alice", vision, "A100-80GB", "0.5", 6, lambda m: 0.2 if m < 180 else 0.01)
    held("alice", vision, "T4", "0.25", 2, lambda m: 0.8)
    held("bob", nlp, "A100-80GB", "1.0", 4, lambda m: 0.7)
    return users


def shoot(page, name):
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def watch_violations(page) -> list[str]:
    seen: list[str] = []
    page.on("console", lambda m: seen.append(m.text) if "Content Security Policy" in m.text else None)
    page.on("pageerror", lambda e: seen.append(f"page error: {e}"))
    return seen


def test_dave_reads_the_overview_and_a_team_report_and_downloads_its_csv(page, live_server, world):
    base = live_server.url
    violations = watch_violations(page)
    page.set_viewport_size({"width": 1280, "height": 900})
    sign_in(page, base, "dave", "s3cret-dave")
    page.click("nav >> text=Reports")
    page.wait_for_url(f"{base}/reports/overview/")
    chart = page.locator("[data-report-chart=series]")
    chart.locator("canvas").wait_for()
    assert int(chart.get_attribute("data-points")) > 0
    assert "Vision allocated" in chart.inner_text() and "NLP" not in page.content()
    shoot(page, "reports-overview-desktop")

    page.click("text=Usage report")
    page.select_option("#f-team", "vision")
    page.click("button:has-text('Show')")
    page.click(".ranges >> text=7d")
    page.wait_for_selector("[data-report-chart=breakdown] canvas")
    assert "range=7d" in page.url and "team=vision" in page.url
    assert page.locator("[data-report-chart=series]").get_attribute("data-drawn") == "true"
    assert page.locator("table[data-breakdown] tbody tr").count() == 1
    # The T4 share used 0.8 of a GPU on a request of 0.25 for 2 hours: 1.1 GPU-hours above its request.
    assert "\t1.10\t" in page.locator("table[data-breakdown] tbody").inner_text()
    shoot(page, "reports-usage-desktop")

    with page.expect_download() as download:
        page.click("text=Download CSV")
    table = list(csv.reader(io.StringIO(Path(download.value.path()).read_text())))
    assert table[0][:3] == ["team", "allocated (GPU-hours)", "used (GPU-hours)"]
    api = page.request.get(f"{base}/api/v1/reports/usage/?team=vision&range=7d").json()
    total = table[-1]
    assert total[0] == "Total"
    assert float(total[1]) == api["total"]["allocated_gpu_hours"] == 3.5  # 0.5 × 6 h + 0.25 × 2 h
    assert float(total[2]) == api["total"]["used_gpu_hours"]
    assert float(total[4]) == api["total"]["idle_allocated_gpu_hours"] == 1.5  # 0.5 × the 3 idle hours
    page_total = page.locator("table[data-breakdown] tfoot").inner_text()
    for name in ("allocated_gpu_hours", "used_gpu_hours"):
        assert f"{api['total'][name]:.2f}" in page_total

    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    page.wait_for_selector("[data-report-chart=breakdown] canvas")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390  # nothing wider than the phone
    shoot(page, "reports-usage-390")
    page.goto(f"{base}/reports/overview/?range=7d")
    page.wait_for_selector("[data-report-chart=series] canvas")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    shoot(page, "reports-overview-390")
    assert violations == []


@pytest.mark.parametrize("who", ["alice", "bob"])
def test_members_cannot_open_daves_reports(page, live_server, world, who):
    base = live_server.url
    sign_in(page, base, who, f"s3cret-{who}")
    assert page.locator("nav >> text=Reports").count() == 0
    for path in ("/reports/overview/", "/reports/?team=vision&range=7d"):
        assert page.goto(f"{base}{path}").status == 403
    assert page.request.get(f"{base}/api/v1/reports/usage/?team=vision").status == 403
    assert page.request.get(f"{base}/api/v1/reports/usage/?team=vision&format=csv").status == 403

