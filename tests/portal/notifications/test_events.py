"""Each event of a reservation tells its owner exactly once, on the channels they chose: in the
portal always by default, by e-mail for running, finished, failed, reclaim and node lost."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core import mail
from django.utils import timezone

from portal.notifications import preferences
from portal.notifications.checks import run_checks
from portal.notifications.live import unread_count
from portal.notifications.models import Channel, Event, Notification
from portal.reservations import services
from portal.reservations.states import State
from tests.reservations import clock_at, ended, placed, running

from .conftest import job


def mine(user, event=None):
    rows = Notification.objects.filter(user=user)
    return list(rows.filter(event=event) if event else rows)


def test_running_tells_the_owner_once_in_the_portal_and_by_mail(people, teams, a100, heard):
    alice = people["alice"]
    alice.email = "alice@example.com"
    alice.save()
    r = job(alice, teams["vision"], name="train-resnet", gpu_request=Decimal("0.5"), gpu_memory_mib=4096,
                  max_duration_s=3600)
    heard(lambda: running(r, a100))
    [n] = mine(alice)
    assert n.event == Event.RUNNING
    assert n.text == "Your reservation 'train-resnet' (0.5 of an A100-80GB) is running on a100-node-1."
    assert [m.to for m in mail.outbox] == [["alice@example.com"]]
    assert "is running on a100-node-1" in mail.outbox[0].body
    assert mail.outbox[0].subject == "[Tessera] 'train-resnet' is running"
    n.refresh_from_db()
    assert (n.email, n.webhook) == ("sent", "off")
    # The same reservation changing again (extended) tells nobody again.
    heard(lambda: services.extend(r.pk, alice, 3600))
    assert len(mine(alice)) == 1 and len(mail.outbox) == 1
    assert unread_count(alice.pk) == 1


def test_finished_and_failed(people, teams, a100, heard):
    alice = people["alice"]
    one = running(job(alice, teams["vision"], name="ok"), a100)
    two = running(job(alice, teams["vision"], name="bad"), a100)
    heard(lambda: ended(one, State.SUCCEEDED))
    heard(lambda: ended(two, State.FAILED, "pod tessera-r2-1 failed (OOMKilled)"))
    assert [n.text for n in mine(alice, Event.FINISHED)] == [
        "Your reservation 'ok' (0.25 of an A100-80GB) finished successfully."]
    assert [n.text for n in mine(alice, Event.FAILED)] == [
        "Your reservation 'bad' (0.25 of an A100-80GB) failed: pod tessera-r2-1 failed (OOMKilled)."]
    assert not mine(alice, Event.RUNNING)  # their running happened outside `heard`


def test_reclaim_warning(people, teams, a100, heard):
    alice = people["alice"]
    alice.email = "alice@example.com"
    alice.save()
    r = job(alice, teams["vision"], name="borrower")
    heard(lambda: running(r, a100, admission="borrowed"))
    mail.outbox.clear()
    at = timezone.now() + timedelta(minutes=5)
    heard(lambda: services.warn_reclaim(r.pk, at, "nlp needs its quota back"))
    heard(lambda: services.warn_reclaim(r.pk, at, "nlp needs its quota back"))  # once warned stays warned
    [n] = mine(alice, Event.RECLAIM)
    assert f"it will be stopped at {at:%H:%M} UTC: nlp needs its quota back" in n.text
    assert n.email == "sent" and [m.subject for m in mail.outbox] == [
        f"[Tessera] 'borrower' will be reclaimed at {at:%H:%M} UTC"]


def test_idle_warning_is_in_the_portal_only_by_default(people, teams, a100, heard):
    alice = people["alice"]
    alice.email = "alice@example.com"
    alice.save()
    r = job(alice, teams["vision"], name="notebook")
    heard(lambda: running(r, a100))
    mail.outbox.clear()
    heard(lambda: services.flag_idle(r.pk, True, timezone.now()))
    [n] = mine(alice, Event.IDLE)
    assert n.in_app and n.email == "off" and mail.outbox == []
    assert "has been idle on a100-node-1" in n.text


@pytest.mark.parametrize("requeue", [False, True])
def test_node_lost_is_one_notification_not_also_failed(people, teams, a100, heard, requeue):
    alice = people["alice"]
    teams["vision"].requeue_on_node_lost = requeue
    teams["vision"].save()
    r = running(job(alice, teams["vision"], name="long-job"), a100)
    heard(lambda: services.lose(r.pk, "node a100-node-1 is not ready"))
    [n] = mine(alice, Event.NODE_LOST)
    assert mine(alice, Event.FAILED) == []
    assert n.text.startswith("Your reservation 'long-job' (0.25 of an A100-80GB) lost its node a100-node-1 "
                             "(node a100-node-1 is not ready).")
    assert n.text.endswith("It went back into the queue and will start again." if requeue else "It has stopped.")


def test_waiting_long_follows_the_owners_limit(people, teams, fleet, heard):
    alice, bob = people["alice"], people["bob"]
    preferences.save(bob, {e: {Channel.IN_APP} for e in Event.values}, 30, "")
    twenty_ago = timezone.now() - timedelta(minutes=20)
    with clock_at(twenty_ago):
        job(alice, teams["vision"], name="queued", gpu_model="T4")
        job(bob, teams["nlp"], name="patient")
    assert run_checks() == (1, 0)
    assert run_checks() == (0, 0)  # once per time in the queue
    [n] = mine(alice, Event.WAITING)
    assert n.text.startswith("Your reservation 'queued' (0.25 of a T4) has waited more than 15 minutes")
    assert mine(bob) == []  # bob waits 30 minutes before he is told
    assert run_checks(timezone.now() + timedelta(minutes=11)) == (1, 0)
    assert len(mine(bob, Event.WAITING)) == 1


def test_expiring_in_15_minutes_once_per_end(people, teams, a100, heard):
    alice = people["alice"]
    start = timezone.now() - timedelta(minutes=50)
    with clock_at(start):
        r = running(job(alice, teams["vision"], name="short", max_duration_s=3600), a100)
    assert run_checks(start + timedelta(minutes=40)) == (0, 0)  # 20 minutes left: not yet
    assert run_checks() == (0, 1)
    assert run_checks() == (0, 0)
    [n] = mine(alice, Event.EXPIRING)
    assert "ends at" in n.text and "in less than 15 minutes" in n.text
    heard(lambda: services.extend(r.pk, alice, 3600))  # a new end: warned again when it comes near
    assert run_checks() == (0, 0)
    assert run_checks(timezone.now() + timedelta(minutes=55)) == (0, 1)


def test_preferences_choose_the_channels(people, teams, a100, heard):
    alice = people["alice"]
    alice.email = "alice@example.com"
    alice.save()
    chosen = {e: set(preferences.DEFAULTS[e]) for e in Event.values}
    chosen[Event.RUNNING] = set()  # not even in the portal
    chosen[Event.FINISHED] = {Channel.IN_APP}  # not by mail
    preferences.save(alice, chosen, 15, "")
    r = job(alice, teams["vision"])
    heard(lambda: running(r, a100))
    heard(lambda: ended(r))
    assert mail.outbox == []
    assert unread_count(alice.pk) == 1  # finished; running is stored (once) but shown nowhere
    assert {n.event: n.in_app for n in mine(alice)} == {Event.RUNNING: False, Event.FINISHED: True}


def test_placing_many_reservations_tells_nobody(people, teams, a100, heard):
    alice = people["alice"]
    rs = [job(alice, teams["vision"]) for _ in range(3)]
    heard(lambda: [placed(r, a100) for r in rs])
    assert mine(alice) == []


def test_a_second_try_to_notify_the_same_event_stores_and_sends_nothing(people, teams, a100, heard):
    from portal.notifications.services import Occurrence, notify

    alice = people["alice"]
    alice.email = "alice@example.com"
    alice.save()
    r = job(alice, teams["vision"], name="twice")
    heard(lambda: running(r, a100))
    again = Occurrence(f"r{r.pk}:running:{r.attempt + 1}", Event.RUNNING, r)
    assert Notification.objects.get(user=alice).key == again.key
    assert heard(lambda: notify([again])) == []  # the key is taken: no row, no mail
    assert len(mail.outbox) == 1


def test_a_failing_notification_does_not_keep_the_change_from_the_live_pages(people, teams, a100, heard,
                                                                             monkeypatch):
    from portal.notifications import subscribers
    from portal.reservations.events import reservations_changed

    heard_by_others = []
    reservations_changed.connect(lambda sender, changes, **kw: heard_by_others.append(changes),
                                 dispatch_uid="test-after-notifications", weak=False)
    try:
        monkeypatch.setattr(subscribers, "notify", lambda found: 1 / 0)
        r = job(people["alice"], teams["vision"])
        heard(lambda: running(r, a100))
    finally:
        reservations_changed.disconnect(dispatch_uid="test-after-notifications")
    assert heard_by_others and all(r.pk in changes for changes in heard_by_others)
    assert mine(people["alice"]) == []
