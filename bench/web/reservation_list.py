"""CPU of rendering a list of reservations as the API does (ReservationListSerializer: the related
names and live allocations read in one query by api/reservation_related.py, then each row through
api/representation.py's shared fields), in process, on PostgreSQL.

The list: `--rows` reservations of one team on the demo inventory, each submitted through the
services and placed by the placement cycle in process (no Redis: tasks run eagerly, as in the
quickstart), so those that fit carry a live allocation. Timed: `ReservationSerializer(list,
many=True).data` on fresh rows (plain rows, nothing cached), time.process_time per row, best of
`--repeat` rounds of `--renders` renders each.

Run it in two trees to compare (a `git archive` of the baseline beside this one), interleaved:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/web/reservation_list.py --label after

It creates (and drops) its own database, `tessera_bench_reservation_list` or TESSERA_BENCH_DB.
Results: bench/results/web/reservation_list.json (one entry per label) and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.scratch_db import ScratchDatabase  # noqa: E402

DB = ScratchDatabase(os.environ.get("TESSERA_BENCH_DB", "tessera_bench_reservation_list"))
RESULTS = ROOT / "bench" / "results" / "web"


def _setup(rows: int) -> None:
    from decimal import Decimal

    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from portal.fleet import inventory
    from portal.reservations import rules, services
    from portal.tenancy.models import Membership
    from tests.teams import make_team

    call_command("migrate", verbosity=0)
    inventory.load(ROOT / "deploy" / "inventory" / "demo.yaml")
    team = make_team("bench", "Bench", quota_gpu_share=Decimal(10_000), quota_memory_mib=10**9, quota_max_gpus=10_000)
    user = get_user_model().objects.create_user("bench")
    Membership.objects.create(user=user, team=team)
    for _ in range(rows):
        services.submit(user, rules.ReservationSpec(team=team, image="busybox:1.36", gpu_request=Decimal("0.1"),
                                                    gpu_memory_mib=100))


def _render_ms_per_row(renders: int) -> float:
    from portal.api.serializers import ReservationSerializer
    from portal.reservations.models import Reservation

    total = 0.0
    rows = 0
    for _ in range(renders):
        items = list(Reservation.objects.order_by("-created_at"))  # fresh: nothing attached or cached
        start = time.process_time()
        data = ReservationSerializer(items, many=True).data
        total += time.process_time() - start
        rows += len(data)
    return total / rows * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--renders", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--label", default="run")
    args = parser.parse_args()
    DB.recreate()
    os.environ["DATABASE_URL"] = DB.url
    os.environ.setdefault("REDIS_URL", "")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    try:
        _setup(args.rows)
        _render_ms_per_row(2)  # warm: plans, compiled queries, imports
        best = min(_render_ms_per_row(args.renders) for _ in range(args.repeat))
    finally:
        from django.db import connection

        connection.close()
        DB.drop()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    command = (f"DATABASE_URL={DB.admin_url} TESSERA_BENCH_DB={DB.name} .venv/bin/python bench/web/reservation_list.py "
               + " ".join(sys.argv[1:]))
    run = {"label": args.label, "command": command, "commit": commit, "rows": args.rows,
           "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores, load avg {os.getloadavg()[0]:.2f}",
           "best_cpu_ms_per_row": round(best, 4)}
    print(json.dumps(run, indent=1))
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "reservation_list.json"
    runs = [r for r in (json.loads(path.read_text()) if path.exists() else []) if r["label"] != args.label] + [run]
    path.write_text(json.dumps(runs, indent=1) + "\n")
    lines = ["# CPU per reservation of an API list answer (in process)", "",
             "bench/web/reservation_list.py: ReservationSerializer(many=True).data over fresh rows (placed ones "
             "with their live allocation); time.process_time per row, best of the rounds.", "",
             "| run | commit | rows | CPU ms per row | machine | date (UTC) |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['label']} | {r['commit']} | {r['rows']} | {r['best_cpu_ms_per_row']} | {r['machine']} | "
              f"{r['date_utc']} |" for r in runs]
    lines += ["", "Commands:", ""] + [f"- {r['label']}: `{r['command']}`" for r in runs] + [""]
    (RESULTS / "reservation_list.md").write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
