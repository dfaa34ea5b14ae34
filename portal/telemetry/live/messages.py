"""The messages a commit of readings makes, per live group."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Latest:
    """The newest reading of one node in a commit, as ingest stored it: plain ids and values. The
    messages are built from it only for the groups somebody watches (most readings go unwatched)."""

    node: int
    ts_ms: int
    gpus: list[tuple]  # (gpu id, sm_util_pct, mem_util_pct, mem_used_mib, power_w, temp_c)
    shares: list[tuple]  # (reservation id, team id, gpu id, used_frac, mem_used_mib): live shares only


def messages_for(latest_readings: list[Latest], watched: set[str] | None = None) -> dict[str, dict]:
    """group name → message data for the newest readings of one commit: one message per group,
    however many nodes reported in it. With `watched`, only those groups (the rest would be built
    to be thrown away)."""
    out: dict[str, dict] = {}
    for latest in latest_readings:
        for gpu, sm_util, mem_util, mem_used, power, temp in latest.gpus:
            name = f"gpu:{gpu}"
            if watched is None or name in watched:
                out[name] = {"type": "gpu", "data": {"gpu": gpu, "sm_util_pct": sm_util, "mem_util_pct": mem_util,
                                                     "mem_used_mib": mem_used, "power_w": power, "temp_c": temp,
                                                     "ts_ms": latest.ts_ms}}
        for reservation, team, gpu, used, mem in latest.shares:
            share = None
            for name in (f"team:{team}", f"reservation:{reservation}"):
                if watched is not None and name not in watched:
                    continue
                if share is None:
                    share = {"reservation": reservation, "team": team, "gpu": gpu, "used_frac": round(used, 4),
                             "mem_used_mib": mem}
                message = out.setdefault(name, {"type": "shares", "data": {"ts_ms": 0, "shares": []}})
                message["data"]["shares"].append(share)
                message["data"]["ts_ms"] = max(message["data"]["ts_ms"], latest.ts_ms)
    return out
