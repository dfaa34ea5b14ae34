"""Pod and node watches in background threads, turned into `ClusterEvent`s for `poll()`.

Each resource kind has one thread: list (to learn the resourceVersion), then watch from there with a
server-side timeout, again and again. A 410 Gone (the watch fell out of the API server's window)
means a relist; on relist the current state of anything that changed since we last knew is reported,
and pods that vanished meanwhile are reported deleted. Errors back off and retry; nothing here raises
into the caller.

Undrained events are coalesced: per pod (namespace, name, uid) and per node only the latest is kept.
Each worker process that polls runs its own watch, and one that polls rarely then reports the current
state of what changed, never a stale history (a node that was NotReady for a moment and is Ready again
comes out Ready, not as a NotReady replayed late). Memory stays bounded by the number of objects.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from ..base import BackendError, ClusterEvent, NodeCondition, NodeEvent, PodEvent, PodStatus
from .api import KubeApi
from .manifests import node_condition, pod_status

log = logging.getLogger(__name__)


class ClusterWatch:
    def __init__(self, api: KubeApi, *, pod_selector: str, timeout_s: int = 60,
                 backoff_max_s: float = 5.0) -> None:
        self._api = api
        self._pod_selector = pod_selector
        self._timeout_s = timeout_s
        self._backoff_max_s = backoff_max_s
        self._pending: OrderedDict[Hashable, ClusterEvent] = OrderedDict()
        self._arrived = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._rng = random.Random()
        self._lock = threading.Lock()
        self._open: set[Any] = set()  # watch responses being read
        self._pods: dict[tuple[str, str], PodStatus] = {}  # what the pod watch last saw of each pod
        self.relists = 0  # how many times a list was needed (start, 410, errors): telemetry and tests

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        core = self._api.core
        pods = self._pods = {}
        nodes: dict[str, tuple[bool, str]] = {}
        self._threads = [
            threading.Thread(target=self._run, name="tessera-watch-pods", daemon=True, args=(
                "pods", core.list_pod_for_all_namespaces, {"label_selector": self._pod_selector},
                lambda typ, obj: self._on_pod(pods, typ, obj), lambda objs: self._relisted_pods(pods, objs))),
            threading.Thread(target=self._run, name="tessera-watch-nodes", daemon=True, args=(
                "nodes", core.list_node, {}, lambda typ, obj: self._on_node(nodes, typ, obj),
                lambda objs: self._relisted_nodes(nodes, objs))),
        ]
        for t in self._threads:
            t.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        with self._lock:
            for resp in self._open:
                # Unblocks the thread reading the stream; it may be closing it at this very moment.
                with contextlib.suppress(ValueError, OSError):
                    resp.shutdown()
        for t in self._threads:
            t.join(timeout_s)

    def seen_pod(self, namespace: str, name: str) -> PodStatus | None:
        """The pod as the running watch last saw it (None when not watching, or not seen)."""
        return self._pods.get((namespace, name)) if self.running else None

    def undelivered(self) -> list[ClusterEvent]:
        """What the next `drain` would return now, left in place (to wait until the watch has seen a change)."""
        with self._arrived:
            return list(self._pending.values())

    def drain(self, timeout_s: float) -> list[ClusterEvent]:
        """What changed since the last call (latest event per object, oldest change first), waiting at
        most `timeout_s` for something to happen."""
        with self._arrived:
            if not self._pending and timeout_s > 0:
                self._arrived.wait_for(lambda: bool(self._pending), timeout=timeout_s)
            out = list(self._pending.values())
            self._pending.clear()
        return out

    # -- the loop ---------------------------------------------------------------------------------

    def _run(self, kind: str, list_fn: Callable[..., Any], selector: Mapping[str, str],
             on_event: Callable[[str, dict], None], on_relist: Callable[[list[dict]], None]) -> None:
        rv: str | None = None
        failures = 0
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self._relist(kind, list_fn, selector, on_relist)
                rv = self._follow(kind, list_fn, selector, rv, on_event)
                failures = 0
            except ApiException as exc:
                if self._stop.is_set():
                    break
                if exc.status == 410:
                    log.info("%s watch expired (410 Gone); relisting", kind)
                    rv = None
                    continue
                failures += 1
                log.warning("%s watch failed: HTTP %s %s", kind, exc.status, exc.reason)
            except (urllib3.exceptions.HTTPError, OSError, BackendError, ValueError) as exc:
                if self._stop.is_set():
                    break  # stop() cut the stream
                failures += 1
                log.warning("%s watch failed: %s: %s", kind, type(exc).__name__, exc)
            except Exception:
                # Anything else (an answer of a shape we did not expect) must not end the thread: the
                # watch would be silently dead. Log it loudly and start over from a list.
                if self._stop.is_set():
                    break
                failures += 1
                log.exception("%s watch: unexpected error", kind)
            if failures:
                # After a failure the stream position may be stale or the server may have restarted:
                # relist so nothing in between is missed.
                rv = None
                self._stop.wait(self._rng.uniform(0, min(self._backoff_max_s, 0.1 * 2 ** min(failures, 10))))

    def _follow(self, kind: str, list_fn: Callable[..., Any], selector: Mapping[str, str], rv: str,
                on_event: Callable[[str, dict], None]) -> str:
        """One watch request from `rv` until the server ends it; returns the position reached."""
        resp = list_fn(watch=True, resource_version=rv, timeout_seconds=self._timeout_s,
                       allow_watch_bookmarks=True, _preload_content=False,
                       _request_timeout=(self._api.policy.connect_timeout_s, self._timeout_s + 10), **selector)
        with self._lock:
            self._open.add(resp)
        try:
            if self._stop.is_set():  # stopped while we connected: stop() did not see this response
                return rv
            for line in iter_resp_lines(resp):
                if self._stop.is_set():
                    break
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    # The Status the API server sends in-stream, e.g. 410 Gone for an expired position.
                    raise ApiException(status=obj.get("code") or 500, reason=obj.get("message") or "watch error")
                rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                if event.get("type") != "BOOKMARK":
                    on_event(event["type"], obj)
            return rv
        finally:
            with self._lock:
                self._open.discard(resp)
            resp.release_conn()

    def _relist(self, kind: str, list_fn: Callable[..., Any], selector: Mapping[str, str],
                on_relist: Callable[[list[dict]], None]) -> str:
        self.relists += 1
        items: list[dict] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": 500, **selector}
            if token:
                kwargs["_continue"] = token
            resp = self._api.call(f"list {kind}", list_fn, _preload_content=False, **kwargs)
            body = _json(resp)
            items.extend(body.get("items") or ())
            meta = body.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                on_relist(items)
                return str(meta.get("resourceVersion") or "")

    # -- turning objects into events ----------------------------------------------------------------

    def _emit(self, event: ClusterEvent) -> None:
        if isinstance(event, PodEvent):
            key: Hashable = ("pod", event.pod.namespace, event.pod.name, event.pod.uid)
        else:
            key = ("node", event.node.name)
        with self._arrived:
            self._pending.pop(key, None)  # the newer event replaces it, at the end of the line
            self._pending[key] = event
            self._arrived.notify_all()

    def _on_pod(self, seen: dict[tuple[str, str], PodStatus], typ: str, obj: dict) -> None:
        status = pod_status(obj)
        key = (status.namespace, status.name)
        if typ == "DELETED":
            seen.pop(key, None)
            self._emit(PodEvent(status, deleted=True))
        elif _pod_changed(seen.get(key), status):
            seen[key] = status
            self._emit(PodEvent(status))

    def _relisted_pods(self, seen: dict[tuple[str, str], PodStatus], objs: list[dict]) -> None:
        now = {}
        for obj in objs:
            status = pod_status(obj)
            now[(status.namespace, status.name)] = status
        for key, old in list(seen.items()):
            if key not in now:
                del seen[key]
                self._emit(PodEvent(old, deleted=True))
        for key, status in now.items():
            if _pod_changed(seen.get(key), status):
                seen[key] = status
                self._emit(PodEvent(status))

    def _on_node(self, seen: dict[str, tuple[bool, str]], typ: str, obj: dict) -> None:
        cond = node_condition(obj)
        if typ == "DELETED":
            seen.pop(cond.name, None)
            self._emit(NodeEvent(NodeCondition(cond.name, False, "Deleted")))
        elif seen.get(cond.name) != (cond.ready, cond.address):  # readiness, or where it is reached
            seen[cond.name] = (cond.ready, cond.address)
            self._emit(NodeEvent(cond))

    def _relisted_nodes(self, seen: dict[str, tuple[bool, str]], objs: list[dict]) -> None:
        conds = {c.name: c for c in map(node_condition, objs)}
        for name in list(seen):
            if name not in conds:
                del seen[name]
                self._emit(NodeEvent(NodeCondition(name, False, "Deleted")))
        for name, cond in conds.items():
            if seen.get(name) != (cond.ready, cond.address):
                seen[name] = (cond.ready, cond.address)
                self._emit(NodeEvent(cond))


def _pod_changed(old: PodStatus | None, new: PodStatus) -> bool:
    return old is None or (old.phase, old.deleting, old.reason, old.node) != (
        new.phase, new.deleting, new.reason, new.node)


def _json(resp: Any) -> dict:
    try:
        return json.loads(resp.data)
    finally:
        resp.release_conn()
