"""Fleet view benchmark: the first screen of /fleet/ (a site admin's) with 500 nodes × 8 GPUs and
about three live shares per GPU, on PostgreSQL, timed in-process (the server's time: routing,
queries, template; no network or browser).

Baseline, measured in the same run: the same first screen on a fleet of one page (20 nodes × 8
GPUs, same shares per GPU). The ratio says how much the page grows with the fleet; the target is
p95 < 300 ms for the first screen at 500 × 8.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/web/fleet.py --nodes 500 --repeat 60

It creates (and drops) its own database `tessera_bench_fleet`. Results: bench/results/web/fleet.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.scratch_db import ScratchDatabase  # noqa: E402

DB = ScratchDatabase("tessera_bench_fleet")
RESULTS = ROOT / "bench" / "results" / "web"
MODELS = [("A100-80GB", 81920), ("H100-80GB", 81920), ("L40S", 46068), ("T4", 15360)]


def setup_django() -> None:
    os.environ["DATABASE_URL"] = DB.url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    os.environ.setdefault("DEBUG", "0")
    os.environ.setdefault("SECRET_KEY", "bench-only-" + "x" * 40)
    os.environ.setdefault("ALLOWED_HOSTS", "testserver,localhost")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def populate(nodes: int, shares_per_gpu: int = 3) -> dict:
    """Nodes, GPUs, teams, people, reservations and their live allocations, written in bulk
    (a benchmark's fixture, not an operation the portal offers)."""
    from decimal import Decimal

    from django.contrib.auth import get_user_model
    from django.db import connection, transaction

    from portal.fleet.models import Gpu, Node
    from portal.reservations.models import Allocation, Reservation
    from portal.tenancy.models import Membership, Role
    from tests.teams import make_team  # the team with its `*` quota row

    with transaction.atomic():
        with connection.cursor() as c:
            c.execute("TRUNCATE reservations_allocation, reservations_statetransition, reservations_reservation, "
                      "fleet_gpu, fleet_node, tenancy_membership, tenancy_team CASCADE")
        users = get_user_model().objects
        admin = users.filter(username="admin").first() or users.create_user("admin", password="x", is_staff=True)
        teams = [make_team(slug=f"team-{i}", name=f"Team {i}", quota_gpu_share=Decimal(10**4),
                           quota_memory_mib=10**12, quota_max_gpus=10**6) for i in range(12)]
        people = [users.filter(username=f"user-{i}").first() or users.create_user(f"user-{i}", password="x")
                  for i in range(24)]
        Membership.objects.bulk_create([Membership(user=p, team=teams[i % len(teams)], role=Role.MEMBER)
                                        for i, p in enumerate(people)])
        node_rows = Node.objects.bulk_create([Node(name=f"gpu-node-{i:04d}", status="ready") for i in range(nodes)])
        gpus = Gpu.objects.bulk_create([
            Gpu(node=n, uuid=f"GPU-{n.name}-{j}", index=j, model=MODELS[i % len(MODELS)][0],
                memory_mib=MODELS[i % len(MODELS)][1])
            for i, n in enumerate(node_rows) for j in range(8)])
        share = Decimal("0.25")
        reservations = Reservation.objects.bulk_create([
            Reservation(owner=people[k % len(people)], team=teams[k % len(teams)], image="busybox:1.36",
                        gpu_request=share, gpu_limit=Decimal("0.5"), gpu_memory_mib=4096, state="running",
                        node_id=g.node_id)
            for k, g in enumerate(g for g in gpus for _ in range(shares_per_gpu))], batch_size=2000)
        Allocation.objects.bulk_create([
            Allocation(reservation=r, gpu=gpus[k // shares_per_gpu], gpu_request=share, gpu_limit=Decimal("0.5"),
                       gpu_memory_mib=4096) for k, r in enumerate(reservations)], batch_size=2000)
    with connection.cursor() as c:
        c.execute("ANALYZE")
    return {"nodes": nodes, "gpus": len(gpus), "shares": len(reservations), "admin": admin}


def measure(admin, url: str, repeat: int) -> dict:
    """Wall time per request (what a browser waits for, PostgreSQL included) and this process's CPU
    time per request (the portal's own work: on a loaded machine the wall time also counts waiting
    for a core). Requests accept gzip, as browsers do: the time includes compressing, and
    `wire_bytes` is what crosses the network (`bytes`: the HTML)."""
    import gzip

    from django.db import connection, reset_queries
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    client.force_login(admin)
    for _ in range(3):  # warm: template loading, connection, plans
        assert client.get(url, HTTP_ACCEPT_ENCODING="gzip").status_code == 200
    times, cpu = [], []
    for _ in range(repeat):
        reset_queries()
        start, start_cpu = time.perf_counter(), time.process_time()
        response = client.get(url, HTTP_ACCEPT_ENCODING="gzip")
        times.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
        assert response.status_code == 200
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, HTTP_ACCEPT_ENCODING="gzip")
    wire = response.content
    body = gzip.decompress(wire) if response.get("Content-Encoding") == "gzip" else wire
    times.sort()
    cpu.sort()
    return {"url": url, "repeat": repeat, "p50_ms": round(statistics.median(times), 1),
            "p95_ms": round(times[int(0.95 * (len(times) - 1))], 1), "max_ms": round(times[-1], 1),
            "cpu_p50_ms": round(statistics.median(cpu), 1), "cpu_p95_ms": round(cpu[int(0.95 * (len(cpu) - 1))], 1),
            "queries": len(queries.captured_queries), "bytes": len(body), "wire_bytes": len(wire),
            "slices": body.count(b'class="slice'), "gpus_drawn": body.count(b"data-gpu=")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--baseline-nodes", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=60)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args()
    DB.recreate()
    try:
        setup_django()
        rows = []
        for nodes in (args.baseline_nodes, args.nodes):
            fleet = populate(nodes)
            admin = fleet.pop("admin")
            from portal.fleet.models import Node

            # What a live "nodes" message makes the page fetch: the rows of the changed nodes on screen.
            first = list(Node.objects.order_by("name").values_list("pk", flat=True)[:2])
            for label, url in (("first screen", "/fleet/"), ("filtered by model", "/fleet/?model=T4"),
                               ("last page", f"/fleet/?page={max(1, (nodes + 19) // 20)}"),
                               ("live: 1 changed row", f"/fleet/rows/?ids={first[0]}&next=/fleet/"),
                               ("live: 2 changed rows", f"/fleet/rows/?ids={first[0]},{first[1]}&next=/fleet/")):
                result = measure(admin, url, args.repeat) | fleet | {"screen": label}
                rows.append(result)
                print(f"{nodes:>4} nodes  {label:<20} p50 {result['p50_ms']:>6} ms  p95 {result['p95_ms']:>6} ms  "
                      f"(portal CPU p95 {result['cpu_p95_ms']:>5} ms)  "
                      f"{result['queries']} queries  {result['gpus_drawn']} GPUs, {result['slices']} slices drawn")
        base = next(r for r in rows if r["nodes"] == args.baseline_nodes and r["screen"] == "first screen")
        big = next(r for r in rows if r["nodes"] == args.nodes and r["screen"] == "first screen")
        ratio = round(big["p95_ms"] / base["p95_ms"], 2)
        verdict = "meets" if big["p95_ms"] < 300 else "MISSES"
        print(f"first screen p95 at {args.nodes} × 8: {big['p95_ms']} ms ({ratio}× the {args.baseline_nodes}-node "
              f"baseline); {verdict} the 300 ms target")
        write(rows, args, ratio, verdict)
    finally:
        if not args.keep:
            from django.db import connections

            connections.close_all()
            DB.drop()


def write(rows: list[dict], args, ratio: float, verdict: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    command = (f"DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/web/fleet.py "
               f"--nodes {args.nodes} --baseline-nodes {args.baseline_nodes} --repeat {args.repeat}")
    meta = {"command": command, "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "load_average_1_5_15": [round(x, 1) for x in os.getloadavg()],
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
            "first_screen_p95_ratio_vs_baseline": ratio, "target_p95_ms": 300, "verdict": verdict}
    (RESULTS / "fleet.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = [
        "# Fleet view: server time of /fleet/", "",
        f"Command: `{command}`  ", f"When: {meta['when']} on {meta['machine']}, shared with other work (load average "
        f"{meta['load_average_1_5_15']} at the end)", "",
        "In-process Django test client as a site admin (routing, queries, template; no network). "
        "About three live shares per GPU; 20 nodes per page.", "",
        "Wall: what the browser waits for (PostgreSQL included). Portal CPU: this process's CPU time per "
        "request, the portal's own work, which waiting for a core on a loaded machine does not inflate.", "",
        "| nodes × 8 GPUs | screen | wall p50 ms | wall p95 ms | max ms | portal CPU p95 ms | queries | GPUs drawn "
        "| slices | HTML bytes | bytes on the wire (gzip) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['nodes']} ({r['gpus']} GPUs, {r['shares']} shares) | {r['screen']} | {r['p50_ms']} | "
                     f"{r['p95_ms']} | {r['max_ms']} | {r['cpu_p95_ms']} | {r['queries']} | {r['gpus_drawn']} | "
                     f"{r['slices']} | {r['bytes']} | {r['wire_bytes']} |")
    lines += ["", f"First screen p95 at {args.nodes} × 8 is {ratio}× the {args.baseline_nodes}-node baseline of the "
              f"same run; it {verdict.lower()} the 300 ms target."]
    (RESULTS / "fleet.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
