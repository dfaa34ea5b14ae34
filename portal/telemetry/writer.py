"""The ingest writer: stores the sample batches of every agent connection of this process in
group commits on its own database thread, answers each connection once its batch is committed, and
hands the newest readings to the live fan-out.

Group commit: a commit starts at most every TESSERA_TELEMETRY_WRITE_DELAY_S (50 ms) and takes
everything that arrived meanwhile. After a quiet spell the first batch goes at once; when a commit
took longer than that, what came in during it goes at once too (no fixed wait on top of a backlog).
Publishing runs in its own task, so the next commit never waits on Redis (live.Fanout)."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from django.db import IntegrityError, connection

from . import conf, seen
from .agent_batches import Submission
from .dbthread import own_connection
from .ingest import Stored, store_batches
from .live import Fanout

log = logging.getLogger(__name__)

MAX_SUBMISSIONS_PER_COMMIT = 1000


def store(submissions: list[Submission]) -> list[Stored]:
    """Store one commit's batches (blocking: the writer runs it in its thread)."""
    try:
        try:
            return store_batches(submissions)
        except IntegrityError:
            # Most likely a reservation deleted after this process remembered it: forget and
            # try once more (unknown reservations are skipped), rather than fail every agent of
            # this commit again and again as they replay the same samples.
            log.warning("storing samples hit an integrity error; retrying without cached reservations")
            seen.forget()
            return store_batches(submissions)
    except Exception:
        # A broken connection (database restarted) must not poison the next commits.
        connection.close()
        raise


class BatchWriter:
    def __init__(self) -> None:
        self._queue: asyncio.Queue[tuple[Submission, asyncio.Future]] = asyncio.Queue()
        # One thread: one database connection that stays open, commits in arrival order.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="telemetry-writer",
                                            initializer=own_connection)
        self._fanout = Fanout()
        self._task = asyncio.get_running_loop().create_task(self._run())
        self.stored_samples = 0
        self.commits = 0

    async def submit(self, submission: Submission) -> Stored:
        """Resolves when the batch is committed; raises what the commit raised."""
        future = asyncio.get_running_loop().create_future()
        await self._queue.put((submission, future))
        return await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last_start = float("-inf")
        while True:
            first = await self._queue.get()
            wait = last_start + conf.writer_delay_s() - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            items = [first]
            while not self._queue.empty() and len(items) < MAX_SUBMISSIONS_PER_COMMIT:
                items.append(self._queue.get_nowait())
            last_start = started = loop.time()
            try:
                results = await loop.run_in_executor(self._executor, store, [s for s, _ in items])
            except Exception as exc:
                log.exception("storing %d sample batches failed", len(items))
                for _, future in items:
                    if not future.done():
                        future.set_exception(exc)
                continue
            self.commits += 1
            for (_, future), stored in zip(items, results, strict=True):
                self.stored_samples += stored.new_samples
                if not future.done():
                    future.set_result(stored)
            log.debug("stored %d batches in %.1f ms", len(items), (loop.time() - started) * 1000)
            # Only after the commit: a browser that re-fetches the state after a gap must find in
            # the database everything numbered up to the sequence it is told (live/watching.py).
            self._fanout.put([r.latest for r in results if r.latest is not None])


_writers: dict[int, BatchWriter] = {}


def writer() -> BatchWriter:
    """The writer of the running event loop (Daphne runs one loop per process; tests one each)."""
    loop = asyncio.get_running_loop()
    w = _writers.get(id(loop))
    if w is None or w._task.done() or w._task.get_loop() is not loop:
        w = _writers[id(loop)] = BatchWriter()
    return w


def close_connections() -> None:
    """Close the database connections of every writer thread (tests, shutdown)."""
    from .dbthread import close_connections as close_pool

    for w in list(_writers.values()):
        close_pool(w._executor)
