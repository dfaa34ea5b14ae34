"""The remote server under trickling connections: legitimate clients' hellos with nobody else
connected, then beside 2 x max-clients connections that trickle their hellos a byte a second from 32
addresses (reconnecting whenever the server cuts one), on this build's server and, in the same run,
on the server before the hello deadline and the unauthenticated caps (built from git REV).

    .venv/bin/python bench/remote/admission_bench.py [--hellos N] [--rev REV]

A legitimate hello is a connection, a hello with a valid token and the worker's reply (a worker on
the fake driver, as in tests/remote). Results go to bench/results/remote/admission.{json,md}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.remote.conftest import PRELOAD, REMOTE, GpuHost, hello_bytes, make, read_reply  # noqa: E402

RESULTS = REPO / "bench" / "results" / "remote"
MAX_CLIENTS = 64
TRICKLERS = 2 * MAX_CLIENTS
ADDRESSES = 32


def build_old_server(rev: str, out: Path) -> Path:
    src = out / "server_old.c"
    src.write_text(subprocess.run(["git", "show", f"{rev}:preload/remote/server.c"], cwd=REPO, check=True,
                                  capture_output=True, text=True).stdout)
    binary = out / "tessera-remote-server-old"
    subprocess.run(["cc", "-O2", "-std=gnu11", "-D_GNU_SOURCE", "-I/usr/local/cuda/include", "-Icommon", "-Iremote",
                    "-o", str(binary), str(src), "remote/token.c", "remote/sha256.c", "remote/wire.c",
                    "common/logline.c", "-lm"], cwd=PRELOAD, check=True)
    return binary


class Tricklers:
    """TRICKLERS connections sending a hello a byte a second, each replaced when the server cuts it."""

    def __init__(self, port: int, hello: bytes) -> None:
        self.port, self.hello = port, hello
        self.cut = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def connect(self, i: int) -> tuple[socket.socket, int]:
        s = socket.socket()
        s.bind((f"127.0.1.{1 + i % ADDRESSES}", 0))
        s.connect(("127.0.0.1", self.port))
        return s, 0

    def run(self) -> None:
        conns = [self.connect(i) for i in range(TRICKLERS)]
        while not self.stop.wait(1.0):
            for i, (s, sent) in enumerate(conns):
                try:
                    s.sendall(self.hello[sent % (len(self.hello) - 1):][:1])  # never the last byte
                    conns[i] = (s, sent + 1)
                except OSError:
                    s.close()
                    self.cut += 1
                    with contextlib.suppress(OSError):
                        conns[i] = self.connect(i)
        for s, _ in conns:
            s.close()

    def __enter__(self) -> Tricklers:
        self.thread.start()
        time.sleep(3)  # all connected and trickling
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def legitimate_hellos(host: GpuHost, n: int) -> dict:
    latencies, refused = [], []
    for _ in range(n):
        start = time.perf_counter()
        try:
            with socket.create_connection(("127.0.0.1", host.port), timeout=30) as s:
                s.sendall(hello_bytes(host.token()))
                result, why = read_reply(s)
        except (OSError, AssertionError) as exc:
            refused.append(str(exc))
            continue
        if result == 0:
            latencies.append((time.perf_counter() - start) * 1000)
        else:
            refused.append(why.decode(errors="replace"))
        time.sleep(0.02)  # its worker exits before the next
    return {"served": len(latencies), "refused": len(refused), "first_refusal": refused[0] if refused else None,
            "median_ms": round(statistics.median(latencies), 2) if latencies else None,
            "max_ms": round(max(latencies), 2) if latencies else None}


def measure(server_bin: Path, root: Path, n: int) -> dict:
    host = GpuHost(root, secrets.token_hex(32).encode(), server_bin=server_bin,
                   server_args=("--max-clients", str(MAX_CLIENTS))).start()
    try:
        alone = legitimate_hellos(host, n)
        with Tricklers(host.port, hello_bytes(host.token())) as t:
            crowded = legitimate_hellos(host, n)
            time.sleep(12)  # past the hello deadline: how many the server cut
        return {"alone": alone, "beside_tricklers": crowded, "trickling_connections_cut": t.cut}
    finally:
        host.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hellos", type=int, default=50)
    p.add_argument("--rev", default="0505f26", help="the commit whose server is the baseline")
    args = p.parse_args()
    make("remote-test-bins")
    with tempfile.TemporaryDirectory() as tmp:
        old = build_old_server(args.rev, Path(tmp))
        (Path(tmp) / "new").mkdir()
        (Path(tmp) / "old").mkdir()
        results = {"command": " ".join(["bench/remote/admission_bench.py", *sys.argv[1:]]),
                   "max_clients": MAX_CLIENTS, "tricklers": TRICKLERS, "addresses": ADDRESSES,
                   "this_build": measure(REMOTE / "tessera-remote-server", Path(tmp) / "new", args.hellos),
                   f"before ({args.rev})": measure(old, Path(tmp) / "old", args.hellos)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "admission.json").write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
