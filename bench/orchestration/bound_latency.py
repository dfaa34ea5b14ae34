"""Orchestration benchmark: time from submission to bound, and placement cycles per second, with
real Celery workers (Redis broker, PostgreSQL) acting on a 1,000-GPU simulated cluster.

Two scenarios, each with 1 and then 2 workers (the 1-worker run is the baseline of the ratios):

- burst: 1,000 reservations become pending at the same instant (one transaction), one cycle is
  requested; latency = pod created on the cluster − the instant that transaction committed (when
  they became pending; writing the 1,000 rows takes the benchmark itself 0.2-0.3 s, which the
  column "from created_at" adds back, as that timestamp is taken when the INSERT starts).
- steady: 1,000 reservations wait that cannot be placed (they ask for the 8 H100s, all taken),
  and new ones arrive at --rate per second for --seconds; latency as above for the arrivals.
  Every cycle still has to consider the 1,000 waiting ones.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/orchestration/bound_latency.py

It creates (and drops) the database `tessera_bench_orchestration` on that server and uses Redis
database 10. Results: bench/results/orchestration/results.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.scratch_db import ScratchDatabase  # noqa: E402

DB = ScratchDatabase("tessera_bench_orchestration")
REDIS_URL = "redis://127.0.0.1:6379/10"
RESULTS = ROOT / "bench" / "results" / "orchestration"


def state_path() -> Path:
    """The simulated cluster's state file, named after the database: a benchmark that reuses this
    module with its own database (bench/kubernetes) must not delete this one's cluster mid-run."""
    return Path(tempfile.gettempdir()) / f"{DB.name}-cluster.sqlite3"


def inventory(path: Path, gpus: int) -> None:
    """gpus/8 − 1 nodes of 8 A100s, plus one node of 8 H100s (the ones the waiting queue wants)."""
    lines = ["version: 1", "nodes:"]
    for i in range(gpus // 8 - 1):
        lines += [f"  - name: a100-{i:04d}", "    gpus:", "      - {model: A100-80GB, memory_mib: 81920, count: 8}"]
    lines += ["  - name: h100-0000", "    gpus:", "      - {model: H100-80GB, memory_mib: 81920, count: 8}"]
    path.write_text("\n".join(lines) + "\n")


def env() -> dict[str, str]:
    return dict(os.environ, DATABASE_URL=DB.url, REDIS_URL=REDIS_URL, TESSERA_BACKEND="local",
                TESSERA_LOCAL_STATE=str(state_path()), TESSERA_LOCAL_START_S="0.5", TESSERA_LOCAL_BATCH_S="3600",
                DJANGO_SETTINGS_MODULE="portal.settings", LOG_LEVEL="WARNING", PYTHONPATH=str(ROOT),
                DEBUG="0")  # as in production: no query log


def start_workers(n: int, logdir: Path) -> tuple[list[subprocess.Popen], list[Path]]:
    procs, logs = [], []
    for i in range(n):
        log = logdir / f"worker{i}.log"
        logs.append(log)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "portal", "worker", "-c", "1", "-n", f"bench{i}@%h",
             "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO"],
            cwd=ROOT, env=env(), stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + 120
    while not all(" ready." in x.read_text() for x in logs):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise SystemExit("workers did not start:\n" + "\n".join(x.read_text()[-2000:] for x in logs))
        time.sleep(0.3)
    return procs, logs


def stop_workers(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


CYCLE_LINE = re.compile(r"cycle \((?P<why>[^)]*)\): placed (?P<placed>\d+).* in (?P<s>[0-9.]+) s "
                        r"\(looked at (?P<looked>\d+)(?:; (?P<phases>[^)]*))?\)")


def cycle_stats(logs: list[Path]) -> dict:
    rounds = [m for log in logs for m in CYCLE_LINE.finditer(log.read_text())]
    seconds = [float(m["s"]) for m in rounds]
    longest = max(rounds, key=lambda m: float(m["s"]), default=None)
    return {"cycles": len(rounds), "cycle_seconds_total": round(sum(seconds), 3),
            "full_looks": sum(1 for m in rounds if int(m["looked"]) > 100),
            "cycle_p50_s": round(statistics.median(seconds), 4) if seconds else None,
            "cycle_max_s": round(max(seconds), 4) if seconds else None,
            # where the longest cycle spent its time, as the worker logged it
            "longest_cycle_phases": longest["phases"] if longest is not None else None}


def pod_times() -> dict[str, float]:
    """reservation id → when its pod was created on the simulated cluster (unix seconds)."""
    with sqlite3.connect(state_path(), timeout=30) as db:
        rows = db.execute("SELECT labels, created_at FROM pods").fetchall()
    out = {}
    for labels, created in rows:
        rid = json.loads(labels).get("tessera.io/reservation")
        if rid is not None:
            out[rid] = min(created, out.get(rid, created))
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def reset_state() -> None:
    """Empty the reservations, the cluster and Redis; keep the fleet."""
    import redis
    from django.db import connection

    from portal.placement import backend as backend_module
    from portal.placement.models import Fence

    with connection.cursor() as cur:
        cur.execute("TRUNCATE reservations_statetransition, reservations_allocation, reservations_reservation "
                    "RESTART IDENTITY CASCADE")
    Fence.objects.update_or_create(pk=1, defaults={"accepted": 0, "issued": 0})
    redis.Redis.from_url(REDIS_URL).flushdb()
    for suffix in ("", "-wal", "-shm"):
        Path(str(state_path()) + suffix).unlink(missing_ok=True)
    backend_module.forget_backends()
    backend_module.get_backend()  # creates the state file with the database's nodes


def bulk_pending(team, user, n: int, model: str, rng: random.Random, priority: int = 50,
                 shares: tuple[str, ...] = ("0.25", "0.5", "1.0"),
                 memory: tuple[int, int] = (1024, 20_000), committed: list[float] | None = None) -> list[int]:
    """n pending reservations written in one transaction, as if submitted at the same instant;
    the instant it commits is appended to `committed`."""
    from decimal import Decimal

    from django.db import transaction

    from portal.cycle_requests import request_cycle
    from portal.reservations.models import Reservation, StateTransition

    with transaction.atomic():
        rows = Reservation.objects.bulk_create(
            Reservation(owner=user, team=team, image="pytorch/pytorch:2.3.0", kind="batch",
                        gpu_request=Decimal(share), gpu_limit=Decimal(share), gpu_memory_mib=mib,
                        gpu_model=model, priority=priority, state_reason="waiting for the next placement cycle")
            for share, mib in ((rng.choice(shares), rng.randint(*memory)) for _ in range(n)))
        StateTransition.objects.bulk_create(
            StateTransition(reservation=r, from_state="", to_state="pending", actor=user,
                            actor_label=user.username, reason="submitted (bench)") for r in rows)
        if committed is not None:  # registered first: runs before the cycle is asked for
            transaction.on_commit(lambda: committed.append(time.time()))
        request_cycle("bench burst")
    return [r.pk for r in rows]


def wait_bound(ids: list[int], timeout: float) -> dict[str, float]:
    """Wait until every one of `ids` has a pod. While waiting it only counts rows (reading and
    parsing every pod's labels each time would take CPU from the workers being measured)."""
    deadline = time.monotonic() + timeout
    wanted = {str(i) for i in ids}
    while True:
        with sqlite3.connect(state_path(), timeout=30) as db:
            (count,) = db.execute("SELECT count(*) FROM pods").fetchone()
        if count >= len(wanted) or time.monotonic() > deadline:
            times = pod_times()
            if wanted <= set(times) or time.monotonic() > deadline:
                return times
        time.sleep(0.25)


def latencies(ids: list[int], times: dict[str, float], pending_at: float | None = None) -> dict:
    """Pod created − reservation created, or − `pending_at` when given (then the figures from
    created_at are kept too, as `*_from_created_s`)."""
    from portal.reservations.models import Reservation

    created = dict(Reservation.objects.filter(pk__in=ids).values_list("pk", "created_at"))
    from_created = [times[str(i)] - created[i].timestamp() for i in ids if str(i) in times]
    lat = [times[str(i)] - pending_at for i in ids if str(i) in times] if pending_at is not None else from_created
    out = {"submitted": len(ids), "bound": len(lat),
           "p50_s": round(percentile(lat, 0.50), 3) if lat else None,
           "p99_s": round(percentile(lat, 0.99), 3) if lat else None,
           "max_s": round(max(lat), 3) if lat else None}
    if pending_at is not None and from_created:
        out |= {"p50_from_created_s": round(percentile(from_created, 0.50), 3),
                "p99_from_created_s": round(percentile(from_created, 0.99), 3)}
    return out


def scenario_burst(n_workers: int, team, user, logdir: Path, size: int) -> dict:
    reset_state()
    procs, logs = start_workers(n_workers, logdir)
    try:
        started = time.monotonic()
        committed: list[float] = []
        ids = bulk_pending(team, user, size, "A100-80GB", random.Random(1), committed=committed)
        times = wait_bound(ids, timeout=600)
        wall = time.monotonic() - started
        result = latencies(ids, times, pending_at=committed[0]) | cycle_stats(logs) | {"wall_s": round(wall, 2)}
    finally:
        stop_workers(procs)
    result["cycles_per_s"] = round(result["cycles"] / result["wall_s"], 2)
    result["placements_per_s"] = round(result["bound"] / result["wall_s"], 1)
    return result


def summarize(runs: list[dict]) -> dict:
    """The run with the median p99 stands for the lot (the host's noise moves single runs by a
    third), with every run's p99 and the worst beside it."""
    middle = sorted(runs, key=lambda r: r["p99_s"])[(len(runs) - 1) // 2]
    return middle | {"runs": len(runs), "p99_runs_s": [r["p99_s"] for r in runs],
                     "p99_worst_s": max(r["p99_s"] for r in runs)}


def scenario_steady(n_workers: int, team, user, logdir: Path, waiting: int, rate: float, seconds: float) -> dict:
    from portal.reservations import rules, services
    from portal.reservations.models import Reservation

    reset_state()
    procs, logs = start_workers(n_workers, logdir)
    try:
        # The 8 H100s taken for good, then the queue that waits for them.
        blockers = bulk_pending(team, user, 8, "H100-80GB", random.Random(2), priority=100, shares=("1.0",),
                                memory=(81920, 81920))
        wait_bound(blockers, timeout=120)
        queue = bulk_pending(team, user, waiting, "H100-80GB", random.Random(3), priority=10)
        deadline = time.monotonic() + 120
        # Until the queue's first full look has ended (positions are written last in a cycle).
        while Reservation.objects.filter(pk__in=queue, queue_position__isnull=True).exists():
            if time.monotonic() > deadline:
                raise SystemExit("the waiting queue never got its reasons")
            time.sleep(0.5)
        for log in logs:  # count only the cycles of the measured part
            log.write_text("")
        rng = random.Random(4)
        arrivals, started = [], time.monotonic()
        while time.monotonic() - started < seconds:
            spec = rules.ReservationSpec(team=team, image="pytorch/pytorch:2.3.0", gpu_model="A100-80GB",
                                         gpu_request=rng.choice(["0.25", "0.5", "1.0"]),
                                         gpu_memory_mib=rng.randint(1024, 20_000), priority=50)
            arrivals.append(services.submit(user, spec).pk)
            time.sleep(max(0.0, started + len(arrivals) / rate - time.monotonic()))
        times = wait_bound(arrivals, timeout=120)
        wall = time.monotonic() - started
        result = latencies(arrivals, times) | cycle_stats(logs) | {"wall_s": round(wall, 2), "waiting": waiting,
                                                                   "rate_per_s": rate}
    finally:
        stop_workers(procs)
    result["cycles_per_s"] = round(result["cycles"] / result["wall_s"], 2)
    return result


def keep_logs(scenario_dir: Path, into: Path | None) -> None:
    if into is not None:
        into.mkdir(parents=True, exist_ok=True)
        for log in scenario_dir.glob("*.log"):
            shutil.copy(log, into / f"{scenario_dir.name}-{log.name}")


def cpu_times() -> tuple[int, int]:
    """(steal, total) jiffies so far: the share of CPU time the hypervisor took during the run says
    how far the timings can be trusted on a shared host."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def interrupt(*_) -> None:
    """A SIGTERM handler: stop as Ctrl-C does, so the run stops its workers on the way out."""
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--burst", type=int, default=1000, help="reservations pending at once")
    parser.add_argument("--waiting", type=int, default=1000, help="unplaceable reservations in the steady run")
    parser.add_argument("--rate", type=float, default=10.0, help="arrivals per second in the steady run")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the steady run")
    parser.add_argument("--repeat", type=int, default=3, help="burst runs per worker count (median reported)")
    parser.add_argument("--workers", default="1,2", help="worker counts, comma-separated; the first is the baseline")
    parser.add_argument("--scenarios", default="burst,steady", help="which to run, comma-separated")
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument("--logs", type=Path, help="copy the workers' logs here")
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    scenarios = set(args.scenarios.split(","))
    if not scenarios <= {"burst", "steady"}:
        parser.error("--scenarios: burst, steady")
    # Stopped from outside: unwind (the scenarios stop their workers and the database is dropped).
    signal.signal(signal.SIGTERM, interrupt)
    if args.gpus < 16 or args.gpus % 8:
        parser.error("--gpus must be a multiple of 8, at least 16")

    steal_at_start = cpu_times()
    DB.recreate()
    os.environ.update(env())
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env(), check=True)
    import django

    django.setup()
    from decimal import Decimal

    from django.contrib.auth import get_user_model

    from portal.fleet import inventory as fleet_inventory
    from portal.tenancy.models import Membership
    from tests.teams import make_team  # the team with its `*` quota row

    with tempfile.TemporaryDirectory() as tmp:
        inv = Path(tmp) / "fleet.yaml"
        inventory(inv, args.gpus)
        fleet_inventory.load(inv)
        team = make_team(slug="bench", name="Bench", quota_gpu_share=Decimal(90_000),
                                   quota_memory_mib=10**12, quota_max_gpus=100_000)
        user = get_user_model().objects.create_user("bench", password="bench-not-secret")
        Membership.objects.create(user=user, team=team)
        results = {"burst": {}, "steady": {}}
        try:
            for n in workers:
                if "burst" in scenarios:
                    runs = []
                    for k in range(args.repeat):
                        d = Path(tmp) / f"burst-{n}-run{k + 1}"
                        d.mkdir()
                        runs.append(scenario_burst(n, team, user, d, args.burst))
                        print(f"burst  {n} worker(s), run {k + 1}: {runs[-1]}", flush=True)
                        keep_logs(d, args.logs)
                    results["burst"][n] = summarize(runs)
                if "steady" in scenarios:
                    d = Path(tmp) / f"steady-{n}"
                    d.mkdir()
                    results["steady"][n] = scenario_steady(n, team, user, d, args.waiting, args.rate, args.seconds)
                    print(f"steady {n} worker(s): {results['steady'][n]}", flush=True)
                    keep_logs(d, args.logs)
        finally:
            from django.db import connections

            connections.close_all()
            if not args.keep_db:
                DB.drop()
            for suffix in ("", "-wal", "-shm"):
                Path(str(state_path()) + suffix).unlink(missing_ok=True)
    steal, total = (b - a for a, b in zip(steal_at_start, cpu_times(), strict=True))
    write(results, args, workers, steal / max(1, total))


def write(results: dict, args, workers: list[int], steal: float) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    command = " ".join(["DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres", ".venv/bin/python",
                        "bench/orchestration/bound_latency.py", *sys.argv[1:]])
    meta = {"command": command, "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "cpu_steal": round(steal, 3),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
            "gpus": args.gpus, "burst": args.burst, "waiting": args.waiting, "rate": args.rate,
            "seconds": args.seconds}
    (RESULTS / "results.json").write_text(json.dumps({"meta": meta, **results}, indent=2) + "\n")
    base = workers[0]
    lines = [
        "# Orchestration: submission → bound, cycles/s", "",
        f"`{command}`", "", f"{meta['when']} · {meta['machine']} · {args.gpus} simulated GPUs · "
        "local backend · PostgreSQL · Redis broker · one Celery worker process per worker (concurrency 1) · "
        f"load average at the end {meta['load_average_at_end']} · CPU time taken by the hypervisor during the run "
        f"(steal) {steal:.0%} (the machine is shared)", "",
    ]
    if results["burst"]:
        lines += [f"## Burst: {args.burst} reservations pending at once", "",
                  f"Each row is the median of {args.repeat} runs by p99; every run's p99 is listed. Latency "
                  "from the commit that made them pending; in brackets, from their `created_at` (which "
                  "includes the benchmark's own 0.2-0.3 s of writing the 1,000 rows).", "",
                  "| workers | bound | p50 s | p99 s | p99 of each run s | max s | wall s | cycles | cycles/s | "
                  f"placements/s | p99 vs {base} worker |", "|" + " --- |" * 11]
    for n, r in results["burst"].items():
        ratio = r["p99_s"] / results["burst"][base]["p99_s"] if r["p99_s"] else float("nan")
        lines.append(f"| {n} | {r['bound']}/{r['submitted']} | {r['p50_s']} ({r.get('p50_from_created_s')}) | "
                     f"{r['p99_s']} ({r.get('p99_from_created_s')}) | {', '.join(map(str, r['p99_runs_s']))} | "
                     f"{r['max_s']} | {r['wall_s']} | {r['cycles']} | {r['cycles_per_s']} | "
                     f"{r['placements_per_s']} | {ratio:.2f} |")
    for n, r in results["burst"].items():
        if r.get("longest_cycle_phases"):
            lines.append(f"\n{n} worker(s), the cycle that placed them, seconds: {r['longest_cycle_phases']}.")
    if results["steady"]:
        lines += ["", f"## Steady: {args.waiting} waiting that cannot be placed, {args.rate:g} arrivals/s for "
                  f"{args.seconds:g} s", "",
                  "| workers | bound | p50 s | p99 s | max s | cycles | cycles/s | cycle p50 s | cycle max s | "
                  f"full looks | p99 vs {base} worker |", "|" + " --- |" * 11]
    for n, r in results["steady"].items():
        ratio = r["p99_s"] / results["steady"][base]["p99_s"] if r["p99_s"] else float("nan")
        lines.append(f"| {n} | {r['bound']}/{r['submitted']} | {r['p50_s']} | {r['p99_s']} | {r['max_s']} | "
                     f"{r['cycles']} | {r['cycles_per_s']} | {r['cycle_p50_s']} | {r['cycle_max_s']} | "
                     f"{r['full_looks']} | {ratio:.2f} |")
    lines += ["", "Target: p99 < 1 s. Bound = the pod exists on the (simulated) cluster; the simulated API "
              "answers in microseconds, so a real API server adds its own latency to each bind.", ""]
    (RESULTS / "results.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
