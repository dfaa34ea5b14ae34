"""Telemetry fixtures: a placed reservation and a way to build the agent's messages."""

from __future__ import annotations

import time
import uuid
from decimal import Decimal

import pytest
from channels.testing import WebsocketCommunicator
from django.db import transaction

from portal.fleet.models import Gpu, Node
from portal.telemetry import dbthread, seen, writer
from portal.telemetry.consumers import AgentConsumer
from tests.reservations import running, submitted
from wire.agent_portal import Hello, Samples


@pytest.fixture(autouse=True)
def _fresh_ingest_cache():
    # Reservation ids can be reused between tests (rolled-back transactions).
    seen.forget()
    yield
    seen.forget()


@pytest.fixture
def memory_layer(settings):
    """The agent consumer in-process: an in-memory channel layer, no Redis, no ticker."""
    from channels.layers import channel_layers

    settings.REDIS_URL = ""
    settings.TESSERA_TELEMETRY_TICKER = False
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()
    # The consumer's database threads keep their connections; the test database must be dropped.
    dbthread.close_connections()
    writer.close_connections()


async def agent_socket(token: str) -> WebsocketCommunicator:
    """A connected ws/agents/ socket presenting the node token `token`."""
    communicator = WebsocketCommunicator(AgentConsumer.as_asgi(), "/ws/agents/",
                                         headers=[(b"authorization", f"Bearer {token}".encode())])
    connected, _ = await communicator.connect()
    assert connected
    return communicator


@pytest.fixture
def node(fleet) -> Node:
    return Node.objects.get(name="a100-node-1")


@pytest.fixture
def placed(node, people, teams):
    """Two running reservations on a100-node-1: vision's on GPU 0 (0.5), nlp's on GPU 1 (0.25)."""

    def make(owner, team, gpu_index, share):
        gpu = Gpu.objects.get(node=node, index=gpu_index)
        # One transaction: in tests that commit, the cycle it asks for finds nothing left to place.
        with transaction.atomic():
            return running(submitted(owner, team, image="img", gpu_request=Decimal(share), gpu_memory_mib=4096),
                           gpu)

    return {"vision": make(people["alice"], teams["vision"], 0, "0.5"),
            "nlp": make(people["bob"], teams["nlp"], 1, "0.25")}


def hello_for(node: Node, stream: str | None = None) -> Hello:
    gpus = [{"index": g.index, "uuid": g.uuid, "model": g.model, "memory_mib": g.memory_mib,
             "numa_node": g.numa_node, "nvlink_peers": [], "mig_mode": "disabled"}
            for g in Gpu.objects.filter(node=node).order_by("index")]
    return Hello.model_validate({"v": 1, "type": "hello", "node": node.name, "stream": stream or str(uuid.uuid4()),
                                 "agent_version": "0.1.0", "source": "simulated", "driver_version": "simulated",
                                 "interval_ms": 1000, "gpus": gpus})


def samples_for(node: Node, stream: str, seqs: range, *, util: int = 40, shares=(), ts_ms: int | None = None,
                step_ms: int = 1000) -> Samples:
    """One batch: every GPU of the node at `util` %, plus (reservation, gpu index, used) shares."""
    gpus = list(Gpu.objects.filter(node=node).order_by("index"))
    start = ts_ms if ts_ms is not None else int(time.time() * 1000) - 1000 * len(seqs)
    samples = []
    for i, seq in enumerate(seqs):
        samples.append({
            "seq": seq, "ts_ms": start + i * step_ms,
            "gpus": [{"uuid": g.uuid, "sm_util_pct": util, "mem_util_pct": util // 2, "mem_used_mib": 1000 + g.index,
                      "power_w": 100.0, "temp_c": 50} for g in gpus],
            "processes": [],
            "shares": [{"reservation": str(r), "gpu_uuid": gpus[idx].uuid, "used_frac": used, "mem_used_mib": 512}
                       for r, idx, used in shares],
        })
    return Samples.model_validate({"v": 1, "type": "samples", "stream": stream, "dropped": 0, "samples": samples})
