"""The Celery worker's CPU per write, in-process: what `placement.cycle`, `placement.bind_many` and
`placement.housekeeping` cost per submit and per cancel on the load benchmark's fleet (bench/load:
500 nodes × 8 A100s, 10 teams, 200 users, TESSERA_BACKEND=local, Redis for the lease and memo).

The load benchmark measures the worker from outside (cores, while the API runs); this one runs the
same task functions in this process, one write at a time, and takes `time.process_time` around the
tasks each write causes (the API's own work, `services.submit` and `services.cancel`, is outside
the measurement). Tasks are not sent to a broker: `apply_async` is replaced by a list that is then
run in order, as one worker with `-c 1` would, including the tasks those tasks send.

Steady state, like a load run some minutes in: each user holds one placed 0.1-GPU reservation, and
`--history` reservations were submitted, placed, bound, cancelled and their pods deleted before
(the rows a long run leaves behind). Then, `--ops` times: a user cancels (→ housekeeping and a
cycle) and submits again (→ a cycle that places it and a bind). Per write: worker CPU ms (mean and
median over the ops; the best of `--repeat` rounds) and the SQL statements and Redis commands.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/orchestration/worker_cpu.py --name after

It creates (and drops) the database `tessera_bench_worker_cpu_<name>` on that server and flushes
the Redis database of --redis (default 11; two runs side by side need two).
Results: bench/results/orchestration/worker_cpu-<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.load.run import TEAMS, write_inventory  # noqa: E402
from bench.scratch_db import ScratchDatabase  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "orchestration"


class Worker:
    """Tasks sent by the code under test, run here in the order they were sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, tuple, dict]] = []
        self.ran: Counter = Counter()

    def install(self) -> None:
        from celery.app.task import Task

        worker = self

        def apply_async(task, args=None, kwargs=None, **options):
            worker.sent.append((task.name, tuple(args or ()), dict(kwargs or {})))

        Task.apply_async = apply_async

    def drain(self) -> None:
        from celery import current_app

        from portal.telemetry.background_sends import sender

        while self.sent:
            name, args, kwargs = self.sent.pop(0)
            self.ran[name] += 1
            current_app.tasks[name](*args, **kwargs)
        sender.flush()  # the agents' pushes run on a thread of this process: count them here


class Counters:
    """SQL statements (through Django's connection) and Redis commands (the sync client) issued."""

    def __init__(self) -> None:
        self.sql = 0
        self.redis = 0
        self.shown: list[str] | None = None  # the statements, while a caller collects them

    def install(self) -> None:
        import redis
        from django.db import connection

        def count_sql(execute, sql, params, many, context):
            self.sql += 1
            if self.shown is not None:
                self.shown.append(sql if len(sql) < 300 else sql[:297] + "...")
            return execute(sql, params, many, context)

        connection.execute_wrappers.append(count_sql)
        plain = redis.Redis.execute_command

        def execute_command(client, *args, **options):
            self.redis += 1
            if self.shown is not None:
                self.shown.append("redis " + " ".join(map(str, args[:2])))
            return plain(client, *args, **options)

        redis.Redis.execute_command = execute_command


def _people(users: int) -> list:
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from portal.fleet import inventory as fleet_inventory
    from portal.tenancy.models import Membership, Role

    call_command("migrate", verbosity=0)
    inventory = Path(tempfile.mkdtemp(prefix="tessera-bench-worker-")) / "inventory.yaml"
    write_inventory(inventory, 500)
    fleet_inventory.load(inventory)
    from tests.teams import make_team  # the team with its `*` quota row, as the tests make it

    teams = [make_team(f"team{i}", f"Team {i}", quota_gpu_share=Decimal(1000), quota_memory_mib=10**9,
                       quota_max_gpus=10_000) for i in range(TEAMS)]
    User = get_user_model()
    people = []
    for i in range(users):
        user = User.objects.create_user(f"user{i:04d}")
        Membership.objects.create(user=user, team=teams[i % TEAMS], role=Role.MEMBER)
        people.append((user, teams[i % TEAMS]))
    return people


def _spec(team):
    from portal.reservations.rules import ReservationSpec

    # What bench/load's users submit.
    return ReservationSpec(team=team, image="pytorch/pytorch:2.3.0", command=["python", "train.py"],
                           gpu_request=Decimal("0.1"), gpu_memory_mib=2048, priority=10)


def run(users: int, history: int, ops: int, repeat: int, profile: str, show: bool) -> dict:
    from portal.reservations import services

    worker, counters = Worker(), Counters()
    worker.install()
    people = _people(users)
    counters.install()

    def submit_all(group: list) -> list[int]:
        ids = [services.submit(user, _spec(team)).pk for user, team in group]
        worker.drain()
        return ids

    def cancel_all(ids: list[int]) -> None:
        for rid in ids:
            services.cancel(rid, "system:bench", "cancelled by the benchmark")
        worker.drain()

    # The history, 200 at a time (a few cycles and binds each), then everyone holds one.
    made = 0
    while made < history:
        group = people[:min(users, history - made)]
        cancel_all(submit_all(group))
        made += len(group)
    live = dict(zip(range(users), submit_all(people), strict=True))

    if show:  # the statements of one cancel and one submit, before the measured rounds
        for op in ("cancel", "submit"):
            user, team = people[0]
            if op == "cancel":
                services.cancel(live[0], user, "cancelled by user")
            else:
                live[0] = services.submit(user, _spec(team)).pk
            counters.shown = []
            worker.drain()
            print(f"--- {op}: {len(counters.shown)} statements and commands")
            print("\n".join(counters.shown))
            counters.shown = None
    rounds = []
    profiler = cProfile.Profile(time.process_time) if profile else None
    for r in range(repeat):
        cpu: dict[str, list[float]] = {"submit": [], "cancel": []}
        sql: dict[str, list[int]] = {"submit": [], "cancel": []}
        redis_cmds: dict[str, list[int]] = {"submit": [], "cancel": []}
        worker.ran.clear()
        for i in range(ops):
            k = (r * ops + i) % users
            user, team = people[k]
            for op in ("cancel", "submit"):
                if op == "cancel":
                    services.cancel(live[k], user, "cancelled by user")
                else:
                    live[k] = services.submit(user, _spec(team)).pk
                s0, q0 = counters.sql, counters.redis
                if profiler is not None and op == profile:
                    profiler.enable()
                t0 = time.process_time()
                worker.drain()
                cpu[op].append((time.process_time() - t0) * 1000)
                if profiler is not None and op == profile:
                    profiler.disable()
                sql[op].append(counters.sql - s0)
                redis_cmds[op].append(counters.redis - q0)
        rounds.append({op: {"cpu_ms_mean": round(statistics.mean(cpu[op]), 2),
                            "cpu_ms_median": round(statistics.median(cpu[op]), 2),
                            "sql_per_op": round(statistics.mean(sql[op]), 2),
                            "redis_per_op": round(statistics.mean(redis_cmds[op]), 2)} for op in cpu}
                      | {"tasks": dict(worker.ran)})
    if profiler is not None:
        profiler.dump_stats(Path(tempfile.gettempdir()) / f"worker_cpu-{profile}.prof")
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(45)
    best = min(rounds, key=lambda x: x["submit"]["cpu_ms_mean"] + x["cancel"]["cpu_ms_mean"])
    return {"best": best, "rounds": rounds}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--history", type=int, default=4000, help="reservations submitted and cancelled before")
    parser.add_argument("--ops", type=int, default=100, help="cancel + submit pairs per round")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the best is reported")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/11", help="flushed at the start")
    parser.add_argument("--profile", choices=("", "submit", "cancel"), default="",
                        help="print cProfile's top functions of this operation's tasks")
    parser.add_argument("--show", action="store_true", help="print the SQL and Redis commands of one of each")
    parser.add_argument("--name", default="", help="results file name suffix (none: print only)")
    args = parser.parse_args()

    db = ScratchDatabase(f"tessera_bench_worker_cpu{'_' + args.name if args.name else ''}")
    db.recreate()
    state = Path(tempfile.mkdtemp(prefix="tessera-bench-worker-")) / "cluster.sqlite3"
    os.environ.update(DATABASE_URL=db.url, REDIS_URL=args.redis, TESSERA_BACKEND="local", DEBUG="0",
                      TESSERA_LOCAL_STATE=str(state), TESSERA_LOCAL_START_S="0.5", LOG_LEVEL="WARNING",
                      CELERY_TASK_ALWAYS_EAGER="0", TESSERA_TELEMETRY_TICKER="0",
                      DJANGO_SETTINGS_MODULE="portal.settings")
    import django
    import redis

    redis.Redis.from_url(args.redis).flushdb()
    django.setup()
    try:
        result = run(args.users, args.history, args.ops, args.repeat, args.profile, args.show)
    finally:
        from django.db import connections

        connections.close_all()
        db.drop()
    command = ("DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python "
               "bench/orchestration/worker_cpu.py " + " ".join(sys.argv[1:]))
    result |= {"command": command, "commit": _commit(), "python": platform.python_version(),
               "at": datetime.now(UTC).isoformat(timespec="seconds"), "load_average_1m": os.getloadavg()[0],
               "settings": {"users": args.users, "history": args.history, "ops": args.ops, "repeat": args.repeat}}
    print(json.dumps(result["best"], indent=1))
    if args.name:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"worker_cpu-{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
        b = result["best"]
        lines = [f"# Worker CPU per write, in-process ({args.name})", "",
                 f"`{command}` at {result['commit']}, {result['at']}, load average {result['load_average_1m']:.1f} "
                 "(shared 2-core machine: CPU time, not wall time).", "",
                 "| write | worker CPU ms (mean) | median | SQL statements | Redis commands |",
                 "| --- | ---: | ---: | ---: | ---: |"]
        for op in ("submit", "cancel"):
            lines.append(f"| {op} | {b[op]['cpu_ms_mean']} | {b[op]['cpu_ms_median']} | {b[op]['sql_per_op']} | "
                         f"{b[op]['redis_per_op']} |")
        lines += ["", f"Tasks run in the best round: {b['tasks']}.", ""]
        (RESULTS / f"worker_cpu-{args.name}.md").write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
