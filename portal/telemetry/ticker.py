"""Telemetry upkeep inside the portal process, for deployments without Celery beat (the
quickstart). A cache lock makes one process of several do each round."""

from __future__ import annotations

import asyncio
import logging

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.cache import cache
from django.db import close_old_connections

from .upkeep import maintain

log = logging.getLogger(__name__)

EVERY_S = 30.0
_tasks: dict[int, asyncio.Task] = {}


def _round() -> None:
    close_old_connections()
    try:
        if cache.add("tessera:telemetry:maintain", 1, timeout=int(EVERY_S) - 1):
            maintain()
    finally:
        close_old_connections()


async def _loop() -> None:
    while True:
        await asyncio.sleep(EVERY_S)
        try:
            await sync_to_async(_round, thread_sensitive=False)()
        except Exception:
            log.exception("telemetry upkeep failed; retrying in %.0f s", EVERY_S)


def ensure_started() -> None:
    """Start the upkeep loop on the running event loop once (when settings ask for it)."""
    if not getattr(settings, "TESSERA_TELEMETRY_TICKER", False):
        return
    loop = asyncio.get_running_loop()
    task = _tasks.get(id(loop))
    if task is None or task.done() or task.get_loop() is not loop:
        _tasks[id(loop)] = loop.create_task(_loop())
