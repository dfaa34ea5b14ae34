"""Bind throughput and latency of the kubernetes backend, and the API requests one reservation costs,
against the test suite's fake API server answering every request after 5 ms (--latency-ms), as a
real API server a few network hops away does. Manifest validation (kubernetes-validate, tens of ms a
pod in Python) is off: what is measured is our side against a given latency.

- bind: 1,000 pods (--pods) through `bind_many` in the placement cycle's batches (--batch), against a
  baseline measured in the same run: the same pods created one after the other with bare
  `create_namespaced_pod` calls (one request each, no node check, no concurrency);
- requests: what one reservation asks of the API server from placement to running to release, for a
  portal pod (create; phases come from the watch; cancel) and a kubectl pod (bind; completed and
  kept; or cancelled), counted on the server per kind of request. Target: at most one create, one
  bind or patch and one delete (reads and the shared list/watch streams counted apart).

    nice -n 10 .venv/bin/python bench/kubernetes/bind_throughput.py

Results: bench/results/kubernetes/bind_throughput.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.kubernetes.fake_cluster import fake_apiserver_module, pct  # noqa: E402
from scheduler.backends import GpuShare, PodRef, make_pod_spec  # noqa: E402
from scheduler.backends.base import external_binding  # noqa: E402
from scheduler.backends.kubernetes import KubernetesBackend  # noqa: E402
from scheduler.backends.kubernetes.manifests import pod_manifest  # noqa: E402

OUT = ROOT / "bench" / "results" / "kubernetes"
NODES = 125


def spec(i: int, namespace: str = "tessera"):
    share = GpuShare(f"GPU-00000000-0000-4000-8000-{i % 8:012d}", i % 8, 0.25, 0.5, 4096)
    return make_pod_spec(reservation_id=str(i), attempt=1, namespace=namespace, node=f"gpu-node-{i % NODES}",
                         team="vision", image="ghcr.io/example/train:1", command=("python", "train.py"),
                         gpus=(share,), priority=10, kind="batch")


def server_for(fake, latency_s: float):
    server = fake.FakeApiServer(namespaces=("tessera", "baseline", "team"), validate=False).start()
    for n in range(NODES):
        server.add_node(f"gpu-node-{n}")
    server.answer_delay_s = latency_s
    return server


def bench_bind(fake, n: int, batch: int, latency_s: float) -> dict:
    server = server_for(fake, latency_s)
    backend = KubernetesBackend(host=server.url, watch_timeout_s=30)
    try:
        # Baseline: the same pods, one bare create after the other.
        started = time.perf_counter()
        base_lat = []
        for i in range(n):
            manifest = pod_manifest(spec(i, "baseline"))
            t = time.perf_counter()
            resp = backend.api.core.create_namespaced_pod("baseline", manifest, _preload_content=False)
            resp.data  # noqa: B018 - read the answer, as any caller must
            resp.release_conn()
            base_lat.append(time.perf_counter() - t)
        base_wall = time.perf_counter() - started
        # Ours: bind_many in batches, as the bind tasks get them; latency = batch start → pod created.
        lat = []
        started = time.perf_counter()
        for first in range(0, n, batch):
            specs = [spec(i) for i in range(first, min(n, first + batch))]
            t_wall, t = time.time(), time.perf_counter()
            outcomes = backend.bind_many(specs)
            assert all(not isinstance(o, Exception) for o in outcomes), outcomes
            lat += [server.created_at[("tessera", s.name)] - t_wall for s in specs]
            del t
        wall = time.perf_counter() - started
        requests = Counter(f"{r.method} {request_kind(r.path)}" for r in server.requests
                           if "/namespaces/baseline/" not in r.path)
    finally:
        backend.close()
        server.stop()
    return {"pods": n, "batch": batch, "latency_ms": latency_s * 1e3,
            "pods_per_s": n / wall, "wall_s": wall, "bind_p50_ms": 1e3 * pct(lat, 0.5),
            "bind_p99_ms": 1e3 * pct(lat, 0.99), "max_in_flight": server.max_in_flight,
            "baseline_pods_per_s": n / base_wall, "baseline_create_p50_ms": 1e3 * pct(base_lat, 0.5),
            "baseline_create_p99_ms": 1e3 * pct(base_lat, 0.99), "speedup": base_wall / wall,
            "requests": dict(requests)}


def request_kind(path: str) -> str:
    """A request path without the names in it: /api/v1/namespaces/NS/pods/NAME/binding → pods/binding."""
    path = re.sub(r"^/api/v1/(namespaces/[^/]+/)?", "", path)
    parts = path.split("/")
    return "/".join([parts[0], *parts[2:]]) if len(parts) > 1 else parts[0]


def bench_requests(fake, latency_s: float) -> dict:
    """Count what one reservation's life asks of the API server, per kind of request."""
    server = server_for(fake, latency_s)
    server.hold_deletions = True  # pods terminate for a while, as on a real cluster
    backend = KubernetesBackend(host=server.url, watch_timeout_s=30)
    other = KubernetesBackend(host=server.url, watch_timeout_s=30)  # a second worker, watching
    out = {}
    try:
        other.poll(0.2)

        def counted(label: str, steps) -> None:
            before = len(server.requests)
            steps()
            out[label] = dict(Counter(f"{r.method} {request_kind(r.path)}" for r in server.requests[before:]
                                      if not r.query.get("watch")))

        def portal_pod() -> None:
            status = backend.bind(spec(1))  # placed → pod
            server.set_pod_phase("tessera", status.name, "Running")  # kubelet
            _wait(other, status.name, lambda p: p.phase.value == "Running")
            # Cancelled: the cancel itself, then the watch event of the terminating pod and the
            # periodic release reach unbind again (another worker among them).
            backend.unbind(status.ref, grace_s=30, reason="cancelled by alice")
            _wait(other, status.name, lambda p: p.deleting)
            other.unbind(status.ref, grace_s=30, reason="reservation 1 is cancelled")
            backend.unbind(status.ref, grace_s=30, reason="reservation 1 is cancelled")

        def kubectl_pod(finish: str) -> None:
            name = f"user-{finish}"
            # As the webhook leaves it: marked with an empty reservation label (deploy/portal/webhook.yaml).
            server.create_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "team",
                               "labels": {"sharedgpu/gpu_request": "0.5", "tessera.io/reservation": ""}},
                               "spec": {"schedulerName": "kubeshare-scheduler",
                                        "containers": [{"name": "c", "image": "x"}]}})
            share = GpuShare("GPU-00000000-0000-4000-8000-000000000001", 1, 0.5, 0.5, 4096)
            backend.bind_external(PodRef("team", name), "gpu-node-1", *external_binding("7", "vision", (share,), 0))
            server.set_pod_phase("team", name, "Running")
            _wait(other, name, lambda p: p.phase.value == "Running")
            if finish == "succeeds":
                server.set_pod_phase("team", name, "Succeeded")  # kept: its owner's TTL removes it
                _wait(other, name, lambda p: p.phase.value == "Succeeded")
            else:
                backend.unbind(PodRef("team", name), grace_s=30, reason="cancelled by alice")

        counted("portal pod: placed, running, cancelled (3 unbind calls from 2 workers)", portal_pod)
        counted("kubectl pod: bound, running, succeeded (kept for its logs)", lambda: kubectl_pod("succeeds"))
        counted("kubectl pod: bound, running, cancelled", lambda: kubectl_pod("cancelled"))
    finally:
        backend.close()
        other.close()
        server.stop()
    return out


def _wait(backend: KubernetesBackend, name: str, ok) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        backend.poll(0.2)
        pod = next((p for (_, n), p in backend.watch._pods.items() if n == name), None)
        if pod is not None and ok(pod):
            return
    raise SystemExit(f"the watch never saw pod {name} change")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=200, help="pods per bind_many call")
    parser.add_argument("--latency-ms", type=float, default=5.0, help="the fake API server's answer time")
    args = parser.parse_args()
    fake = fake_apiserver_module()
    latency = args.latency_ms / 1e3
    bind = bench_bind(fake, args.pods, args.batch, latency)
    requests = bench_requests(fake, latency)
    command = "nice -n 10 .venv/bin/python bench/kubernetes/bind_throughput.py " + " ".join(sys.argv[1:])
    meta = {"command": command.strip(), "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared), Python {platform.python_version()}",
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()]}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bind_throughput.json").write_text(json.dumps({"meta": meta, "bind": bind, "requests": requests},
                                                         indent=2) + "\n")
    lines = [
        "# Kubernetes backend: bind throughput, and the requests a reservation costs", "",
        f"`{meta['command']}`", "",
        f"{meta['when']} · {meta['machine']} · load average at the end {meta['load_average_at_end']} · "
        f"fake API server answering after {bind['latency_ms']:g} ms, validation off, {NODES} nodes", "",
        f"## Bind: {bind['pods']} pods, `bind_many` in batches of {bind['batch']}", "",
        "| | pods/s | p50 ms | p99 ms |", "| --- | --- | --- | --- |",
        f"| `bind_many` (node read once per batch, {bind['max_in_flight']} requests in flight at most) | "
        f"{bind['pods_per_s']:.0f} | {bind['bind_p50_ms']:.0f} | {bind['bind_p99_ms']:.0f} |",
        f"| baseline: bare creates one after the other | {bind['baseline_pods_per_s']:.0f} | "
        f"{bind['baseline_create_p50_ms']:.1f} | {bind['baseline_create_p99_ms']:.1f} |", "",
        f"Throughput against the baseline: **{bind['speedup']:.1f}x**. Latency of `bind_many` is from the "
        "start of its batch to the pod's creation on the server (a batch's last pod waits for the ones "
        "before it); the baseline's is one request's round trip.", "",
        "Requests: " + ", ".join(f"{k}: {v}" for k, v in sorted(bind["requests"].items())), "",
        "## Requests per reservation", "",
        "Counted on the server, watch streams left out (one per worker for all pods).", "",
        "| life | requests |", "| --- | --- |",
    ]
    lines += [f"| {life} | {', '.join(f'{k}: {v}' for k, v in sorted(counts.items()))} |"
              for life, counts in requests.items()]
    md = "\n".join(lines) + "\n"
    (OUT / "bind_throughput.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
