"""Helpers of the notification tests: a block run as if it committed, and a quarter-GPU job."""

from __future__ import annotations

from decimal import Decimal

import pytest

from portal.fleet.models import Gpu
from portal.reservations import events
from tests.reservations import submitted


@pytest.fixture(autouse=True)
def _clean_notes():
    events.forget_pending()
    yield
    events.forget_pending()


@pytest.fixture
def a100(fleet):
    return Gpu.objects.select_related("node").get(node__name="a100-node-1", index=0)


@pytest.fixture
def heard(django_capture_on_commit_callbacks):
    """Run a block as if it committed: the signals (and what they cause) run after it."""
    def run(action):
        # What the test did outside a block never committed: its notes are not announced with it.
        events.forget_pending()
        with django_capture_on_commit_callbacks(execute=True):
            return action()
    return run


def job(user, team, **spec):
    """A pending reservation of a quarter GPU, 4 GiB (submitted outside `heard`: its cycle stays unrun)."""
    return submitted(user, team, **{"gpu_request": Decimal("0.25"), "gpu_memory_mib": 4096, **spec})
