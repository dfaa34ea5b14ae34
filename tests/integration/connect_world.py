"""A running notebook reservation for the Connect tests: made through the services and bound
through the real bind path on the simulated cluster, whose pod runs a real jupyter-server; and a
real kernel run through the proxy (Jupyter's REST API and its kernel WebSocket)."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from pathlib import Path

import httpx
from websockets.sync.client import connect

from scheduler.backends import PodRef
from tests.integration.conftest import INVENTORY
from tests.teams import make_team
from tests.waiting import wait_for


def notebook_world(settings, tmp: Path) -> dict:
    """Teams vision (alice: member, owner of the notebook; carol: team admin) and nlp (bob)."""
    from django.contrib.auth import get_user_model

    from portal.fleet import inventory
    from portal.placement.backend import forget_backends, get_backend
    from portal.reservations import rules, services
    from portal.reservations.models import Reservation
    from portal.reservations.states import State
    from portal.tenancy.models import Membership, Role

    settings.TESSERA_LOCAL_STATE = str(tmp / "cluster.sqlite3")
    settings.TESSERA_LOCAL_START_S = 0.0
    forget_backends()
    inventory.load(INVENTORY)
    users = get_user_model().objects
    teams = {slug: make_team(slug, quota_gpu_share=Decimal(4), quota_memory_mib=500_000, quota_max_gpus=8)
             for slug in ("vision", "nlp")}
    people = {name: users.create_user(name, password="x") for name in ("alice", "bob", "carol")}
    Membership.objects.create(user=people["alice"], team=teams["vision"], role=Role.MEMBER)
    Membership.objects.create(user=people["carol"], team=teams["vision"], role=Role.ADMIN)
    Membership.objects.create(user=people["bob"], team=teams["nlp"], role=Role.MEMBER)
    r = services.submit(people["alice"], rules.ReservationSpec(
        team=teams["vision"], image="jupyter/base-notebook:latest", gpu_request=Decimal("0.5"),
        gpu_memory_mib=4096, kind="interactive", app="jupyter"))
    # The tests run Celery eagerly: the submit's cycle placed it and bound its pod (on `backend`,
    # which started the pod's notebook server); the pod watch is not running, so say it runs.
    backend = get_backend()
    wait_for(lambda: Reservation.objects.filter(pk=r.pk, state=State.PLACED).exists(), 10, "the placement")
    placed = Reservation.objects.get(pk=r.pk)
    assert backend.pod_env(PodRef(placed.pod_namespace, placed.pod_name))["TESSERA_APP"] == "jupyter"
    assert services.move(r.pk, State.PLACED, State.RUNNING, "its pod runs", "test")
    return {"teams": teams, "people": people, "reservation": Reservation.objects.get(pk=r.pk), "backend": backend,
            "cluster": {"TESSERA_LOCAL_STATE": settings.TESSERA_LOCAL_STATE, "TESSERA_LOCAL_START_S": "0"}}


def wait_for_app(base: str, reservation_id: int, cookie: str, timeout: float = 60.0) -> None:
    """Until the notebook answers through the proxy (the server takes a few seconds to start)."""
    def up() -> bool:
        answer = httpx.get(f"{base}/connect/{reservation_id}/api/status", headers={"Cookie": cookie}, timeout=5)
        return answer.status_code == 200
    wait_for(up, timeout, "the notebook to answer through the proxy", every=0.3)


def execute_request(code: str) -> dict:
    return {"header": {"msg_id": uuid.uuid4().hex, "username": "test", "session": uuid.uuid4().hex,
                       "msg_type": "execute_request", "version": "5.3", "date": ""},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True}}


def run_in_kernel(http_base: str, ws_base: str, reservation_id: int, cookie: str, code: str) -> str:
    """Start a kernel through the proxy, run `code` over its WebSocket, answer what it printed."""
    prefix = f"/connect/{reservation_id}"
    kernel = httpx.post(f"{http_base}{prefix}/api/kernels", json={"name": "python3"},
                        headers={"Cookie": cookie, "Origin": http_base}, timeout=30)
    assert kernel.status_code == 201, kernel.text
    kernel_id = kernel.json()["id"]
    request = execute_request(code)
    printed = []
    with connect(f"{ws_base}{prefix}/api/kernels/{kernel_id}/channels",
                 additional_headers={"Cookie": cookie, "Origin": http_base}, open_timeout=30) as ws:
        ws.send(json.dumps(request))
        while True:
            message = json.loads(ws.recv(timeout=60))
            if message.get("parent_header", {}).get("msg_id") != request["header"]["msg_id"]:
                continue
            if message["msg_type"] == "stream":
                printed.append(message["content"]["text"])
            if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
                break
    return "".join(printed)
