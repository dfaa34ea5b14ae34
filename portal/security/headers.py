"""Content-Security-Policy on every response.

Strict for scripts: only files served by us ('self'), no inline script, no eval, no plugins; the
templates keep every script in static/js (tests/portal/security/test_csp.py holds them to it) and
htmx is configured not to eval or inject styles (templates/base.html). Style attributes are
allowed (progress bars set widths inline); style elements and foreign stylesheets are not.
A response that already carries its own policy keeps it.
"""

from __future__ import annotations

from django.conf import settings

DEFAULT_POLICY = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "style-src-attr": ["'unsafe-inline'"],
    "img-src": ["'self'", "data:"],
    "font-src": ["'self'"],
    "connect-src": ["'self'"],  # includes ws(s) to the same host (CSP Level 3)
    "object-src": ["'none'"],
    "base-uri": ["'self'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
}


def policy_header(policy: dict[str, list[str]]) -> str:
    return "; ".join(f"{name} {' '.join(values)}".strip() for name, values in policy.items())


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response
        self.header = policy_header(getattr(settings, "TESSERA_CSP", DEFAULT_POLICY))

    def __call__(self, request):
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", self.header)
        return response
