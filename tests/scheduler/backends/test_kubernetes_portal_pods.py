"""A portal reservation's pod on the kubernetes backend, end to end through the portal's tasks: it
lands in a namespace that enforces PodSecurity baseline; a transient refusal is retried and shown as
the reservation's reason; a cancel costs one DELETE (and one PATCH for the reason), however many
events, sweeps and reconciles see the pod terminating afterwards."""

from __future__ import annotations

from decimal import Decimal

import pytest

from scheduler.backends.base import REASON_ANNOTATION
from scheduler.backends.kubernetes import KubernetesBackend

from .test_kubectl_end_to_end import portal_on_kubernetes, sync_until  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db
NAMESPACE = "tessera-workloads"


@pytest.fixture
def workloads(portal_on_kubernetes, apiserver, settings):  # noqa: F811 - the fixture imported above
    """The portal puts its pods in tessera-workloads (PodSecurity baseline, as deploy/namespace.yaml),
    through a backend with short retries."""
    from django.contrib.auth import get_user_model

    from portal.placement import backend as backend_module
    from portal.tenancy.models import Membership, Role, Team

    apiserver.add_namespace(NAMESPACE, {"pod-security.kubernetes.io/enforce": "baseline"})
    settings.TESSERA_NAMESPACE = NAMESPACE
    backend_module.use_backend(KubernetesBackend(
        host=apiserver.url, namespace=NAMESPACE, watch_timeout_s=5,
        retry=dict(attempts=2, base_s=0.01, max_s=0.02, connect_timeout_s=1.0, read_timeout_s=2.0)))
    alice = get_user_model().objects.create_user("alice", password="pw-alice")
    Membership.objects.create(user=alice, team=Team.objects.get(slug="vision"), role=Role.MEMBER)
    return alice


def submit(user):
    from portal.reservations import services
    from portal.reservations.rules import ReservationSpec
    from portal.tenancy.models import Team

    spec = ReservationSpec(team=Team.objects.get(slug="vision"), image="ghcr.io/example/train:1",
                           gpu_request=Decimal("0.25"), gpu_memory_mib=2048, gpu_model="T4", priority=40)
    return services.submit(user, spec)


def test_a_cancel_costs_one_delete_and_the_first_reason_stays(workloads, portal_on_kubernetes,  # noqa: F811
                                                             apiserver):
    from portal.placement import tasks
    from portal.reservations import services
    from portal.reservations.models import Reservation

    r = submit(workloads)
    portal_on_kubernetes()
    r.refresh_from_db()
    pod = apiserver.pod(NAMESPACE, r.pod_name)
    assert pod is not None and "volumes" not in pod["spec"]  # admitted under baseline
    apiserver.set_pod_phase(NAMESPACE, r.pod_name, "Running")
    sync_until(lambda: Reservation.objects.get(pk=r.pk).state == "running")

    apiserver.hold_deletions = True  # the kubelet takes its time stopping the container
    services.cancel(r.pk, workloads)
    tasks.housekeeping()
    sync_until(lambda: apiserver.pod(NAMESPACE, r.pod_name)["metadata"].get("deletionTimestamp"))
    for _ in range(3):  # events of the terminating pod, sweeps, reconciles: it is left alone
        tasks.sync(0.2)
        tasks.housekeeping()
        tasks.reconcile()
    path = rf"^/api/v1/namespaces/{NAMESPACE}/pods/{r.pod_name}$"
    assert len(apiserver.calls("DELETE", path)) == 1
    assert len(apiserver.calls("PATCH", path)) == 1
    assert len(apiserver.calls("POST", rf"^/api/v1/namespaces/{NAMESPACE}/pods$")) == 1
    reason = apiserver.pod(NAMESPACE, r.pod_name)["metadata"]["annotations"][REASON_ANNOTATION]
    assert reason == f"reservation {r.pk} is cancelled"


def test_a_transient_refusal_is_the_reservations_reason_until_the_pod_is_made(
        workloads, portal_on_kubernetes, apiserver):  # noqa: F811
    from portal.placement import binding, reconcile
    from portal.placement.backend import get_backend
    from portal.reservations.models import Reservation

    apiserver.service_accounts.discard((NAMESPACE, "default"))  # a namespace made a moment ago
    r = submit(workloads)
    portal_on_kubernetes()  # placed; the bind meets the refusal and its retries give up
    r.refresh_from_db()
    assert r.state == "placed"
    assert r.state_reason.startswith("the cluster has not taken the pod yet: create pod: namespace "
                                     f"{NAMESPACE} has no ServiceAccount default yet")
    apiserver.add_service_account(NAMESPACE)
    reconcile.reconcile(get_backend())  # binds what is placed and has no pod
    r = Reservation.objects.get(pk=r.pk)
    assert apiserver.pod(NAMESPACE, r.pod_name) is not None
    assert r.state == "placed" and r.state_reason == "pod created; waiting for it to start"
    assert binding.bind_batch(get_backend(), [r.pk]).bound == 1  # again: adopted, nothing new


def test_a_missing_runtime_class_fails_the_reservation_saying_what_the_operator_must_do(
        workloads, portal_on_kubernetes, apiserver):  # noqa: F811
    from portal.reservations.models import Reservation

    apiserver.runtime_classes.clear()  # no NVIDIA container toolkit on this cluster
    r = submit(workloads)
    portal_on_kubernetes()
    r = Reservation.objects.get(pk=r.pk)
    assert r.state == "failed"
    assert "RuntimeClass nvidia is missing: install the NVIDIA container toolkit" in r.state_reason
    assert "TESSERA_RUNTIME_CLASS" in r.state_reason
    assert len(apiserver.calls("POST", rf"^/api/v1/namespaces/{NAMESPACE}/pods$")) == 1  # not retried


def test_a_finished_portal_pod_is_kept_for_its_log_then_deleted(workloads, portal_on_kubernetes,  # noqa: F811
                                                               apiserver, settings):
    from portal.placement import tasks
    from portal.reservations.models import Reservation

    r = submit(workloads)
    portal_on_kubernetes()
    r.refresh_from_db()
    apiserver.set_pod_phase(NAMESPACE, r.pod_name, "Succeeded")
    sync_until(lambda: Reservation.objects.get(pk=r.pk).state == "succeeded")
    tasks.housekeeping()
    tasks.reconcile()
    assert apiserver.pod(NAMESPACE, r.pod_name) is not None  # the reservation page can still read its log
    settings.TESSERA_KEEP_FINISHED_PODS_S = 0  # an hour later
    tasks.housekeeping()
    assert apiserver.pod(NAMESPACE, r.pod_name) is None
    assert Reservation.objects.get(pk=r.pk).pod_name == ""
