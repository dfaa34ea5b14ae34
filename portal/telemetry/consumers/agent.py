"""`ws/agents/`: one node agent's connection (token auth). Protocol: wire/PROTOCOL.md.

Thin: validation comes from the wire protocol, the hello from streams, each batch reduced by
agent_batches and stored by the writer (ingest).
"""

from __future__ import annotations

import logging
import re

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncWebsocketConsumer

from portal.fleet.links import LinksRefused, remote_servers_for, store_links
from portal.fleet.services import node_for_token
from portal.telemetry import agent_batches, conf, dbthread, streams, ticker
from portal.telemetry.services import placements_for_node, revoked_shares_for_node
from portal.telemetry.signals import REMOTE_PROBERS, agent_token_group
from portal.telemetry.writer import writer
from portal.tenancy.models import hash_secret
from wire.agent_portal import (
    AGENT_MESSAGES,
    PROTOCOL_VERSION,
    TOKEN_PATTERN,
    Ack,
    Error,
    Hello,
    Links,
    ProtocolError,
    RevokedShare,
    Samples,
    Servers,
    Welcome,
    encode,
    error_message,
    parse,
)
from wire.rate import TokenBucket

log = logging.getLogger(__name__)

_BEARER = re.compile(r"^Bearer (" + TOKEN_PATTERN.strip("^$") + r")$")
_FIRST_SEQ = re.compile(rb'"seq"\s*:\s*([0-9]{1,16})')


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


def prepare_samples(info: streams.StreamInfo, message: Samples, skew) -> agent_batches.Submission | str:
    """What the writer stores of a valid batch, or why its clock refuses it (invalid_message)."""
    problem = agent_batches.too_far_ahead(message, skew=skew)
    if problem:
        return problem
    return agent_batches.reduce(info, message)


def ack_text(stream: str, seq: int) -> str:
    return encode(Ack(v=PROTOCOL_VERSION, type="ack", stream=stream, seq=seq))


class AgentConsumer(AsyncWebsocketConsumer):
    """One node agent. Protocol: wire/PROTOCOL.md."""

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
        self.info: streams.StreamInfo | None = None
        self.hello: Hello | None = None
        self.broken = False  # a store failed: nothing more may be stored or acked here
        self.servers_sent: list[dict[str, str]] | None = None  # the GPU nodes' servers the agent probes
        self.token_group: str | None = None
        # What this connection last sent: the reservations placed on the node (a change there is
        # when a share may have ended or come back) and the revoked shares (sent again only if changed).
        self.placed_sent: frozenset[str] | None = None
        self.revoked_sent: list[RevokedShare] | None = None
        token = _bearer_token(self.scope)
        if token:
            # Tied to its token from the start: joined before the lookup, so a rotation or
            # revocation committed at any point after the lookup closes this connection, whether
            # or not it has sent its hello.
            self.token_group = agent_token_group(hash_secret(token))
            await self.channel_layer.group_add(self.token_group, self.channel_name)
        try:
            # Daphne drops a handshake the application has not answered in 5 s.
            node = await dbthread.run(node_for_token, token, within=4.0) if token else None
        except dbthread.Stale:
            await self._refuse_handshake()  # refused for now; the agent retries with backoff
            return
        if node is None:
            await self._refuse_handshake()  # before accept: the handshake is answered 403, nothing is read
            return
        self.node = node
        self.bucket = TokenBucket(*conf.agent_rate())
        self.max_skew = conf.max_future_skew()
        ticker.ensure_started()
        await self.accept()

    async def _refuse_handshake(self) -> None:
        if self.token_group is not None:
            await self.channel_layer.group_discard(self.token_group, self.channel_name)
            self.token_group = None
        await self.close()

    async def disconnect(self, code) -> None:
        if self.token_group is not None:
            await self.channel_layer.group_discard(self.token_group, self.channel_name)
        if self.node is not None and self.hello is not None:
            await self.channel_layer.group_discard(_node_group(self.node.pk), self.channel_name)
        if self.servers_sent is not None:
            await self.channel_layer.group_discard(REMOTE_PROBERS, self.channel_name)

    async def _fatal(self, code: str, message: str, close_code: int) -> None:
        await self.send(error_message(code, message, fatal=True))
        await self.close(close_code)

    async def receive(self, text_data=None, bytes_data=None) -> None:
        try:
            await self._receive(text_data, bytes_data)
        except Exception:
            # A bug must not end the connection with an exception (1011, and whatever it had
            # started left running): the agent is told, the socket closed, and it reconnects.
            log.exception("ws/agents: a frame of %s could not be handled", getattr(self.node, "name", None))
            self.broken = True
            await self._fatal("internal", "the portal could not handle that message; reconnect", CLOSE_INTERNAL)

    async def _receive(self, text_data=None, bytes_data=None) -> None:
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
        elif isinstance(message, Links):
            await self._on_links(message)
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
            self.info = await dbthread.run(streams.register_hello, self.node, hello, within=8.0)
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
        welcome = {"v": PROTOCOL_VERSION, "type": "welcome", "node": hello.node, "stream": hello.stream,
                   "acked_seq": self.info.acked_seq}
        if self.info.remote_servers is not None:  # an agent that probes GPU nodes' servers
            welcome["remote_servers"] = self.servers_sent = self.info.remote_servers
            await self.channel_layer.group_add(REMOTE_PROBERS, self.channel_name)
        await self.send(encode(Welcome(**welcome)))
        await self._send_placements()

    async def _on_samples(self, message: Samples) -> None:
        if message.stream != self.hello.stream:
            await self.send(error_message("invalid_message",
                                          f"samples: stream: {message.stream} is not this connection's stream",
                                          ref_seq=message.samples[0].seq))
            return
        submission = prepare_samples(self.info, message, self.max_skew)
        if isinstance(submission, str):
            await self.send(error_message("invalid_message", submission, ref_seq=message.samples[0].seq))
            return
        try:
            stored = await writer().submit(submission)
        except Exception:
            self.broken = True
            await self._fatal("internal", "the portal could not store samples; resend after reconnecting",
                              CLOSE_INTERNAL)
            return
        await self.send(ack_text(message.stream, stored.ack_seq))

    async def _on_links(self, message: Links) -> None:
        """Measured links for remote GPU shares (PROTOCOL.md 4.3): stored whole, or refused whole."""
        try:
            await dbthread.run(store_links, self.node, message, within=8.0)
        except LinksRefused as exc:
            await self.send(error_message("invalid_message", f"links: {exc}"))
        except Exception:
            # Not stored now: the agent sends its links again at its next refresh.
            log.exception("storing the links of %s failed", self.node.name)
            await self.send(error_message("internal", "the portal could not store the links; send them later"))

    async def _send_placements(self) -> None:
        try:
            body = await dbthread.run(placements_for_node, self.node.pk, self.hello.priorities)
        except Exception:
            # The agent keeps its previous placements; it gets the full list at its next hello.
            log.exception("reading the placements of %s failed", self.node.name)
            return
        await self.send(encode(body))
        if not self.hello.revocations:
            return
        placed = frozenset(p.reservation for p in body.placements)
        if placed != self.placed_sent:
            # A share that left the node may have ended (its token must stop working at once), and
            # one placed here again (requeued) must leave the revoked list.
            self.placed_sent = placed
            await self._send_revoked()

    async def _send_revoked(self) -> None:
        try:
            body = await dbthread.run(revoked_shares_for_node, self.node.pk)
        except Exception:
            # Sent again at the next change on the node or the next hello; the token expires anyway.
            log.exception("reading the revoked shares of %s failed", self.node.name)
            return
        if body.shares != self.revoked_sent:
            self.revoked_sent = body.shares
            await self.send(encode(body))

    # Channel layer events
    async def placements_changed(self, event) -> None:
        if self.hello is not None and not self.broken:
            await self._send_placements()

    async def remote_servers_changed(self, event) -> None:
        if self.hello is None or self.broken or self.servers_sent is None:
            return
        try:
            servers = await dbthread.run(remote_servers_for, self.node)
        except Exception:
            log.exception("reading the GPU nodes' servers for %s failed", self.node.name)
            return  # it gets the list again at its next session
        if servers != self.servers_sent:
            self.servers_sent = servers
            await self.send(encode(Servers(v=PROTOCOL_VERSION, type="servers", remote_servers=servers)))

    async def agent_token_changed(self, event) -> None:
        if self.node is None:
            return  # refused at the handshake already
        self.broken = True
        await self._fatal("node_mismatch", "this node's token was revoked or replaced", CLOSE_POLICY)

    async def agent_superseded(self, event) -> None:
        if event.get("by") != self.channel_name:
            self.broken = True
            await self.close(CLOSE_SUPERSEDED)
