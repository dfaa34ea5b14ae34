"""The kubectl path with Dynamic Resource Allocation against the device-plugin path: kubectl pods
admitted (listed) and bound per second, and the API requests one reservation costs, against the test
suite's fake API server answering every request after 5 ms (--latency-ms), validation off (what is
measured is our side against a given latency; the fake's over-commit guard runs once at the end).

The fake runs in a process of its own (FakeInProcess): in ours, its Python work held the GIL our
client waited for, so whichever path made the fake work harder paid for it (`--in-process` measures
that way still). Each path runs `--rounds` times, interleaved, and the median round is kept: the
machine is shared and its load comes in bursts. "Our CPU" is this process's CPU per pod bound; "fake
CPU" the fake's process's (its Python work per request, which shares the machine's cores with ours:
a claim status write costs it more than the device-plugin path's read of the pod).

- device plugin: pods as the webhook leaves them (`sharedgpu/*` labels, an empty reservation label);
  `bind_external` reads the pod, then writes the Binding carrying the placement annotation;
- DRA: pods whose claim (made from a ResourceClaimTemplate of class gpu-share.tessera.io) asks
  compute 250 and 4 GiB, marked by the webhook as the KubeShare ones; `list_pending_external` reads
  the claims (one list per call) and `bind_external` writes the claim's allocation, then binds.

Both are bound one pod after the other (`bind_external`), and side by side (`bind_external_many`, as
portal/placement/binding.py binds kubectl pods: a pod's own writes in their order, pods overlapping);
each life ends with `unbind` (one delete). Target: DRA at least the device plugin's rate, and 1 claim
status write + 1 bind + 1 delete per reservation.

    nice -n 10 .venv/bin/python bench/kubernetes/dra_bench.py

Results: bench/results/kubernetes/dra_bench.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agents.dra.slices import SliceApi, SlicePublisher  # noqa: E402
from agents.gpus.base import GpuDevice  # noqa: E402
from bench.kubernetes.fake_cluster import FakeInProcess, fake_apiserver_module  # noqa: E402
from scheduler.backends import GpuShare, PodRef  # noqa: E402
from scheduler.backends.base import ExternalBinding, external_binding  # noqa: E402
from scheduler.backends.kubernetes import KubernetesBackend  # noqa: E402
from scheduler.backends.kubernetes.api import BIND_CONCURRENCY  # noqa: E402

OUT = ROOT / "bench" / "results" / "kubernetes"
NODES = 25
GPUS_PER_NODE = 8
SHARE = 0.25  # four pods to a GPU


def uuid_of(node: int, gpu: int) -> str:
    return f"GPU-00000000-0000-4000-{node:04d}-{gpu:012d}"


def server_for(fake, latency_s: float):
    server = fake.FakeApiServer(namespaces=("team",), validate=False).start()
    for n in range(NODES):
        server.add_node(f"gpu-node-{n}")
        gpus = [GpuDevice(index=g, uuid=uuid_of(n, g), model="NVIDIA A100-SXM4-40GB", memory_mib=40960,
                          numa_node=0, nvlink_peers=(), mig_mode="disabled") for g in range(GPUS_PER_NODE)]
        SlicePublisher(SliceApi(host=server.url), f"gpu-node-{n}").sync(gpus)
    server.put_object({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                       "metadata": {"name": "quarter", "namespace": "team"},
                       "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                           "deviceClassName": "gpu-share.tessera.io",
                           "capacity": {"requests": {"compute": "250", "memory": "4Gi"}}}}]}}}})
    server.answer_delay_s = latency_s
    # The fake's over-commit guard scans every claim on every status write (O(n) in Python, where a real
    # server checks nothing): off while timing, checked once at the end instead.
    server.check_allocations = False
    return server


def make_pods(server, n: int, dra: bool) -> None:
    for i in range(n):
        name = f"user-{i}"
        if dra:
            spec = {"schedulerName": "tessera",
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "quarter"}],
                    "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}]}
            # As the webhook leaves it (deploy/portal/webhook.yaml's dra.tessera.io): marked, no share slot.
            server.create_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": name, "namespace": "team", "labels": {"tessera.io/reservation": ""}}, "spec": spec})
            server.make_template_claims("team", name)  # the resourceclaim controller
        else:
            server.create_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": name, "namespace": "team",
                "labels": {"sharedgpu/gpu_request": str(SHARE), "sharedgpu/gpu_mem": "4096Mi",
                           "tessera.io/reservation": ""}},
                "spec": {"schedulerName": "tessera", "containers": [{"name": "c", "image": "x"}]}})


def placement(i: int) -> tuple[str, GpuShare]:
    slot = i // 4  # four quarters per GPU
    node, gpu = slot // GPUS_PER_NODE % NODES, slot % GPUS_PER_NODE
    return f"gpu-node-{node}", GpuShare(uuid_of(node, gpu), gpu, SHARE, SHARE, 4096)


def _kind(path: str) -> str:
    path = re.sub(r"^/apis?/(resource\.k8s\.io/)?v1/(namespaces/[^/]+/)?", "", path)
    parts = path.split("/")
    return "/".join([parts[0], *parts[2:]]) if len(parts) > 1 else parts[0]


def _setup(fake, n: int, latency_s: float, dra: bool):
    server = server_for(fake, latency_s)
    make_pods(server, n, dra)
    return server


def _request_count(server) -> int:
    return len(server.requests)


def _cpu_s(server) -> float:
    """The CPU the fake's process has used (in its child process: its own)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _requests_since(server, before: int) -> dict[str, int]:
    return dict(Counter(f"{r.method} {_kind(r.path)}" for r in server.requests[before:] if not r.query.get("watch")))


def _allocated_problems(server) -> tuple[int, list[str]]:
    claims = server.objects("ResourceClaim")
    problems = sys.modules["fake_apiserver"].resource_api.allocation_problems(claims, server.objects("ResourceSlice"))
    return len([c for c in claims if c["status"].get("allocation")]), problems


class _Here:
    """The fake in this process, with FakeInProcess's surface (`--in-process`: the way this bench
    measured before, the fake's work charged to our client through the GIL)."""

    def __init__(self, setup, *args) -> None:
        self.server = setup(fake_apiserver_module(), *args)
        self.url = self.server.url

    def ask(self, fn, *args):
        return fn(self.server, *args)

    def stop(self) -> None:
        self.server.stop()


def run(n: int, latency_s: float, dra: bool, in_process: bool, side_by_side: bool = False) -> dict:
    fake = (_Here if in_process else FakeInProcess)(_setup, n, latency_s, dra)
    backend = KubernetesBackend(host=fake.url, watch_timeout_s=30, runtime_class="")
    try:
        before = fake.ask(_request_count)
        started = time.perf_counter()
        pending = backend.list_pending_external()
        listed_s = time.perf_counter() - started
        assert len(pending) == n, (len(pending), n)
        fake_cpu = None if in_process else fake.ask(_cpu_s)
        bind_started, bind_cpu = time.perf_counter(), time.process_time()
        bindings = [ExternalBinding(pod.ref, placement(i)[0], *external_binding(str(i + 1), "vision",
                                                                                 (placement(i)[1],), 10))
                    for i, pod in enumerate(sorted(pending, key=lambda p: int(p.name.split("-")[1])))]
        if side_by_side:  # as portal/placement/binding.py binds kubectl pods
            assert backend.bind_external_many(bindings) == [None] * n
        else:
            for b in bindings:
                backend.bind_external(b.pod, b.node, b.labels, b.annotations)
        bind_s, bind_cpu = time.perf_counter() - bind_started, time.process_time() - bind_cpu
        fake_cpu = None if fake_cpu is None else fake.ask(_cpu_s) - fake_cpu
        if dra:  # before the pods go (their claims go with them)
            allocated, problems = fake.ask(_allocated_problems)
            assert allocated == n, (allocated, n)
            assert not problems, problems[:3]
        for pod in pending:
            backend.unbind(PodRef(pod.namespace, pod.name), grace_s=30, reason="done")
        per_kind = fake.ask(_requests_since, before)
    finally:
        backend.close()
        fake.stop()
    return {"pods": n, "list_s": listed_s, "bind_s": bind_s, "pods_bound_per_s": n / bind_s,
            "our_cpu_ms_per_pod": 1e3 * bind_cpu / n,
            "fake_cpu_ms_per_pod": None if fake_cpu is None else 1e3 * fake_cpu / n,
            "admitted_and_bound_per_s": n / (listed_s + bind_s),
            "requests_per_reservation": {k: round(v / n, 3) for k, v in sorted(per_kind.items())}}


def _median_round(rounds: list[dict]) -> dict:
    return sorted(rounds, key=lambda r: r["pods_bound_per_s"])[len(rounds) // 2]


def _table(title: str, rounds: dict[str, list[dict]]) -> tuple[list[str], float]:
    plugin, dra = _median_round(rounds["device_plugin"]), _median_round(rounds["dra"])
    each = {name: " / ".join(f"{r['pods_bound_per_s']:.0f}" for r in rs) for name, rs in rounds.items()}
    ratio = dra["pods_bound_per_s"] / plugin["pods_bound_per_s"]
    return [
        f"## {title}", "",
        "| path | pods | list s | bind s | pods bound/s | admitted+bound/s | our CPU ms/pod | fake CPU ms/pod "
        "| pods bound/s, each round |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *(f"| {name} | {r['pods']} | {r['list_s']:.2f} | {r['bind_s']:.3f} | {r['pods_bound_per_s']:.0f} | "
          f"{r['admitted_and_bound_per_s']:.0f} | {r['our_cpu_ms_per_pod']:.2f} | "
          f"{'-' if r['fake_cpu_ms_per_pod'] is None else format(r['fake_cpu_ms_per_pod'], '.2f')} | {each[key]} |"
          for name, key, r in (("device plugin", "device_plugin", plugin), ("DRA", "dra", dra))), "",
        f"DRA over the device plugin (pods bound/s, median rounds): **{ratio:.2f}x**", "",
    ], ratio


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--latency-ms", type=float, default=5.0, help="the fake API server's answer time")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each path, interleaved; the median is kept")
    parser.add_argument("--in-process", action="store_true",
                        help="the fake in this process (its Python work then competes with ours for the GIL)")
    args = parser.parse_args()
    latency = args.latency_ms / 1e3
    modes = {"one_by_one": False, "side_by_side": True}
    rounds = {mode: {"device_plugin": [], "dra": []} for mode in modes}
    for _ in range(args.rounds):  # interleaved: a burst of load on this shared machine hits both paths
        for mode, side_by_side in modes.items():
            for key, dra in (("device_plugin", False), ("dra", True)):
                rounds[mode][key].append(run(args.pods, latency, dra=dra, in_process=args.in_process,
                                             side_by_side=side_by_side))
    command = "nice -n 10 .venv/bin/python bench/kubernetes/dra_bench.py " + " ".join(sys.argv[1:])
    meta = {"command": command.strip(), "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared), Python {platform.python_version()}",
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "fake": "in this process" if args.in_process else "in a process of its own", "rounds": args.rounds}
    one, one_ratio = _table("One pod after the other (`bind_external`)", rounds["one_by_one"])
    many, many_ratio = _table(f"Side by side (`bind_external_many`, at most {BIND_CONCURRENCY} pods in flight), "
                              "as portal/placement/binding.py binds kubectl pods", rounds["side_by_side"])
    plugin = _median_round(rounds["one_by_one"]["device_plugin"])
    dra = _median_round(rounds["one_by_one"]["dra"])
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "dra_bench.json").write_text(json.dumps({
        "meta": meta, "dra_over_device_plugin": {"one_by_one": one_ratio, "side_by_side": many_ratio},
        "median": {mode: {k: _median_round(v) for k, v in r.items()} for mode, r in rounds.items()},
        "rounds": rounds}, indent=2) + "\n")
    lines = [
        "# kubectl pods: DRA claims against the device-plugin path", "", f"`{meta['command']}`", "",
        f"{meta['when']} · {meta['machine']} · load average at the end {meta['load_average_at_end']} · "
        f"fake API server {meta['fake']}, answering after {args.latency_ms:g} ms, validation off, {NODES} nodes × "
        f"{GPUS_PER_NODE} GPUs · {args.rounds} rounds of each path and way, interleaved; the median round shown", "",
        *one, *many,
        "## Requests per reservation (list, bind, unbind; watches apart; the same either way)", "",
        "| request | device plugin | DRA |", "| --- | --- | --- |",
        *(f"| {k} | {plugin['requests_per_reservation'].get(k, 0):g} | {dra['requests_per_reservation'].get(k, 0):g} |"
          for k in sorted(set(plugin["requests_per_reservation"]) | set(dra["requests_per_reservation"]))), "",
    ]
    (OUT / "dra_bench.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
