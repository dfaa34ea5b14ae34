"""Token round trip: ACQUIRE to GRANT through the broker, one client alone on its GPU.

    .venv/bin/python bench/preload/token_roundtrip.py [--tokens N]

The client is Python here; the library's C client adds less than Python does. The baseline is the
round trip of a QUERY (a bare request/answer on the same socket, no scheduling), so the ratio shows
what the scheduling itself costs.
"""

from __future__ import annotations

import argparse
import json
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=5000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "broker.sock"
        broker = Broker(path)
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(path))
                s.sendall(b"HELLO v=1 share=bench gpu=g pid=1 request=1.0 limit=1.0 priority=low\n")
                s.recv(100)
                grants = roundtrips(s, b"ACQUIRE used_us=10 idle=1\n", args.tokens)
                s.sendall(b"RELEASE used_us=10 idle=1\n")
                queries = roundtrips(s, b"QUERY\n", args.tokens)
        finally:
            broker.stop()
    rows = []
    for name, values in [("ACQUIRE -> GRANT", grants), ("QUERY -> STATS (baseline)", queries)]:
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
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "token_roundtrip.md").write_text("\n".join(lines))
    record = {"command": command_line(), "rows": rows}
    (RESULTS / "token_roundtrip.json").write_text(json.dumps(record, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
