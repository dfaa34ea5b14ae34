"""How much of its reserved time a reservation with an end really uses, learnt from those that ended.

A reservation's end (its expiry) is when it ends at the latest; people release many earlier. The
forecast (`forecast.estimate_starts`) walks the ends it is given: given expiries, it says "at the
latest". `RunLengths` keeps the share of the reserved time that ended reservations used and turns
a running reservation's expiry into its likely end: the median end of the past reservations that
ran at least as long as this one has run so far (so a reservation that has already outlived most
ends late, and one past every observed ratio ends at its expiry). Pure; the caller feeds it.
"""

from __future__ import annotations

import bisect


class RunLengths:
    def __init__(self, ratios: list[float] | None = None) -> None:
        self._ratios: list[float] = sorted(min(1.0, max(0.0, r)) for r in ratios or ())

    def __len__(self) -> int:
        return len(self._ratios)

    def observe(self, used_s: float, reserved_s: float) -> None:
        """A reservation of `reserved_s` ended after `used_s` (ended by its owner or its expiry, not
        by preemption or node loss)."""
        if reserved_s > 0:
            bisect.insort(self._ratios, min(1.0, max(0.0, used_s / reserved_s)))

    def end(self, started: float, reserved_s: float, now: float) -> float:
        """The likely end of a reservation of `reserved_s` that started at `started` and still runs at
        `now`; its expiry when nothing has been learnt."""
        expiry = started + reserved_s
        if not self._ratios or reserved_s <= 0:
            return expiry
        ran = (now - started) / reserved_s
        k = bisect.bisect_right(self._ratios, ran)  # the past ones that had not ended at this point
        if k >= len(self._ratios):
            return max(now, expiry)
        ratio = self._ratios[k + (len(self._ratios) - k - 1) // 2]
        return min(expiry, max(now, started + ratio * reserved_s))

    def run(self, reserved_s: float) -> float:
        """The likely run time of a reservation of `reserved_s` not started yet."""
        if not self._ratios:
            return reserved_s
        return self._ratios[(len(self._ratios) - 1) // 2] * reserved_s
