"""Token round trip: ACQUIRE to GRANT through the broker, one client alone on its GPU.

    .venv/bin/python bench/preload/token_roundtrip.py [--tokens N]

The client is Python here; the library's C client adds less than Python does. The baseline is the
round trip of a QUERY (a bare request/answer on the agent's control socket, no scheduling), so the
ratio shows what the scheduling itself costs. Also: what a process's HELLO costs, the broker's
decision whether it may join its share (by session, and by pod cgroup as on Kubernetes).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

from common import RESULTS, Broker, command_line


def roundtrips(sock: socket.socket, message: bytes, n: int) -> list[float]:
    buf = b""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        sock.sendall(message)
        while b"\n" not in buf:
            buf += sock.recv(65536)
        _, _, buf = buf.partition(b"\n")
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def pct(values: list[float], p: float) -> float:
    return sorted(values)[min(len(values) - 1, int(p * len(values)))]


def hellos(path: Path, share: bytes, n: int) -> list[float]:
    """A new connection's HELLO to its OK each time: the broker's decision per process (terms looked
    up, the peer's credentials read, its session or cgroup matched), with connect and close."""
    out = []
    line = b"HELLO v=1 share=%s gpu=g pid=1 request=1.0 limit=1.0 priority=low\n" % share
    for _ in range(n):
        t0 = time.perf_counter()
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(path))
            s.sendall(line)
            answer = s.recv(100)
        out.append((time.perf_counter() - t0) * 1e6)
        assert answer.startswith(b"OK"), answer
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=5000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "broker.sock"
        broker = Broker(path)
        try:
            broker.define("bench", "g", 1.0, 1.0)
            with socket.socket(socket.AF_UNIX) as s, socket.socket(socket.AF_UNIX) as agent:
                s.connect(str(path))
                s.sendall(b"HELLO v=1 share=bench gpu=g pid=1 request=1.0 limit=1.0 priority=low\n")
                s.recv(100)
                grants = roundtrips(s, b"ACQUIRE used_us=10 idle=1\n", args.tokens)
                s.sendall(b"RELEASE used_us=10 idle=1\n")
                agent.connect(str(broker.control))  # telemetry is the agent's, on its own socket
                queries = roundtrips(agent, b"QUERY\n", args.tokens)
            by_session = hellos(path, b"bench", args.tokens)
        finally:
            broker.stop()
        # the same through the pod's cgroup, as on Kubernetes: this process's /proc/<pid>/cgroup under a
        # fixture proc root, named as the kubelet's systemd driver names it
        pod = "0f1d2c3b-4a5e-4f60-8a7b-9c0d1e2f3a4b"
        proc = Path(tmp) / "proc" / str(os.getpid())
        proc.mkdir(parents=True)
        (proc / "cgroup").write_text(f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                                     f"{pod.replace('-', '_')}.slice/cri-containerd-{'ab' * 32}.scope\n")
        broker = Broker(path, "--proc-root", str(Path(tmp) / "proc"), identity="cgroup")
        try:
            broker.define("bench", "g", 1.0, 1.0, pod_uid=pod)
            by_cgroup = hellos(path, b"bench", args.tokens)
        finally:
            broker.stop()
    rows = []
    for name, values in [("ACQUIRE -> GRANT", grants), ("QUERY -> STATS (baseline)", queries),
                         ("connect, HELLO -> OK, close (identity by session)", by_session),
                         ("connect, HELLO -> OK, close (identity by pod cgroup)", by_cgroup)]:
        rows.append({"exchange": name, "median_us": round(statistics.median(values), 1),
                     "p99_us": round(pct(values, 0.99), 1), "max_us": round(max(values), 1)})
    ratio = rows[0]["median_us"] / rows[1]["median_us"]
    lines = [
        "# Preload: token round trip through the broker",
        "",
        f"Command: `{command_line()}`",
        "",
        f"{args.tokens} exchanges each, one client on an otherwise idle GPU (Python client, Unix socket).",
        "",
        "| exchange | median µs | p99 µs | max µs |",
        "| --- | ---: | ---: | ---: |",
        *[f"| {r['exchange']} | {r['median_us']} | {r['p99_us']} | {r['max_us']} |" for r in rows],
        "",
        f"Grant / baseline median ratio: {ratio:.2f}",
        "",
        "A HELLO is answered only for a share the node's agent named (its control socket), to a process",
        "the kernel's peer credentials tie to it: its session, or the pod in its /proc/<pid>/cgroup. The",
        "HELLO rows are that decision per process, with the connection's setup and teardown.",
        "",
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "token_roundtrip.md").write_text("\n".join(lines))
    record = {"command": command_line(), "rows": rows}
    (RESULTS / "token_roundtrip.json").write_text(json.dumps(record, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
