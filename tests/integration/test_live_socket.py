"""ws/live/ against a real Daphne and a real simulated agent: a browser only ever receives what
its user may see; sequence numbers and the HTTP state to re-fetch; placements pushed to the agent."""

from __future__ import annotations

import json
import time
import urllib.request
from decimal import Decimal

import pytest
from django.db import transaction
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from portal.fleet.services import issue_node_token
from portal.reservations import rules, services
from portal.telemetry.models import ShareSample
from tests.waiting import wait_for

from .conftest import session_cookie

pytestmark = pytest.mark.timeout(120)


def live_socket(portal, user):
    headers = {"Origin": portal.url}
    if user is not None:
        headers["Cookie"] = session_cookie(user)
    return connect(f"{portal.ws}/ws/live/", additional_headers=headers, open_timeout=10, close_timeout=2)


def collect(ws, seconds: float) -> list[dict]:
    out, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            out.append(json.loads(ws.recv(timeout=max(0.05, deadline - time.monotonic()))))
        except TimeoutError:
            break
    return out


def collect_until(ws, done, limit: float = 120.0) -> list[dict]:
    """The messages read until done(messages) holds; the limit only ends a test that would hang."""
    out, deadline = [], time.monotonic() + limit
    while not done(out):
        assert time.monotonic() < deadline, f"still waiting after {limit} s; got {out[-5:]}"
        out.append(json.loads(ws.recv(timeout=max(0.05, deadline - time.monotonic()))))
    return out


def _share_ids(messages: list[dict]) -> set[int]:
    return {s["reservation"] for m in messages if m.get("type") == "shares" for s in m["data"]["shares"]}


def subscribe(ws, names: list[str]) -> dict:
    ws.send(json.dumps({"subscribe": names}))
    while True:
        message = json.loads(ws.recv(timeout=10))
        if message.get("type") == "subscribed":
            return message


def test_anonymous_browser_is_refused(portal, world):
    with pytest.raises(InvalidStatus) as refused:
        live_socket(portal, None)
    assert refused.value.response.status_code == 403


def test_each_user_receives_only_what_their_team_may_see(portal, agents, world):
    node = world["node"]
    agents.start(node.name, issue_node_token(node), interval=0.2)
    vision, nlp = world["teams"]["vision"], world["teams"]["nlp"]
    r_vision, r_nlp = world["reservations"]["vision"], world["reservations"]["nlp"]
    gpu0, gpu1 = world["gpus"][0], world["gpus"][1]
    everything = [f"team:{vision.pk}", f"team:{nlp.pk}", f"reservation:{r_vision.pk}",
                  f"reservation:{r_nlp.pk}", f"gpu:{gpu0.pk}", f"gpu:{gpu1.pk}", "gpu:0", "team:x"]
    with live_socket(portal, world["people"]["alice"]) as alice, live_socket(portal, world["people"]["bob"]) as bob, \
            live_socket(portal, world["people"]["admin"]) as admin:
        got = subscribe(alice, everything)
        assert got["groups"] == [f"team:{vision.pk}", f"reservation:{r_vision.pk}"]
        # A card's own load includes other teams' work: GPU groups are for staff.
        assert set(got["refused"]) == {f"team:{nlp.pk}", f"reservation:{r_nlp.pk}", f"gpu:{gpu0.pk}",
                                       f"gpu:{gpu1.pk}", "gpu:0", "team:x"}
        assert set(subscribe(bob, everything)["groups"]) == {f"team:{nlp.pk}", f"reservation:{r_nlp.pk}"}
        assert len(subscribe(admin, everything)["groups"]) == 6
        # Each socket is read until what its user may see has come at least once (the agent sends
        # every 0.2 s; a busy machine only makes that slower), then for one more moment.
        seen = {"alice": collect_until(alice, lambda got: _share_ids(got) >= {r_vision.pk}),
                "bob": collect_until(bob, lambda got: _share_ids(got) >= {r_nlp.pk}),
                "admin": collect_until(admin, lambda got: _share_ids(got) >= {r_vision.pk, r_nlp.pk}
                                       and any(m.get("type") == "gpu" for m in got))}
        seen = {name: got + collect(ws, 0.5) for (name, got), ws in zip(seen.items(), (alice, bob, admin), strict=True)}

    def shares(messages):
        return [s for m in messages if m.get("type") == "shares" for s in m["data"]["shares"]]

    assert {s["reservation"] for s in shares(seen["alice"])} == {r_vision.pk}
    assert {s["reservation"] for s in shares(seen["bob"])} == {r_nlp.pk}
    assert {s["reservation"] for s in shares(seen["admin"])} == {r_vision.pk, r_nlp.pk}
    # GPU messages are the GPU's own numbers, never whose work runs on it.
    gpu_messages = [m for m in seen["admin"] if m.get("type") == "gpu"]
    assert gpu_messages and all("shares" not in m["data"] for m in gpu_messages)
    assert {m["group"] for m in seen["alice"] if "group" in m} == set(got["groups"])
    # Each group numbers its messages; a browser that sees a gap asks for the state over HTTP.
    by_group: dict[str, list[int]] = {}
    for m in seen["alice"]:
        if "seq" in m:
            by_group.setdefault(m["group"], []).append(m["seq"])
    assert all(seqs == sorted(seqs) and len(set(seqs)) == len(seqs) for seqs in by_group.values())

    request = urllib.request.Request(
        f"{portal.url}/telemetry/live/state/?groups=team:{vision.pk},team:{nlp.pk},gpu:{gpu0.pk}",
        headers={"Cookie": session_cookie(world["people"]["alice"])})
    with urllib.request.urlopen(request, timeout=10) as response:
        state = json.load(response)
    assert set(state["refused"]) == {f"team:{nlp.pk}", f"gpu:{gpu0.pk}"}
    team_state = state["groups"][f"team:{vision.pk}"]
    assert team_state["seq"] >= max(by_group[f"team:{vision.pk}"])
    assert {s["reservation"] for s in team_state["data"]["shares"]} == {r_vision.pk}


def test_new_placements_reach_the_running_agent(portal, agents, world):
    node = world["node"]
    agents.start(node.name, issue_node_token(node), interval=0.2)
    wait_for(lambda: ShareSample.objects.exists(), 30, "the agent's first share readings")
    # Placing it tells the node's agent after the commit (reservations.events.announce_allocations).
    with transaction.atomic():  # the cycle it asks for, after the commit, finds nothing to place
        r = services.submit(world["people"]["alice"], rules.ReservationSpec(
            team=world["teams"]["vision"], image="img", gpu_request=Decimal("0.25"), gpu_limit=Decimal("0.5"),
            gpu_memory_mib=2048))
        services.place(r.pk, node.pk, [services.NewAllocation(world["gpus"][3].pk, Decimal("0.25"), 2048)])
    wait_for(lambda: ShareSample.objects.filter(reservation=r, gpu=world["gpus"][3]).exists(), 20,
             "the new share in the agent's readings")
