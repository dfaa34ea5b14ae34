"""CPU per agent message of the whole live process, end to end: `python -m portal.serve` (Daphne,
autobahn's framing, the consumer, the writer, the acks back) with one `agents.fleet --simulate`
process of N nodes, each sending one `samples` message a second (8 GPUs, 2 running shares) and
reading its acks. CPU is the live process's own (user + system, /proc), per stored message, over
`--seconds` of steady state (every stream connected and its replay drained); of it, the cyclic
garbage collector's share is counted in the process by gc_probe/sitecustomize.py (either tree).

The baseline is the tree at `--baseline` (a git ref, exported with `git archive` into a temporary
folder), run in the same session against the same database; `--current` names another ref, else
this working tree runs. Rounds go baseline, current, current, baseline, ... so that what else the
machine is doing falls on both alike. On a shared 2-core machine the same tree on both sides
(`--current HEAD --baseline HEAD`) differed by up to 7 %: compare over several rounds.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/telemetry/live_cpu.py --baseline HEAD~1 --nodes 500 --rounds 2

It creates (and drops) the database `--db` on that server and flushes `--redis`. Results:
bench/results/telemetry/live_cpu[_LABEL].{json,md}. `--profile-dir` records a py-spy profile (--gil, raw)
of the live process in each round.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
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
from bench.telemetry.run import cpu_seconds, free_port, setup_fleet, write_inventory  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "telemetry"


def _export(ref: str) -> Path:
    """The tree at `ref` in a temporary folder, with this checkout's virtual environment."""
    where = Path(tempfile.mkdtemp(prefix="tessera-live-cpu-"))
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def _streams_drained(nodes: int) -> bool:
    from django.db import connection

    # Every round's agents open new streams: those of earlier rounds stay behind, stale.
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM telemetry_agentstream "
                       "WHERE last_sample_at > now() - interval '2 seconds'")
        return cursor.fetchone()[0] >= nodes


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _stored_messages() -> int:
    # One row per GPU per message: the simulated nodes have 8 GPUs each.
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM telemetry_gpusample")
        return cursor.fetchone()[0] // 8


def _wait_port(port: int) -> None:
    for _ in range(300):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError("the live process did not start listening")


def _stop(*procs: subprocess.Popen | None) -> None:
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        if proc is not None:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _gc_totals(path: Path) -> tuple[float, list[int]]:
    """(CPU seconds, passes per generation) of the live process's collector so far (gc_probe/)."""
    totals = json.loads(path.read_text())
    return sum(totals["cpu_s"]), totals["passes"]


def _round(tree: Path, env: dict, files: dict, nodes: int, seconds: float, warmup: float,
           profile: Path | None) -> dict:
    port = free_port()
    gc_file = files["tmp"] / f"gc-{port}.json"
    env = {**env, "PYTHONPATH": str(ROOT / "bench" / "telemetry" / "gc_probe"), "TESSERA_GC_PROBE": str(gc_file)}
    live = subprocess.Popen([sys.executable, "-m", "portal.serve", "-b", "127.0.0.1", "-p", str(port),
                             "portal.asgi:application"], cwd=tree, env=env,
                            stdout=(files["tmp"] / "live.log").open("ab"), stderr=subprocess.STDOUT)
    fleet = spy = None
    try:
        _wait_port(port)
        fleet = subprocess.Popen([sys.executable, "-m", "agents.fleet", "--portal", f"http://127.0.0.1:{port}",
                                  "--simulate", str(files["inventory"]), "--tokens", str(files["tokens"]),
                                  "--interval", "1"], cwd=ROOT, env={**os.environ},
                                 stdout=(files["tmp"] / "fleet.log").open("ab"), stderr=subprocess.STDOUT)
        started = time.monotonic()
        checks = 0
        while time.monotonic() - started < warmup and checks < 2:
            time.sleep(2)
            checks = checks + 1 if _streams_drained(nodes) else 0
        if profile is not None:
            spy = subprocess.Popen([str(ROOT / ".venv" / "bin" / "py-spy"), "record", "--gil", "-r", "50", "-d",
                                    str(int(seconds)), "-f", "raw", "-o", str(profile), "-p", str(live.pid)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        messages0, cpu0, gc0, t0 = _stored_messages(), cpu_seconds(live.pid), _gc_totals(gc_file), time.monotonic()
        time.sleep(seconds)
        messages1, cpu1, gc1, t1 = _stored_messages(), cpu_seconds(live.pid), _gc_totals(gc_file), time.monotonic()
        if spy is not None:
            spy.wait(30)
        messages = messages1 - messages0
        return {"messages_per_s": round(messages / (t1 - t0), 1), "cpu_cores": round((cpu1 - cpu0) / (t1 - t0), 3),
                "cpu_ms_per_message": round(1000 * (cpu1 - cpu0) / max(1, messages), 4),
                "gc_ms_per_message": round(1000 * (gc1[0] - gc0[0]) / max(1, messages), 4),
                "gc_passes_per_s": [round((b - a) / (t1 - t0), 2) for a, b in zip(gc0[1], gc1[1], strict=True)],
                "rss_mib": _rss_mib(live.pid), "settle_s": round(t0 - started, 1),
                "load_average_1m": round(os.getloadavg()[0], 2),
                "profiled": profile is not None}
    finally:
        _stop(fleet, live)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="git ref of the baseline tree, e.g. HEAD~1")
    parser.add_argument("--current", help="git ref of the tree compared with it (default: this working tree)")
    parser.add_argument("--nodes", type=int, default=500, help="simulated agents (one message a second each)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each tree, alternating")
    parser.add_argument("--seconds", type=float, default=40.0, help="measured seconds per round")
    parser.add_argument("--warmup", type=float, default=90.0, help="at most this long to reach steady state")
    parser.add_argument("--db", default="tessera_bench_live_cpu", help="scratch database (created and dropped)")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/9", help="Redis database (flushed)")
    parser.add_argument("--profile-dir", type=Path, help="write a py-spy profile of each round here")
    parser.add_argument("--label", default="", help="names the run in the results")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    db = ScratchDatabase(args.db)
    db.recreate()
    os.environ["DATABASE_URL"] = db.url
    import django

    django.setup()
    tmp = Path(tempfile.mkdtemp(prefix="tessera-live-cpu-"))
    files = {"tmp": tmp, "inventory": tmp / "inventory.yaml", "tokens": tmp / "tokens.yaml"}
    write_inventory(files["inventory"], args.nodes)
    setup_fleet(files["inventory"], files["tokens"], 2)
    import redis

    env = {**os.environ, "DATABASE_URL": db.url, "REDIS_URL": args.redis, "TESSERA_TELEMETRY_TICKER": "0",
           "CELERY_TASK_ALWAYS_EAGER": "1", "LOG_LEVEL": "WARNING", "DJANGO_SETTINGS_MODULE": "portal.settings"}
    baseline_commit = subprocess.run(["git", "rev-parse", "--short", args.baseline], cwd=ROOT, check=True,
                                     capture_output=True, text=True).stdout.strip()
    current_commit = subprocess.run(["git", "rev-parse", "--short", args.current or "HEAD"], cwd=ROOT, check=True,
                                    capture_output=True, text=True).stdout.strip()
    dirty = not args.current and bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                                     cwd=ROOT, capture_output=True, text=True).stdout.strip())
    trees = {"baseline": _export(args.baseline), "current": _export(args.current) if args.current else ROOT}
    rounds = []
    try:
        for i in range(args.rounds):
            # baseline, current, current, baseline, ...: a drift in what else the machine does
            # (or in the database) falls on both trees alike.
            for name in ("baseline", "current") if i % 2 == 0 else ("current", "baseline"):
                redis.Redis.from_url(args.redis).flushdb()
                profile = args.profile_dir / f"{name}-{i}.txt" if args.profile_dir else None
                if profile:
                    args.profile_dir.mkdir(parents=True, exist_ok=True)
                print(f"--- round {i + 1}: {name}", file=sys.stderr, flush=True)
                result = {"tree": name, "round": i + 1,
                          **_round(trees[name], env, files, args.nodes, args.seconds, args.warmup, profile)}
                print(json.dumps(result), file=sys.stderr, flush=True)
                rounds.append(result)
    finally:
        redis.Redis.from_url(args.redis).flushdb()
        for tree in trees.values():
            if tree != ROOT:
                shutil.rmtree(tree, ignore_errors=True)
        from django.db import connection

        connection.close()
        db.drop()

    def best(name: str) -> float:
        return min(r["cpu_ms_per_message"] for r in rounds if r["tree"] == name)

    def mean(name: str, key: str = "cpu_ms_per_message") -> float:
        values = [r[key] for r in rounds if r["tree"] == name]
        return round(sum(values) / len(values), 4)

    ratio = round(best("current") / best("baseline"), 3)
    mean_ratio = round(mean("current") / mean("baseline"), 3)
    command = (f"DATABASE_URL={db.admin_url} .venv/bin/python bench/telemetry/live_cpu.py "
               + " ".join(sys.argv[1:]))
    report = {"command": command, "label": args.label, "baseline": f"{args.baseline} ({baseline_commit})",
              "current": f"{current_commit}{' + uncommitted changes' if dirty else ''}",
              "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
              "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "nodes": args.nodes, "rounds": rounds,
              "best_ms_per_message": {"baseline": best("baseline"), "current": best("current")},
              "current_vs_baseline": ratio,
              "mean_ms_per_message": {"baseline": mean("baseline"), "current": mean("current")},
              "current_vs_baseline_mean": mean_ratio,
              "mean_gc_ms_per_message": {"baseline": mean("baseline", "gc_ms_per_message"),
                                         "current": mean("current", "gc_ms_per_message")}}
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "live_cpu" + (f"_{args.label}" if args.label else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = ["# CPU per agent message of the live process, end to end", "",
             f"Command: `{command}`  ", f"Baseline: {report['baseline']}; current: {report['current']}  ",
             f"Machine: {report['machine']}  ", f"Date (UTC): {report['date_utc']}", "",
             f"`portal.serve` with {args.nodes} simulated agents at one `samples` message a second each; CPU of "
             "the live process (user + system) per stored message. Rounds alternate the two trees.", "",
             "| round | tree | messages/s | live CPU (cores) | CPU ms / message | of it, collector ms / message "
             "| collector passes/s (gen 0, 1, 2) | RSS MiB at end | settle s | load avg | profiled |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rounds:
        lines.append(f"| {r['round']} | {r['tree']} | {r['messages_per_s']} | {r['cpu_cores']} | "
                     f"{r['cpu_ms_per_message']} | {r['gc_ms_per_message']} | "
                     f"{', '.join(str(p) for p in r['gc_passes_per_s'])} | {r['rss_mib']} | {r['settle_s']} | "
                     f"{r['load_average_1m']} | {r['profiled']} |")
    lines += ["", f"Best CPU ms per message: baseline {best('baseline')}, current {best('current')}; "
              f"current / baseline = {ratio}. Mean: baseline {mean('baseline')}, current {mean('current')}; "
              f"current / baseline = {mean_ratio}. Of it, the cyclic collector (mean): baseline "
              f"{mean('baseline', 'gc_ms_per_message')}, current {mean('current', 'gc_ms_per_message')} ms.", ""]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
