"""Dynamic Resource Allocation on the kubectl path: a pod with `schedulerName: tessera` whose
ResourceClaims name our DeviceClasses (`gpu-share.tessera.io`, `gpu-whole.tessera.io`) is placed by
the same cycle as a KubeShare-labelled one; then, instead of a placement annotation for the device
plugin, the claim gets its allocation, which the node's DRA driver (`agents/dra`) prepares.

- `claim_terms(claims)`: what the pod's claims ask for, in the portal's terms (share, memory, GPU
  count), so admission can turn them into a reservation as it does labels.
- `allocation(...)`: `status.allocation` for a placement: one result per GPU, device `gpu-<index>` of
  the node's pool, `consumedCapacity` on the grid the slice's request policy sets (compute in
  milli-GPUs rounded up to a multiple of 10, at least 10; memory in whole MiB), a `shareID` derived
  from the claim and the device (so a retried write is the same write), and the node selector.
- `ClaimAllocator.allocate` (then the backend's Binding): one status write per claim (a PUT
  on the claim's resourceVersion as read with the pod's claims; a 409 reads it once and tries
  again). A claim already allocated to exactly this placement (our earlier try whose answer was
  lost) only gets the pod added to `reservedFor`; allocated otherwise (the kube-scheduler was first)
  raises `PodConflict`. The placement annotation rides on the Binding as on the device-plugin path;
  the node's driver reads it from the pod the claim is reserved for (reservation, limit, priority).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kubernetes import client
from kubernetes.utils import parse_quantity

from ..base import GpuShare, PodConflict, PodRef
from .api import Conflict, KubeApi, NotFound

API_VERSION = "resource.k8s.io/v1"
DRIVER = "gpu.tessera.io"
SHARE_CLASS = "gpu-share.tessera.io"
WHOLE_CLASS = "gpu-whole.tessera.io"
OUR_CLASSES = frozenset({SHARE_CLASS, WHOLE_CLASS})
MIB = 1 << 20
WHOLE_GPU_MILLI = 1000
STEP_MILLI = 10
SHARE_IDS = uuid.UUID("6b1f6a52-2f0e-4d55-9a3c-7d1e1c0a7e11")  # namespace of the derived shareIDs


class ClaimError(ValueError):
    """The pod's claims ask for something Tessera cannot place; the message says what, for the user."""


@dataclass(frozen=True)
class ClaimTerms:
    gpu_request: Decimal  # per GPU, 0 < r <= 1
    gpu_memory_mib: int | None  # per GPU; None: the whole card
    gpu_count: int
    whole: bool


def pod_claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The ResourceClaims a pod uses: named directly, or made from a template by the resourceclaim
    controller (recorded in the pod's `status.resourceClaimStatuses`). A template's claim not made
    yet: ClaimError (the pod waits until it is)."""
    statuses = {s["name"]: s.get("resourceClaimName") for s in (pod.get("status") or {}).get(
        "resourceClaimStatuses") or ()}
    names = []
    for ref in (pod.get("spec") or {}).get("resourceClaims") or ():
        if ref.get("resourceClaimName"):
            names.append(ref["resourceClaimName"])
        elif statuses.get(ref["name"]):
            names.append(statuses[ref["name"]])
        else:
            raise ClaimError(f"the claim of {ref['name']!r} is not made from its template yet")
    return names


def _ours(request: Mapping[str, Any]) -> Mapping[str, Any] | None:
    exactly = request.get("exactly") or {}
    return exactly if exactly.get("deviceClassName") in OUR_CLASSES else None


def names_our_class(claim: Mapping[str, Any]) -> bool:
    """Whether one of the claim's requests names one of our classes (no capacity parsed)."""
    return any(_ours(r) is not None for r in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ())


def claim_terms(claims: Sequence[Mapping[str, Any]]) -> ClaimTerms | None:
    """What the claims ask of our classes (None: nothing, the pod is not ours to place with DRA).
    One request of one of our classes, in one claim: what a reservation can express."""
    ours = [(c, r, e) for c in claims for r in ((c.get("spec") or {}).get("devices") or {}).get("requests") or ()
            if (e := _ours(r)) is not None]
    if not ours:
        return None
    if len(ours) > 1:
        raise ClaimError(f"{len(ours)} requests name a Tessera class; one request (with a count) is supported")
    claim, request, exactly = ours[0]
    where = f"claim {claim['metadata']['name']}, request {request['name']}"
    if exactly.get("allocationMode", "ExactCount") != "ExactCount":
        raise ClaimError(f"{where}: allocationMode must be ExactCount")
    count = int(exactly.get("count") or 1)
    asked = (exactly.get("capacity") or {}).get("requests") or {}
    whole = exactly["deviceClassName"] == WHOLE_CLASS or "compute" not in asked
    try:
        milli = Decimal(WHOLE_GPU_MILLI) if whole else parse_quantity(asked["compute"])
        memory = parse_quantity(asked["memory"]) if "memory" in asked and not whole else None
    except ValueError as exc:
        raise ClaimError(f"{where}: capacity is not a quantity ({exc})") from exc
    if not 0 < milli <= WHOLE_GPU_MILLI:
        raise ClaimError(f"{where}: compute must be more than 0 and at most {WHOLE_GPU_MILLI} milli-GPUs")
    if count > 1 and milli < WHOLE_GPU_MILLI:
        raise ClaimError(f"{where}: several GPUs are whole GPUs; ask compute {WHOLE_GPU_MILLI} or one GPU")
    return ClaimTerms(gpu_request=milli / WHOLE_GPU_MILLI, whole=whole, gpu_count=count,
                      gpu_memory_mib=None if memory is None else max(1, math.ceil(memory / MIB)))


def terms_as_labels(terms: ClaimTerms) -> dict[str, str]:
    """The claims' terms as the `sharedgpu/*` labels the portal admits kubectl pods by
    (portal/placement/kubectl_labels.py): so a DRA pod is a reservation like any other."""
    labels = {"sharedgpu/gpu_request": str(terms.gpu_count) if terms.whole else f"{terms.gpu_request.normalize():f}"}
    if terms.gpu_memory_mib is not None:
        labels["sharedgpu/gpu_mem"] = f"{terms.gpu_memory_mib}Mi"
    return labels


def uses_claims(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("resourceClaims"))


def devices_by_uuid(resource_slice: Mapping[str, Any]) -> dict[str, int]:
    """GPU UUID -> its index, from the node's slice (agents/dra/slices.py names devices gpu-<index>)."""
    out = {}
    for device in (resource_slice.get("spec") or {}).get("devices") or ():
        attributes = device.get("attributes") or {}
        if "uuid" in attributes and "index" in attributes:
            out[attributes["uuid"]["string"]] = int(attributes["index"]["int"])
    return out


def consumed_milli(share: float) -> int:
    """A share (0..1] as the milli-GPUs a device's request policy lets a claim consume."""
    milli = math.ceil(round(share * WHOLE_GPU_MILLI, 6) / STEP_MILLI) * STEP_MILLI
    return min(WHOLE_GPU_MILLI, max(STEP_MILLI, milli))


def allocation(claim: Mapping[str, Any], node: str, gpus: Sequence[GpuShare]) -> dict[str, Any]:
    """`status.allocation` for a placement of the claim's request of our class on `gpus` of `node`."""
    (request,) = [r for r in claim["spec"]["devices"]["requests"] if _ours(r) is not None]
    uid = claim["metadata"]["uid"]
    results = [{
        "request": request["name"], "driver": DRIVER, "pool": node, "device": f"gpu-{g.index}",
        "shareID": share_id(uid, node, g.index),
        "consumedCapacity": {"compute": str(consumed_milli(g.gpu_request)), "memory": str(g.gpu_memory_mib * MIB)},
    } for g in gpus]
    return {"devices": {"results": results},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}


@dataclass(frozen=True)
class ForeignShare:
    """What another allocator (the default kube-scheduler, for a pod left to it) took of one of our
    devices: the portal counts it as used, so that our cycle never places into that room."""

    node: str
    gpu_index: int
    milli: int  # compute consumed, milli-GPUs
    memory_mib: int | None  # None: the whole card's (a result that consumed no stated memory)
    claim: str  # namespace/name, for the reasons the portal gives; its namespace names the team
    claim_uid: str = ""  # tells a claim from a later one of the same name


def share_id(claim_uid: str, node: str, index: int) -> str:
    """The shareID our allocations carry (derived, so a retried write is the same write)."""
    return str(uuid.uuid5(SHARE_IDS, f"{claim_uid}/{node}/{index}"))


def foreign_shares(claims: Sequence[Mapping[str, Any]]) -> list[ForeignShare]:
    """The devices of our driver that claims hold without our allocation (their shareID is not the one
    `allocation` derives). A result without consumedCapacity took the whole device (a whole-GPU class,
    or the request policy's defaults); an unreadable amount counts as the whole device, never less."""
    out = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        for result in (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or ():
            device = str(result.get("device", ""))
            if result.get("driver") != DRIVER or not device.startswith("gpu-") or not device[4:].isdigit():
                continue
            node, index = str(result.get("pool", "")), int(device[4:])
            if result.get("shareID") == share_id(meta.get("uid", ""), node, index):
                continue  # ours: the portal holds it as a reservation already
            consumed = result.get("consumedCapacity") or {}
            try:
                milli = int(parse_quantity(consumed["compute"])) if "compute" in consumed else WHOLE_GPU_MILLI
                mib = math.ceil(parse_quantity(consumed["memory"]) / MIB) if "memory" in consumed else None
            except ValueError:
                milli, mib = WHOLE_GPU_MILLI, None
            out.append(ForeignShare(node=node, gpu_index=index, memory_mib=mib,
                                    milli=min(max(milli, STEP_MILLI), WHOLE_GPU_MILLI),
                                    claim=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
                                    claim_uid=str(meta.get("uid", ""))))
    return out


class ClaimAllocator:
    """Claim status writes and the Binding, through the backend's `KubeApi` (its retries)."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.resource = client.ResourceV1Api(api.api_client)


    def list_claims(self) -> dict[tuple[str, str], dict]:
        """Every ResourceClaim, by (namespace, name): read once per cycle, not once per pod."""
        page = self.api.call_json("list claims", self.resource.list_resource_claim_for_all_namespaces)
        return {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in page.get("items") or ()}

    def read_slice(self, node: str) -> dict:
        return self.api.call_json("read slice", self.resource.read_resource_slice, f"{node}-{DRIVER}")

    def read_device_class(self, name: str) -> dict:
        return self.api.call_json("read device class", self.resource.read_device_class, name)

    def create_claim(self, namespace: str, manifest: dict) -> dict:
        return self.api.call_json("create claim", self.resource.create_namespaced_resource_claim, namespace, manifest)

    def read_claim(self, namespace: str, name: str) -> dict:
        return self.api.call_json("read claim", self.resource.read_namespaced_resource_claim, name, namespace)

    def allocate(self, claim: dict, pod: PodRef, pod_uid: str, node: str, gpus: Sequence[GpuShare]) -> None:
        """Write the claim's allocation for this placement and reserve it for the pod: one status
        write (a PUT of the status on the claim's resourceVersion as read: idempotent; a 409 reads
        the claim once and tries again)."""
        wanted = allocation(claim, node, gpus)
        consumer = {"resource": "pods", "name": pod.name, "uid": pod_uid}
        name = claim["metadata"]["name"]
        path = f"/apis/resource.k8s.io/v1/namespaces/{pod.namespace}/resourceclaims/{name}/status"
        for attempt in range(2):
            status = claim.get("status") or {}
            if status.get("allocation") and status["allocation"] != wanted:
                raise PodConflict(f"claim {pod.namespace}/{name} is allocated elsewhere (by another scheduler)")
            reserved = list(status.get("reservedFor") or ())
            if status.get("allocation") and any(r.get("uid") == pod_uid for r in reserved):
                return  # done before (an answer lost on the way back)
            # The status subresource takes the status alone (the server keeps the stored spec and
            # metadata): the claim's identity, the resourceVersion it was read at, the new status.
            meta = claim["metadata"]
            body = {"apiVersion": API_VERSION, "kind": "ResourceClaim",
                    "metadata": {"name": name, "namespace": pod.namespace, "uid": meta.get("uid"),
                                 "resourceVersion": meta.get("resourceVersion")},
                    "status": {**status, "allocation": wanted, "reservedFor": [*reserved, consumer]}}
            try:
                self.api.send_json("allocate claim", "PUT", path, body, answer=False)
                return
            except Conflict:
                if attempt:
                    raise
                claim = self.read_claim(pod.namespace, name)
            except NotFound as exc:
                raise PodConflict(f"claim {pod.namespace}/{name} is gone") from exc
        raise AssertionError("unreachable")
