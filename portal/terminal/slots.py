"""At most `PER_USER` terminals per user, across every portal process: slot keys in the cache
(Redis when REDIS_URL is set; `add` is atomic there), each held by one terminal and renewed
while it lives, so a slot of a process that died frees itself after `TTL_S`."""

from __future__ import annotations

import secrets

from django.core.cache import cache

TTL_S = 60  # renewed every CHECK_S by the terminal holding it


def _key(user_id: int, index: int) -> str:
    return f"tessera:terminal:{user_id}:{index}"


def claim(user_id: int, per_user: int) -> tuple[str, str] | None:
    """(key, token) of a free slot, now held; None when all `per_user` are taken."""
    token = secrets.token_hex(8)
    for index in range(per_user):
        key = _key(user_id, index)
        if cache.add(key, token, timeout=TTL_S):
            return key, token
    return None


def renew(slot: tuple[str, str]) -> None:
    key, token = slot
    if cache.get(key) == token:
        cache.touch(key, TTL_S)
    else:  # expired meanwhile (a long pause): take it again if still free
        cache.add(key, token, timeout=TTL_S)


def release(slot: tuple[str, str]) -> None:
    key, token = slot
    if cache.get(key) == token:
        cache.delete(key)
