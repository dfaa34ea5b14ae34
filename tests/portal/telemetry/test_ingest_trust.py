"""An agent speaks only for its own node: share readings are stored only for live allocations on
its node's GPUs, and its hello cannot add GPUs to the fleet."""

from __future__ import annotations

import uuid

import pytest

from portal.fleet.models import Gpu, Node
from portal.reservations import services
from portal.reservations.states import State
from portal.telemetry import agent_batches, ingest, streams
from portal.telemetry.models import GpuSample, ShareSample
from wire.agent_portal import MAX_GPUS_PER_NODE

from .conftest import hello_for, samples_for

pytestmark = pytest.mark.django_db


def _submit(info, message):
    return ingest.store_batches([agent_batches.reduce(info, message)])[0]


def test_an_agent_cannot_report_shares_of_another_nodes_reservations(node, placed):
    other = Node.objects.exclude(pk=node.pk).filter(gpus__isnull=False).first()
    hello = hello_for(other)
    info = streams.register_hello(other, hello)
    stored = _submit(info, samples_for(other, hello.stream, range(1, 3),
                                       shares=[(placed["vision"].pk, 0, 0.9), (placed["nlp"].pk, 1, 0.9)]))
    assert stored.new_samples == 2 and stored.latest.shares == []
    assert not ShareSample.objects.exists()
    assert GpuSample.objects.filter(stream_id=info.stream_pk).exists()  # its own GPUs are stored


def test_only_the_gpu_the_share_holds_counts(node, placed):
    hello = hello_for(node)
    info = streams.register_hello(node, hello)
    # vision holds GPU 0; a reading of it on GPU 3 (which it does not hold) is refused.
    _submit(info, samples_for(node, hello.stream, range(1, 2),
                              shares=[(placed["vision"].pk, 3, 0.7), (placed["vision"].pk, 0, 0.4)]))
    gpu0 = Gpu.objects.get(node=node, index=0)
    assert list(ShareSample.objects.values_list("reservation_id", "gpu_id")) == [(placed["vision"].pk, gpu0.pk)]


def test_a_released_share_stores_nothing_more(node, placed):
    hello = hello_for(node)
    info = streams.register_hello(node, hello)
    _submit(info, samples_for(node, hello.stream, range(1, 2), shares=[(placed["nlp"].pk, 1, 0.5)]))
    assert services.release(placed["nlp"].pk, State.SUCCEEDED, "its pod completed", "test")
    _submit(info, samples_for(node, hello.stream, range(2, 3), shares=[(placed["nlp"].pk, 1, 0.5)]))
    assert ShareSample.objects.count() == 1


@pytest.mark.parametrize("name", ["1" * 40, "9223372036854775808", "pod-7", "12:3"])
def test_odd_reservation_names_are_ignored_not_a_crash(node, placed, name):
    # What the protocol lets through but no reservation id is (bigger than the column, not digits).
    hello = hello_for(node)
    info = streams.register_hello(node, hello)
    message = samples_for(node, hello.stream, range(1, 2))
    sample = message.samples[0]
    share = {"reservation": name, "gpu_uuid": sample.gpus[0].uuid, "used_frac": 0.5, "mem_used_mib": 1}
    odd = message.model_copy(update={"samples": [sample.model_copy(update={
        "shares": [type(sample).model_fields["shares"].annotation.__args__[0].model_validate(share)]})]})
    assert _submit(info, odd).new_samples == 1
    assert not ShareSample.objects.exists()


def test_a_gpu_only_the_agent_knows_of_waits_cordoned_for_an_admin(node):
    hello = hello_for(node)
    forged = hello.gpus[0].model_copy(update={"uuid": f"GPU-{uuid.uuid4()}", "index": 99, "model": "H200-141GB",
                                              "memory_mib": 141_000})
    streams.register_hello(node, hello.model_copy(update={"gpus": [*hello.gpus, forged]}))
    row = Gpu.objects.get(uuid=forged.uuid)
    assert row.cordoned and "approve" in row.cordon_reason
    # The placement snapshot leaves it out: no capacity until a site admin uncordons it.
    from portal.placement import snapshot

    assert forged.uuid not in {g.uuid for n in snapshot.build().nodes for g in n.gpus}
    streams.register_hello(node, hello.model_copy(update={"gpus": [*hello.gpus, forged]}))
    assert Gpu.objects.get(uuid=forged.uuid).cordoned  # a second hello does not approve it


def test_hellos_cannot_flood_the_fleet_with_gpus(node):
    hello = hello_for(node)
    for round_ in range(4):  # each hello as large as the protocol allows, all new GPUs
        extra = [hello.gpus[0].model_copy(update={"uuid": f"GPU-{uuid.uuid4()}", "index": 100 + round_ * 64 + i})
                 for i in range(MAX_GPUS_PER_NODE - len(hello.gpus))]
        streams.register_hello(node, hello.model_copy(update={"gpus": [*hello.gpus, *extra]}))
    assert Gpu.objects.filter(node=node).count() == MAX_GPUS_PER_NODE
