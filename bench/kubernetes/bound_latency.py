"""Submission → bound on the kubernetes backend: 1,000 reservations pending at once, placed by real
Celery workers (Redis broker, PostgreSQL) and bound through `KubernetesBackend` to the test suite's
fake API server, which answers every request after 5 ms (--latency-ms; manifest validation off, as
the real server's takes microseconds). Target: p99 < 2 s with 2 workers. Also counts the API
requests the burst cost, per reservation.

Baseline, in the same run and with the same workers: the same burst on the simulated cluster (the
local backend, no network), so the ratio says what binding through a Kubernetes API server adds
on this machine, whatever else it is busy with.

The scenario and its helpers are bench/orchestration/bound_latency.py's (there on the simulated
cluster); here the workers reach the fake API server through a kubeconfig, and "bound" is the
moment the pod exists on it.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        nice -n 10 .venv/bin/python bench/kubernetes/bound_latency.py

It creates (and drops) the database `tessera_bench_kubernetes` and uses Redis database 13.
Results: bench/results/kubernetes/bound_latency.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "kubernetes"))
from bind_throughput import request_kind  # noqa: E402

from bench.kubernetes.fake_cluster import fake_apiserver_module  # noqa: E402
from bench.orchestration import bound_latency as orch  # noqa: E402
from bench.scratch_db import ScratchDatabase  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "kubernetes"
NAMESPACE = "tessera-workloads"
LOCAL_ENV = orch.env
orch.DB = ScratchDatabase("tessera_bench_kubernetes")
orch.REDIS_URL = "redis://127.0.0.1:6379/13"
KUBECONFIG = Path(tempfile.gettempdir()) / "tessera-bench-kubernetes.kubeconfig"


def env() -> dict[str, str]:
    return dict(os.environ, DATABASE_URL=orch.DB.url, REDIS_URL=orch.REDIS_URL, TESSERA_BACKEND="kubernetes",
                KUBECONFIG=str(KUBECONFIG), TESSERA_NAMESPACE=NAMESPACE, DJANGO_SETTINGS_MODULE="portal.settings",
                LOG_LEVEL="WARNING", PYTHONPATH=str(ROOT), DEBUG="0")


orch.env = env


def kubeconfig(url: str) -> None:
    KUBECONFIG.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "bench", "user": {"token": "bench"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "bench"}}]}))


def fresh_cluster(fake, latency_s: float):
    """A new fake API server with the fleet's nodes; the workers find it through the kubeconfig."""
    from portal.fleet.models import Node

    server = fake.FakeApiServer(namespaces=(NAMESPACE,), validate=False).start()
    for name in Node.objects.values_list("name", flat=True):
        server.add_node(name)
    server.answer_delay_s = latency_s
    kubeconfig(server.url)
    return server


def reset_reservations() -> None:
    import redis
    from django.db import connection

    from portal.placement.models import Fence

    with connection.cursor() as cur:
        cur.execute("TRUNCATE reservations_statetransition, reservations_allocation, reservations_reservation "
                    "RESTART IDENTITY CASCADE")
    Fence.objects.update_or_create(pk=1, defaults={"accepted": 0, "issued": 0})
    redis.Redis.from_url(orch.REDIS_URL).flushdb()


def burst(fake, n_workers: int, team, user, logdir: Path, size: int, latency_s: float) -> dict:
    reset_reservations()
    server = fresh_cluster(fake, latency_s)
    procs, logs = orch.start_workers(n_workers, logdir)
    try:
        started = time.monotonic()
        committed: list[float] = []
        ids = orch.bulk_pending(team, user, size, "A100-80GB", random.Random(1), committed=committed)
        deadline = time.monotonic() + 600
        while len(server.created_at) < size and time.monotonic() < deadline:
            time.sleep(0.25)
        wall = time.monotonic() - started
        times = {}
        for (_, name), at in server.created_at.items():
            rid = name.removeprefix("tessera-r").rsplit("-", 1)[0]
            times[rid] = min(at, times.get(rid, at))
        result = orch.latencies(ids, times, pending_at=committed[0]) | orch.cycle_stats(logs) | {
            "wall_s": round(wall, 2)}
        kinds = Counter(f"{r.method} {request_kind(r.path)}" for r in server.requests if not r.query.get("watch"))
        result["requests_per_reservation"] = {k: round(v / size, 3) for k, v in sorted(kinds.items())}
        result["max_in_flight"] = server.max_in_flight
    finally:
        orch.stop_workers(procs)
        server.stop()
    result["placements_per_s"] = round(result["bound"] / result["wall_s"], 1)
    return result


def local_burst(n_workers: int, team, user, logdir: Path, size: int) -> dict:
    """The baseline: bench/orchestration's burst on the simulated cluster, with these settings."""
    from django.conf import settings

    saved = orch.env, settings.TESSERA_BACKEND, settings.TESSERA_LOCAL_STATE, settings.TESSERA_LOCAL_START_S
    orch.env = lambda: LOCAL_ENV() | {"DATABASE_URL": orch.DB.url, "REDIS_URL": orch.REDIS_URL}
    settings.TESSERA_BACKEND, settings.TESSERA_LOCAL_STATE, settings.TESSERA_LOCAL_START_S = (
        "local", str(orch.state_path()), "0.5")
    try:
        result = orch.scenario_burst(n_workers, team, user, logdir, size)
    finally:
        orch.env, settings.TESSERA_BACKEND, settings.TESSERA_LOCAL_STATE, settings.TESSERA_LOCAL_START_S = saved
        for suffix in ("", "-wal", "-shm"):
            Path(str(orch.state_path()) + suffix).unlink(missing_ok=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--latency-ms", type=float, default=5.0)
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    signal.signal(signal.SIGTERM, orch.interrupt)
    fake = fake_apiserver_module()
    orch.DB.recreate()
    os.environ.update(env())
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env(), check=True)
    import django

    django.setup()
    from decimal import Decimal

    from django.contrib.auth import get_user_model

    from portal.fleet import inventory as fleet_inventory
    from portal.tenancy.models import Membership
    from tests.teams import make_team  # the team with its `*` quota row

    results: dict[int, dict] = {}
    baselines: dict[int, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        inv = Path(tmp) / "fleet.yaml"
        orch.inventory(inv, args.gpus)
        fleet_inventory.load(inv)
        team = make_team(slug="bench", name="Bench", quota_gpu_share=Decimal(90_000),
                                   quota_memory_mib=10**12, quota_max_gpus=100_000)
        user = get_user_model().objects.create_user("bench", password="bench-not-secret")
        Membership.objects.create(user=user, team=team)
        try:
            for n in workers:
                runs = []
                for k in range(args.repeat):
                    d = Path(tmp) / f"burst-{n}-run{k + 1}"
                    d.mkdir()
                    runs.append(burst(fake, n, team, user, d, args.burst, args.latency_ms / 1e3))
                    print(f"burst {n} worker(s), run {k + 1}: {runs[-1]}", flush=True)
                results[n] = orch.summarize(runs)
                local = []
                for k in range(args.repeat):
                    d = Path(tmp) / f"local-{n}-run{k + 1}"
                    d.mkdir()
                    local.append(local_burst(n, team, user, d, args.burst))
                    print(f"baseline (simulated cluster) {n} worker(s), run {k + 1}: {local[-1]}", flush=True)
                baselines[n] = orch.summarize(local)
        finally:
            from django.db import connections

            connections.close_all()
            orch.DB.drop()
            KUBECONFIG.unlink(missing_ok=True)
    write(results, baselines, args, workers)


def write(results: dict, baselines: dict, args, workers: list[int]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    command = " ".join(["DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres", "nice -n 10",
                        ".venv/bin/python", "bench/kubernetes/bound_latency.py", *sys.argv[1:]])
    meta = {"command": command, "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared), Python {platform.python_version()}",
            "gpus": args.gpus, "burst": args.burst, "latency_ms": args.latency_ms}
    (RESULTS / "bound_latency.json").write_text(json.dumps({"meta": meta, "burst": results,
                                                            "baseline_simulated_cluster": baselines}, indent=2) + "\n")
    lines = [
        "# Kubernetes backend: submission → bound, 1,000 pending at once", "",
        f"`{command}`", "",
        f"{meta['when']} · {meta['machine']} · {args.gpus} GPUs · kubernetes backend against the fake API server "
        f"answering every request after {args.latency_ms:g} ms (validation off) · PostgreSQL · Redis broker · "
        f"one Celery worker process per worker · load average at the end {meta['load_average_at_end']}", "",
        f"Each row is the median of {args.repeat} runs by p99. Latency from the commit that made the "
        f"{args.burst} reservations pending to their pod's creation on the API server (on the simulated "
        "cluster for the baseline rows, run in between with the same workers).", "",
        "| cluster | workers | bound | p50 s | p99 s | p99 of each run s | max s | wall s | placements/s | "
        "p99 vs simulated |", "|" + " --- |" * 10]
    for n, r in results.items():
        for label, row in (("simulated (baseline)", baselines.get(n)), ("Kubernetes API, 5 ms", r)):
            if row is None:
                continue
            ratio = row["p99_s"] / baselines[n]["p99_s"] if n in baselines and baselines[n]["p99_s"] else float("nan")
            lines.append(f"| {label} | {n} | {row['bound']}/{row['submitted']} | {row['p50_s']} | {row['p99_s']} | "
                         f"{', '.join(map(str, row['p99_runs_s']))} | {row['max_s']} | {row['wall_s']} | "
                         f"{row['placements_per_s']} | {ratio:.2f} |")
    for n, r in results.items():
        lines.append(f"\n{n} worker(s): API requests per reservation: "
                     + ", ".join(f"{k} {v}" for k, v in r["requests_per_reservation"].items())
                     + f"; at most {r['max_in_flight']} requests in flight.")
    lines += ["", "Target: p99 < 2 s with 2 workers."]
    (RESULTS / "bound_latency.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
