"""Domain operations on teams, memberships, exclusion groups and API tokens."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from .models import ApiToken, hash_secret


class TokenNameTaken(Exception):
    """The user already has a live token of that name; the message says which and what to do."""

    def __init__(self, existing: ApiToken):
        self.existing = existing
        super().__init__(f"you already have a token named '{existing.name}' (starting {existing.prefix}, made "
                         f"{existing.created_at:%Y-%m-%d %H:%M} UTC); revoke it first, choose another name, or "
                         "ask to replace it")


def create_token(user, name: str) -> tuple[ApiToken, str]:
    """Make a token named `name` for `user`; returns the row and the key, which is never stored or
    shown again. A live token of the same name raises TokenNameTaken (nothing reused or doubled)."""
    token, key, _ = replace_token(user, name, replace=False)
    return token, key


@transaction.atomic
def replace_token(user, name: str, replace: bool = True) -> tuple[ApiToken, str, ApiToken | None]:
    """Like create_token, but a live token of the same name is revoked in the same transaction
    (returned third, so the answer can name it) when `replace`. The database refuses two live
    tokens of one name (`one_live_token_per_name`), also to two requests at once."""
    name = name.strip()
    existing = (ApiToken.objects.select_for_update()
                .filter(user=user, name=name, revoked_at__isnull=True).first())
    if existing is not None:
        if not replace:
            raise TokenNameTaken(existing)
        revoke_token(existing)
    key = ApiToken.generate_key()
    try:
        with transaction.atomic():
            token = ApiToken.objects.create(
                user=user, name=name, prefix=key[: ApiToken.PREFIX_LEN], key_hash=hash_secret(key))
    except IntegrityError:  # the same name made at the same moment by another request
        raise TokenNameTaken(ApiToken.objects.get(user=user, name=name, revoked_at__isnull=True)) from None
    return token, key, existing


@transaction.atomic
def revoke_token(token: ApiToken) -> ApiToken:
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token
