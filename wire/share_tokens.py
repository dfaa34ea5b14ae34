"""Share tokens for remote GPU shares (format in preload/remote/PROTOCOL.md, checked by
preload/remote/token.c on the GPU node).

``tsr1.<claims>.<mac>``: the claims are the share's terms as ``key=value`` fields, base64url without
padding; the mac is HMAC-SHA256 over ``tsr1.<claims>`` with the GPU node's secret, base64url. The portal
issues one with each remote placement; the node's server runs the client's calls under exactly those
terms, so a client cannot choose its own cap or share.

A token names the placement it was issued for (``attempt``, the reservation's attempt counter, which
grows with every placement): a revocation voids a share's tokens of the attempts before a given one
(wire/PROTOCOL.md 5.5), so a share placed on the same node again gets a new token and its old one is
refused, and the revoked list still holds one entry per share.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import re
import time
from dataclasses import dataclass

PREFIX = "tsr1."
MAX_TOKEN_BYTES = 2048
# A remote share's id and a GPU's as tokens carry them (preload/remote/token.c checks the same);
# the `revoked_shares` message names shares by the same pattern (agent_portal.py).
SHARE_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
_ID_RE = re.compile(SHARE_ID_PATTERN)
PRIORITIES = ("high", "normal", "low")
VERSION = "2"  # 2: with ``attempt``; version 1 (without) is refused, see wire/PROTOCOL.md 5.5
MAX_ATTEMPT = 2**32 - 2  # the server keeps attempts as 32-bit numbers; 2**32 - 1 voids every attempt
CLAIMS = ("v", "share", "attempt", "gpu", "mem", "request", "limit", "priority", "exp")


class TokenError(ValueError):
    """A token that cannot be issued or is not valid."""


@dataclass(frozen=True)
class ShareTerms:
    share: str
    gpu: str
    memory_bytes: int  # 0: no cap
    request: float
    limit: float
    priority: str = "normal"
    attempt: int = 1  # the placement it was issued for (Reservation.attempt)

    def validate(self) -> None:
        if not _ID_RE.fullmatch(self.share):  # fullmatch: `$` alone would let a final newline by
            raise TokenError(f"share id {self.share!r} is not 1-128 of A-Za-z0-9._:-")
        if not _ID_RE.fullmatch(self.gpu):
            raise TokenError(f"GPU {self.gpu!r} is not 1-128 of A-Za-z0-9._:-")
        if not isinstance(self.memory_bytes, int) or self.memory_bytes < 0:
            raise TokenError("memory must be a non-negative number of bytes")
        for name, value in (("request", self.request), ("limit", self.limit)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and 0 < value <= 1):
                raise TokenError(f"{name} must be in (0, 1], not {value!r}")
        if self.request > self.limit:
            raise TokenError("request must not be above the limit")
        if self.priority not in PRIORITIES:
            raise TokenError(f"priority must be one of {', '.join(PRIORITIES)}")
        if not isinstance(self.attempt, int) or not 1 <= self.attempt <= MAX_ATTEMPT:
            raise TokenError(f"attempt must be in 1-{MAX_ATTEMPT}, not {self.attempt!r}")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not re.fullmatch(r"[A-Za-z0-9_-]*", text) or len(text) % 4 == 1:
        raise TokenError("token is not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def issue(secret: bytes, terms: ShareTerms, ttl_s: int = 24 * 3600, now: float | None = None) -> str:
    """A token for ``terms``, valid for ``ttl_s`` seconds, signed with the GPU node's ``secret``."""
    terms.validate()
    if len(secret) < 16:
        raise TokenError("the node secret must be at least 16 bytes")
    if ttl_s <= 0:
        raise TokenError("ttl must be positive")
    expires = int((time.time() if now is None else now) + ttl_s)
    claims = (
        f"v={VERSION} share={terms.share} attempt={terms.attempt} gpu={terms.gpu} mem={terms.memory_bytes} "
        f"request={terms.request:.4f} limit={terms.limit:.4f} priority={terms.priority} exp={expires}"
    )
    body = PREFIX + _b64(claims.encode("ascii"))
    mac = hmac.new(secret, body.encode("ascii"), hashlib.sha256).digest()
    token = f"{body}.{_b64(mac)}"
    if len(token) > MAX_TOKEN_BYTES:
        raise TokenError("token too long")
    return token


def verify(secret: bytes, token: str, now: float | None = None) -> tuple[ShareTerms, int]:
    """The terms and expiry of a token signed with ``secret``; :class:`TokenError` otherwise (the same
    checks as the server's)."""
    if not token.startswith(PREFIX) or token.count(".") != 2:
        raise TokenError("not a Tessera share token (tsr1.…)")
    body, _, sig = token.rpartition(".")
    want = hmac.new(secret, body.encode("ascii"), hashlib.sha256).digest()
    if not hmac.compare_digest(_unb64(sig), want):
        raise TokenError("token signature does not match this node's secret")
    fields: dict[str, str] = {}
    for item in _unb64(body[len(PREFIX):]).decode("ascii").split(" "):
        key, sep, value = item.partition("=")
        if not sep or key in fields:
            raise TokenError(f"token claim {item!r} is malformed or repeated")
        fields[key] = value
    if fields.get("v") != VERSION:
        raise TokenError(f"token version {fields.get('v')!r} is not supported (this side speaks {VERSION})")
    if set(fields) != set(CLAIMS):
        raise TokenError(f"token claims are not those of version {VERSION}")
    if not fields["attempt"].isdigit():
        raise TokenError("token attempt is not a number")
    terms = ShareTerms(fields["share"], fields["gpu"], int(fields["mem"]), float(fields["request"]),
                       float(fields["limit"]), fields["priority"], int(fields["attempt"]))
    terms.validate()
    expires = int(fields["exp"])
    if expires <= (time.time() if now is None else now):
        raise TokenError("token expired")
    return terms, expires
