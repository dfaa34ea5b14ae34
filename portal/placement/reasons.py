"""Why a reservation waits, in its owner's words. The engine explains per rule how many GPUs it
refused ("16 GPU(s) are not of model T4"); a person asked for "0.75 of a T4, 8 GiB" and wants to
hear about the GPUs they asked for: "no T4 GPU has room: 1 has less than 0.75 of a GPU free; left
out: 16 GPUs of other models, 2 awaiting a site admin's approval". The engine's decisions and its
reason codes are untouched: only their wording is the portal's.

GPUs awaiting a site admin's approval are not in the engine's snapshot at all (fleet_cache reads
only uncordoned ones), so they are counted here from the database and named among what is left out.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from portal.fleet.models import Gpu, awaiting_approval
from scheduler.core import Reason, ReasonCode, Request

MIB_PER_GIB = 1024
# Refused for what the person asked (room on the GPUs they could have), said after the headline.
ROOM = (ReasonCode.COMPUTE, ReasonCode.MEMORY, ReasonCode.EXCLUSION, ReasonCode.ANTI_AFFINITY,
        ReasonCode.AFFINITY, ReasonCode.NODE_CPU, ReasonCode.NODE_MEMORY, ReasonCode.WHOLE_GPU)
# GPUs that were never candidates, said as what is left out.
LEFT_OUT = (ReasonCode.MODEL, ReasonCode.NODE_NOT_READY)


def gib_text(mib: int) -> str:
    return f"{mib / MIB_PER_GIB:g} GiB" if mib >= MIB_PER_GIB else f"{mib} MiB"


def _n(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def models_text(req: Request) -> str:
    models = sorted(req.gpu_model or ())
    return " or ".join(models)


def clause(reason: Reason, req: Request, subject: bool = False) -> str:
    """One engine reason about `req`, in words, or "" for one the headline already says. After the
    headline ("no T4 GPU has room: …") a clause starts with the count ("2 have …"); standing alone
    (`subject`) it names the GPUs ("2 T4 GPUs have …")."""
    n, code = reason.count, reason.code
    wanted = models_text(req)

    def some(one: str, many: str) -> str:
        if not subject:
            return _n(n, one, many)
        return f"{n} {wanted + ' ' if wanted else ''}{'GPU' if n == 1 else 'GPUs'} {one if n == 1 else many}"

    if code == ReasonCode.COMPUTE:
        if req.whole:
            return some("is not fully free", "are not fully free")
        return f"{some('has', 'have')} less than {req.gpu_request:g} of a GPU free"
    if code == ReasonCode.MEMORY:
        return f"{some('has', 'have')} less than {gib_text(req.gpu_memory_mib)} of GPU memory free"
    if code == ReasonCode.EXCLUSION:
        if req.exclusion:
            return (f"{some('holds', 'hold')} shares of another exclusion group than yours "
                    f"({', '.join(sorted(req.exclusion))})")
        return f"{some('is', 'are')} kept for an exclusion group you are not asking for"
    if code == ReasonCode.ANTI_AFFINITY:
        return f"{some('holds', 'hold')} a share of anti-affinity group {', '.join(sorted(req.anti_affinity))}"
    if code == ReasonCode.AFFINITY:
        return f"{some('does', 'do')} not hold affinity group {', '.join(sorted(req.affinity))}"
    if code == ReasonCode.NODE_CPU:
        cores = req.cpu_milli / 1000
        return f"{some('is', 'are')} on nodes with less than {cores:g} CPU{'' if cores == 1 else 's'} left"
    if code == ReasonCode.NODE_MEMORY:
        return f"{some('is', 'are')} on nodes with less than {gib_text(req.memory_mib)} of memory left"
    if code == ReasonCode.MODEL:
        return _n(n, "GPU of another model", "GPUs of other models")
    if code == ReasonCode.NODE_NOT_READY:
        return _n(n, "GPU on a draining or lost node", "GPUs on draining or lost nodes")
    if code == ReasonCode.NO_FIT:
        return ""
    return reason.message  # quota, a whole-GPU gang's room, an incomplete gang: already in words


def awaiting_text(count: int) -> str:
    return _n(count, "GPU awaiting a site admin's approval", "GPUs awaiting a site admin's approval")


def waiting_text(reasons: Iterable[Reason], req: Request, awaiting: int = 0) -> str:
    """The reason a waiting reservation shows: the quota's word first, then whether any GPU of
    what it asked for has room and why not, then what was left out (other models, draining or lost
    nodes, `awaiting` approval)."""
    reasons = list(reasons)
    quota = [r.message for r in reasons if r.code == ReasonCode.QUOTA]
    room = [clause(r, req) for r in reasons if r.code in ROOM]
    left_out = [clause(r, req) for r in reasons if r.code in LEFT_OUT]
    if awaiting:
        left_out.append(awaiting_text(awaiting))
    other = [r.message for r in reasons
             if r.code not in (*ROOM, *LEFT_OUT, ReasonCode.QUOTA, ReasonCode.NO_FIT)]
    parts = [*quota, *other]
    if room or left_out or not parts:
        wanted = models_text(req)
        headline = f"no {wanted + ' ' if wanted else ''}GPU has room"
        if room:
            headline += ": " + ", ".join(c for c in room if c)
        if left_out:
            headline += "; left out: " + ", ".join(left_out)
        parts.append(headline)
    return "; ".join(parts)[:500]


class AwaitingApproval:
    """How many GPUs await a site admin's approval, per model; read once, when first asked."""

    def __init__(self) -> None:
        self._by_model: Counter[str] | None = None

    def count(self, req: Request) -> int:
        if self._by_model is None:
            self._by_model = Counter(Gpu.objects.filter(awaiting_approval(), healthy=True)
                                     .values_list("model", flat=True))
        if req.gpu_model is None:
            return sum(self._by_model.values())
        return sum(self._by_model[m] for m in req.gpu_model)


_READY = re.compile(r"\b(\d+) ready GPU\(s\) of (?:model (\S+)|any model)")


def estimate_words(text: str) -> str:
    """The forecast's "the 2 ready GPU(s) of model T4 that could take it" as "the 2 ready T4 GPUs
    that could take it"."""
    def say(m: re.Match) -> str:
        count, models = int(m.group(1)), m.group(2)
        model = " or ".join(models.split("|")) + " " if models else ""
        return f"{count} ready {model}{'GPU' if count == 1 else 'GPUs'}"
    return _READY.sub(say, text)
