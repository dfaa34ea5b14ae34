"""Adaptive sharing in the placement cycle: a request whose pod finds no room on any GPU node runs
on a CPU-only node with a share of a GPU elsewhere, over the best measured link, when it and its
team allow it; the reason is on the reservation and its page."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from portal.fleet.models import Node, NodeLink
from portal.placement import memo
from portal.reservations.models import Reservation
from portal.reservations.states import State
from portal.tenancy.models import TeamPolicy
from scheduler.backends import PodRef
from tests.invariants import live_shares_ok
from wire import share_tokens as tokens


def _fleet_with_cpu_nodes(settings, cluster):
    """The GPU nodes have no CPU left for a pod; two CPU-only nodes do."""
    settings.TESSERA_POD_CPU_MILLI = 1000
    cluster.add_nodes(["cpu-near", "cpu-far"])
    Node.objects.exclude(gpus=None).update(cpu_milli=500, memory_mib=65536)
    near = Node.objects.create(name="cpu-near", cpu_milli=16000, memory_mib=65536)
    far = Node.objects.create(name="cpu-far", cpu_milli=16000, memory_mib=65536)
    t4 = Node.objects.get(name="t4-node-1")
    now = timezone.now()
    NodeLink.objects.create(client=far, gpu_node=t4, rtt_ms=1.5, bandwidth_mbps=2000, measured_at=now)
    NodeLink.objects.create(client=near, gpu_node=t4, rtt_ms=0.1, bandwidth_mbps=25000, measured_at=now)
    return near, far, t4


def _submit(client, body) -> int:
    r = client.post("/api/v1/reservations/", body, format="json")
    assert r.status_code == 201, r.content
    return r.json()["id"]


def test_cpu_only_node_runs_a_remote_share_over_the_best_link(settings, client_for, reservation_body, teams, people,
                                                              cluster, placement_loop, tmp_path):
    _near, _far, t4 = _fleet_with_cpu_nodes(settings, cluster)
    secret = b"t4-node-1 secret, 32 bytes long.."
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "t4-node-1").write_bytes(secret + b"\n")
    settings.TESSERA_REMOTE_SECRETS_DIR = str(tmp_path / "secrets")
    TeamPolicy.objects.create(team=teams["vision"], allow_remote=True)
    alice = client_for("alice")
    rid = _submit(alice, reservation_body(gpu_request=0.25, gpu_memory_mib=4096, gpu_model="T4",
                                          remote_allowed=True))
    stays = _submit(alice, reservation_body(gpu_request=0.25, gpu_memory_mib=4096, gpu_model="T4"))
    placement_loop()

    body = alice.get(f"/api/v1/reservations/{rid}/").json()
    assert body["state"] == "running", body
    assert (body["sharing"], body["client_node"], body["node"]) == ("remote", "cpu-near", "t4-node-1")
    assert body["sharing_reason"].startswith("no GPU node has room for the pod itself; a 0.25 share of GPU ")
    assert "on t4-node-1, used remotely from cpu-near over 25,000 Mbit/s, 0.1 ms" in body["sharing_reason"]
    [alloc] = body["allocations"]
    assert alloc["gpu_uuid"] in {g.uuid for g in t4.gpus.all()}
    r = Reservation.objects.get(pk=rid)
    pod = {p.name: p for p in cluster.list_pods()}[r.pod_name]
    assert pod.node == "cpu-near"  # the pod runs where there is room for it; its GPU is on t4-node-1
    # The client pod gets the client libraries, the GPU node's server and a token for exactly this share.
    env = cluster.pod_env(PodRef(r.pod_namespace, r.pod_name))
    assert env["TESSERA_REMOTE_SERVER"] == "t4-node-1:7470"
    assert env["LD_LIBRARY_PATH"] == "/opt/tessera/remote/client" and env["TESSERA_SHARE_ID"] == str(rid)
    assert "NVIDIA_VISIBLE_DEVICES" not in env and "LD_PRELOAD" not in env  # no GPU on this node
    terms, _expires = tokens.verify(secret, env["TESSERA_REMOTE_TOKEN"])
    assert (terms.share, terms.gpu, terms.memory_bytes, terms.request) == (str(rid), alloc["gpu_uuid"], 4096 << 20,
                                                                          0.25)
    with pytest.raises(tokens.TokenError):
        tokens.verify(b"another node's secret, 32 bytes", env["TESSERA_REMOTE_TOKEN"])
    log = cluster.pod_log(PodRef(r.pod_namespace, r.pod_name))
    assert "started: remote share through t4-node-1:7470 (client libraries in /opt/tessera/remote/client)" in log
    assert live_shares_ok() == []

    # Not allowed remote: it waits, saying why.
    waiting = alice.get(f"/api/v1/reservations/{stays}/").json()
    assert waiting["state"] == "pending" and waiting["sharing"] == ""
    assert "CPU" in waiting["state_reason"], waiting["state_reason"]

    page = Client()
    page.force_login(people["alice"])
    html = page.get(f"/reservations/{rid}/").content.decode()
    assert "Remote share:" in html and "used remotely from cpu-near" in html
    assert "Pod runs on" in html and "cpu-near" in html and "GPU node" in html

    # The fleet view shows it as a remote share: client node → GPU.
    admin = Client()
    admin.force_login(people["admin"])
    fleet = admin.get("/fleet/?node=t4-node-1").content.decode()
    gpu_index = r.sharing_reason.split("share of GPU ")[1].split(" ")[0]
    assert (f'<li><a href="/reservations/{rid}/">#{rid}</a> remote: cpu-near → GPU {gpu_index}</li>') in fleet
    assert f"#{rid} alice (vision): 0.25 of the GPU, 4 GiB, running, remote from cpu-near" in fleet


def test_remote_waits_when_the_team_does_not_allow_it_or_no_link_is_good(settings, client_for, reservation_body,
                                                                         teams, cluster, placement_loop):
    near, far, _t4 = _fleet_with_cpu_nodes(settings, cluster)
    carol = client_for("carol")  # vision's team admin

    def allow_remote(allowed: bool) -> None:
        answer = carol.patch("/api/v1/teams/vision/policy/", {"allow_remote": allowed}, format="json")
        assert answer.status_code == 200, answer.content

    allow_remote(True)
    rid = _submit(client_for("alice"), reservation_body(gpu_request=0.25, gpu_memory_mib=4096, gpu_model="T4",
                                                        remote_allowed=True))
    # The team turned remote shares off after the request was admitted with them allowed.
    allow_remote(False)
    placement_loop()
    assert Reservation.objects.get(pk=rid).state == State.PENDING

    allow_remote(True)
    NodeLink.objects.filter(client=near).update(measured_at=timezone.now() - timedelta(days=1))  # stale
    NodeLink.objects.filter(client=far).update(bandwidth_mbps=100)  # too slow for a remote share
    memo.bump()  # what was known not to fit is looked at again
    placement_loop()
    r = Reservation.objects.get(pk=rid)
    assert r.state == State.PENDING and r.sharing == ""
    # The stale link (the good one) is not used; the slow one is measured but too slow.
    assert "CPU left" in r.state_reason and "remote: no local room; 2 measured link(s) to GPUs with room are " \
        "below 1000 Mbit/s or above 2 ms" in r.state_reason, r.state_reason


def test_local_placements_say_how_they_share(client_for, reservation_body, cluster, placement_loop):
    alice = client_for("alice")
    share = _submit(alice, reservation_body(gpu_request=0.5, gpu_memory_mib=4096, gpu_model="T4"))
    whole = _submit(alice, reservation_body(gpu_request=1, gpu_memory_mib=4096, gpu_model="T4"))
    placement_loop()
    a, b = Reservation.objects.get(pk=share), Reservation.objects.get(pk=whole)
    assert a.sharing == "local" and a.client_node is None
    assert a.sharing_reason.startswith("a 0.5 share of GPU ") and a.sharing_reason.endswith(", where the pod runs")
    assert b.sharing == "exclusive" and b.sharing_reason.startswith("a whole GPU (")
    env = cluster.pod_env(PodRef(a.pod_namespace, a.pod_name))
    assert env["TESSERA_SHARE_ID"] == str(share)


def test_a_gpu_node_without_a_secret_fails_the_remote_share_saying_what_to_add(settings, client_for, reservation_body,
                                                                              teams, cluster, placement_loop,
                                                                              tmp_path):
    _fleet_with_cpu_nodes(settings, cluster)
    settings.TESSERA_REMOTE_SECRETS_DIR = str(tmp_path)
    TeamPolicy.objects.create(team=teams["vision"], allow_remote=True)
    rid = _submit(client_for("alice"), reservation_body(gpu_request=0.25, gpu_memory_mib=4096, gpu_model="T4",
                                                        remote_allowed=True))
    placement_loop()
    r = Reservation.objects.get(pk=rid)
    assert r.state == State.FAILED
    assert f"no remote-share secret for node t4-node-1 in {tmp_path}: add the key t4-node-1" in r.state_reason
    assert live_shares_ok() == []


def test_a_link_reported_later_places_a_request_the_cycle_had_set_aside(settings, client_for, reservation_body,
                                                                        teams, cluster, placement_loop, lock_redis,
                                                                        tmp_path, django_capture_on_commit_callbacks):
    from portal.fleet.links import store_links
    from wire.agent_portal import Links

    settings.TESSERA_LOCK_REDIS_URL = lock_redis  # the memo of what did not fit lives in Redis
    settings.TESSERA_REMOTE_SECRETS_DIR = str(tmp_path)
    (tmp_path / "t4-node-1").write_text("t4-node-1 secret, 32 bytes long..")
    near, _far, _t4 = _fleet_with_cpu_nodes(settings, cluster)
    NodeLink.objects.all().delete()  # nothing measured yet
    TeamPolicy.objects.create(team=teams["vision"], allow_remote=True)
    rid = _submit(client_for("alice"), reservation_body(gpu_request=0.25, gpu_memory_mib=4096, gpu_model="T4",
                                                        remote_allowed=True))
    placement_loop()
    assert Reservation.objects.get(pk=rid).state == State.PENDING
    assert str(rid) in memo.load()[1]  # set aside until something changes
    now_ms = int(timezone.now().timestamp() * 1000)
    report = Links.model_validate({"v": 1, "type": "links", "links": [
        {"gpu_node": "t4-node-1", "rtt_ms": 0.2, "bandwidth_mbps": 20000.0, "ts_ms": now_ms}]})
    with django_capture_on_commit_callbacks(execute=True):  # as when the agent's report commits
        store_links(near, report)
    placement_loop()
    r = Reservation.objects.get(pk=rid)
    assert (r.state, r.sharing, r.client_node_id) == (State.RUNNING, "remote", near.pk), r.state_reason
