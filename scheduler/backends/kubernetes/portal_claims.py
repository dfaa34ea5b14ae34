"""The portal's own reservation pods through Dynamic Resource Allocation, where the cluster has it.

`sharing` (the backend option; the portal's TESSERA_KUBERNETES_SHARING) says how a portal pod gets
its share of a GPU:

- `deviceplugin`: one `tessera.io/gpu-share` slot of the device plugin, the pod pinned to its node
  (`nodeName`), as before;
- `dra`: a ResourceClaim of `gpu-share.tessera.io` with the share's compute and memory, allocated by
  us and reserved for the pod, then the pod's Binding, as for a kubectl pod's claim (`dra.py`);
- `auto` (the default): `dra` when the API server serves resource.k8s.io/v1 and our DeviceClass
  exists there (one read, the first time a pod is made), else `deviceplugin`.

The order of a pod's writes, each idempotent so that a retried bind finishes what an earlier one
began: the pod, unbound (no kubelet sees it yet); its claim, owned by the pod (the garbage collector
deletes it with the pod: releasing stays one delete); the claim's allocation and `reservedFor`; the
Binding. The kubelet therefore finds the claim allocated and reserved when the pod reaches it, and the
node's DRA driver reads the share's terms from the pod's placement annotation, as for kubectl pods.
A remote share's pod runs where its GPU is not: it keeps its own path (no device, no claim).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..base import PermanentBackendError, PodConflict, PodSpec, PodStatus, TransientBackendError
from .api import Conflict, NotFound
from .dra import MIB, SHARE_CLASS, consumed_milli
from .manifests import SHARE_RESOURCE, binding_manifest, check_name, pod_status

if TYPE_CHECKING:
    from .backend import KubernetesBackend

log = logging.getLogger(__name__)

SHARING_MODES = ("auto", "deviceplugin", "dra")
CLAIM_REFERENCE = "gpu"  # the pod's name for its claim (spec.resourceClaims[].name)


def sharing_option(value: str) -> str:
    mode = (value or "").strip().lower()
    if mode not in SHARING_MODES:
        raise ValueError(f"sharing: {value!r} is not one of {', '.join(SHARING_MODES)} (how portal pods get "
                         "their GPU share: auto detects DRA, deviceplugin or dra forces one)")
    return mode


def claim_name(pod_name: str) -> str:
    name = f"{pod_name}-{CLAIM_REFERENCE}"
    check_name("resource claim", name)
    return name


def claim_manifest(spec: PodSpec, pod_uid: str) -> dict[str, Any]:
    """One request of the share class: as many devices as the reservation has GPUs, each consuming the
    share's compute (milli-GPUs, on the slices' grid) and memory; owned by the pod."""
    share = spec.gpus[0]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": claim_name(spec.name), "namespace": spec.namespace, "labels": dict(spec.labels),
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": spec.name, "uid": pod_uid,
                                 "controller": True}],
        },
        "spec": {"devices": {"requests": [{"name": CLAIM_REFERENCE, "exactly": {
            "deviceClassName": SHARE_CLASS, "allocationMode": "ExactCount", "count": len(spec.gpus),
            "capacity": {"requests": {"compute": str(consumed_milli(share.gpu_request)),
                                      "memory": str(share.gpu_memory_mib * MIB)}}}}]}},
    }


def with_claim(manifest: dict[str, Any], spec: PodSpec) -> dict[str, Any]:
    """The device-plugin pod manifest turned into the DRA one: no share slot and no node (the Binding
    sets it, once the claim is allocated); the container uses the pod's claim instead."""
    out = copy.deepcopy(manifest)
    pod_spec = out["spec"]
    pod_spec.pop("nodeName", None)
    pod_spec["resourceClaims"] = [{"name": CLAIM_REFERENCE, "resourceClaimName": claim_name(spec.name)}]
    for container in pod_spec["containers"]:
        resources = container.setdefault("resources", {})
        limits = resources.get("limits") or {}
        limits.pop(SHARE_RESOURCE, None)
        if not limits:
            resources.pop("limits", None)
        resources["claims"] = [{"name": CLAIM_REFERENCE}]
    return out


class PortalClaims:
    """The DRA path of a `KubernetesBackend`'s portal pods: whether it is taken, and the pod's writes."""

    def __init__(self, backend: KubernetesBackend) -> None:
        self.backend = backend
        self._found: bool | None = None  # "auto", decided on the first pod made

    def in_use(self) -> bool:
        """Whether portal pods get a ResourceClaim (`sharing`; "auto": whether the API server serves
        resource.k8s.io/v1 and has our DeviceClass, read once)."""
        sharing = self.backend.sharing
        if sharing != "auto":
            return sharing == "dra"
        if self._found is None:
            try:
                self.backend.claims.read_device_class(SHARE_CLASS)
                found = True
            except NotFound:  # no such class, or no resource.k8s.io/v1 at all
                found = False
            except PermanentBackendError as exc:  # e.g. not allowed to read DeviceClasses
                log.warning("portal pods use the device plugin: cannot read DeviceClass %s (%s)", SHARE_CLASS, exc)
                found = False
            log.info("portal pods get their GPU share through %s", "DRA claims" if found else "the device plugin")
            self._found = found
        return self._found

    def create(self, spec: PodSpec, manifest: dict[str, Any]) -> PodStatus:
        """The pod unbound, its claim (owned by it), the claim's allocation, the Binding: each step
        idempotent, so a retry finishes what an earlier try began. `manifest`: the device-plugin pod."""
        backend, api = self.backend, self.backend.api
        try:
            status = pod_status(api.call_json("create pod", api.core.create_namespaced_pod, spec.namespace,
                                              with_claim(manifest, spec)))
        except NotFound as exc:
            raise PermanentBackendError(f"namespace {spec.namespace!r} does not exist: {exc}") from exc
        except Conflict:
            status = backend._adopt(spec)
        if status.node:
            backend.check_bound(spec.ref, spec.node, status.node)
            return status
        name = claim_name(spec.name)
        try:
            claim = backend.claims.create_claim(spec.namespace, claim_manifest(spec, status.uid))
        except Conflict:
            claim = backend.claims.read_claim(spec.namespace, name)
            if not any(ref.get("uid") == status.uid for ref in claim["metadata"].get("ownerReferences") or ()):
                # An earlier pod's of this name (deleted, its claim not collected yet): it goes by itself.
                raise TransientBackendError(f"claim {spec.namespace}/{name} still belongs to an earlier pod "
                                            f"{spec.name}; the garbage collector deletes it") from None
        backend.claims.allocate(claim, spec.ref, status.uid, spec.node, backend.on_slice(spec.node, spec.gpus))
        try:
            api.bind(spec.namespace, spec.name, binding_manifest(spec.namespace, spec.name, spec.node))
        except NotFound as exc:
            raise PodConflict(f"pod {spec.namespace}/{spec.name} is gone") from exc
        except Conflict:
            after = backend._read_external(spec.ref)
            backend.check_bound(spec.ref, spec.node, (after.get("spec") or {}).get("nodeName") or "")
        return replace(status, node=spec.node)
