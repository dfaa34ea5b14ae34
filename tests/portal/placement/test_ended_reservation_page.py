"""A reservation that ended (here: cancelled while it ran) still shows its pod's last lines after
the pod is deleted, and no longer counts down to an expiry that will not come."""

from __future__ import annotations

from django.test import Client

from portal.reservations.models import Kind, Reservation
from portal.reservations.states import State
from scheduler.backends import PodRef


def test_cancelled_running_reservation_keeps_its_log_and_shows_no_expiry(client_for, reservation_body, people,
                                                                         cluster, placement_loop):
    response = client_for("alice").post("/api/v1/reservations/", reservation_body(
        kind=Kind.INTERACTIVE, gpu_request=0.5, gpu_memory_mib=4096), format="json")
    rid = response.json()["id"]
    placement_loop()
    r = Reservation.objects.get(pk=rid)
    assert r.state == State.RUNNING and r.expires_at is not None
    page = Client()
    page.force_login(people["alice"])
    assert "Expires" in page.get(f"/reservations/{rid}/").content.decode()
    live = page.get(f"/reservations/{rid}/log/").content.decode()
    assert "[simulated] started" in live
    pod = PodRef(r.pod_namespace, r.pod_name)

    assert page.post(f"/reservations/{rid}/cancel/").status_code == 302
    placement_loop()  # housekeeping deletes the pod
    r.refresh_from_db()
    assert r.state == State.CANCELLED and r.pod_name == ""
    assert cluster.pod_log(pod, 10) is None  # the pod is really gone
    log = page.get(f"/reservations/{rid}/log/").content.decode()
    assert "[simulated] started" in log and f"Pod {pod.name} is gone; its last lines" in log
    summary = page.get(f"/reservations/{rid}/?part=summary", HTTP_HX_REQUEST="true").content.decode()
    assert "Expires" not in summary and "Ended" in summary

