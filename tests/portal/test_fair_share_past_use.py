"""Fair share over time (off by default): a team's past use, decayed with a half-life, as the
portal reads it from the allocations for the cycle's order."""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.reservations.engine_quotas import past_use
from tests.reservations import clock_at, ended, running, submitted

HOUR = 3600.0


def test_off_by_default_and_when_zero(settings):
    from django.conf import settings as conf

    assert conf.TESSERA_FAIR_SHARE_HALF_LIFE_S == 0
    assert past_use(0, timezone.now()) == {}


def test_recent_use_weighs_more_than_old_use(people, fleet, teams):
    now = timezone.now()
    a100 = list(fleet.filter(model="A100-80GB"))
    # vision held a whole GPU all along (5 half-lives and more); nlp held one only long ago.
    with clock_at(now - timedelta(hours=10)):
        running(submitted(people["alice"], teams["vision"], gpu_request="1", gpu_memory_mib=100), a100[0])
        old = running(submitted(people["bob"], teams["nlp"], gpu_request="1", gpu_memory_mib=100), a100[1])
    with clock_at(now - timedelta(hours=6)):
        ended(old)
    # nlp's recent half share: the last half-life only.
    with clock_at(now - timedelta(hours=1)):
        running(submitted(people["bob"], teams["nlp"], gpu_request="0.5", gpu_memory_mib=100), a100[2])
    got = past_use(HOUR, now)
    assert got["vision"] == pytest.approx(1000.0, rel=1e-6)  # the whole window at 1.0
    # 0.5 over the last half-life: weight (1 - 2^-1) of (1 - 2^-5) of the window's weight.
    assert got["nlp"] == pytest.approx(500.0 * 0.5 / (1 - 2 ** -5), rel=1e-3)
