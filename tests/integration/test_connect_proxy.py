"""Connect through the real portal (Daphne) to a real jupyter-server run by the simulated
cluster's pod: who gets in, what the browser never sees, and a kernel over the proxied WebSocket."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.integration.conftest import Portal, session_cookie
from tests.integration.connect_world import notebook_world, run_in_kernel, wait_for_app

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def notebook(transactional_db, redis_layer, settings, tmp_path):
    world = notebook_world(settings, tmp_path)
    server = Portal(tmp_path)
    server.env.update(world["cluster"])
    server.start()
    world["portal"] = server
    world["cluster_dir"] = tmp_path
    world["cookies"] = {name: session_cookie(user) for name, user in world["people"].items()}
    yield world
    server.stop()
    world["backend"].stop_apps()


def get(world, who: str | None, path: str, **kwargs) -> httpx.Response:
    headers = {"Cookie": world["cookies"][who]} if who else {}
    return httpx.get(f"{world['portal'].url}{path}", headers=headers, timeout=30, **kwargs)


def test_owner_runs_a_cell_through_the_proxy(notebook):
    r = notebook["reservation"]
    wait_for_app(notebook["portal"].url, r.pk, notebook["cookies"]["alice"])
    printed = run_in_kernel(notebook["portal"].url, notebook["portal"].ws, r.pk, notebook["cookies"]["alice"],
                            "print(6*7)")
    assert printed == "42\n"


def test_others_get_404_and_the_admin_only_when_the_policy_allows(notebook):
    from portal.audit.services import Actor
    from portal.tenancy.policy import set_policy

    r = notebook["reservation"]
    path = f"/connect/{r.pk}/api/status"
    wait_for_app(notebook["portal"].url, r.pk, notebook["cookies"]["alice"])
    assert get(notebook, "bob", path).status_code == 404  # another team
    assert get(notebook, "carol", path).status_code == 404  # the team's admin, policy off (the default)
    assert get(notebook, "alice", "/connect/999999/api/status").status_code == 404
    anonymous = get(notebook, None, path)
    assert anonymous.status_code == 302 and anonymous.headers["location"].startswith("/login/")

    set_policy(notebook["teams"]["vision"], Actor(None), {"connect_admins": True})
    assert get(notebook, "carol", path).status_code == 200  # at once: a "no" is never remembered
    assert get(notebook, "bob", path).status_code == 404
    set_policy(notebook["teams"]["vision"], Actor(None), {"connect_admins": False})
    assert get(notebook, "carol", path).status_code == 404  # nor an admin's "yes"


def test_the_token_never_reaches_the_browser_nor_the_portal_cookies_the_app(notebook):
    from portal.connect.access import app_token

    r = notebook["reservation"]
    token = app_token(r.pk)
    wait_for_app(notebook["portal"].url, r.pk, notebook["cookies"]["alice"])
    for path in ("/", "/api/status", "/api/kernelspecs", "/api/me", "/api/contents"):
        answer = get(notebook, "alice", f"/connect/{r.pk}{path}", follow_redirects=True)
        assert answer.status_code == 200, (path, answer.status_code)
        assert token not in answer.text
        assert all(token not in value for value in answer.headers.values())
    # Jupyter's own page for who is asking: the proxy's token made it "authenticated", not the session.
    me = get(notebook, "alice", f"/connect/{r.pk}/api/me").json()
    assert me["identity"]["username"]
    # The app is not reachable without the token (what anyone else on the network would try).
    address = notebook["backend"].app_address(
        __import__("scheduler.backends", fromlist=["PodRef"]).PodRef(r.pod_namespace, r.pod_name), r.app_port)
    assert httpx.get(f"http://{address}/connect/{r.pk}/api/kernels", timeout=10).status_code == 403


def test_a_websocket_of_another_team_or_site_is_refused(notebook):
    r = notebook["reservation"]
    wait_for_app(notebook["portal"].url, r.pk, notebook["cookies"]["alice"])
    url = f"{notebook['portal'].ws}/connect/{r.pk}/api/events/subscribe"
    with pytest.raises(InvalidStatus):
        connect(url, additional_headers={"Cookie": notebook["cookies"]["bob"],
                                         "Origin": notebook["portal"].url}, open_timeout=10)
    with pytest.raises(InvalidStatus):  # alice's session, but a page of another site
        connect(url, additional_headers={"Cookie": notebook["cookies"]["alice"],
                                         "Origin": "https://elsewhere.example"}, open_timeout=10)
    with connect(url, additional_headers={"Cookie": notebook["cookies"]["alice"],
                                          "Origin": notebook["portal"].url}, open_timeout=10) as ws:
        assert ws.protocol.state.name == "OPEN"


# The portal remembers an owner's "yes" per session and rechecks it on each request: each of these
# is refused on the very next request after the change, with no wait (its app still runs: a 404,
# the proxy's refusal, not the 502 of an app that is gone).

def test_an_ended_reservation_is_404_at_once(notebook):
    from portal.reservations import services

    r = notebook["reservation"]
    path = f"/connect/{r.pk}/api/status"
    wait_for_app(notebook["portal"].url, r.pk, notebook["cookies"]["alice"])
    assert get(notebook, "alice", path).status_code == 200  # remembered now
    services.cancel(r.pk, notebook["people"]["alice"])
    assert get(notebook, "alice", path).status_code == 404


def test_a_new_owner_gets_in_and_the_old_one_is_refused_at_once(notebook):
    from portal.reservations.models import Reservation

    r = notebook["reservation"]
    path = f"/connect/{r.pk}/api/status"
    wait_for_app(notebook["portal"].url, r.pk, notebook["cookies"]["alice"])
    assert get(notebook, "alice", path).status_code == 200
    assert get(notebook, "carol", path).status_code == 404  # the team's admin; the policy is off
    Reservation.objects.filter(pk=r.pk).update(owner=notebook["people"]["carol"])
    assert get(notebook, "alice", path).status_code == 404
    assert get(notebook, "carol", path).status_code == 200
    Reservation.objects.filter(pk=r.pk).update(owner=notebook["people"]["alice"])
    assert get(notebook, "carol", path).status_code == 404
    assert get(notebook, "alice", path).status_code == 200


def test_a_session_that_ends_or_a_user_who_goes_is_refused_at_once(notebook):
    from django.contrib.sessions.models import Session

    r = notebook["reservation"]
    path = f"/connect/{r.pk}/api/status"
    wait_for_app(notebook["portal"].url, r.pk, notebook["cookies"]["alice"])
    assert get(notebook, "alice", path).status_code == 200
    alice = notebook["people"]["alice"]
    alice.set_password("a new one")  # Django ends her other sessions: so does the proxy
    alice.save()
    assert get(notebook, "alice", path).status_code == 302  # to the sign-in page
    alice.refresh_from_db()
    notebook["cookies"]["alice"] = session_cookie(alice)
    assert get(notebook, "alice", path).status_code == 200
    alice.is_active = False
    alice.save()
    assert get(notebook, "alice", path).status_code == 302
    alice.is_active = True
    alice.save()
    assert get(notebook, "alice", path).status_code == 200
    Session.objects.all().delete()  # signed out
    assert get(notebook, "alice", path).status_code == 302


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_a_100_mb_download_streams_through_without_being_held(notebook):
    import hashlib
    import os

    r = notebook["reservation"]
    wait_for_app(notebook["portal"].url, r.pk, notebook["cookies"]["alice"])
    root = notebook["cluster_dir"] / "apps" / f"{r.pod_namespace}-{r.pod_name}"
    chunk = os.urandom(1024 * 1024)
    with (root / "big.bin").open("wb") as out:
        for _ in range(100):
            out.write(chunk)
    expected = hashlib.sha256(chunk * 100).hexdigest()
    daphne = notebook["portal"].proc.pid
    before = _peak_rss_mib(daphne)
    digest, size, paused_at = hashlib.sha256(), 0, 0
    with httpx.stream("GET", f"{notebook['portal'].url}/connect/{r.pk}/files/big.bin",
                      headers={"Cookie": notebook["cookies"]["alice"]}, timeout=120) as answer:
        assert answer.status_code == 200
        for part in answer.iter_raw():
            digest.update(part)
            size += len(part)
            if size - paused_at >= 10 * 1024 * 1024:
                # A slow client: the app on the loopback could hand the portal the rest of the file
                # in this pause, and the portal must not take it before the client reads it.
                time.sleep(0.5)
                paused_at = size
    assert size == 100 * 1024 * 1024 and digest.hexdigest() == expected
    assert _peak_rss_mib(daphne) - before < 50  # the portal held a few chunks at a time, not the file
