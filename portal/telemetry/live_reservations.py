"""Live reservation changes for browsers: when a reservation's state, reason or place in the
queue changes, the `team:<id>` and `reservation:<id>` groups that somebody watches get
{"type": "reservations", "data": {"changed": [ids], "ts_ms"}}.

The message names what changed, not how it looks now: the page asks for the server-rendered
fragment of each (which checks tenancy like every page). The groups' sequence numbers are the
same counters the share readings use, so a browser that misses one (a gap) re-fetches the group
state and its fragments.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from channels.layers import get_channel_layer
from django.dispatch import receiver

from portal.reservations.events import reservations_changed

from . import live
from .background_sends import deliver

log = logging.getLogger(__name__)


def messages_for(changes: dict[int, int], watched: set[str]) -> dict[str, list[int]]:
    """group name → changed reservation ids, for the watched groups only."""
    out: dict[str, list[int]] = {}
    for reservation_id, team_id in sorted(changes.items()):
        for name in (f"team:{team_id}", f"reservation:{reservation_id}"):
            if name in watched:
                out.setdefault(name, []).append(reservation_id)
    return out


async def publish(changes: dict[int, int]) -> int:
    watched = await live.store().watched()
    outgoing = messages_for(changes, watched)
    if not outgoing:
        return 0
    layer = get_channel_layer()
    seqs = await live.store().next_seqs(list(outgoing))
    ts_ms = int(time.time() * 1000)

    async def send(name: str) -> None:
        text = json.dumps({"group": name, "seq": seqs[name], "type": "reservations",
                           "data": {"changed": outgoing[name], "ts_ms": ts_ms}}, separators=(",", ":"))
        await layer.group_send(live.parse_group(name).channel_group,
                               {"type": "live.message", "group": name, "text": text})

    await asyncio.gather(*(send(name) for name in outgoing))
    return len(outgoing)


@receiver(reservations_changed, dispatch_uid="telemetry.publish_reservation_changes")
def publish_changes(sender, changes: dict[int, int], **kwargs) -> None:
    if changes:
        changes = dict(changes)
        deliver(lambda: publish(changes), f"changes of reservations {sorted(changes)[:10]}")
