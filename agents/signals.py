"""Stopping an agent process on SIGTERM or SIGINT, once, without a traceback on the way out."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_on_signals(loop: asyncio.AbstractEventLoop, stop: Callable[[], object]) -> None:
    """Call `stop` on the first SIGTERM or SIGINT; hold back any later one until the process ends.

    A second signal is common (Ctrl-C reaches the whole process group, then a supervisor sends
    SIGTERM) and must not land while asyncio closes the loop: the loop closes its wakeup pipe before
    it removes its signal handlers, so a signal in between is written to a closed descriptor and
    Python prints "Exception ignored ... Bad file descriptor". Blocked, it stays pending and is
    dropped when the process exits; the process is already stopping anyway.
    """

    def first_signal() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        stop()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, first_signal)
