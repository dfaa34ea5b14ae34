"""The bell's number, live: each person's `user:<id>` group on ws/live/ gets
{"type": "notifications", "data": {"unread": n}} when their unread count changes. Sent after
commit from the background sender (never waiting for Redis); a lost message is made good by the
next one or the page's next load (the group state answers the same count)."""

from __future__ import annotations

import json
import time

from channels.layers import get_channel_layer

from portal.telemetry import live
from portal.telemetry.background_sends import deliver

from .models import Notification


def unread_count(user_id: int) -> int:
    return Notification.objects.filter(user_id=user_id, in_app=True, read_at__isnull=True).count()


def state(user_id: int) -> dict:
    """What the live state answers for `user:<id>` (a reconnecting page's count)."""
    return {"type": "notifications", "data": {"unread": unread_count(user_id)}}


async def _publish(counts: dict[int, int]) -> None:
    watched = await live.store().watched()
    names = {uid: f"user:{uid}" for uid in counts if f"user:{uid}" in watched}
    if not names:
        return
    layer = get_channel_layer()
    seqs = await live.store().next_seqs(list(names.values()))
    ts_ms = int(time.time() * 1000)
    for uid, name in names.items():
        text = json.dumps({"group": name, "seq": seqs[name], "type": "notifications",
                           "data": {"unread": counts[uid], "ts_ms": ts_ms}}, separators=(",", ":"))
        await layer.group_send(live.parse_group(name).channel_group,
                               {"type": "live.message", "group": name, "text": text})


def publish_unread(user_ids) -> None:
    """Tell these people's open pages their unread count (counted now, after the commit)."""
    counts = {uid: unread_count(uid) for uid in set(user_ids)}
    if counts:
        deliver(lambda: _publish(counts), f"unread counts of users {sorted(counts)[:10]}")
