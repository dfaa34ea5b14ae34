"""Work expected to arrive: what recently arrived, replayed forward as the demand still to come.

A waiting request's start depends on more than the queue of the moment: a team further below its
share, or a higher priority, that submits later goes ahead of it, and small work that arrives
later takes room it cannot yet use. `Arrivals` learns, from the requests that arrived within the
last `window_s`, each (team, model, priority band)'s arrival rate, and the sizes and run lengths
of its requests; `forward(now, horizon_s)` is that demand over the next `horizon_s`, each key's
requests evenly spaced at its rate, the shapes taken in turn from what it submitted (the expected
count, deterministic: the same history gives the same stream). The forecast walks it as requests
that join the queue at their arrival time (`estimate_starts(arrivals=...)`), ranked by the
caller's order like any other.

A run length is what the request ran (it ended), else the median of its key's known ones, else
of all known ones; with fewer than `min_arrivals` arrivals, nothing is learnt (the forecast
then walks the present queue only). Pure; the caller feeds it.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable
from dataclasses import dataclass, replace

from ..model import Request

DEFAULT_WINDOW_S = 24 * 3600.0  # learn the rate from this long (a day: teams' day cycles average out)
DEFAULT_HORIZON_S = 12 * 3600.0  # expected arrivals are walked this far ahead
MIN_ARRIVALS = 20  # arrivals in the window before any rate is learnt
MAX_FORWARD = 2000  # expected arrivals walked at most (the horizon shrinks to fit)
PREFIX = "~expected:"  # the ids of expected arrivals (never a reservation's id)


def band(priority: int) -> int:
    """Priority bands: 0 (opportunistic: anyone may evict it), 1-4, 5 and up."""
    return 0 if priority <= 0 else 1 if priority < 5 else 2


@dataclass(frozen=True)
class Expected:
    """A request expected to arrive at `at` and run `run_s` once started."""

    at: float
    request: Request
    run_s: float


class Arrivals:
    def __init__(self, window_s: float = DEFAULT_WINDOW_S, min_arrivals: int = MIN_ARRIVALS) -> None:
        self.window_s = window_s
        self.min_arrivals = min_arrivals
        self._seen: dict[Hashable, list[tuple[float, Request, float | None]]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def observe(self, created_at: float, req: Request, run_s: float | None = None) -> None:
        """A request that arrived at `created_at` (within the window the caller reads); `run_s`: how
        long it ran, where it ended (None: not known yet)."""
        models = req.gpu_model if req.gpu_model is None else "|".join(sorted(req.gpu_model))
        self._seen.setdefault((req.team, models, band(req.priority)), []).append((created_at, req, run_s))
        self._count += 1

    def forward(self, now: float, horizon_s: float = DEFAULT_HORIZON_S, limit: int = MAX_FORWARD) -> list[Expected]:
        """The arrivals expected within `horizon_s` of `now`, in time order (ids PREFIX + a number)."""
        if self._count < self.min_arrivals or horizon_s <= 0:
            return []
        known = [run for seen in self._seen.values() for _, _, run in seen if run is not None]
        if not known:
            return []
        overall = statistics.median(known)
        horizon_s = min(horizon_s, limit * self.window_s / self._count)  # at most `limit` in all
        out: list[tuple[float, int, Request, float]] = []
        for k, key in enumerate(sorted(self._seen, key=repr)):
            seen = sorted(self._seen[key], key=lambda s: s[0])
            runs = [run for _, _, run in seen if run is not None]
            typical = statistics.median(runs) if runs else overall
            gap = self.window_s / len(seen)  # the key's rate, as a spacing
            n = 0
            while (at := now + (n + 0.5) * gap) < now + horizon_s:
                _, req, run = seen[n % len(seen)]
                out.append((at, k, req, run if run is not None else typical))
                n += 1
        out.sort(key=lambda x: (x[0], x[1]))
        return [Expected(at, replace(req, id=f"{PREFIX}{i}", created_at=at, group=None), max(60.0, run))
                for i, (at, _, req, run) in enumerate(out)]
