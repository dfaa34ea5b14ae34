"""How much of its reserved time a reservation with an end really uses, learnt from those that ended.

A reservation's end (its expiry) is when it ends at the latest; people release many earlier. The
forecast (`forecast.estimate_starts`) walks the ends it is given: given expiries, it says "at the
latest". `RunLengths` keeps the share of the reserved time that ended reservations used and turns
a running reservation's expiry into its likely end: the median end of the past reservations that
ran at least as long as this one has run so far (so a reservation that has already outlived most
ends late, and one past every observed ratio ends at its expiry). Pure; the caller feeds it.

People differ (one always uses the whole day they book, another stops after an hour), so the
shares are kept per key as well (the caller's: e.g. the owner, the team, the GPU count): an answer
comes from the first of a reservation's keys, most specific first, with at least `min_samples`
ended reservations, else from all of them; with fewer than that in all, nothing is learnt yet (a
few reservations say little about the next: the expiry stands).
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Sequence

MIN_SAMPLES = 20  # ended reservations a key needs before its own shares are used

Keys = Sequence[Hashable]


class RunLengths:
    def __init__(self, ratios: list[float] | None = None, min_samples: int = MIN_SAMPLES) -> None:
        self._ratios: list[float] = sorted(min(1.0, max(0.0, r)) for r in ratios or ())
        self._by_key: dict[Hashable, list[float]] = {}
        self.min_samples = min_samples

    def __len__(self) -> int:
        return len(self._ratios)

    def observe(self, used_s: float, reserved_s: float, keys: Keys = ()) -> None:
        """A reservation of `reserved_s` ended after `used_s` (ended by its owner or its expiry, not
        by preemption or node loss); `keys`: what it is learnt under besides all reservations."""
        if reserved_s <= 0:
            return
        ratio = min(1.0, max(0.0, used_s / reserved_s))
        bisect.insort(self._ratios, ratio)
        for key in keys:
            bisect.insort(self._by_key.setdefault(key, []), ratio)

    def _of(self, keys: Keys) -> list[float]:
        for key in keys:
            found = self._by_key.get(key)
            if found is not None and len(found) >= self.min_samples:
                return found
        return self._ratios if len(self._ratios) >= self.min_samples else []

    def end(self, started: float, reserved_s: float, now: float, keys: Keys = ()) -> float:
        """The likely end of a reservation of `reserved_s` that started at `started` and still runs at
        `now`; its expiry when nothing has been learnt."""
        expiry = started + reserved_s
        ratios = self._of(keys)
        if not ratios or reserved_s <= 0:
            return expiry
        ran = (now - started) / reserved_s
        k = bisect.bisect_right(ratios, ran)  # the past ones that had not ended at this point
        if k >= len(ratios):
            return max(now, expiry)
        ratio = ratios[k + (len(ratios) - k - 1) // 2]
        return min(expiry, max(now, started + ratio * reserved_s))

    def run(self, reserved_s: float, keys: Keys = ()) -> float:
        """The likely run time of a reservation of `reserved_s` not started yet."""
        ratios = self._of(keys)
        if not ratios:
            return reserved_s
        return ratios[(len(ratios) - 1) // 2] * reserved_s
