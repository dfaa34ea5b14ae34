"""`ws/live/`: one browser's connection (session auth): subscriptions to live groups, checked
against what the user may see, and the messages of those groups."""

from __future__ import annotations

import asyncio
import json

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from portal.telemetry import live
from portal.telemetry.ratelimit import TokenBucket


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
