"""What housekeeping's search for ended pods (`portal.placement.pods.ended_pods`, every 5 s) costs
PostgreSQL as the reservations table grows, with the `reservation_with_pod` partial index and,
as the baseline in the same run, without it (dropped, then created again).

The table holds `--live` placed reservations that name a pod (what runs now) and, for each size in
`--sizes`, that many ended ones whose pods were deleted (pod name forgotten): the rows a portal
accumulates over months. Per size: the query's execution time as PostgreSQL reports it
(EXPLAIN ANALYZE, median of `--repeat`) and the buffers it touched.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/orchestration/ended_pods_scan.py

It creates (and drops) its own database `tessera_bench_ended_pods` on that server.
Results: bench/results/orchestration/ended_pods_scan.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.scratch_db import ScratchDatabase  # noqa: E402

DB = ScratchDatabase("tessera_bench_ended_pods")
RESULTS = ROOT / "bench" / "results" / "orchestration"


def _setup(live: int) -> None:
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from portal.fleet import inventory
    from portal.reservations import rules, services
    from portal.reservations.models import Reservation
    from portal.tenancy.models import Membership, Role
    from tests.teams import make_team  # the team with its `*` quota row

    call_command("migrate", verbosity=0)
    inventory.load(ROOT / "deploy" / "inventory" / "demo.yaml")
    team = make_team(slug="bench", name="Bench", quota_gpu_share=Decimal(10_000),
                               quota_memory_mib=10**9, quota_max_gpus=10_000, allow_over_quota=True)
    user = get_user_model().objects.create_user("bench", password="pw-bench")
    Membership.objects.create(user=user, team=team, role=Role.MEMBER)
    template = services.submit(user, rules.ReservationSpec(team=team, image="busybox:1.36",
                                                           gpu_request=Decimal("0.1"), gpu_memory_mib=1024))
    _clone(template.pk, live - 1)
    # What runs now: named pods in state placed (written directly: the bench measures a read).
    Reservation.objects.update(state="placed", pod_namespace="tessera", pod_name="pod")


def _clone(template_id: int, count: int, **overrides: str) -> None:
    from django.db import connection

    from portal.reservations.models import Reservation

    columns = [f.column for f in Reservation._meta.concrete_fields if not f.primary_key]
    values = [f"'{overrides[c]}'" if c in overrides else c for c in columns]
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {Reservation._meta.db_table} ({', '.join(columns)}) "
                       f"SELECT {', '.join(values)} FROM {Reservation._meta.db_table}, generate_series(1, %s) "
                       "WHERE id = %s", [count, template_id])
        cursor.execute(f"ANALYZE {Reservation._meta.db_table}")


def _measure(repeat: int) -> dict:
    from django.db import connection

    from portal.placement.pods import ended_pods

    sql, params = ended_pods()[:500].query.sql_with_params()
    times, buffers, plan = [], [], ""
    with connection.cursor() as cursor:
        for _ in range(repeat):
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
            times.append(float(re.search(r"Execution Time: ([\d.]+) ms", plan).group(1)))
            hits = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", plan)
            buffers.append(int(hits.group(1)) + int(hits.group(2) or 0) if hits else 0)
    return {"ms": round(statistics.median(times), 3), "buffers": int(statistics.median(buffers)),
            "uses_index": "reservation_with_pod" in plan}


def run(sizes: list[int], live: int, repeat: int) -> list[dict]:
    import django

    DB.recreate()
    os.environ["DATABASE_URL"] = DB.url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    django.setup()
    from django.db import connection

    from portal.reservations.models import Reservation

    _setup(live)
    template = Reservation.objects.order_by("pk").values_list("pk", flat=True).first()
    rows, have = [], 0
    for size in sizes:
        _clone(template, size - have, state="cancelled", pod_name="", pod_namespace="")
        have = size
        with connection.cursor() as cursor:
            cursor.execute("DROP INDEX reservation_with_pod")
            cursor.execute("ANALYZE reservations_reservation")
        without = _measure(repeat)
        with connection.cursor() as cursor:
            cursor.execute("CREATE INDEX reservation_with_pod ON reservations_reservation (state) "
                           "WHERE pod_name > ''")
            cursor.execute("ANALYZE reservations_reservation")
        with_index = _measure(repeat)
        rows.append({"ended_reservations": size, "live_with_pod": live, "without_index": without,
                     "with_index": with_index,
                     "ratio": round(without["ms"] / with_index["ms"], 1) if with_index["ms"] else None})
        print(rows[-1], flush=True)
    connection.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--live", type=int, default=2_000, help="placed reservations naming a pod")
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    try:
        rows = run(sorted(args.sizes), args.live, args.repeat)
    finally:
        DB.drop()
    command = ("DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python "
               "bench/orchestration/ended_pods_scan.py " + " ".join(sys.argv[1:])).strip()
    result = {"command": command, "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores", "rows": rows}
    lines = ["# Housekeeping's search for ended pods, with and without `reservation_with_pod`", "",
             f"Command: `{command}`  ", f"Date (UTC): {result['date']}; machine: {result['machine']}", "",
             "PostgreSQL's execution time of `ended_pods()[:500]` (EXPLAIN ANALYZE, median), every 5 s in "
             f"housekeeping; {args.live} placed reservations name a pod, the ended ones do not.", "",
             "| ended reservations | without index ms | buffers | with index ms | buffers | uses index | ratio |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        a, b = r["without_index"], r["with_index"]
        lines.append(f"| {r['ended_reservations']:,} | {a['ms']} | {a['buffers']} | {b['ms']} | {b['buffers']} | "
                     f"{b['uses_index']} | {r['ratio']} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ended_pods_scan.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "ended_pods_scan.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
