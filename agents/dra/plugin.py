"""The kubelet DRA plugin of driver `gpu.tessera.io`: registration (the kubelet's plugin watcher finds
our socket in its plugins_registry directory and calls `Registration.GetInfo`) and the `v1` DRA
service (`NodePrepareResources` / `NodeUnprepareResources`) on a socket in its plugins directory.

Prepare reads each claim from the API server, takes the results of its allocation that are ours
(driver `gpu.tessera.io`, pool = this node), turns each device and its `consumedCapacity` into a GPU
share (compute milli-GPUs → the share, memory bytes → the cap in MiB), writes the claim's CDI spec
(`cdi.py`) and answers its CDI id. The share's reservation, limit and priority come from the
placement annotation our engine writes (`tessera.io/placement`) on the pod the claim is reserved for,
with the Binding, as on the device-plugin path (or on the claim itself); a claim the kube-scheduler
allocated has none: its share id is `claim-<uid>`, its limit its request,
its priority low.

Restart-safe and idempotent: every prepared claim is kept in a checkpoint file (written atomically,
with the CDI spec), so a claim prepared again (the kubelet retries, or restarted) is answered from
it without asking the API server, and a spec file that went missing is written again. Unprepare
deletes the spec and forgets the claim: the runtime no longer gives its GPU to new containers, and the
broker's share ends with the claim's last process, as on the device-plugin path. Unpreparing an
unknown claim succeeds (it may have been unprepared before a restart).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

import grpc
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from agents.gpus.base import GpuDevice
from agents.kube_client import kube_api_client
from scheduler.backends.base import HIGH_PRIORITY_FROM, GpuShare
from wire.pod_placement import PLACEMENT_ANNOTATION, PlacementError, parse_placement

from . import dra_pb2, dra_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc
from .cdi import CDI_DIR, cdi_id, claim_spec, spec_path, write_atomically
from .slices import COMPUTE, DRIVER, MEMORY, MIB, WHOLE_GPU_MILLI, device_name

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
DRA_SERVICE = "v1.DRAPlugin"  # what the kubelet looks for in supported_versions (k8s.io/kubelet dra/v1)
PLUGINS_DIR = f"/var/lib/kubelet/plugins/{DRIVER}"
REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
CHECKPOINT_VERSION = 1


class ClaimError(Exception):
    """This claim cannot be prepared here; the message says why (the kubelet shows it on the pod)."""


class ClaimReader(Protocol):
    def claim(self, namespace: str, name: str) -> dict: ...

    def pod_annotations(self, namespace: str, name: str) -> dict[str, str]:
        """The annotations of a pod ({} when it is gone)."""
        ...


class KubernetesClaims:
    """`ClaimReader` on the API server (in-cluster, or a host for tests)."""

    def __init__(self, *, host: str | None = None, token: str | None = None, timeout_s: float = 5.0) -> None:
        api_client = kube_api_client(host=host, token=token)
        self.resource = client.ResourceV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.timeout_s = timeout_s

    def pod_annotations(self, namespace: str, name: str) -> dict[str, str]:
        try:
            resp = self.core.read_namespaced_pod(name, namespace, _preload_content=False,
                                                 _request_timeout=self.timeout_s)
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise ClaimError(f"cannot read pod {namespace}/{name}: HTTP {exc.status} {exc.reason}") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ClaimError(f"cannot read pod {namespace}/{name}: {exc}") from exc
        try:
            return (json.loads(resp.data).get("metadata") or {}).get("annotations") or {}
        finally:
            resp.release_conn()

    def claim(self, namespace: str, name: str) -> dict:
        try:
            resp = self.resource.read_namespaced_resource_claim(name, namespace, _preload_content=False,
                                                                _request_timeout=self.timeout_s)
        except ApiException as exc:
            raise ClaimError(f"cannot read ResourceClaim {namespace}/{name}: HTTP {exc.status} {exc.reason}") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:  # the kubelet asks again
            raise ClaimError(f"cannot read ResourceClaim {namespace}/{name}: {exc}") from exc
        try:
            return json.loads(resp.data)
        finally:
            resp.release_conn()


@dataclass(frozen=True)
class Terms:
    share_id: str
    priority: int
    shares: tuple[GpuShare, ...]
    devices: tuple[tuple[str, str, str], ...]  # (request, pool, device) of each result that is ours


def claim_terms(claim: dict, uid: str, node: str, gpus: Sequence[GpuDevice],
                annotations: dict[str, str] | None = None) -> Terms:
    """The GPU shares a claim's allocation gives on this node; ClaimError when it gives none here.
    `annotations`: where the placement is (the claim's own, else its pod's)."""
    meta = claim.get("metadata") or {}
    where = f"ResourceClaim {meta.get('namespace')}/{meta.get('name')}"
    if meta.get("uid") != uid:
        raise ClaimError(f"{where} has uid {meta.get('uid')}, not {uid} (it was deleted and made again)")
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"{where} is not allocated")
    by_name = {device_name(g): g for g in gpus}
    shares, devices = [], []
    for result in (allocation.get("devices") or {}).get("results") or ():
        if result.get("driver") != DRIVER:
            continue
        if result.get("pool") != node:
            raise ClaimError(f"{where}: device {result.get('device')} is of pool {result.get('pool')}, "
                             f"not of this node ({node})")
        gpu = by_name.get(result.get("device", ""))
        if gpu is None:
            raise ClaimError(f"{where}: node {node} has no device {result.get('device')!r}")
        consumed = result.get("consumedCapacity") or {}
        try:
            milli = parse_quantity(consumed.get(COMPUTE, WHOLE_GPU_MILLI))
            memory = parse_quantity(consumed.get(MEMORY, gpu.memory_mib * MIB))
        except ValueError as exc:
            raise ClaimError(f"{where}: consumedCapacity of {device_name(gpu)} is not a quantity ({exc})") from exc
        if not (0 < milli <= WHOLE_GPU_MILLI) or not (MIB <= memory <= gpu.memory_mib * MIB):
            raise ClaimError(f"{where}: consumedCapacity of {device_name(gpu)} is out of range "
                             f"(compute {milli}, memory {memory} bytes)")
        request = float(milli / Decimal(WHOLE_GPU_MILLI))
        shares.append(GpuShare(uuid=gpu.uuid, index=gpu.index, gpu_request=request, gpu_limit=request,
                               gpu_memory_mib=int(memory // MIB)))
        devices.append((result.get("request", ""), node, device_name(gpu)))
    if not shares:
        raise ClaimError(f"{where} has no device of driver {DRIVER}")
    share_id, priority = f"claim-{uid}", 0
    annotations = annotations if annotations is not None else meta.get("annotations") or {}
    if PLACEMENT_ANNOTATION in annotations:
        try:
            placement = parse_placement(annotations)
        except PlacementError as exc:
            raise ClaimError(f"{where}: {exc}") from exc
        share_id = placement.reservation
        priority = HIGH_PRIORITY_FROM if placement.priority == "high" else 0
        shares = [GpuShare(s.uuid, s.index, s.gpu_request, max(s.gpu_request, placement.limit), s.gpu_memory_mib)
                  for s in shares]
    return Terms(share_id, priority, tuple(shares), tuple(devices))


class Checkpoint:
    """The prepared claims, by uid, in one JSON file replaced atomically on every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.claims: dict[str, dict[str, Any]] = {}
        if path.exists():
            data = json.loads(path.read_text())
            if data.get("version") != CHECKPOINT_VERSION:
                raise ValueError(f"{path}: checkpoint version {data.get('version')}, expected {CHECKPOINT_VERSION}")
            self.claims = data["claims"]

    def save(self) -> None:
        write_atomically(self.path, {"version": CHECKPOINT_VERSION, "claims": self.claims})


class DraService(dra_pb2_grpc.DRAPluginServicer):
    def __init__(self, node: str, gpus: Sequence[GpuDevice], claims: ClaimReader, *, state_dir: str | Path,
                 cdi_dir: str | Path = CDI_DIR) -> None:
        self.node = node
        self.gpus = list(gpus)
        self.claims = claims
        self.cdi_dir = Path(cdi_dir)
        self.checkpoint = Checkpoint(Path(state_dir) / "checkpoint.json")
        self.api_reads = 0
        self._lock = threading.Lock()  # one change of the checkpoint at a time

    def NodePrepareResources(self, request, context):
        answer = dra_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            try:
                devices = self._prepare(claim)
                answer.claims[claim.uid].devices.extend(devices)
            except (ClaimError, OSError) as exc:
                log.warning("prepare %s/%s (%s): %s", claim.namespace, claim.name, claim.uid, exc)
                answer.claims[claim.uid].error = str(exc)
        return answer

    def NodeUnprepareResources(self, request, context):
        answer = dra_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            try:
                self._unprepare(claim.uid)
                answer.claims[claim.uid].CopyFrom(dra_pb2.NodeUnprepareResourceResponse())
            except OSError as exc:
                answer.claims[claim.uid].error = str(exc)
        return answer

    def _prepare(self, claim: dra_pb2.Claim) -> list[dra_pb2.Device]:
        with self._lock:
            entry = self.checkpoint.claims.get(claim.uid)
            if entry is None:
                self.api_reads += 1
                obj = self.claims.claim(claim.namespace, claim.name)
                terms = claim_terms(obj, claim.uid, self.node, self.gpus, self._placement_of(obj))
                entry = {"namespace": claim.namespace, "name": claim.name, "share_id": terms.share_id,
                         "devices": [list(d) for d in terms.devices],
                         "spec": claim_spec(claim.uid, terms.share_id, terms.shares, terms.priority)}
                write_atomically(spec_path(self.cdi_dir, claim.uid), entry["spec"])
                self.checkpoint.claims[claim.uid] = entry
                self.checkpoint.save()
                log.info("prepared %s/%s: share %s", claim.namespace, claim.name, terms.share_id)
            elif not spec_path(self.cdi_dir, claim.uid).exists():
                write_atomically(spec_path(self.cdi_dir, claim.uid), entry["spec"])  # the runtime's dir was wiped
        return [dra_pb2.Device(request_names=[request] if request else [], pool_name=pool, device_name=device,
                               cdi_device_ids=[cdi_id(claim.uid)]) for request, pool, device in entry["devices"]]

    def _placement_of(self, claim: dict) -> dict[str, str]:
        """The annotations that carry the claim's placement: its own, else those of the pod it is
        reserved for (Tessera's Binding put the placement there, as on the device-plugin path)."""
        own = (claim.get("metadata") or {}).get("annotations") or {}
        if PLACEMENT_ANNOTATION in own:
            return own
        pods = [r for r in (claim.get("status") or {}).get("reservedFor") or () if r.get("resource") == "pods"]
        if not pods:
            return own
        self.api_reads += 1
        return self.claims.pod_annotations(claim["metadata"]["namespace"], pods[0]["name"])

    def _unprepare(self, uid: str) -> None:
        with self._lock:
            spec_path(self.cdi_dir, uid).unlink(missing_ok=True)
            if self.checkpoint.claims.pop(uid, None) is not None:
                self.checkpoint.save()
                log.info("unprepared claim %s", uid)


class RegistrationService(pluginregistration_pb2_grpc.RegistrationServicer):
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.registered = threading.Event()
        self.error = ""

    def GetInfo(self, request, context):
        return pluginregistration_pb2.PluginInfo(type=PLUGIN_TYPE, name=DRIVER, endpoint=self.endpoint,
                                                 supported_versions=[DRA_SERVICE])

    def NotifyRegistrationStatus(self, request, context):
        self.error = request.error
        if request.plugin_registered:
            self.registered.set()
            log.info("the kubelet registered driver %s", DRIVER)
        else:
            self.registered.clear()
            log.warning("the kubelet refused driver %s: %s", DRIVER, request.error)
        return pluginregistration_pb2.RegistrationStatusResponse()


class PluginRunner:
    """Serves the DRA service on `<plugins dir>/dra.sock` and registration on
    `<registry dir>/gpu.tessera.io-reg.sock`; serves again when a socket disappears."""

    def __init__(self, service: DraService, *, plugins_dir: str | Path = PLUGINS_DIR,
                 registry_dir: str | Path = REGISTRY_DIR, check_every_s: float = 1.0) -> None:
        self.service = service
        self.dra_socket = Path(plugins_dir) / "dra.sock"
        self.registration_socket = Path(registry_dir) / f"{DRIVER}-reg.sock"
        self.registration = RegistrationService(str(self.dra_socket))
        self.check_every_s = check_every_s
        self._server: grpc.Server | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0)
        for path in (self.dra_socket, self.registration_socket):
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():
                path.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="tessera-dra"))
        dra_pb2_grpc.add_DRAPluginServicer_to_server(self.service, server)
        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(self.registration, server)
        server.add_insecure_port(f"unix://{self.dra_socket}")
        server.add_insecure_port(f"unix://{self.registration_socket}")
        server.start()
        self._server = server
        log.info("serving %s at %s, registration at %s", DRA_SERVICE, self.dra_socket, self.registration_socket)

    def run(self) -> None:
        while not self._stop.wait(self.check_every_s):
            if not (os.path.exists(self.dra_socket) and os.path.exists(self.registration_socket)):
                log.info("a plugin socket is gone; serving again")
                self.start()

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.stop(grace=1).wait()
            self._server = None
