"""Per-launch overhead of the preload library: 10M empty launches with and without the hook.

    .venv/bin/python bench/preload/launch_overhead.py [--launches N] [--repeats R]

Each configuration runs R times in this run, interleaved; the fastest run of each is reported (the
others measure the neighbours on a shared machine), with the added nanoseconds per launch against
the no-library baseline measured in the same run, and the median beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

from common import BUILD, LIBRARY, RESULTS, TEST_BIN, Broker, build, command_line, fake_env

SOURCE = Path(__file__).with_name("launch_overhead.c")
BINARY = BUILD / "bench" / "launch_overhead"


def compile_bench() -> None:
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-O2", "-I/usr/local/cuda/include", "-o", str(BINARY), str(SOURCE),
                    f"-L{TEST_BIN}", "-lcuda", f"-Wl,-rpath,{TEST_BIN}"], check=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--launches", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    build()
    compile_bench()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        broker = Broker(root / "broker.sock")
        broker.define("default", "0", 1.0, 1.0)  # the library's share and GPU when unnamed
        lib = str(LIBRARY)
        configs = {
            "no library": fake_env(root),
            "library, memory cap only": fake_env(root, LD_PRELOAD=lib, TESSERA_GPU_MEMORY_LIMIT="1Gi"),
            "library, share 1.0 via broker": fake_env(root, LD_PRELOAD=lib, TESSERA_GPU_REQUEST="1.0",
                                                      TESSERA_BROKER_SOCKET=str(root / "broker.sock")),
            "library, share 1.0 local bucket": fake_env(root, LD_PRELOAD=lib, TESSERA_GPU_REQUEST="1.0"),
        }
        samples: dict[str, list[float]] = {name: [] for name in configs}
        try:
            for _ in range(args.repeats):
                for name, env in configs.items():
                    out = subprocess.run([str(BINARY), str(args.launches)], env=env, capture_output=True,
                                         text=True, check=True)
                    samples[name].append(float(out.stdout))
        finally:
            broker.stop()
    base = min(samples["no library"])
    rows = []
    for name, values in samples.items():
        best = min(values)
        rows.append({"config": name, "ns_per_launch": round(best, 2), "added_ns": round(best - base, 2),
                     "ratio": round(best / base, 2), "median_ns": round(statistics.median(values), 2),
                     "samples": values})
    lines = [
        "# Preload: per-launch overhead",
        "",
        f"Command: `{command_line()}`",
        "",
        f"{args.launches:,} empty `cuLaunchKernel` calls on the fake driver (which returns at once), "
        f"fastest of {args.repeats} interleaved runs. With a share set, the token is held nearly all the "
        "time; the numbers include the token boundaries that fell inside the run. Target: < 100 ns added.",
        "",
        "| configuration | ns / launch | added ns | ratio | median ns |",
        "| --- | ---: | ---: | ---: | ---: |",
        *[f"| {r['config']} | {r['ns_per_launch']} | {r['added_ns']} | {r['ratio']} | {r['median_ns']} |"
          for r in rows],
        "",
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "launch_overhead.md").write_text("\n".join(lines))
    record = {"command": command_line(), "rows": rows}
    (RESULTS / "launch_overhead.json").write_text(json.dumps(record, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
