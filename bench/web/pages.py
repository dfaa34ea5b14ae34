"""Web pages benchmark: server time and bytes of the data scientist's pages on PostgreSQL.

The loaded case: alice owns 200 reservations over 30 days (160 ended, 25 running with their GPU
shares, 15 pending), with per-minute rollups over each one's life (the measured reservation has
run for 30 days: 43,200 minutes) plus the raw samples of the last minutes. The baseline, in the same
run and database: bob, with one running reservation and a day of rollups. Each page is requested
through Django's full stack (middleware, sessions, templates, PostgreSQL; no network), warm.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/web/pages.py --requests 60

Targets (issue #11): p95 < 150 ms for the home page, the request page's preview and the reservation
page, < 100 ms for the preview; CSS + JS of a page < 150 KB compressed. It creates (and drops) the
database `tessera_bench_web`. Results: bench/results/web/pages.{json,md}.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.scratch_db import ScratchDatabase  # noqa: E402

DB = ScratchDatabase("tessera_bench_web")
RESULTS = ROOT / "bench" / "results" / "web"
TARGET_MS = {"home": 150, "preview": 100, "reservation": 150, "request": 150}
ASSET_BUDGET = 150 * 1024


def setup_django() -> None:
    os.environ["DATABASE_URL"] = DB.url
    os.environ["REDIS_URL"] = ""
    os.environ["DEBUG"] = "0"  # DEBUG keeps every query in memory: not what a server runs
    os.environ["DB_CONN_MAX_AGE"] = "600"  # a server keeps its connections (production: a pool)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def seed() -> dict:
    """Returns the objects the measurements use. Bulk SQL where rows are many."""
    from datetime import timedelta
    from decimal import Decimal

    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone

    from portal.fleet import inventory
    from portal.fleet.models import Gpu
    from portal.reservations.models import Allocation, Reservation, StateTransition
    from portal.telemetry.models import RollupState
    from portal.tenancy.models import Membership, Preset, Role
    from tests.teams import make_team  # the team with its `*` quota row

    inventory.load(ROOT / "deploy" / "inventory" / "demo.yaml")
    vision = make_team(slug="vision", name="Vision", quota_gpu_share=Decimal(40), quota_memory_mib=10**7,
                                 quota_max_gpus=100)
    nlp = make_team(slug="nlp", name="NLP", quota_gpu_share=Decimal(4))
    users = get_user_model().objects
    alice, bob = users.create_user("alice"), users.create_user("bob")
    Membership.objects.create(user=alice, team=vision, role=Role.MEMBER)
    Membership.objects.create(user=bob, team=nlp, role=Role.MEMBER)
    for i in range(4):
        Preset.objects.create(team=vision, name=f"Preset {i}", gpu_request=Decimal("0.25"), gpu_limit=Decimal("0.5"),
                              gpu_memory_mib=4096, image="jupyter/base-notebook:1")
    now = timezone.now()
    gpus = list(Gpu.objects.order_by("node__name", "index").select_related("node"))
    rows, spans = [], []  # spans: (reservation, start, end, gpu)

    def make(owner, team, state, start, end, gpu=None, **extra):
        r = Reservation.objects.create(owner=owner, team=team, image="pytorch/pytorch:2", kind="interactive",
                                       gpu_request=Decimal("0.25"), gpu_limit=Decimal("0.5"), gpu_memory_mib=8192,
                                       state=state, node=gpu.node if gpu else None, **extra)
        Reservation.objects.filter(pk=r.pk).update(created_at=start - timedelta(seconds=30), placed_at=start,
                                                   finished_at=end if state not in ("running", "pending") else None)
        if gpu is not None and state == "running":
            Allocation.objects.create(reservation=r, gpu=gpu, gpu_request=Decimal("0.25"),
                                      gpu_limit=Decimal("0.5"), gpu_memory_mib=8192)
        rows.append(r)
        if gpu is not None:
            spans.append((r, start, end, gpu))
        return r

    day = timedelta(days=1)
    target = make(alice, vision, "running", now - 30 * day, now, gpus[0], expires_at=now + day)
    for i in range(24):
        start = now - (1 + (i * 7) % 29) * day
        make(alice, vision, "running", start, now, gpus[(i + 1) % len(gpus)], expires_at=now + day)
    for i in range(160):
        start = now - (1 + i % 29) * day - timedelta(hours=i % 11)
        make(alice, vision, ["succeeded", "cancelled", "expired", "failed"][i % 4], start,
             start + timedelta(hours=2 + i % 6), gpus[i % len(gpus)])
    for i in range(15):
        make(alice, vision, "pending", now - timedelta(minutes=5 + i), now, None, queue_position=i + 1,
             estimated_start=now + timedelta(hours=1 + i))
    base = make(bob, nlp, "running", now - day, now, gpus[-1], expires_at=now + day)
    StateTransition.objects.bulk_create([
        StateTransition(reservation=r, from_state=a, to_state=b, actor_label="system", reason="bench")
        for r in rows for a, b in (("", "pending"), ("pending", "placed"), ("placed", "running"))])
    rolled_to = now.replace(second=0, microsecond=0) - timedelta(minutes=2)
    RollupState.objects.create(rolled_up_to=rolled_to)
    with connection.cursor() as cur:
        for r, start, end, gpu in spans:
            cur.execute(
                "INSERT INTO telemetry_shareminute (reservation_id, gpu_id, team_id, minute, samples, used_sum, "
                "used_max, mem_used_max) SELECT %s, %s, %s, m, 60, 60 * (0.2 + 0.3 * random()), 0.5, "
                "(4000 + 3000 * random())::int FROM generate_series(date_trunc('minute', %s::timestamptz), "
                "LEAST(%s::timestamptz, %s::timestamptz) - interval '1 minute', interval '1 minute') AS m",
                [r.pk, gpu.pk, r.team_id, start, end, rolled_to])
            if end >= now:
                cur.execute(
                    "INSERT INTO telemetry_sharesample (reservation_id, gpu_id, ts, used_frac, mem_used_mib) "
                    "SELECT %s, %s, t, 0.2 + 0.3 * random(), 5000 FROM generate_series(%s::timestamptz, "
                    "%s::timestamptz, interval '1 second') AS t", [r.pk, gpu.pk, rolled_to, now])
        cur.execute("ANALYZE")
        cur.execute("SELECT count(*) FROM telemetry_shareminute")
        minutes = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM telemetry_shareminute WHERE reservation_id = %s", [target.pk])
        target_minutes = cur.fetchone()[0]
    return {"alice": alice, "bob": bob, "target": target, "base": base, "reservations": len(rows) - 1,
            "share_minutes": minutes, "target_minutes": target_minutes}


PREVIEW_QUERY = {"team": "vision", "kind": "interactive", "image": "jupyter/base-notebook:1", "gpu_model": "",
                 "gpu_request": "0.3", "gpu_limit": "0.6", "memory_gib": "12", "gpu_count": "1", "hours": "4",
                 "priority": "50", "command": "python train.py --epochs 3"}


def assets_of(html: str) -> dict[str, int]:
    """The CSS and JS files a page loads → their gzip size (what a server with compression sends)."""
    out = {}
    for url in re.findall(r'<(?:link rel="stylesheet"|script) (?:href|src)="(/static/[^"]+)"', html):
        path = ROOT / "static" / url.removeprefix("/static/")
        out[url] = len(gzip.compress(path.read_bytes(), 9))
    return out


def measure(client, url: str, params: dict | None, n: int) -> dict:
    from django.db import connection

    for _ in range(5):
        response = client.get(url, params or {})
        assert response.status_code == 200, (url, response.status_code)
    queries = []
    # Counted by a wrapper: the query log is reset when a request starts.
    with connection.execute_wrapper(lambda execute, sql, *a: queries.append(sql) or execute(sql, *a)):
        client.get(url, params or {})
    times, cpu = [], []
    for _ in range(n):
        started, cpu_started = time.perf_counter(), time.thread_time()
        response = client.get(url, params or {})
        times.append((time.perf_counter() - started) * 1000)
        cpu.append((time.thread_time() - cpu_started) * 1000)
    body = response.content
    times.sort()
    # CPU: this process's own work (Python, templates), not PostgreSQL's and not time spent waiting
    # for a core: on a machine shared with other work, the part of the wall time that is ours.
    return {"p50_ms": round(statistics.median(times), 1), "p95_ms": round(times[int(0.95 * (n - 1))], 1),
            "cpu_p50_ms": round(statistics.median(cpu), 1),
            "max_ms": round(times[-1], 1), "queries": len(queries), "html_bytes": len(body),
            "html_gzip_bytes": len(gzip.compress(body, 6))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=60, help="timed requests per page (after 5 warm-up)")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--profile", help="profile this page of the loaded case (home, request, preview, "
                                          "reservation) instead of measuring")
    args = parser.parse_args()
    DB.recreate()
    try:
        setup_django()
        seeded_at = time.perf_counter()
        world = seed()
        seed_s = time.perf_counter() - seeded_at
        from django.conf import settings
        from django.test import Client

        settings.ALLOWED_HOSTS = ["testserver"]
        pages = {"home": ("/", None), "request": ("/reservations/new/", None),
                 "preview": ("/reservations/new/preview/", PREVIEW_QUERY)}
        if args.profile:
            import cProfile
            import pstats

            client = Client()
            client.force_login(world["alice"])
            url, params = dict(pages, reservation=(f"/reservations/{world['target'].pk}/", None))[args.profile]
            for _ in range(3):
                client.get(url, params or {})
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(20):
                client.get(url, params or {})
            profile.disable()
            pstats.Stats(profile).sort_stats("cumulative").print_stats(45)
            return
        results = {}
        for who, key in (("baseline", "base"), ("loaded", "target")):
            client = Client()
            client.force_login(world["bob" if who == "baseline" else "alice"])
            query = dict(PREVIEW_QUERY, team="nlp" if who == "baseline" else "vision")
            urls = dict(pages, preview=("/reservations/new/preview/", query),
                        reservation=(f"/reservations/{world[key].pk}/", None))
            results[who] = {name: measure(client, url, params, args.requests) for name, (url, params) in urls.items()}
            # The reservation page's first view: its usage buckets are not cached yet.
            from django.core.cache import cache

            cold = []
            for _ in range(5):
                cache.clear()
                started = time.perf_counter()
                client.get(urls["reservation"][0])
                cold.append((time.perf_counter() - started) * 1000)
            results[who]["reservation"]["first_view_p50_ms"] = round(statistics.median(cold), 1)
            for name in ("home", "request", "reservation"):
                html = client.get(urls[name][0]).content.decode()
                assets = assets_of(html)
                results[who][name]["assets_gzip_bytes"] = sum(assets.values())
                results[who][name]["assets"] = assets
        report = {
            "command": "DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/web/pages.py "
                       f"--requests {args.requests}",
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                        "nice": os.nice(0),
                        "load_average_1m_at_end": os.getloadavg()[0]},
            "data": {"reservations_of_alice": world["reservations"], "share_minutes": world["share_minutes"],
                     "minutes_of_measured_reservation": world["target_minutes"], "seed_s": round(seed_s, 1)},
            "results": results, "targets_ms": TARGET_MS, "asset_budget_bytes": ASSET_BUDGET,
        }
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "pages.json").write_text(json.dumps(report, indent=2) + "\n")
        lines = ["# Web pages: server time and bytes", "", f"Command: `{report['command']}`", "",
                 f"Data: {world['reservations']} reservations of alice over 30 days, {world['share_minutes']:,} "
                 f"per-minute share rollups ({world['target_minutes']:,} for the measured reservation). "
                 "Baseline (same run, same database): bob, one reservation, one day of rollups.", "",
                 "| page | p50 ms | p95 ms | target p95 | CPU p50 ms | baseline p95 | ratio | queries | HTML gzip "
                 "| CSS+JS gzip |",
                 "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for name in ("home", "request", "preview", "reservation"):
            loaded, base = results["loaded"][name], results["baseline"][name]
            assets = loaded.get("assets_gzip_bytes", results["loaded"]["request"]["assets_gzip_bytes"])
            lines.append(f"| {name} | {loaded['p50_ms']} | {loaded['p95_ms']} | < {TARGET_MS[name]} | "
                         f"{loaded['cpu_p50_ms']} | "
                         f"{base['p95_ms']} | {loaded['p95_ms'] / base['p95_ms']:.2f}× | {loaded['queries']} | "
                         f"{loaded['html_gzip_bytes'] / 1024:.1f} KB | {assets / 1024:.1f} KB (budget 150) |")
        lines += ["", "The preview is a fragment of the request page: its CSS + JS are the request page's.",
                  "Reservation page, first view (its closed usage buckets not cached yet): p50 "
                  f"{results['loaded']['reservation']['first_view_p50_ms']} ms loaded, "
                  f"{results['baseline']['reservation']['first_view_p50_ms']} ms baseline.",
                  f"Machine: {os.cpu_count()} CPUs shared with other work (load average {os.getloadavg()[0]:.1f} at "
                  f"the end of the run; this process at nice {os.nice(0)}), Python {platform.python_version()}; "
                  "server time is Django's whole request (middleware, session, queries, templates) in-process, "
                  "without the network. CPU p50 is this process's own CPU time per request (not PostgreSQL's, "
                  "not time spent waiting for a core): where the machine is busy, the part of the wall time "
                  "that is the page's own work."]
        (RESULTS / "pages.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    finally:
        if not args.keep:
            from django.db import connections

            connections.close_all()
            DB.drop()


if __name__ == "__main__":
    main()
