"""Which pod is the kubelet allocating for? The kubelet's Allocate names only device IDs, so the
plugin asks the API server for the pods bound to its node that wait for Tessera's resource, and
takes the one bound first (the kubelet admits pods one at a time, in about that order), as HAMi and
Gemini do. Each container it answers for is counted on the pod (`ALLOCATED_ANNOTATION`, written
with a resourceVersion precondition), so two Allocate calls never take the same container.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from agents.kube_client import kube_api_client
from scheduler.backends.kubernetes.api import RETRIED_STATUSES, status_message
from scheduler.backends.kubernetes.refusals import explain
from wire.pod_placement import PLACEMENT_ANNOTATION

log = logging.getLogger(__name__)
T = TypeVar("T")

ALLOCATED_ANNOTATION = "tessera.io/allocated-containers"
MAX_CLAIM_TRIES = 5
# A failed Allocate fails the pod's admission for good, and the kubelet admits the node's pods one at
# a time, all waiting behind this one: the API server gets this long to come back (a restart: seconds
# refused, then about 2 s of 403 until its RBAC cache syncs), then the pod fails with the reason.
ADMISSION_BUDGET_S = 20.0
RETRY_FIRST_S, RETRY_MAX_S = 0.1, 1.0


class NoPodForAllocation(Exception):
    """No pod on this node explains the Allocate call (or the API server cannot be asked)."""


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    uid: str
    container: str
    annotations: Mapping[str, str]


class PodApi(Protocol):
    def pods_on_node(self, node: str) -> list[dict]: ...

    def annotate(self, namespace: str, name: str, resource_version: str, annotations: dict[str, str]) -> bool:
        """Patch annotations if the pod is still at `resource_version`; False when it moved on."""
        ...


def _passes(exc: Exception) -> bool:
    """Whether a failure may pass by itself: a server under load, restarting (connection refused), or
    restarted and still syncing its RBAC cache (403 in RBAC's words)."""
    if not isinstance(exc, ApiException):
        return True
    if exc.status in RETRIED_STATUSES:
        return True
    refusal = explain(exc.status, *status_message(exc))
    return refusal.transient or refusal.confirm_when_ready


def _never_applied(exc: Exception) -> bool:
    """A failure of a write that certainly did not happen, so that sending it again counts nothing
    twice: no connection, or refused before admission (429, RBAC). A 5xx or a timeout may come
    after the write (then the next list shows it)."""
    if isinstance(exc, ApiException):
        return exc.status in (403, 429) and _passes(exc)
    return isinstance(exc, urllib3.exceptions.NewConnectionError | ConnectionRefusedError)


def _reason(exc: Exception) -> str:
    """The failure in words, without the HTTP headers an ApiException's text carries."""
    if isinstance(exc, ApiException):
        reason, message = status_message(exc)
        return f"HTTP {exc.status} {reason}: {message}"
    return str(exc).rsplit(">: ", 1)[-1]  # urllib3 prefixes the connection object's repr


class KubernetesPods:
    """`PodApi` on the API server, with the node's service account (or an explicit host for tests)."""

    def __init__(self, *, host: str | None = None, token: str | None = None, timeout_s: float = 5.0,
                 budget_s: float = ADMISSION_BUDGET_S) -> None:
        self.core = client.CoreV1Api(kube_api_client(host=host, token=token))  # retried in _retrying
        self.timeout_s = timeout_s
        self.budget_s = budget_s

    def _retrying(self, what: str, fn: Callable[[], T], retried: Callable[[Exception], bool]) -> T:
        """`fn()`, asked again while the failure may pass and the admission budget lasts."""
        deadline = time.monotonic() + self.budget_s
        delay = RETRY_FIRST_S
        while True:
            try:
                return fn()
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
                if not retried(exc):
                    raise NoPodForAllocation(f"{what}: {_reason(exc)}") from exc
                if time.monotonic() + delay > deadline:
                    raise NoPodForAllocation(f"{what}: {_reason(exc)} (for {self.budget_s:g} s)") from exc
                log.info("%s: %s; asking again in %.1f s", what, _reason(exc), delay)
            time.sleep(delay)
            delay = min(RETRY_MAX_S, delay * 2)

    def pods_on_node(self, node: str) -> list[dict]:
        def list_pods() -> list[dict]:
            resp = self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node},status.phase=Pending", _preload_content=False,
                _request_timeout=self.timeout_s)
            return list(_body(resp).get("items") or ())

        return self._retrying(f"cannot list the pods of node {node}", list_pods, _passes)

    def annotate(self, namespace: str, name: str, resource_version: str, annotations: dict[str, str]) -> bool:
        body = {"metadata": {"resourceVersion": resource_version, "annotations": annotations}}

        def patch() -> bool:
            try:
                _body(self.core.patch_namespaced_pod(name, namespace, body, _preload_content=False,
                                                     _request_timeout=self.timeout_s))
            except ApiException as exc:
                if exc.status in (404, 409):
                    return False
                raise
            return True

        return self._retrying(f"cannot count a container of pod {namespace}/{name}", patch, _never_applied)


def _body(resp: Any) -> dict:
    """The answer's JSON, read to its end before the connection goes back to the pool: a connection
    given back with its body unread is reused as if idle, and the next request on it fails
    (`ResponseNotReady('Request-sent')`)."""
    try:
        return json.loads(resp.data)
    finally:
        resp.release_conn()


def _requesting(pod: Mapping[str, Any], resource: str) -> list[tuple[str, int]]:
    """(container name, how many devices it asked for) of each container asking for `resource`."""
    out = []
    for c in (pod.get("spec") or {}).get("containers") or ():
        limits = ((c.get("resources") or {}).get("limits") or {})
        try:
            count = int(str(limits.get(resource, "0")))
        except ValueError:
            count = 0
        if count > 0:
            out.append((c.get("name", ""), count))
    return out


def _bound_at(pod: Mapping[str, Any]) -> tuple[str, str]:
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("lastTransitionTime"):
            return str(cond["lastTransitionTime"]), str(pod["metadata"].get("creationTimestamp") or "")
    return "", str(pod["metadata"].get("creationTimestamp") or "")


class PodFinder:
    def __init__(self, api: PodApi, node: str, resource: str) -> None:
        self.api = api
        self.node = node
        self.resource = resource

    def claim(self, device_count: int) -> Claim:
        """Take the next unallocated container that asked for `device_count` of our resource."""
        for _ in range(MAX_CLAIM_TRIES):
            try:
                pods = self.api.pods_on_node(self.node)
            except NoPodForAllocation:
                raise
            except Exception as exc:  # the API server's errors come in many types; all mean "cannot tell"
                raise NoPodForAllocation(f"cannot list the pods of node {self.node}: {exc}") from exc
            candidates = []
            for pod in pods:
                meta = pod.get("metadata") or {}
                annotations = meta.get("annotations") or {}
                if meta.get("deletionTimestamp") or PLACEMENT_ANNOTATION not in annotations:
                    continue
                wanted = _requesting(pod, self.resource)
                try:
                    done = int(annotations.get(ALLOCATED_ANNOTATION, "0"))
                except ValueError:
                    done = 0
                if done < len(wanted) and wanted[done][1] == device_count:
                    candidates.append((_bound_at(pod), pod, wanted[done][0], done))
            if not candidates:
                raise NoPodForAllocation(
                    f"no pod bound to {self.node} waits for {device_count} {self.resource} "
                    f"with a {PLACEMENT_ANNOTATION} annotation")
            candidates.sort(key=lambda c: c[0])
            _, pod, container, done = candidates[0]
            meta = pod["metadata"]
            if self.api.annotate(meta["namespace"], meta["name"], meta.get("resourceVersion", ""),
                                 {ALLOCATED_ANNOTATION: str(done + 1)}):
                return Claim(meta["namespace"], meta["name"], meta.get("uid", ""), container,
                             dict(meta.get("annotations") or {}))
            log.info("pod %s/%s changed while claiming; looking again", meta["namespace"], meta["name"])
        raise NoPodForAllocation(f"pods on {self.node} kept changing; gave up after {MAX_CLAIM_TRIES} tries")
