"""The streaming ASGI proxy behind /connect/<reservation id>/: HTTP through aiohttp's client (its
C parser: less CPU per request than httpx's pure-Python one, and more throughput on a large
download), WebSockets through the `websockets` client, both to the address the cluster backend
reports for the pod's app.

Per request: the portal session (its cookie) must belong to someone who may open the app
(access.target_for: the owner, or a team admin where the team allows it); anyone else, and every
id that is not a running reservation with an app, gets the same 404. Then the portal's own cookies
and credentials are taken off, the app's token is put on (`Authorization: token …`, which
Jupyter reads; the browser never sees it) and the request goes to the pod. Bodies stream both ways
in chunks, never held whole; request headers are bounded (431 over the limit), WebSocket messages
from the app too (1009).

The first request of a session to an app is decided in full (the ORM, on a worker thread). An
owner's "yes" is then remembered per session and reservation, and each later request only asks
PostgreSQL whether what it read still holds (recheck.py: one prepared statement, pipelined on the
proxy's own connection, from the event loop): a reservation that ends, passes to another owner, or a
session that ends is refused on the very next request. Where the app is (its pod's address) is kept
for ADDRESS_TTL_S and dropped when the app does not answer. Anything else (a team admin's way in, a
"no") is decided in full each time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from importlib import import_module
from types import SimpleNamespace
from urllib.parse import quote, urlsplit

import aiohttp
from channels.db import database_sync_to_async
from django.conf import settings
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from scheduler.backends import PodRef

from . import access
from .recheck import Recheck, RecheckFailed
from .recheck import available as recheck_available

log = logging.getLogger(__name__)

PATH = re.compile(r"^/connect/(?P<id>[0-9]{1,12})(?P<rest>/.*)?$")
MAX_REQUEST_HEADERS = 100
MAX_REQUEST_HEADER_BYTES = 64 * 1024
MAX_WS_MESSAGE_BYTES = 16 * 1024 * 1024  # a notebook output with a few images fits
# Bytes handed to Daphne per write: fewer, larger writes (each one a trip through Daphne and Twisted)
# move a large download faster; what is held per response stays this small.
STREAM_CHUNK = 256 * 1024
REMEMBER_S = 3600.0  # how long an owner's "yes" stays remembered unused (each use is rechecked)
ADDRESS_TTL_S = 30.0
CACHE_MAX = 10_000
# Hop-by-hop headers (RFC 9110 7.6.1) and what the proxy sets itself.
HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
              b"transfer-encoding", b"upgrade", b"proxy-connection"}
REQUEST_DROPPED = HOP_BY_HOP | {b"host", b"cookie", b"authorization", b"x-csrftoken", b"origin", b"referer",
                                b"forwarded", b"x-forwarded-for", b"x-forwarded-host", b"x-forwarded-proto",
                                b"x-real-ip",
                                # plain bodies from the app, so the token can be masked in them (Masker)
                                b"accept-encoding"}
WS_REQUEST_DROPPED = REQUEST_DROPPED | {b"content-length", b"sec-websocket-key", b"sec-websocket-version",
                                        b"sec-websocket-extensions",
                                        b"sec-websocket-protocol"}
UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
SAFE_METHODS = {"GET", "HEAD"}


def portal_cookie_names() -> set[str]:
    return {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME, "messages"}


class _Cache:
    """A small time-bounded map (one per process; cleared whole when full, which is rare and cheap)."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._items: dict = {}

    def get(self, key):
        hit = self._items.get(key)
        if hit is None or hit[1] < time.monotonic():
            return None
        return hit[0]

    def put(self, key, value) -> None:
        if len(self._items) >= CACHE_MAX:
            self._items.clear()
        self._items[key] = (value, time.monotonic() + self.ttl_s)

    def drop(self, key) -> None:
        self._items.pop(key, None)

    def clear(self) -> None:
        self._items.clear()


_remembered = _Cache(REMEMBER_S)
_addresses = _Cache(ADDRESS_TTL_S)
_sessions: dict[int, aiohttp.ClientSession] = {}
_rechecks: dict[int, Recheck] = {}


def forget() -> None:
    """Drop what this process remembers (tests change sessions and reservations under it)."""
    _remembered.clear()
    _addresses.clear()


def _recheck() -> Recheck:
    loop = asyncio.get_running_loop()
    recheck = _rechecks.get(id(loop))
    if recheck is None:
        recheck = _rechecks[id(loop)] = Recheck()
    return recheck


def _session() -> aiohttp.ClientSession:
    """One pooled client per event loop (connections to the apps are kept alive between requests).
    It adds no Accept-Encoding (bodies come plain, for the Masker) and keeps no cookies of its own."""
    loop = asyncio.get_running_loop()
    session = _sessions.get(id(loop))
    if session is None or session.closed:
        session = _sessions[id(loop)] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=512, limit_per_host=64),
            timeout=aiohttp.ClientTimeout(total=None, connect=5, sock_read=300),
            auto_decompress=False, skip_auto_headers=("Accept-Encoding", "User-Agent"),
            cookie_jar=aiohttp.DummyCookieJar(), trust_env=False)
    return session


@dataclass(frozen=True)
class Decision:
    target: access.Target | None  # what the session's user may open; None: a 404 (or sign in)
    signed_in: bool
    # The parameters of recheck's statement when this "yes" may be remembered (the owner's, where
    # the recheck is available); None: decide in full next time.
    recheck: list[bytes] | None = None


def decide_access(session_key: str | None, reservation_id: int) -> Decision:
    """Whom this session is and what it may open of the reservation (a database read: run off the loop)."""
    from django.contrib.auth import get_user

    from portal.reservations.states import State

    if not session_key:
        return Decision(None, False)
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = get_user(SimpleNamespace(session=store))
    if not user.is_authenticated:
        return Decision(None, False)
    target = access.target_for(user, reservation_id)
    if target is None or target.owner_id != user.pk or not recheck_available():
        return Decision(target, True)
    params = [str(target.reservation_id), State.RUNNING.value, str(user.pk), target.app, str(target.port),
              target.pod_namespace, target.pod_name, user.password, session_key]
    return Decision(target, True, [p.encode() for p in params])


def _address(target: access.Target) -> str | None:
    from portal.placement.backend import get_backend

    return get_backend().app_address(PodRef(target.pod_namespace, target.pod_name), target.port)


_decide_access_async = database_sync_to_async(decide_access)
_address_async = database_sync_to_async(_address)


async def _decide(session_key: str | None, reservation_id: int) -> Decision:
    key = (session_key, reservation_id)
    remembered = _remembered.get(key)
    if remembered is not None:
        try:
            if await _recheck().holds(remembered.recheck):
                return remembered
        except RecheckFailed as exc:
            log.warning("connect: the access recheck failed (deciding in full): %s", exc)
        _remembered.drop(key)
    decision = await _decide_access_async(session_key, reservation_id)
    if decision.recheck is not None:
        _remembered.put(key, decision)
    return decision


async def _resolve(session_key: str | None, reservation_id: int) -> tuple[access.Target | None, str | None, bool]:
    decision = await _decide(session_key, reservation_id)
    target = decision.target
    if target is None:
        return None, None, decision.signed_in
    where = (target.reservation_id, target.pod_name)
    address = _addresses.get(where)
    if address is None:
        address = await _address_async(target)
        if address is not None:
            _addresses.put(where, address)
    return target, address, True


def split_cookies(raw: bytes) -> tuple[str | None, str]:
    """(the portal session key, the cookie header without the portal's cookies)."""
    ours = portal_cookie_names()
    session_key, kept = None, []
    for part in raw.decode("latin-1").split(";"):
        name, _, value = part.strip().partition("=")
        if not name:
            continue
        if name == settings.SESSION_COOKIE_NAME:
            session_key = value.strip('"') or None
        if name not in ours:
            kept.append(f"{name}={value}")
    return session_key, "; ".join(kept)


def _check_headers(headers: list[tuple[bytes, bytes]]) -> bool:
    return len(headers) <= MAX_REQUEST_HEADERS and sum(len(k) + len(v) for k, v in headers) <= MAX_REQUEST_HEADER_BYTES


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


def same_origin(headers: list[tuple[bytes, bytes]]) -> bool:
    """A browser's Origin (when it sends one) names the host it asked: a page elsewhere may not
    drive the app with the user's session."""
    origin = _header(headers, b"origin")
    if origin is None:
        return True
    host = _header(headers, b"host")
    return host is not None and urlsplit(origin.decode("latin-1")).netloc.lower() == host.decode("latin-1").lower()


def _upstream_headers(scope, dropped: set[bytes], cookie: str, token: str) -> list[tuple[str, str]]:
    out = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"] if k.lower() not in dropped]
    if cookie:
        out.append(("cookie", cookie))
    out.append(("authorization", f"token {token}"))
    client = scope.get("client")
    if client:
        out.append(("x-forwarded-for", str(client[0])))
    host = _header(scope["headers"], b"host")
    if host:
        out.append(("x-forwarded-host", host.decode("latin-1")))
    out.append(("x-forwarded-proto", "https" if scope.get("scheme") in ("https", "wss") else "http"))
    return out


def _upstream_path(scope) -> str:
    path = scope.get("raw_path") or quote(scope["path"]).encode()
    query = scope.get("query_string") or b""
    return path.decode("latin-1") + (f"?{query.decode('latin-1')}" if query else "")


async def _respond(send, status: int, text: str, headers: list[tuple[bytes, bytes]] = ()) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()), (b"cache-control", b"no-store"),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


NOT_FOUND = "Not found."


class ConnectProxy:
    """ASGI: /connect/… here, everything else to `fallback` (Django for HTTP, Channels' routes for
    WebSockets)."""

    def __init__(self, fallback) -> None:
        self.fallback = fallback

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] in ("http", "websocket") and scope["path"].startswith(access.PREFIX):
            match = PATH.match(scope["path"])
            if scope["type"] == "http":
                await self.http(scope, receive, send, match)
            else:
                await self.websocket(scope, receive, send, match)
            return
        await self.fallback(scope, receive, send)

    # -- HTTP -------------------------------------------------------------------------------------

    async def http(self, scope, receive, send, match) -> None:
        headers = scope["headers"]
        if not _check_headers(headers):
            await _respond(send, 431, "Request headers too large.")
            return
        if match is None:
            await _respond(send, 404, NOT_FOUND)
            return
        if match["rest"] is None:  # /connect/7 → /connect/7/ (the app's links are relative to it)
            await _respond(send, 301, "", [(b"location", f"{access.PREFIX}{match['id']}/".encode())])
            return
        session_key, cookie = split_cookies(_header(headers, b"cookie") or b"")
        reservation_id = int(match["id"])
        has_body = _has_body(headers)
        # A remembered "yes" for a safe request: its recheck and the request to the app go out
        # together (one round trip's wait, not two); the answer is used only if the recheck holds.
        early = None
        if scope["method"] in SAFE_METHODS and not has_body:
            early = await self._early(scope, session_key, reservation_id, cookie)
        if early is not None:
            target, address, pending = early
            signed_in = True
        else:
            target, address, signed_in = await _resolve(session_key, reservation_id)
            pending = None
        if target is None:
            if not signed_in and scope["method"] in ("GET", "HEAD"):
                login = f"{settings.LOGIN_URL}?next={quote(scope['path'])}"
                await _respond(send, 302, "Sign in first.", [(b"location", login.encode())])
            else:
                await _respond(send, 404, NOT_FOUND)
            return
        if scope["method"] in UNSAFE_METHODS and not same_origin(headers):
            await _respond(send, 403, "This request came from another site.")
            return
        if address is None:
            await _respond(send, 503, "The app is starting; reload in a moment.", [(b"retry-after", b"2")])
            return
        token = access.app_token(target.reservation_id)
        try:
            response = await (pending or _upstream(scope, receive, address, cookie, token, has_body))
        except (aiohttp.ClientError, TimeoutError) as exc:
            _addresses.drop((target.reservation_id, target.pod_name))
            log.info("connect %s: %s did not answer: %s", target.reservation_id, address, exc)
            await _respond(send, 502, "The app did not answer; it may still be starting or it stopped.")
            return
        masker = Masker(token)
        # A browser that goes away (a cancelled download) stops the copy from the app. Its receive
        # channel is free to watch only once the request's body was read; an answer of one chunk
        # at most (most of them) is sent whole anyway.
        small = response.content_length is not None and response.content_length <= STREAM_CHUNK
        gone = None if small or has_body else asyncio.ensure_future(_disconnected(receive))
        try:
            await send({"type": "http.response.start", "status": response.status,
                        "headers": _response_headers(response.raw_headers)})
            async for chunk in response.content.iter_chunked(STREAM_CHUNK):  # what has come, up to that
                if gone is not None and gone.done():
                    break
                chunk = masker.feed(chunk)
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": masker.end()})
        except (aiohttp.ClientError, TimeoutError) as exc:  # the app went away mid-answer: end it there
            log.info("connect %s: the answer broke off: %s", target.reservation_id, exc)
            await send({"type": "http.response.body", "body": masker.end()})
        finally:
            if gone is not None:
                gone.cancel()
            if response.content.at_eof():
                response.release()  # the connection goes back to the pool
            else:
                response.close()

    async def _early(self, scope, session_key: str | None, reservation_id: int, cookie: str):
        """(target, address, the app's answer to come) where a remembered "yes" still holds; None
        where there is none to use (then decide in full) or it no longer holds (then the request
        to the app is dropped unanswered, and the caller decides in full)."""
        key = (session_key, reservation_id)
        remembered = _remembered.get(key)
        if remembered is None:
            return None
        target = remembered.target
        address = _addresses.get((target.reservation_id, target.pod_name))
        if address is None:
            return None
        pending = asyncio.ensure_future(
            _upstream(scope, None, address, cookie, access.app_token(target.reservation_id), False))
        try:
            holds = await _recheck().holds(remembered.recheck)
        except RecheckFailed as exc:
            log.warning("connect: the access recheck failed (deciding in full): %s", exc)
            holds = False
        except BaseException:  # the browser went away meanwhile (cancelled): so does the request
            _drop_unused(pending)
            raise
        if holds:
            return target, address, pending
        _remembered.drop(key)
        _drop_unused(pending)
        return None

    # -- WebSockets -------------------------------------------------------------------------------

    async def websocket(self, scope, receive, send, match) -> None:
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        headers = scope["headers"]
        target = address = None
        if match is not None and match["rest"] is not None and _check_headers(headers) and same_origin(headers):
            session_key, cookie = split_cookies(_header(headers, b"cookie") or b"")
            target, address, _signed_in = await _resolve(session_key, int(match["id"]))
        if target is None or address is None:
            await send({"type": "websocket.close", "code": 1008})  # refused before accept: 403
            return
        token = access.app_token(target.reservation_id)
        requested = [p.strip() for p in (_header(headers, b"sec-websocket-protocol") or b"").decode().split(",")
                     if p.strip()]
        try:
            upstream = await ws_connect(
                f"ws://{address}{_upstream_path(scope)}",
                additional_headers=_upstream_headers(scope, WS_REQUEST_DROPPED, cookie, token),
                subprotocols=requested or None, max_size=MAX_WS_MESSAGE_BYTES, open_timeout=10,
                compression=None, proxy=None)
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            if not isinstance(exc, InvalidStatus):
                _addresses.drop((target.reservation_id, target.pod_name))
            log.info("connect %s: the app refused the WebSocket: %s", target.reservation_id, exc)
            await send({"type": "websocket.close", "code": 1011})
            return
        await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
        await _pump(receive, send, upstream, token)


async def _upstream(scope, receive, address: str, cookie: str, token: str, has_body: bool) -> aiohttp.ClientResponse:
    return await _session().request(
        scope["method"], f"http://{address}{_upstream_path(scope)}",
        headers=_upstream_headers(scope, REQUEST_DROPPED, cookie, token),
        # A body streams on (its Content-Length kept, else chunked); none is sent as none, not as
        # an empty chunked one the app would wait for.
        data=_body(receive) if has_body else None, allow_redirects=False)


def _drop_unused(task: asyncio.Future) -> None:
    """A request to the app whose answer will not be sent (the recheck said no): cancel it, or
    let its connection go once it answered."""
    task.cancel()
    task.add_done_callback(_close_unused)


def _close_unused(task: asyncio.Future) -> None:
    if not task.cancelled() and task.exception() is None:
        task.result().close()


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _has_body(headers: list[tuple[bytes, bytes]]) -> bool:
    length = _header(headers, b"content-length")
    return (length is not None and length.strip() != b"0") or _header(headers, b"transfer-encoding") is not None


async def _body(receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body"):
            return


def _response_headers(raw: tuple[tuple[bytes, bytes], ...]) -> list[tuple[bytes, bytes]]:
    ours = portal_cookie_names()
    out = []
    for name, value in raw:
        lower = name.lower()
        if lower in HOP_BY_HOP:
            continue
        if lower == b"set-cookie" and _cookie_name(value) in ours:
            continue  # the app may not replace the portal's session
        out.append((lower, value))
    return out


def _cookie_name(value: bytes) -> str:
    try:
        return next(iter(SimpleCookie(value.decode("latin-1")).keys()), "")
    except CookieError:
        return value.split(b"=", 1)[0].strip().decode("latin-1")


class Masker:
    """Replaces the app's token in a streamed body by as many zeros (the length, and so any
    Content-Length, stays the same): an app may put its own token in what it serves (Jupyter
    writes it into every page), and the browser must never get it. Holds back only the last
    len(token) - 1 bytes between chunks, where a token may be cut in two."""

    def __init__(self, token: str) -> None:
        self.token = token.encode()
        self.mask = b"0" * len(self.token)
        self.keep = len(self.token) - 1
        self.tail = b""

    def feed(self, chunk: bytes) -> bytes:
        data = (self.tail + chunk).replace(self.token, self.mask) if self.tail else chunk.replace(self.token, self.mask)
        if len(data) <= self.keep:
            self.tail = data
            return b""
        self.tail = data[-self.keep:]
        return data[:-self.keep]

    def end(self) -> bytes:
        tail, self.tail = self.tail, b""
        return tail


async def _pump(receive, send, upstream, token: str) -> None:
    """Messages both ways until either side closes; then the other is closed too."""

    async def from_browser() -> None:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("bytes") is not None:
                await upstream.send(message["bytes"])
            elif message.get("text") is not None:
                await upstream.send(message["text"])

    async def from_app() -> None:
        try:
            text_mask = "0" * len(token)
            bytes_token, bytes_mask = token.encode(), text_mask.encode()
            async for data in upstream:  # whole messages: the token cannot be cut in two here
                if isinstance(data, bytes):
                    await send({"type": "websocket.send", "bytes": data.replace(bytes_token, bytes_mask)})
                else:
                    await send({"type": "websocket.send", "text": data.replace(token, text_mask)})
        except ConnectionClosed:
            pass
        code = upstream.close_code or 1000
        # 1005, 1006 and 1015 are never sent on the wire
        await send({"type": "websocket.close", "code": 1000 if code in (1005, 1006, 1015) else code})

    browser = asyncio.ensure_future(from_browser())
    app = asyncio.ensure_future(from_app())
    try:
        await asyncio.wait({browser, app}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (browser, app):
            task.cancel()
        with contextlib.suppress(Exception):
            await upstream.close()
        for task in (browser, app):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
