"""Share accuracy on the fake device: several mixes at once, each on its own fake GPU, one broker.

    .venv/bin/python bench/preload/share_accuracy.py [--seconds S]

Method: every process runs back-to-back 1 ms fake kernels (a kernel sleeps while holding its fake
GPU's cross-process lock, so the device serialises kernels as a GPU does and the CPU stays free). All
processes start at the same wall-clock instant and each measures, over the same S seconds, the
device time its kernels got. The fraction is that time over S. The expected fraction is the broker's
policy worked out by hand: every share busy, spare time split in proportion to requests, no share
above its limit (water-filling). The priority mix compares a bursty high-priority job's throughput
beside a busy low-priority job with its throughput alone on another fake GPU in the same run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

from common import LIBRARY, RESULTS, Broker, build, command_line, fake_env

MIXES: dict[str, list[tuple[str, float, float]]] = {
    "0.3/0.7 at their limits": [("a", 0.3, 0.3), ("b", 0.7, 0.7)],
    "0.3/0.7 may burst to 1.0": [("a", 0.3, 1.0), ("b", 0.7, 1.0)],
    "0.1/0.9 at their limits": [("a", 0.1, 0.1), ("b", 0.9, 0.9)],
    "0.2/0.3/0.5 at their limits": [("a", 0.2, 0.2), ("b", 0.3, 0.3), ("c", 0.5, 0.5)],
    "three tenants (0.2-0.4, 0.3-0.3, 0.1-1.0)": [("a", 0.2, 0.4), ("b", 0.3, 0.3), ("c", 0.1, 1.0)],
    "lone 0.3 may burst to 1.0": [("a", 0.3, 1.0)],
    "lone 0.5 held to 0.5": [("a", 0.5, 0.5)],
}


def expected(shares: list[tuple[str, float, float]]) -> dict[str, float]:
    """Water-filling: spare time in proportion to requests, nobody above its limit."""
    got = {name: 0.0 for name, _, _ in shares}
    open_ = {name: (r, lim) for name, r, lim in shares}
    left = 1.0
    while open_ and left > 1e-9:
        total_r = sum(r for r, _ in open_.values())
        step = min(left, min((lim - got[n]) * total_r / r for n, (r, lim) in open_.items()))
        for n, (r, lim) in list(open_.items()):
            got[n] += step * r / total_r
            if got[n] >= lim - 1e-9:
                del open_[n]
        left -= step
    return got


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    build()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        broker = Broker(root / "broker.sock")
        start_at = f"{time.time() + 2:.6f}"
        procs = []

        def launch(gpu: str, name: str, request: float, limit: float, priority: str = "low", burst: str = ""):
            broker.define(f"{gpu}-{name}", gpu, request, limit, priority)  # as the node's agent does
            env = fake_env(root, LD_PRELOAD=str(LIBRARY), FAKE_GPU_UUID=gpu, NVIDIA_VISIBLE_DEVICES=gpu,
                           TESSERA_SHARE_ID=f"{gpu}-{name}", TESSERA_GPU_REQUEST=str(request),
                           TESSERA_GPU_LIMIT=str(limit), TESSERA_PRIORITY=priority,
                           TESSERA_BROKER_SOCKET=str(root / "broker.sock"))
            cmd = [str(LIBRARY.parent / "test" / "kernel_loop"), "--seconds", str(args.seconds),
                   "--kernel-us", "1000", "--start-at", start_at, *burst.split()]
            procs.append((gpu, name, request, limit, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                                                       text=True)))

        for i, shares in enumerate(MIXES.values()):
            for name, request, limit in shares:
                launch(f"mix{i}", name, request, limit)
        burst = "--burst 100 --pause-ms 100"
        launch("prio", "high", 0.5, 1.0, "high", burst)
        launch("prio", "low", 0.5, 1.0, "low")
        launch("prio-alone", "high", 0.5, 1.0, "high", burst)
        measured = {}
        for gpu, name, _, _, proc in procs:
            out, _ = proc.communicate(timeout=args.seconds + 60)
            measured[(gpu, name)] = json.loads(out)
        broker.stop()

    rows = []
    for i, (mix, shares) in enumerate(MIXES.items()):
        want = expected(shares)
        for name, request, limit in shares:
            m = measured[(f"mix{i}", name)]
            got = m["busy_s"] / m["wall_s"]
            rows.append({"mix": mix, "share": name, "request": request, "limit": limit,
                         "expected": round(want[name], 3), "measured": round(got, 3),
                         "error_points": round(100 * (got - want[name]), 1)})
    high_alone = measured[("prio-alone", "high")]["bursts"]
    high_shared = measured[("prio", "high")]["bursts"]
    low = measured[("prio", "low")]
    prio = {"high_bursts_alone": high_alone, "high_bursts_beside_low": high_shared,
            "high_throughput_kept": round(high_shared / high_alone, 3),
            "low_fraction": round(low["busy_s"] / low["wall_s"], 3)}
    worst = max(abs(r["error_points"]) for r in rows)
    lines = [
        "# Preload: share accuracy on the fake device",
        "",
        f"Command: `{command_line()}`",
        "",
        __doc__.split("\n\n", 2)[2].strip(),
        "",
        f"Measured over {args.seconds:g} s, all mixes at once on a 2-core machine.",
        "",
        "| mix | share | request | limit | expected | measured | error (points) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
        *[f"| {r['mix']} | {r['share']} | {r['request']} | {r['limit']} | {r['expected']} | "
          f"{r['measured']} | {r['error_points']:+} |" for r in rows],
        "",
        f"Largest error: {worst} points.",
        "",
        "Priority: a high-priority job (bursts of 100 kernels of 1 ms, 100 ms apart) beside a busy "
        "low-priority job, against the same job alone on another fake GPU:",
        "",
        f"- high-priority bursts alone: {high_alone}, beside the low-priority job: {high_shared} "
        f"(throughput kept: {prio['high_throughput_kept']:.1%}; target ≥ 95%)",
        f"- low-priority job's share of the device: {prio['low_fraction']:.1%} (target ≥ 20%)",
        "",
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "share_accuracy.md").write_text("\n".join(lines))
    record = {"command": command_line(), "seconds": args.seconds, "rows": rows, "priority": prio}
    (RESULTS / "share_accuracy.json").write_text(json.dumps(record, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
