"""CPU per sample of a simulated agent fleet (`python -m agents.fleet`), measured in this process.

Issue #16's load benchmark runs 500 simulated nodes of 8 GPUs at 1 Hz on the same 2 cores as the
portal, so the fleet's CPU counts against the portal's target. Three measurements, each the CPU
time of this process (time.process_time) divided by the samples taken, best of `--repeats`:

- take:   Sampler.take() (SimulatedSource.read, attribution, JSON) of every node, round after round;
- loop:   every node's Agent._sample_loop on one event loop at the real interval, no stream running:
          take plus the loop's scheduling (sleep, wake-ups) and the buffer;
- stream: whole agents (sample loop and PortalStream) connected to a stand-in portal in a child
          process that welcomes, pushes placements and acks every batch: everything the fleet
          process spends per sample, WebSocket and ack parsing included (the child's CPU is not
          counted).

Nodes are `load-node-NNNN` with 8 A100-80GB GPUs, as bench/load/run.py writes them, with
`--placements` shares per node on average (random GPUs, requests that fit).

    .venv/bin/python bench/agents/fleet_cpu.py                       (~1 minute)
    .venv/bin/python bench/agents/fleet_cpu.py --out fleet_cpu-before  (a baseline to compare with)

Writes bench/results/agents/<out>.json and .md; the .md compares with fleet_cpu-before.json when
that file exists and was made with the same arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agents.agent import Agent, AgentSettings  # noqa: E402
from agents.gpus.simulated import SimulatedSource  # noqa: E402
from agents.placements import PlacementTable  # noqa: E402
from agents.sampling import Sampler  # noqa: E402
from wire.agent_portal import PROTOCOL_VERSION, Placements  # noqa: E402
from wire.inventory import InventoryNode, load_inventory  # noqa: E402

OUT = ROOT / "bench" / "results" / "agents"
BASELINE = "fleet_cpu-before"
GPUS_PER_NODE = 8


def write_inventory(path: Path, nodes: int) -> None:
    lines = ["version: 1", "nodes:"]
    for i in range(nodes):
        lines += [f"  - name: load-node-{i:04d}", "    gpus:", "      - model: A100-80GB",
                  "        memory_mib: 81920", f"        count: {GPUS_PER_NODE}"]
    path.write_text("\n".join(lines) + "\n")


def placements_for(node: str, gpu_uuids: list[str], mean: float, rng: random.Random) -> dict:
    """A placements message with about `mean` shares on random GPUs of one node (requests fit)."""
    count = min(len(gpu_uuids), round(rng.uniform(0, 2 * mean)))
    free = dict.fromkeys(gpu_uuids, 1.0)
    entries = []
    for k in range(count):
        gpu = rng.choice([g for g in gpu_uuids if free[g] > 0])
        request = min(free[gpu], rng.choice((0.25, 0.5, 1.0)))
        free[gpu] -= request
        entries.append({"reservation": f"r-{node}-{k}", "gpu_uuid": gpu, "request": request,
                        "limit": round(min(1.0, request * rng.choice((1, 1.5, 2))), 2),
                        "memory_mib": rng.choice((None, 20480)), "pod_uid": None})
    return {"v": PROTOCOL_VERSION, "type": "placements", "revision": 1, "placements": entries}


def fleet_nodes(nodes: int) -> list[InventoryNode]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "inventory.yaml"
        write_inventory(path, nodes)
        return load_inventory(path)


def placed(nodes: list[InventoryNode], mean: float, seed: int) -> list[PlacementTable]:
    rng = random.Random(seed)
    tables = []
    for node in nodes:
        table = PlacementTable({g.uuid for g in node.gpus})
        table.apply(Placements.model_validate(placements_for(node.name, [g.uuid for g in node.gpus], mean, rng)))
        tables.append(table)
    return tables


def measure_take(nodes: list[InventoryNode], mean: float, rounds: int, repeats: int) -> dict:
    tables = placed(nodes, mean, seed=1)
    sources = [SimulatedSource(n, t, seed=i) for i, (n, t) in enumerate(zip(nodes, tables, strict=True))]
    samplers = [Sampler(s, t) for s, t in zip(sources, tables, strict=True)]
    for sampler in samplers:  # warm-up: first reads fill the demand tables
        sampler.take()
    read_ms, take_ms = [], []
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(rounds):
            for source in sources:
                source.read()
        read_ms.append((time.process_time() - start) * 1000 / (rounds * len(sources)))
        start = time.process_time()
        for _ in range(rounds):
            for sampler in samplers:
                sampler.take()
        take_ms.append((time.process_time() - start) * 1000 / (rounds * len(samplers)))
    shares = sum(len(t.all()) for t in tables)
    return {"nodes": len(nodes), "placements_per_node": shares / len(nodes), "rounds": rounds,
            "read_ms_per_sample": min(read_ms), "take_ms_per_sample": min(take_ms),
            "all_read_ms": read_ms, "all_take_ms": take_ms}


def make_agents(nodes: list[InventoryNode], tables: list[PlacementTable], url: str, interval: float) -> list[Agent]:
    return [
        Agent(AgentSettings(url=url, token=f"tok-{i}", node=node.name, interval_s=interval),
              SimulatedSource(node, table, seed=i), table)
        for i, (node, table) in enumerate(zip(nodes, tables, strict=True))
    ]


def samples_taken(agents: list[Agent]) -> int:
    return sum(a.sampler.seq for a in agents)


async def _measured(agents: list[Agent], warm_s: float, seconds: float) -> tuple[float, int]:
    await asyncio.sleep(warm_s)
    cpu, taken = time.process_time(), samples_taken(agents)
    await asyncio.sleep(seconds)
    return time.process_time() - cpu, samples_taken(agents) - taken


async def _loop_run(nodes: list[InventoryNode], mean: float, interval: float, seconds: float) -> tuple[float, int]:
    agents = make_agents(nodes, placed(nodes, mean, seed=1), "ws://127.0.0.1:9/ws/agents/", interval)
    stop = asyncio.Event()
    rng = random.Random(0)

    async def staggered(agent: Agent) -> None:
        await asyncio.sleep(rng.uniform(0, interval))  # as agents.fleet.run_fleet spreads the starts
        await agent._sample_loop(stop)

    tasks = [asyncio.create_task(staggered(a)) for a in agents]
    try:
        return await _measured(agents, interval + 0.5, seconds)
    finally:
        stop.set()
        await asyncio.gather(*tasks)


def measure_loop(nodes: list[InventoryNode], mean: float, interval: float, seconds: float, repeats: int) -> dict:
    runs = [asyncio.run(_loop_run(nodes, mean, interval, seconds)) for _ in range(repeats)]
    per = [cpu * 1000 / taken for cpu, taken in runs]
    return {"interval_s": interval, "seconds": seconds, "samples": [t for _, t in runs],
            "loop_ms_per_sample": min(per), "all_loop_ms": per}


# -- the stand-in portal (child process) -----------------------------------------------------------

async def _serve(port_file: Path, mean: float) -> None:
    from websockets.asyncio.server import serve
    from websockets.exceptions import ConnectionClosed

    rng = random.Random(1)

    async def handler(ws) -> None:
        with contextlib.suppress(ConnectionClosed):
            hello = json.loads(await ws.recv())
            await ws.send(json.dumps({"v": PROTOCOL_VERSION, "type": "welcome", "node": hello["node"],
                                      "stream": hello["stream"], "acked_seq": 0}))
            await ws.send(json.dumps(placements_for(hello["node"], [g["uuid"] for g in hello["gpus"]], mean, rng)))
            async for raw in ws:
                batch = json.loads(raw)
                if batch.get("type") == "samples":
                    await ws.send(json.dumps({"v": PROTOCOL_VERSION, "type": "ack", "stream": batch["stream"],
                                              "seq": batch["samples"][-1]["seq"]}))

    async with serve(handler, "127.0.0.1", 0, max_size=2**22) as server:
        port_file.write_text(str(server.sockets[0].getsockname()[1]))
        await asyncio.Future()


async def _stream_run(nodes: list[InventoryNode], url: str, interval: float, warm_s: float,
                      seconds: float) -> tuple[float, int, int]:
    agents = make_agents(nodes, [PlacementTable({g.uuid for g in n.gpus}) for n in nodes], url, interval)
    stop = asyncio.Event()
    rng = random.Random(0)

    async def staggered(agent: Agent) -> None:
        await asyncio.sleep(rng.uniform(0, interval))
        await agent.run(stop)

    tasks = [asyncio.create_task(staggered(a)) for a in agents]
    try:
        deadline = time.monotonic() + 60
        while not all(a.stream.connected for a in agents) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        cpu, taken = await _measured(agents, warm_s, seconds)
        connected = sum(a.stream.connected for a in agents)
        return cpu, taken, connected
    finally:
        stop.set()
        await asyncio.gather(*tasks)


def measure_stream(nodes: list[InventoryNode], mean: float, interval: float, seconds: float, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(port_file), "--placements", str(mean)],
                                  cwd=ROOT)
        try:
            deadline = time.monotonic() + 20
            while not port_file.exists() or not port_file.read_text():
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the stand-in portal did not start")
                time.sleep(0.05)
            url = f"ws://127.0.0.1:{port_file.read_text()}/ws/agents/"
            runs = [asyncio.run(_stream_run(nodes, url, interval, 3.0, seconds)) for _ in range(repeats)]
        finally:
            server.terminate()
            server.wait(10)
    per = [cpu * 1000 / taken for cpu, taken, _ in runs]
    return {"interval_s": interval, "seconds": seconds, "samples": [t for _, t, _ in runs],
            "connected": [c for _, _, c in runs], "stream_ms_per_sample": min(per), "all_stream_ms": per}


# -- report ----------------------------------------------------------------------------------------

ROWS = (("take", "take_ms_per_sample", "Sampler.take (read + attribution + JSON)"),
        ("take", "read_ms_per_sample", "SimulatedSource.read alone"),
        ("loop", "loop_ms_per_sample", "sample loop at the interval (take + scheduling + buffer)"),
        ("stream", "stream_ms_per_sample", "whole agents streaming to a stand-in portal"))


def report(result: dict, baseline: dict | None) -> str:
    meta = result["meta"]
    lines = [f"# Simulated agent fleet: CPU per sample ({meta['nodes']} nodes x {GPUS_PER_NODE} GPUs)", "",
             f"`{meta['command']}`", "",
             f"{meta['when']} at {meta['commit']} · {meta['machine']} · load average at the end "
             f"{meta['load_average_at_end']} · CPU time of this process (process_time), best of "
             f"{meta['repeats']}; {result['take']['placements_per_node']:.2f} placements per node", ""]
    if baseline is not None:
        lines += ["| | ms CPU per sample | baseline | baseline / now |", "| --- | --- | --- | --- |"]
    else:
        lines += ["| | ms CPU per sample |", "| --- | --- |"]
    for part, key, label in ROWS:
        if part not in result:
            continue
        now = result[part][key]
        if baseline is not None and part in baseline:
            before = baseline[part][key]
            lines.append(f"| {label} | {now:.3f} | {before:.3f} | {before / now:.1f}x |")
        elif baseline is not None:
            lines.append(f"| {label} | {now:.3f} | | |")
        else:
            lines.append(f"| {label} | {now:.3f} |")
    if baseline is not None:
        lines += ["", f"Baseline: `{BASELINE}.json`, made at {baseline['meta']['commit']} "
                      f"({baseline['meta']['when']}) with the same arguments."]
    if "stream" in result:
        s = result["stream"]
        cores = s["stream_ms_per_sample"] * meta["nodes"] / s["interval_s"] / 1000
        lines += ["", f"At {meta['nodes']} nodes and one sample a node every {s['interval_s']:g} s, the "
                      f"stream figure is {cores:.3f} cores; agents connected during the runs: {s['connected']}."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--placements", type=float, default=3.0, help="mean shares per node")
    parser.add_argument("--rounds", type=int, default=5, help="take: rounds of every node per repeat")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=5.0, help="loop and stream: measured seconds per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-stream", action="store_true")
    parser.add_argument("--out", default="fleet_cpu", help="results file name under bench/results/agents/")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve, args.placements))
        return 0
    nodes = fleet_nodes(args.nodes)
    result: dict = {"take": measure_take(nodes, args.placements, args.rounds, args.repeats)}
    print(f"take: {result['take']['take_ms_per_sample']:.3f} ms/sample "
          f"(read {result['take']['read_ms_per_sample']:.3f})", flush=True)
    result["loop"] = measure_loop(nodes, args.placements, args.interval, args.seconds, args.repeats)
    print(f"loop: {result['loop']['loop_ms_per_sample']:.3f} ms/sample", flush=True)
    if not args.skip_stream:
        result["stream"] = measure_stream(nodes, args.placements, args.interval, args.seconds, args.repeats)
        print(f"stream: {result['stream']['stream_ms_per_sample']:.3f} ms/sample", flush=True)
    command = " ".join([".venv/bin/python bench/agents/fleet_cpu.py", *sys.argv[1:]])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "agents"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs (shared), Python {platform.python_version()}"
    result["meta"] = {"command": command, "commit": commit + ("+changes" if dirty else ""),
                      "when": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine,
                      "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
                      "nodes": args.nodes, "repeats": args.repeats,
                      "args": {k: v for k, v in vars(args).items() if k not in ("out", "serve")}}
    baseline = None
    base_path = OUT / f"{BASELINE}.json"
    if args.out != BASELINE and base_path.exists():
        candidate = json.loads(base_path.read_text())
        if candidate["meta"].get("args") == result["meta"]["args"]:
            baseline = candidate
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.out}.json").write_text(json.dumps(result, indent=2) + "\n")
    md = report(result, baseline)
    (OUT / f"{args.out}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
