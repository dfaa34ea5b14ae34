"""A person's webhook: Slack-compatible JSON (`{"text": ...}`) posted to a URL they gave.

The URL is checked when it is saved and again, with its addresses resolved, before each post:
https only (plain http where TESSERA_WEBHOOK_ALLOW_HTTP says so: the demo and the tests), and only
public addresses unless TESSERA_WEBHOOK_ALLOW_PRIVATE (so nobody uses the portal to reach what
sits behind it). The connection goes to the address that was checked (a name that resolves
elsewhere a moment later is not followed), redirects are not followed, every try has a timeout,
and the Celery task retries a bounded number of times."""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings


class WebhookRefused(ValueError):
    """The URL may not be used; the message says why, in the person's words."""


class WebhookFailed(Exception):
    def __init__(self, message: str, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str
    address: str  # the checked address the connection goes to


def check(url: str, resolve: bool = True) -> Target:
    """The URL's target, or WebhookRefused saying what is wrong with it."""
    parts = urlsplit(url.strip())
    allowed = ("https", "http") if settings.TESSERA_WEBHOOK_ALLOW_HTTP else ("https",)
    if parts.scheme not in allowed:
        raise WebhookRefused("The webhook URL must start with https://.")
    if not parts.hostname:
        raise WebhookRefused("The webhook URL needs a host name, e.g. https://hooks.slack.com/services/….")
    if parts.username or parts.password:
        raise WebhookRefused("Put no user name or password in the webhook URL; use a secret path instead.")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise WebhookRefused("The webhook URL's port is not a number between 1 and 65535.") from None
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if not resolve:
        return Target(parts.scheme, parts.hostname, port, path, "")
    try:
        infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise WebhookRefused(f"The host {parts.hostname} of the webhook URL cannot be found.") from None
    addresses = [info[4][0] for info in infos]
    if not settings.TESSERA_WEBHOOK_ALLOW_PRIVATE:
        for address in addresses:
            ip = ipaddress.ip_address(address.split("%")[0])
            if not ip.is_global:
                raise WebhookRefused(f"The webhook URL leads to a private address ({ip}); use a public one.")
    return Target(parts.scheme, parts.hostname, port, path, addresses[0])


class _PinnedHTTPS(http.client.HTTPSConnection):
    """HTTPS to the checked address, with the certificate checked for the URL's host name."""

    def __init__(self, target: Target, timeout: float) -> None:
        self._tls = ssl.create_default_context()
        super().__init__(target.host, target.port, timeout=timeout, context=self._tls)
        self._address = target.address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(sock, server_hostname=self.host)


def post(url: str, text: str) -> None:
    """One try: POST {"text": text}. Raises WebhookRefused (the URL may not be used) or WebhookFailed
    (with whether another try may help: the server unreachable, 5xx or 429)."""
    target = check(url)
    timeout = settings.TESSERA_WEBHOOK_TIMEOUT_S
    if target.scheme == "https":
        conn: http.client.HTTPConnection = _PinnedHTTPS(target, timeout)
    else:
        conn = http.client.HTTPConnection(target.address, target.port, timeout=timeout)
    body = json.dumps({"text": text}).encode()
    host = target.host if target.port in (80, 443) else f"{target.host}:{target.port}"
    try:
        conn.request("POST", target.path, body=body, headers={
            "Host": host, "Content-Type": "application/json", "User-Agent": "Tessera notifications"})
        status = conn.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        raise WebhookFailed(f"could not reach {target.host}: {exc}", retry=True) from None
    finally:
        conn.close()
    if status >= 300:
        raise WebhookFailed(f"{target.host} answered {status}", retry=status >= 500 or status == 429)
