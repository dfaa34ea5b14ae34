"""The ingest writer: gathers sample batches from every agent connection of this process for a
few tens of milliseconds, stores them in one transaction on its own database thread, then
answers each connection and publishes the newest readings to the live groups."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from django.db import IntegrityError, connection

from . import conf
from .ingest import Stored, Submission, forget_cache, store_batches
from .live import Publisher

log = logging.getLogger(__name__)

MAX_SUBMISSIONS_PER_COMMIT = 1000


def _store_in_thread(submissions: list[Submission]) -> list[Stored]:
    try:
        try:
            return store_batches(submissions)
        except IntegrityError:
            # Most likely a reservation deleted after this process remembered it: forget and
            # try once more (unknown reservations are skipped), rather than fail every agent of
            # this commit again and again as they replay the same samples.
            log.warning("storing samples hit an integrity error; retrying without cached reservations")
            forget_cache()
            return store_batches(submissions)
    except Exception:
        # A broken connection (database restarted) must not poison the next commits.
        connection.close()
        raise


class BatchWriter:
    def __init__(self) -> None:
        self._queue: asyncio.Queue[tuple[Submission, asyncio.Future]] = asyncio.Queue()
        # One thread: one database connection that stays open, commits in arrival order.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="telemetry-writer")
        self._publisher = Publisher()
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
        while True:
            first = await self._queue.get()
            await asyncio.sleep(conf.writer_delay_s())
            items = [first]
            while not self._queue.empty() and len(items) < MAX_SUBMISSIONS_PER_COMMIT:
                items.append(self._queue.get_nowait())
            started = time.monotonic()
            try:
                results = await loop.run_in_executor(self._executor, _store_in_thread, [s for s, _ in items])
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
            log.debug("stored %d batches in %.1f ms", len(items), (time.monotonic() - started) * 1000)
            try:
                await self._publisher.publish([r.latest for r in results if r.latest is not None])
            except Exception:
                # The live view is best effort (browsers re-fetch on a gap); storage is not.
                log.exception("publishing live readings failed")


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
