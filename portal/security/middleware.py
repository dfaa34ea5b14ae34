"""Middleware of the guards: sign-in throttling for the HTML sign-in forms; 503 for a database
that cannot take the request."""

from __future__ import annotations

import contextlib

from django.conf import settings
from django.http import HttpResponse
from django.urls import NoReverseMatch, reverse

from . import throttle, unavailable


class SignInThrottleMiddleware:
    """A POST to /login/ or /admin/login/ from a throttled username or address answers 429 with
    Retry-After before the form is read further (the API's token endpoint has its DRF throttle)."""

    def __init__(self, get_response):
        self.get_response = get_response
        self._paths: set[str] | None = None

    def _signin_paths(self) -> set[str]:
        if self._paths is None:
            paths = {settings.LOGIN_URL}
            with contextlib.suppress(NoReverseMatch):  # a project without the admin
                paths.add(reverse("admin:login"))
            self._paths = paths
        return self._paths

    def __call__(self, request):
        if request.method == "POST" and request.path in self._signin_paths():
            try:
                wait_s = throttle.retry_after(request, request.POST.get("username"))
            except unavailable.RedisUnavailable as exc:  # no counts: no unthrottled hashing either
                return unavailable.response(request, exc)
            if wait_s is not None:
                return _too_many(wait_s)
        response = self.get_response(request)
        wait_s = getattr(request, "signin_retry_after", None)
        if wait_s is not None and response.status_code == 200 and request.method == "POST":
            return _too_many(wait_s)  # throttled inside authenticate() (a race with the check above)
        return response


def _too_many(wait_s: int) -> HttpResponse:
    response = HttpResponse(f"Too many failed sign-ins. Try again in {wait_s} seconds.\n",
                            status=429, content_type="text/plain; charset=utf-8")
    response["Retry-After"] = str(wait_s)
    return response


class DatabaseUnavailableMiddleware:
    """A view that fails because the database cannot take it now answers 503 with Retry-After
    (portal.security.unavailable). Failures inside other middleware reach handler500, which
    answers the same."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if unavailable.is_database_unavailable(exception):
            return unavailable.response(request, exception)
        return None
