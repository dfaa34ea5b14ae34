"""The messages a commit of readings makes, per live group."""

from __future__ import annotations


def messages_for(latest_readings: list[dict], watched: set[str] | None = None) -> dict[str, dict]:
    """group name → message data for the newest readings of one commit (see
    ingest._latest_reading): one message per group, however many nodes reported in it. With
    `watched`, only those groups (the rest would be built to be thrown away)."""
    out: dict[str, dict] = {}
    for latest in latest_readings:
        for reading in latest["gpus"]:
            name = f"gpu:{reading['gpu']}"
            if watched is None or name in watched:
                out[name] = {"type": "gpu", "data": {**reading, "ts_ms": latest["ts_ms"]}}
        for share in latest["shares"]:
            for name in (f"team:{share['team']}", f"reservation:{share['reservation']}"):
                if watched is not None and name not in watched:
                    continue
                message = out.setdefault(name, {"type": "shares", "data": {"ts_ms": 0, "shares": []}})
                message["data"]["shares"].append(share)
                message["data"]["ts_ms"] = max(message["data"]["ts_ms"], latest["ts_ms"])
    return out
