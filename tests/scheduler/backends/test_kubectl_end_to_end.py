"""The kubectl path end to end on the cluster side: an unchanged KubeShare pod (given its share-slot
resource by the mutating webhook) is picked up by the portal's placement cycle through the kubernetes
backend, placed, annotated and bound on the (fake) API server; the device plugin on its node then
hands the container exactly that GPU and share; the pod's phases come back through the watch as the
reservation's states. A pod with a wrong label gets a Warning Event and stays pending."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from pathlib import Path

import pytest

from agents.deviceplugin import api_pb2
from agents.deviceplugin.pods import KubernetesPods, PodFinder
from agents.deviceplugin.server import DevicePluginService, PluginConfig
from agents.gpus.simulated import SimulatedSource
from agents.placements import PlacementTable
from scheduler.backends.base import PLACEMENT_ANNOTATION, RESERVATION_LABEL
from scheduler.backends.kubernetes.webhook import share_patch
from tests.scheduler.backends.portal_on_fake_cluster import point_portal_at
from tests.teams import make_team
from wire.inventory import load_inventory, pick_node

pytestmark = pytest.mark.django_db

INVENTORY = Path(__file__).resolve().parents[3] / "deploy" / "inventory" / "demo.yaml"


@pytest.fixture
def portal_on_kubernetes(settings, apiserver, tmp_path, monkeypatch, django_capture_on_commit_callbacks):
    """The portal configured as in deploy/portal (TESSERA_BACKEND=kubernetes), its kubeconfig
    pointing at the fake API server; Celery tasks run in-process."""
    from portal.celery import app as celery_app
    from portal.fleet import inventory
    from portal.placement import backend as backend_module

    point_portal_at(apiserver, settings, tmp_path, monkeypatch)
    eager = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    inventory.load(INVENTORY)
    for node in load_inventory(INVENTORY):
        apiserver.add_node(node.name)
    make_team("vision", "Vision", namespace="team-vision", quota_gpu_share=Decimal("4"),
                        quota_memory_mib=400_000, quota_max_gpus=4, allow_over_quota=True)
    backend_module.forget_backends()

    def cycle():
        from portal.placement import tasks

        with django_capture_on_commit_callbacks(execute=True):
            tasks.housekeeping()
            tasks.run_cycles("test")

    yield cycle
    backend_module.forget_backends()
    celery_app.conf.task_always_eager = eager


def kubectl_pod(name, **labels):
    """A KubeShare 2.0 manifest as users already have them: labels and the scheduler name, nothing else."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team-vision", "labels": labels},
            "spec": {"schedulerName": "tessera", "containers": [
                {"name": "nb", "image": "jupyter/base-notebook:2025-01"}]}}


def sync_until(predicate, timeout_s=15.0):
    from portal.placement import tasks

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        tasks.sync(0.3)
        if predicate():
            return
    raise AssertionError("timed out waiting for the cluster's events to arrive")


def test_a_kubectl_pod_is_placed_bound_allocated_and_followed(portal_on_kubernetes, apiserver):
    from portal.reservations.models import Reservation, Source

    apiserver.pod_mutators.append(share_patch)  # the webhook of deploy/portal/webhook.yaml
    apiserver.create_pod(kubectl_pod("notebook", **{"sharedgpu/gpu_request": "0.5", "sharedgpu/gpu_limit": "1.0",
                                                     "sharedgpu/gpu_mem": "4Gi", "sharedgpu/gpu_model": "T4"}))
    portal_on_kubernetes()

    r = Reservation.objects.select_related("node").get(source=Source.KUBECTL, pod_name="notebook")
    (gpu,) = [a.gpu for a in r.allocations.filter(released_at__isnull=True).select_related("gpu")]
    pod = apiserver.pod("team-vision", "notebook")
    assert pod["spec"]["nodeName"] == r.node.name == "t4-node-1"
    # Marked by the webhook at creation (empty label, so the watch follows it), bound in one write:
    # the Binding carried the placement onto the pod.
    assert pod["metadata"]["labels"][RESERVATION_LABEL] == ""
    assert not apiserver.calls("PATCH", r"/namespaces/team-vision/pods/notebook$")
    assert len(apiserver.calls("POST", r"/namespaces/team-vision/pods/notebook/binding$")) == 1
    placement = json.loads(pod["metadata"]["annotations"][PLACEMENT_ANNOTATION])
    assert placement["gpus"] == [gpu.uuid] and placement["request"] == 0.5 and placement["memory_mib"] == 4096

    # The kubelet on t4-node-1 admits the pod: the device plugin gives the container its share.
    node = pick_node(load_inventory(INVENTORY), "t4-node-1", str(INVENTORY))
    gpus = SimulatedSource(node, PlacementTable({g.uuid for g in node.gpus})).devices()
    service = DevicePluginService(PluginConfig(node="t4-node-1", gpus=gpus),
                                  PodFinder(KubernetesPods(host=apiserver.url), "t4-node-1", "tessera.io/gpu-share"))

    class Context:
        def abort(self, code, details):
            raise AssertionError(f"allocate refused: {details}")

    answer = service.Allocate(api_pb2.AllocateRequest(container_requests=[
        api_pb2.ContainerAllocateRequest(devices_ids=[f"{gpus[0].uuid}::0"])]), Context())
    envs = dict(answer.container_responses[0].envs)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == gpu.uuid and envs["TESSERA_SHARE_ID"] == str(r.pk)
    assert envs["TESSERA_GPU_REQUEST"] == "0.5" and envs["TESSERA_GPU_MEMORY_LIMIT"] == "4096Mi"

    # Its phases come back through the watch as the reservation's states.
    apiserver.set_pod_phase("team-vision", "notebook", "Running")
    sync_until(lambda: Reservation.objects.get(pk=r.pk).state == "running")
    apiserver.set_pod_phase("team-vision", "notebook", "Succeeded")
    sync_until(lambda: Reservation.objects.get(pk=r.pk).state == "succeeded")


def test_a_kubectl_pod_with_a_wrong_label_gets_an_event_and_stays_pending(portal_on_kubernetes, apiserver):
    from portal.reservations.models import Reservation

    apiserver.create_pod(kubectl_pod("typo", **{"sharedgpu/gpu_reqest": "0.5"}))
    portal_on_kubernetes()
    portal_on_kubernetes()  # a second cycle neither admits it nor repeats the event
    (event,) = apiserver.events()
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "typo"
    assert "sharedgpu/gpu_reqest" in event["message"]
    assert "nodeName" not in apiserver.pod("team-vision", "typo")["spec"]
    assert not Reservation.objects.filter(pod_name="typo").exists()
