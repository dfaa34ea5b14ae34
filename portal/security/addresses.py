"""The client's address, believing X-Forwarded-For only as far as our own proxies wrote it.

Each trusted proxy appends the address it received the request from; with N trusted proxies in
front (settings.TESSERA_TRUSTED_PROXIES) the client is the N-th address from the right, and
whatever the client wrote itself further left is ignored. With none, REMOTE_ADDR is the client.
The same rule as DRF's NUM_PROXIES, which the settings set to the same number.
"""

from __future__ import annotations

from django.conf import settings


def client_address(meta: dict) -> str:
    remote = meta.get("REMOTE_ADDR") or ""
    proxies = int(getattr(settings, "TESSERA_TRUSTED_PROXIES", 0))
    forwarded = meta.get("HTTP_X_FORWARDED_FOR")
    if proxies <= 0 or not forwarded:
        return remote
    hops = [h.strip() for h in forwarded.split(",") if h.strip()]
    if not hops:
        return remote
    return hops[-min(proxies, len(hops))]
