"""Checks the preload library, the share broker and the remote share on a real NVIDIA GPU, as one
command (needs PyTorch with CUDA, nvcc and a C compiler; run from the repository root):

    python preload/gpu_check.py [--seconds 8] [--only memory,graphs,...]
                                [--out bench/results/preload/gpu_check.json] [--budget-s 400]

1. memory: PyTorch under a 2 GiB cap (default caching allocator, expandable_segments:True, the
   cudaMallocAsync backend) sees the cap in mem_get_info and gets OutOfMemoryError at it; a driver-API
   program through cuMemAlloc, cuMemAllocAsync and cuMemCreate likewise; a process that exits holding
   its memory leaves nothing behind (the next one gets the whole cap, the card's used memory returns).
2. graphs: CUDA graphs (PyTorch's capture and replay; a C program's stream capture, including a graph
   that allocates inside itself) and per-thread default streams, with the cap held; a replayed graph
   at a 0.5 share gets half the card.
3. remote: a CUDA C program through the remote share's client libraries on loopback gives the results
   of its direct run; its device-to-host copies against a raw TCP copy of the same size.
4. overhead: a tiny-kernel launch loop (< 1 %) and a small CNN's training step (< 3 %) with the
   library at share 1.0 against without it.
5. shares: 0.3/0.7 at their limits get 30/70 +- 3 points of a matmul loop's solo throughput; beside an
   idle neighbour an elastic share (0.7, may burst to 1.0) gets >= 90 % of the card and one held to
   0.7 gets 70 +- 3 points; a bursty high-priority job beside a busy low-priority one keeps >= 95 % of
   its solo speed.

Every check prints PASS or FAIL with its numbers; results go to --out (JSON, rewritten after every
section, so a run cut short keeps what it measured) and the same name with .md. The exit status is
the number of failures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agents.broker.protocol import ShareTerms as BrokerTerms  # noqa: E402
from agents.broker.protocol import query_stats  # noqa: E402
from wire.share_tokens import ShareTerms, issue  # noqa: E402

BUILD = REPO / "preload" / "build"
LIBRARY = BUILD / "libtessera_preload.so"
PROGS = BUILD / "gpu"
CLIENT = BUILD / "remote" / "client"
GiB, MiB = 1 << 30, 1 << 20
CAP = 2 * GiB
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY and cudaErrorMemoryAllocation
SECTIONS = ("memory", "graphs", "graph_share", "remote", "overhead", "shares", "priority")

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

# a matmul loop: solo throughput, shares, and (with a pause) a bursty job's time per burst. It runs
# `lead` seconds before it measures `seconds`: the broker's limits hold over a sliding window
# (BrokerSettings.window_s), so a share measured right after idling may spend credit it saved.
MATMUL_CHILD = textwrap.dedent(
    """
    import json, sys, time, torch
    seconds, start_at, lead = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[5])
    burst, pause_s = int(sys.argv[3]), float(sys.argv[4]) / 1e3  # burst 0: idle
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    time.sleep(max(0.0, start_at - time.time()))
    def loop(until):
        n, bursts, busy = 0, 0, 0.0
        while burst and time.time() < until:
            b0 = time.perf_counter()
            for _ in range(burst):
                a @ b
            torch.cuda.synchronize()
            busy += time.perf_counter() - b0
            n += burst
            bursts += 1
            time.sleep(pause_s)
        return n, bursts, busy
    if burst == 0:  # holds its context, launches nothing
        time.sleep(lead + seconds)
    loop(time.time() + lead)
    t0 = time.time()
    n, bursts, busy = loop(t0 + seconds)
    print(json.dumps({"iterations": n, "seconds": time.time() - t0, "bursts": bursts, "busy_s": busy}))
    """
)

TINY_CHILD = textwrap.dedent(
    """
    import json, time, torch
    x = torch.zeros(1, device="cuda")
    for _ in range(2000):
        x.add_(1)
    torch.cuda.synchronize()
    best = None
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(50000):
            x.add_(1)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    print(json.dumps({"us_per_launch": best / 50000 * 1e6}))
    """
)

CNN_CHILD = textwrap.dedent(
    """
    import json, time, torch, torch.nn as nn
    torch.manual_seed(0)
    def block(i, o):
        return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(), nn.MaxPool2d(2))
    model = nn.Sequential(block(3, 64), block(64, 128), block(128, 256), nn.Flatten(),
                          nn.Linear(256 * 8 * 8, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(128, 3, 64, 64, device="cuda")
    y = torch.randint(0, 10, (128,), device="cuda")
    def step():
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    for _ in range(30):
        step()
    torch.cuda.synchronize()
    best = None
    for _ in range(4):
        t0 = time.perf_counter()
        for _ in range(40):
            step()
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / 40
        best = dt if best is None else min(best, dt)
    print(json.dumps({"ms_per_step": best * 1e3}))
    """
)

# PyTorch's CUDA graphs under the cap: replay gives the eager result; a capture that allocates past
# the cap fails with OutOfMemoryError; mem_get_info still shows the cap afterwards
TORCH_GRAPH_CHILD = textwrap.dedent(
    """
    import json, torch
    x = torch.randn(1024, 1024, device="cuda")
    w = torch.randn(1024, 1024, device="cuda")
    static = torch.empty_like(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            static.copy_(torch.relu(x @ w))
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static.copy_(torch.relu(x @ w))
    x.copy_(torch.randn(1024, 1024, device="cuda"))
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()
    replay_ok = bool(torch.allclose(static, torch.relu(x @ w), rtol=1e-3, atol=1e-3))
    held = torch.empty(int(1.5 * (1 << 30)), dtype=torch.uint8, device="cuda")
    big = torch.cuda.CUDAGraph()
    refused, outcome = False, ""
    try:
        with torch.cuda.graph(big):
            inner = torch.ones(1 << 30, dtype=torch.uint8, device="cuda")
            inner.mul_(2)
        big.replay()
        torch.cuda.synchronize()
        outcome = "captured and replayed 1 GiB past 1.5 GiB held"
    except RuntimeError as exc:  # OutOfMemoryError, or the capture failing on the refused allocation
        refused, outcome = True, str(exc).splitlines()[0][:200]
    free, total = torch.cuda.mem_get_info()
    print(json.dumps({"replay_ok": replay_ok, "refused": refused, "outcome": outcome, "total": total,
                      "reserved": torch.cuda.memory_reserved(), "held": held.numel()}))
    """
)

GRAPH_SHARE_CHILD = textwrap.dedent(
    """
    import json, sys, time, torch
    seconds, lead = float(sys.argv[1]), float(sys.argv[2])  # lead: run before measuring, as MATMUL_CHILD
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    c = torch.empty_like(a)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            torch.matmul(a, b, out=c)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            torch.matmul(a, b, out=c)
    t0 = time.time()
    while time.time() - t0 < lead:
        g.replay()
        torch.cuda.synchronize()
    n, t0 = 0, time.time()
    while time.time() - t0 < seconds:
        g.replay()
        torch.cuda.synchronize()
        n += 10
    print(json.dumps({"iterations": n, "seconds": time.time() - t0}))
    """
)


class CardSampler:
    """The card's SM clock and power draw, sampled while a measurement runs: a card held below its
    power limit at part duty clocks higher than at full duty, so throughput is not GPU time."""

    def __enter__(self) -> CardSampler:
        self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                                      "-lms", "200"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        rows = []
        for line in out.splitlines():
            with contextlib.suppress(ValueError):
                rows.append([float(f) for f in line.split(",")])
        busy = [r for r in rows if r[1] > 150] or rows  # the samples while the card worked
        self.summary = {"sm_mhz_mean": round(sum(r[0] for r in busy) / len(busy)) if busy else None,
                        "power_w_mean": round(sum(r[1] for r in busy) / len(busy)) if busy else None}


def kv(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


class Check:
    """Runs the sections, keeps the results and writes them after each section."""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args, self.tmp = args, tmp
        self.failures = 0
        self.results: dict[str, object] = {"command": " ".join(["python", *sys.argv]), "checks": {}}
        self.started = time.monotonic()
        # the broker takes terms only from the node's agent: this check plays the agent, and tells the
        # broker each share it starts (tied to this check's session, which its processes inherit)
        self.control: Path | None = None
        self.terms: dict[tuple[str, str], BrokerTerms] = {}

    # -- plumbing ----------------------------------------------------------------------------
    def verdict(self, name: str, ok: bool, detail: dict) -> None:
        self.failures += not ok
        self.results["checks"][name] = {"pass": ok, **detail}
        print(f"{'PASS' if ok else 'FAIL'} {name}: {json.dumps(detail)}", flush=True)

    def env(self, preload: bool = False, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
        env.pop("LD_PRELOAD", None)
        env["TESSERA_BUDGET_PATH"] = str(self.tmp / f"budget-{time.monotonic_ns()}")
        env["TESSERA_BROKER_SOCKET"] = str(self.tmp / "broker.sock")
        if preload:
            env["LD_PRELOAD"] = str(LIBRARY)
        env.update(extra)
        if preload and ("TESSERA_GPU_REQUEST" in extra or "TESSERA_GPU_LIMIT" in extra):
            # the terms the portal's placement would carry, as the library reads them (config.c)
            request = float(extra.get("TESSERA_GPU_REQUEST", extra.get("TESSERA_GPU_LIMIT", "1")))
            limit = float(extra.get("TESSERA_GPU_LIMIT", request))
            gpu = (env.get("TESSERA_GPU_UUID") or env.get("NVIDIA_VISIBLE_DEVICES") or "0").split(",")[0]
            self.agent_terms(env.get("TESSERA_SHARE_ID", "default"), gpu, min(request, limit), limit,
                             env.get("TESSERA_PRIORITY", "low").lower())
        return env

    def agent_terms(self, share: str, gpu: str, request: float, limit: float, priority: str,
                    session: int | None = None) -> None:
        """A share's terms to the broker, as the node's agent gives them on its control socket."""
        self.terms[(gpu, share)] = BrokerTerms(share=share, gpu=gpu, request=request, limit=limit, priority=priority,
                                               sessions=[session or os.getsid(0)])
        if self.control is not None:
            query_stats(self.control, timeout_s=10, terms=self.terms.values())

    def python(self, code: str, env: dict[str, str], *args: str, timeout: float = 300) -> dict:
        return self.run([sys.executable, "-c", code, *args], env, timeout, parse=json.loads)

    def run(self, cmd: list[str], env: dict[str, str], timeout: float = 300,
            parse: Callable[[str], dict] | None = None) -> dict:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"{Path(cmd[0]).name} exited {out.returncode}:\n{out.stdout[-1500:]}"
                               f"{out.stderr[-3000:]}")
        if parse is json.loads:
            return json.loads(out.stdout.strip().splitlines()[-1])
        return kv(out.stdout)

    def spawn(self, code: str, env: dict[str, str], *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    @staticmethod
    def collect(proc: subprocess.Popen, timeout: float) -> dict:
        out, err = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"child exited {proc.returncode}:\n{err[-3000:]}")
        return json.loads(out.strip().splitlines()[-1])

    def used_mib(self) -> int:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=True)
        return int(out.stdout.split()[0])

    def settled_used_mib(self, baseline: int) -> int:
        """The card's used memory once exited processes are gone (the driver frees shortly after)."""
        used = self.used_mib()
        for _ in range(50):
            if used <= baseline + 16:
                break
            time.sleep(0.1)
            used = self.used_mib()
        return used

    @contextlib.contextmanager
    def broker(self):
        path, control = self.tmp / "broker.sock", self.tmp / "broker-control.sock"
        path.unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, "-m", "agents.broker", "--socket", str(path), "--control-socket",
                                 str(control), "--identity", "session", "--log-level", "WARNING"], cwd=REPO)
        try:
            for _ in range(400):
                with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(control))
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError("the share broker did not start")
            self.control = control
            query_stats(control, timeout_s=10, terms=self.terms.values())
            yield path
        finally:
            self.control = None
            proc.terminate()
            proc.wait(10)

    def write(self) -> None:
        out = self.args.out
        out.parent.mkdir(parents=True, exist_ok=True)
        self.results["failures"] = self.failures
        self.results["elapsed_s"] = round(time.monotonic() - self.started, 1)
        out.write_text(json.dumps(self.results, indent=2))
        out.with_suffix(".md").write_text(render(self.results))

    # -- the machine ----------------------------------------------------------------------------
    def describe(self) -> None:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,uuid",
                            "--format=csv,noheader"], capture_output=True, text=True, check=True)
        name, driver, memory, uuid = [f.strip() for f in q.stdout.splitlines()[0].split(",")]
        nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()
        torch_v = self.python("import json, torch; print(json.dumps({'torch': torch.__version__, "
                              "'cuda': torch.version.cuda}))", self.env())
        self.uuid = uuid
        self.results["machine"] = {"gpu": name, "driver": driver, "memory": memory, "nvcc": nvcc[-1] if nvcc else "",
                                   "torch": torch_v["torch"], "torch_cuda": torch_v["cuda"],
                                   "cpu_count": os.cpu_count(), "kernel": platform.release()}
        print(json.dumps(self.results["machine"]), flush=True)

    # -- 1. memory ---------------------------------------------------------------------------
    def memory(self) -> None:
        baseline = self.settled_used_mib(self.used_mib())
        for label, conf in [("default", ""), ("expandable_segments", "expandable_segments:True"),
                            ("cudaMallocAsync", "backend:cudaMallocAsync")]:
            env = self.env(preload=True, TESSERA_GPU_MEMORY_LIMIT="2Gi")
            if conf:
                env["PYTORCH_CUDA_ALLOC_CONF"] = conf
            r = self.python(MEMORY_CHILD, env)
            ok = (r["oom"] and 1.9 * GiB <= r["total"] <= CAP and r["free"] <= r["total"]
                  and 1.5 * GiB <= r["taken"] <= CAP)
            self.verdict(f"memory: PyTorch, {label} allocator, 2 GiB cap", ok,
                         {"mem_get_info_total_gib": round(r["total"] / GiB, 3),
                          "allocated_before_oom_gib": round(r["taken"] / GiB, 3), "oom": r["oom"]})
        for api in ("alloc", "async", "create"):
            env = self.env(preload=True, TESSERA_GPU_MEMORY_LIMIT="2Gi")
            r = self.run([str(PROGS / "alloc_probe"), api, "128"], env)
            got = int(r.get("allocated", 0))
            ok = (int(r.get("stop", -1)) == OOM and int(r["total"]) == CAP and CAP - 128 * MiB <= got <= CAP
                  and int(r.get("free_after", -1)) == CAP)
            self.verdict(f"memory: driver API {api}, 2 GiB cap", ok,
                         {"total_gib": round(int(r["total"]) / GiB, 3), "allocated_gib": round(got / GiB, 3),
                          "stopped_by": int(r.get("stop", -1)), "free_after_release_gib":
                          round(int(r.get("free_after", 0)) / GiB, 3)})
        # a process that exits holding its memory: the budget and the card get it back
        env = self.env(preload=True, TESSERA_GPU_MEMORY_LIMIT="2Gi")
        first = self.run([str(PROGS / "alloc_probe"), "alloc", "128", "--leak"], env)
        second = self.run([str(PROGS / "alloc_probe"), "alloc", "128"], env)
        used = self.settled_used_mib(baseline)
        ok = (int(second["allocated"]) == int(first["allocated"]) and int(second["free"]) == CAP
              and used <= baseline + 16)
        self.verdict("memory: nothing leaks at exit", ok,
                     {"held_at_exit_gib": round(int(first["allocated"]) / GiB, 3),
                      "next_process_free_gib": round(int(second["free"]) / GiB, 3),
                      "card_used_mib_before": baseline, "card_used_mib_after": used})

    # -- 2. graphs and per-thread default streams --------------------------------------------
    def graphs(self) -> None:
        with self.broker():
            for label, conf in [("default", ""), ("cudaMallocAsync", "backend:cudaMallocAsync")]:
                env = self.env(preload=True, TESSERA_GPU_MEMORY_LIMIT="2Gi", TESSERA_GPU_REQUEST="1.0")
                if conf:
                    env["PYTORCH_CUDA_ALLOC_CONF"] = conf
                r = self.python(TORCH_GRAPH_CHILD, env)
                self.verdict(f"graphs: PyTorch capture and replay, {label} allocator, 2 GiB cap",
                             r["replay_ok"] and r["refused"] and r["reserved"] <= CAP and r["total"] == CAP,
                             {"replay_matches_eager": r["replay_ok"], "capture_past_cap": r["outcome"],
                              "reserved_after_gib": round(r["reserved"] / GiB, 3),
                              "mem_get_info_total_gib": round(r["total"] / GiB, 3)})
            env = self.env(preload=True, TESSERA_GPU_MEMORY_LIMIT="2Gi", TESSERA_GPU_REQUEST="1.0")
            r = self.run([str(PROGS / "streams_graphs"), str(CAP)], env)
            self.verdict("graphs: per-thread default streams (4 threads), 2 GiB cap",
                         r.get("threads_ok") == "1" and int(r.get("ptsz_over", -1)) == OOM
                         and int(r.get("ptsz_taken", CAP + 1)) <= CAP,
                         {k: r.get(k) for k in ("threads_ok", "ptsz_taken", "ptsz_over")})
            self.verdict("graphs: a captured C graph replayed 100 times", r.get("graph_ok") == "1",
                         {k: r.get(k) for k in ("graph_error", "graph_value")})
            held = int(r.get("node_base_bytes", 0)) + int(r.get("node_used_high", 0))
            refused = OOM in {int(r.get(k, 0)) for k in ("node_capture_alloc", "node_instantiate", "node_launch")}
            self.verdict("graphs: a graph allocating inside itself stays within the cap", refused or held <= CAP,
                         {**{k: r.get(k) for k in ("node_capture_alloc", "node_instantiate", "node_launch",
                                                   "node_sync", "node_used_high")},
                          "held_with_graph_gib": round(held / GiB, 3)})
    def graph_share(self) -> None:
        """Graph replays pass the launch gate: at a 0.5 share a replay loop gets half the card."""
        with self.broker():
            with CardSampler() as card_alone:
                alone = self.python(GRAPH_SHARE_CHILD, self.env(), str(self.args.seconds), "2")
            with CardSampler() as card_half:
                half = self.python(GRAPH_SHARE_CHILD, self.env(preload=True, TESSERA_GPU_REQUEST="0.5",
                                                               TESSERA_GPU_LIMIT="0.5", TESSERA_SHARE_ID="graph"),
                                   str(self.args.seconds), str(self.args.lead))
            stats = query_stats(self.control, timeout_s=10)["gpus"]
        share = next(iter(stats.values()))["shares"].get("graph", {})
        fraction = (half["iterations"] / half["seconds"]) / (alone["iterations"] / alone["seconds"])
        self.verdict("graphs: replayed graphs held to a 0.5 share", abs(fraction - 0.5) <= 0.05,
                     {"fraction": round(fraction, 3), "broker_window_used_s": share.get("window_used_s"),
                      "broker_window_s": share.get("window_s"), "card_alone": card_alone.summary,
                      "card_at_half": card_half.summary})

    # -- 3. the remote share on loopback ----------------------------------------------------
    def remote(self) -> None:
        nbytes = 256 * MiB
        cuda_lib = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "lib64"
        ld_path = ":".join(filter(None, [str(cuda_lib), os.environ.get("LD_LIBRARY_PATH")]))
        local = self.run([str(PROGS / "remote_prog"), str(nbytes)], self.env(LD_LIBRARY_PATH=ld_path))
        secret = secrets.token_hex(32).encode()
        (self.tmp / "secret").write_bytes(secret)
        port_file = self.tmp / "remote.port"
        with self.broker() as sock:
            env = self.env(TESSERA_BROKER_SOCKET=str(sock), TESSERA_LOG_LEVEL="warn")
            server = subprocess.Popen(
                [str(BUILD / "remote" / "tessera-remote-server"), "--listen", "127.0.0.1:0", "--port-file",
                 str(port_file), "--secret-file", str(self.tmp / "secret"), "--worker",
                 str(BUILD / "remote" / "tessera-remote-worker"), "--preload", str(LIBRARY), "--gpu", self.uuid,
                 "--budget-dir", str(self.tmp)], env=env, start_new_session=True)
            try:
                for _ in range(400):
                    if port_file.exists() and port_file.read_text().strip():
                        break
                    time.sleep(0.02)
                token = issue(secret, ShareTerms("gpu-check", self.uuid, 8 * GiB, 1.0, 1.0), ttl_s=3600)
                # the token's share, for the server's workers (in the server's session)
                self.agent_terms("gpu-check", self.uuid, 1.0, 1.0, "low", session=server.pid)
                address = f"127.0.0.1:{port_file.read_text().strip()}"
                renv = self.env(LD_LIBRARY_PATH=str(CLIENT), TESSERA_REMOTE_SERVER=address, TESSERA_REMOTE_TOKEN=token)
                remote = self.run([str(PROGS / "remote_prog"), str(nbytes)], renv)
            finally:
                os.killpg(server.pid, signal.SIGTERM)
                server.wait(10)
        self.verdict("remote: a CUDA C program's results through the client libraries equal the local run's",
                     remote.get("hash") == local.get("hash") and bool(local.get("hash")),
                     {"local_hash": local.get("hash"), "remote_hash": remote.get("hash"),
                      "local_sum": local.get("sum"), "remote_sum": remote.get("sum")})
        raw = self.raw_tcp(nbytes)
        ratio = float(raw["recv_s"]) / float(remote["dtoh_s"])
        self.verdict("remote: device-to-host copies over loopback against raw TCP", ratio >= 0.5,
                     {"bytes": nbytes, "remote_dtoh_GBps": round(nbytes / 1e9 / float(remote["dtoh_s"]), 2),
                      "remote_htod_GBps": round(nbytes / 1e9 / float(remote["htod_s"]), 2),
                      "raw_tcp_GBps": round(nbytes / 1e9 / float(raw["recv_s"]), 2),
                      "local_dtoh_GBps": round(nbytes / 1e9 / float(local["dtoh_s"]), 2),
                      "ratio_to_raw_tcp": round(ratio, 3)})

    def raw_tcp(self, nbytes: int) -> dict[str, str]:
        port_file = self.tmp / "raw.port"
        server = subprocess.Popen([str(PROGS / "tcp_raw"), "serve", "127.0.0.1", str(port_file)])
        try:
            for _ in range(400):
                if port_file.exists() and port_file.read_text().strip():
                    break
                time.sleep(0.02)
            return self.run([str(PROGS / "tcp_raw"), "send", f"127.0.0.1:{port_file.read_text().strip()}",
                             str(nbytes), "3"], self.env())
        finally:
            server.wait(60)

    # -- 4. overhead --------------------------------------------------------------------------
    def overhead(self) -> None:
        with self.broker():
            hooked_env = {"TESSERA_GPU_REQUEST": "1.0", "TESSERA_GPU_MEMORY_LIMIT": "16Gi",
                          "TESSERA_SHARE_ID": "overhead"}
            for name, code, key, limit in [("tiny-kernel launch loop", TINY_CHILD, "us_per_launch", 0.01),
                                           ("small CNN training step", CNN_CHILD, "ms_per_step", 0.03)]:
                plain, hooked = [], []
                for _ in range(2):  # alternated, best of each: the card's clocks drift between runs
                    plain.append(self.python(code, self.env())[key])
                    hooked.append(self.python(code, self.env(preload=True, **hooked_env))[key])
                slowdown = min(hooked) / min(plain) - 1
                self.verdict(f"overhead: {name}", slowdown < limit,
                             {f"{key}_plain": round(min(plain), 4), f"{key}_library": round(min(hooked), 4),
                              "slowdown": round(slowdown, 4), "target": f"< {limit:.0%}"})

    # -- 5. shares ----------------------------------------------------------------------------
    def matmul_alone(self) -> float:
        if "matmul_alone_iterations_per_s" not in self.results:
            r = self.python(MATMUL_CHILD, self.env(), str(self.args.seconds), str(time.time() + 1), "10", "0", "2")
            self.results["matmul_alone_iterations_per_s"] = round(r["iterations"] / r["seconds"], 1)
        return self.results["matmul_alone_iterations_per_s"]

    def together(self, terms: list[tuple[str, str, str, str, int, int]], lead: float) -> list[dict]:
        """Matmul loops as (name, request, limit, priority, burst, pause_ms), started at one instant."""
        seconds = self.args.seconds
        start_at = str(time.time() + 10)  # every process warmed up before the common start
        procs = [self.spawn(MATMUL_CHILD, self.env(preload=True, TESSERA_SHARE_ID=f"check-{name}",
                                                   TESSERA_GPU_REQUEST=req, TESSERA_GPU_LIMIT=lim,
                                                   TESSERA_PRIORITY=prio), str(seconds), start_at, str(burst),
                            str(pause_ms), str(lead))
                 for name, req, lim, prio, burst, pause_ms in terms]
        return [self.collect(p, seconds + lead + 120) for p in procs]

    def shares(self) -> None:
        rate_alone = self.matmul_alone()

        def fraction(r: dict) -> float:
            return r["iterations"] / r["seconds"] / rate_alone

        def together(terms: list[tuple[str, str, str, str, int, int]]) -> list[dict]:
            return self.together(terms, self.args.lead)

        with self.broker():
            a, b = together([("a", "0.3", "0.3", "normal", 10, 0), ("b", "0.7", "0.7", "normal", 10, 0)])
            fa, fb = fraction(a), fraction(b)
            self.verdict("shares: 0.3 / 0.7 at their limits", abs(fa - 0.3) <= 0.03 and abs(fb - 0.7) <= 0.03,
                         {"fraction_a": round(fa, 3), "fraction_b": round(fb, 3),
                          "alone_iterations_per_s": round(rate_alone, 1)})
            _, busy = together([("idle", "0.3", "1.0", "normal", 0, 0), ("busy", "0.7", "1.0", "normal", 10, 0)])
            self.verdict("shares: elastic 0.7 (may burst to 1.0) beside an idle share", fraction(busy) >= 0.9,
                         {"fraction": round(fraction(busy), 3), "target": ">= 0.9"})
            _, held = together([("idle", "0.3", "0.7", "normal", 0, 0), ("busy", "0.3", "0.7", "normal", 10, 0)])
            self.verdict("shares: 0.3 limited to 0.7 beside an idle share", abs(fraction(held) - 0.7) <= 0.03,
                         {"fraction": round(fraction(held), 3), "target": "0.7 +- 0.03"})

    def priority(self) -> None:
        """A bursty high-priority job (bursts of ~90 ms of matmuls, 100 ms apart) beside a busy
        low-priority one, against itself alone; then with ~4 ms bursts, where the hand-off shows."""
        rate_alone = self.matmul_alone()
        with self.broker():
            for label, burst, pause, gate in [("~90 ms bursts", 400, 100, 0.95), ("~4 ms bursts", 20, 50, None)]:
                solo = self.together([("high", "0.5", "1.0", "high", burst, pause)], 2)[0]
                high, low = self.together([("high", "0.5", "1.0", "high", burst, pause),
                                           ("low", "0.5", "1.0", "low", 10, 0)], 2)
                per_solo, per_shared = solo["busy_s"] / solo["bursts"], high["busy_s"] / high["bursts"]
                kept = per_solo / per_shared
                name = f"shares: high priority beside a busy low-priority job, {label}"
                detail = {"burst_ms_alone": round(1e3 * per_solo, 2), "burst_ms_beside_low": round(1e3 * per_shared, 2),
                          "speed_kept": round(kept, 3),
                          "low_fraction": round(low["iterations"] / low["seconds"] / rate_alone, 3),
                          "target": f">= {gate}" if gate else "measured, no target (hand-off latency)",
                          "broker_revocations": next(iter(query_stats(self.control, timeout_s=10)["gpus"].values()))
                          ["revocations"]}
                if gate:
                    self.verdict(name, kept >= gate, detail)
                else:
                    self.results["checks"][name] = {"pass": True, **detail}
                    print(f"INFO {name}: {json.dumps(detail)}", flush=True)


def driver_library() -> str | None:
    """What to link the driver-API probe against: the toolkit's stub, else the installed driver."""
    cuda = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    found = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    listed = [line.rsplit("=> ", 1)[-1] for line in found.splitlines() if "libcuda.so.1 " in line]
    for path in [cuda / "lib64" / "stubs" / "libcuda.so", cuda / "targets" / "x86_64-linux" / "lib" / "stubs" /
                 "libcuda.so", *map(Path, listed), Path("/usr/local/nvidia/lib64/libcuda.so.1"),
                 Path("/usr/lib/x86_64-linux-gnu/libcuda.so.1")]:
        if path.exists():
            return str(path)
    return None


def render(results: dict) -> str:
    m = results.get("machine", {})
    lines = ["# The preload library, the broker and the remote share on a real GPU", "",
             f"Command: `{results['command']}`", ""]
    if m:
        lines += [f"GPU: {m['gpu']} ({m['memory']}), driver {m['driver']}, {m['nvcc']}, PyTorch {m['torch']} "
                  f"(CUDA {m['torch_cuda']}), {m['cpu_count']} CPUs, kernel {m['kernel']}.", ""]
    lines += ["| check | result | numbers |", "| --- | --- | --- |"]
    for name, r in results["checks"].items():
        numbers = ", ".join(f"{k} {v}" for k, v in r.items() if k != "pass")
        lines.append(f"| {name} | {'PASS' if r['pass'] else '**FAIL**'} | {numbers} |")
    lines += ["", f"{results.get('failures', 0)} failure(s) in {results.get('elapsed_s')} s.", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each share measurement")
    parser.add_argument("--lead", type=float, default=10.0,
                        help="seconds a share runs before it is measured (the broker's window: 10 s)")
    parser.add_argument("--only", default=",".join(SECTIONS), help="sections to run, comma-separated")
    parser.add_argument("--budget-s", type=float, default=1e9,
                        help="start no section after this many seconds (those left are reported as not run)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "preload" / "gpu_check.json")
    args = parser.parse_args()
    if os.getsid(0) == 0:
        # the broker ties the checks' processes to their shares by session; a container whose session
        # leader is outside its PID namespace gives none (0), so the check starts its own
        with contextlib.suppress(PermissionError):  # a group leader cannot (and is seen by its shell)
            os.setsid()
    wanted = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(wanted) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s) {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
    make = ["make", "-s", "-j", str(os.cpu_count() or 2), "-C", str(REPO / "preload"), "gpu-check-bins"]
    driver = driver_library()
    subprocess.run([*make, f"DRIVER={driver}"] if driver else make, check=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        check = Check(args, Path(tmp_name))
        check.describe()
        for section in wanted:
            if time.monotonic() - check.started > args.budget_s:
                check.verdict(f"{section}: not run", False, {"why": f"past --budget-s {args.budget_s:g}"})
                continue
            try:
                getattr(check, section)()
            except Exception as exc:  # one broken section must not lose the others' numbers
                check.verdict(f"{section}: error", False, {"error": f"{type(exc).__name__}: {exc}"[-2000:]})
            check.write()
        check.write()
    print(f"{check.failures} failure(s); results in {args.out}")
    return check.failures


if __name__ == "__main__":
    sys.exit(main())
