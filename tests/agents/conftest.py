"""A small stand-in portal for the agent tests: a real WebSocket server (the `websockets` library)
that checks the token on the handshake, validates every agent message with the protocol models,
stores samples by sequence number and acknowledges them. Its store survives a kill/restart, like
the portal's database does."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from agents.agent import Agent, AgentSettings
from agents.gpus.simulated import SimulatedSource
from agents.placements import PlacementTable
from wire.agent_portal import AGENT_MESSAGES, PROTOCOL_VERSION, Hello, Links, Samples, parse
from wire.inventory import load_inventory, pick_node

REPO = Path(__file__).resolve().parents[2]
DEMO_INVENTORY = REPO / "deploy" / "inventory" / "demo.yaml"


@dataclass
class FakePortal:
    token: str = "node-token-1"
    other_tokens: set[str] = field(default_factory=set)  # more nodes' tokens, for fleet tests
    handshakes: list[tuple[float, dict[str, str]]] = field(default_factory=list)
    hellos: list[Hello] = field(default_factory=list)
    batches: list[Samples] = field(default_factory=list)
    streams: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)  # stream -> seq -> sample
    arrivals: list[int] = field(default_factory=list)  # every seq received, in order, duplicates included
    errors_from_agent: list[dict[str, Any]] = field(default_factory=list)
    links: list[Links] = field(default_factory=list)  # `links` messages (remote GPU shares)
    refused: list[str] = field(default_factory=list)  # agent messages that failed validation
    first_messages: list[dict[str, Any]] = field(default_factory=list)  # pushed right after welcome
    fail_store_at: int | None = None  # the batch holding this seq fails once, as with a database outage
    acking: bool = True  # False: store but do not ack, as when a portal dies before its acks go out
    port: int = 0
    _server: Server | None = None
    _connections: set[ServerConnection] = field(default_factory=set)

    # -- server lifecycle --

    async def start(self) -> None:
        self._server = await serve(
            self._handler, "127.0.0.1", self.port, process_request=self._check_token, max_size=2**20
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def kill(self) -> None:
        """Drop every connection without a close frame, as a crashed process does, and stop listening."""
        assert self._server is not None
        self._server.close(close_connections=False)
        for ws in list(self._connections):
            ws.transport.abort()
        await self._server.wait_closed()
        self._server = None

    @property
    def listening(self) -> bool:
        return self._server is not None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws/agents/"

    @property
    def stored(self) -> dict[int, dict[str, Any]]:
        """seq -> sample of the one agent stream a test runs (empty before it connects)."""
        assert len(self.streams) <= 1, "several agents: use .streams"
        return next(iter(self.streams.values()), {})

    @property
    def last_seq(self) -> int:
        return max(self.stored, default=0)

    async def push(self, message: dict[str, Any]) -> None:
        for ws in list(self._connections):
            await ws.send(json.dumps(message))

    async def wait_for(self, condition: Callable[[], bool], timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; stored up to {self.last_seq}, refused {self.refused}")
            await asyncio.sleep(0.02)

    # -- protocol --

    def _check_token(self, connection: ServerConnection, request: Any) -> Any:
        self.handshakes.append((time.monotonic(), dict(request.headers.raw_items())))
        accepted = {f"Bearer {t}" for t in {self.token, *self.other_tokens}}
        if request.headers.get("Authorization") not in accepted:
            return connection.respond(HTTPStatus.FORBIDDEN, "node token refused\n")
        return None

    async def _handler(self, ws: ServerConnection) -> None:
        self._connections.add(ws)
        try:
            hello = parse(await ws.recv(), AGENT_MESSAGES)
            assert isinstance(hello, Hello)
            self.hellos.append(hello)
            await ws.send(json.dumps({"v": PROTOCOL_VERSION, "type": "welcome", "node": hello.node,
                                      "stream": hello.stream,
                                      "acked_seq": max(self.streams.get(hello.stream, {}), default=0)}))
            for message in self.first_messages:
                await ws.send(json.dumps(message))
            async for raw in ws:
                data = json.loads(raw)
                if data.get("type") == "error":
                    self.errors_from_agent.append(data)
                    continue
                try:
                    batch = parse(raw, AGENT_MESSAGES)
                except ValueError as exc:
                    self.refused.append(str(exc))
                    continue
                if isinstance(batch, Links):
                    self.links.append(batch)
                    continue
                assert isinstance(batch, Samples)
                if self.fail_store_at is not None and any(s.seq == self.fail_store_at for s in batch.samples):
                    self.fail_store_at = None
                    await ws.send(json.dumps({"v": PROTOCOL_VERSION, "type": "error", "code": "internal",
                                              "message": "database unavailable", "fatal": True,
                                              "ref_seq": batch.samples[0].seq}))
                    await ws.close(1011, "database unavailable")
                    return
                self.batches.append(batch)
                for sample in batch.samples:
                    self.arrivals.append(sample.seq)
                    stored = self.streams.setdefault(batch.stream, {})
                    if sample.seq not in stored:
                        stored[sample.seq] = sample.model_dump()
                if not self.acking:
                    continue
                await ws.send(json.dumps({"v": PROTOCOL_VERSION, "type": "ack", "stream": batch.stream,
                                          "seq": batch.samples[-1].seq}))
        except ConnectionClosed:
            pass
        finally:
            self._connections.discard(ws)


@pytest_asyncio.fixture
async def portal() -> AsyncIterator[FakePortal]:
    fake = FakePortal()
    await fake.start()
    yield fake
    if fake.listening:
        with contextlib.suppress(Exception):
            await fake.kill()


@pytest.fixture
def demo_inventory() -> Path:
    return DEMO_INVENTORY


def make_agent(
    url: str,
    *,
    node: str = "v100-node-1",
    token: str = "node-token-1",
    interval_s: float = 0.05,
    buffer_seconds: float = 900.0,
    backoff: tuple[float, float] = (0.05, 0.3),
    seed: int = 7,
) -> Agent:
    """A simulated agent for one node of the demo inventory, sampling fast so tests stay short."""
    inventory_node = pick_node(load_inventory(DEMO_INVENTORY), node, str(DEMO_INVENTORY))
    table = PlacementTable({g.uuid for g in inventory_node.gpus})
    settings = AgentSettings(
        url=url,
        token=token,
        node=inventory_node.name,
        interval_s=interval_s,
        buffer_seconds=buffer_seconds,
        backoff_base_s=backoff[0],
        backoff_cap_s=backoff[1],
        stable_after_s=0.5,
        drain_timeout_s=3.0,
    )
    return Agent(settings, SimulatedSource(inventory_node, table, seed=seed), table)


@contextlib.asynccontextmanager
async def running(agent: Agent) -> AsyncIterator[Agent]:
    """Run the agent for the body of the block, then stop it the way SIGTERM does."""
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        yield agent
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


@pytest.fixture
def agent_tools() -> tuple[Callable[..., Agent], Callable[[Agent], Any]]:
    return make_agent, running
