"""What the caller plugs into the forecast: quota (Gate) and the cycle's order as use changes (Order)."""

from __future__ import annotations

from typing import Any, Protocol

from ..model import Request, Snapshot
from ..queue import DEFAULT_AGING_S, effective_priority


class Gate(Protocol):
    """What else than room decides whether a request may start: the portal's quota.

    `allowed(req)`: the GPU models the request may use now (None: any; empty: none now);
    `charge(req, model)`: it was placed in the forecast on a GPU of `model`;
    `refund(reservation_id)`: a reservation (running, or placed in the forecast) ended or was evicted.
    `allowed` is asked often (after ends, for lines it had restricted): keep it cheap.
    """

    def allowed(self, req: Request) -> frozenset[str] | None: ...

    def charge(self, req: Request, model: str) -> None: ...

    def refund(self, reservation_id: str) -> None: ...


class Order(Protocol):
    """The cycle's queue order as the forecast runs forward. Under fair share the order follows each
    team's use, which the forecast changes as it places and ends work: `key(req, at)` ranks a waiting
    request at time `at` (lowest first); `charge` and `refund` as in Gate (one object may be both).
    Requests of one team, priority and shape must keep their order in `queue` under it (age does)."""

    def key(self, req: Request, at: float) -> Any: ...

    def charge(self, req: Request, model: str) -> None: ...

    def refund(self, reservation_id: str) -> None: ...


class QueueOrder:
    """Today's order (`queue.queue_order`: priority with aging, then the team's quota use, then
    age), with the use kept up to date as the forecast places and ends work."""

    def __init__(self, snapshot: Snapshot, aging_s: float = DEFAULT_AGING_S) -> None:
        self.aging_s = aging_s
        self.quota = {team: usage.quota_gpus for team, usage in snapshot.teams.items()}
        self.used = {team: usage.used_gpus for team, usage in snapshot.teams.items()}
        self.held: dict[str, tuple[str, float]] = {}  # reservation -> (team, GPUs it counts)
        for node in snapshot.nodes:
            for gpu in node.gpus:
                for share in gpu.shares:
                    team, gpus = self.held.get(share.reservation_id, (share.team, 0.0))
                    self.held[share.reservation_id] = (team, gpus + share.gpu_request)

    def key(self, req: Request, at: float) -> tuple[int, float, float, str]:
        if req.team in self.quota:
            quota, used = self.quota[req.team], self.used[req.team]
            ratio = used / quota if quota > 0 else 1e18
        else:
            ratio = 0.0
        return (-effective_priority(req, at, self.aging_s), ratio, req.created_at, req.id)

    def charge(self, req: Request, model: str) -> None:
        gpus = req.gpu_request * req.gpu_count
        self.held[req.id] = (req.team, gpus)
        if req.team in self.used:
            self.used[req.team] += gpus

    def refund(self, reservation_id: str) -> None:
        team, gpus = self.held.pop(reservation_id, ("", 0.0))
        if team in self.used:
            self.used[team] -= gpus
