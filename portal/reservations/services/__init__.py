"""The only writer of reservation, allocation and audit rows. Pages, the API, the placement cycle,
the binding and lifecycle tasks and the kubectl path all call these; nothing else writes them.

- submitting: `submit` (portal, API or a kubectl pod: its `source`)
- booking:    `book` (a future window, weekly repeats), `move_booking`, `cancel_booking`,
              `delete_series`, `free_windows`, `window_conflict` (the preview's read-only check),
              `start_due` (booked → pending), `release_no_show`
- placing:    `place`, `place_many` (the cycle's decisions, with attempt, pod name and end time)
- moving:     the compare-and-set `move`, `cancel`, `release`, `preempt`, `lose`
- pods:       `record_pod(s)`, `forget_pod`, `note_cluster_waits`, `keep_pod_log` (a deleted pod's last
              lines)
- extending:  `extend` (within the team policy's maximum duration)
- reclaiming: `warn_reclaim` (a borrowed reservation's warning before it is reclaimed)
- terminals:  `note_terminal_opened` (the audit row of a terminal opened in the pod)
- upkeep:     `note_pending_reason`, `set_queue_positions`, `note_estimate_reasons`, `flag_idle`,
              `idle_reclaim_at`, `warn_expiry`
"""

from .booking import (
    BookingConflict,
    Window,
    book,
    cancel_booking,
    delete_series,
    free_windows,
    move_booking,
    release_no_show,
    start_due,
    window_conflict,
    window_of,
)
from .extending import ExtendRefused, extend
from .moving import cancel, lose, move, preempt, release
from .placing import CapacityConflict, NewAllocation, Placing, ends_at, place, place_many
from .pods import forget_pod, keep_pod_log, note_cluster_waits, record_pod, record_pods
from .reclaiming import FOR_A_BOOKING, warn_reclaim
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
    "FOR_A_BOOKING",
    "BookingConflict",
    "CapacityConflict",
    "ExtendRefused",
    "NewAllocation",
    "Placing",
    "Window",
    "base_reason",
    "book",
    "cancel",
    "cancel_booking",
    "delete_series",
    "ends_at",
    "extend",
    "flag_idle",
    "forget_pod",
    "free_windows",
    "idle_reclaim_at",
    "keep_pod_log",
    "lose",
    "move",
    "move_booking",
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
    "release_no_show",
    "set_queue_positions",
    "start_due",
    "submit",
    "warn_expiry",
    "warn_reclaim",
    "window_conflict",
    "window_of",
]
