"""Telemetry benchmark: N simulated nodes × 8 GPUs at 1 Hz against ONE portal process (Daphne,
channels-redis, PostgreSQL), with a browser watching live groups.

Measures, per fleet size: GPU samples stored per second (offered: N × 8), agent→browser latency
p50/p99 (the sample's ts_ms, taken by the agent, to its arrival at the browser on ws/live/ — one
machine, one clock), and the CPU the portal process and the agent fleet use. The first size is the
baseline each later size is compared with (ratios in the same run).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/telemetry/run.py --nodes 50,200,500 --seconds 40

It creates (and drops) its own database `tessera_bench_telemetry` on that server and uses Redis
database 9. Results: bench/results/telemetry/results.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.scratch_db import ScratchDatabase  # noqa: E402

DB = ScratchDatabase("tessera_bench_telemetry")
REDIS_URL = "redis://127.0.0.1:6379/9"
RESULTS = ROOT / "bench" / "results" / "telemetry"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def write_inventory(path: Path, nodes: int) -> list[str]:
    names = [f"bench-node-{i:04d}" for i in range(nodes)]
    lines = ["version: 1", "nodes:"]
    for name in names:
        lines += [f"  - name: {name}", "    gpus:", "      - model: A100-80GB", "        memory_mib: 81920",
                  "        count: 8"]
    path.write_text("\n".join(lines) + "\n")
    return names


def setup_fleet(inventory: Path, tokens: Path, shares_per_node: int) -> dict:
    """Fleet, one team and user, `shares_per_node` running reservations per node (so the agents
    report shares and the team group has traffic); node tokens into the tokens file."""
    from decimal import Decimal

    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from bench.telemetry.running_shares import hold_shares
    from portal.fleet import inventory as fleet_inventory
    from portal.fleet.models import Gpu, Node
    from portal.fleet.services import issue_node_token
    from portal.tenancy.models import Membership, Role
    from tests.teams import make_team  # the team with its `*` quota row

    call_command("migrate", verbosity=0)
    fleet_inventory.load(inventory)
    team = make_team(slug="bench", name="Bench", quota_gpu_share=Decimal(10_000),
                               quota_memory_mib=10**9, quota_max_gpus=10_000)
    # Staff: GPU groups (a card's whole load) are for site admins; the team group for members.
    user = get_user_model().objects.create_user("watcher", password="x", is_staff=True)
    Membership.objects.create(user=user, team=team, role=Role.MEMBER)
    token_lines = []
    for node in Node.objects.all():
        token_lines.append(f"{node.name}: {issue_node_token(node)}")
        hold_shares(user, team, node, shares_per_node)
    tokens.write_text("\n".join(token_lines) + "\n")
    from django.conf import settings
    from django.contrib.sessions.backends.db import SessionStore

    session = SessionStore()
    session["_auth_user_id"] = str(user.pk)
    session["_auth_user_backend"] = settings.AUTHENTICATION_BACKENDS[0]
    session["_auth_user_hash"] = user.get_session_auth_hash()
    session.create()
    gpus = list(Gpu.objects.order_by("node__name", "index").values_list("pk", flat=True))
    return {"session": session.session_key, "team": team.pk, "gpus": gpus}


async def _browser(url: str, session: str, groups: list[str], stop: asyncio.Event, latencies: list[float],
                   gaps: list[int]) -> None:
    from websockets.asyncio.client import connect

    headers = {"Cookie": f"sessionid={session}", "Origin": url.replace("ws://", "http://")}
    async with connect(f"{url}/ws/live/", additional_headers=headers, max_size=None) as ws:
        await ws.send(json.dumps({"subscribe": groups}))
        last: dict[str, int] = {}
        while not stop.is_set():
            try:
                raw = await asyncio.wait_for(ws.recv(), 0.5)
            except TimeoutError:
                continue
            now_ms = time.time() * 1000
            message = json.loads(raw)
            if "seq" not in message:
                continue
            group = message["group"]
            if group in last and message["seq"] != last[group] + 1:
                gaps.append(message["seq"] - last[group] - 1)
            last[group] = message["seq"]
            if message["type"] == "gpu":
                latencies.append(now_ms - message["data"]["ts_ms"])


def _stored_rows() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM telemetry_gpusample")
        return cursor.fetchone()[0]


def _lag() -> tuple[int, float | None, float | None]:
    """(streams that stored anything, 90th percentile and maximum of now - newest stored
    sample over the streams, s)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*), percentile_cont(0.9) WITHIN GROUP (ORDER BY "
                       "extract(epoch FROM now() - last_sample_at)), "
                       "max(extract(epoch FROM now() - last_sample_at)) FROM telemetry_agentstream "
                       "WHERE last_sample_at IS NOT NULL")
        count, lag, worst = cursor.fetchone()
        return count, (None if lag is None else float(lag)), (None if worst is None else float(worst))


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _measure(nodes: int, seconds: float, warmup: float, shares: int, watch_gpus: int) -> dict:
    import django
    from django.apps import apps
    from django.db import connection

    if apps.ready:
        connection.close()
    DB.recreate()
    os.environ["DATABASE_URL"] = DB.url
    if not apps.ready:
        django.setup()
    tmp = Path(tempfile.mkdtemp(prefix="tessera-bench-"))
    inventory, tokens = tmp / "inventory.yaml", tmp / "tokens.yaml"
    write_inventory(inventory, nodes)
    setup = setup_fleet(inventory, tokens, shares)
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()
    port = free_port()
    env = {**os.environ, "DATABASE_URL": DB.url, "REDIS_URL": REDIS_URL, "TESSERA_TELEMETRY_TICKER": "0",
           "CELERY_TASK_ALWAYS_EAGER": "1", "LOG_LEVEL": "WARNING", "DJANGO_SETTINGS_MODULE": "portal.settings"}
    portal = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                               "portal.asgi:application"], cwd=ROOT, env=env,
                              stdout=(tmp / "daphne.log").open("wb"), stderr=subprocess.STDOUT)
    fleet = None
    try:
        for _ in range(300):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        fleet = subprocess.Popen([sys.executable, "-m", "agents.fleet", "--portal", f"http://127.0.0.1:{port}",
                                  "--simulate", str(inventory), "--tokens", str(tokens), "--interval", "1"],
                                 cwd=ROOT, env={**os.environ}, stdout=(tmp / "fleet.log").open("wb"),
                                 stderr=subprocess.STDOUT)
        stride = max(1, len(setup["gpus"]) // watch_gpus)
        groups = [f"gpu:{g}" for g in setup["gpus"][::stride][:watch_gpus]] + [f"team:{setup['team']}"]
        result = asyncio.run(_drive(port, setup["session"], groups, portal.pid, fleet.pid, seconds, warmup,
                                    nodes))
        result.update({"nodes": nodes, "gpus": nodes * 8, "offered_samples_per_s": nodes * 8.0,
                       "watched_groups": len(groups), "logs": str(tmp)})
        return result
    finally:
        for proc in (fleet, portal):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (fleet, portal):
            if proc is not None:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


async def _drive(port: int, session: str, groups: list[str], portal_pid: int, fleet_pid: int, seconds: float,
                 warmup: float, nodes: int) -> dict:
    latencies: list[float] = []
    gaps: list[int] = []
    stop = asyncio.Event()
    browser = asyncio.create_task(_browser(f"ws://127.0.0.1:{port}", session, groups, stop, latencies, gaps))
    # Steady state first: every agent connected and its replay drained (after a start every
    # agent has a backlog, like after a portal restart); how long that took is reported too.
    # Every stream, not 90 % of them, and at two checks in a row: the browser watches GPUs of
    # some nodes, and one still replaying its backlog (newest stored sample more than an interval
    # plus a second old) would put catch-up seconds into the steady-state percentiles.
    started = time.monotonic()
    await asyncio.sleep(min(warmup, 10))
    drained_checks = 0
    while time.monotonic() - started < warmup:
        count, _, worst = await asyncio.to_thread(_lag)
        drained_checks = drained_checks + 1 if count >= nodes and worst is not None and worst < 2.0 else 0
        if drained_checks == 2:
            break
        await asyncio.sleep(2)
    settle_s = time.monotonic() - started
    latencies.clear()
    gaps.clear()
    rows0, t0 = await asyncio.to_thread(_stored_rows), time.monotonic()
    cpu0 = (cpu_seconds(portal_pid), cpu_seconds(fleet_pid))
    await asyncio.sleep(seconds)
    rows1, t1 = await asyncio.to_thread(_stored_rows), time.monotonic()
    _, lag_end, _ = await asyncio.to_thread(_lag)
    cpu1 = (cpu_seconds(portal_pid), cpu_seconds(fleet_pid))
    stop.set()
    await asyncio.wait_for(browser, 5)
    elapsed = t1 - t0
    return {
        "stored_samples_per_s": round((rows1 - rows0) / elapsed, 1),
        "latency_ms_p50": _round(_percentile(latencies, 0.50)),
        "latency_ms_p99": _round(_percentile(latencies, 0.99)),
        "latency_samples": len(latencies),
        "live_messages_missed": sum(gaps),
        "portal_cpu_cores": round((cpu1[0] - cpu0[0]) / elapsed, 2),
        "fleet_cpu_cores": round((cpu1[1] - cpu0[1]) / elapsed, 2),
        "measured_s": round(elapsed, 1),
        "settle_s": round(settle_s, 1),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "lag_p90_s_at_end": _round(lag_end),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _maintenance_cost() -> dict:
    """One rollup round over what the last (largest) run stored."""
    from datetime import timedelta

    from django.utils import timezone

    from portal.telemetry.rollups import roll_up

    started = time.monotonic()
    rows = roll_up(timezone.now() + timedelta(minutes=2))
    return {"rollup_rows": rows, "rollup_s": round(time.monotonic() - started, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="50,200,500", help="fleet sizes, comma-separated; the first is the baseline")
    parser.add_argument("--seconds", type=float, default=40.0, help="measured seconds per size")
    parser.add_argument("--warmup", type=float, default=120.0,
                        help="at most this many seconds to reach steady state (all connected, replays drained)")
    parser.add_argument("--shares", type=int, default=2, help="running shares per node (reported by the agents)")
    parser.add_argument("--watch-gpus", type=int, default=16, help="GPU groups the browser watches")
    parser.add_argument("--keep-db", action="store_true", help="leave the benchmark database behind")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    sizes = [int(n) for n in args.nodes.split(",")]
    runs = []
    for n in sizes:
        print(f"--- {n} nodes x 8 GPUs at 1 Hz ...", file=sys.stderr, flush=True)
        result = _measure(n, args.seconds, args.warmup, args.shares, args.watch_gpus)
        print(json.dumps(result), file=sys.stderr, flush=True)
        runs.append(result)
    maintenance = _maintenance_cost()
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()  # leave the bench's Redis database empty
    if not args.keep_db:
        from django.db import connection

        connection.close()
        DB.drop()
    base = runs[0]
    for r in runs:
        r["stored_ratio_to_offered"] = round(r["stored_samples_per_s"] / r["offered_samples_per_s"], 3)
        # CPU per sample does not depend on how much of the machine others take: the honest
        # figure for "how many cores would 4,000 samples/s need".
        r["portal_cpu_ms_per_1000_samples"] = round(1000 * r["portal_cpu_cores"] / max(1.0, r["stored_samples_per_s"])
                                                    * 1000, 1)
        r["portal_cores_for_4000_per_s"] = round(r["portal_cpu_ms_per_1000_samples"] * 4 / 1000, 2)
        r["throughput_vs_baseline"] = round(r["stored_samples_per_s"] / base["stored_samples_per_s"], 2)
        if r["latency_ms_p99"] and base["latency_ms_p99"]:
            r["p99_vs_baseline"] = round(r["latency_ms_p99"] / base["latency_ms_p99"], 2)
    niceness = os.nice(0)
    command = (f"DATABASE_URL={DB.admin_url} " + (f"nice -n {niceness} " if niceness else "")
               + ".venv/bin/python bench/telemetry/run.py " + " ".join(sys.argv[1:]))
    report = {"command": command, "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
              "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "runs": runs,
              "rollup_after_last_run": maintenance}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# Telemetry ingest and live fan-out", "",
        f"Command: `{command}`  ", f"Machine: {report['machine']}  ", f"Date (UTC): {report['date_utc']}", "",
        "One Daphne process (portal), channels-redis, PostgreSQL, one `agents.fleet` process with N simulated "
        "nodes × 8 GPUs at 1 Hz, one browser on ws/live/ watching GPU groups and the team group. "
        "Latency: the agent's sample timestamp to its arrival at the browser. Every process of the run "
        "(portal, agents, browser) shares the machine with whatever else runs there: the load average "
        "column says how busy it was, and `portal CPU (cores)` how much the portal got. "
        "`settle s`: time until every agent was connected and its post-start replay drained "
        "(capped by --warmup; a run that hit the cap was measured while still catching up).", "",
        "| nodes | offered samples/s | stored samples/s | stored/offered | p50 ms | p99 ms | live msgs missed "
        "| portal CPU (cores) | portal CPU ms / 1000 samples | fleet CPU (cores) | settle s | load avg "
        "| throughput vs baseline | p99 vs baseline |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        lines.append(f"| {r['nodes']} | {r['offered_samples_per_s']:.0f} | {r['stored_samples_per_s']:.0f} | "
                     f"{r['stored_ratio_to_offered']} | {r['latency_ms_p50']} | {r['latency_ms_p99']} | "
                     f"{r['live_messages_missed']} | {r['portal_cpu_cores']} | "
                     f"{r['portal_cpu_ms_per_1000_samples']} | {r['fleet_cpu_cores']} | {r['settle_s']} | "
                     f"{r['load_average_1m']} | "
                     f"{r['throughput_vs_baseline']} | {r.get('p99_vs_baseline', '-')} |")
    lines += ["", f"Rollup of everything stored in the last run: {maintenance['rollup_rows']} minute rows in "
              f"{maintenance['rollup_s']} s.", ""]
    (RESULTS / "results.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
