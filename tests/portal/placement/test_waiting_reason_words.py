"""A waiting reservation's reason speaks of the GPUs its owner asked for ("no T4 GPU has room: …"),
not of the engine's filters ("16 GPU(s) are not of model T4"), and counts the GPUs awaiting a site
admin's approval among what is left out (the engine never sees them)."""

from __future__ import annotations

from portal.fleet import services as fleet_services
from portal.fleet.models import Gpu, Node
from portal.reservations.models import Reservation
from portal.reservations.states import State
from scheduler.core import Reason, ReasonCode, Request
from wire.agent_portal import GpuInfo


def _submit(client_for, reservation_body, **body) -> int:
    response = client_for("alice").post("/api/v1/reservations/", reservation_body(**body), format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def _report_one_more_t4() -> None:
    """The T4 node's agent reports a third T4 the inventory does not have: recorded awaiting approval."""
    node = Node.objects.get(name="t4-node-1")
    known = [GpuInfo(index=g.index, uuid=g.uuid, model=g.model, memory_mib=g.memory_mib, numa_node=0,
                     nvlink_peers=[], mig_mode="disabled") for g in Gpu.objects.filter(node=node)]
    extra = GpuInfo(index=2, uuid="GPU-t4-node-1-extra", model="T4",
                    memory_mib=15360, numa_node=0, nvlink_peers=[], mig_mode="disabled")
    fleet_services.reconcile_gpus(node, [*known, extra])


def test_waiting_for_a_t4_says_so_in_the_users_words(client_for, reservation_body, placement_loop):
    _report_one_more_t4()
    for _ in range(2):  # both T4s taken
        _submit(client_for, reservation_body, gpu_model="T4", gpu_request=0.75, gpu_memory_mib=1024)
    placement_loop()
    rid = _submit(client_for, reservation_body, gpu_model="T4", gpu_request=0.5, gpu_memory_mib=1024)
    placement_loop()
    r = Reservation.objects.get(pk=rid)
    assert r.state == State.PENDING
    others = Gpu.objects.exclude(model="T4").count()
    assert r.state_reason.startswith(
        "no T4 GPU has room: 2 have less than 0.5 of a GPU free; "
        f"left out: {others} GPUs of other models, 1 GPU awaiting a site admin's approval"), r.state_reason
    assert "GPU(s)" not in r.state_reason


def test_wording_of_each_rule():
    from portal.placement.reasons import waiting_text

    req = Request(id="1", team="vision", gpu_request=0.3, gpu_memory_mib=8192, gpu_model="A100-80GB",
                  exclusion=frozenset({"secure"}))
    text = waiting_text([
        Reason(ReasonCode.NODE_NOT_READY, "engine words", 1),
        Reason(ReasonCode.MODEL, "engine words", 10),
        Reason(ReasonCode.EXCLUSION, "engine words", 2),
        Reason(ReasonCode.MEMORY, "engine words", 1),
        Reason(ReasonCode.NO_FIT, "engine words", 0),
    ], req, awaiting=2)
    assert text == ("no A100-80GB GPU has room: 2 hold shares of another exclusion group than yours (secure), "
                    "1 has less than 8 GiB of GPU memory free; left out: 1 GPU on a draining or lost node, "
                    "10 GPUs of other models, 2 GPUs awaiting a site admin's approval")
    quota = waiting_text([Reason(ReasonCode.QUOTA, "over team vision's quota of 2 GPUs")], req)
    assert quota == "over team vision's quota of 2 GPUs"


def test_the_estimates_words_count_gpus_as_people_do():
    from portal.placement.reasons import estimate_words

    assert estimate_words("the 2 ready GPU(s) of model T4 that could take it are held") == \
        "the 2 ready T4 GPUs that could take it are held"
    assert estimate_words("the 1 ready GPU(s) of any model that could") == "the 1 ready GPU that could"
    assert estimate_words("the 3 ready GPU(s) of model A|B that") == "the 3 ready A or B GPUs that"


def test_the_request_pages_preview_speaks_the_same_words(client_for, reservation_body, placement_loop, people):
    from django.test import Client

    _report_one_more_t4()
    for _ in range(2):
        _submit(client_for, reservation_body, gpu_model="T4", gpu_request=0.75, gpu_memory_mib=1024)
    placement_loop()
    page = Client()
    page.force_login(people["alice"])
    body = page.get("/reservations/new/preview/", {
        "team": "vision", "kind": "interactive", "image": "busybox:1", "command": "", "gpu_model": "T4",
        "gpu_request": "0.5", "gpu_limit": "", "memory_gib": "1", "gpu_count": "1", "hours": "",
        "priority": "50"}).content.decode()
    assert 'data-fits="no"' in body
    assert "2 T4 GPUs have less than 0.5 of a GPU free" in body
    assert "1 GPU awaiting a site admin&#x27;s approval" in body and "GPU(s)" not in body
