import logging

from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django.core.cache import cache as default_cache
from django.core.cache.backends.redis import RedisCache
from rest_framework.throttling import BaseThrottle, UserRateThrottle

from portal import internals
from portal.security import throttle, unavailable

log = logging.getLogger(__name__)

# DRF's sliding window (a list of the user's request times, newest first) kept in Redis and
# decided there, in one round trip and atomically: DRF itself reads the list and writes it back
# (two round trips and a pickle of up to `limit` floats on every write request, and two
# concurrent requests could both pass the last free slot). Returns nil when the request is
# allowed (and counted), else {oldest time in the window, requests in it} for `wait`.
WINDOW = """
local key, now, duration, limit = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local oldest = redis.call('LINDEX', key, -1)
while oldest and tonumber(oldest) <= now - duration do
  redis.call('RPOP', key)
  oldest = redis.call('LINDEX', key, -1)
end
local held = redis.call('LLEN', key)
if held >= limit then
  return {oldest, held}
end
redis.call('LPUSH', key, ARGV[1])
redis.call('EXPIRE', key, math.ceil(duration))
return nil
"""


class WriteRateThrottle(UserRateThrottle):
    """Rate-limit writes per user (or per IP when anonymous); reads are paginated, not throttled."""

    scope = "writes"
    # Not DRF's key (throttle_writes_<id>): that one holds DRF's pickled list, this one a Redis list.
    cache_format = "throttle-window_%(scope)s_%(ident)s"
    _window = None  # the registered script, shared by every instance

    def allow_request(self, request, view) -> bool:
        if request.method in ("GET", "HEAD", "OPTIONS"):
            return True
        backend = caches[DEFAULT_CACHE_ALIAS] if self.cache is default_cache else self.cache
        try:
            if isinstance(backend, RedisCache) and self.rate is not None:
                return self._allow_in_redis(backend, request, view)
            return super().allow_request(request, view)
        except unavailable.RedisUnavailable as exc:
            # The counts live in Redis: while it is away, writes go on unthrottled (they are
            # authenticated, and quota still holds) rather than all failing.
            log.warning("write throttle skipped, the cache is unavailable: %s", exc)
            return True

    def _allow_in_redis(self, backend: RedisCache, request, view) -> bool:
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        key = backend.make_and_validate_key(self.key)
        client = internals.redis_client(backend, key)  # Django's own client and connection pool
        cls = type(self)
        if cls._window is None:
            cls._window = client.register_script(WINDOW)
        self.now = self.timer()
        refused = cls._window(keys=[key], args=[repr(self.now), self.duration, self.num_requests], client=client)
        if refused is None:
            self.history = None
            return True
        oldest, held = refused
        self.history = (float(oldest), int(held))
        return self.throttle_failure()

    def wait(self):
        if not isinstance(self.history, tuple):  # DRF's own list (not Redis)
            return super().wait()
        oldest, held = self.history
        available_requests = self.num_requests - held + 1  # as DRF's wait() counts them
        if available_requests <= 0:
            return None
        return (self.duration - (self.now - oldest)) / float(available_requests)


class SignInThrottle(BaseThrottle):
    """Refuses a token request for a username or address with too many failed sign-ins, before the
    password is checked (portal.security.throttle has the counts and why)."""

    def allow_request(self, request, view) -> bool:
        username = request.data.get("username") if isinstance(request.data, dict) else None
        self._wait = throttle.retry_after(request, username if isinstance(username, str) else None)
        return self._wait is None

    def wait(self) -> float | None:
        return self._wait
