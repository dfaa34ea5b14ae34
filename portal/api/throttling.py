import logging

from rest_framework.throttling import BaseThrottle, UserRateThrottle

from portal.security import throttle, unavailable

log = logging.getLogger(__name__)


class WriteRateThrottle(UserRateThrottle):
    """Rate-limit writes per user (or per IP when anonymous); reads are paginated, not throttled."""

    scope = "writes"

    def allow_request(self, request, view) -> bool:
        if request.method in ("GET", "HEAD", "OPTIONS"):
            return True
        try:
            return super().allow_request(request, view)
        except unavailable.RedisUnavailable as exc:
            # The counts live in Redis: while it is away, writes go on unthrottled (they are
            # authenticated, and quota still holds) rather than all failing.
            log.warning("write throttle skipped, the cache is unavailable: %s", exc)
            return True


class SignInThrottle(BaseThrottle):
    """Refuses a token request for a username or address with too many failed sign-ins, before the
    password is checked (portal.security.throttle has the counts and why)."""

    def allow_request(self, request, view) -> bool:
        username = request.data.get("username") if isinstance(request.data, dict) else None
        self._wait = throttle.retry_after(request, username if isinstance(username, str) else None)
        return self._wait is None

    def wait(self) -> float | None:
        return self._wait
