"""Remote GPU shares: what the network costs, over loopback and over a veth link between two network
namespaces (root only; skipped with the reason otherwise).

    .venv/bin/python bench/remote/remote_bench.py [--iters N] [--copy-mib M] [--repeats R] [--loop N]

* round trip of an empty launch (launch + synchronize), an empty launch pipelined (one-way messages),
  and a small synchronous call (cuMemGetInfo), remote against the same program on the local fake driver;
* host↔device copies of M MiB (default 64) as a ratio of raw TCP throughput on the same link, measured
  in the same run with the same socket options (target ≥ 0.8);
* a toy loop (copy M MiB in, N launches of 50 µs kernels, copy out) remote against local.

Every figure is the best of R runs (the others measure the neighbours on a shared machine). The GPU
host is the fake driver with the preload library, as in tests/remote. Results go to
bench/results/remote/.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from wire.share_tokens import ShareTerms, issue  # noqa: E402

PRELOAD = REPO / "preload"
BUILD = PRELOAD / "build"
REMOTE = BUILD / "remote"
BENCH_BIN = BUILD / "bench-remote"
RESULTS = REPO / "bench" / "results" / "remote"
HERE = Path(__file__).resolve().parent
MiB = 1 << 20


def command_line() -> str:
    return " ".join(["python", *[str(Path(a).resolve().relative_to(REPO)) if Path(a).exists() else a
                                 for a in sys.argv]])


def build() -> None:
    subprocess.run(["make", "-s", "-C", str(PRELOAD), "remote-test-bins"], check=True)
    BENCH_BIN.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-I/usr/local/cuda/include", "-o", str(BENCH_BIN / "rpc_bench"),
                    str(HERE / "rpc_bench.c"), f"-L{REMOTE / 'client'}", "-lcuda"], check=True)
    subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-o", str(BENCH_BIN / "tcp_raw"), str(HERE / "tcp_raw.c")],
                   check=True)


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "FAKE_", "LD_", "CUDA_"))}


def kv(text: str) -> dict[str, float]:
    out = {}
    for line in text.split():
        key, _, value = line.partition("=")
        with contextlib.suppress(ValueError):
            out[key] = float(value)
    return out


class Link:
    """Loopback, or a veth pair between a GPU namespace and a client namespace."""

    def __init__(self, kind: str, rate: str | None = None) -> None:
        self.kind = kind
        self.gpu_ns = self.client_ns = None
        self.gpu_ip = self.client_ip = "127.0.0.1"
        if kind.startswith("veth"):
            tag = str(os.getpid() % 100000)
            self.gpu_ns, self.client_ns = f"tsrb-gpu-{tag}", f"tsrb-cli-{tag}"
            self.gpu_ip, self.client_ip = "10.211.9.1", "10.211.9.2"
            steps = [["netns", "add", self.gpu_ns], ["netns", "add", self.client_ns],
                     ["link", "add", f"bg{tag}", "type", "veth", "peer", "name", f"bc{tag}"],
                     ["link", "set", f"bg{tag}", "netns", self.gpu_ns],
                     ["link", "set", f"bc{tag}", "netns", self.client_ns],
                     ["-n", self.gpu_ns, "addr", "add", f"{self.gpu_ip}/30", "dev", f"bg{tag}"],
                     ["-n", self.client_ns, "addr", "add", f"{self.client_ip}/30", "dev", f"bc{tag}"],
                     ["-n", self.gpu_ns, "link", "set", f"bg{tag}", "up"],
                     ["-n", self.client_ns, "link", "set", f"bc{tag}", "up"],
                     ["-n", self.gpu_ns, "link", "set", "lo", "up"]]
            if rate:  # a link slower than this machine copies, as a NIC is: each end sends at most `rate`
                steps += [["-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "1mb",
                           "latency", "100ms"] for ns, dev in ((self.gpu_ns, f"bg{tag}"), (self.client_ns, f"bc{tag}"))]
            for step in steps:
                tool = "tc" if "qdisc" in step else "ip"
                r = subprocess.run([tool, *step], capture_output=True, text=True)
                if r.returncode != 0:
                    self.close()
                    raise RuntimeError(f"cannot build the veth link ({' '.join(step)}): {r.stderr.strip()}")

    def on_gpu(self, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.gpu_ns, *cmd] if self.gpu_ns else cmd

    def on_client(self, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.client_ns, *cmd] if self.client_ns else cmd

    def close(self) -> None:
        for ns in (self.gpu_ns, self.client_ns):
            if ns:
                subprocess.run(["ip", "netns", "delete", ns], capture_output=True)


class GpuHost:
    def __init__(self, link: Link, root: Path) -> None:
        self.root = root
        self.secret = secrets.token_hex(32).encode()
        (root / "secret").write_bytes(self.secret)
        env = clean_env()
        env.update(LD_LIBRARY_PATH=str(BUILD / "test"), FAKE_CUDA_STATE_DIR=str(root),
                   TESSERA_BROKER_SOCKET=str(root / "absent.sock"), TESSERA_LOG_LEVEL="error")
        port_file = root / "port"
        cmd = [str(REMOTE / "tessera-remote-server"), "--listen", f"{link.gpu_ip}:0", "--port-file", str(port_file),
               "--secret-file", str(root / "secret"), "--worker", str(REMOTE / "tessera-remote-worker"),
               "--preload", str(BUILD / "libtessera_preload.so"), "--budget-dir", str(root), "--gpu", "GPU-fake-0"]
        self.proc = subprocess.Popen(link.on_gpu(cmd), env=env, stderr=subprocess.DEVNULL, start_new_session=True)
        for _ in range(400):
            if port_file.exists():
                break
            time.sleep(0.02)
        self.address = f"{link.gpu_ip}:{int(port_file.read_text())}"

    def token(self) -> str:
        return issue(self.secret, ShareTerms("bench", "GPU-fake-0", 4 << 30, 1.0, 1.0))

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(10)


def remote_env(host: GpuHost) -> dict[str, str]:
    env = clean_env()
    env.update(LD_LIBRARY_PATH=str(REMOTE / "client"), TESSERA_REMOTE_SERVER=host.address,
               TESSERA_REMOTE_TOKEN=host.token())
    return env


def local_env(root: Path) -> dict[str, str]:
    """The same share terms on the fake driver in this process's node: the local baseline."""
    env = clean_env()
    env.update(LD_LIBRARY_PATH=str(BUILD / "test"), FAKE_CUDA_STATE_DIR=str(root),
               LD_PRELOAD=str(BUILD / "libtessera_preload.so"), TESSERA_GPU_MEMORY_LIMIT="4Gi",
               TESSERA_GPU_REQUEST="1.0", TESSERA_GPU_LIMIT="1.0", TESSERA_BUDGET_PATH=str(root / "local-budget"),
               TESSERA_BROKER_SOCKET=str(root / "absent.sock"), TESSERA_LOG_LEVEL="error")
    return env


def run(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stdout}{r.stderr}")
    return kv(r.stdout)


def raw_tcp(link: Link, root: Path, nbytes: int, repeats: int) -> dict[str, float]:
    port_file = root / "raw.port"
    port_file.unlink(missing_ok=True)
    server = subprocess.Popen(link.on_gpu([str(BENCH_BIN / "tcp_raw"), "serve", link.gpu_ip, str(port_file)]))
    for _ in range(400):
        if port_file.exists() and port_file.read_text().strip():
            break
        time.sleep(0.02)
    try:
        return run(link.on_client([str(BENCH_BIN / "tcp_raw"), "send", f"{link.gpu_ip}:{port_file.read_text().strip()}",
                                   str(nbytes), str(repeats)]), clean_env())
    finally:
        server.wait(60)


LINKS = {"loopback": None, "veth": None, "veth 4 Gbit/s": "4gbit"}


def measure(kind: str, args: argparse.Namespace) -> dict:
    image = str(REMOTE / "test" / "kernels.cubin")
    link = Link(kind, LINKS[kind])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            host = GpuHost(link, root)
            try:
                renv, lenv = remote_env(host), local_env(root)
                best: dict[str, float] = {}

                def keep(prefix: str, values: dict[str, float]) -> None:
                    for k, v in values.items():
                        best[f"{prefix}{k}"] = min(v, best.get(f"{prefix}{k}", v))

                nbytes = args.copy_mib * MiB
                for _ in range(args.repeats):
                    keep("remote_", run(link.on_client([str(BENCH_BIN / "rpc_bench"), image, "latency",
                                                        str(args.iters)]), renv))
                    keep("local_", run([str(BENCH_BIN / "rpc_bench"), image, "latency", str(args.iters)], lenv))
                    keep("remote_", run(link.on_client([str(BENCH_BIN / "rpc_bench"), image, "copy", str(nbytes),
                                                        "3"]), renv))
                    keep("raw_", raw_tcp(link, root, nbytes, 3))
                    loop = ["--bytes", str(nbytes), "--loop", str(args.loop), "--kernel-us", "50"]
                    keep("remote_", run(link.on_client([str(REMOTE / "test" / "drv_prog"), image, *loop]), renv))
                    keep("local_", run([str(REMOTE / "test" / "drv_prog"), image, *loop], lenv))
            finally:
                host.stop()
    finally:
        link.close()
    gbps = nbytes / 1e9
    return {
        "link": kind,
        "empty_launch_round_trip_us": round(best["remote_launch_sync_us"], 1),
        "empty_launch_round_trip_local_us": round(best["local_launch_sync_us"], 2),
        "empty_launch_pipelined_us": round(best["remote_launch_us"], 2),
        "empty_launch_pipelined_local_us": round(best["local_launch_us"], 3),
        "small_sync_call_us": round(best["remote_meminfo_us"], 1),
        "small_sync_call_local_us": round(best["local_meminfo_us"], 3),
        "htod_GBps": round(gbps / best["remote_htod_s"], 2),
        "dtoh_GBps": round(gbps / best["remote_dtoh_s"], 2),
        "raw_tcp_send_GBps": round(gbps / best["raw_send_s"], 2),
        "raw_tcp_recv_GBps": round(gbps / best["raw_recv_s"], 2),
        "htod_ratio_to_raw_tcp": round(best["raw_send_s"] / best["remote_htod_s"], 3),
        "dtoh_ratio_to_raw_tcp": round(best["raw_recv_s"] / best["remote_dtoh_s"], 3),
        "toy_loop_remote_s": round(best["remote_loop_s"], 4),
        "toy_loop_local_s": round(best["local_loop_s"], 4),
        "toy_loop_ratio": round(best["remote_loop_s"] / best["local_loop_s"], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--copy-mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--loop", type=int, default=1000)
    args = parser.parse_args()
    build()
    rows, skipped = [], []
    for kind in LINKS:
        if kind != "loopback" and os.geteuid() != 0:
            skipped.append(f"{kind}: network namespaces need root")
            continue
        try:
            rows.append(measure(kind, args))
        except RuntimeError as exc:
            if kind == "loopback":
                raise
            skipped.append(f"{kind}: {exc}")
    lines = [
        "# Remote GPU shares: round trips, copy throughput, a toy loop",
        "",
        f"Command: `{command_line()}`",
        "",
        "GPU host: the fake driver with the preload library (share 1.0, 4 GiB cap), as in tests/remote; "
        f"best of {args.repeats} runs each. Round trips: {args.iters} calls. Copies: {args.copy_mib} MiB, "
        "ratio = raw TCP time on the same link (same socket options, measured in this run) / copy time "
        "(target ≥ 0.8). On loopback and a plain veth pair TCP itself is this machine's CPU copying, and the "
        "fake GPU's device copy is one more CPU copy (a real GPU's is DMA), so there the copies compete with "
        "the network for the same cores; the 4 Gbit/s veth (tc tbf on each end) is a link slower than the "
        f"CPU, as a real NIC is. Toy loop: copy {args.copy_mib} MiB in, {args.loop} launches of 50 µs kernels, "
        "copy out; "
        "local = the same program on the fake driver in the client's place.",
        "",
        "| link | launch+sync round trip µs (local) | empty launch, pipelined µs (local) | cuMemGetInfo µs (local) "
        "| HtoD GB/s (raw TCP) | ratio | DtoH GB/s (raw TCP) | ratio | toy loop s remote / local | ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *[f"| {r['link']} | {r['empty_launch_round_trip_us']} ({r['empty_launch_round_trip_local_us']}) "
          f"| {r['empty_launch_pipelined_us']} ({r['empty_launch_pipelined_local_us']}) "
          f"| {r['small_sync_call_us']} ({r['small_sync_call_local_us']}) "
          f"| {r['htod_GBps']} ({r['raw_tcp_send_GBps']}) | {r['htod_ratio_to_raw_tcp']} "
          f"| {r['dtoh_GBps']} ({r['raw_tcp_recv_GBps']}) | {r['dtoh_ratio_to_raw_tcp']} "
          f"| {r['toy_loop_remote_s']} / {r['toy_loop_local_s']} | {r['toy_loop_ratio']} |" for r in rows],
        "",
        *[f"Skipped: {s}" for s in skipped],
        "",
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "remote.md").write_text("\n".join(lines))
    (RESULTS / "remote.json").write_text(json.dumps({"command": command_line(), "rows": rows, "skipped": skipped},
                                                    indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
