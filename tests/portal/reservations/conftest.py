"""Bookings: windows on days ahead, made through the booking service."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from portal.reservations import rules, services


@pytest.fixture
def day():
    """09:00 UTC two days from now: a morning comfortably in the future."""
    base = datetime.now(UTC).replace(hour=9, minute=0, second=0, microsecond=0) + timedelta(days=2)
    return base


@pytest.fixture
def booked():
    """`booked(user, team, start, hours, **spec)`: the booking's reservations (one per week)."""

    def make(user, team, start: datetime, hours: float, *, weeks: int = 1, image: str = "busybox:1.36", **spec):
        spec.setdefault("gpu_request", Decimal("1"))
        spec.setdefault("gpu_memory_mib", 8192)
        spec.setdefault("gpu_model", "T4")
        window = services.window_of(start, start + timedelta(hours=hours), weeks=weeks)
        return services.book(user, rules.ReservationSpec(team=team, image=image, **spec), window)

    return make
