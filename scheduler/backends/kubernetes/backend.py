"""`KubernetesBackend`: the `scheduler.backends.base.Backend` contract on a real cluster, through the
official client. Read `scheduler/backends/base.py` for what each call promises."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from kubernetes import client

from wire.pod_placement import parse_placement

from ..base import (
    REASON_ANNOTATION,
    RESERVATION_LABEL,
    BackendError,
    ClusterEvent,
    ExternalBinding,
    ExternalPod,
    GpuShare,
    NodeCondition,
    PermanentBackendError,
    PodConflict,
    PodRef,
    PodSpec,
    PodStatus,
    Terminal,
    TransientBackendError,
)
from . import dra, portal_claims
from .api import BIND_CONCURRENCY, Conflict, KubeApi, NotFound, RetryPolicy, make_api_client
from .manifests import (
    DEFAULT_CLIENT_IMAGE,
    binding_manifest,
    check_labels,
    event_manifest,
    event_name,
    external_pod,
    is_pending_external,
    node_condition,
    pod_manifest,
    pod_status,
    scheduler_names,
)
from .terminal import open_exec_terminal
from .watch import ClusterWatch

log = logging.getLogger(__name__)

LIST_PAGE = 500
# A pod this process deleted is not deleted again for this long (the reason it carries is kept, and
# the API server is not asked again while the pod terminates).
DELETED_MEMORY_S = 600.0
# A refused kubectl pod's Warning Event: its count is brought up to date at most this often.
EVENT_REFRESH_S = 60.0
MEMORY_ENTRIES = 10_000
# A cluster that answered that it serves no resource.k8s.io/v1 is asked again this rarely (an
# upgrade to 1.34+ brings DRA in; until then housekeeping's list of claims would be a 404 each run).
DRA_RECHECK_S = 3600.0


def scheduler_names_option(value: Sequence[str] | str | None) -> tuple[str, ...]:
    if value is None:
        value = os.environ.get("TESSERA_SCHEDULER_NAMES", "")
    return scheduler_names(value)


class KubernetesBackend:
    """Pods on a Kubernetes cluster. Options (all keywords, as `scheduler.backends.create` passes them):

    - where: `host` (+ `token`, `verify_ssl`) for an explicit API server; else `in_cluster`
      (default: when running in a pod) or `kubeconfig` / `context`
    - `retry`: a `RetryPolicy` or a dict of its fields (attempts, base_s, max_s, timeouts)
    - `watch_timeout_s`: server-side length of one watch request (then it is renewed)
    - `runtime_class`: the pods' RuntimeClass (default: $TESSERA_RUNTIME_CLASS, else "nvidia";
      None or "" to leave it out, for clusters whose default runtime is already NVIDIA's)
    - `scheduler_names`: the `schedulerName`s of the kubectl pods Tessera places (default:
      $TESSERA_SCHEDULER_NAMES, else "tessera,kubeshare-scheduler", so KubeShare manifests run as they are)
    - `client_image`: the image whose init container gives a remote share's pod the client libraries
      (default: $TESSERA_REMOTE_CLIENT_IMAGE, else the agent image `tessera/agent:0.1.0`)
    - `namespace`: where the portal puts reservation pods (each `PodSpec` carries its own; kept for
      reference). Lists and watches are cluster-wide: kubectl pods live in the teams' namespaces.
    - `sharing`: how portal pods get their share, "auto" (default: $TESSERA_KUBERNETES_SHARING, else
      auto), "deviceplugin" or "dra" (portal_claims.py)
    """

    name = "kubernetes"
    watches_nodes = True
    # Pods created at once by a batch of binds: each bind waits on the API server (two round
    # trips), so a batch of hundreds would otherwise take seconds. The client's connection pool is
    # at least this big (see make_api_client).
    bind_concurrency = BIND_CONCURRENCY

    def __init__(self, *, host: str | None = None, token: str | None = None, verify_ssl: bool = True,
                 kubeconfig: str | None = None, context: str | None = None, in_cluster: bool | None = None,
                 retry: RetryPolicy | Mapping[str, Any] | None = None, watch_timeout_s: int = 60,
                 runtime_class: str | None = None, namespace: str = "tessera",
                 scheduler_names: Sequence[str] | str | None = None, client_image: str | None = None,
                 sharing: str | None = None, api_client: client.ApiClient | None = None) -> None:
        policy = retry if isinstance(retry, RetryPolicy) else RetryPolicy(**dict(retry or {}))
        api_client = api_client or make_api_client(host=host, token=token, kubeconfig=kubeconfig,
                                                   context=context, in_cluster=in_cluster,
                                                   verify_ssl=verify_ssl)
        self.api = KubeApi(api_client, policy)
        if runtime_class is None:
            runtime_class = os.environ.get("TESSERA_RUNTIME_CLASS", "nvidia")
        self.runtime_class = runtime_class.strip() or None
        self.client_image = (client_image or os.environ.get("TESSERA_REMOTE_CLIENT_IMAGE")
                             or DEFAULT_CLIENT_IMAGE).strip()
        self.scheduler_names = scheduler_names_option(scheduler_names)
        self.sharing = portal_claims.sharing_option(sharing or os.environ.get("TESSERA_KUBERNETES_SHARING") or "auto")
        self.namespace = namespace
        self._memory_lock = threading.Lock()
        self._deleted: OrderedDict[tuple[str, str], float] = OrderedDict()  # pod -> when we deleted it
        self._events: OrderedDict[tuple[str, str], list] = OrderedDict()  # event -> [count, sent at, uid]
        self.claims = dra.ClaimAllocator(self.api)
        self.portal_claims = portal_claims.PortalClaims(self)
        self._slices: dict[str, dict[str, int]] = {}  # node -> GPU UUID -> index, from its ResourceSlice
        self._slice_reads: dict[str, threading.Lock] = {}  # node -> held while its slice is read
        # Claims as the last listing read them: binding starts from them (a stale one costs a 409 and a read).
        self._claims: OrderedDict[tuple[str, str], dict] = OrderedDict()
        self._claim_pods: OrderedDict[tuple[str, str], dict] = OrderedDict()  # DRA pods as last listed
        self.dra_recheck_s = DRA_RECHECK_S
        self._no_dra_since: float | None = None  # monotonic: when the cluster said it serves no resource.k8s.io/v1
        self.watch = ClusterWatch(self.api, pod_selector=RESERVATION_LABEL, timeout_s=watch_timeout_s,
                                  backoff_max_s=policy.max_s)

    # -- pods for portal reservations ----------------------------------------------------------------

    def bind(self, spec: PodSpec) -> PodStatus:
        self._check_node(spec.node)
        return self._create(spec)

    def _check_node(self, node: str) -> None:
        try:
            self.api.call_json(f"read node {node}", self.api.core.read_node, node)
        except NotFound as exc:
            raise PermanentBackendError(f"node {node!r} does not exist in the cluster") from exc

    def _create(self, spec: PodSpec) -> PodStatus:
        manifest = pod_manifest(spec, runtime_class=self.runtime_class, client_image=self.client_image)
        if not spec.remote and self.portal_claims.in_use():
            return self.portal_claims.create(spec, manifest)
        try:
            created = self.api.call_json("create pod", self.api.core.create_namespaced_pod, spec.namespace, manifest)
            return pod_status(created)
        except NotFound as exc:
            raise PermanentBackendError(f"namespace {spec.namespace!r} does not exist: {exc}") from exc
        except Conflict:
            # A pod of this name exists: ours from an earlier try whose answer was lost, or another's.
            return self._adopt(spec)

    def bind_many(self, specs: Sequence[PodSpec]) -> list[PodStatus | BackendError]:
        """`bind` for each spec, side by side (at most bind_concurrency calls in flight), with each
        distinct node read once for the whole batch rather than once per pod: a batch of 200 pods
        lands on a few dozen nodes, so this halves the round trips."""
        def guarded(call: Callable[[], PodStatus | None]) -> PodStatus | BackendError | None:
            try:
                return call()
            except BackendError as exc:
                return exc

        def run(calls: list[Callable[[], PodStatus | None]]) -> list[PodStatus | BackendError | None]:
            workers = min(self.bind_concurrency, len(calls))
            if workers <= 1:
                return [guarded(call) for call in calls]
            with ThreadPoolExecutor(workers, thread_name_prefix="bind") as pool:
                return list(pool.map(guarded, calls))

        nodes = sorted({spec.node for spec in specs})
        node_errors = dict(zip(nodes, run([lambda n=n: self._check_node(n) for n in nodes]), strict=True))
        fine = [i for i, spec in enumerate(specs) if node_errors[spec.node] is None]
        created = dict(zip(fine, run([lambda s=specs[i]: self._create(s) for i in fine]), strict=True))
        return [created[i] if i in created else node_errors[spec.node] for i, spec in enumerate(specs)]

    def _adopt(self, spec: PodSpec) -> PodStatus:
        try:
            existing = self.api.call_json("read pod", self.api.core.read_namespaced_pod, spec.name, spec.namespace)
        except NotFound as exc:
            # It was there a moment ago and is gone now (deleted between our calls): try again later.
            raise TransientBackendError(f"pod {spec.namespace}/{spec.name} vanished while adopting") from exc
        status = pod_status(existing)
        if status.reservation_id != spec.reservation_id or status.external:
            raise PodConflict(f"pod {spec.namespace}/{spec.name} exists for reservation "
                              f"{status.reservation_id!r}, not {spec.reservation_id!r}")
        if status.deleting:
            raise TransientBackendError(f"pod {spec.namespace}/{spec.name} is still terminating")
        log.info("adopted existing pod %s/%s for reservation %s", spec.namespace, spec.name, spec.reservation_id)
        return status

    def unbind(self, ref: PodRef, grace_s: int, reason: str) -> bool:
        """One DELETE per pod: a pod already terminating (this process deleted it, or the watch saw
        its deletionTimestamp) is left alone. The reason goes on after the delete, and only where the
        pod has none yet, so the first reason given is the one kept. True when this call deleted it."""
        if grace_s < 0:
            raise ValueError("grace_s: must be >= 0")
        key = (ref.namespace, ref.name)
        seen = self.watch.seen_pod(*key)
        if self._deleted_lately(key) or (seen is not None and seen.deleting):
            return False
        try:
            gone = self.api.call_json("delete pod", self.api.core.delete_namespaced_pod, ref.name, ref.namespace,
                             grace_period_seconds=grace_s, propagation_policy="Background")
        except NotFound:
            return False
        except Conflict as exc:
            raise TransientBackendError(str(exc)) from exc
        self._remember(self._deleted, key, time.monotonic())
        if REASON_ANNOTATION not in ((gone.get("metadata") or {}).get("annotations") or {}):
            try:
                # Why it goes, for whoever looks at the pod while it terminates (and for us on reconcile).
                self.api.call_json("annotate pod", self.api.core.patch_namespaced_pod, ref.name, ref.namespace,
                          {"metadata": {"annotations": {REASON_ANNOTATION: reason[:1024]}}})
            except (NotFound, Conflict):
                pass  # already gone: nobody left to read it
            except BackendError as exc:
                log.info("could not record why pod %s/%s goes: %s", ref.namespace, ref.name, exc)
        return True

    def pod_log(self, ref: PodRef, tail_lines: int = 200) -> str | None:
        """The pod's log (its only container's), last `tail_lines` lines with timestamps."""
        try:
            return self.api.call(f"read log of pod {ref.namespace}/{ref.name}", self.api.core.read_namespaced_pod_log,
                                 ref.name, ref.namespace, tail_lines=tail_lines, timestamps=True)
        except NotFound:
            return None

    def open_terminal(self, ref: PodRef, rows: int, cols: int) -> Terminal:
        """A shell in the pod through the exec subresource. On a client of its own: the stream
        helper swaps the client's request method while it connects, which would send other
        threads' calls (binds, the watch) over WebSockets."""
        own = client.CoreV1Api(client.ApiClient(configuration=self.api.api_client.configuration))
        return open_exec_terminal(own, ref, rows, cols)

    def app_address(self, ref: PodRef, port: int) -> str | None:
        """The pod's IP (deploy/'s NetworkPolicy admits only the portal to its app port)."""
        try:
            pod = self.api.call_json(f"read pod {ref.namespace}/{ref.name}", self.api.core.read_namespaced_pod,
                            ref.name, ref.namespace)
        except NotFound:
            return None
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            return None
        return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"

    def _deleted_lately(self, key: tuple[str, str]) -> bool:
        with self._memory_lock:
            at = self._deleted.get(key)
            return at is not None and time.monotonic() - at < DELETED_MEMORY_S

    def _remember(self, memory: OrderedDict, key: tuple[str, str], value: object) -> None:
        with self._memory_lock:
            memory.pop(key, None)
            memory[key] = value
            while len(memory) > MEMORY_ENTRIES:
                memory.popitem(last=False)

    def list_pods(self) -> list[PodStatus]:
        return [pod_status(o) for o in self._list_all("list pods", self.api.core.list_pod_for_all_namespaces,
                                                      label_selector=RESERVATION_LABEL)]

    def list_nodes(self) -> list[NodeCondition]:
        return [node_condition(o) for o in self._list_all("list nodes", self.api.core.list_node)]

    def poll(self, timeout_s: float) -> list[ClusterEvent]:
        self.watch.start()
        return self.watch.drain(timeout_s)

    # -- kubectl path --------------------------------------------------------------------------------

    def list_pending_external(self) -> list[ExternalPod]:
        objs = [o for name in self.scheduler_names
                for o in self._list_all("list pending pods", self.api.core.list_pod_for_all_namespaces,
                                        field_selector=f"spec.schedulerName={name},spec.nodeName=")]
        objs = [o for o in objs if is_pending_external(o, self.scheduler_names)]
        claimed = [o for o in objs if dra.uses_claims(o)]
        claims = self.claims.list_claims() if claimed else {}
        pods = [external_pod(o) for o in objs if not dra.uses_claims(o)]
        for obj in claimed:
            pod = external_pod(obj)
            try:
                keys = [(pod.namespace, n) for n in dra.pod_claim_names(obj)]
            except dra.ClaimError:
                continue  # a claim not made from its template yet: the pod waits for it
            if any(k not in claims for k in keys):
                continue  # a claim it names does not exist (yet): the kubelet would not start it either
            try:
                terms = dra.claim_terms([claims[k] for k in keys])
            except dra.ClaimError as exc:
                self.reject_external(pod.ref, f"tessera: {exc}")
                continue
            if terms is None:  # no claim of ours: a KubeShare-labelled pod that also uses other devices
                pods.append(pod)
                continue
            pods.append(replace(pod, labels={**pod.labels, **dra.terms_as_labels(terms)}))  # admitted as if labelled
            for key in keys:
                self._remember(self._claims, key, claims[key])
            self._remember(self._claim_pods, (pod.namespace, pod.name), obj)
        return sorted(pods, key=lambda p: (p.created_at, p.namespace, p.name))

    def bind_external(self, pod: PodRef, node: str, labels: Mapping[str, str],
                      annotations: Mapping[str, str]) -> None:
        check_labels(labels)
        with self._memory_lock:
            listed = self._claim_pods.pop((pod.namespace, pod.name), None)
        # A DRA pod as the listing read it spares a read: its claim's write and the Binding check the
        # rest (a pod bound meanwhile answers the Binding 409, then it is read; one gone, 404).
        current = listed or self._read_external(pod)
        bound_to = (current.get("spec") or {}).get("nodeName")
        if bound_to:
            self.check_bound(pod, node, bound_to)
            return
        marked = RESERVATION_LABEL in ((current.get("metadata") or {}).get("labels") or {})
        try:
            if not marked:
                # No webhook marked it at creation, so the watch (which selects RESERVATION_LABEL)
                # would not see it: the labels go on first, in their own write (beside the claims'
                # allocation, which is another object: both before the Binding).
                patch = {"metadata": {"labels": dict(labels), "annotations": dict(annotations)}}
                self._beside(lambda: self._allocate_claims(pod, current, node, annotations)
                             if dra.uses_claims(current) else None,
                             lambda: self.api.call_json("label pod", self.api.core.patch_namespaced_pod, pod.name,
                                               pod.namespace, patch))
            elif dra.uses_claims(current):
                self._allocate_claims(pod, current, node, annotations)
            # The placement rides on the Binding: the API server puts it on the pod with its node, in
            # one write, so the device plugin finds it as soon as the kubelet sees the pod.
            self.api.bind(pod.namespace, pod.name, binding_manifest(pod.namespace, pod.name, node, annotations))
        except NotFound as exc:
            raise PodConflict(f"pod {pod.namespace}/{pod.name} is gone") from exc
        except Conflict:
            # Bound meanwhile: by our own earlier try (answer lost) or by someone else.
            after = self._read_external(pod)
            self.check_bound(pod, node, (after.get("spec") or {}).get("nodeName") or "")

    def bind_external_many(self, bindings: Sequence[ExternalBinding]) -> list[BackendError | None]:
        """`bind_external` for each, side by side (at most bind_concurrency pods in flight): a pod's
        own writes stay in their order (its claims' allocation before its Binding), while one pod's
        Binding and the next one's claim write overlap instead of waiting on each other."""
        def one(b: ExternalBinding) -> BackendError | None:
            try:
                self.bind_external(b.pod, b.node, b.labels, b.annotations)
            except BackendError as exc:
                return exc
            return None

        workers = min(self.bind_concurrency, len(bindings))
        if workers <= 1:
            return [one(b) for b in bindings]
        # The ResourceSlices of the DRA pods' nodes not read yet, all at once first: else the pods
        # placed on one node wait, side by side, for the one of them that reads its slice, node after node.
        with self._memory_lock:
            cold = sorted({b.node for b in bindings if (b.pod.namespace, b.pod.name) in self._claim_pods}
                          - set(self._slices))
        with ThreadPoolExecutor(workers, thread_name_prefix="bind-external") as pool:
            list(pool.map(self._warm_slice, cold))
            return list(pool.map(one, bindings))

    def _warm_slice(self, node: str) -> None:
        """Read the node's slice into the index `on_slice` keeps, if nobody has (a failure is left to
        the bind that needs it, which says what is wrong)."""
        with self._memory_lock:
            reading = self._slice_reads.setdefault(node, threading.Lock())
        with reading:
            if node in self._slices:
                return
            try:
                index = dra.devices_by_uuid(self.claims.read_slice(node))
            except BackendError:
                return
            with self._memory_lock:
                self._slices[node] = index

    def _beside(self, first: Callable[[], Any], second: Callable[[], Any]) -> None:
        """Both calls at once (`second` in another thread); the first failure is raised once both ended."""
        with ThreadPoolExecutor(1, thread_name_prefix="beside") as pool:
            later = pool.submit(second)
            try:
                first()
            finally:
                later.result()

    def _allocate_claims(self, pod: PodRef, obj: dict, node: str, annotations: Mapping[str, str]) -> None:
        """Before the Binding: allocate the pod's claims of our classes to the placed GPUs (one status
        write each), so the kubelet finds them allocated and reserved when the pod reaches it."""
        placement = parse_placement(annotations)  # ours, written by this backend a moment ago
        gpus = self.on_slice(node, [GpuShare(uuid=u, index=-1, gpu_request=placement.request,
                                             gpu_limit=placement.limit, gpu_memory_mib=placement.memory_mib)
                                    for u in placement.gpus])
        for name in dra.pod_claim_names(obj):
            with self._memory_lock:
                claim = self._claims.pop((pod.namespace, name), None)
            try:
                claim = claim or self.claims.read_claim(pod.namespace, name)
            except NotFound as exc:
                raise PodConflict(f"claim {pod.namespace}/{name} of pod {pod.name} is gone") from exc
            if dra.names_our_class(claim):
                self.claims.allocate(claim, pod, obj["metadata"]["uid"], node, gpus)

    def foreign_shares(self) -> list[dra.ForeignShare]:
        """What claims allocated by another scheduler (pods left to the default kube-scheduler that
        name our DeviceClasses) hold of our GPUs: one list of the claims. Empty where the cluster
        serves no resource.k8s.io/v1 (nothing can be held through it): once it answered so, it is
        not asked again for `dra_recheck_s`."""
        if self._no_dra_since is not None and time.monotonic() - self._no_dra_since < self.dra_recheck_s:
            return []
        try:
            claims = self.claims.list_claims()
        except NotFound:
            log.info("the cluster serves no resource.k8s.io/v1: no claims are read for %g s", self.dra_recheck_s)
            self._no_dra_since = time.monotonic()
            return []
        self._no_dra_since = None
        return dra.foreign_shares(list(claims.values()))

    def on_slice(self, node: str, gpus: Sequence[GpuShare]) -> list[GpuShare]:
        """The shares with each GPU's index as the node's ResourceSlice names its device (read once per
        node, again when it lacks a GPU: the node's GPUs changed)."""
        index = self._slices.get(node) or {}
        if any(g.uuid not in index for g in gpus):
            with self._memory_lock:
                reading = self._slice_reads.setdefault(node, threading.Lock())
            with reading:  # pods bound side by side on one node: one of them reads its slice
                index = self._slices.get(node) or {}
                if any(g.uuid not in index for g in gpus):
                    try:
                        index = dra.devices_by_uuid(self.claims.read_slice(node))
                    except NotFound as exc:
                        raise PermanentBackendError(f"node {node} publishes no ResourceSlice of {dra.DRIVER}") from exc
                    with self._memory_lock:
                        self._slices[node] = index
        missing = [g.uuid for g in gpus if g.uuid not in index]
        if missing:
            raise PodConflict(f"node {node}'s ResourceSlice has no GPU {', '.join(missing)}")
        return [replace(g, index=index[g.uuid]) for g in gpus]

    def reject_external(self, pod: PodRef, reason: str) -> None:
        """A Warning Event on the pod, posted once; the same refusal again only counts up (the count
        written at most every EVENT_REFRESH_S), as kube-scheduler's event recorder does."""
        key = (pod.namespace, event_name(pod.name, "FailedScheduling", reason))
        with self._memory_lock:
            known = self._events.get(key)
            if known is not None:
                known[0] += 1
                if time.monotonic() - known[1] < EVENT_REFRESH_S:
                    return
                known[1] = time.monotonic()
                count = known[0]
        if known is not None:
            self._count_event(pod, key, count)
            return
        try:
            obj = self.api.call_json("read pod", self.api.core.read_namespaced_pod, pod.name, pod.namespace)
        except NotFound:
            return  # nobody left to tell
        uid = (obj.get("metadata") or {}).get("uid", "")
        event = event_manifest(namespace=pod.namespace, pod_name=pod.name, pod_uid=uid,
                               reason="FailedScheduling", message=reason)
        try:
            self.api.call_json("record event", self.api.core.create_namespaced_event, pod.namespace, event)
            count = 1
        except NotFound:
            return
        except Conflict:
            # Recorded by another process (or before a restart): count this one on it.
            try:
                existing = self.api.call_json("read event", self.api.core.read_namespaced_event, key[1], pod.namespace)
            except NotFound:
                return
            count = int(existing.get("count") or 1) + 1
            self._count_event(pod, key, count)
        self._remember(self._events, key, [count, time.monotonic(), uid])

    def _count_event(self, pod: PodRef, key: tuple[str, str], count: int) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:
            self.api.call_json("count event", self.api.core.patch_namespaced_event, key[1], pod.namespace,
                      {"count": count, "lastTimestamp": stamp})
        except NotFound:
            with self._memory_lock:  # expired (events live an hour): the next refusal posts it anew
                self._events.pop(key, None)

    def _read_external(self, pod: PodRef) -> dict:
        try:
            obj = self.api.call_json("read pod", self.api.core.read_namespaced_pod, pod.name, pod.namespace)
        except NotFound as exc:
            raise PodConflict(f"pod {pod.namespace}/{pod.name} is gone") from exc
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            raise PodConflict(f"pod {pod.namespace}/{pod.name} is being deleted")
        return obj

    @staticmethod
    def check_bound(pod: PodRef, node: str, bound_to: str) -> None:
        if bound_to != node:
            raise PodConflict(f"pod {pod.namespace}/{pod.name} is bound to {bound_to or 'no node'}, not {node}")

    # -- plumbing ------------------------------------------------------------------------------------


    def _list_all(self, what: str, fn: Any, **kwargs: Any) -> list[dict]:
        items: list[dict] = []
        token = None
        while True:
            page = self.api.call_json(what, fn, limit=LIST_PAGE, **({"_continue": token} if token else {}), **kwargs)
            items.extend(page.get("items") or ())
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    def close(self) -> None:
        self.watch.stop()
        self.api.close()
