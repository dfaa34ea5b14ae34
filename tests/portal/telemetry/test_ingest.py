"""Storing sample batches: idempotent per (node, stream, seq), attributed shares, node seen/lost."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from portal.audit import services as audit
from portal.fleet import services as fleet_services
from portal.fleet.models import Gpu, Node, NodeStatus
from portal.reservations import services
from portal.reservations.models import Reservation
from portal.telemetry import agent_batches, ingest, streams
from portal.telemetry.models import GpuSample, ShareSample
from portal.telemetry.services import placements_for_node, recent_utilization
from scheduler.backends import Phase, PodStatus
from wire.agent_portal import PORTAL_MESSAGES, encode, parse

from .conftest import hello_for, samples_for

pytestmark = pytest.mark.django_db


def _submit(info, message):
    return ingest.store_batches([agent_batches.reduce(info, message)])[0]


def test_replayed_samples_are_stored_once_and_still_acked(node):
    hello = hello_for(node)
    info = streams.register_hello(node, hello)
    assert info.acked_seq == 0
    first = _submit(info, samples_for(node, hello.stream, range(1, 6)))
    assert (first.ack_seq, first.new_samples) == (5, 5)
    # The ack was lost; the agent resends 3..8 after reconnecting.
    again = _submit(info, samples_for(node, hello.stream, range(3, 9)))
    assert (again.ack_seq, again.new_samples) == (8, 3)
    seqs = sorted(set(GpuSample.objects.filter(stream_id=info.stream_pk).values_list("seq", flat=True)))
    assert seqs == list(range(1, 9))
    assert GpuSample.objects.filter(stream_id=info.stream_pk).count() == 8 * 8
    # A reconnect of the same stream is welcomed with what is stored.
    assert streams.register_hello(node, hello).acked_seq == 8


def test_a_new_stream_starts_from_zero(node):
    first = hello_for(node)
    info = streams.register_hello(node, first)
    _submit(info, samples_for(node, first.stream, range(1, 3)))
    # A restarted agent has a new stream: its numbering starts again.
    assert streams.register_hello(node, hello_for(node)).acked_seq == 0


def test_shares_of_unknown_reservations_are_not_stored(node, placed):
    hello = hello_for(node)
    info = streams.register_hello(node, hello)
    _submit(info, samples_for(node, hello.stream, range(1, 3),
                              shares=[(placed["vision"].pk, 0, 0.4), (999999, 2, 0.9)]))
    assert set(ShareSample.objects.values_list("reservation_id", flat=True)) == {placed["vision"].pk}


def test_recent_utilization_is_the_mean_use_per_reservation(node, placed):
    hello = hello_for(node)
    info = streams.register_hello(node, hello)
    _submit(info, samples_for(node, hello.stream, range(1, 3), shares=[(placed["vision"].pk, 0, 0.2)]))
    _submit(info, samples_for(node, hello.stream, range(3, 5), shares=[(placed["vision"].pk, 0, 0.6)]))
    since = timezone.now() - timedelta(minutes=5)
    use = recent_utilization([placed["vision"].pk, placed["nlp"].pk], since)
    # nlp reported nothing: absent (no data), not 0 (idle).
    assert use == {placed["vision"].pk: pytest.approx(0.4)}
    assert recent_utilization([placed["vision"].pk], timezone.now() + timedelta(seconds=5)) == {}


def test_hello_flags_gpus_the_agent_no_longer_has(node):
    hello = hello_for(node)
    gone = hello.gpus[-1].uuid
    trimmed = hello.model_copy(update={"gpus": hello.gpus[:-1]})
    info = streams.register_hello(node, trimmed)
    assert gone not in info.gpu_ids
    assert not Gpu.objects.get(uuid=gone).healthy
    streams.register_hello(node, hello)
    assert Gpu.objects.get(uuid=gone).healthy


def test_silent_node_is_lost_and_comes_back_when_its_agent_reports(node):
    streams.register_hello(node, hello_for(node))
    Node.objects.filter(pk=node.pk).update(last_seen=timezone.now() - timedelta(minutes=5))
    heard, never_seen = Node.objects.exclude(pk=node.pk)[:2]
    Node.objects.filter(pk=heard.pk).update(last_seen=timezone.now())
    assert fleet_services.mark_lost_nodes(timedelta(seconds=90)) == [node.name]
    node.refresh_from_db()
    never_seen.refresh_from_db()
    assert node.status == NodeStatus.LOST and never_seen.status == NodeStatus.READY
    streams.register_hello(node, hello_for(node))
    node.refresh_from_db()
    assert node.status == NodeStatus.READY


def test_no_node_is_lost_when_no_agent_at_all_is_heard(node):
    # Every agent silent at once is the portal's outage, not the fleet's.
    streams.register_hello(node, hello_for(node))
    Node.objects.update(last_seen=timezone.now() - timedelta(minutes=5))
    assert fleet_services.mark_lost_nodes(timedelta(seconds=90)) == []
    node.refresh_from_db()
    assert node.status == NodeStatus.READY


def test_a_drained_node_stays_drained_when_its_agent_reports(node):
    fleet_services.drain(node.pk, audit.cli("test"), "maintenance")
    streams.register_hello(node, hello_for(node))
    node.refresh_from_db()
    assert node.status == NodeStatus.DRAINING


def test_placements_for_the_agent_are_the_live_shares_of_its_node(node, placed):
    for r, uid in ((placed["vision"], "0f1d2c3b-4a5e-4f60-8a7b-9c0d1e2f3a4b"), (placed["nlp"], "not-a-kubernetes-uid")):
        services.record_pod(r.pk, PodStatus(namespace=r.pod_namespace, name=r.pod_name, uid=uid, node=node.name,
                                            phase=Phase.RUNNING, reservation_id=str(r.pk)))
    # What the agent's own validation accepts.
    message = parse(encode(placements_for_node(node.pk)), PORTAL_MESSAGES)
    got = {(p.reservation, p.gpu_uuid, p.request, p.pod_uid) for p in message.placements}
    gpus = {g.index: g.uuid for g in node.gpus.all()}
    assert got == {(str(placed["vision"].pk), gpus[0], 0.5, "0f1d2c3b-4a5e-4f60-8a7b-9c0d1e2f3a4b"),
                   (str(placed["nlp"].pk), gpus[1], 0.25, None)}
    other = Node.objects.exclude(pk=node.pk).first()
    assert placements_for_node(other.pk).placements == []


def test_placements_carry_the_brokers_priority_only_to_agents_that_ask(node, placed):
    placed["vision"].__class__.objects.filter(pk=placed["vision"].pk).update(priority=90)
    placed["nlp"].__class__.objects.filter(pk=placed["nlp"].pk).update(priority=10)
    message = parse(encode(placements_for_node(node.pk, priorities=True)), PORTAL_MESSAGES)
    assert {p.reservation: p.priority for p in message.placements} == {
        str(placed["vision"].pk): "high", str(placed["nlp"].pk): "low"}
    # an older agent refuses unknown fields: it is sent none
    sent = json.loads(encode(placements_for_node(node.pk)))
    assert sent["placements"] and all("priority" not in p for p in sent["placements"])


@pytest.mark.django_db(transaction=True)  # foreign keys are checked at commit
def test_a_reservation_deleted_after_it_was_seen_does_not_block_storage(node, placed):
    from portal.telemetry.writer import store

    hello = hello_for(node)
    info = streams.register_hello(node, hello)
    r = placed["vision"].pk
    store([agent_batches.reduce(info, samples_for(node, hello.stream, range(1, 2), shares=[(r, 0, 0.3)]))])
    Reservation.objects.filter(pk=r).delete()  # the process still remembers it
    stored = store([agent_batches.reduce(info, samples_for(node, hello.stream, range(2, 3),
                                                                   shares=[(r, 0, 0.3)]))])
    assert stored[0].ack_seq == 2
    assert GpuSample.objects.filter(seq=2).count() == 8 and not ShareSample.objects.exists()
