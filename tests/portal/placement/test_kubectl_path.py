"""Pods created with kubectl (schedulerName tessera, KubeShare sharedgpu/* labels) are placed by the
same cycle; wrong labels get an Event that says what is wrong, and the pod stays pending."""

from __future__ import annotations

import json

import pytest

from portal.placement.kubectl_labels import spec_from_pod
from portal.reservations.models import Reservation, Source
from portal.reservations.rules import RuleViolation
from portal.reservations.states import State
from scheduler.backends import ExternalPod, PodRef
from scheduler.backends.base import PLACEMENT_ANNOTATION


def _labels(**values) -> dict[str, str]:
    return {f"sharedgpu/{k}": str(v) for k, v in values.items()}


def test_kubectl_pod_is_placed_bound_and_runs(cluster, placement_loop, teams):
    pod = cluster.create_external("vision", "train-1", _labels(gpu_request="0.5", gpu_limit="1.0",
                                                               gpu_mem=8 * 1024**3, gpu_model="T4", priority=60))
    placement_loop()
    placement_loop()
    r = Reservation.objects.get(source=Source.KUBECTL, pod_uid=pod.uid)
    assert (r.team, r.gpu_request, r.gpu_limit, r.gpu_memory_mib, r.priority) == (
        teams["vision"], 0.5, 1, 8192, 60)
    assert r.state == State.RUNNING and r.node.name == "t4-node-1"
    [bound] = [p for p in cluster.list_pods() if p.name == "train-1"]
    assert bound.external and bound.node == "t4-node-1" and bound.reservation_id == str(r.pk)
    assert cluster.list_pending_external() == []
    # The device plugin reads the placement from the pod's annotation.
    placement = json.loads(cluster.pod_annotations(PodRef(bound.namespace, bound.name))[PLACEMENT_ANNOTATION])
    assert placement["gpus"] == [r.allocations.get().gpu.uuid] and placement["request"] == 0.5


def test_pod_with_wrong_labels_gets_an_event_and_stays_pending(cluster, placement_loop, teams):
    cluster.create_external("vision", "typo", _labels(gpu_request="half", gpu_memory="8Gi"))
    cluster.create_external("nobody", "stray", _labels(gpu_request="0.5"))
    cluster.create_external("vision", "too-big", _labels(gpu_request="0.5", gpu_mem="100Gi", gpu_model="T4"))
    placement_loop()
    placement_loop()
    assert not Reservation.objects.filter(source=Source.KUBECTL).exists()
    [typo] = cluster.kubernetes_events(PodRef("vision", "typo"))  # told once, not every cycle
    assert "sharedgpu/gpu_request" in typo and "'half'" in typo
    assert "sharedgpu/gpu_memory: unknown label" in typo
    assert "namespace nobody belongs to no Tessera team" in cluster.kubernetes_events(PodRef("nobody", "stray"))[0]
    [big] = cluster.kubernetes_events(PodRef("vision", "too-big"))
    assert "sharedgpu/gpu_mem" in big and "15360 MiB" in big
    assert {p.name for p in cluster.list_pending_external()} == {"typo", "stray", "too-big"}


def test_deleting_the_kubectl_pod_cancels_its_reservation(cluster, placement_loop, teams):
    pod = cluster.create_external("vision", "notebook", _labels(gpu_request="0.25", gpu_mem="4Gi"))
    placement_loop()
    r = Reservation.objects.get(pod_uid=pod.uid)
    assert r.state == State.RUNNING
    cluster.delete_external(pod.ref)
    placement_loop()
    r.refresh_from_db()
    assert r.state == State.CANCELLED and "deleted" in r.state_reason
    assert not r.allocations.filter(released_at__isnull=True).exists()


def test_kubeshare_whole_gpus_and_gangs_translate(fleet, teams):
    spec = spec_from_pod(ExternalPod("vision", "big", "uid-1", _labels(
        gpu_request=2, gpu_model="A100-80GB", pod_group_name="ddp", group_headcount=4, group_threshold="0.5")))
    assert (spec.gpu_count, spec.gpu_request, spec.gpu_limit) == (2, 1, 1)
    assert (spec.group_name, spec.group_headcount, str(spec.group_threshold)) == ("ddp", 4, "0.500")
    assert spec.gpu_memory_mib == 81920  # a whole card each when no gpu_mem is given
    with pytest.raises(RuleViolation) as bad:
        spec_from_pod(ExternalPod("vision", "x", "uid-2", _labels(gpu_request="1.5")))
    assert "whole GPUs" in str(bad.value)
    with pytest.raises(RuleViolation) as bad:
        spec_from_pod(ExternalPod("vision", "x", "uid-3", _labels(gpu_request="0.5", gpu_limit="0.2")))
    assert "sharedgpu/gpu_limit" in bad.value.errors


def test_same_pod_seen_twice_makes_one_reservation(cluster, placement_loop, teams):
    pod = cluster.create_external("vision", "once", _labels(gpu_request="0.25", gpu_mem="1Gi", gpu_model="V100-32GB"))
    from portal.placement.admission import ingest

    assert ingest(cluster) == (1, 0)
    assert ingest(cluster) == (0, 0)
    assert Reservation.objects.filter(pod_uid=pod.uid).count() == 1
    placement_loop()
    assert [p.reservation_id for p in cluster.list_pods()] == [str(Reservation.objects.get(pod_uid=pod.uid).pk)]


def test_kubectl_pod_gone_while_nobody_watched_is_cancelled_by_reconcile(cluster, placement_loop, teams):
    from portal.placement.reconcile import reconcile

    pod = cluster.create_external("vision", "vanishes", _labels(gpu_request="0.25", gpu_mem="1Gi"))
    placement_loop()
    r = Reservation.objects.get(pod_uid=pod.uid)
    assert r.state == State.RUNNING
    cluster.delete_external(pod.ref)
    cluster.poll(0)  # the deletion event is lost
    assert reconcile(cluster).failed == [r.pk]
    r.refresh_from_db()
    assert r.state == State.CANCELLED and "deleted" in r.state_reason


def test_a_kubectl_pod_asking_for_a_remote_share_is_told_why_it_cannot_have_one(cluster, placement_loop, teams):
    cluster.create_external("vision", "far", _labels(gpu_request="0.25", gpu_mem="4Gi", remote="true"))
    placement_loop()
    assert not Reservation.objects.filter(source=Source.KUBECTL).exists()
    [event] = cluster.kubernetes_events(PodRef("vision", "far"))
    assert "sharedgpu/remote: remote GPU shares are not available to kubectl pods" in event
    assert "request through the portal with remote_allowed" in event
