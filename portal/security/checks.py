"""`manage.py check --deploy`: demo users and demo mode in a deployment."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import check_password
from django.core import checks
from django.db import DatabaseError

from . import demo


@checks.register(checks.Tags.security, deploy=True)
def demo_users_in_deployment(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    if demo.demo_mode():
        messages.append(checks.Warning(
            "demo mode is on: the demo password (seed_demo) signs in",
            hint="Unset TESSERA_DEMO and DEBUG in a deployment.", id="tessera.W001"))
    User = get_user_model()
    try:
        marked = set(User.objects.filter(groups__name=demo.DEMO_GROUP).values_list("username", flat=True))
        # Seeded before the group existed: the demo names that still have the demo password.
        named = {u.username for u in User.objects.filter(username__in=demo.DEMO_USERNAMES)
                 if check_password(demo.DEMO_PASSWORD, u.password)}
    except DatabaseError:
        return messages  # not migrated yet: nothing seeded either
    found = sorted(marked | named)
    if found:
        messages.append(checks.Error(
            f"demo users exist in this database: {', '.join(found)} (created by seed_demo with a "
            "well-known password); they cannot sign in outside demo mode, but should not be here",
            hint="Delete them (manage.py shell, or /admin/) or give them their own passwords and "
                 f"remove them from the group {demo.DEMO_GROUP!r}.", id="tessera.E001"))
    return messages
