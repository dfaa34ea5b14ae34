"""Link probes: how good the network is from this node to the GPU nodes whose remote servers could
serve it (preload/remote; the probe is answered by the server's listener, see PROTOCOL.md).

A probe is bounded on both ends (at most 32 round trips and 16 MiB, a deadline for the whole probe) and
the prober refreshes each link slowly, so probing never competes with the workloads it is measuring
for. The results (`LinkQuality`) are what network-aware placement scores remote candidates with
(`scheduler.core.remote`).

    python -m agents.remote.probe HOST:PORT [--pings N] [--mib M]    prints one JSON line
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

WIRE_MAGIC = 0x31525354
OP_PROBE = 28  # preload/remote/wire.h
MAX_PINGS = 32
MAX_BYTES = 16 << 20
_REQ = struct.Struct("<IIQ")
_PROBE = struct.Struct("<IIIIQ")
_REP = struct.Struct("<iiIIQ")


class ProbeError(OSError):
    """The GPU node did not answer a probe as it should."""


@dataclass(frozen=True)
class LinkQuality:
    """One measured link: median round trip and throughput from the GPU node to this one."""

    gpu_node: str
    rtt_ms: float
    bandwidth_mbps: float  # megabits per second
    measured_at: float


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ProbeError("the GPU node closed the probe early")
        got += k
    return bytes(buf)


def probe(address: str, gpu_node: str = "", pings: int = 8, nbytes: int = 4 << 20, timeout_s: float = 5.0,
          clock: Callable[[], float] = time.monotonic) -> LinkQuality:
    """Measures the link to the remote server at ``host:port``; :class:`ProbeError` when it cannot."""
    if not 1 <= pings <= MAX_PINGS:
        raise ValueError(f"pings must be 1..{MAX_PINGS}")
    if not 1 <= nbytes <= MAX_BYTES:
        raise ValueError(f"bytes must be 1..{MAX_BYTES}")
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{address!r} is not host:port")
    deadline = clock() + timeout_s
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            body = _PROBE.pack(WIRE_MAGIC, 1, pings, 0, nbytes)
            sock.sendall(_REQ.pack(OP_PROBE, len(body), 0) + body)
            result, _deferred, length, _pad, bulk = _REP.unpack(_recv_exact(sock, _REP.size))
            if result != 0:
                raise ProbeError(f"probe refused: {_recv_exact(sock, length).decode(errors='replace')}")
            if bulk != nbytes:
                raise ProbeError("the GPU node offered a different probe")
            rtts = []
            for i in range(pings):
                sock.settimeout(max(0.05, deadline - clock()))
                t0 = clock()
                sock.sendall(struct.pack("<Q", i))
                if struct.unpack("<Q", _recv_exact(sock, 8))[0] != i:
                    raise ProbeError("the GPU node echoed the wrong ping")
                rtts.append(clock() - t0)
            t0 = clock()
            left = nbytes
            while left:
                sock.settimeout(max(0.05, deadline - clock()))
                chunk = sock.recv(min(left, 1 << 20))
                if not chunk:
                    raise ProbeError("the GPU node closed the probe early")
                left -= len(chunk)
            elapsed = max(clock() - t0, 1e-6)
    except TimeoutError as exc:
        raise ProbeError(f"probe of {address} took longer than {timeout_s} s") from exc
    except OSError as exc:
        if isinstance(exc, ProbeError):
            raise
        raise ProbeError(f"cannot probe {address}: {exc}") from exc
    return LinkQuality(gpu_node or host, round(statistics.median(rtts) * 1000, 3),
                       round(nbytes * 8 / elapsed / 1e6, 1), time.time())


class LinkTable:
    """The links from this node to the GPU nodes that may serve it, each refreshed at most once per
    ``interval_s`` (with jitter, so a fleet of agents does not probe in step), one probe per call of
    :meth:`refresh` at most: a node agent calls it from its slow loop."""

    def __init__(self, servers: dict[str, str], interval_s: float = 600.0, prober=probe,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None) -> None:
        self.fixed = dict(servers)  # given on the command line: always probed, never replaced
        self.servers = dict(servers)  # GPU node name → host:port of its remote server
        self.interval_s = interval_s
        self.prober = prober
        self.clock = clock
        self.rng = rng or random.Random()
        self.links: dict[str, LinkQuality] = {}
        self.errors: dict[str, str] = {}
        self._due = {node: clock() + self.rng.uniform(0, interval_s / 10) for node in self.servers}
        # offer() runs on the agent's event loop, refresh() in a worker thread.
        self._lock = threading.Lock()

    def offer(self, servers: dict[str, str]) -> bool:
        """The servers the portal names (its welcome): they replace the ones it named before; the
        command line's stay and win. A new server is probed soon; a server no longer named loses
        its link. Returns True when a link was dropped (the portal must hear the smaller set)."""
        with self._lock:
            wanted = {**servers, **self.fixed}
            dropped = False
            for node in list(self.servers):
                if node not in wanted:
                    del self.servers[node]
                    self._due.pop(node, None)
                    self.errors.pop(node, None)
                    dropped = self.links.pop(node, None) is not None or dropped
            for node, address in wanted.items():
                if self.servers.get(node) != address:
                    self.servers[node] = address
                    self._due[node] = self.clock() + self.rng.uniform(0, self.interval_s / 10)
            return dropped

    def refresh(self) -> str | None:
        """Probes the most overdue GPU node, if any is due; returns its name."""
        with self._lock:
            now = self.clock()
            due = [node for node, when in self._due.items() if when <= now]
            if not due:
                return None
            node = min(due, key=self._due.__getitem__)
            address = self.servers[node]
        try:  # outside the lock: a probe takes seconds
            quality, error = self.prober(address, gpu_node=node), None
        except (ProbeError, ValueError) as exc:
            quality, error = None, str(exc)
        with self._lock:
            if self.servers.get(node) != address:
                return node  # replaced or dropped meanwhile: this measure is of nothing we probe now
            if quality is not None:
                self.links[node] = quality
                self.errors.pop(node, None)
            else:
                self.links.pop(node, None)  # a link that does not answer is not a candidate
                self.errors[node] = error or ""
            self._due[node] = now + self.interval_s * self.rng.uniform(0.9, 1.1)
        return node

    def report(self) -> list[dict]:
        return [asdict(link) for link in sorted(self.links.values(), key=lambda link: link.gpu_node)]

    def message(self) -> str:
        """The wire `links` message (wire/PROTOCOL.md 4.3) for the portal: every link measured now,
        the complete set (a link that stopped answering is left out, so the portal drops it)."""
        from wire.agent_portal import MAX_LINKS, Links, encode

        with self._lock:
            measured = sorted(self.links.values(), key=lambda q: q.gpu_node)
        links = [{"gpu_node": q.gpu_node, "rtt_ms": max(q.rtt_ms, 0.001), "bandwidth_mbps": q.bandwidth_mbps,
                  "ts_ms": int(q.measured_at * 1000)} for q in measured]
        return encode(Links.model_validate({"v": 1, "type": "links", "links": links[:MAX_LINKS]}, strict=False))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address")
    parser.add_argument("--pings", type=int, default=8)
    parser.add_argument("--mib", type=float, default=4)
    args = parser.parse_args(argv)
    try:
        link = probe(args.address, pings=args.pings, nbytes=int(args.mib * (1 << 20)))
    except (ProbeError, ValueError) as exc:
        print(f"probe: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(link)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
