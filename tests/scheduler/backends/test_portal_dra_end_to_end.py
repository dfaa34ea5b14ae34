"""A portal reservation through DRA, end to end through the portal's tasks: with our DeviceClasses on
the cluster (TESSERA_KUBERNETES_SHARING=auto), a reservation of 0.4 of a GPU with 12 GiB becomes a pod
with a ResourceClaim of that share, allocated to the placed GPU and reserved for the pod before its
Binding; the node's DRA driver prepares it with the reservation's terms; when the reservation ends,
its pod goes and its claim with it."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from agents.dra import dra_pb2
from agents.dra.plugin import DraService, KubernetesClaims
from agents.dra.slices import MIB, SliceApi, SlicePublisher
from agents.gpus.simulated import SimulatedSource
from agents.placements import PlacementTable
from scheduler.backends.kubernetes.manifests import SHARE_RESOURCE
from wire.inventory import load_inventory

from .test_kubectl_end_to_end import INVENTORY, portal_on_kubernetes, sync_until  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db
DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "dra"


@pytest.fixture
def dra_portal(portal_on_kubernetes, apiserver, settings):  # noqa: F811 - the fixture imported above
    """deploy/dra applied: the DeviceClasses, and each node's driver has published its GPUs."""
    from django.contrib.auth import get_user_model

    from portal.tenancy.models import Membership, Role, Team

    for doc in yaml.safe_load_all((DEPLOY / "deviceclasses.yaml").read_text()):
        if doc:
            apiserver.put_object(doc)
    devices = {}
    for node in load_inventory(INVENTORY):
        devices[node.name] = SimulatedSource(node, PlacementTable({g.uuid for g in node.gpus})).devices()
        SlicePublisher(SliceApi(host=apiserver.url), node.name).sync(devices[node.name])
    settings.TESSERA_KUBERNETES_SHARING = "auto"
    alice = get_user_model().objects.create_user("alice", password="pw-alice")
    Membership.objects.create(user=alice, team=Team.objects.get(slug="vision"), role=Role.MEMBER)
    return alice, devices


def test_a_portal_reservation_gets_an_allocated_claim_and_loses_it_when_it_ends(dra_portal, portal_on_kubernetes,  # noqa: F811
                                                                              apiserver, tmp_path):
    from portal.placement import tasks
    from portal.reservations import services
    from portal.reservations.models import Reservation
    from portal.reservations.rules import ReservationSpec
    from portal.tenancy.models import Team

    alice, devices = dra_portal
    r = services.submit(alice, ReservationSpec(team=Team.objects.get(slug="vision"), image="ghcr.io/example/train:1",
                                               gpu_request=Decimal("0.4"), gpu_memory_mib=12288, priority=40))
    portal_on_kubernetes()
    r = Reservation.objects.select_related("node").get(pk=r.pk)
    (gpu,) = [a.gpu for a in r.allocations.filter(released_at__isnull=True).select_related("gpu")]
    pod = apiserver.pod(r.pod_namespace, r.pod_name)
    assert pod["spec"]["nodeName"] == r.node.name
    (container,) = pod["spec"]["containers"]
    assert SHARE_RESOURCE not in (container["resources"].get("limits") or {})  # no device-plugin slot
    ((ref,),) = [pod["spec"]["resourceClaims"]]
    claim = next(c for c in apiserver.objects("ResourceClaim") if c["metadata"]["name"] == ref["resourceClaimName"])
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"] == {
        "compute": "400", "memory": str(12288 * MIB)}
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"]) == (r.node.name, f"gpu-{gpu.index}")
    assert result["consumedCapacity"] == {"compute": "400", "memory": str(12288 * MIB)}
    assert [c["uid"] for c in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]

    # The kubelet on that node prepares the claim: the container gets the reservation's share.
    service = DraService(r.node.name, devices[r.node.name], KubernetesClaims(host=apiserver.url),
                         state_dir=tmp_path, cdi_dir=tmp_path)
    uid = claim["metadata"]["uid"]
    answer = service.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=[dra_pb2.Claim(
        namespace=r.pod_namespace, name=claim["metadata"]["name"], uid=uid)]), None)
    assert answer.claims[uid].error == ""
    spec = json.loads((tmp_path / f"gpu.tessera.io-share_{uid}.json").read_text())
    env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["TESSERA_SHARE_ID"], env["TESSERA_GPU_REQUEST"],
            env["TESSERA_GPU_MEMORY_LIMIT"]) == (gpu.uuid, str(r.pk), "0.4", "12288Mi")

    apiserver.set_pod_phase(r.pod_namespace, r.pod_name, "Running")
    sync_until(lambda: Reservation.objects.get(pk=r.pk).state == "running")
    services.cancel(r.pk, alice)
    tasks.housekeeping()
    assert apiserver.pod(r.pod_namespace, r.pod_name) is None
    assert [c for c in apiserver.objects("ResourceClaim") if c["metadata"]["uid"] == uid] == []
