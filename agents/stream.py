"""The WebSocket stream to the portal: hello, batched samples, acks, placements, reconnects.

One session: connect with the node token in the handshake, send `hello`, wait for `welcome` (which
says what the portal already stored), then send every buffered sample after that point in order,
keeping at most MAX_UNACKED_BATCHES batches unacknowledged. When the connection drops, the samples
stay in the buffer and the next session replays them, so the portal sees every sequence number once
(or, if an ack was lost, again; the portal ignores what it has stored).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from http import HTTPStatus
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from agents import __version__
from agents.buffer import SampleBuffer
from agents.pacing import Backoff
from agents.placements import PlacementRefused, PlacementTable
from wire.agent_portal import (
    AGENT_MAX_BURST,
    AGENT_MAX_MESSAGES_PER_S,
    AGENT_WS_PATH,
    MAX_MESSAGE_BYTES,
    MAX_SAMPLES_PER_BATCH,
    MAX_UNACKED_BATCHES,
    PORTAL_MESSAGES,
    PROTOCOL_VERSION,
    TOKEN_HEADER,
    TOKEN_SCHEME,
    WELCOME_TIMEOUT_S,
    Ack,
    Error,
    Placements,
    ProtocolError,
    RemoteServer,
    RevokedShares,
    Servers,
    Welcome,
    error_message,
    parse,
)
from wire.rate import TokenBucket

log = logging.getLogger(__name__)

ENVELOPE_RESERVE = 256  # bytes of a samples message besides the samples themselves


def websocket_url(portal: str) -> str:
    """The agents endpoint for a portal address: http(s)://host[:port] gets /ws/agents/ over ws(s).

    A ws:// or wss:// address is used as given (with /ws/agents/ added when it has no path).
    Raises ValueError with a readable reason.
    """
    parts = urlsplit(portal.strip())
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme.lower())
    if scheme is None:
        raise ValueError(f"{portal!r}: the portal address must start with http://, https://, ws:// or wss://")
    if not parts.hostname:
        raise ValueError(f"{portal!r}: the portal address has no host")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError(f"{portal!r}: the port is not a number from 0 to 65535") from None
    if parts.query or parts.fragment:
        raise ValueError(f"{portal!r}: the portal address must not have a query or fragment")
    path = parts.path
    if path in ("", "/"):
        path = AGENT_WS_PATH
    elif parts.scheme.lower() in ("http", "https"):
        path = path.rstrip("/") + AGENT_WS_PATH  # a portal mounted under a prefix
    return urlunsplit((scheme, parts.netloc, path, "", ""))


class _RedactToken(logging.Filter):
    """websockets logs the handshake headers at DEBUG level; the node token must not reach the log."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self._token = token

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self._token in message:
            record.msg, record.args = message.replace(self._token, "[redacted]"), None
        return True


class HandshakeRefused(Exception):
    """The portal answered the handshake with an HTTP error (bad token, wrong path...)."""


class PortalStream:
    def __init__(
        self,
        url: str,
        token: str,
        hello: str,
        node: str,
        stream_id: str,
        buffer: SampleBuffer,
        placements: PlacementTable,
        backoff: Backoff | None = None,
        stable_after_s: float = 10.0,
        welcome_timeout_s: float = WELCOME_TIMEOUT_S,
        rate: TokenBucket | None = None,
        token_source: Callable[[], str | None] | None = None,
    ) -> None:
        self.url = url
        self._token = token
        # Asked before each connection for the node's current token (None: keep the one held), so
        # a token rotated in the portal and written where the source reads reaches a running agent.
        self.token_source = token_source
        self.hello = hello
        self.node = node
        self.stream_id = stream_id
        self.buffer = buffer
        self.placements = placements
        self.backoff = backoff or Backoff()
        self.stable_after_s = stable_after_s
        self.welcome_timeout_s = welcome_timeout_s
        self.rate = rate or TokenBucket(AGENT_MAX_MESSAGES_PER_S, AGENT_MAX_BURST)
        self.connected = False
        self.sessions = 0  # sessions that got as far as a welcome
        self._welcomed_at: float | None = None
        self._ws_log = logging.getLogger(f"{__name__}.websocket")
        self._ws_log.addFilter(_RedactToken(token))
        self._wake = asyncio.Event()
        self._in_flight: deque[int] = deque()  # last seq of each unacknowledged batch
        self.links: str | None = None  # the latest `links` message (agents.remote.probe.LinkTable)
        # The GPU nodes' servers to probe, as the portal names them (welcome, then `servers`).
        self.on_servers: Callable[[list[RemoteServer]], None] | None = None
        # The remote shares of this GPU node whose reservations ended (`revoked_shares`).
        self.on_revoked: Callable[[RevokedShares], None] | None = None

    def wake(self) -> None:
        """New samples are in the buffer."""
        self._wake.set()

    def set_links(self, text: str) -> None:
        """New measured links for the portal (wire `links`): sent once per session and on change."""
        self.links = text
        self._wake.set()

    # -- the reconnect loop ------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._welcomed_at = None
            try:
                await self._session(stop)
            except InvalidStatus as exc:
                status = exc.response.status_code
                if status in (HTTPStatus.UNAUTHORIZED, HTTPStatus.FORBIDDEN):
                    log.error(
                        "portal %s refused the node token (HTTP %d); check --token / --token-file; retrying",
                        self.url, status,
                    )
                else:
                    log.warning("portal %s refused the connection: HTTP %d", self.url, status)
            except (OSError, TimeoutError, InvalidHandshake, InvalidURI, ConnectionClosed,
                    ProtocolError, HandshakeRefused) as exc:
                log.warning("connection to %s failed: %s", self.url, exc or type(exc).__name__)
            finally:
                self.connected = False
            if stop.is_set():
                break
            # A connection that worked for a while resets the backoff, however it ended (a portal
            # restart drops it without a close frame), so the agent is back within a second or so.
            if self._welcomed_at is not None and time.monotonic() - self._welcomed_at >= self.stable_after_s:
                self.backoff.reset()
            delay = self.backoff.next_delay()
            log.info("reconnecting in %.1f s (%d samples buffered)", delay, len(self.buffer))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)

    def _current_token(self) -> str:
        if self.token_source is not None:
            fresh = self.token_source()
            if fresh and fresh != self._token:
                log.info("using the node's new token")
                self._token = fresh
                self._ws_log.addFilter(_RedactToken(fresh))  # the old one stays redacted too
        return self._token

    async def _session(self, stop: asyncio.Event) -> None:
        token = self._current_token()
        async with connect(
            self.url,
            additional_headers={TOKEN_HEADER: f"{TOKEN_SCHEME} {token}"},
            user_agent_header=f"tessera-agent/{__version__}",
            max_size=MAX_MESSAGE_BYTES,
            open_timeout=10,
            ping_interval=20,
            ping_timeout=20,
            close_timeout=5,
            proxy=None,
            logger=self._ws_log,
        ) as ws:
            await ws.send(self.hello)
            welcome = await self._await_welcome(ws)
            if self.on_servers is not None and welcome.remote_servers is not None:
                self.on_servers(welcome.remote_servers)
            self.buffer.ack(welcome.acked_seq)
            if self.buffer.last_seq is not None and welcome.acked_seq > self.buffer.last_seq:
                log.warning("portal acknowledged seq %d, beyond our last sample %d",
                            welcome.acked_seq, self.buffer.last_seq)
            self.connected = True
            self.sessions += 1
            self._welcomed_at = time.monotonic()
            # Each connection starts from the portal's view; a restarted portal may count revisions anew.
            self.placements.new_connection()
            self._in_flight.clear()
            log.info("connected to %s; replaying %d buffered samples", self.url, len(self.buffer))
            sender = asyncio.create_task(self._send_loop(ws, max(welcome.acked_seq, self.buffer.acked_seq)))
            receiver = asyncio.create_task(self._receive_loop(ws))
            stopper = asyncio.create_task(stop.wait())
            done, pending = await asyncio.wait(
                {sender, receiver, stopper}, return_when=asyncio.FIRST_COMPLETED
            )
            for task in pending:
                task.cancel()
            for task in pending:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for task in done:
                if task is not stopper and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            if receiver in done:
                log.warning("portal closed the connection: code %s %s", ws.close_code, ws.close_reason or "")

    async def _await_welcome(self, ws: ClientConnection) -> Welcome:
        try:
            raw = await asyncio.wait_for(ws.recv(), self.welcome_timeout_s)
        except TimeoutError:
            raise HandshakeRefused(f"no welcome within {self.welcome_timeout_s:.0f} s") from None
        message = parse(raw, PORTAL_MESSAGES)
        if isinstance(message, Error):
            raise HandshakeRefused(f"portal refused hello: {message.code}: {message.message}")
        if not isinstance(message, Welcome):
            await ws.send(error_message("unexpected_message", f"expected welcome, got {message.type}",
                                        fatal=True))
            raise HandshakeRefused(f"expected welcome, got {message.type}")
        if message.stream != self.stream_id or message.node != self.node:
            raise HandshakeRefused(
                f"welcome is for {message.node}/{message.stream}, we are {self.node}/{self.stream_id}"
            )
        return message

    # -- one session's two directions --------------------------------------------------------------

    def next_batch(self, after_seq: int) -> tuple[int, str] | None:
        """The `samples` message of what the buffer holds after `after_seq` (as much as one may
        carry) and the last seq in it; None when nothing is there."""
        entries = self.buffer.after(after_seq, MAX_SAMPLES_PER_BATCH, MAX_MESSAGE_BYTES - ENVELOPE_RESERVE)
        if not entries:
            return None
        body = ",".join(e.text for e in entries)
        text = (
            f'{{"v":{PROTOCOL_VERSION},"type":"samples","stream":"{self.stream_id}",'
            f'"dropped":{self.buffer.dropped},"samples":[{body}]}}'
        )
        return entries[-1].seq, text

    async def _send_loop(self, ws: ClientConnection, sent_upto: int) -> None:
        links_sent = None  # a new session sends the links again: the portal may have lost them
        while True:
            self._wake.clear()
            if self.links is not None and self.links != links_sent and self.rate.wait_time() <= 0:
                self.rate.take()
                links_sent = self.links
                await ws.send(links_sent)
            if len(self._in_flight) >= MAX_UNACKED_BATCHES:
                await self._wake.wait()
                continue
            batch = self.next_batch(sent_upto)
            if batch is None:
                await self._wake.wait()
                continue
            wait = self.rate.wait_time()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            self.rate.take()
            last_seq, text = batch
            await ws.send(text)
            sent_upto = last_seq
            self._in_flight.append(last_seq)

    async def _receive_loop(self, ws: ClientConnection) -> None:
        async for raw in ws:
            try:
                message = parse(raw, PORTAL_MESSAGES)
            except ProtocolError as exc:
                log.warning("refused a message from the portal: %s: %s", exc.code, exc)
                await ws.send(error_message(exc.code, str(exc)))
                continue
            if isinstance(message, Ack):
                self._on_ack(message)
            elif isinstance(message, Placements):
                await self._on_placements(ws, message)
            elif isinstance(message, Servers):
                if self.on_servers is not None:
                    self.on_servers(message.remote_servers)
            elif isinstance(message, RevokedShares):
                if self.on_revoked is not None:
                    self.on_revoked(message)
            elif isinstance(message, Error):
                level = logging.ERROR if message.fatal else logging.WARNING
                log.log(level, "portal reports %s: %s%s", message.code, message.message,
                        f" (seq {message.ref_seq})" if message.ref_seq else "")
            else:
                await ws.send(error_message("unexpected_message", f"{message.type} is only valid once, "
                                            "in answer to hello"))

    def _on_ack(self, ack: Ack) -> None:
        if ack.stream != self.stream_id:
            log.warning("ignoring an ack for stream %s (ours is %s)", ack.stream, self.stream_id)
            return
        self.buffer.ack(ack.seq)
        window_was_full = len(self._in_flight) >= MAX_UNACKED_BATCHES
        while self._in_flight and self._in_flight[0] <= ack.seq:
            self._in_flight.popleft()
        # An ack can only unblock a sender waiting for room in the window, or links the rate limit
        # held back; waking it otherwise costs each agent a loop turn a sample for nothing.
        if window_was_full or self.links is not None:
            self._wake.set()

    async def _on_placements(self, ws: ClientConnection, message: Placements) -> None:
        try:
            applied = self.placements.apply(message)
        except PlacementRefused as exc:
            log.warning("refused placements revision %d: %s", message.revision, exc)
            await ws.send(error_message(exc.code, str(exc)))
            return
        if applied:
            log.info("placements revision %d: %d shares", message.revision, len(message.placements))
