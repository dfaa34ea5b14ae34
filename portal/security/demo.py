"""The demo people (seed_demo) and their well-known password work only in demo mode.

A database seeded once keeps those users; outside demo mode (production, no DEBUG) neither the
password nor any session or API token of a demo user is accepted, and `check --deploy` says so.
Demo users are marked by membership of one group, so recognising them costs no password hash.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group

DEMO_PASSWORD = "tessera-demo"
DEMO_GROUP = "tessera-demo-users"
# Users seed_demo creates; a database seeded before the group existed is found by these names.
DEMO_USERNAMES = ("alice", "bob", "carol", "dave", "admin")


def demo_mode() -> bool:
    return bool(getattr(settings, "DEMO_MODE", False))


def mark_demo_user(user) -> None:
    group, _ = Group.objects.get_or_create(name=DEMO_GROUP)
    user.groups.add(group)


def in_demo_group(user_id_ref):
    """An Exists() for annotating a query with whether the user `user_id_ref` points at is a demo
    user: the token and session lookups learn it in their own query instead of a second one."""
    from django.contrib.auth import get_user_model
    from django.db.models import Exists

    through = get_user_model().groups.through
    return Exists(through.objects.filter(user_id=user_id_ref, group__name=DEMO_GROUP))


def is_demo_user(user) -> bool:
    annotated = getattr(user, "is_demo_user", None)  # set by the backend's one-query get_user
    if annotated is not None:
        return bool(annotated)
    return user.groups.filter(name=DEMO_GROUP).exists()


def refused(user) -> bool:
    """True when this user may not sign in or use a session or token now."""
    return not demo_mode() and is_demo_user(user)
