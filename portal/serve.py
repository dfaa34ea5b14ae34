"""`python -m portal.serve [daphne's options] portal.asgi:application`: Daphne with a size limit
on WebSocket frames and messages, enforced by its WebSocket layer (autobahn) as a frame's header
arrives, before the payload is buffered. Daphne itself offers no such option, and a consumer only
sees a message once it is whole in memory: a client could make the server hold 128 MiB per frame.

The limit is settings.TESSERA_WS_MAX_MESSAGE_BYTES (default: the wire protocol's 1 MiB, the largest
message an agent may send; browsers send a few hundred bytes). Over it the connection is closed
with 1009.

Each serving process runs with the cyclic collector's young threshold raised (GC_YOUNG_THRESHOLD).

`--processes N` (default 1) serves from N Daphne processes sharing one listening socket, which
this process binds and then only watches (it restarts a process that dies and passes SIGTERM and
SIGINT on). One Daphne process runs Python on one core at a time (the GIL) however many request
threads it has: with N processes the API and the agents' streams use N cores, each process with
its own database pool (so N × DB_POOL_MAX_SIZE must stay under PostgreSQL's max_connections).
"""

from __future__ import annotations

import gc
import signal
import socket
import subprocess
import sys
import time

import daphne.server
from daphne.cli import CommandLineInterface
from daphne.ws_protocol import WebSocketFactory


def max_message_bytes() -> int:
    # Read when Daphne builds its server, after it imported the application (Django is set up).
    from django.conf import settings

    return settings.TESSERA_WS_MAX_MESSAGE_BYTES


class BoundedWebSocketFactory(WebSocketFactory):
    def setProtocolOptions(self, **options) -> None:  # autobahn's name
        limit = max_message_bytes()
        options.setdefault("maxFramePayloadSize", limit)
        options.setdefault("maxMessagePayloadSize", limit)
        super().setProtocolOptions(**options)


def _pop_option(args: list[str], *names: str) -> str | None:
    """Remove the last `NAME VALUE` or `NAME=VALUE` of any of `names` from args; return its value."""
    value = None
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in names and i + 1 < len(args):
            value = args[i + 1]
            del args[i:i + 2]
            continue
        if any(arg.startswith(f"{n}=") for n in names if n.startswith("--")):
            value = arg.split("=", 1)[1]
            del args[i]
            continue
        i += 1
    return value


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def _supervise(args: list[str], processes: int) -> int:
    """Bind once, run `processes` Daphne processes on the socket, keep them running until told to stop."""
    host = _pop_option(args, "-b", "--bind") or "127.0.0.1"
    port = int(_pop_option(args, "-p", "--port") or "8000")
    sock = _listen(host, port)
    child_args = [sys.executable, "-m", "portal.serve", "--fd", str(sock.fileno()), *args]
    stopping = False

    def start() -> subprocess.Popen:
        return subprocess.Popen(child_args, pass_fds=(sock.fileno(),))

    children = [start() for _ in range(processes)]

    def stop(signum, _frame) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopping:
        for i, child in enumerate(children):
            if child.poll() is not None and not stopping:
                print(f"portal.serve: process {child.pid} exited with {child.returncode}; starting another",
                      file=sys.stderr, flush=True)
                time.sleep(1)  # a process that cannot start must not spin
                children[i] = start()
        time.sleep(0.5)
    deadline = time.monotonic() + 20
    for child in children:
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    return 0


# The cyclic collector's first threshold (CPython's default: 700). A young pass starts when the
# objects allocated and not yet freed pass it, and with 500 agents the messages in flight (parsed,
# waiting for their commit) alone are over 700: ~25 young and ~2 middle passes a second and a full
# one (~75 ms over the connections' objects) every ~5 s took ~15 % of the process's CPU. At 50,000
# none ran in 40 s of that load (so it leaves under ~1,000 cyclic objects a second to collect) and
# memory stayed the same (bench/results/telemetry/live_cpu_gc_threshold_probe.md).
GC_YOUNG_THRESHOLD = 50_000


def tune_gc() -> None:
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def main() -> None:
    args = sys.argv[1:]
    processes = int(_pop_option(args, "--processes") or "1")
    if processes > 1:
        sys.exit(_supervise(args, processes))
    tune_gc()
    # Daphne builds its factory from this module-level name in Server.run.
    daphne.server.WebSocketFactory = BoundedWebSocketFactory
    CommandLineInterface().run(args)


if __name__ == "__main__":
    main()
