"""Who may watch which live group, and the state a browser re-fetches after a gap."""

from __future__ import annotations

import pytest
from django.test import Client

from portal.telemetry import agent_batches, ingest, live, streams

from .conftest import hello_for, samples_for

pytestmark = pytest.mark.django_db


def test_group_names_are_strict():
    assert live.parse_group("team:12") == live.Group("team", 12)
    assert live.parse_group("fleet").name == "fleet" and live.parse_group("fleet").channel_group == "live.fleet"
    for bad in ("team:0", "team:-1", "team:01", "Team:1", "team:1 ", "gpu:", "node:1", 7, None, "team:1:2",
                "fleet:1", "Fleet", "fleet "):
        assert live.parse_group(bad) is None


def test_members_see_their_team_and_its_reservations_only(people, teams, placed, node):
    vision, nlp = teams["vision"], teams["nlp"]
    gpu = live.Group("gpu", node.gpus.first().pk)
    cases = {
        "alice": {("team", vision.pk), ("reservation", placed["vision"].pk)},
        "dave": {("team", vision.pk), ("reservation", placed["vision"].pk)},  # managers read
        "bob": {("team", nlp.pk), ("reservation", placed["nlp"].pk)},
        "admin": {("team", vision.pk), ("team", nlp.pk), ("reservation", placed["vision"].pk),
                  ("reservation", placed["nlp"].pk)},
    }
    every = [live.Group(k, i) for k, i in set().union(*cases.values())]
    for name, allowed in cases.items():
        user = people[name]
        assert {(g.kind, g.id) for g in every if live.may_see(user, g)} == allowed, name
        # A card's own load includes other teams' work: staff only, as in the reports.
        assert live.may_see(user, gpu) == (name == "admin")
    assert not live.may_see(people["admin"], live.Group("gpu", 999_999))
    assert not live.may_see(people["admin"], live.Group("reservation", 999_999))


def test_one_message_per_group_per_commit_and_gpu_messages_never_carry_shares():
    def reading(node, gpu, shares):
        return live.Latest(node=node, ts_ms=1_800_000_000_000 + node, gpus=[(gpu, 50, 1, 1, None, None)],
                           shares=[(r, t, gpu, 0.5, None) for r, t in shares])

    messages = live.messages_for([reading(1, 5, [(9, 3), (10, 4)]), reading(2, 6, [(11, 3)])])
    assert set(messages) == {"gpu:5", "gpu:6", "team:3", "team:4", "reservation:9", "reservation:10",
                             "reservation:11"}
    assert "shares" not in messages["gpu:5"]["data"]
    # Team 3 has work on both nodes: both readings are in its one message, nothing of team 4.
    assert [s["reservation"] for s in messages["team:3"]["data"]["shares"]] == [9, 11]
    assert messages["team:3"]["data"]["ts_ms"] == 1_800_000_000_002


def test_live_state_answers_only_visible_groups(people, teams, placed, node):
    hello = hello_for(node)
    info = streams.register_hello(node, hello)
    ingest.store_batches([agent_batches.reduce(info, samples_for(
        node, hello.stream, range(1, 2), shares=[(placed["vision"].pk, 0, 0.3), (placed["nlp"].pk, 1, 0.6)]))])
    client = Client()
    assert client.get("/telemetry/live/state/?groups=gpu:1").status_code == 401
    client.force_login(people["alice"])
    gpu0 = node.gpus.get(index=0)
    response = client.get(f"/telemetry/live/state/?groups=team:{teams['vision'].pk},team:{teams['nlp'].pk},"
                          f"gpu:{gpu0.pk},bogus")
    assert response.status_code == 200
    body = response.json()
    assert set(body["refused"]) == {f"team:{teams['nlp'].pk}", f"gpu:{gpu0.pk}", "bogus"}
    team = body["groups"][f"team:{teams['vision'].pk}"]
    assert team["seq"] == 0 and [s["reservation"] for s in team["data"]["shares"]] == [placed["vision"].pk]
    staff = Client()
    staff.force_login(people["admin"])
    gpu_state = staff.get(f"/telemetry/live/state/?groups=gpu:{gpu0.pk}").json()["groups"][f"gpu:{gpu0.pk}"]
    assert gpu_state["data"]["sm_util_pct"] == 40
    # The fleet's state is "anything up to seq may have changed": the page re-reads its rows if drawn earlier.
    fleet = body_of(staff, "fleet")["groups"]["fleet"]
    assert fleet == {"seq": fleet["seq"], "type": "nodes", "data": {"all": True, "seq": fleet["seq"]}}
    assert body_of(client, "fleet")["refused"] == {"fleet": "not found or not visible to you"}
    for bad in ("", "?groups=", "?groups=gpu:1&x=1", "?groups=" + ",".join(f"gpu:{i}" for i in range(1, 300))):
        assert client.get("/telemetry/live/state/" + bad).status_code == 400, bad


def body_of(client, groups: str) -> dict:
    return client.get(f"/telemetry/live/state/?groups={groups}").json()


def test_the_fleet_hears_of_the_nodes_a_changed_reservation_holds_gpus_on(people, teams, fleet):
    """nodes_holding (a precompiled statement) names the nodes of live allocations only: the
    same nodes the ORM finds, none for a reservation that holds nothing or has released its GPUs."""
    from portal.reservations.models import Allocation
    from portal.telemetry.live_fleet import nodes_holding
    from tests.reservations import ended, running, submitted
    from tests.reservations import placed as place

    alice, vision = people["alice"], teams["vision"]
    gpus = list(fleet)
    by_node: dict[int, list] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node_id, []).append(gpu)
    first, second = (by_node[n] for n in sorted(by_node)[:2])
    place(submitted(alice, vision, gpu_request="0.1", gpu_memory_mib=10), first[0])
    running(submitted(alice, vision, gpu_request="0.1", gpu_memory_mib=10), second[0])
    held = running(submitted(alice, vision, gpu_request="0.1", gpu_memory_mib=10), second[1])
    done = ended(running(submitted(alice, vision, gpu_request="0.1", gpu_memory_mib=10), first[1]))
    waiting = submitted(alice, vision, gpu_request="0.1", gpu_memory_mib=10)
    ids = [*Allocation.objects.values_list("reservation_id", flat=True).distinct(), waiting.pk]

    def orm(reservation_ids):
        return sorted(set(Allocation.objects.filter(reservation_id__in=reservation_ids, released_at__isnull=True)
                          .values_list("gpu__node_id", flat=True)))

    assert nodes_holding(ids) == orm(ids) == sorted({first[0].node_id, second[0].node_id})
    assert nodes_holding([held.pk]) == [second[1].node_id]
    assert nodes_holding([done.pk]) == nodes_holding([waiting.pk]) == nodes_holding([]) == []


@pytest.mark.asyncio
async def test_readings_nobody_watches_are_not_made_into_messages(settings, monkeypatch):
    settings.REDIS_URL = ""
    live.watching.forget()  # in memory: nobody watches anything

    def refuse(*args, **kwargs):
        raise AssertionError("messages built for groups nobody watches")

    monkeypatch.setattr(live.publishing, "messages_for", refuse)
    reading = live.Latest(node=1, ts_ms=1_800_000_000_000, gpus=[(5, 50, 1, 1, None, None)], shares=[])
    assert await live.Publisher().publish([reading]) == 0
