"""GPUs are named as a person reads them ("GPU 0 on t4-node-1 (T4)") wherever a person reads
them: the usage report grouped by GPU (page, JSON label and CSV) and a placed reservation's
reason and timeline. UUIDs stay the machine-facing keys."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

from portal.fleet.models import Gpu
from portal.reservations.models import Reservation
from tests.portal.test_reports import T0, URL, two_hours  # noqa: F401 (a fixture)


def test_usage_by_gpu_names_each_gpu(client_for, two_hours):  # noqa: F811
    t4_0 = Gpu.objects.get(node__name="t4-node-1", index=0)
    params = {"since": (T0 - timedelta(hours=1)).isoformat(), "until": (T0 + timedelta(hours=4)).isoformat(),
              "group_by": "gpu"}
    rows = {r["key"]: r for r in client_for("admin").get(URL, params).json()["rows"]}
    assert rows[t4_0.uuid]["label"] == "GPU 0 on t4-node-1 (T4)"
    table = client_for("admin").get(URL, {**params, "format": "csv"}).content.decode()
    labels = [row[0] for row in csv.reader(io.StringIO(table))]
    assert "GPU 0 on t4-node-1 (T4)" in labels and "GPU 1 on t4-node-1 (T4)" in labels
    assert not any(label.startswith("GPU-") or "/ GPU-" in label for label in labels)


def test_placed_reason_names_the_gpu_not_its_uuid(client_for, reservation_body, placement_loop):
    response = client_for("alice").post("/api/v1/reservations/", reservation_body(gpu_model="T4", gpu_request=0.5),
                                        format="json")
    placement_loop(sync=False)
    r = Reservation.objects.get(pk=response.json()["id"])
    placed = r.transitions.get(to_state="placed")
    assert placed.reason.startswith("placed on GPU ") and " on t4-node-1 (T4)" in placed.reason, placed.reason
    assert "GPU-" not in placed.reason
