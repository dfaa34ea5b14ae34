"""`Authorization: Token <key>` against hashed per-user API tokens."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import OuterRef
from django.utils import timezone
from rest_framework import authentication, exceptions

from portal.security import demo

from .models import ApiToken, hash_secret

# Touch last_used_at at most this often so reads don't turn into a write per request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class HashedTokenAuthentication(authentication.TokenAuthentication):
    keyword = "Token"

    def authenticate_credentials(self, key: str):
        # One query: the token, its user, and whether that user is a demo user (demo.refused).
        token = (
            ApiToken.objects.select_related("user")
            .annotate(user_is_demo=demo.in_demo_group(OuterRef("user_id")))
            .filter(key_hash=hash_secret(key), revoked_at__isnull=True)
            .first()
        )
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        token.user.is_demo_user = token.user_is_demo
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("User inactive or deleted.")
        if demo.refused(token.user):
            raise exceptions.AuthenticationFailed("Demo users work only in demo mode.")
        now = timezone.now()
        if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token
