from rest_framework.throttling import UserRateThrottle


class WriteRateThrottle(UserRateThrottle):
    """Rate-limit writes per user (or per IP when anonymous); reads are paginated, not throttled."""

    scope = "writes"

    def allow_request(self, request, view) -> bool:
        if request.method in ("GET", "HEAD", "OPTIONS"):
            return True
        return super().allow_request(request, view)
