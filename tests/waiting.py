"""Waiting for a condition, the one way the suite does it. A test waits for what it needs and goes on
the moment it holds; the deadline is only how long a failing test takes to say so. CI may run on a
busy machine (other work beside the suite), so every deadline is stretched by TESSERA_TEST_PATIENCE
(default 3): a passing test costs no more, a slow machine fails nothing."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

PATIENCE = float(os.environ.get("TESSERA_TEST_PATIENCE", "3"))

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, what: str, every: float = 0.2,
             sleep: Callable[[float], object] = time.sleep, ignore: tuple[type[BaseException], ...] = ()) -> T:
    """The first true value of `predicate`, polled every `every` s for up to `timeout` × PATIENCE s;
    `sleep`: how to pass the time between polls (a browser page's own wait, for Playwright);
    `ignore`: exceptions that mean "not yet" (a server still starting)."""
    limit = timeout * PATIENCE
    deadline = time.monotonic() + limit
    while True:
        try:
            value = predicate()
        except ignore:
            value = None
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {limit:g} s waiting for {what}")
        sleep(every)


def until(page, check: Callable[[], object], what: str, timeout_s: float = 60) -> None:
    """In a browser test: poll `check` from here, waiting on the page between polls (the pages'
    CSP forbids eval, which Playwright's wait_for_function needs)."""
    wait_for(check, timeout_s, what, every=0.2, sleep=lambda s: page.wait_for_timeout(s * 1000))
