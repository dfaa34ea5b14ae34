"""Share tokens as the portal issues them (wire/share_tokens.py); the server's own checks of the same
format are exercised end to end in test_loopback.py."""

from __future__ import annotations

import time

import pytest

from wire.share_tokens import ShareTerms, TokenError, issue, verify

SECRET = b"0123456789abcdef0123456789abcdef"
TERMS = ShareTerms("res-42", "GPU-8d1c", 12 << 30, 0.3, 0.7, "low")


def test_a_token_carries_the_share_terms() -> None:
    token = issue(SECRET, TERMS, ttl_s=60, now=1000)
    terms, expires = verify(SECRET, token, now=1001)
    assert terms == TERMS
    assert expires == 1060
    assert token.startswith("tsr1.") and len(token) < 300


def test_tampered_expired_or_foreign_tokens_are_refused() -> None:
    token = issue(SECRET, TERMS, ttl_s=60, now=time.time())
    _, _, sig = token.rpartition(".")
    forged = issue(SECRET, ShareTerms("res-42", "GPU-8d1c", 80 << 30, 1.0, 1.0), now=time.time()).split(".")[1]
    with pytest.raises(TokenError, match="signature"):
        verify(SECRET, f"tsr1.{forged}.{sig}")
    with pytest.raises(TokenError, match="signature"):
        verify(b"another secret, 16+ bytes", token)
    with pytest.raises(TokenError, match="expired"):
        verify(SECRET, token, now=time.time() + 120)
    with pytest.raises(TokenError, match="not a Tessera share token"):
        verify(SECRET, "Bearer abc")


@pytest.mark.parametrize(
    ("terms", "message"),
    [
        (ShareTerms("res 42", "GPU-1", 0, 0.5, 0.5), "share id"),
        (ShareTerms("res-42", "GPU/1", 0, 0.5, 0.5), "GPU"),
        (ShareTerms("res-42", "GPU-1", -1, 0.5, 0.5), "memory"),
        (ShareTerms("res-42", "GPU-1", 0, 0.0, 0.5), "request must be in"),
        (ShareTerms("res-42", "GPU-1", 0, 0.8, 0.5), "above the limit"),
        (ShareTerms("res-42", "GPU-1", 0, 0.5, 0.5, "urgent"), "priority"),
    ],
)
def test_invalid_terms_are_not_issued(terms: ShareTerms, message: str) -> None:
    with pytest.raises(TokenError, match=message):
        issue(SECRET, terms)


def test_a_short_secret_is_refused() -> None:
    with pytest.raises(TokenError, match="at least 16 bytes"):
        issue(b"short", TERMS)
