"""The kubectl path: pods with `schedulerName: tessera` and KubeShare 2.0 labels become reservations.

Labels (all values are strings, as Kubernetes requires):

| label | meaning | default |
| --- | --- | --- |
| `sharedgpu/gpu_request` | guaranteed share of one GPU, 0 < r ≤ 1; above 1: whole GPUs (an integer) | required |
| `sharedgpu/gpu_limit` | most it may use when the GPU is idle, request ≤ limit ≤ 1 | the request |
| `sharedgpu/gpu_mem` | memory cap: bytes (KubeShare), or with Ki/Mi/Gi/Ti | request × the smallest card |
| `sharedgpu/gpu_model` | a GPU model of the fleet, by its label-safe name (note 1) | any |
| `sharedgpu/priority` | 0 (opportunistic, preemptible) … 100 | 0, as in KubeShare |
| `sharedgpu/pod_group_name` | gang name; `sharedgpu/group_name` (KubeShare 2.0's README) is the same | none |
| `sharedgpu/group_headcount` | gang size | required with a group |
| `sharedgpu/group_threshold` | fraction of the gang that must be placed together, 0 < t ≤ 1 | 1 |

`sharedgpu/remote` (the name a remote-share switch would have) is refused with what to do
instead: see REMOTE_REFUSED.

Note 1: NVML's name with dashes for spaces, as KubeShare writes it (`NVIDIA-A100-SXM4-80GB` for
"NVIDIA A100-SXM4-80GB"); a display name that is a valid label value is accepted too.

A pod without `sharedgpu/priority` is opportunistic (0), as in KubeShare: it runs on what is free
and is the first to be preempted, by any team. Give it a priority to hold its share.

The namespace names the team (`Team.namespace`, else the team whose slug is the namespace). A pod
whose labels are wrong gets a Warning Event saying what is wrong (`Backend.reject_external`, by
`admission`) and stays pending; nothing is written for it. Unknown `sharedgpu/*` labels are refused
too, so a typo never silently changes what runs.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from django.db.models import Min, Q

from portal.fleet.model_names import display_model
from portal.fleet.models import Gpu
from portal.reservations import rules
from portal.reservations.rules import LABEL, ReservationSpec, RuleViolation
from portal.tenancy.models import Team
from scheduler.backends import ExternalPod

PREFIX = "sharedgpu/"
KNOWN = frozenset({"gpu_request", "gpu_limit", "gpu_mem", "gpu_model", "priority", "pod_group_name",
                   "group_name", "group_headcount", "group_threshold"})
DEFAULT_PRIORITY = 0  # KubeShare's: a pod that names no priority is opportunistic
# Remote GPU shares need what only the pod's creation can give (an init container with the client
# libraries, their volume, the server and token in the env; no tessera.io/gpu-share slot), and a
# pod's spec cannot change once created: the kubectl path places locally only (README, "Remote").
REMOTE_REFUSED = ("remote GPU shares are not available to kubectl pods (their spec cannot receive the client "
                  "libraries once created): remove the label, or request through the portal with remote_allowed")
_QUANTITY = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti|K|M|G|T)?$")
_UNITS = {None: 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4,
          "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4}
MIB = 1024 * 1024


def team_for_namespace(namespace: str) -> Team | None:
    return (Team.objects.filter(namespace=namespace).first()
            or Team.objects.filter(slug=namespace, namespace="").first())


def _memory_mib(value: str) -> int:
    m = _QUANTITY.match(value.strip())
    if not m:
        raise ValueError(f"must be bytes or a quantity such as 8Gi, got {value!r}")
    total = int(m.group(1)) * _UNITS[m.group(2)]
    return -(-total // MIB)  # round up: a cap below what was asked would break the workload


def spec_from_pod(pod: ExternalPod) -> ReservationSpec:
    """Translate and validate; raises RuleViolation with per-label messages."""
    labels = {k[len(PREFIX):]: v for k, v in pod.labels.items() if k.startswith(PREFIX)}
    errors: dict[str, list[str]] = {}

    def bad(name: str, message: str) -> None:
        errors.setdefault(PREFIX + name, []).append(message)

    if "remote" in labels:
        bad("remote", REMOTE_REFUSED)
    for unknown in sorted(set(labels) - KNOWN - {"remote"}):
        bad(unknown, f"unknown label; Tessera reads {', '.join(PREFIX + k for k in sorted(KNOWN))}")
    team = team_for_namespace(pod.namespace)
    if team is None:
        errors.setdefault("namespace", []).append(f"namespace {pod.namespace} belongs to no Tessera team")
    request = count = None
    if "gpu_request" not in labels:
        bad("gpu_request", "required: the share of a GPU, e.g. \"0.5\"")
    else:
        try:
            raw = Decimal(labels["gpu_request"])
            if not raw.is_finite():
                raise InvalidOperation
        except InvalidOperation:
            bad("gpu_request", f"must be a number, got {labels['gpu_request']!r}")
        else:
            if raw > 1:
                if raw != raw.to_integral_value():
                    bad("gpu_request", "above 1 it counts whole GPUs and must be an integer")
                else:
                    request, count = Decimal(1), int(raw)
            else:
                request, count = raw, 1
    memory = None
    if "gpu_mem" in labels:
        try:
            memory = _memory_mib(labels["gpu_mem"])
        except ValueError as exc:
            bad("gpu_mem", str(exc))
    group = labels.get("pod_group_name", labels.get("group_name", ""))
    if labels.get("group_name", group) != group:
        bad("group_name", f"is another name of {PREFIX}pod_group_name, which says {group!r}: give one of them")
    model = display_model(labels.get("gpu_model", ""))  # the label-safe name stands for the display name
    if memory is None and request is not None and "gpu_mem" not in labels:
        cards = Gpu.objects.filter(Q(model__in=model.split("|")) if model else Q())
        smallest = cards.aggregate(m=Min("memory_mib"))["m"] or 0
        memory = max(1, int(smallest * request))  # per GPU; whole GPUs take the card
    if errors or team is None or request is None:
        raise RuleViolation(errors)
    spec = ReservationSpec(
        team=team, image=pod.image or "unknown", gpu_request=request, gpu_memory_mib=memory or 0,
        gpu_limit=labels.get("gpu_limit", Decimal(1) if count and count > 1 else None),
        gpu_count=count or 1, gpu_model=model, priority=labels.get("priority", DEFAULT_PRIORITY),
        name=pod.name if LABEL.match(pod.name) else "",
        group_name=group, group_headcount=labels.get("group_headcount"),
        group_threshold=labels.get("group_threshold"),
    )
    try:
        rules.check(spec)
    except RuleViolation as exc:
        # Speak in labels, which is what the kubectl user wrote.
        group_label = "pod_group_name" if "pod_group_name" in labels or "group_name" not in labels else "group_name"
        names = {"gpu_memory_mib": "gpu_mem", "group_name": group_label, "gpu_count": "gpu_request"}
        raise RuleViolation({(PREFIX + names.get(k, k)) if k not in ("image", "name", "command") else k: v
                             for k, v in exc.errors.items()}) from exc
    return spec
