"""The only writer of reservation, allocation and audit rows. Pages, the API, the placement cycle,
the binding and lifecycle tasks and the kubectl path all call these; nothing else writes them.

- submitting: `submit` (portal, API or a kubectl pod: its `source`)
- placing:    `place`, `place_many` (the cycle's decisions, with attempt, pod name and end time)
- moving:     `transition`, the compare-and-set `move`, `cancel`, `release`, `preempt`, `lose`
- pods:       `record_pod(s)`, `forget_pod`, `note_cluster_waits`, `keep_pod_log` (a deleted pod's last
              lines)
- extending:  `extend` (within the team policy's maximum duration)
- reclaiming: `warn_reclaim` (a borrowed reservation's warning before it is reclaimed)
- terminals:  `note_terminal_opened` (the audit row of a terminal opened in the pod)
- upkeep:     `note_pending_reason`, `set_queue_positions`, `note_estimate_reasons`, `flag_idle`,
              `idle_reclaim_at`, `warn_expiry`
"""

from .extending import ExtendRefused, extend
from .moving import cancel, lose, move, preempt, release, transition
from .placing import CapacityConflict, NewAllocation, Placing, ends_at, place, place_many
from .pods import forget_pod, keep_pod_log, note_cluster_waits, record_pod, record_pods
from .reclaiming import warn_reclaim
from .submitting import submit
from .terminals import note_terminal_opened
from .upkeep import (
    base_reason,
    flag_idle,
    idle_reclaim_at,
    note_estimate_reasons,
    note_pending_reason,
    set_queue_positions,
    warn_expiry,
)

__all__ = [
    "CapacityConflict",
    "ExtendRefused",
    "NewAllocation",
    "Placing",
    "base_reason",
    "cancel",
    "ends_at",
    "extend",
    "flag_idle",
    "forget_pod",
    "idle_reclaim_at",
    "keep_pod_log",
    "lose",
    "move",
    "note_cluster_waits",
    "note_estimate_reasons",
    "note_pending_reason",
    "note_terminal_opened",
    "place",
    "place_many",
    "preempt",
    "record_pod",
    "record_pods",
    "release",
    "set_queue_positions",
    "submit",
    "transition",
    "warn_expiry",
    "warn_reclaim",
]
