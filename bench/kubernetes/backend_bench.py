"""Cost of the kubernetes backend and the device plugin against the test suite's fake API server.

Measured in one run, on the same server, so the ratios say what our layer adds:
- bind: `KubernetesBackend.bind` (node check + create, with validation and retry logic) against a
  bare `create_namespaced_pod` of the same manifests (baseline);
- watch: time from a pod's phase change on the server to its event out of `poll()`;
- allocate: the device plugin's `Allocate` over gRPC with N placed pods waiting on the node.

The fake API server validates every pod with kubernetes-validate, which dominates absolute times;
read the ratios. Results: bench/results/kubernetes/backend.{md,json}.

    nice -n 10 .venv/bin/python bench/kubernetes/backend_bench.py [--pods 300]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agents.deviceplugin import api_pb2, api_pb2_grpc  # noqa: E402
from agents.deviceplugin.pods import KubernetesPods, PodFinder  # noqa: E402
from agents.deviceplugin.server import DevicePluginService, PluginConfig, PluginRunner  # noqa: E402
from agents.gpus.base import GpuDevice  # noqa: E402
from bench.kubernetes.fake_cluster import fake_apiserver_module, pct  # noqa: E402
from scheduler.backends import GpuShare, PodEvent, PodRef, make_pod_spec  # noqa: E402
from scheduler.backends.base import external_binding  # noqa: E402
from scheduler.backends.kubernetes import KubernetesBackend  # noqa: E402
from scheduler.backends.kubernetes.manifests import pod_manifest  # noqa: E402

OUT = ROOT / "bench" / "results" / "kubernetes"


def spec(i: int, node: str = "gpu-node-1"):
    share = GpuShare(f"GPU-00000000-0000-4000-8000-{i % 8:012d}", i % 8, 0.25, 0.5, 4096)
    return make_pod_spec(reservation_id=str(i), attempt=1, namespace="tessera", node=node, team="vision",
                         image="ghcr.io/example/train:1", command=("python", "train.py"), gpus=(share,),
                         priority=10, kind="batch")


def bench_bind(fake, n: int) -> dict:
    server = fake.FakeApiServer(namespaces=("tessera", "baseline")).start()
    server.add_node("gpu-node-1")
    backend = KubernetesBackend(host=server.url, watch_timeout_s=30)
    try:
        ours, base = [], []
        for i in range(n):
            t = time.perf_counter()
            backend.bind(spec(i))
            ours.append(time.perf_counter() - t)
            manifest = pod_manifest(spec(i))
            manifest["metadata"]["namespace"] = "baseline"
            t = time.perf_counter()
            resp = backend.api.core.create_namespaced_pod("baseline", manifest, _preload_content=False)
            resp.release_conn()
            base.append(time.perf_counter() - t)
        retried = []
        for i in range(n // 3):  # a retried task: adopt
            t = time.perf_counter()
            backend.bind(spec(i))
            retried.append(time.perf_counter() - t)
    finally:
        backend.close()
        server.stop()
    return {"n": n, "bind_p50_ms": 1e3 * pct(ours, 0.5), "bind_p99_ms": 1e3 * pct(ours, 0.99),
            "baseline_create_p50_ms": 1e3 * pct(base, 0.5), "baseline_create_p99_ms": 1e3 * pct(base, 0.99),
            "bind_over_baseline": statistics.median(ours) / statistics.median(base),
            "adopt_p50_ms": 1e3 * pct(retried, 0.5)}


def bench_watch(fake, n: int) -> dict:
    server = fake.FakeApiServer(namespaces=("tessera",)).start()
    server.add_node("gpu-node-1")
    backend = KubernetesBackend(host=server.url, watch_timeout_s=30)
    try:
        for i in range(n):
            backend.bind(spec(i))
        deadline = time.monotonic() + 30
        seen = set()
        while len(seen) < n and time.monotonic() < deadline:
            seen |= {e.pod.name for e in backend.poll(0.5) if isinstance(e, PodEvent)}
        lat = []
        for i in range(n):
            t = time.perf_counter()
            server.set_pod_phase("tessera", f"tessera-r{i}-1", "Running")
            while True:
                events = backend.poll(5.0)
                if any(isinstance(e, PodEvent) and e.pod.name == f"tessera-r{i}-1" for e in events):
                    break
            lat.append(time.perf_counter() - t)
    finally:
        backend.close()
        server.stop()
    return {"n": n, "event_p50_ms": 1e3 * pct(lat, 0.5), "event_p99_ms": 1e3 * pct(lat, 0.99)}


def bench_allocate(fake, waiting: int) -> dict:
    gpus = [GpuDevice(i, f"GPU-00000000-0000-4000-8000-{i:012d}", "A100", 40960, 0, (), "disabled") for i in range(8)]
    server = fake.FakeApiServer(namespaces=("team",)).start()
    server.add_node("gpu-node-1")
    backend = KubernetesBackend(host=server.url)
    plugin_dir = Path(tempfile.mkdtemp(prefix="dpb-", dir="/tmp"))
    # A minimal kubelet: registration only; Allocate is called directly over the plugin's socket.
    class Kubelet(api_pb2_grpc.RegistrationServicer):
        def Register(self, request, context):
            return api_pb2.Empty()

    kubelet = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_RegistrationServicer_to_server(Kubelet(), kubelet)
    kubelet.add_insecure_port(f"unix://{plugin_dir / 'kubelet.sock'}")
    kubelet.start()
    cfg = PluginConfig(node="gpu-node-1", gpus=gpus, plugin_dir=str(plugin_dir))
    runner = PluginRunner(DevicePluginService(cfg, PodFinder(KubernetesPods(host=server.url), "gpu-node-1",
                                                             cfg.resource_name)))
    runner.start()
    try:
        for i in range(waiting):
            server.create_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i}", "namespace": "team"},
                               "spec": {"schedulerName": "tessera", "containers": [
                                   {"name": "c", "image": "x", "resources": {"limits": {cfg.resource_name: "1"}}}]}})
            share = GpuShare(gpus[i % 8].uuid, i % 8, 0.1, 0.2, 1024)
            backend.bind_external(PodRef("team", f"p{i}"), "gpu-node-1", *external_binding(str(i), "t", (share,), 10))
        channel = grpc.insecure_channel(f"unix://{plugin_dir / cfg.endpoint}")
        stub = api_pb2_grpc.DevicePluginStub(channel)
        lat = []
        for _ in range(waiting):
            t = time.perf_counter()
            stub.Allocate(api_pb2.AllocateRequest(container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=["x"])]), timeout=30)
            lat.append(time.perf_counter() - t)
        channel.close()
    finally:
        runner.stop()
        kubelet.stop(0)
        backend.close()
        server.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)
    return {"waiting_pods": waiting, "allocate_p50_ms": 1e3 * pct(lat, 0.5), "allocate_p99_ms": 1e3 * pct(lat, 0.99)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=300)
    args = parser.parse_args()
    fake = fake_apiserver_module()
    results = {"command": "nice -n 10 .venv/bin/python bench/kubernetes/backend_bench.py --pods "
                          f"{args.pods}", "machine": platform.platform(),
               "bind": bench_bind(fake, args.pods), "watch": bench_watch(fake, min(args.pods, 200)),
               "allocate": bench_allocate(fake, min(args.pods, 100))}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "backend.json").write_text(json.dumps(results, indent=2) + "\n")
    b, w, a = results["bind"], results["watch"], results["allocate"]
    md = f"""# Kubernetes backend and device plugin against the fake API server

`{results['command']}` on {results['machine']} (2 shared cores).

| measure | p50 | p99 |
| --- | --- | --- |
| `bind` (node check + create) | {b['bind_p50_ms']:.1f} ms | {b['bind_p99_ms']:.1f} ms |
| baseline: bare `create_namespaced_pod` | {b['baseline_create_p50_ms']:.1f} ms | {b['baseline_create_p99_ms']:.1f} ms |
| `bind` of an existing pod (adopt) | {b['adopt_p50_ms']:.1f} ms | |
| phase change on the server → event from `poll()` | {w['event_p50_ms']:.1f} ms | {w['event_p99_ms']:.1f} ms |
| device plugin `Allocate`, {a['waiting_pods']} placed pods on the node | {a['allocate_p50_ms']:.1f} ms \
| {a['allocate_p99_ms']:.1f} ms |

`bind` / bare create (median): **{b['bind_over_baseline']:.2f}x** ({b['n']} pods). The fake server
validates every pod with kubernetes-validate, which dominates the absolute numbers.
"""
    (OUT / "backend.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
