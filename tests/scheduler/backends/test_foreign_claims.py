"""Pods left to the default kube-scheduler that name our DeviceClasses: the kube-scheduler allocates
their claims from our ResourceSlices itself. Housekeeping reads those allocations and every cycle
counts them as used room on their GPUs, so our cycle never places a reservation into a GPU the
kube-scheduler already gave away; our own allocations are not counted twice; room the kube-scheduler
frees is ours again. Each is charged to the team of its namespace (its quota and fair share, and the
usage reports' allocated GPU-hours), or to the reports' unattributed row where no team has it. A
cluster without resource.k8s.io/v1 is not asked for claims on every housekeeping run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from agents.dra.slices import MIB, SliceApi, SlicePublisher
from agents.gpus.simulated import SimulatedSource
from agents.placements import PlacementTable
from scheduler.backends.kubernetes.dra import ForeignShare, foreign_shares, share_id
from wire.inventory import load_inventory

from .test_kubectl_end_to_end import INVENTORY, portal_on_kubernetes  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db
DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "dra"
NODE = "t4-node-1"  # two T4s


@pytest.fixture
def dra_fleet(portal_on_kubernetes, apiserver, settings):  # noqa: F811 - the fixture imported above
    from django.contrib.auth import get_user_model
    from django.core.cache import cache

    from portal.placement import foreign_claims
    from portal.tenancy.models import Membership, Role, Team

    for doc in yaml.safe_load_all((DEPLOY / "deviceclasses.yaml").read_text()):
        if doc:
            apiserver.put_object(doc)
    for node in load_inventory(INVENTORY):
        devices = SimulatedSource(node, PlacementTable({g.uuid for g in node.gpus})).devices()
        SlicePublisher(SliceApi(host=apiserver.url), node.name).sync(devices)
    settings.TESSERA_KUBERNETES_SHARING = "auto"
    cache.delete(foreign_claims.CACHE_KEY)
    alice = get_user_model().objects.create_user("alice", password="pw-alice")
    Membership.objects.create(user=alice, team=Team.objects.get(slug="vision"), role=Role.MEMBER)
    yield alice
    cache.delete(foreign_claims.CACHE_KEY)


def kube_scheduler_claim(apiserver, name: str, device: str, consumed: dict | None,
                         namespace: str = "team-vision") -> dict:
    """A claim of a pod left to the default kube-scheduler, as the kube-scheduler allocates it."""
    claim = apiserver.put_object({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu-share.tessera.io" if consumed else "gpu-whole.tessera.io"}}]}}})
    result = {"request": "gpu", "driver": "gpu.tessera.io", "pool": NODE, "device": device,
              "shareID": f"6f1c2a40-0000-4000-8000-00000000000{len(name)}"}
    if consumed:
        result["consumedCapacity"] = consumed
    claim["status"] = {"allocation": {"devices": {"results": [result]}},
                       "reservedFor": [{"resource": "pods", "name": name, "uid": f"uid-of-{name}"}]}
    return apiserver.put_object(claim)


def submit(user, share: str, memory_mib: int):
    from portal.reservations import services
    from portal.reservations.rules import ReservationSpec
    from portal.tenancy.models import Team

    return services.submit(user, ReservationSpec(team=Team.objects.get(slug="vision"), image="ghcr.io/example/nb:1",
                                                 gpu_request=Decimal(share), gpu_memory_mib=memory_mib,
                                                 gpu_model="T4", priority=40))


def test_our_cycle_never_places_into_room_the_kube_scheduler_allocated(dra_fleet, portal_on_kubernetes,  # noqa: F811
                                                                       apiserver):
    from portal.placement import foreign_claims
    from portal.placement.backend import get_backend
    from portal.reservations.models import Reservation

    kube_scheduler_claim(apiserver, "whole", "gpu-0", None)  # a whole T4
    partial = kube_scheduler_claim(apiserver, "partial", "gpu-1", {"compute": "700", "memory": str(8192 * MIB)})
    r = submit(dra_fleet, "0.5", 4096)
    portal_on_kubernetes()  # housekeeping reads the claims, then the cycle runs
    r = Reservation.objects.get(pk=r.pk)
    assert r.state == "pending" and not r.allocations.exists()  # 0.3 of a T4 is left, nowhere 0.5

    small = submit(dra_fleet, "0.3", 4096)  # what is left of gpu-1 fits it, and only there
    portal_on_kubernetes()
    small = Reservation.objects.select_related("node").get(pk=small.pk)
    assert small.state in ("placed", "running") and small.node.name == NODE
    assert [a.gpu.index for a in small.allocations.select_related("gpu")] == [1]
    # The portal's own allocation (the claim of small's pod) is not counted a second time.
    assert foreign_claims.observe(get_backend()) == 2

    # The kube-scheduler's pod on gpu-0 ended: its claim is gone, the whole T4 is ours again.
    get_backend().claims.resource.delete_namespaced_resource_claim("whole", "team-vision")
    portal_on_kubernetes()
    r = Reservation.objects.select_related("node").get(pk=r.pk)
    assert r.state in ("placed", "running") and [a.gpu.index for a in r.allocations.select_related("gpu")] == [0]
    assert partial["status"]["allocation"]  # still held: nobody was placed onto gpu-1 beyond its room


def test_foreign_shares_are_what_other_allocators_took_of_our_devices():
    ours_uid = "3f0c6a52-0000-4000-8000-000000000001"
    claims = [
        {"metadata": {"namespace": "a", "name": "ours", "uid": ours_uid}, "status": {"allocation": {"devices": {
            "results": [{"driver": "gpu.tessera.io", "pool": "n1", "device": "gpu-0",
                         "shareID": share_id(ours_uid, "n1", 0), "consumedCapacity": {"compute": "400"}}]}}}},
        {"metadata": {"namespace": "a", "name": "theirs", "uid": "u2"}, "status": {"allocation": {"devices": {
            "results": [{"driver": "gpu.tessera.io", "pool": "n1", "device": "gpu-0", "shareID": "x",
                         "consumedCapacity": {"compute": "250", "memory": "4Gi"}},
                        {"driver": "gpu.tessera.io", "pool": "n1", "device": "gpu-1"},  # whole
                        {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-2"}]}}}},  # not ours
        {"metadata": {"namespace": "a", "name": "waiting", "uid": "u3"}, "status": {}},
    ]
    assert foreign_shares(claims) == [ForeignShare("n1", 0, 250, 4096, "a/theirs", "u2"),
                                      ForeignShare("n1", 1, 1000, None, "a/theirs", "u2")]


@pytest.mark.parametrize(("namespace", "admitted"), [("team-vision", "borrowed"), ("default", "guaranteed")])
def test_a_kube_scheduler_claim_counts_in_its_namespace_teams_quota(dra_fleet, portal_on_kubernetes,  # noqa: F811
                                                                    apiserver, namespace, admitted):
    """vision's quota is one GPU's compute: with 0.7 of a T4 held by a kube-scheduler pod in its
    namespace, its 0.5 request is beyond the quota (borrowed); held in a namespace of no team, the
    0.7 takes room but is nobody's quota, and the request is within vision's."""
    from portal.reservations.models import Reservation
    from portal.tenancy.models import Team
    from tests.teams import set_any_quota

    set_any_quota(Team.objects.get(slug="vision"), share=1)
    kube_scheduler_claim(apiserver, "theirs", "gpu-1", {"compute": "700", "memory": str(4096 * MIB)},
                         namespace=namespace)
    r = submit(dra_fleet, "0.5", 4096)
    portal_on_kubernetes()
    r = Reservation.objects.get(pk=r.pk)
    assert r.state in ("placed", "running") and r.admission == admitted
    assert [a.gpu.index for a in r.allocations.select_related("gpu")] == [0]  # gpu-1 has 0.3 left


def test_kube_scheduler_claims_count_as_allocated_gpu_hours_in_the_usage_report(dra_fleet, apiserver, client):
    """Held 2 hours: 0.7 of a T4 in vision's namespace, a whole T4 in a namespace of no team. The
    report by team gives vision 1.4 GPU-hours and the unattributed row 2 (site admins see it; the
    team's manager sees only the team's); by GPU each lands on its GPU."""
    from django.contrib.auth import get_user_model

    from portal.placement import foreign_claims
    from portal.placement.backend import get_backend
    from portal.placement.models import ForeignHold
    from portal.tenancy.models import Membership, Role, Team
    from tests.reservations import clock_at

    t0 = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)
    kube_scheduler_claim(apiserver, "theirs", "gpu-1", {"compute": "700", "memory": str(4096 * MIB)})
    kube_scheduler_claim(apiserver, "nobodys", "gpu-0", None, namespace="default")
    with clock_at(t0):
        assert foreign_claims.observe(get_backend()) == 2
    with clock_at(t0 + timedelta(hours=1)):
        assert foreign_claims.observe(get_backend()) == 2  # still held: the same rows, none new
    assert ForeignHold.objects.filter(released_at__isnull=True).count() == 2
    get_backend().claims.resource.delete_namespaced_resource_claim("theirs", "team-vision")
    get_backend().claims.resource.delete_namespaced_resource_claim("nobodys", "default")
    with clock_at(t0 + timedelta(hours=2)):
        assert foreign_claims.observe(get_backend()) == 0
    assert not ForeignHold.objects.filter(released_at__isnull=True).exists()

    def report(user, group_by):
        client.force_login(user)
        r = client.get("/api/v1/reports/usage/", {"since": (t0 - timedelta(hours=1)).isoformat(),
                                                  "until": (t0 + timedelta(hours=4)).isoformat(),
                                                  "group_by": group_by})
        assert r.status_code == 200, r.content
        return {row["key"]: row for row in r.json()["rows"]}

    admin = get_user_model().objects.create_user("root", password="pw-root", is_staff=True)
    rows = report(admin, "team")
    assert rows["vision"]["allocated_gpu_hours"] == rows["vision"]["kube_scheduler_gpu_hours"] == 1.4
    assert rows["(unattributed)"]["allocated_gpu_hours"] == 2.0
    assert "no team" in rows["(unattributed)"]["label"]
    by_gpu = report(admin, "gpu")
    assert sorted(r["allocated_gpu_hours"] for r in by_gpu.values()) == [1.4, 2.0]
    manager = get_user_model().objects.create_user("carol", password="pw-carol")
    Membership.objects.create(user=manager, team=Team.objects.get(slug="vision"), role=Role.MANAGER)
    rows = report(manager, "team")
    assert set(rows) == {"vision"} and rows["vision"]["allocated_gpu_hours"] == 1.4  # not the unattributed


def test_housekeeping_stops_asking_for_claims_where_the_cluster_has_no_dra(make_backend, apiserver):
    if not hasattr(apiserver, "serves_dra"):
        pytest.skip("a real API server serves what its version serves")
    apiserver.serves_dra = False
    backend = make_backend()
    for _ in range(3):
        assert backend.foreign_shares() == []
    assert len(apiserver.calls("GET", r"/resourceclaims$")) == 1  # the 404 once, then not again

    # Upgraded to a release with DRA: asked again once the re-check is due, and its claims count.
    apiserver.serves_dra = True
    kube_scheduler_claim(apiserver, "theirs", "gpu-1", {"compute": "700", "memory": str(4096 * MIB)})
    assert backend.foreign_shares() == []  # not asked within the hour
    backend.dra_recheck_s = 0.0  # as if the hour had passed
    assert [s.claim for s in backend.foreign_shares()] == ["team-vision/theirs"]
