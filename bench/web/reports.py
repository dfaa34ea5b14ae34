"""Reports benchmark: 30 days of per-minute rollups for 500 nodes × 8 GPUs and 2,000 reservations
on PostgreSQL; every report of GET /api/v1/reports/ answered through the full stack (Django, DRF,
JSON), timed over repeated runs with ragged windows (not on hour boundaries).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/web/reports.py --runs 15

It creates (and drops) its own database `tessera_bench_reports` on that server. Results:
bench/results/web/reports.{json,md}.

What is generated (rows written straight into the tables, as the telemetry pipeline would have
left them; the reservation services would take hours to place 2,000 requests one by one):
- 500 nodes × 8 GPUs (four models), 20 teams with a manager each, 2,000 reservations placed over
  the 30 days (shares 0.25 / 0.5 / 1.0, 1 to 60 hours, a fifth of them idle), 200 more waiting;
- ShareMinute: every minute of every allocation (the per-share rollups, ~2 M rows), folded into
  ShareHour by the real fold (portal.telemetry.hours.fold);
- GpuHour for every GPU and hour of the 30 days (2.9 M rows), generated directly, folded into
  GpuDay by the real fold (portal.telemetry.hours.fold_day), and GpuMinute
  only for the hours the measured windows start and end in: a month of GpuMinute for 4,000 GPUs
  is 173 M rows (~25 GB), which reports never read except at a window's ragged edges.

The baseline, measured in the same run: the share-based reports with the hourly rollups switched
off (hours_rolled_up_to unset), so they read the minute rows, as before this change.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.scratch_db import ScratchDatabase  # noqa: E402

DB = ScratchDatabase("tessera_bench_reports")
RESULTS = ROOT / "bench" / "results" / "web"
MODELS = [("A100-80GB", 81920), ("H100-80GB", 81920), ("L4", 23034), ("T4", 15360)]
NODES, GPUS_PER_NODE, TEAMS, RESERVATIONS, WAITING, DAYS = 500, 8, 20, 2000, 200, 30


def setup_django() -> None:
    os.environ["DATABASE_URL"] = DB.url
    os.environ["DB_CONN_MAX_AGE"] = "600"  # one database session, whose CPU time is read from /proc
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def generate(now: datetime, rng: random.Random) -> dict:
    from decimal import Decimal

    from django.contrib.auth import get_user_model
    from django.db import connection

    from portal.fleet.models import Gpu, Node
    from portal.reservations.models import Allocation, Reservation
    from portal.reservations.states import State
    from portal.tenancy.models import Membership, Role, Team

    timings = {}
    t = time.perf_counter()
    nodes = Node.objects.bulk_create([Node(name=f"node-{i:03d}") for i in range(NODES)])
    gpus = Gpu.objects.bulk_create([
        Gpu(node=n, uuid=f"GPU-{n.name}-{k}", index=k, model=MODELS[i % 4][0], memory_mib=MODELS[i % 4][1])
        for i, n in enumerate(nodes) for k in range(GPUS_PER_NODE)])
    teams = Team.objects.bulk_create([Team(slug=f"team-{i:02d}", name=f"Team {i}") for i in range(TEAMS)])
    User = get_user_model()
    users = User.objects.bulk_create([User(username=f"user-{i:03d}") for i in range(TEAMS * 5)])
    managers = User.objects.bulk_create([User(username=f"manager-{i:02d}") for i in range(TEAMS)])
    User.objects.create(username="site-admin", is_staff=True)
    Membership.objects.bulk_create(
        [Membership(user=u, team=teams[i % TEAMS], role=Role.MEMBER) for i, u in enumerate(users)]
        + [Membership(user=m, team=teams[i], role=Role.MANAGER) for i, m in enumerate(managers)])

    start = now - timedelta(days=DAYS)
    reservations, spans = [], []
    for i in range(RESERVATIONS):
        team = i % TEAMS
        share = rng.choice(["0.25", "0.5", "1.0"])
        placed = start + timedelta(minutes=rng.randrange(DAYS * 24 * 60))
        end = placed + timedelta(hours=rng.uniform(1, 60))
        created = placed - timedelta(seconds=rng.expovariate(1 / 120))
        held = end > now
        reservations.append(Reservation(
            owner=users[team + TEAMS * rng.randrange(5)], team=teams[team], image="bench:1", gpu_request=Decimal(share),
            gpu_limit=Decimal("1.0"), gpu_memory_mib=4096, state=State.RUNNING if held else State.SUCCEEDED,
            placed_at=placed, started_at=placed, finished_at=None if held else end))
        spans.append((created, placed, None if held else end, Decimal(share)))
    for i in range(WAITING):
        reservations.append(Reservation(owner=users[i % len(users)], team=teams[i % TEAMS], image="bench:1",
                                        gpu_request=Decimal("0.75"), gpu_limit=Decimal("1.0"), gpu_memory_mib=30000,
                                        state_reason="2 GPU(s) have less than 0.75 of compute free"))
    reservations = Reservation.objects.bulk_create(reservations, batch_size=1000)
    allocations = []
    for r, (created, _placed, _end, share) in zip(reservations, spans, strict=False):
        allocations.append(Allocation(reservation=r, gpu=gpus[rng.randrange(len(gpus))], gpu_request=share,
                                      gpu_limit=Decimal("1.0"), gpu_memory_mib=4096))
        r.created_at = created
    Reservation.objects.bulk_update(reservations[:RESERVATIONS], ["created_at"], batch_size=1000)
    allocations = Allocation.objects.bulk_create(allocations, batch_size=1000)
    for a, (_c, placed, end, _s) in zip(allocations, spans, strict=True):
        a.created_at, a.released_at = placed, end
    Allocation.objects.bulk_update(allocations, ["created_at", "released_at"], batch_size=1000)
    timings["fleet, teams, reservations"] = time.perf_counter() - t

    with connection.cursor() as c:
        t = time.perf_counter()
        # Every minute of every allocation; a fifth of the reservations idle (under 4 % of a GPU),
        # the rest using up to 1.6 × their request (bursting), capped at the whole GPU.
        c.execute("""
            INSERT INTO telemetry_shareminute (reservation_id, gpu_id, team_id, minute, samples, used_sum, used_max)
            SELECT reservation_id, gpu_id, team_id, m, 60, 60 * v, v FROM (
                SELECT a.reservation_id, a.gpu_id, r.team_id, m,
                       CASE WHEN r.id %% 5 = 0 THEN random() * 0.04
                            ELSE LEAST(1.0, a.gpu_request * random() * 1.6) END AS v
                FROM reservations_allocation a JOIN reservations_reservation r ON r.id = a.reservation_id
                CROSS JOIN LATERAL generate_series(date_trunc('minute', a.created_at),
                                                   COALESCE(a.released_at, %s) - interval '1 minute',
                                                   interval '1 minute') m) per_minute
        """, [now])
        timings["ShareMinute rows"] = time.perf_counter() - t
        t = time.perf_counter()
        first_hour = start.replace(minute=0, second=0, microsecond=0)
        last_hour = now.replace(minute=0, second=0, microsecond=0)
        c.execute("""
            INSERT INTO telemetry_gpuhour (gpu_id, hour, sampled_minutes, busy)
            SELECT g.id, h, 60, random() * 60
            FROM fleet_gpu g CROSS JOIN generate_series(%s, %s - interval '1 hour', interval '1 hour') h
        """, [first_hour, last_hour])
        timings["GpuHour rows"] = time.perf_counter() - t
        t = time.perf_counter()
        edge_hours = {last_hour} | {(now - span).replace(minute=0, second=0, microsecond=0) for span in SPANS.values()}
        for hour in sorted(edge_hours):
            c.execute("""
                INSERT INTO telemetry_gpuminute (gpu_id, minute, samples, sm_util_sum, sm_util_count, sm_util_max,
                                                 mem_used_sum, mem_used_max, power_sum, power_count, temp_max)
                SELECT g.id, m, 60, (random() * 6000)::bigint, 60, 100, 0, 0, 0, 0, NULL
                FROM fleet_gpu g CROSS JOIN generate_series(%s, %s, interval '1 minute') m WHERE m < %s
            """, [hour, hour + timedelta(minutes=59), now])
        timings["GpuMinute rows (edge hours)"] = time.perf_counter() - t
        c.execute("ANALYZE")
        counts = {}
        for table in ("telemetry_shareminute", "telemetry_gpuhour", "telemetry_gpuminute", "reservations_allocation"):
            c.execute(f"SELECT count(*) FROM {table}")  # our own table names
            counts[table] = c.fetchone()[0]
    return {"timings_s": timings, "rows": counts, "first_hour": first_hour, "last_hour": last_hour}


SPANS = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=DAYS) - timedelta(hours=2)}


def fold_hours(first_hour: datetime, last_hour: datetime, now: datetime) -> dict:
    from django.db import connection

    from portal.telemetry import hours
    from portal.telemetry.models import GpuHour, RollupState, ShareMinute

    # The real fold over the month, in day-sized steps (production folds one or two hours at a time).
    t = time.perf_counter()
    gpu_hours = GpuHour.objects.count()
    at = first_hour
    while at < last_hour:
        step = min(at + timedelta(days=1), last_hour)
        _fold_shares(hours, at, step)  # shares only: the GPU hours were generated (their minutes were not)
        at = step
    month = time.perf_counter() - t
    assert GpuHour.objects.count() == gpu_hours
    t = time.perf_counter()
    day = hours.ceil_day(first_hour)
    while day + hours.DAY <= last_hour:  # the GPU day rows, by the real fold of days from hours
        hours.fold_day(day)
        day += hours.DAY
    days = time.perf_counter() - t
    # One busy hour the way production folds it: 4,000 GPUs' minutes and the shares of that hour.
    hour = last_hour - timedelta(hours=1)
    with connection.cursor() as c:
        c.execute("""
            INSERT INTO telemetry_gpuminute (gpu_id, minute, samples, sm_util_sum, sm_util_count, sm_util_max,
                                             mem_used_sum, mem_used_max, power_sum, power_count, temp_max)
            SELECT g.id, m, 60, (random() * 6000)::bigint, 60, 100, 0, 0, 0, 0, NULL
            FROM fleet_gpu g CROSS JOIN generate_series(%s, %s, interval '1 minute') m
            ON CONFLICT DO NOTHING
        """, [hour, hour + timedelta(minutes=59)])
    t = time.perf_counter()
    hours.fold(hour, hour + timedelta(hours=1))
    one_hour = time.perf_counter() - t
    RollupState.objects.create(rolled_up_to=now.replace(second=0, microsecond=0), hours_rolled_up_to=last_hour)
    with connection.cursor() as c:
        c.execute("ANALYZE")
    return {"fold 30 days of shares (s)": round(month, 1), "fold 29 GPU days from hours (s)": round(days, 1),
            "fold one hour, 4,000 GPUs + shares (s)": round(one_hour, 2),
            "share minutes": ShareMinute.objects.count()}


def _fold_shares(hours, start: datetime, end: datetime) -> None:
    from django.db.models.functions import TruncHour

    from portal.telemetry.models import ShareHour

    rows = [ShareHour(reservation_id=r["reservation_id"], gpu_id=r["gpu_id"], team_id=r["team_id"], hour=r["h"],
                      **{k: r[k] for k in hours.share_minute_sums()})
            for r in hours.share_minutes(start, end).annotate(h=TruncHour("minute"))
            .values("reservation_id", "gpu_id", "team_id", "h").annotate(**hours.share_minute_sums())]
    ShareHour.objects.bulk_create(rows, batch_size=5000)


def reuse() -> tuple[datetime, dict, dict]:
    from django.db import connection

    from portal.telemetry import hours
    from portal.telemetry.models import GpuDay, GpuHour, RollupState

    state = RollupState.objects.get()
    now = state.rolled_up_to
    last_hour = hours.floor_hour(now)
    RollupState.objects.update(hours_rolled_up_to=last_hour)
    folding = {"reused": True}
    if not GpuDay.objects.exists():
        t = time.perf_counter()
        day = hours.ceil_day(GpuHour.objects.order_by("hour").values_list("hour", flat=True).first())
        while day + hours.DAY <= last_hour:
            hours.fold_day(day)
            day += hours.DAY
        folding["fold 29 GPU days from hours (s)"] = round(time.perf_counter() - t, 1)
        with connection.cursor() as c:
            c.execute("ANALYZE")
    rows = {}
    with connection.cursor() as c:
        for table in ("telemetry_shareminute", "telemetry_sharehour", "telemetry_gpuhour", "telemetry_gpuday",
                      "telemetry_gpuminute", "reservations_allocation"):
            c.execute(f"SELECT count(*) FROM {table}")  # our own table names
            rows[table] = c.fetchone()[0]
    return now, {"rows": rows, "timings_s": {}}, folding


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] if q != 0.5 else statistics.median(ordered), 3)


def _database_session():
    """The CPU seconds the database server process of our session has used so far (same machine),
    with parallel query off so that the whole query runs, and is counted, in that process."""
    from django.db import connection

    connection.ensure_connection()
    with connection.cursor() as c:
        c.execute("SET max_parallel_workers_per_gather = 0")
        c.execute("SELECT pg_backend_pid()")
        pid = c.fetchone()[0]
    tick = os.sysconf("SC_CLK_TCK")

    def cpu() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    return cpu


def measure(now: datetime, runs: int, rng: random.Random, baseline: bool) -> dict:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from portal.telemetry.models import RollupState

    User = get_user_model()
    clients = {}
    for who in ("site-admin", "manager-03"):
        client = Client()
        client.force_login(User.objects.get(username=who))
        clients[who] = client
    cases = [("site-admin", "usage", {"group_by": g}) for g in ("team", "user", "node", "gpu_model", "reservation")]
    cases += [("manager-03", "usage", {"group_by": g}) for g in ("team", "node", "reservation")]
    cases += [("site-admin", "overview", {}), ("manager-03", "overview", {})]
    cases += [("site-admin", "usage", {"group_by": "team", "format": "csv"})]
    if baseline:  # share-based reports only: GpuMinute for the whole month was not generated
        cases = [c for c in cases if c[1] == "usage" and c[2] == {"group_by": "team"}]
    state = RollupState.objects.get()
    kept = state.hours_rolled_up_to
    if baseline:
        RollupState.objects.update(hours_rolled_up_to=None)
    backend = _database_session()
    for who, kind, params in cases:  # warm up: URL resolution, templates, the database's caches
        clients[who].get(f"/api/v1/reports/{kind}/", {"range": "24h", **params})
    out = {}
    try:
        for span_name, span in SPANS.items():
            for who, kind, params in cases:
                times, cpu = [], []
                for _ in range(runs):
                    # Ragged: the window ends a random number of minutes before the data's end.
                    until = now - timedelta(minutes=rng.randrange(0, 50), seconds=rng.randrange(60))
                    query = {"since": (until - span).isoformat(), "until": until.isoformat(), **params}
                    c0, t = time.process_time() + backend(), time.perf_counter()
                    r = clients[who].get(f"/api/v1/reports/{kind}/", query)
                    times.append(time.perf_counter() - t)
                    cpu.append(time.process_time() + backend() - c0)
                    assert r.status_code == 200, r.content[:300]
                csv = " csv" if "format" in params else ""
                label = f"{span_name} {kind} {params.get('group_by', '')}{csv} as {who}"
                out[label] = {"p50_s": _p(times, 0.5), "p95_s": _p(times, 0.95),
                              "cpu_p50_s": _p(cpu, 0.5), "cpu_p95_s": _p(cpu, 0.95)}
                print(f"  {label:50s} wall p50 {out[label]['p50_s']:.3f} s p95 {out[label]['p95_s']:.3f} s · "
                      f"CPU p50 {out[label]['cpu_p50_s']:.3f} s p95 {out[label]['cpu_p95_s']:.3f} s", flush=True)
    finally:
        RollupState.objects.update(hours_rolled_up_to=kept)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="requests per report and window")
    parser.add_argument("--keep", action="store_true", help="keep the database (tessera_bench_reports)")
    parser.add_argument("--reuse", action="store_true", help="measure again on the data a --keep run left")
    parser.add_argument("--markdown", action="store_true", help="only write reports.md again from reports.json")
    args = parser.parse_args()
    if args.markdown:
        write_markdown(json.loads((RESULTS / "reports.json").read_text()))
        return
    rng = random.Random(13)
    try:
        if args.reuse:  # the data of an earlier --keep run: only the measurements again
            setup_django()
            now, data, folding = reuse()
        else:
            DB.recreate()
            setup_django()
            now = datetime.now(UTC).replace(microsecond=0)
            print("generating…", flush=True)
            data = generate(now, rng)
            print(json.dumps(data, default=str, indent=1), flush=True)
            folding = fold_hours(data["first_hour"], data["last_hour"], now)
            print(json.dumps(folding, indent=1), flush=True)
        print("with the hourly and daily rollups:", flush=True)
        load_before = os.getloadavg()
        fast = measure(now, args.runs, rng, baseline=False)
        load_after = os.getloadavg()
        print("baseline, minute rollups only:", flush=True)
        slow = measure(now, 3, rng, baseline=True)
    finally:
        if not (args.keep or args.reuse):
            DB.drop()
    worst = max(fast.items(), key=lambda kv: kv[1]["p95_s"])
    worst_cpu = max(fast.items(), key=lambda kv: kv[1]["cpu_p95_s"])
    result = {
        "command": f"DATABASE_URL=postgres://… .venv/bin/python bench/web/reports.py --runs {args.runs}"
                   + (" --reuse (on the data of an earlier --keep run)" if args.reuse else ""),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs shared with other work; "
                   f"load average {load_before[0]:.1f} before and {load_after[0]:.1f} after the measurements",
        "scale": {"nodes": NODES, "gpus": NODES * GPUS_PER_NODE, "teams": TEAMS, "reservations": RESERVATIONS,
                  "waiting": WAITING, "days": DAYS},
        "generated": {k: v for k, v in data.items() if k in ("rows", "timings_s")}, "folding": folding,
        "with_hourly_rollups": fast, "baseline_minutes_only": slow,
        "worst_wall_p95": {"report": worst[0], **worst[1]},
        "worst_cpu_p95": {"report": worst_cpu[0], **worst_cpu[1]},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "reports.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    write_markdown(result)


WHY = """What makes it fast: pre-aggregation, not an index. The per-minute rollups are folded into hourly
rows once an hour is complete (ShareHour per share and GpuHour per GPU, portal/telemetry/hours.py,
migration telemetry 0003), and GPU hours into UTC days (GpuDay, migration 0004). A report reads whole
days, then whole hours, and minutes only at its ragged edges and in the hour not folded yet, so a
30-day report reads about 60,000 share-hour rows instead of 3.5 million share minutes, and 116,000
GPU-day rows plus the edges instead of 2.9 million GPU hours (173 million GPU minutes). Idle and burst
are judged per minute while folding, so hours give the same numbers as minutes (tests/portal/
test_reports.py: test_hourly_rollups_give_the_same_numbers_as_the_minutes,
test_device_load_from_days_hours_and_minutes_agrees). The chart buckets are counted by the database.
The existing (minute) and (hour) / (day) indexes serve the range scans; no new index was needed.
What remains costly is the edges of site admins' device-load reports: up to two partial hours of
4,000 GPUs' minutes (up to 480,000 rows)."""


def write_markdown(result: dict) -> None:
    fast, slow = result["with_hourly_rollups"], result["baseline_minutes_only"]
    # Medians: the baseline runs a third as many requests, so its p95 is nearly its maximum.
    ratios = {k: round(slow[k]["cpu_p50_s"] / fast[k]["cpu_p50_s"], 1) for k in slow if fast[k]["cpu_p50_s"] > 0}
    lines = ["# Reports over 30 days, 500 nodes × 8 GPUs, 2,000 reservations", "", f"`{result['command']}`",
             "", f"Machine: {result['machine']}.", "", f"Rows: {result['generated']['rows']}.", "",
             f"Folding: {result['folding']}", "", WHY, "",
             "Wall time is what a browser waits on this shared machine; CPU is the portal's plus its database "
             "session's CPU seconds for the request (parallel query off): what it costs an idle core. The "
             "baseline is the same report with the hourly and daily rollups switched off (minute rows only), "
             "measured in the same run.", "",
             "| report | wall p50 (s) | wall p95 (s) | CPU p50 (s) | CPU p95 (s) | minutes only: wall p95 (s) | "
             "CPU p50 (s) | ratio (CPU p50) |", "|---|---|---|---|---|---|---|---|"]
    for k, v in fast.items():
        base = slow.get(k)
        lines.append(f"| {k} | {v['p50_s']} | {v['p95_s']} | {v['cpu_p50_s']} | {v['cpu_p95_s']} | "
                     f"{base['p95_s'] if base else '–'} | {base['cpu_p50_s'] if base else '–'} | "
                     f"{ratios.get(k, '–')} |")
    worst, worst_cpu = result["worst_wall_p95"], result["worst_cpu_p95"]
    lines += ["", f"Worst wall p95: {worst['report']} {worst['p95_s']} s; worst CPU p95: {worst_cpu['report']} "
              f"{worst_cpu['cpu_p95_s']} s."]
    (RESULTS / "reports.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

if __name__ == "__main__":
    main()
