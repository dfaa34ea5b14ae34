"""Booking a window through the services: checked against the model's cards and the team's quota,
refused with what is taken and the nearest free windows, moved, cancelled, deleted and started."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from portal.fleet.models import Gpu
from portal.reservations import rules, services
from portal.reservations.models import Allocation, Reservation, StateTransition
from portal.reservations.states import State
from tests.reservations import SYSTEM, clock_at, placed, running


def _audit(r) -> list[tuple[str, str, str]]:
    return [(t.from_state, t.to_state, t.reason) for t in StateTransition.objects.filter(reservation=r)]


def test_a_booking_is_booked_for_its_window_and_holds_nothing(fleet, people, teams, booked, day):
    [r] = booked(people["alice"], teams["vision"], day, 2, gpu_request=Decimal("0.5"))
    r.refresh_from_db()
    assert r.state == State.BOOKED
    assert (r.starts_at, r.ends_at) == (day, day + timedelta(hours=2))
    assert r.max_duration_s == 7200 and r.admission == "guaranteed"
    assert not Allocation.objects.filter(reservation=r).exists()
    [(before, after, reason)] = _audit(r)
    assert (before, after) == ("", "booked") and f"{day:%Y-%m-%d} 09:00–11:00 UTC" in reason


@pytest.mark.parametrize(("start", "end", "duration", "weeks", "field", "words"), [
    (-1, 2, None, 1, "starts_at", "must be in the future"),
    (91 * 24, 2, None, 1, "starts_at", "at most 90 days ahead"),
    (24, None, None, 1, "ends_at", "either ends_at or duration_s"),
    (24, 26, 3600, 1, "ends_at", "either ends_at or duration_s"),
    (24, 23, None, 1, "ends_at", "at least a minute after starts_at"),
    (24, None, 3600, 13, "repeat_weeks", "1 to 12 times"),
    (80 * 24, None, 3600, 3, "repeat_weeks", "the last of 3 weekly windows would start more than 90 days ahead"),
])
def test_a_window_out_of_bounds_is_refused_by_field(db, start, end, duration, weeks, field, words):
    from django.utils import timezone

    now = timezone.now()
    with pytest.raises(rules.RuleViolation) as refused:
        services.window_of(now + timedelta(hours=start), now + timedelta(hours=end) if end is not None else None,
                           duration, weeks)
    assert words in " ".join(refused.value.errors[field])


def test_a_booking_names_one_model(fleet, people, teams, booked, day):
    with pytest.raises(rules.RuleViolation, match="a booking names one GPU model"):
        booked(people["alice"], teams["vision"], day, 1, gpu_model="T4|V100-32GB")


def test_whole_gpus_taken_refuse_an_overlapping_window_and_offer_the_nearest_free_ones(
        fleet, people, teams, booked, day):
    booked(people["alice"], teams["vision"], day, 2, gpu_count=2)  # both T4s, 09:00–11:00
    with pytest.raises(services.BookingConflict) as refused:
        booked(people["bob"], teams["nlp"], day + timedelta(hours=1), 2, gpu_request=Decimal("0.5"))
    message = str(refused.value)
    assert f"T4 is fully booked for {day:%Y-%m-%d} 10:00–12:00 UTC" in message
    assert "2 of its 2 GPUs' compute" in message
    assert [(s - day, e - day) for s, e in refused.value.free_windows] == [
        (timedelta(hours=2), timedelta(hours=4)), (timedelta(hours=2, minutes=15), timedelta(hours=4, minutes=15)),
        (timedelta(hours=2, minutes=30), timedelta(hours=4, minutes=30))]
    assert not Reservation.objects.filter(team=teams["nlp"]).exists()
    # the window right after is free
    [r] = booked(people["bob"], teams["nlp"], day + timedelta(hours=2), 2, gpu_request=Decimal("0.5"))
    assert r.state == State.BOOKED


def test_fractions_share_cards_by_compute_and_memory(fleet, people, teams, booked, day):
    for _ in range(4):  # four halves fill both T4s
        booked(people["alice"], teams["vision"], day, 1, gpu_request=Decimal("0.5"), gpu_memory_mib=7000)
    with pytest.raises(services.BookingConflict, match="2 of its 2 GPUs' compute and 27 of 30 GiB are booked"):
        booked(people["bob"], teams["nlp"], day, 1, gpu_request=Decimal("0.1"), gpu_memory_mib=1000)


def test_memory_alone_can_fill_a_card(fleet, people, teams, booked, day):
    booked(people["alice"], teams["vision"], day, 1, gpu_request=Decimal("0.2"), gpu_memory_mib=15000)
    booked(people["alice"], teams["vision"], day, 1, gpu_request=Decimal("0.2"), gpu_memory_mib=15000)
    with pytest.raises(services.BookingConflict, match="fully booked"):
        booked(people["bob"], teams["nlp"], day, 1, gpu_request=Decimal("0.1"), gpu_memory_mib=1024)


def test_the_teams_quota_for_the_model_bounds_its_bookings(fleet, people, teams, booked, day):
    # nlp's `*` quota: 1.5 GPU share. One A100 booked; a second overlapping one would be 2.0.
    booked(people["bob"], teams["nlp"], day, 3, gpu_model="A100-80GB")
    with pytest.raises(services.BookingConflict) as refused:
        booked(people["bob"], teams["nlp"], day + timedelta(hours=1), 1, gpu_model="A100-80GB")
    assert "team nlp's A100-80GB quota (1.5 GPU share" in str(refused.value)
    assert "its bookings take 1 GPU share" in str(refused.value)
    assert refused.value.free_windows[0][0] == day + timedelta(hours=3)
    # a half fits beside it, and the same A100 window is open to another team
    booked(people["bob"], teams["nlp"], day + timedelta(hours=1), 1, gpu_model="A100-80GB",
           gpu_request=Decimal("0.5"))
    booked(people["alice"], teams["vision"], day + timedelta(hours=1), 1, gpu_model="A100-80GB")


def test_a_team_without_a_quota_for_the_model_books_nothing(fleet, people, teams, booked, day):
    from portal.tenancy.models import Quota

    Quota.objects.filter(team=teams["nlp"]).update(gpu_model="V100-32GB")
    with pytest.raises(services.BookingConflict, match="team nlp's T4 quota \\(0 GPU share"):
        booked(people["bob"], teams["nlp"], day, 1, gpu_request=Decimal("0.5"))


def test_weekly_repeats_are_booked_all_or_none(fleet, people, teams, booked, day):
    week = timedelta(days=7)
    booked(people["bob"], teams["nlp"], day + 2 * week, 1)  # one of the two T4s, in the third week
    with pytest.raises(services.BookingConflict, match=f"T4 is fully booked for {(day + 2 * week):%Y-%m-%d} 09:00"):
        booked(people["alice"], teams["vision"], day, 1, weeks=3, gpu_count=2)
    assert not Reservation.objects.filter(team=teams["vision"]).exists()
    made = booked(people["alice"], teams["vision"], day, 1, weeks=12, gpu_request=Decimal("0.5"))
    assert [r.starts_at for r in made] == [day + i * week for i in range(12)]
    assert len({r.booking_series for r in made}) == 1 and made[0].booking_series is not None
    assert "(week 12 of 12)" in _audit(made[-1])[0][2]


def test_moving_a_booking_rechecks_the_new_window_but_not_against_itself(fleet, people, teams, booked, day):
    [mine] = booked(people["alice"], teams["vision"], day, 2, gpu_count=2)
    moved = services.move_booking(mine.pk, people["alice"], day + timedelta(hours=1), day + timedelta(hours=3))
    assert (moved.starts_at, moved.ends_at) == (day + timedelta(hours=1), day + timedelta(hours=3))
    assert "booking moved from" in _audit(mine)[-1][2] and _audit(mine)[-1][:2] == ("booked", "booked")
    [theirs] = booked(people["bob"], teams["nlp"], day + timedelta(hours=4), 1, gpu_request=Decimal("0.5"))
    with pytest.raises(services.BookingConflict, match="fully booked"):
        services.move_booking(theirs.pk, people["bob"], day + timedelta(hours=2), day + timedelta(hours=3))
    theirs.refresh_from_db()
    assert theirs.starts_at == day + timedelta(hours=4)


def test_cancelling_frees_the_window_and_deleting_cancels_the_rest_of_the_series(fleet, people, teams, booked,
                                                                                     day):
    [first, *rest] = booked(people["alice"], teams["vision"], day, 1, gpu_count=2, weeks=3)
    services.cancel_booking(first.pk, people["alice"])
    first.refresh_from_db()
    assert first.state == State.CANCELLED and _audit(first)[-1] == ("booked", "cancelled", "booking cancelled")
    booked(people["bob"], teams["nlp"], day, 1, gpu_request=Decimal("0.5"))  # its window is free again
    assert services.delete_series(rest[0].pk, people["alice"]) == [r.pk for r in rest]
    assert {(r.state, _audit(r)[-1][2]) for r in Reservation.objects.filter(pk__in=[r.pk for r in rest])} == {
        ("cancelled", "booking deleted")}


def test_at_its_start_a_booking_becomes_pending_and_is_placed_until_its_window_ends(fleet, people, teams,
                                                                                      booked, day):
    [r] = booked(people["alice"], teams["vision"], day, 2, gpu_request=Decimal("0.5"))
    with clock_at(day - timedelta(seconds=1)):
        assert services.start_due() == (0, 0)
    with clock_at(day + timedelta(seconds=5)):
        assert services.start_due() == (1, 0)
        r.refresh_from_db()
        assert r.state == State.PENDING and "its booked window started" in r.state_reason
        r = placed(r, Gpu.objects.filter(model="T4").first())
    assert r.expires_at == day + timedelta(hours=2)


def test_a_window_missed_entirely_is_cancelled_and_one_still_waiting_at_its_end_expires(fleet, people, teams,
                                                                                        booked, day):
    [missed] = booked(people["alice"], teams["vision"], day, 1, gpu_request=Decimal("0.5"))
    [waiting] = booked(people["alice"], teams["vision"], day + timedelta(hours=3), 1, gpu_request=Decimal("0.5"))
    with clock_at(day + timedelta(hours=2)):
        assert services.start_due() == (0, 1)
    with clock_at(day + timedelta(hours=3, minutes=1)):
        assert services.start_due() == (1, 0)
    with clock_at(day + timedelta(hours=4)):
        assert services.start_due() == (0, 1)
    missed.refresh_from_db()
    waiting.refresh_from_db()
    assert (missed.state, waiting.state) == (State.CANCELLED, State.EXPIRED)


def test_ending_a_running_booking_early_frees_the_rest_of_its_window(fleet, people, teams, booked, day):
    [r] = booked(people["alice"], teams["vision"], day, 4, gpu_count=2)
    with clock_at(day + timedelta(seconds=1)):
        services.start_due()
    gpus = list(Gpu.objects.filter(model="T4").order_by("pk"))
    placed_r = placed(r, gpus[0])
    assert services.move(placed_r.pk, State.PLACED, State.RUNNING, "its pod runs", SYSTEM)
    with pytest.raises(services.BookingConflict):
        booked(people["bob"], teams["nlp"], day + timedelta(hours=2), 1, gpu_request=Decimal("0.5"))
    services.cancel_booking(r.pk, people["alice"])
    booked(people["bob"], teams["nlp"], day + timedelta(hours=2), 1, gpu_request=Decimal("0.5"))


def test_a_booked_reservation_cannot_be_placed_before_its_start(fleet, people, teams, booked, day):
    from portal.reservations.states import IllegalTransition

    [r] = booked(people["alice"], teams["vision"], day, 1, gpu_request=Decimal("0.5"))
    with pytest.raises(IllegalTransition):
        running(r, Gpu.objects.filter(model="T4").first())


def test_a_booking_beyond_the_quota_alone_offers_no_windows(fleet, people, teams, booked, day):
    with pytest.raises(services.BookingConflict) as refused:  # nlp's quota is 1.5 GPU share
        booked(people["bob"], teams["nlp"], day, 1, gpu_count=2)
    assert refused.value.free_windows == []
