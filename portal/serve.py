"""`python -m portal.serve [daphne's options] portal.asgi:application`: Daphne with flow control on
streamed responses and a size limit on WebSocket frames and messages, enforced by its WebSocket
layer (autobahn) as a frame's header arrives, before the payload is buffered. Daphne itself
offers no such option, and a consumer only sees a message once it is whole in memory: a client
could make the server hold 128 MiB per frame.

The limit is settings.TESSERA_WS_MAX_MESSAGE_BYTES (default: the wire protocol's 1 MiB, the largest
message an agent may send; browsers send a few hundred bytes). Over it the connection is closed
with 1009.

Flow control: Daphne hands each response chunk to Twisted, which buffers whatever the client has
not read yet without bound, so a slow client downloading a large file through /connect/ made the
process hold the file. FlowControlledServer makes the application's `send` of a body chunk wait
while the connection's send buffer is over Twisted's high-water mark (Twisted's push-producer
interface), so the proxy reads from the app only as fast as the client reads from us.

Each serving process runs with the cyclic collector's young threshold raised (GC_YOUNG_THRESHOLD).

`--processes N` (default 1) serves from N Daphne processes sharing one listening socket, which
this process binds and then only watches (it restarts a process that dies and passes SIGTERM and
SIGINT on). One Daphne process runs Python on one core at a time (the GIL) however many request
threads it has: with N processes the API and the agents' streams use N cores, each process with
its own database pool (so N × DB_POOL_MAX_SIZE must stay under PostgreSQL's max_connections).
"""

from __future__ import annotations

import asyncio
import gc
import signal
import socket
import subprocess
import sys
import time
import weakref

import daphne.server
from daphne.cli import CommandLineInterface
from daphne.http_protocol import WebRequest
from daphne.ws_protocol import WebSocketFactory
from twisted.internet.interfaces import IPushProducer
from zope.interface import implementer


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


@implementer(IPushProducer)
class SendBuffer:
    """Registered on a response's connection: Twisted pauses it when the connection's send buffer
    is over its high-water mark and resumes it once the buffer drained."""

    def __init__(self) -> None:
        self.room = asyncio.Event()
        self.room.set()

    def pauseProducing(self) -> None:  # Twisted's names
        self.room.clear()

    def resumeProducing(self) -> None:
        self.room.set()

    def stopProducing(self) -> None:
        self.room.set()  # the connection is going: whatever waits goes on, and Daphne drops its sends


class FlowControlledServer(daphne.server.Server):
    """Daphne whose HTTP `send` of a body chunk returns once the client has room for more."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.send_buffers: weakref.WeakKeyDictionary[WebRequest, SendBuffer] = weakref.WeakKeyDictionary()

    async def handle_reply(self, protocol, message) -> None:
        if not isinstance(protocol, WebRequest):  # a WebSocket: its messages are not streamed bodies
            await super().handle_reply(protocol, message)
        elif message["type"] == "http.response.start":
            await super().handle_reply(protocol, message)
            self.send_buffers[protocol] = buffer = SendBuffer()
            protocol.registerProducer(buffer, True)
        elif message["type"] == "http.response.body" and message.get("more_body", False):
            await super().handle_reply(protocol, message)
            buffer = self.send_buffers.get(protocol)
            if buffer is not None:
                await buffer.room.wait()
        else:
            if self.send_buffers.pop(protocol, None) is not None:
                # Twisted wants the producer gone before the request finishes, which the last chunk does.
                protocol.unregisterProducer()
            await super().handle_reply(protocol, message)

    def protocol_disconnected(self, protocol) -> None:
        buffer = self.send_buffers.pop(protocol, None)
        if buffer is not None:
            buffer.stopProducing()
        super().protocol_disconnected(protocol)


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
    cli = CommandLineInterface()
    cli.server_class = FlowControlledServer
    cli.run(args)


if __name__ == "__main__":
    main()
