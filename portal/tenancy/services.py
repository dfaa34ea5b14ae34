"""Domain operations on teams, memberships, exclusion groups and API tokens."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from .models import ApiToken, hash_secret


def create_token(user, name: str) -> tuple[ApiToken, str]:
    """Make a token for `user`; returns the row and the key, which is never stored or shown again."""
    key = ApiToken.generate_key()
    token = ApiToken.objects.create(
        user=user, name=name, prefix=key[: ApiToken.PREFIX_LEN], key_hash=hash_secret(key)
    )
    return token, key


@transaction.atomic
def revoke_token(token: ApiToken) -> ApiToken:
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token
