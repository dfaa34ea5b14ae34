"""The bounds of a terminal. Each can be set in settings as TESSERA_TERMINAL_<NAME>."""

from __future__ import annotations

import time
from collections.abc import Callable

from django.conf import settings

DEFAULTS = {
    "MAX_INPUT_BYTES": 64 * 1024,  # one input frame (a paste); larger ones close the terminal with 1009
    "INPUT_MESSAGES_PER_S": 100.0,  # keystrokes are frames: typing is ~10/s, a held key ~30/s
    "INPUT_BURST": 400,
    "OUTPUT_BYTES_PER_S": 512 * 1024,  # the shell is held (not read) beyond this: backpressure
    "OUTPUT_BURST_BYTES": 256 * 1024,
    "OUTPUT_CHUNK_BYTES": 16 * 1024,  # the largest output frame
    "IDLE_S": 30 * 60,  # no input for this long closes the terminal
    "PER_USER": 3,  # terminals open at once per user
    "CHECK_S": 5.0,  # the reservation and the session are looked at again this often
    "MAX_ROWS": 500,
    "MAX_COLS": 1000,
}


def limit(name: str):
    return getattr(settings, f"TESSERA_TERMINAL_{name}", DEFAULTS[name])


class OutputPace:
    """Bytes per second with a burst: `delay(n)` spends `n` bytes and says how long to wait
    before the next send so that the average stays at `rate`."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("an output pace needs rate > 0 and burst >= 1")
        self.rate, self.burst, self._clock = float(rate), float(burst), clock
        self._tokens, self._stamp = float(burst), clock()

    def delay(self, n: int) -> float:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate) - n
        self._stamp = now
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate
