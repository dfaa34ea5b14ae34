"""The DRA path end to end on the cluster side: a pod whose claim (made from the example template:
0.4 of a GPU, 12 GiB) names gpu-share.tessera.io is placed by the portal's placement cycle like a
KubeShare pod; its claim gets the allocation (the reservation's GPU, consumedCapacity, reservedFor)
and the pod its Binding; the DRA driver on the node prepares the claim with the reservation's terms;
the pod's phases come back as the reservation's states."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agents.dra import dra_pb2
from agents.dra.plugin import DraService, KubernetesClaims
from agents.dra.slices import MIB, SliceApi, SlicePublisher
from agents.gpus.simulated import SimulatedSource
from agents.placements import PlacementTable
from scheduler.backends.kubernetes.webhook import share_patch
from tests.scheduler.backends.test_kubectl_end_to_end import INVENTORY, portal_on_kubernetes, sync_until
from wire.inventory import load_inventory

pytestmark = pytest.mark.django_db
EXAMPLES = Path(__file__).resolve().parents[3] / "deploy" / "dra" / "examples"
__all__ = ["portal_on_kubernetes"]  # the fixture, shared with the device-plugin path's test


def test_a_pod_with_a_share_claim_is_placed_allocated_prepared_and_followed(portal_on_kubernetes, apiserver,
                                                                            tmp_path):
    from portal.reservations.models import Reservation, Source

    devices = {}
    for node in load_inventory(INVENTORY):  # each node's DRA driver has published its GPUs
        devices[node.name] = SimulatedSource(node, PlacementTable({g.uuid for g in node.gpus})).devices()
        SlicePublisher(SliceApi(host=apiserver.url), node.name).sync(devices[node.name])
    apiserver.pod_mutators.append(share_patch)  # the webhook of deploy/portal/webhook.yaml
    template, pod = [d for d in yaml.safe_load_all((EXAMPLES / "share.yaml").read_text()) if d]
    apiserver.put_object(template)
    apiserver.create_pod(pod)
    (claim,) = apiserver.make_template_claims("team-vision", "notebook")  # the resourceclaim controller
    portal_on_kubernetes()

    r = Reservation.objects.select_related("node").get(source=Source.KUBECTL, pod_name="notebook")
    assert (str(r.gpu_request), r.gpu_memory_mib) == ("0.400", 12288)
    (gpu,) = [a.gpu for a in r.allocations.filter(released_at__isnull=True).select_related("gpu")]
    assert apiserver.pod("team-vision", "notebook")["spec"]["nodeName"] == r.node.name
    claim = next(c for c in apiserver.objects("ResourceClaim") if c["metadata"]["name"] == claim["metadata"]["name"])
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"]) == (r.node.name, f"gpu-{gpu.index}")
    assert result["consumedCapacity"] == {"compute": "400", "memory": str(12288 * MIB)}
    assert [c["name"] for c in claim["status"]["reservedFor"]] == ["notebook"]

    # The kubelet on that node prepares the claim: the container gets the reservation's share.
    service = DraService(r.node.name, devices[r.node.name], KubernetesClaims(host=apiserver.url),
                         state_dir=tmp_path, cdi_dir=tmp_path)
    uid = claim["metadata"]["uid"]
    answer = service.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=[dra_pb2.Claim(
        namespace="team-vision", name=claim["metadata"]["name"], uid=uid)]), None)
    assert answer.claims[uid].error == ""
    spec = json.loads((tmp_path / f"gpu.tessera.io-share_{uid}.json").read_text())
    env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["TESSERA_SHARE_ID"], env["TESSERA_GPU_REQUEST"],
            env["TESSERA_GPU_MEMORY_LIMIT"]) == (gpu.uuid, str(r.pk), "0.4", "12288Mi")

    apiserver.set_pod_phase("team-vision", "notebook", "Running")
    sync_until(lambda: Reservation.objects.get(pk=r.pk).state == "running")
