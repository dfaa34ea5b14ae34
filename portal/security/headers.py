"""Content-Security-Policy on every response.

Strict for scripts: only files served by us ('self'), no inline script, no eval, no plugins; the
templates keep every script in static/js (tests/portal/security/test_csp.py holds them to it) and
htmx is configured not to eval or inject styles (templates/base.html). Style attributes are
allowed (progress bars set widths inline); style elements and foreign stylesheets are not, except
those carrying the response's style nonce: a page that renders `request.csp_style_nonce` (the
terminal, whose xterm.js makes its own style elements and takes no nonce: static/js/terminal.js
stamps it on them) gets `style-src-elem 'self' 'nonce-…'` for that response only.
A response that already carries its own policy keeps it.
"""

from __future__ import annotations

import secrets

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


class StyleNonce:
    """Made when a template first renders it; a response whose page never did allows no style element."""

    value: str | None = None

    def __str__(self) -> str:
        if self.value is None:
            self.value = secrets.token_urlsafe(18)
        return self.value


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response
        self.policy = getattr(settings, "TESSERA_CSP", DEFAULT_POLICY)
        self.header = policy_header(self.policy)

    def __call__(self, request):
        request.csp_style_nonce = nonce = StyleNonce()
        response = self.get_response(request)
        header = self.header
        if nonce.value is not None:
            styles = self.policy.get("style-src", ["'self'"])
            header = policy_header({**self.policy, "style-src-elem": [*styles, f"'nonce-{nonce.value}'"]})
        response.headers.setdefault("Content-Security-Policy", header)
        return response
