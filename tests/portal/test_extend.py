"""Extending a reservation: more time before it expires, within the team's maximum duration."""

from datetime import timedelta
from decimal import Decimal

import pytest

from portal.fleet.models import Gpu
from portal.reservations import services
from portal.reservations.models import Reservation, StateTransition
from portal.reservations.states import State
from portal.tenancy.models import TeamPolicy
from tests.reservations import running, submitted


def _running(people, teams, hours: float) -> Reservation:
    """alice's interactive reservation, placed and running now, for `hours`."""
    r = submitted(people["alice"], teams["vision"], image="img", kind="interactive", gpu_request=Decimal("0.5"),
                  gpu_memory_mib=1024, max_duration_s=int(hours * 3600))
    return running(r, Gpu.objects.order_by("pk").first())


def test_extend_moves_the_expiry_and_is_audited(fleet, people, teams):
    r = _running(people, teams, 2)
    assert r.expires_at - r.placed_at == timedelta(hours=2)
    before = r.expires_at
    services.extend(r.pk, people["alice"], 3600)
    r.refresh_from_db()
    assert r.expires_at - before == timedelta(hours=1) and r.max_duration_s == 3 * 3600
    audit = StateTransition.objects.get(reservation=r, from_state=State.RUNNING)
    assert (audit.from_state, audit.to_state, audit.actor_label) == ("running", "running", "alice")
    assert "extended by 1 h to 3 h" in audit.reason


def test_extend_beyond_the_team_maximum_is_refused_and_writes_nothing(fleet, people, teams):
    TeamPolicy.objects.create(team=teams["vision"], max_duration_s=4 * 3600)
    r = _running(people, teams, 3)
    audited = StateTransition.objects.filter(reservation=r).count()
    refused = r"at most 4 h; this one would last 5 h \(you can add up to 60 min\)"
    with pytest.raises(services.ExtendRefused, match=refused):
        services.extend(r.pk, people["alice"], 2 * 3600)
    r.refresh_from_db()
    assert r.max_duration_s == 3 * 3600 and StateTransition.objects.filter(reservation=r).count() == audited


def test_finished_reservation_cannot_be_extended(fleet, people, teams):
    r = _running(people, teams, 1)
    assert services.release(r.pk, State.SUCCEEDED, "its pod ended", "system:test")
    with pytest.raises(services.ExtendRefused, match="is succeeded"):
        services.extend(r.pk, people["alice"], 3600)
