"""Load benchmark: concurrent API users (submit, list, capacity preview, cancel) against the portal
as deploy/ runs it (HTTP on Gunicorn with portal/web_server.py's settings, the agents' WebSockets on
Daphne, `portal.serve`; PostgreSQL through each process's connection pool, Redis), one Celery worker
placing what they submit, with and without N simulated node agents streaming at 1 Hz.
`--http daphne` measures the earlier layout instead: the users and the agents on the same Daphne
processes (portal.serve --processes N).

A user acts like a person at the API or the pages: one request, then a pause of `--think` seconds
on average (uniform between half and one and a half times it) while reading the answer, then the
next: submit, list, capacity preview, cancel, and again. So 200 users at 5 s offer about 40
requests per second, whatever the server's speed (an open loop would measure a queue instead).
The load generator is this one asyncio process (aiohttp; httpx took about 10 ms of CPU per request
here); the CPU each part of the run used (generator, portal, worker, agents, PostgreSQL, the whole
machine) is in the results.

Two phases in one run, same users and same mix: `api` (the users alone: the baseline) and
`api+agents` (the users while the agents stream). For each phase and operation: requests per
second, p50/p99 latency, and errors (5xx, 429, connection failures). After the run it checks
what the issue asks of a bad day too: no GPU over-committed, every reservation the users were
told was created exists once.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/load/run.py --users 200 --agents 500 --seconds 600

It creates (and drops) the database `tessera_bench_load` on that server and uses Redis database 12.
Results: bench/results/load/results.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.scratch_db import ScratchDatabase  # noqa: E402

DB = ScratchDatabase("tessera_bench_load")
REDIS_URL = "redis://127.0.0.1:6379/12"
RESULTS = ROOT / "bench" / "results" / "load"
TEAMS = 10
OPERATIONS = ("submit", "list", "capacity", "cancel")
TARGET_MS = {"submit": 1000, "cancel": 1000, "list": 500, "capacity": 500}  # the issue's p99 targets


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_inventory(path: Path, nodes: int) -> None:
    lines = ["version: 1", "nodes:"]
    for i in range(nodes):
        lines += [f"  - name: load-node-{i:04d}", "    gpus:", "      - model: A100-80GB", "        memory_mib: 81920",
                  "        count: 8"]
    path.write_text("\n".join(lines) + "\n")


def _setup(inventory: Path, tokens_file: Path, users: int) -> list[tuple[str, str]]:
    """Fleet, TEAMS teams, `users` members spread over them, an API token each (made here, not
    through the sign-in endpoint, whose failure throttle is not what is measured); node tokens."""
    from decimal import Decimal

    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from portal.fleet import inventory as fleet_inventory
    from portal.fleet.models import Node
    from portal.fleet.services import issue_node_token
    from portal.tenancy.models import Membership, Role
    from portal.tenancy.services import create_token
    from tests.teams import make_team  # the team with its `*` quota row

    call_command("migrate", verbosity=0)
    fleet_inventory.load(inventory)
    teams = [make_team(slug=f"team{i}", name=f"Team {i}", quota_gpu_share=Decimal(1000),
                                 quota_memory_mib=10**9, quota_max_gpus=10_000) for i in range(TEAMS)]
    people = []
    User = get_user_model()
    for i in range(users):
        user = User.objects.create_user(f"user{i:04d}")
        team = teams[i % TEAMS]
        Membership.objects.create(user=user, team=team, role=Role.MEMBER)
        _, key = create_token(user, "load")
        people.append((team.slug, key))
    tokens_file.write_text("\n".join(f"{n.name}: {issue_node_token(n)}" for n in Node.objects.all()) + "\n")
    return people


def _invariants() -> dict:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM (SELECT gpu_id FROM reservations_allocation WHERE released_at IS NULL "
                       "GROUP BY gpu_id HAVING sum(gpu_request) > 1.0001) over")
        over = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM (SELECT reservation_id, gpu_id FROM reservations_allocation "
                       "WHERE released_at IS NULL GROUP BY reservation_id, gpu_id HAVING count(*) > 1) dup")
        duplicated = cursor.fetchone()[0]
        cursor.execute("SELECT id FROM reservations_reservation")
        ids = {row[0] for row in cursor.fetchall()}
    return {"gpus_over_committed": over, "duplicated_allocations": duplicated, "reservation_ids": ids}


class Recorder:
    def __init__(self) -> None:
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.status: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.created: set[int] = set()
        self.on = False

    def add(self, op: str, seconds: float, status: str) -> None:
        if self.on:
            self.latency[op].append(seconds * 1000)
            self.status[op][status] += 1


async def _user(client, team: str, key: str, rec: Recorder, stop: asyncio.Event, think_s: float) -> None:
    headers = {"Authorization": f"Token {key}"}
    body = {"team": team, "image": "pytorch/pytorch:2.3.0", "command": ["python", "train.py"],
            "gpu_request": 0.1, "gpu_memory_mib": 2048, "priority": 10}
    await asyncio.sleep(random.uniform(0, think_s))

    async def call(op: str, method: str, url: str, **kwargs) -> tuple[int, bytes] | None:
        started = time.perf_counter()
        try:
            async with client.request(method, url, headers=headers, **kwargs) as r:
                answer = (r.status, await r.read())
        except Exception as exc:  # a refused or dropped connection is an error the users saw
            rec.add(op, time.perf_counter() - started, type(exc).__name__)
            return None
        rec.add(op, time.perf_counter() - started, str(answer[0]))
        return answer

    async def think() -> None:
        await asyncio.sleep(random.uniform(0.5, 1.5) * think_s)

    while not stop.is_set():
        r = await call("submit", "POST", "/api/v1/reservations/", json=body)
        rid = json.loads(r[1])["id"] if r is not None and r[0] == 201 else None
        if rid is not None:
            rec.created.add(rid)
        await think()
        await call("list", "GET", "/api/v1/reservations/", params={"page_size": "20"})
        await think()
        await call("capacity", "GET", "/api/v1/capacity/", params={"gpu_request": "0.25", "gpu_memory_mib": "4096"})
        await think()
        if rid is not None:
            await call("cancel", "POST", f"/api/v1/reservations/{rid}/cancel/")
            await think()


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of these processes and their children that are alive (from /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in _with_descendants(pids):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _with_descendants(pids: list[int]) -> set[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children[ppid].append(int(entry.name))
    out, todo = set(), list(pids)
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo += children.get(pid, [])
    return out


def _postgres_pids() -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid != 0 and (entry / "comm").read_text().strip() in ("postgres", "postmaster"):
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def _loop_seconds() -> float:
    """Seconds for a 10M-iteration empty Python loop, best of 3: how fast this machine runs Python.
    The machines these runs are taken on differ from session to session (earlier results quote one
    untimed pass: 0.73 s and 1.42 s), so a result is read with this beside it."""
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(10_000_000):
            pass
        best = min(best, time.perf_counter() - t)
    return round(best, 2)


def _machine_busy_s() -> tuple[float, float]:
    """(busy CPU seconds of the whole machine, its elapsed CPU seconds) from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = values[3] + values[4]
    return (sum(values) - idle) / tick, sum(values) / tick


class CpuMeter:
    """CPU used by each part of the run over a phase, in cores (1.0 = one core all the time)."""

    def __init__(self, parts: dict[str, list[int]]) -> None:
        self.parts = parts

    def start(self) -> None:
        # PostgreSQL's backends come and go with connections: count whatever runs as its server user now.
        self.parts["postgres (all databases)"] = _postgres_pids()
        self.t0 = time.monotonic()
        self.own0 = time.process_time()
        self.parts0 = {name: _cpu_seconds(pids) for name, pids in self.parts.items()}
        self.machine0 = _machine_busy_s()

    def stop(self) -> dict:
        elapsed = time.monotonic() - self.t0
        out = {"load generator": (time.process_time() - self.own0) / elapsed}
        for name, pids in self.parts.items():
            # Processes that ended meanwhile are not counted (their CPU is lost to /proc): a lower bound.
            out[name] = max(0.0, _cpu_seconds(pids) - self.parts0[name]) / elapsed
        busy, total = _machine_busy_s()
        out["machine (all engineers)"] = (busy - self.machine0[0]) / (total - self.machine0[1]) * (os.cpu_count() or 1)
        return {k: round(v, 2) for k, v in out.items()}


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def _summary(rec: Recorder, seconds: float) -> dict:
    out = {}
    for op in OPERATIONS:
        statuses = dict(rec.status[op])
        total = sum(statuses.values())
        out[op] = {
            "requests": total, "per_s": round(total / seconds, 1),
            "p50_ms": _percentile(rec.latency[op], 0.5), "p99_ms": _percentile(rec.latency[op], 0.99),
            "5xx": sum(n for s, n in statuses.items() if s.startswith("5")),
            "429": statuses.get("429", 0),
            "failed_connections": sum(n for s, n in statuses.items() if not s.isdigit()),
            "statuses": statuses,
        }
    out["all"] = {"requests": sum(o["requests"] for o in out.values()),
                  "per_s": round(sum(o["per_s"] for o in out.values()), 1),
                  "5xx": sum(o["5xx"] for o in out.values())}
    return out


async def _phase(port: int, people: list[tuple[str, str]], seconds: float, warmup: float, think_s: float,
                 rec: Recorder, cpu: CpuMeter) -> dict:
    import aiohttp

    stop = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=len(people) + 10)
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}", connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=30)) as client:
        tasks = [asyncio.create_task(_user(client, team, key, rec, stop, think_s)) for team, key in people]
        await asyncio.sleep(warmup)
        rec.on = True
        cpu.start()
        load0, t0 = os.getloadavg()[0], time.monotonic()
        await asyncio.sleep(seconds)
        rec.on = False
        cores = cpu.stop()
        elapsed = time.monotonic() - t0
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    result = _summary(rec, elapsed)
    result["measured_s"] = round(elapsed, 1)
    result["load_average_1m"] = round((load0 + os.getloadavg()[0]) / 2, 2)
    result["cpu_cores"] = cores
    return result


def _start(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _stop(*procs: subprocess.Popen | None) -> None:
    for proc in procs:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        if proc is not None:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def run(users: int, agents: int, seconds: float, warmup: float, think_s: float, pool: int, processes: int,
        threads: int, http: str, live_processes: int, agents_nice: int = 0) -> dict:
    import django


    DB.recreate()
    os.environ["DATABASE_URL"] = DB.url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    django.setup()
    tmp = Path(tempfile.mkdtemp(prefix="tessera-bench-load-"))
    inventory, tokens = tmp / "inventory.yaml", tmp / "tokens.yaml"
    write_inventory(inventory, max(agents, 50))
    people = _setup(inventory, tokens, users)
    from django.db import connection

    connection.close()
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": DB.url, "REDIS_URL": REDIS_URL, "DEBUG": "0", "LOG_LEVEL": "WARNING",
           "DB_POOL_MAX_SIZE": str(pool), "TESSERA_WRITE_RATE": "100000/min", "TESSERA_TELEMETRY_TICKER": "0",
           "TESSERA_BACKEND": "local", "TESSERA_LOCAL_STATE": str(tmp / "cluster.sqlite3"),
           "TESSERA_LOCAL_START_S": "0.5", "TESSERA_INVENTORY": str(inventory), "PYTHONPATH": str(ROOT),
           "DJANGO_SETTINGS_MODULE": "portal.settings"}
    env.update(TESSERA_WEB_PROCESSES=str(processes), TESSERA_WEB_THREADS=str(threads))
    portal = worker = fleet = live = None
    phases = {}
    try:
        if http == "gunicorn":
            portal = _start([sys.executable, "-m", "gunicorn", "-c", "python:portal.web_server", "-b",
                             f"127.0.0.1:{port}"], env, tmp / "portal.log")
        else:
            portal = _start([sys.executable, "-m", "portal.serve", "--processes", str(processes), "-b", "127.0.0.1",
                             "-p", str(port), "portal.asgi:application"], env, tmp / "portal.log")
        worker = _start([sys.executable, "-m", "celery", "-A", "portal", "worker", "-c", "1", "-n", "load@%h",
                         "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "WARNING"],
                        env, tmp / "worker.log")
        for _ in range(300):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        live_port = port
        if http == "gunicorn":  # the WebSockets' processes, as deploy/'s Ingress routes /ws/ there
            live_port = _free_port()
            live = _start([sys.executable, "-m", "portal.serve", "--processes", str(live_processes), "-b", "127.0.0.1",
                           "-p", str(live_port), "portal.asgi:application"], env, tmp / "live.log")
        rec = Recorder()
        parts = {"portal": [portal.pid], "worker": [worker.pid]}
        phases["api"] = asyncio.run(_phase(port, people, seconds, warmup, think_s, rec, CpuMeter(parts)))
        if agents:
            # The simulated agents stand for 500 other machines; --agents-nice lets the system
            # under test have first claim on this one's cores, as it would on its own.
            niced = ["nice", "-n", str(agents_nice)] if agents_nice else []
            fleet = _start([*niced, sys.executable, "-m", "agents.fleet", "--portal", f"http://127.0.0.1:{live_port}",
                            "--simulate", str(inventory), "--tokens", str(tokens), "--interval", "1"],
                           env, tmp / "fleet.log")
            time.sleep(warmup)  # the agents connect and send their first batches
            rec2 = Recorder()
            rec2.created = rec.created
            parts["agents"] = [fleet.pid]
            if live is not None:
                parts["live (WebSockets)"] = [live.pid]
            phases["api+agents"] = asyncio.run(_phase(port, people, seconds, warmup, think_s, rec2, CpuMeter(parts)))
            stored = _stored_samples_per_s(seconds=10)
            phases["api+agents"]["agent_samples_stored_per_s"] = stored
        time.sleep(3)  # the last cancels settle
        checks = _invariants()
        created = rec.created
        lost = sorted(created - checks.pop("reservation_ids"))
        checks.update({"reservations_created": len(created), "created_but_missing": len(lost)})
    finally:
        _stop(fleet, worker, live, portal)
    return {"phases": phases, "checks": checks, "logs": str(tmp)}


def _stored_samples_per_s(seconds: float) -> float:
    from django.db import connection

    def count() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM telemetry_gpusample")
            return cursor.fetchone()[0]

    a, t = count(), time.monotonic()
    time.sleep(seconds)
    return round((count() - a) / (time.monotonic() - t), 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--agents", type=int, default=500, help="simulated nodes × 8 GPUs at 1 Hz (0: none)")
    parser.add_argument("--seconds", type=float, default=600, help="measured time per phase")
    parser.add_argument("--warmup", type=float, default=20)
    parser.add_argument("--think", type=float, default=5.0,
                        help="mean pause of a user after each request, s (a person reading the answer)")
    parser.add_argument("--http", choices=("gunicorn", "daphne"), default="gunicorn",
                        help="gunicorn: HTTP on Gunicorn, WebSockets on Daphne (deploy/); daphne: both on Daphne")
    parser.add_argument("--processes", type=int, default=2, help="HTTP processes (TESSERA_WEB_PROCESSES)")
    parser.add_argument("--threads", type=int, default=4, help="threads per HTTP process (TESSERA_WEB_THREADS)")
    parser.add_argument("--live-processes", type=int, default=1, help="Daphne processes for the WebSockets")
    parser.add_argument("--pool", type=int, default=20, help="DB_POOL_MAX_SIZE of the portal process")
    parser.add_argument("--agents-nice", type=int, default=0, choices=range(20), metavar="0-19",
                        help="run the simulated agents at this nice level (they stand for other machines)")
    parser.add_argument("--note", default="", help="a line for the results (e.g. why the run is short)")
    parser.add_argument("--name", default="results", help="results file name in bench/results/load/")
    args = parser.parse_args()
    try:
        result = run(args.users, args.agents, args.seconds, args.warmup, args.think, args.pool, args.processes,
                     args.threads, args.http, args.live_processes, args.agents_nice)
    finally:
        DB.drop()
    command = "DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/load/run.py " + \
        " ".join(sys.argv[1:])
    machine = (f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}; a 10M-iteration Python loop "
               f"in {_loop_seconds()} s")
    result.update({"command": command, "machine": machine,
                   "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"), "users": args.users, "agents": args.agents,
                   "think_s": args.think, "http": args.http, "processes": args.processes, "threads": args.threads,
                   "live_processes": args.live_processes, "agents_nice": args.agents_nice,
                   "pool": args.pool, "note": args.note})
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / f"{args.name}.md").write_text(_markdown(result))
    print(_markdown(result))
    return 0


def _layout(result: dict) -> str:
    pool = f"each with a pool of {result['pool']} connections to PostgreSQL"
    if result.get("http") == "gunicorn":
        return (f"HTTP on Gunicorn: {result['processes']} processes × {result['threads']} threads ({pool}); the "
                f"agents' WebSockets on {result['live_processes']} Daphne process(es) of their own, as deploy/ "
                "runs it.")
    return f"Users and agents on {result['processes']} Daphne processes (`portal.serve --processes`, {pool})."


def _markdown(result: dict) -> str:
    lines = ["# API load with agents streaming", "", f"Command: `{result['command']}`  ",
             f"Machine: {result['machine']}  ", f"Date (UTC): {result['date']}  "]
    if result["note"]:
        lines.append(f"Note: {result['note']}  ")
    lines += ["", f"{result['users']} API users, each in a loop: submit, list (page of 20), capacity preview, cancel, "
              f"with a pause after every request of {result['think_s']} s on average (a person reading the answer). "
              + _layout(result) + f" One Celery worker placing, Redis. Phase `api+agents` adds {result['agents']} "
              "simulated nodes × 8 GPUs streaming at 1 Hz"
              + (f" (at nice {result['agents_nice']}: they stand for other machines)"
                 if result.get("agents_nice") else "")
              + ". Ratios: against the `api` phase of the same run. "
              "Target (issue #16): zero 5xx, p99 < 500 ms for reads, < 1 s for submits.", "",
              "| phase | operation | requests | req/s | p50 ms | p99 ms | p99 target ms | 5xx | 429 | failed conn. "
              "| p99 vs api |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    base = result["phases"].get("api", {})
    notes = []
    for phase, data in result["phases"].items():
        for op in OPERATIONS:
            d = data[op]
            ratio = ""
            if base.get(op, {}).get("p99_ms") and d["p99_ms"]:
                ratio = round(d["p99_ms"] / base[op]["p99_ms"], 2)
            lines.append(f"| {phase} | {op} | {d['requests']} | {d['per_s']} | {d['p50_ms']} | {d['p99_ms']} | "
                         f"{TARGET_MS[op]} | {d['5xx']} | {d['429']} | {d['failed_connections']} | {ratio} |")
        extra = f", agent samples stored/s {data['agent_samples_stored_per_s']}" \
            if "agent_samples_stored_per_s" in data else ""
        lines.append(f"| {phase} | all | {data['all']['requests']} | {data['all']['per_s']} | | | | "
                     f"{data['all']['5xx']} | | | |")
        notes.append(f"`{phase}`: measured {data['measured_s']} s, load average {data['load_average_1m']}{extra}. "
                     "CPU in cores: " + ", ".join(f"{k} {v}" for k, v in data.get("cpu_cores", {}).items()) + ".")
    lines += ["", *notes, ""]
    c = result["checks"]
    lines += ["After the run: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in c.items()) + ".", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
