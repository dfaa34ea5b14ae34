"""A node's last_seen as its agent's batches move it: written through fleet.services at most every
few seconds per node, remembered per process (a hello writes it itself)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from django.utils import timezone

from portal.fleet import services as fleet_services

# Writing last_seen once per batch would be one UPDATE per node per second for nothing.
LAST_SEEN_EVERY_S = 5.0


@dataclass
class _Cache:
    last_seen_written: dict[int, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_cache = _Cache()


def forget() -> None:
    """Forget when this process last wrote each node's last_seen (tests; after a failed commit)."""
    with _cache.lock:
        _cache.last_seen_written.clear()


def written(node_id: int) -> None:
    """The node's last_seen was just written (its hello): batches need not write it for a while."""
    with _cache.lock:
        _cache.last_seen_written[node_id] = time.monotonic()


def touch(node_ids: set[int]) -> None:
    """Write last_seen of the nodes whose agents sent a batch, each at most every LAST_SEEN_EVERY_S."""
    now_mono = time.monotonic()
    with _cache.lock:
        due = [n for n in node_ids if now_mono - _cache.last_seen_written.get(n, 0.0) >= LAST_SEEN_EVERY_S]
        for n in due:
            _cache.last_seen_written[n] = now_mono
    if due:
        fleet_services.record_seen(due, timezone.now())
