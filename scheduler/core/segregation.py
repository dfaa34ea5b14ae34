"""Keep empty nodes empty, and guaranteed work apart from work that may be taken back (off by
default, `decide(keep_apart=True)`: in the replay it added evictions on two seeds of three).

A request for a whole node (8 GPUs of an 8-GPU node) can start only on a node that is empty or that
reclaim can empty. In the fair-share replay (bench/fairshare/replay.py) the teams below their share
waited mostly behind such requests while the free and reclaimable GPUs of their model lay spread
over nodes that also held guaranteed work. So before its score a placement prefers
(`placement_tier`, higher first):
- guaranteed work: nodes that already hold guaranteed work, then nodes holding only work that may
  be taken back (borrowed, opportunistic), then empty nodes;
- borrowed or opportunistic work: nodes holding only such work, then nodes with guaranteed work,
  then empty nodes.
Sending borrowed work to empty nodes first (the obvious reading of "keep them apart") was measured
worse: it used up the empty nodes.
"""

from __future__ import annotations

import numpy as np

from .fairshare import Admission
from .state import ClusterState

EMPTY, ONLY_TAKEABLE, GUARANTEED_HERE = 0, 1, 2  # what a node holds (`NodeKinds`)
# Tier per node kind (index: the kind above), per admission.
_GUARANTEED_TIER = np.array([0, 1, 2], dtype=np.int64)
_TAKEABLE_TIER = np.array([0, 2, 1], dtype=np.int64)


class NodeKinds:
    """Per node, what it holds: nothing (`EMPTY`), only work that may be taken back
    (`ONLY_TAKEABLE`), or some guaranteed work (`GUARANTEED_HERE`). Worked out again only for
    the nodes whose `ClusterState.version` moved since it last looked, so a cycle pays per change,
    not per request."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._seen = np.full(len(state.node_names), -1, dtype=np.int64)
        self.kind = np.full(len(state.node_names), EMPTY, dtype=np.int64)

    def current(self) -> np.ndarray:
        stale = np.flatnonzero(self.state.version != self._seen)
        on_node = self.state.on_node
        for node in stale.tolist():
            here = on_node.get(node)
            if not here:
                self.kind[node] = EMPTY
            elif any(h.share.admission == Admission.GUARANTEED for h in here.values()):
                self.kind[node] = GUARANTEED_HERE
            else:
                self.kind[node] = ONLY_TAKEABLE
        self._seen[stale] = self.state.version[stale]
        return self.kind


def placement_tier(kinds: NodeKinds, admission: Admission) -> np.ndarray:
    """Per node, the tier `engine.choose` compares before the score (higher first) for a placement
    admitted as `admission` (see the module's text)."""
    table = _GUARANTEED_TIER if admission == Admission.GUARANTEED else _TAKEABLE_TIER
    return table[kinds.current()]
