"""WebSocket consumers: `ws/agents/` (node agents, token auth) and `ws/live/` (browsers, session).

Thin: validation comes from agents.protocol, storage from ingest/writer, visibility from live.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time

from asgiref.sync import sync_to_async
from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from agents.protocol import (
    AGENT_MESSAGES,
    TOKEN_PATTERN,
    Error,
    Hello,
    ProtocolError,
    Samples,
    error_message,
    parse,
)
from portal.fleet.services import node_for_token

from . import conf, dbthread, ingest, live, ticker
from .services import placements_for_node
from .writer import writer

log = logging.getLogger(__name__)

_BEARER = re.compile(r"^Bearer (" + TOKEN_PATTERN.strip("^$") + r")$")
_FIRST_SEQ = re.compile(rb'"seq"\s*:\s*([0-9]{1,16})')


class TokenBucket:
    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, float(burst)
        self.tokens = float(burst)
        self.at = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


def _bearer_token(scope) -> str | None:
    values = [v for k, v in scope.get("headers", []) if k.lower() == b"authorization"]
    if len(values) != 1:
        return None
    try:
        m = _BEARER.match(values[0].decode("ascii"))
    except UnicodeDecodeError:
        return None
    return m.group(1) if m else None


# PROTOCOL.md section 6 names 1008 / 1009 / 1011, but Daphne (autobahn) lets a server send only
# 1000 or 3000-4999; the portal sends 4000 + the standard code. The agent treats every close alike.
CLOSE_POLICY = 4008
CLOSE_TOO_BIG = 4009
CLOSE_INTERNAL = 4011
CLOSE_SUPERSEDED = 4409


def _node_group(node_id: int) -> str:
    return f"agent.node.{node_id}"


class AgentConsumer(AsyncWebsocketConsumer):
    """One node agent. Protocol: agents/PROTOCOL.md."""

    async def dispatch(self, message) -> None:
        # Channels closes old database connections before every handler, a thread hop per
        # message; this consumer touches the database only through dbthread and the writer,
        # which manage their own connections.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"no handler for message type {message['type']}")
        await handler(message)

    async def connect(self) -> None:
        self.node = None
        self.info: ingest.StreamInfo | None = None
        self.hello: Hello | None = None
        self.broken = False  # a store failed: nothing more may be stored or acked here
        token = _bearer_token(self.scope)
        try:
            # Daphne drops a handshake the application has not answered in 5 s.
            node = await dbthread.run(node_for_token, token, within=4.0) if token else None
        except dbthread.Stale:
            await self.close()  # refused for now; the agent retries with backoff
            return
        if node is None:
            await self.close()  # before accept: the handshake is answered 403, nothing is read
            return
        self.node = node
        self.bucket = TokenBucket(*conf.agent_rate())
        self.max_skew = conf.max_future_skew()
        ticker.ensure_started()
        await self.accept()

    async def disconnect(self, code) -> None:
        if self.node is not None and self.hello is not None:
            await self.channel_layer.group_discard(_node_group(self.node.pk), self.channel_name)

    async def _fatal(self, code: str, message: str, close_code: int) -> None:
        await self.send(error_message(code, message, fatal=True))
        await self.close(close_code)

    async def receive(self, text_data=None, bytes_data=None) -> None:
        if self.node is None or self.broken:
            return
        if not self.bucket.take():
            log.warning("agent of %s is flooding; closing", self.node.name)
            await self._fatal("rate_limited", "over the portal's message rate; slow down", CLOSE_POLICY)
            self.broken = True
            return
        raw = text_data if text_data is not None else bytes_data
        try:
            message = parse(raw, AGENT_MESSAGES)
        except ProtocolError as exc:
            await self._refuse(exc, raw)
            return
        if isinstance(message, Hello):
            await self._on_hello(message)
        elif self.hello is None:
            await self._fatal("unexpected_message", f"{message.type} before hello; send hello first", CLOSE_POLICY)
        elif isinstance(message, Samples):
            await self._on_samples(message)
        elif isinstance(message, Error):
            log.info("agent of %s refused a message: %s %s", self.node.name, message.code, message.message)

    async def _refuse(self, exc: ProtocolError, raw) -> None:
        if exc.code == "too_large":
            await self._fatal("too_large", str(exc), CLOSE_TOO_BIG)
        elif self.hello is None:
            await self._fatal(exc.code, f"the first message must be a valid hello: {exc}", CLOSE_POLICY)
        else:
            ref = None
            if isinstance(raw, str):
                m = _FIRST_SEQ.search(raw[:4096].encode())
                ref = int(m.group(1)) if m and int(m.group(1)) >= 1 else None
            await self.send(error_message(exc.code, str(exc), fatal=False, ref_seq=ref))

    async def _on_hello(self, hello: Hello) -> None:
        if self.hello is not None:
            await self._fatal("unexpected_message", "a second hello on one connection", CLOSE_POLICY)
            return
        if hello.node != self.node.name:
            await self._fatal("node_mismatch", f"this token belongs to node {self.node.name}, not {hello.node}",
                              CLOSE_POLICY)
            return
        try:
            # The agent waits WELCOME_TIMEOUT_S (10 s) for the welcome.
            self.info = await dbthread.run(ingest.register_hello, self.node, hello, within=8.0)
        except dbthread.Stale:
            await self._fatal("internal", "the portal is busy; try again later", CLOSE_INTERNAL)
            return
        except Exception:
            log.exception("registering hello of %s failed", self.node.name)
            await self._fatal("internal", "the portal could not record the hello; try again later",
                              CLOSE_INTERNAL)
            return
        self.hello = hello
        group = _node_group(self.node.pk)
        # An older connection of the same node gives way (close 4409); then this one joins.
        await self.channel_layer.group_send(group, {"type": "agent.superseded", "by": self.channel_name})
        await self.channel_layer.group_add(group, self.channel_name)
        await self.send(json.dumps({"v": 1, "type": "welcome", "node": hello.node, "stream": hello.stream,
                                    "acked_seq": self.info.acked_seq}, separators=(",", ":")))
        await self._send_placements()

    async def _on_samples(self, message: Samples) -> None:
        if message.stream != self.hello.stream:
            await self.send(error_message("invalid_message",
                                          f"samples: stream: {message.stream} is not this connection's stream",
                                          ref_seq=message.samples[0].seq))
            return
        problem = ingest.too_far_ahead(message, skew=self.max_skew)
        if problem:
            await self.send(error_message("invalid_message", problem, ref_seq=message.samples[0].seq))
            return
        try:
            stored = await writer().submit(ingest.Submission(self.info, message))
        except Exception:
            self.broken = True
            await self._fatal("internal", "the portal could not store samples; resend after reconnecting",
                              CLOSE_INTERNAL)
            return
        await self.send(json.dumps({"v": 1, "type": "ack", "stream": message.stream, "seq": stored.ack_seq},
                                   separators=(",", ":")))

    async def _send_placements(self) -> None:
        try:
            body = await dbthread.run(placements_for_node, self.node.pk)
        except Exception:
            # The agent keeps its previous placements; it gets the full list at its next hello.
            log.exception("reading the placements of %s failed", self.node.name)
            return
        await self.send(json.dumps(body, separators=(",", ":")))

    # Channel layer events
    async def placements_changed(self, event) -> None:
        if self.hello is not None and not self.broken:
            await self._send_placements()

    async def agent_token_changed(self, event) -> None:
        self.broken = True
        await self._fatal("node_mismatch", "this node's token was revoked or replaced", CLOSE_POLICY)

    async def agent_superseded(self, event) -> None:
        if event.get("by") != self.channel_name:
            self.broken = True
            await self.close(CLOSE_SUPERSEDED)


class LiveConsumer(AsyncWebsocketConsumer):
    """A browser. Sends {"subscribe": ["gpu:3", "team:1"]} / {"unsubscribe": [...]}; receives
    {"type": "subscribed", "groups": [...], "refused": {name: reason}} and then live messages
    {"group", "seq", "type", "data"}. A gap in a group's seq means: GET /telemetry/live/state/."""

    MAX_FRAME = 16_384
    MAX_GROUPS = 200
    RECHECK_S = 30.0

    async def dispatch(self, message) -> None:
        # Fan-out messages touch no database: skip Channels' close-old-connections thread hop,
        # which would otherwise cost one thread round trip per message per browser.
        if message["type"] == "live.message":
            await self.live_message(message)
        else:
            await super().dispatch(message)

    async def connect(self) -> None:
        self.user = self.scope.get("user")
        self.groups_joined: dict[str, live.Group] = {}
        self.bucket = TokenBucket(5.0, 20)
        self.flooded = False
        if self.user is None or not self.user.is_authenticated:
            await self.close()  # refused at the handshake (403)
            return
        await self.accept()
        self.keeper = asyncio.get_running_loop().create_task(self._keep())

    async def disconnect(self, code) -> None:
        keeper = getattr(self, "keeper", None)
        if keeper is not None:
            keeper.cancel()
        for group in self.groups_joined.values():
            await self.channel_layer.group_discard(group.channel_group, self.channel_name)

    async def _answer(self, **body) -> None:
        await self.send(json.dumps(body, separators=(",", ":")))

    async def receive(self, text_data=None, bytes_data=None) -> None:
        if self.flooded:
            return
        if not self.bucket.take():
            self.flooded = True
            await self._answer(type="error", message="too many messages")
            await self.close(4429)
            return
        if text_data is None or len(text_data) > self.MAX_FRAME:
            await self._answer(type="error", message=f"send JSON text frames of at most {self.MAX_FRAME} bytes")
            return
        try:
            body = json.loads(text_data)
        except ValueError:
            await self._answer(type="error", message="not valid JSON")
            return
        if not isinstance(body, dict) or not body or set(body) - {"subscribe", "unsubscribe"}:
            await self._answer(type="error", message='send {"subscribe": [...]} or {"unsubscribe": [...]}')
            return
        for key in ("subscribe", "unsubscribe"):
            names = body.get(key, [])
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or len(names) > 200:
                await self._answer(type="error", message=f"{key}: a list of at most 200 group names")
                return
        for name in body.get("unsubscribe", []):
            group = self.groups_joined.pop(name, None)
            if group is not None:
                await self.channel_layer.group_discard(group.channel_group, self.channel_name)
        if body.get("subscribe"):
            await self._subscribe(body["subscribe"])

    async def _subscribe(self, names: list[str]) -> None:
        allowed, refused = [], {}
        for name in dict.fromkeys(names):
            group = live.parse_group(name)
            if group is None:
                refused[name] = "not a group name: gpu:<id>, team:<id> or reservation:<id>"
            elif name in self.groups_joined:
                allowed.append(name)
            elif len(self.groups_joined) >= self.MAX_GROUPS:
                refused[name] = f"at most {self.MAX_GROUPS} groups per connection"
            elif not await database_sync_to_async(live.may_see)(self.user, group):
                refused[name] = "not found or not visible to you"
            else:
                await self.channel_layer.group_add(group.channel_group, self.channel_name)
                self.groups_joined[name] = group
                allowed.append(name)
        await live.store().watch(allowed)
        await self._answer(type="subscribed", groups=allowed, refused=refused)

    async def _keep(self) -> None:
        """Renew the watched groups and drop those the user may no longer see (a membership
        removed while the page stays open)."""
        while True:
            await asyncio.sleep(self.RECHECK_S)
            lost = []
            await sync_to_async(self._forget_cached_roles)()
            for name, group in list(self.groups_joined.items()):
                if not await database_sync_to_async(live.may_see)(self.user, group):
                    lost.append(name)
                    self.groups_joined.pop(name, None)
                    await self.channel_layer.group_discard(group.channel_group, self.channel_name)
            if lost:
                await self._answer(type="revoked", groups=lost)
            await live.store().watch(list(self.groups_joined))

    def _forget_cached_roles(self) -> None:
        from portal.tenancy.roles import forget_roles

        forget_roles(self.user)

    async def live_message(self, event) -> None:
        if event.get("group") in self.groups_joined:
            await self.send(event["text"])

