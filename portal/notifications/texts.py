"""What a notification says, in the owner's words: which reservation, how much of which GPU, where,
and what happens next."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from portal.reservations.models import Reservation

# Models whose names are read starting with a vowel sound ("an A100", "an H100", "a T4").
_VOWEL_SOUND = set("AEFHILMNORSX8")


def article(model: str) -> str:
    return "an" if model[:1].upper() in _VOWEL_SOUND else "a"


def share_words(r: Reservation, model: str) -> str:
    """"0.5 of an A100", "a whole T4", "0.5 of each of 2 V100s"."""
    model = model or "GPU"
    request = Decimal(r.gpu_request).normalize()
    if r.gpu_count > 1:
        return f"{r.gpu_count} whole {model}s" if request == 1 else f"{request:f} of each of {r.gpu_count} {model}s"
    if request == 1:
        return f"a whole {model}"
    return f"{request:f} of {article(model)} {model}"


def title(r: Reservation) -> str:
    return f"'{r.name}'" if r.name else f"#{r.pk}"


def _at(moment: datetime | None) -> str:
    return f"{moment:%H:%M} UTC" if moment else "soon"


def _window(r: Reservation) -> str:
    if r.starts_at is None or r.ends_at is None:
        return "its window"
    return f"{r.starts_at:%Y-%m-%d %H:%M}–{r.ends_at:%H:%M} UTC"


def compose(event: str, r: Reservation, model: str, node: str, why: str = "", minutes: int = 0) -> tuple[str, str]:
    """(subject, text) of `event` for reservation `r` on a GPU of `model` on `node`."""
    it = f"Your reservation {title(r)} ({share_words(r, model)})"
    reason = f": {why}" if why else ""
    match event:
        case "running":
            return (f"{title(r)} is running", f"{it} is running on {node or 'its node'}.")
        case "waiting":
            return (f"{title(r)} is still waiting",
                    f"{it} has waited more than {minutes} minutes for a GPU"
                    + (f" ({r.state_reason})." if r.state_reason else "."))
        case "expiring":
            return (f"{title(r)} ends at {_at(r.expires_at)}",
                    f"{it} ends at {_at(r.expires_at)}, in less than 15 minutes. Extend it on its page if you "
                    "need more time.")
        case "idle":
            return (f"{title(r)} is idle",
                    f"{it} has been idle on {node or 'its node'}: its GPU is barely used. It may be reclaimed "
                    "if it stays idle; release it if you are done.")
        case "reclaim":
            return (f"{title(r)} will be reclaimed at {_at(r.reclaim_at)}",
                    f"{it} runs on borrowed capacity that its owners need back: it will be stopped at "
                    f"{_at(r.reclaim_at)}{reason}. Save your work.")
        case "node_lost":
            after = ("It went back into the queue and will start again." if r.state == "pending"
                     else "It has stopped.")
            where = f" {node}" if node else ""
            because = f" ({why})" if why else ""
            return (f"{title(r)} lost its node", f"{it} lost its node{where}{because}. {after}")
        case "drain":
            return (f"Maintenance over your booking {title(r)}",
                    f"Your booking {title(r)} ({share_words(r, model)}, {_window(r)}) may not get its capacity: "
                    f"{why}. A site admin planned it knowing this. Move the booking to another window on the "
                    "bookings page, or keep it and it starts if capacity is free then.")
        case "finished":
            return (f"{title(r)} finished", f"{it} finished successfully.")
        case "failed":
            return (f"{title(r)} failed", f"{it} failed{reason}.")
    raise ValueError(f"no text for event {event!r}")
