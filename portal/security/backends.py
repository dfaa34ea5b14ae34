"""The one authentication backend: Django's model backend behind the sign-in guards.

Every password sign-in goes through here: the API token endpoint, /login/ and /admin/. In order:
the throttles (no database, no hashing when refused), the demo password outside demo mode
(refused without a lookup), then the usual check, and demo users refused outside demo mode. A
session's user is loaded here too, so a demo user's old session ends when demo mode is off.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef

from . import demo, throttle


class GuardedModelBackend(ModelBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
        if username is None:
            username = kwargs.get(get_user_model().USERNAME_FIELD)
        if username is None or password is None:
            return None
        wait_s = throttle.retry_after(request, username)
        if wait_s is not None:
            if request is not None:
                request.signin_retry_after = wait_s
            raise PermissionDenied(f"too many failed sign-ins; try again in {wait_s} s")
        user = None
        if demo.demo_mode() or password != demo.DEMO_PASSWORD:
            user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is not None and demo.refused(user):
            user = None
        if user is None:
            throttle.record_failure(request, username)
        return user

    def get_user(self, user_id):
        if demo.demo_mode():
            return super().get_user(user_id)
        User = get_user_model()
        try:
            user = User._default_manager.annotate(is_demo_user=demo.in_demo_group(OuterRef("pk"))).get(pk=user_id)
        except User.DoesNotExist:
            return None
        if user.is_demo_user or not self.user_can_authenticate(user):
            return None
        return user
