"""The bell, the notifications page, reading them, the preferences page and the demo's mailbox, as
the people who use them: each sees only their own."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from portal.notifications import preferences
from portal.notifications.live import unread_count
from portal.notifications.models import Channel, Event, Notification
from tests.reservations import ended, running

from .conftest import job


@pytest.fixture
def alices_run(people, teams, a100, heard):
    """alice's reservation 'train-resnet' ran and finished: two notifications."""
    r = job(people["alice"], teams["vision"], name="train-resnet")
    heard(lambda: running(r, a100))
    heard(lambda: ended(r))
    return r


def bell_count(html: str) -> int:
    return int(re.search(r'data-bell="user:\d+" data-unread="(\d+)"', html).group(1))


def test_the_bell_counts_unread_and_the_page_lists_them(people, alices_run, browser_for):
    alice = browser_for("alice")
    page = alice.get("/notifications/").content.decode()
    assert bell_count(page) == 2
    assert "Your reservation &#x27;train-resnet&#x27; (0.25 of an A100-80GB) is running on a100-node-1." in page
    assert "finished successfully" in page
    assert bell_count(alice.get("/").content.decode()) == 2  # on every page


def test_reading_one_and_opening_its_reservation(people, alices_run, browser_for):
    alice = browser_for("alice")
    running_one = Notification.objects.get(user=people["alice"], event=Event.RUNNING)
    answer = alice.post(f"/notifications/{running_one.pk}/read/", {"open": "1"})
    assert answer.status_code == 302 and answer["Location"] == f"/reservations/{alices_run.pk}/"
    assert unread_count(people["alice"].pk) == 1
    alice.post("/notifications/read-all/")
    assert unread_count(people["alice"].pk) == 0
    assert bell_count(alice.get("/notifications/").content.decode()) == 0


def test_another_persons_notification_is_404(people, alices_run, browser_for):
    bob = browser_for("bob")
    theirs = Notification.objects.filter(user=people["alice"]).first()
    assert bob.post(f"/notifications/{theirs.pk}/read/").status_code == 404
    assert unread_count(people["alice"].pk) == 2
    page = bob.get("/notifications/").content.decode()
    assert "train-resnet" not in page and bell_count(page) == 0
    bob.post("/notifications/read-all/")  # reads bob's own, none of alice's
    assert unread_count(people["alice"].pk) == 2
    # Nor may bob follow alice's count live.
    state = bob.get(f"/telemetry/live/state/?groups=user:{people['alice'].pk}").json()
    assert state["groups"] == {} and f"user:{people['alice'].pk}" in state["refused"]
    mine = browser_for("alice").get(f"/telemetry/live/state/?groups=user:{people['alice'].pk}").json()
    assert mine["groups"][f"user:{people['alice'].pk}"]["data"] == {"unread": 2}


def test_pages_need_a_sign_in(db):
    assert Client().get("/notifications/").status_code == 302
    assert Client().post("/notifications/1/read/").status_code == 302


def test_preferences_page_saves_and_refuses_in_words(people, browser_for):
    alice = browser_for("alice")
    page = alice.get("/notifications/settings/").content.decode()
    assert re.search(r'name="running__email"[^>]*checked', page)  # the defaults, never saved
    assert not re.search(r'name="idle__email"[^>]*checked', page)  # idle: in the portal only
    bad = alice.post("/notifications/settings/", {"waiting_after_min": "0", "running__webhook": "on"})
    assert bad.status_code == 400
    text = bad.content.decode()
    assert "Wait at least 1 minute before you are told." in text
    assert "Give a webhook URL, or untick the Webhook column." in text
    good = alice.post("/notifications/settings/", {"waiting_after_min": "45", "running__in_app": "on",
                                                   "failed__email": "on"})
    assert good.status_code == 302
    prefs = preferences.of([people["alice"].pk])[people["alice"].pk]
    assert prefs.waiting_after_min == 45
    assert preferences.channels_for(prefs, Event.RUNNING) == {Channel.IN_APP}
    assert preferences.channels_for(prefs, Event.FAILED) == {Channel.EMAIL}
    assert preferences.channels_for(prefs, Event.FINISHED) == set()


def test_the_demo_mailbox_shows_ones_own_mails(people, teams, a100, heard, browser_for, settings, tmp_path):
    settings.EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    settings.EMAIL_FILE_PATH = str(tmp_path / "mail")
    for name in ("alice", "bob"):
        people[name].email = f"{name}@example.com"
        people[name].save()
    r = job(people["alice"], teams["vision"], name="train-resnet")
    settings.DEMO_MODE = False
    assert browser_for("alice").get("/notifications/mail/").status_code == 404
    settings.DEMO_MODE = True
    heard(lambda: running(r, a100))
    assert list((tmp_path / "mail").glob("*.log"))  # written by the file backend
    page = browser_for("alice").get("/notifications/mail/").content.decode()
    assert "[Tessera] &#x27;train-resnet&#x27; is running" in page
    assert f"/reservations/{r.pk}/" in page
    assert "train-resnet" not in browser_for("bob").get("/notifications/mail/").content.decode()
