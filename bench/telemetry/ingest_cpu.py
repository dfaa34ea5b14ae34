"""CPU per agent message of the live process's own part, in process: parsing a `samples` message
(wire.agent_portal.parse), the consumer's work on it before and after the commit (clock check,
hand-over to the writer, the ack's text), and the writer's group commits (portal.telemetry.writer
.store) against a real PostgreSQL. Daphne's frame handling and the event loop are not in it.

Messages are what live agents send at 1 Hz: one sample of 8 simulated GPUs with `--shares`
running shares per node, built by the agents' own Sampler over the simulated source
(agents/gpus/simulated.py, agents/sampling.py). Commits take `--per-commit` messages (500
messages/s in a 50 ms group-commit window: 25). CPU is time.process_time of this process (the
database server's CPU is not counted), best of `--repeat` rounds, each on fresh sequence numbers.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/telemetry/ingest_cpu.py --nodes 100 --rounds 10 --repeat 5

It creates (and drops) its own database `tessera_bench_ingest_cpu` on that server. Results:
bench/results/telemetry/ingest_cpu.{json,md} (--label names the run, e.g. before/after).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.scratch_db import ScratchDatabase  # noqa: E402

# Two runs side by side (other work on the machine) need two databases: TESSERA_BENCH_DB names this one.
DB = ScratchDatabase(os.environ.get("TESSERA_BENCH_DB", "tessera_bench_ingest_cpu"))
RESULTS = ROOT / "bench" / "results" / "telemetry"


def _setup(nodes: int, shares: int) -> list:
    """The fleet, `shares` running reservations per node, and one hello per node (as the
    consumer registers it); returns (StreamInfo, Sampler, stream id) per node."""

    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from agents.gpus.simulated import SimulatedSource
    from agents.placements import PlacementTable
    from agents.sampling import Sampler
    from bench.telemetry.running_shares import hold_shares
    from portal.fleet import inventory as fleet_inventory
    from portal.fleet.models import Node
    from portal.telemetry import ingest
    from portal.telemetry.services import placements_for_node
    from portal.tenancy.models import Team
    from wire.agent_portal import Hello
    from wire.inventory import load_inventory

    call_command("migrate", verbosity=0)
    path = Path(tempfile.mkdtemp(prefix="tessera-bench-")) / "inventory.yaml"
    lines = ["version: 1", "nodes:"]
    for i in range(nodes):
        lines += [f"  - name: bench-node-{i:04d}", "    gpus:", "      - model: A100-80GB",
                  "        memory_mib: 81920", "        count: 8"]
    path.write_text("\n".join(lines) + "\n")
    fleet_inventory.load(path)
    team = Team.objects.create(slug="bench", name="Bench")  # shares are held directly: no quota needed
    user = get_user_model().objects.create_user("bench", password="x")
    out = []
    for spec in load_inventory(path):
        node = Node.objects.get(name=spec.name)
        hold_shares(user, team, node, shares)
        stream = f"{node.pk:08x}-0000-4000-8000-000000000000"
        hello = Hello.model_validate({
            "v": 1, "type": "hello", "node": spec.name, "stream": stream, "agent_version": "0.1.0",
            "source": "simulated", "driver_version": "simulated", "interval_ms": 1000,
            "gpus": [{"index": g.index, "uuid": g.uuid, "model": g.model, "memory_mib": g.memory_mib,
                      "numa_node": g.numa_node, "nvlink_peers": list(g.nvlink_peers), "mig_mode": "disabled"}
                     for g in spec.gpus]})
        info = ingest.register_hello(node, hello)
        table = PlacementTable({g.uuid for g in spec.gpus})
        table.apply(placements_for_node(node.pk))
        out.append((info, Sampler(SimulatedSource(spec, table, seed=node.pk), table), stream))
    return out


def _messages(nodes: list, rounds: int) -> list[str]:
    """`rounds` live messages per node (one sample each), in arrival order, timed just now."""
    messages = []
    for _ in range(rounds):
        for _info, sampler, stream in nodes:
            _seq, sample = sampler.take()
            # As agents/stream.py frames a batch.
            messages.append(f'{{"v":1,"type":"samples","stream":"{stream}","dropped":0,"samples":[{sample}]}}')
    return messages


def _round(nodes: list, rounds: int, per_commit: int, profile: cProfile.Profile | None) -> dict:
    import asyncio

    from portal.telemetry import conf
    from portal.telemetry.consumers import agent as consumer
    from portal.telemetry.writer import store
    from wire.agent_portal import AGENT_MESSAGES, parse

    texts = _messages(nodes, rounds)
    skew = conf.max_future_skew()
    infos = [info for info, _, _ in nodes] * rounds
    if profile:
        profile.enable()
    t0 = time.process_time()
    parsed = [parse(t, AGENT_MESSAGES) for t in texts]
    t1 = time.process_time()
    prepared = [consumer.prepare_samples(info, m, skew) for info, m in zip(infos, parsed, strict=True)]
    t2 = time.process_time()
    results = []
    for i in range(0, len(prepared), per_commit):
        results += store(prepared[i:i + per_commit])
    t3 = time.process_time()
    loop = asyncio.new_event_loop()
    try:
        # Publishing with nobody watching: the readings of each commit handed to the fan-out.
        loop.run_until_complete(_publish_unwatched(results, per_commit))
        t4 = time.process_time()
        acks = [consumer.ack_text(m.stream, s.ack_seq) for m, s in zip(parsed, results, strict=True)]
        t5 = time.process_time()
    finally:
        loop.close()
    if profile:
        profile.disable()
    assert all(s.new_samples == 1 for s in results), "every message is new"
    assert len(acks) == len(texts)
    n = len(texts)
    return {"messages": n, "parse_ms": (t1 - t0) * 1000 / n, "prepare_ms": (t2 - t1) * 1000 / n,
            "store_ms": (t3 - t2) * 1000 / n, "fanout_ms": (t4 - t3) * 1000 / n, "ack_ms": (t5 - t4) * 1000 / n,
            "total_ms": ((t3 - t0) + (t5 - t3)) * 1000 / n}


async def _publish_unwatched(results: list, per_commit: int) -> None:
    from portal.telemetry.live import Publisher

    publisher = Publisher()
    for i in range(0, len(results), per_commit):
        await publisher.publish(_latest(results[i:i + per_commit]))


def _latest(stored: list) -> list:
    return [r.latest for r in stored if r.latest is not None]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--shares", type=int, default=2, help="running shares per node")
    parser.add_argument("--rounds", type=int, default=10, help="messages per node per repetition")
    parser.add_argument("--per-commit", type=int, default=25, help="messages per group commit")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--label", default="run", help="name of this run in the results")
    parser.add_argument("--profile", type=int, default=0, help="print the top N functions (cProfile, cumulative)")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    DB.recreate()
    os.environ["DATABASE_URL"] = DB.url
    os.environ.setdefault("REDIS_URL", "")
    import django

    django.setup()
    try:
        nodes = _setup(args.nodes, args.shares)
        _round(nodes, 2, args.per_commit, None)  # warm: caches, prepared plans, imports
        runs = [_round(nodes, args.rounds, args.per_commit, None) for _ in range(args.repeat)]
        if args.profile:
            profile = cProfile.Profile(time.process_time)
            _round(nodes, args.rounds, args.per_commit, profile)
            pstats.Stats(profile).sort_stats(os.environ.get("BENCH_SORT", "cumulative")).print_stats(args.profile)
    finally:
        from django.db import connection

        connection.close()
        DB.drop()
    best = {k: round(min(r[k] for r in runs), 4) for k in runs[0] if k.endswith("_ms")}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    command = f"DATABASE_URL={DB.admin_url} .venv/bin/python bench/telemetry/ingest_cpu.py " + " ".join(sys.argv[1:])
    run = {"label": args.label, "command": command, "commit": commit + ("+changes" if dirty else ""),
           "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores, load avg {os.getloadavg()[0]:.2f}",
           "messages_per_round": runs[0]["messages"], "best_ms_per_message": best}
    print(json.dumps(run, indent=2))
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "ingest_cpu.json"
    previous = json.loads(path.read_text()) if path.exists() else []
    previous = [r for r in previous if r["label"] != args.label] + [run]
    path.write_text(json.dumps(previous, indent=2) + "\n")
    _write_markdown(previous)
    return 0


def _write_markdown(runs: list[dict]) -> None:
    lines = ["# CPU per agent message in the live process (in process)", "",
             "bench/telemetry/ingest_cpu.py: parse + the consumer's work + group commits of realistic `samples` "
             "messages (1 sample, 8 GPUs, 2 shares) against PostgreSQL; time.process_time per message, best of "
             "the repetitions. Daphne's frame handling and the ack's trip through Twisted are not in it.", "",
             "| run | commit | parse ms | consumer ms | store ms | fan-out (unwatched) ms | ack ms | total ms | "
             "machine | date (UTC) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in runs:
        b = r["best_ms_per_message"]
        lines.append(f"| {r['label']} | {r['commit']} | {b['parse_ms']} | {b['prepare_ms']} | {b['store_ms']} | "
                     f"{b['fanout_ms']} | {b['ack_ms']} | {b['total_ms']} | {r['machine']} | {r['date_utc']} |")
    lines += ["", "Commands:", ""] + [f"- {r['label']}: `{r['command']}`" for r in runs] + [""]
    (RESULTS / "ingest_cpu.md").write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
