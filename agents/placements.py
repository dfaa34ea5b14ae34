"""What the portal has placed on this node's GPUs, as last pushed in a `placements` message."""

from __future__ import annotations

import threading

from wire.agent_portal import PlacedShare, Placements


class PlacementRefused(ValueError):
    """A placements message the agent cannot use; `code` is the protocol error code to answer with."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class PlacementTable:
    """The current placements; replaced whole by each newer `placements` message.

    The sampler reads it from a worker thread while the stream updates it, hence the lock.
    """

    def __init__(self, gpu_uuids: set[str]) -> None:
        self._gpus = frozenset(gpu_uuids)
        self._lock = threading.Lock()
        self._revision = -1
        self._placements: tuple[PlacedShare, ...] = ()
        self._by_pod: dict[str, str] = {}

    @property
    def revision(self) -> int:
        return self._revision

    def apply(self, message: Placements) -> bool:
        """Take a newer placements message; False if it is older than what we have (ignored)."""
        unknown = sorted({p.gpu_uuid for p in message.placements} - self._gpus)
        if unknown:
            raise PlacementRefused("unknown_gpu", f"placements name GPU {unknown[0]}, not a GPU of this node")
        with self._lock:
            # A stale message must not undo a newer one (only possible from a misbehaving portal, as
            # one connection is ordered; new_connection() starts the count again).
            if message.revision < self._revision:
                return False
            self._revision = message.revision
            self._placements = tuple(message.placements)
            self._by_pod = {p.pod_uid: p.reservation for p in message.placements if p.pod_uid}
        return True

    def new_connection(self) -> None:
        """Accept any revision from the next message: revisions only order messages of one connection."""
        with self._lock:
            self._revision = -1

    def all(self) -> tuple[PlacedShare, ...]:
        with self._lock:
            return self._placements

    def on_gpu(self, gpu_uuid: str) -> list[PlacedShare]:
        with self._lock:
            return [p for p in self._placements if p.gpu_uuid == gpu_uuid]

    def reservation_of_pod(self, pod_uid: str) -> str | None:
        with self._lock:
            return self._by_pod.get(pod_uid)
