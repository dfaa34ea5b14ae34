"""Each user's secret iCal feed URL: the token is shown once (at creation or regeneration) and only
its hash is kept, so a leaked database does not leak feeds; regenerating ends the old URL."""

from __future__ import annotations

import hashlib
import secrets

from .models import CalendarFeed


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def regenerate(user) -> str:
    """A new secret for `user`'s feed (the old one stops working); returns the token."""
    token = secrets.token_urlsafe(32)
    CalendarFeed.objects.update_or_create(user=user, defaults={"token_hash": _hash(token)})
    return token


def user_of(token: str):
    """The user whose feed `token` opens, or None."""
    if not token or len(token) > 100:
        return None
    feed = CalendarFeed.objects.select_related("user").filter(token_hash=_hash(token)).first()
    return feed.user if feed is not None and feed.user.is_active else None


def has_feed(user) -> bool:
    return CalendarFeed.objects.filter(user=user).exists()
