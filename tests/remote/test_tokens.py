"""Share tokens as the portal issues them (wire/share_tokens.py); the server's own checks of the same
format are exercised end to end in test_loopback.py."""

from __future__ import annotations

import time

import pytest

from wire.share_tokens import ShareTerms, TokenError, issue, verify

from .conftest import signed_claims

SECRET = b"0123456789abcdef0123456789abcdef"
TERMS = ShareTerms("res-42", "GPU-8d1c", 12 << 30, 0.3, 0.7, "low", attempt=3)


def test_a_token_carries_the_share_terms_and_its_placement_attempt() -> None:
    token = issue(SECRET, TERMS, ttl_s=60, now=1000)
    terms, expires = verify(SECRET, token, now=1001)
    assert terms == TERMS and terms.attempt == 3
    assert expires == 1060
    assert token.startswith("tsr1.") and len(token) < 300




@pytest.mark.parametrize(
    ("claims", "message"),
    [
        # a version 1 token (before tokens named their placement) cannot be revoked per attempt
        ("v=1 share=res-42 gpu=GPU-1 mem=0 request=0.5 limit=0.5 priority=normal exp=9999999999", "version '1'"),
        ("v=2 share=res-42 gpu=GPU-1 mem=0 request=0.5 limit=0.5 priority=normal exp=9999999999", "claims"),
        ("v=2 share=res-42 attempt=0 gpu=GPU-1 mem=0 request=0.5 limit=0.5 priority=normal exp=9999999999",
         "attempt"),
        ("v=2 share=res-42 attempt=-1 gpu=GPU-1 mem=0 request=0.5 limit=0.5 priority=normal exp=9999999999",
         "attempt"),
    ],
)
def test_tokens_without_a_valid_attempt_are_refused(claims: str, message: str) -> None:
    with pytest.raises(TokenError, match=message):
        verify(SECRET, signed_claims(SECRET, claims))


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
        (ShareTerms("res-42", "GPU-1", 0, 0.5, 0.5, attempt=0), "attempt"),
    ],
)
def test_invalid_terms_are_not_issued(terms: ShareTerms, message: str) -> None:
    with pytest.raises(TokenError, match=message):
        issue(SECRET, terms)


def test_a_short_secret_is_refused() -> None:
    with pytest.raises(TokenError, match="at least 16 bytes"):
        issue(b"short", TERMS)
