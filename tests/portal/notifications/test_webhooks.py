"""A person's webhook gets Slack-compatible JSON from a Celery task, posted to a real HTTP server
the test runs; private addresses and plain http are refused unless allowed; failures are retried a
bounded number of times."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from portal.notifications import preferences, webhooks
from portal.notifications.forms import PreferencesForm
from portal.notifications.models import Channel, Event, Notification
from tests.reservations import running

from .conftest import job


class Hook:
    """An HTTP server on 127.0.0.1 that records each POST and answers `status`."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.posts: list[tuple[dict, bytes]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                hook.posts.append((dict(self.headers), body))
                self.send_response(hook.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/T000/B000/secret"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook():
    server = Hook()
    yield server
    server.close()


@pytest.fixture
def local_webhooks(settings):
    settings.TESSERA_WEBHOOK_ALLOW_HTTP = True
    settings.TESSERA_WEBHOOK_ALLOW_PRIVATE = True
    return settings


def wants_webhook(user, url: str) -> None:
    chosen = {e: set(preferences.DEFAULTS[e]) for e in Event.values}
    chosen[Event.RUNNING] = {Channel.IN_APP, Channel.WEBHOOK}
    preferences.save(user, chosen, 15, url)


def test_running_posts_slack_json_to_the_webhook(people, teams, a100, heard, hook, local_webhooks):
    alice = people["alice"]
    wants_webhook(alice, hook.url)
    r = job(alice, teams["vision"], name="train-resnet")
    heard(lambda: running(r, a100))
    [(headers, body)] = hook.posts
    n = Notification.objects.get(user=alice, event=Event.RUNNING)
    assert json.loads(body) == {"text": n.text}
    assert headers["Content-Type"] == "application/json"
    assert n.text.startswith("Your reservation 'train-resnet'")
    assert n.webhook == "sent"


def test_a_private_address_is_refused_unless_allowed(people, teams, a100, heard, hook, settings):
    settings.TESSERA_WEBHOOK_ALLOW_HTTP = True
    settings.TESSERA_WEBHOOK_ALLOW_PRIVATE = False
    alice = people["alice"]
    wants_webhook(alice, hook.url)  # stored before the rule changed: checked again before each post
    r = job(alice, teams["vision"])
    heard(lambda: running(r, a100))
    assert hook.posts == []
    n = Notification.objects.get(user=alice, event=Event.RUNNING)
    assert n.webhook == "failed"
    assert n.webhook_error == "The webhook URL leads to a private address (127.0.0.1); use a public one."
    prefs = preferences.of([alice.pk])[alice.pk]
    form = PreferencesForm({"waiting_after_min": "15", "webhook_url": "http://10.1.2.3/hook",
                            "running__webhook": "on"}, prefs=prefs)
    assert not form.is_valid()
    assert form.errors["webhook_url"] == ["The webhook URL leads to a private address (10.1.2.3); use a public one."]


def test_plain_http_is_refused_outside_the_demo(settings):
    settings.TESSERA_WEBHOOK_ALLOW_HTTP = False
    with pytest.raises(webhooks.WebhookRefused, match="must start with https://"):
        webhooks.check("http://hooks.example.com/x", resolve=False)
    with pytest.raises(webhooks.WebhookRefused, match="no user name or password"):
        webhooks.check("https://me:pw@hooks.example.com/x", resolve=False)
    assert webhooks.check("https://hooks.example.com/a?b=1", resolve=False).path == "/a?b=1"


@pytest.mark.parametrize(("status", "tries", "outcome"), [(500, 3, "failed"), (404, 1, "failed"), (204, 1, "sent")])
def test_failures_are_retried_a_bounded_number_of_times(people, teams, a100, heard, local_webhooks, status, tries,
                                                         outcome):
    server = Hook(status)
    try:
        alice = people["alice"]
        wants_webhook(alice, server.url)
        r = job(alice, teams["vision"])
        heard(lambda: running(r, a100))
        assert len(server.posts) == tries
    finally:
        server.close()
    n = Notification.objects.get(user=alice, event=Event.RUNNING)
    assert n.webhook == outcome
    if outcome == "failed":
        assert f"answered {status}" in n.webhook_error


def test_an_unreachable_webhook_gives_up(people, teams, a100, heard, local_webhooks):
    closed = Hook()
    closed.close()  # nothing listens there any more
    alice = people["alice"]
    wants_webhook(alice, closed.url)
    r = job(alice, teams["vision"])
    heard(lambda: running(r, a100))
    n = Notification.objects.get(user=alice, event=Event.RUNNING)
    assert n.webhook == "failed" and "could not reach 127.0.0.1" in n.webhook_error
