"""Channel-layer sends from synchronous code (Celery tasks, views) that do not wait for Redis.

`async_to_sync` starts a fresh event loop for every call, and channels_redis keeps its connection
pools per loop: each push paid for new Redis connections (a placement cycle's 74-node push took
34 ms, each bind batch's 6 ms) and the caller waited for all of it. Here one event loop per
process runs in a daemon thread, its pools stay open, and `submit` returns at once.

Pushes are notifications ("read your placements again"), each complete in itself: one that is
late, or lost when the process dies, is made good by the next one or the agent's next hello.
`flush` waits for what is in flight (process shutdown, tests).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import threading
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class BackgroundSender:
    def __init__(self, timeout_s: float = 10.0) -> None:
        # A send that hangs (Redis unreachable but not refusing) is given up after this long, so
        # that sends cannot pile up behind it while placements go on.
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0
        self._in_flight: set[concurrent.futures.Future] = set()

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            # After a fork (Celery's prefork children) the parent's thread does not exist here.
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="tessera-channel-sends", daemon=True).start()
                self._loop, self._pid, self._in_flight = loop, os.getpid(), set()
            return self._loop

    def submit(self, make: Callable[[], Awaitable[None]], what: str) -> concurrent.futures.Future:
        """Run `make()` on the sender's loop; a failure is logged with `what`, never raised here."""
        async def run() -> None:
            try:
                await asyncio.wait_for(make(), self.timeout_s)
            except TimeoutError:
                log.error("gave up sending %s after %g s", what, self.timeout_s)
            except Exception:
                log.exception("could not send %s", what)

        future = asyncio.run_coroutine_threadsafe(run(), self._running_loop())
        with self._lock:
            self._in_flight.add(future)
        future.add_done_callback(self._done)
        return future

    def _done(self, future: concurrent.futures.Future) -> None:
        with self._lock:
            self._in_flight.discard(future)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything submitted so far has been sent (or failed). False on timeout."""
        with self._lock:
            if self._pid != os.getpid():
                return True
            waiting = list(self._in_flight)
        if not waiting:
            return True
        _, not_done = concurrent.futures.wait(waiting, timeout=timeout)
        return not not_done


sender = BackgroundSender()
atexit.register(sender.flush, 2.0)


def deliver(send: Callable[[], Awaitable[None]], what: str) -> None:
    """Run `send` for the process's channel layer: on the sender's loop for Redis, without
    waiting (a placement batch or a cycle goes on, and the caller's thread may run an event loop
    of its own, where async_to_sync cannot be used); in-line for the in-memory layer (the
    quickstart), whose queues belong to the server's loop, reached from a request's thread.
    Nothing is sent without a layer; a failure is logged with `what`."""
    from asgiref.sync import async_to_sync
    from channels.layers import InMemoryChannelLayer, get_channel_layer

    layer = get_channel_layer()
    if layer is None:
        return
    if not isinstance(layer, InMemoryChannelLayer):
        sender.submit(send, what)
        return
    try:
        async_to_sync(send)()
    except Exception:
        log.exception("could not send %s", what)
