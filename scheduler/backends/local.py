"""A simulated cluster for the quickstart and the tests: nodes from the inventory, "pods" as rows.

State lives in one SQLite file (or in memory), so the web process, Celery workers and beat of a
quickstart all see one cluster. Time drives the pods: a bound pod is `Pending` for
`start_delay_s`, then `Running`; a batch pod with `simulated_duration_s` then `Succeeded`. The
simulated node agents (agents/ --simulate) report utilization from the placements the portal
pushes them, so nothing here pretends to measure anything.

Extra calls, for the simulation and the tests (not part of the `Backend` protocol):
`add_nodes`, `set_node_ready` (a node goes NotReady: its pods fail with reason NodeLost),
`create_external` / `delete_external` (what `kubectl apply` / `kubectl delete` would do),
`fail_pod`, `kubernetes_events` (the Events `reject_external` recorded), `pod_env` and
`pod_annotations` (what a pod was made with), `pod_workdir` (a running pod's directory, where its
terminal starts), `history` (every change, whoever polled it), `stop_apps` (the real apps pods
run: local_apps.py).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from . import local_apps
from .base import (
    RESERVATION_LABEL,
    BackendError,
    ClusterEvent,
    ExternalBinding,
    ExternalPod,
    NodeCondition,
    NodeEvent,
    PermanentBackendError,
    Phase,
    PodConflict,
    PodEvent,
    PodRef,
    PodSpec,
    PodStatus,
    Terminal,
)
from .local_terminal import PtyTerminal, shell_env

SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (name TEXT PRIMARY KEY, ready INTEGER NOT NULL, reason TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pods (
  namespace TEXT NOT NULL, name TEXT NOT NULL, uid TEXT NOT NULL, node TEXT, phase TEXT NOT NULL,
  external INTEGER NOT NULL, labels TEXT NOT NULL, annotations TEXT NOT NULL, env TEXT NOT NULL,
  image TEXT NOT NULL, reason TEXT NOT NULL, message TEXT NOT NULL, created_at REAL NOT NULL,
  start_at REAL, end_at REAL, PRIMARY KEY (namespace, name));
CREATE INDEX IF NOT EXISTS pods_by_phase ON pods (phase);
CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cursors (consumer TEXT PRIMARY KEY, seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS k8s_events (namespace TEXT, name TEXT, reason TEXT, message TEXT, at REAL);
CREATE TABLE IF NOT EXISTS apps (namespace TEXT NOT NULL, name TEXT NOT NULL, pid INTEGER NOT NULL,
  port INTEGER NOT NULL, PRIMARY KEY (namespace, name));
"""

POD_COLUMNS = "namespace, name, uid, node, phase, external, labels, annotations, reason, message"


class LocalBackend:
    name = "local"
    watches_nodes = False  # no kubelet: a node is only as ready as a test or the demo says

    def __init__(self, nodes: Iterable[str] = (), state_path: str | Path | None = None,
                 start_delay_s: float = 0.5, consumer: str = "portal",
                 clock: Callable[[], float] = time.time):
        if start_delay_s < 0:
            raise ValueError("start_delay_s: must be ≥ 0")
        self.start_delay_s = start_delay_s
        self.consumer = consumer
        self.clock = clock
        self._lock = threading.Lock()
        if state_path is None:
            self._db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        else:
            Path(state_path).parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(state_path), timeout=30, check_same_thread=False,
                                       isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            # A simulation: losing the last write on power loss is fine, an fsync per pod is not.
            self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._state_dir = Path(state_path).parent if state_path is not None else None
        self._own_dir: Path | None = None  # a temporary directory for an in-memory cluster's pods
        self._apps_dir = Path(state_path).parent / "apps" if state_path is not None else None
        self.add_nodes(nodes)

    # -- plumbing -------------------------------------------------------------------------------

    @contextmanager
    def _tx(self):
        """One write transaction across processes (BEGIN IMMEDIATE takes the file's write lock)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _emit(self, db: sqlite3.Connection, event: dict) -> None:
        db.execute("INSERT INTO events (body) VALUES (?)", (json.dumps(event),))

    @staticmethod
    def _status(row) -> PodStatus:
        namespace, name, uid, node, phase, external, labels, _annotations, reason, message = row
        return PodStatus(namespace=namespace, name=name, uid=uid, node=node, phase=Phase(phase),
                         reservation_id=json.loads(labels).get(RESERVATION_LABEL), reason=reason,
                         message=message, external=bool(external))

    def _pod_event(self, db, row, deleted: bool = False) -> None:
        self._emit(db, self._pod_event_body(self._status(row), row, deleted))

    @staticmethod
    def _pod_event_body(status: PodStatus, row, deleted: bool = False) -> dict:
        return {"pod": status.__dict__ | {"phase": str(row[4])}, "deleted": deleted}

    def _advance(self, db: sqlite3.Connection) -> None:
        """Move pods along in time: Pending → Running at start_at, Running → Succeeded at end_at."""
        now = self.clock()
        for phase_from, column, phase_to in ((Phase.PENDING, "start_at", Phase.RUNNING),
                                             (Phase.RUNNING, "end_at", Phase.SUCCEEDED)):
            rows = db.execute(
                f"SELECT {POD_COLUMNS} FROM pods WHERE phase = ? AND node IS NOT NULL "  # noqa: S608
                f"AND {column} IS NOT NULL AND {column} <= ?", (str(phase_from), now)).fetchall()
            for row in rows:
                db.execute("UPDATE pods SET phase = ?, reason = ? WHERE namespace = ? AND name = ?",
                           (str(phase_to), "Completed" if phase_to == Phase.SUCCEEDED else "",
                            row[0], row[1]))
                updated = (*row[:4], str(phase_to), *row[5:8],
                           "Completed" if phase_to == Phase.SUCCEEDED else "", row[9])
                self._pod_event(db, updated)

    def _row(self, db, ref: PodRef):
        return db.execute(f"SELECT {POD_COLUMNS} FROM pods WHERE namespace = ? AND name = ?",  # noqa: S608
                          (ref.namespace, ref.name)).fetchone()

    # -- the Backend protocol -------------------------------------------------------------------

    def bind(self, spec: PodSpec) -> PodStatus:
        (outcome,) = self.bind_many([spec])
        if isinstance(outcome, BackendError):
            raise outcome
        return outcome

    def bind_many(self, specs: Sequence[PodSpec]) -> list[PodStatus | BackendError]:
        """All the pods in one write transaction (one fsync-free commit, not one per pod), with
        the existing pods and the nodes read once and the new rows written together."""
        out: list[PodStatus | BackendError] = []
        with self._tx() as db:
            self._advance(db)
            ready = dict(db.execute("SELECT name, ready FROM nodes"))
            existing = self._rows(db, [spec.ref for spec in specs])
            now = self.clock()
            pods, events = [], []
            for spec in specs:
                row = existing.get((spec.namespace, spec.name))
                if row is not None:
                    status = self._status(row)
                    if status.reservation_id != spec.reservation_id:
                        out.append(PodConflict(f"pod {spec.namespace}/{spec.name} exists for reservation "
                                               f"{status.reservation_id}, not {spec.reservation_id}"))
                    else:
                        out.append(status)  # adopted: a retried bind never makes two
                    continue
                if spec.node not in ready:
                    out.append(PermanentBackendError(f"node {spec.node} does not exist in the cluster"))
                    continue
                if not ready[spec.node]:
                    out.append(PermanentBackendError(f"node {spec.node} is not ready"))
                    continue
                start = now + self.start_delay_s
                end = start + spec.simulated_duration_s if spec.simulated_duration_s is not None else None
                row = (spec.namespace, spec.name, str(uuid.uuid4()), spec.node, str(Phase.PENDING), 0,
                       json.dumps(dict(spec.labels)), json.dumps(dict(spec.annotations)), "", "")
                existing[(spec.namespace, spec.name)] = row  # the same pod twice in a batch: adopted
                pods.append((*row, json.dumps(dict(spec.env)), spec.image, now, start, end))
                status = self._status(row)
                events.append((json.dumps(self._pod_event_body(status, row)),))
                out.append(status)
            db.executemany(
                "INSERT INTO pods (namespace, name, uid, node, phase, external, labels, annotations, reason, "
                "message, env, image, created_at, start_at, end_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", pods)
            db.executemany("INSERT INTO events (body) VALUES (?)", events)
        self._start_apps([spec for spec in specs if (spec.namespace, spec.name) in {(p[0], p[1]) for p in pods}])
        return out

    def _start_apps(self, specs: Sequence[PodSpec]) -> None:
        """Each new pod's real app (Jupyter), as its process would start in the container."""
        for spec in specs:
            base = self._apps_dir or Path(tempfile.gettempdir()) / "tessera-apps"
            started = local_apps.start(spec.env_dict(), base / f"{spec.namespace}-{spec.name}")
            if started is not None:
                with self._tx() as db:
                    db.execute("INSERT OR REPLACE INTO apps (namespace, name, pid, port) VALUES (?, ?, ?, ?)",
                               (spec.namespace, spec.name, *started))

    def app_address(self, ref: PodRef, port: int) -> str | None:
        """127.0.0.1 and the free port its app was started on (not `port`: many pods share this
        machine), once the pod runs and the app listens."""
        with self._tx() as db:
            self._advance(db)
            row = db.execute("SELECT apps.port FROM apps JOIN pods USING (namespace, name) "
                             "WHERE namespace = ? AND name = ? AND pods.phase = 'Running'",
                             (ref.namespace, ref.name)).fetchone()
        if row is None or not local_apps.listening(row[0]):
            return None
        return f"127.0.0.1:{row[0]}"

    def _stop_app(self, db: sqlite3.Connection, ref: PodRef) -> None:
        row = db.execute("SELECT pid FROM apps WHERE namespace = ? AND name = ?", (ref.namespace, ref.name)).fetchone()
        if row is not None:
            db.execute("DELETE FROM apps WHERE namespace = ? AND name = ?", (ref.namespace, ref.name))
            local_apps.stop(row[0])

    def stop_apps(self) -> None:
        """Stop every app the cluster's pods run (the quickstart and the tests, when they end)."""
        with self._tx() as db:
            for (pid,) in db.execute("SELECT pid FROM apps").fetchall():
                local_apps.stop(pid)
            db.execute("DELETE FROM apps")

    @staticmethod
    def _rows(db: sqlite3.Connection, refs: Sequence[PodRef], chunk: int = 400) -> dict[tuple[str, str], tuple]:
        """(namespace, name) → row of the pods among `refs` that exist."""
        found = {}
        for start in range(0, len(refs), chunk):
            part = refs[start:start + chunk]
            keys = ", ".join(["(?, ?)"] * len(part))
            for row in db.execute(f"SELECT {POD_COLUMNS} FROM pods WHERE (namespace, name) IN (VALUES {keys})",  # noqa: S608
                                  [v for ref in part for v in (ref.namespace, ref.name)]):
                found[(row[0], row[1])] = row
        return found

    def unbind(self, ref: PodRef, grace_s: int, reason: str) -> bool:
        # Graceful termination is not simulated: the pod is gone at once.
        with self._tx() as db:
            row = self._row(db, ref)
            if row is None:
                return False
            db.execute("DELETE FROM pods WHERE namespace = ? AND name = ?", (ref.namespace, ref.name))
            self._pod_event(db, (*row[:8], "Deleted", reason[:200]), deleted=True)
            self._stop_app(db, ref)
            return True

    def list_pods(self) -> list[PodStatus]:
        with self._tx() as db:
            self._advance(db)
            rows = db.execute(f"SELECT {POD_COLUMNS} FROM pods ORDER BY namespace, name").fetchall()  # noqa: S608
        return [s for s in map(self._status, rows) if s.reservation_id is not None]

    def list_nodes(self) -> list[NodeCondition]:
        with self._lock:
            rows = self._db.execute("SELECT name, ready, reason FROM nodes ORDER BY name").fetchall()
        return [NodeCondition(name, bool(ready), reason) for name, ready, reason in rows]

    def poll(self, timeout_s: float) -> list[ClusterEvent]:
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            with self._tx() as db:
                self._advance(db)
                cursor = db.execute("SELECT seq FROM cursors WHERE consumer = ?", (self.consumer,)).fetchone()
                after = cursor[0] if cursor else 0
                rows = db.execute("SELECT seq, body FROM events WHERE seq > ? ORDER BY seq LIMIT 1000",
                                  (after,)).fetchall()
                if rows:
                    db.execute("INSERT INTO cursors (consumer, seq) VALUES (?, ?) ON CONFLICT (consumer) "
                               "DO UPDATE SET seq = excluded.seq", (self.consumer, rows[-1][0]))
            if rows or time.monotonic() >= deadline:
                return [_event(json.loads(body)) for _seq, body in rows]
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def list_pending_external(self) -> list[ExternalPod]:
        with self._lock:
            rows = self._db.execute(
                "SELECT namespace, name, uid, labels, annotations, image, created_at FROM pods "
                "WHERE external = 1 AND node IS NULL ORDER BY created_at").fetchall()
        return [ExternalPod(namespace=ns, name=name, uid=uid, labels=json.loads(labels),
                            annotations=json.loads(annotations), image=image, created_at=created)
                for ns, name, uid, labels, annotations, image, created in rows]

    def bind_external_many(self, bindings: Sequence[ExternalBinding]) -> list[BackendError | None]:
        out: list[BackendError | None] = []
        for b in bindings:
            try:
                self.bind_external(b.pod, b.node, b.labels, b.annotations)
                out.append(None)
            except BackendError as exc:
                out.append(exc)
        return out

    def bind_external(self, pod: PodRef, node: str, labels: Mapping[str, str],
                      annotations: Mapping[str, str]) -> None:
        with self._tx() as db:
            row = self._row(db, pod)
            if row is None:
                raise PodConflict(f"pod {pod.namespace}/{pod.name} no longer exists")
            if row[3] is not None:
                if row[3] == node:
                    return
                raise PodConflict(f"pod {pod.namespace}/{pod.name} is already bound to {row[3]}")
            ready = db.execute("SELECT ready FROM nodes WHERE name = ?", (node,)).fetchone()
            if ready is None or not ready[0]:
                raise PermanentBackendError(f"node {node} does not exist or is not ready")
            merged_labels = json.loads(row[6]) | dict(labels)
            merged_annotations = json.loads(row[7]) | dict(annotations)
            start = self.clock() + self.start_delay_s
            db.execute("UPDATE pods SET node = ?, labels = ?, annotations = ?, start_at = ? "
                       "WHERE namespace = ? AND name = ?",
                       (node, json.dumps(merged_labels), json.dumps(merged_annotations), start,
                        pod.namespace, pod.name))
            self._pod_event(db, (*row[:3], node, row[4], row[5], json.dumps(merged_labels),
                                 json.dumps(merged_annotations), "", ""))

    def reject_external(self, pod: PodRef, reason: str) -> None:
        with self._tx() as db:
            last = db.execute("SELECT message FROM k8s_events WHERE namespace = ? AND name = ? "
                              "ORDER BY rowid DESC LIMIT 1", (pod.namespace, pod.name)).fetchone()
            if last is None or last[0] != reason:
                db.execute("INSERT INTO k8s_events VALUES (?, ?, ?, ?, ?)",
                           (pod.namespace, pod.name, "FailedScheduling", reason, self.clock()))

    # -- simulation and test hooks --------------------------------------------------------------

    def add_nodes(self, names: Iterable[str]) -> None:
        names = list(names)
        if not names:
            return
        with self._tx() as db:
            db.executemany("INSERT OR IGNORE INTO nodes (name, ready, reason) VALUES (?, 1, '')",
                           [(n,) for n in names])

    def set_node_ready(self, name: str, ready: bool, reason: str = "") -> None:
        with self._tx() as db:
            if db.execute("SELECT 1 FROM nodes WHERE name = ?", (name,)).fetchone() is None:
                raise KeyError(f"no node {name}")
            db.execute("UPDATE nodes SET ready = ?, reason = ? WHERE name = ?", (int(ready), reason, name))
            self._emit(db, {"node": {"name": name, "ready": ready, "reason": reason}})
            if not ready:
                rows = db.execute(f"SELECT {POD_COLUMNS} FROM pods WHERE node = ? "  # noqa: S608
                                  "AND phase IN ('Pending', 'Running')", (name,)).fetchall()
                for row in rows:
                    self._set_failed(db, row, "NodeLost", f"node {name} is not ready")

    def fail_pod(self, ref: PodRef, reason: str, message: str = "") -> None:
        with self._tx() as db:
            row = self._row(db, ref)
            if row is None:
                raise KeyError(f"no pod {ref.namespace}/{ref.name}")
            self._set_failed(db, row, reason, message)

    def _set_failed(self, db, row, reason: str, message: str) -> None:
        db.execute("UPDATE pods SET phase = 'Failed', reason = ?, message = ? "
                   "WHERE namespace = ? AND name = ?", (reason, message, row[0], row[1]))
        self._pod_event(db, (*row[:4], "Failed", *row[5:8], reason, message))
        self._stop_app(db, PodRef(row[0], row[1]))

    def create_external(self, namespace: str, name: str, labels: Mapping[str, str],
                        annotations: Mapping[str, str] | None = None, image: str = "busybox") -> ExternalPod:
        uid = str(uuid.uuid4())
        with self._tx() as db:
            db.execute(
                "INSERT INTO pods (namespace, name, uid, node, phase, external, labels, annotations, reason, "
                "message, env, image, created_at) "
                "VALUES (?, ?, ?, NULL, 'Pending', 1, ?, ?, '', '', '{}', ?, ?)",
                (namespace, name, uid, json.dumps(dict(labels)), json.dumps(dict(annotations or {})), image,
                 self.clock()))
        return ExternalPod(namespace, name, uid, dict(labels), dict(annotations or {}), image)

    def delete_external(self, ref: PodRef) -> bool:
        return self.unbind(ref, 0, "deleted by user")

    def pod_env(self, ref: PodRef) -> dict[str, str]:
        return self._pod_map(ref, "env")

    def pod_annotations(self, ref: PodRef) -> dict[str, str]:
        return self._pod_map(ref, "annotations")

    def _pod_map(self, ref: PodRef, column: str) -> dict[str, str]:
        assert column in ("env", "annotations")  # a column name, never data
        with self._lock:
            row = self._db.execute(f"SELECT {column} FROM pods WHERE namespace = ? AND name = ?",  # noqa: S608
                                   (ref.namespace, ref.name)).fetchone()
        if row is None:
            raise KeyError(f"no pod {ref.namespace}/{ref.name}")
        return json.loads(row[0])

    def history(self) -> list[ClusterEvent]:
        """Every event the cluster has sent, oldest first, whether or not a consumer polled it."""
        with self._lock:
            rows = self._db.execute("SELECT body FROM events ORDER BY seq").fetchall()
        return [_event(json.loads(body)) for (body,) in rows]

    def pod_log(self, ref: PodRef, tail_lines: int = 200) -> str | None:
        """The simulated pod's log, written from what the simulation knows (when it was created,
        started and ended, its node, image and share variables) plus one progress line a minute
        while it runs. Every line says [simulated]: no container runs here."""
        with self._tx() as db:
            self._advance(db)
            row = db.execute("SELECT node, phase, env, image, reason, message, created_at, start_at, end_at "
                             "FROM pods WHERE namespace = ? AND name = ?", (ref.namespace, ref.name)).fetchone()
        if row is None:
            return None
        node, phase, env, image, reason, message, created, start, end = row
        env = json.loads(env)
        now = self.clock()

        def at(t: float) -> str:
            return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))

        lines = [f"{at(created)} [simulated] scheduled {ref.namespace}/{ref.name} on {node}",
                 f"{at(created)} [simulated] pulling image {image}"]
        if start is not None and start <= now and phase != str(Phase.PENDING):
            if "TESSERA_REMOTE_SERVER" in env:  # a remote share: its terms are in the token, its GPU elsewhere
                lines.append(f"{at(start)} [simulated] started: remote share through "
                             f"{env['TESSERA_REMOTE_SERVER']} (client libraries in {env.get('LD_LIBRARY_PATH', '?')})")
            else:
                lines.append(f"{at(start)} [simulated] started: GPU {env.get('NVIDIA_VISIBLE_DEVICES', '?')}, share "
                             f"{env.get('TESSERA_GPU_REQUEST', '?')} (limit {env.get('TESSERA_GPU_LIMIT', '?')}), "
                             f"memory cap {env.get('TESSERA_GPU_MEMORY_LIMIT', '?')}")
            stop = min(now, end) if end is not None else now
            if phase in (str(Phase.FAILED), str(Phase.SUCCEEDED)):
                stop = min(stop, now)
            first_tick = max(1, int(max(0.0, stop - start) // 60) - tail_lines + 1)
            for minute in range(first_tick, int(max(0.0, stop - start) // 60) + 1):
                lines.append(f"{at(start + 60 * minute)} [simulated] running for {minute} min")
        if phase == str(Phase.SUCCEEDED):
            lines.append(f"{at(end if end is not None else now)} [simulated] completed")
        elif phase == str(Phase.FAILED):
            lines.append(f"{at(now)} [simulated] failed: {reason} {message}".rstrip())
        return "\n".join(lines[-tail_lines:]) + "\n"

    def open_terminal(self, ref: PodRef, rows: int, cols: int) -> Terminal:
        """A shell on a real PTY in the pod's working directory, with the pod's environment."""
        with self._tx() as db:
            self._advance(db)
            row = db.execute("SELECT phase, env FROM pods WHERE namespace = ? AND name = ?",
                             (ref.namespace, ref.name)).fetchone()
        if row is None:
            raise PermanentBackendError(f"pod {ref.namespace}/{ref.name} does not exist")
        if row[0] != str(Phase.RUNNING):
            raise PermanentBackendError(f"pod {ref.namespace}/{ref.name} is {row[0].lower()}, not running")
        workdir = self.pod_workdir(ref)
        return PtyTerminal(shell_env(json.loads(row[1]), workdir), workdir, rows, cols)

    def pod_workdir(self, ref: PodRef) -> Path:
        """The simulated pod's own directory (made on first use): beside the state file, or in a
        temporary directory for an in-memory cluster."""
        if not all(part and "/" not in part and part not in (".", "..") for part in (ref.namespace, ref.name)):
            raise PermanentBackendError(f"not a pod name: {ref.namespace}/{ref.name}")
        if self._state_dir is None:
            self._state_dir = self._own_dir = Path(tempfile.mkdtemp(prefix="tessera-local-"))
        path = self._state_dir / "pods" / ref.namespace / ref.name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def kubernetes_events(self, ref: PodRef) -> list[str]:
        with self._lock:
            rows = self._db.execute("SELECT message FROM k8s_events WHERE namespace = ? AND name = ? "
                                    "ORDER BY rowid", (ref.namespace, ref.name)).fetchall()
        return [r[0] for r in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)


def _event(body: dict) -> ClusterEvent:
    if "node" in body:
        return NodeEvent(NodeCondition(**body["node"]))
    pod = dict(body["pod"])
    pod["phase"] = Phase.UNKNOWN if pod["phase"] == "Deleted" else Phase(pod["phase"])
    return PodEvent(PodStatus(**pod), deleted=body["deleted"])
