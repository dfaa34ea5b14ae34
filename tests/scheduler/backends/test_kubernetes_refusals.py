"""The API server refuses pods for reasons that pass (a fresh namespace's ServiceAccount, a full
quota) and reasons that need an operator (a missing RuntimeClass, PodSecurity, RBAC): the first are
retried and come out transient, the others final with what to fix."""

from __future__ import annotations

import pytest

from scheduler.backends import PermanentBackendError, TransientBackendError
from scheduler.backends.kubernetes.refusals import explain

PODS = r"^/api/v1/namespaces/fresh/pods$"
# The API server takes up to 1.8 s to refuse a pod for a missing default ServiceAccount (it looks
# again and again first): a read timeout shorter than that sees a timeout, not the refusal.
SLOW_REFUSALS = dict(attempts=4, base_s=0.01, max_s=0.05, connect_timeout_s=1.0, read_timeout_s=3.0)


def test_a_fresh_namespace_without_its_service_account_yet_is_retried_until_it_is_there(nodes, make_backend,
                                                                                      pod_spec):
    nodes.add_namespace("fresh", service_account=False)
    nodes.service_account_after["fresh"] = 2  # the controller creates it while we are refused twice
    status = make_backend(retry=SLOW_REFUSALS).bind(pod_spec(namespace="fresh"))
    assert status.namespace == "fresh"
    assert len(nodes.calls("POST", PODS)) == 3


def test_a_service_account_that_stays_missing_is_transient_and_says_so(nodes, make_backend, pod_spec):
    nodes.add_namespace("fresh", service_account=False)
    with pytest.raises(TransientBackendError, match="namespace fresh has no ServiceAccount default yet"):
        make_backend(retry=SLOW_REFUSALS).bind(pod_spec(namespace="fresh"))
    assert len(nodes.calls("POST", PODS)) == 4  # every attempt of the policy
    assert nodes.pods() == []


def test_a_full_resource_quota_is_transient(nodes, backend, pod_spec):
    nodes.add_namespace("fresh")
    nodes.pod_quota["fresh"] = 1
    backend.bind(pod_spec(namespace="fresh"))
    with pytest.raises(TransientBackendError, match="ResourceQuota is used up"):
        backend.bind(pod_spec(reservation_id="43", namespace="fresh"))


def test_a_missing_runtime_class_fails_at_once_saying_what_to_install_or_set(nodes, backend, pod_spec):
    nodes.runtime_classes.clear()
    with pytest.raises(PermanentBackendError) as refused:
        backend.bind(pod_spec())
    assert "RuntimeClass nvidia is missing: install the NVIDIA container toolkit" in str(refused.value)
    assert "TESSERA_RUNTIME_CLASS" in str(refused.value)
    assert len(nodes.calls("POST", r"^/api/v1/namespaces/tessera/pods$")) == 1  # not retried


def test_the_runtime_class_is_whatever_tessera_runtime_class_says(nodes, make_backend, pod_spec, monkeypatch):
    nodes.runtime_classes = {"nvidia-cdi"}
    monkeypatch.setenv("TESSERA_RUNTIME_CLASS", "nvidia-cdi")
    make_backend().bind(pod_spec())
    monkeypatch.setenv("TESSERA_RUNTIME_CLASS", "")
    make_backend().bind(pod_spec(reservation_id="43"))
    classes = [p["spec"].get("runtimeClassName") for p in sorted(nodes.pods(), key=lambda p: p["metadata"]["name"])]
    assert classes == ["nvidia-cdi", None]


def test_a_namespace_stricter_than_baseline_is_final_and_named(nodes, backend, pod_spec):
    nodes.add_namespace("locked", {"pod-security.kubernetes.io/enforce": "restricted"})
    with pytest.raises(PermanentBackendError, match="PodSecurity level restricted:latest refuses the pod"):
        backend.bind(pod_spec(namespace="locked"))


def test_host_paths_are_refused_under_baseline(nodes):
    """The fake refuses as the real API server does, in its words (run against one: real_apiserver.py)."""
    nodes.add_namespace("team-b", {"pod-security.kubernetes.io/enforce": "baseline"})
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-b"},
           "spec": {"containers": [{"name": "c", "image": "x"}],
                    "volumes": [{"name": "lib", "hostPath": {"path": "/opt/tessera/lib"}}]}}
    with pytest.raises(Exception, match='violates PodSecurity "baseline:latest": hostPath volumes') as refused:
        nodes.create_pod(pod)
    assert refused.value.code == 403


@pytest.mark.parametrize(("status", "message", "transient", "says"), [
    (403, 'pods "p" is forbidden: error looking up service account team-a/default: serviceaccount "default" '
          "not found", True, "namespace team-a has no ServiceAccount default yet"),
    (403, 'pods "p" is forbidden: exceeded quota: gpu, requested: pods=1, used: pods=4, limited: pods=4', True,
     "ResourceQuota is used up (gpu, requested"),
    (403, 'pods "p" is forbidden: pod rejected: RuntimeClass "nvidia" not found', False,
     "RuntimeClass nvidia is missing"),
    (403, 'pods "p" is forbidden: violates PodSecurity "baseline:latest": hostPath volumes (volumes "a")', False,
     "label the namespace pod-security.kubernetes.io/enforce=baseline"),
    (403, 'pods is forbidden: User "system:serviceaccount:tessera:tessera-portal" cannot create resource "pods" '
          'in API group "" in the namespace "kube-system"', False,
     "system:serviceaccount:tessera:tessera-portal may not create pods in namespace kube-system"),
    (403, 'pods "nb" is forbidden: User "system:serviceaccount:tessera:tessera-portal" cannot create resource '
          '"pods/binding" in API group "" in the namespace "kube-system"', False,
     "Tessera places pods only in namespaces that grant it; apply deploy/optional/team-namespace.yaml with "
     "namespace kube-system"),
    (403, 'pods "p" is forbidden: unable to create new content in namespace gone because it is being terminated',
     False, "namespace gone is being deleted"),
    (422, 'Pod "p" is invalid: spec.containers[0].image: Required value', False, "found the manifest invalid"),
])
def test_refusals_are_sorted_into_passing_and_final_in_the_operators_words(status, message, transient, says):
    refusal = explain(status, "Forbidden" if status == 403 else "Invalid", message)
    assert refusal.transient is transient
    assert says in refusal.text
