"""The booking pages, server side: "Book ahead" on the request page (and its free windows), the
calendar page per role, cancel, move and delete from there, and the secret iCal feed."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client

from portal.reservations.models import Reservation, StateTransition
from portal.reservations.states import State


def _client(people, name: str) -> Client:
    client = Client()
    client.force_login(people[name])
    return client


@pytest.fixture
def alice(people, fleet):
    return _client(people, "alice")


def _local(at) -> str:
    return at.strftime("%Y-%m-%dT%H:%M")


def _form(day, **overrides) -> dict:
    data = {"team": "vision", "kind": "batch", "image": "busybox:1.36", "command": "", "gpu_model": "T4",
            "gpu_request": "0.5", "gpu_limit": "", "memory_gib": "4", "gpu_count": "1", "hours": "2",
            "priority": "50", "book_start": _local(day), "book_end": "", "book_weeks": "1"}
    data.update(overrides)
    return data


def test_book_ahead_from_the_request_page(alice, day):
    r = alice.post("/reservations/new/", _form(day, book_weeks="2"))
    assert r.status_code == 302, r.content.decode()[-2000:]
    made = Reservation.objects.order_by("starts_at")
    assert [(b.state, b.starts_at, b.ends_at) for b in made] == [
        ("booked", day + timedelta(days=7 * i), day + timedelta(days=7 * i, hours=2)) for i in range(2)]
    page = alice.get(r["Location"]).content.decode()
    assert "booked for" in page and "Booked window" in page
    assert f'action="/reservations/{made[0].pk}/cancel/"' in page  # cancelled before its window too
    assert alice.post(f"/reservations/{made[0].pk}/cancel/").status_code == 302
    assert Reservation.objects.get(pk=made[0].pk).state == State.CANCELLED


def test_a_conflict_shows_the_message_and_free_windows_that_fill_the_form(alice, day):
    assert alice.post("/reservations/new/", _form(day, gpu_count="2", gpu_request="1")).status_code == 302
    r = alice.post("/reservations/new/", _form(day + timedelta(hours=1), hours="1"))
    assert r.status_code == 400
    html = r.content.decode()
    assert "Team vision&#x27;s T4 quota (2 GPU share, 195 GiB, 4 GPUs) does not cover this booking" in html
    assert f'data-start="{_local(day + timedelta(hours=2))}" data-end="{_local(day + timedelta(hours=3))}"' in html
    assert "<details class=\"advanced booking\" open>" in html


def test_an_end_without_a_start_and_a_start_without_a_length_are_refused(alice, day):
    r = alice.post("/reservations/new/", _form(day, book_start="", book_end=_local(day)))
    assert r.status_code == 400 and "Give the start too" in r.content.decode()
    r = alice.post("/reservations/new/", _form(day, hours=""))
    assert r.status_code == 400 and "give the end, or the hours it lasts" in r.content.decode()
    assert not Reservation.objects.exists()


def test_the_calendar_shows_mine_my_teams_and_for_site_admins_the_fleet(people, fleet, teams, booked, day):
    booked(people["alice"], teams["vision"], day, 2, gpu_request=Decimal("0.5"))
    booked(people["alice2"], teams["vision"], day + timedelta(hours=3), 1, gpu_request=Decimal("0.5"))
    booked(people["bob"], teams["nlp"], day, 1, gpu_request=Decimal("0.25"))
    alice = _client(people, "alice").get("/bookings/").content.decode()
    assert alice.count('class="booking-actions"') == 1  # only her own booking can be changed by her
    assert "alice2" in alice and "bob" not in alice and "Booked capacity per GPU model" not in alice
    admin = _client(people, "admin").get("/bookings/").content.decode()
    assert "Booked capacity per GPU model" in admin and "The whole fleet" in admin
    assert "bob" in admin
    assert 'value="0.75"' in admin  # 0.5 and 0.25 of a T4 at once that day
    dave = _client(people, "dave").get("/bookings/").content.decode()
    assert "The teams you manage" in dave and "bob" not in dave


def test_cancel_move_and_delete_from_the_calendar(alice, people, teams, booked, day):
    [one] = booked(people["alice"], teams["vision"], day, 1, gpu_request=Decimal("0.5"))
    [first, second] = booked(people["alice"], teams["vision"], day + timedelta(hours=5), 1,
                             gpu_request=Decimal("0.5"), weeks=2)
    r = alice.post(f"/bookings/{one.pk}/move/", {"start": _local(day + timedelta(hours=1)),
                                                 "end": _local(day + timedelta(hours=3))})
    assert r.status_code == 302
    one.refresh_from_db()
    assert (one.starts_at, one.ends_at) == (day + timedelta(hours=1), day + timedelta(hours=3))
    assert alice.post(f"/bookings/{one.pk}/cancel/").status_code == 302
    assert alice.post(f"/bookings/{first.pk}/delete/").status_code == 302
    states = dict(Reservation.objects.values_list("pk", "state"))
    assert states == {one.pk: State.CANCELLED, first.pk: State.CANCELLED, second.pk: State.CANCELLED}
    reasons = list(StateTransition.objects.filter(reservation=one).values_list("reason", flat=True))
    assert reasons[1].startswith("booking moved from") and reasons[2] == "booking cancelled"


def test_a_move_into_a_taken_window_says_what_is_taken_and_changes_nothing(alice, people, teams, booked, day):
    booked(people["bob"], teams["nlp"], day, 2, gpu_request=Decimal("1"))
    booked(people["bob"], teams["nlp"], day, 2, gpu_request=Decimal("0.5"))
    [mine] = booked(people["alice"], teams["vision"], day + timedelta(hours=4), 1, gpu_request=Decimal("1"))
    r = alice.post(f"/bookings/{mine.pk}/move/", {"start": _local(day), "end": _local(day + timedelta(hours=1))},
                   follow=True)
    assert "was not moved: T4 is fully booked" in r.content.decode() and "Free nearby:" in r.content.decode()
    mine.refresh_from_db()
    assert mine.starts_at == day + timedelta(hours=4)


def test_another_teams_booking_is_not_found_and_a_manager_may_not_cancel(people, fleet, teams, booked, day):
    [theirs] = booked(people["bob"], teams["nlp"], day, 1, gpu_request=Decimal("0.5"))
    [ours] = booked(people["alice"], teams["vision"], day, 1, gpu_request=Decimal("0.5"))
    assert _client(people, "alice").post(f"/bookings/{theirs.pk}/cancel/").status_code == 404
    r = _client(people, "dave").post(f"/bookings/{ours.pk}/cancel/", follow=True)
    assert "Only the owner or a team admin may cancel" in r.content.decode()
    assert _client(people, "carol").post(f"/bookings/{ours.pk}/cancel/").status_code == 302  # vision's admin
    assert Reservation.objects.get(pk=theirs.pk).state == State.BOOKED
    assert Reservation.objects.get(pk=ours.pk).state == State.CANCELLED


def test_the_ical_feed_has_a_secret_address_that_can_be_regenerated(alice, people, teams, booked, day):
    booked(people["alice"], teams["vision"], day, 2, gpu_request=Decimal("0.5"), name="workshop")
    booked(people["alice2"], teams["vision"], day, 2, gpu_request=Decimal("0.5"))
    assert "Create my feed address" in alice.get("/bookings/").content.decode()
    page = alice.post("/bookings/feed/", follow=True).content.decode()
    url = page.split('id="feed-url" type="text" readonly value="')[1].split('"')[0]
    assert url.startswith("http://testserver/bookings/feed/") and url.endswith(".ics")
    assert url not in alice.get("/bookings/").content.decode()  # shown once
    feed = Client().get(url.removeprefix("http://testserver"))  # no sign-in: the address is the key
    assert feed.status_code == 200 and feed["Content-Type"].startswith("text/calendar")
    text = feed.content.decode()
    assert text.count("BEGIN:VEVENT") == 1 and "0.5 T4 (vision): workshop" in text
    assert f"DTSTART:{day:%Y%m%dT%H%M%S}Z" in text
    alice.post("/bookings/feed/")
    assert Client().get(url.removeprefix("http://testserver")).status_code == 404
    assert Client().get("/bookings/feed/not-a-token.ics").status_code == 404


def test_the_calendar_needs_sign_in(db):
    r = Client().get("/bookings/")
    assert r.status_code == 302 and "/login/" in r["Location"]


def test_a_team_admin_sets_the_no_show_minutes_on_the_policy_page(people, fleet, teams):
    from portal.tenancy.policy import policy_of

    carol = _client(people, "carol")
    assert 'name="booking_no_show_min"' in carol.get("/team/vision/policy/").content.decode()
    form = {"max_duration_h": "8", "interactive_max_h": "4", "idle_threshold_pct": "10", "idle_after_min": "15",
            "idle_action": "warn", "idle_warning_min": "20", "max_priority_member": "40", "max_priority_admin": "60"}
    assert carol.post("/team/vision/policy/", form | {"booking_no_show_min": "35"}).status_code == 302
    assert policy_of(teams["vision"]).booking_no_show_min == 35
    r = carol.post("/team/vision/policy/", form | {"booking_no_show_min": "0"})
    assert r.status_code == 400 and "between 1 and 1440" in r.content.decode()


def test_the_preview_says_whether_the_booked_window_is_free(alice, people, teams, booked, day):
    booked(people["bob"], teams["nlp"], day, 2, gpu_request=Decimal("1"))
    free = alice.get("/reservations/new/preview/", _form(day + timedelta(hours=3))).content.decode()
    assert 'data-booking="yes"' in free and "Window free" in free
    taken = alice.get("/reservations/new/preview/", _form(day, gpu_count="2", gpu_request="1")).content.decode()
    assert 'data-booking="no"' in taken and "T4 is fully booked for" in taken
    now = alice.get("/reservations/new/preview/", _form(day, book_start="")).content.decode()
    assert "data-booking" not in now
    assert not Reservation.objects.filter(owner=people["alice"]).exists()
