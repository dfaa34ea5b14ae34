"""Checks the preload library on a real NVIDIA GPU, as one command (needs PyTorch with CUDA):

    python preload/gpu_check.py [--seconds 20] [--out bench/results/preload/gpu_check.json]

1. Memory: PyTorch under a 2 GiB cap sees ~2 GiB in torch.cuda.mem_get_info() and runs out of
   memory there, with the default caching allocator, with expandable_segments:True (VMM:
   cuMemCreate) and with the cudaMallocAsync backend (stream-ordered pools).
2. Shares: two matmul loops at request=limit 0.3 and 0.7 through a share broker get ~30/70 of the
   throughput one loop has alone.
3. Overhead: a loop of tiny kernels (the launch path dominates) is < 1% slower with the library
   loaded and a share of 1.0 than without the library.

Every check prints PASS or FAIL with its numbers; the exit status is the number of failures. Run it
from the repository root of a checkout (it builds the library with make and starts
`python -m agents.broker`).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIBRARY = REPO / "preload" / "build" / "libtessera_preload.so"
GiB = 1 << 30

MEMORY_CHILD = textwrap.dedent(
    """
    import json, torch
    free, total = torch.cuda.mem_get_info()
    blocks, taken = [], 0
    step = 128 << 20
    oom = False
    try:
        while taken < (64 << 30):
            blocks.append(torch.empty(step, dtype=torch.uint8, device="cuda"))
            taken += step
    except torch.cuda.OutOfMemoryError:
        oom = True
    print(json.dumps({"total": total, "free": free, "taken": taken, "oom": oom}))
    """
)

MATMUL_CHILD = textwrap.dedent(
    """
    import json, sys, time, torch
    seconds, start_at = float(sys.argv[1]), float(sys.argv[2])
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    time.sleep(max(0.0, start_at - time.time()))
    n, t0 = 0, time.time()
    while time.time() - t0 < seconds:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        n += 10
    print(json.dumps({"iterations": n, "seconds": time.time() - t0}))
    """
)

TINY_CHILD = textwrap.dedent(
    """
    import json, time, torch
    x = torch.zeros(1, device="cuda")
    for _ in range(1000):
        x.add_(1)
    torch.cuda.synchronize()
    best = None
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(100000):
            x.add_(1)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    print(json.dumps({"us_per_launch": best / 100000 * 1e6}))
    """
)


def child(code: str, env: dict[str, str], *args: str, timeout: float = 600) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                         timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"child failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def base_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
    env.pop("LD_PRELOAD", None)
    env["TESSERA_BUDGET_PATH"] = str(tmp / f"budget-{time.monotonic_ns()}")
    env.update(extra)
    return env


def start_broker(path: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "agents.broker", "--socket", str(path), "--log-level", "WARNING"]
    proc = subprocess.Popen(cmd, cwd=REPO)
    for _ in range(200):
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(path))
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the share broker did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the share measurement")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "preload" / "gpu_check.json")
    args = parser.parse_args()
    subprocess.run(["make", "-s", "-C", str(REPO / "preload")], check=True)
    results: dict[str, object] = {"command": " ".join(["python", *sys.argv])}
    failures = 0

    def verdict(name: str, ok: bool, detail: dict) -> None:
        nonlocal failures
        failures += not ok
        results[name] = {"pass": ok, **detail}
        print(f"{'PASS' if ok else 'FAIL'} {name}: {json.dumps(detail)}", flush=True)

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        card = child(MEMORY_CHILD.replace("while taken < (64 << 30)", "while False"), base_env(tmp))
        results["card_total_bytes"] = card["total"]

        # 1. memory caps, per allocator
        for label, conf in [("default", ""), ("expandable_segments", "expandable_segments:True"),
                            ("cudaMallocAsync", "backend:cudaMallocAsync")]:
            env = base_env(tmp, LD_PRELOAD=str(LIBRARY), TESSERA_GPU_MEMORY_LIMIT="2Gi")
            if conf:
                env["PYTORCH_CUDA_ALLOC_CONF"] = conf
            r = child(MEMORY_CHILD, env)
            ok = (r["oom"] and 1.9 * GiB <= r["total"] <= 2 * GiB and r["free"] <= r["total"]
                  and 1.0 * GiB <= r["taken"] <= 2 * GiB)
            verdict(f"memory cap 2 GiB, {label} allocator", ok,
                    {"mem_get_info_total_gib": round(r["total"] / GiB, 3),
                     "allocated_before_oom_gib": round(r["taken"] / GiB, 3), "oom": r["oom"]})

        # 2. shares 0.3 / 0.7
        alone = child(MATMUL_CHILD, base_env(tmp), str(args.seconds / 2), str(time.time() + 1))
        rate_alone = alone["iterations"] / alone["seconds"]
        sock = tmp / "broker.sock"
        broker = start_broker(sock)
        try:
            start_at = str(time.time() + 15)  # both warmed up before the common start
            procs = []
            for name, share in [("a", "0.3"), ("b", "0.7")]:
                env = base_env(tmp, LD_PRELOAD=str(LIBRARY), TESSERA_BROKER_SOCKET=str(sock),
                               TESSERA_SHARE_ID=f"check-{name}", TESSERA_GPU_REQUEST=share,
                               TESSERA_GPU_LIMIT=share)
                cmd = [sys.executable, "-c", MATMUL_CHILD, str(args.seconds), start_at]
                procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
            shares = []
            for p in procs:
                out, _ = p.communicate(timeout=args.seconds + 300)
                r = json.loads(out.strip().splitlines()[-1])
                shares.append(r["iterations"] / r["seconds"] / rate_alone)
        finally:
            broker.terminate()
            broker.wait(10)
        verdict("compute shares 0.3 / 0.7", abs(shares[0] - 0.3) <= 0.05 and abs(shares[1] - 0.7) <= 0.05,
                {"fraction_a": round(shares[0], 3), "fraction_b": round(shares[1], 3),
                 "alone_iterations_per_s": round(rate_alone, 1)})

        # 3. launch overhead
        broker = start_broker(sock)
        try:
            plain = child(TINY_CHILD, base_env(tmp))
            hooked = child(TINY_CHILD, base_env(tmp, LD_PRELOAD=str(LIBRARY), TESSERA_BROKER_SOCKET=str(sock),
                                                TESSERA_GPU_REQUEST="1.0", TESSERA_GPU_MEMORY_LIMIT="8Gi"))
        finally:
            broker.terminate()
            broker.wait(10)
        slowdown = hooked["us_per_launch"] / plain["us_per_launch"] - 1
        verdict("tiny-kernel loop overhead", slowdown < 0.01,
                {"us_per_launch_plain": round(plain["us_per_launch"], 3),
                 "us_per_launch_library": round(hooked["us_per_launch"], 3), "slowdown": round(slowdown, 4)})

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"{failures} failure(s); results in {args.out}")
    return failures


if __name__ == "__main__":
    sys.exit(main())
