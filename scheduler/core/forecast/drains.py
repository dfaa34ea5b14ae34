"""Planned drains in the forecast: when each node takes new work over the walk.

A node takes new work at `t` when it is open then and no drain passed for it covers `t`. Open: ready
in the snapshot, or draining in it with a drain passed for it that has begun (the caller passes a
begun drain only where its end returns the node: the plan drained it). A lost node, or one a person
drained, never opens. What already runs on a node runs on through its drain.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..model import Node, NodeStatus, PlannedDrain
from ..state import ClusterState


class Drains:
    def __init__(self, state: ClusterState, nodes: Iterable[Node], drains: Iterable[PlannedDrain], now: float
                 ) -> None:
        self.by_node: dict[int, list[PlannedDrain]] = {}
        begun: set[int] = set()  # nodes with a drain that has begun (ended too: its end is not applied yet)
        for d in drains:
            i = state.node_index.get(d.node)
            if i is None:
                continue
            if d.starts_at <= now:
                begun.add(i)
            if d.ends_at is None or d.ends_at > now:
                self.by_node.setdefault(i, []).append(d)
        self.open = state.ready.copy()
        for n in nodes:
            i = state.node_index[n.name]
            if n.status == NodeStatus.DRAINING and i in begun:
                self.open[i] = True
        for i in begun - self.by_node.keys():
            self.by_node[i] = []  # a drain just ended: the walk opens the node at its start
        # Nodes that take new work at some time from now on (a request that fits only on the others
        # never starts).
        self.ever: np.ndarray = self.open.copy()
        for i, plans in self.by_node.items():
            self.ever[i] = self.open[i] and any(
                self.takes_work(i, t) for t in (now, *(d.ends_at for d in plans if d.ends_at is not None)))

    def takes_work(self, i: int, t: float) -> bool:
        return bool(self.open[i]) and not any(d.covers(t) for d in self.by_node.get(i, ()))

    def times(self, now: float) -> list[tuple[float, int]]:
        """(time, node) where a node may close or open after `now`."""
        out = []
        for i, plans in self.by_node.items():
            for d in plans:
                out += [(t, i) for t in (d.starts_at, d.ends_at) if t is not None and t > now]
        return sorted(out)

    def apply(self, state: ClusterState, t: float) -> None:
        """Each node's readiness at `t`."""
        for i in self.by_node:
            state.ready[i] = self.takes_work(i, t)
