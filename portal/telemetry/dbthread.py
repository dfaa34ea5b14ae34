"""Database calls of the agent consumers, on a small pool of threads that keep their connections.

Channels' database_sync_to_async runs every call on one shared thread and closes the connection
around each call when CONN_MAX_AGE is 0: with hundreds of agents (re)connecting at once, the
handshakes then queue behind fresh PostgreSQL logins and time out, and the retries make it worse.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from django.db import connection

from portal import internals

T = TypeVar("T")



def own_connection() -> None:
    """Thread initializer: this thread keeps one connection of its own for its life, outside the
    web requests' pool (DB_POOL_MAX_SIZE): agents' hellos and sample commits never queue behind
    HTTP requests for a pooled connection, and a long-lived thread does not hold a pool slot."""
    options = connection.settings_dict.get("OPTIONS", {})
    if "pool" in options:
        connection.settings_dict = {**connection.settings_dict,
                                    "OPTIONS": {k: v for k, v in options.items() if k != "pool"}}


_executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="telemetry-db", initializer=own_connection)


class Stale(Exception):
    """The call waited in the queue past its deadline: its caller has given up by now."""


def _call(deadline: float | None, fn: Callable[..., T], *args) -> T:
    # During a reconnect storm the queue can hold work for agents that already timed out and
    # will retry; doing it anyway would make every later handshake late too.
    if deadline is not None and time.monotonic() > deadline:
        raise Stale(f"{getattr(fn, '__name__', fn)} waited too long to start")
    try:
        return fn(*args)
    except Exception:
        # The next call opens a fresh connection (the database may have restarted).
        connection.close()
        raise


async def run(fn: Callable[..., T], *args, within: float | None = None) -> T:
    """Run fn(*args) on the pool; with `within`, give up (Stale) if it cannot start in that many s."""
    deadline = None if within is None else time.monotonic() + within
    return await asyncio.get_running_loop().run_in_executor(_executor, _call, deadline, fn, *args)


def close_connections(executor: ThreadPoolExecutor | None = None) -> None:
    """Close the database connection of every thread of `executor` (this module's pool by
    default), e.g. before a test database is dropped. Each thread runs one close: a barrier
    keeps a thread from taking two."""
    executor = executor or _executor
    threads = internals.pool_threads(executor)
    if not threads:
        return
    barrier = threading.Barrier(threads, timeout=5)

    def close() -> None:
        connection.close()
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait()

    for future in [executor.submit(close) for _ in range(threads)]:
        future.result(timeout=10)
