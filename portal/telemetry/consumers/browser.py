"""`ws/live/`: one browser's connection (session auth): subscriptions to live groups, checked
against what the user may see, and the messages of those groups.

Defensive: a frame that cannot be parsed (too big, nested too deeply) is answered or closes the
socket with a 4xxx code, never an exception; the background task is cancelled on every way out
(close, disconnect, error); and every RECHECK_S the session and the user are looked at again, so
a signed-out session or a deactivated user loses the socket, not only new page loads.
"""

from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from portal.telemetry import live
from wire.rate import TokenBucket

log = logging.getLogger(__name__)

CLOSE_BAD_FRAME = 4400  # a frame no browser of ours sends (nested beyond reason)
CLOSE_SIGNED_OUT = 4401  # the session ended or the user was deactivated
CLOSE_INTERNAL = 4011


class LiveConsumer(AsyncWebsocketConsumer):
    """A browser. Sends {"subscribe": ["gpu:3", "team:1"]} / {"unsubscribe": [...]}; receives
    {"type": "subscribed", "groups": [...], "refused": {name: reason}} and then live messages
    {"group", "seq", "type", "data"}. A gap in a group's seq means: GET /telemetry/live/state/."""

    MAX_FRAME = 16_384
    MAX_GROUPS = 200
    RECHECK_S = 30.0

    async def __call__(self, scope, receive, send):
        # Whatever way the connection ends (a close, the client gone, an exception in a
        # handler), its background task ends with it: nothing queries for a client that is gone.
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._stop_keeper()

    def _stop_keeper(self) -> None:
        keeper = getattr(self, "keeper", None)
        if keeper is not None and not keeper.done():
            keeper.cancel()

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
        self._stop_keeper()
        for group in self.groups_joined.values():
            await self.channel_layer.group_discard(group.channel_group, self.channel_name)

    async def _answer(self, **body) -> None:
        await self.send(json.dumps(body, separators=(",", ":")))

    async def close(self, code=None, reason=None) -> None:
        self._stop_keeper()
        await super().close(code, reason)

    async def receive(self, text_data=None, bytes_data=None) -> None:
        try:
            await self._receive(text_data)
        except Exception:
            log.exception("ws/live: a frame of %s could not be handled", getattr(self.user, "pk", None))
            await self.close(CLOSE_INTERNAL)

    async def _receive(self, text_data) -> None:
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
        except RecursionError:  # "[[[[…" within the size limit: no page of ours sends that
            await self._answer(type="error", message="JSON nested too deeply")
            await self.close(CLOSE_BAD_FRAME)
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
                refused[name] = "not a group name: gpu:<id>, team:<id>, reservation:<id> or fleet"
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
            if not await database_sync_to_async(self.still_signed_in)():
                await self._answer(type="signed_out", message="your session ended; sign in again")
                await self.close(CLOSE_SIGNED_OUT)
                return
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

    def still_signed_in(self) -> bool:
        """The session still exists and still names this user, who may still sign in (active;
        not a demo user outside demo mode): Django's own check of a request's session, again."""
        from importlib import import_module

        from django.conf import settings
        from django.contrib.auth import get_user

        session = self.scope.get("session")
        if session is None:  # a consumer mounted without the session middleware (tests)
            from django.contrib.auth import get_user_model

            return get_user_model()._default_manager.filter(pk=self.user.pk, is_active=True).exists()
        key = session.session_key
        if not key:
            return False
        fresh = import_module(settings.SESSION_ENGINE).SessionStore(key)  # read anew, not the cached copy
        user = get_user(SimpleNamespace(session=fresh))
        return user.is_authenticated and user.pk == self.user.pk

    def _forget_cached_roles(self) -> None:
        from portal.tenancy.roles import forget_roles

        forget_roles(self.user)

    async def live_message(self, event) -> None:
        if event.get("group") in self.groups_joined:
            await self.send(event["text"])
