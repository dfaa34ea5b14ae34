"""Sign-in throttles, checked before any password is hashed or any user row is read.

Failed sign-ins are counted per username and per client address in fixed windows in the cache
(Redis in production, so every portal process shares them). Once either count reaches its limit,
further attempts for that username or from that address are refused with the seconds to wait,
without touching the database or the password hasher: a flood of wrong passwords costs one cache
round trip each, and cannot fill the database pool nor keep the CPU hashing. Successful sign-ins
are not counted, so people behind one NAT are not locked out by their colleagues' logins.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured

from .addresses import client_address

_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([smhd])[a-z]*\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Rate:
    limit: int
    window_s: int


def parse_rate(text: str) -> Rate:
    """'10/15m' → 10 per 900 s; '30/h', '5/min' too."""
    match = _RATE.match(text or "")
    if not match:
        raise ImproperlyConfigured(f"a rate is 'count/period' like '10/15m' or '30/h', got {text!r}")
    count, multiple, unit = match.groups()
    return Rate(int(count), int(multiple or 1) * _UNIT_S[unit])


def _key(kind: str, value: str, rate: Rate, now: float) -> tuple[str, int]:
    window = int(now // rate.window_s)
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"signin:{kind}:{digest}:{window}", int(rate.window_s - now % rate.window_s) + 1


def _subjects(request, username: str | None) -> list[tuple[str, str, Rate]]:
    subjects = []
    if username:
        subjects.append(("user", username.strip().casefold()[:150],
                         parse_rate(settings.TESSERA_SIGNIN_FAILURES_PER_USERNAME)))
    address = client_address(request.META) if request is not None else ""
    if address:
        subjects.append(("addr", address, parse_rate(settings.TESSERA_SIGNIN_FAILURES_PER_ADDRESS)))
    return subjects


def retry_after(request, username: str | None) -> int | None:
    """Seconds until this username and address may try again, or None when they may now."""
    now = time.time()
    waits = []
    for kind, value, rate in _subjects(request, username):
        key, left = _key(kind, value, rate, now)
        if (cache.get(key) or 0) >= rate.limit:
            waits.append(left)
    return max(waits) if waits else None


def record_failure(request, username: str | None) -> None:
    now = time.time()
    for kind, value, rate in _subjects(request, username):
        key, left = _key(kind, value, rate, now)
        cache.add(key, 0, timeout=left)
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.set(key, 1, timeout=left)
