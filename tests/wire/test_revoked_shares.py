"""`revoked_shares` (wire/PROTOCOL.md 5.5): only well-formed, bounded lists of share ids reach the
agent, which writes them into the remote server's revoked-share file."""

from __future__ import annotations

import json

import pytest

from wire import share_tokens as tokens
from wire.agent_portal import (
    AGENT_MESSAGES,
    MAX_REVOKED_SHARES,
    PORTAL_MESSAGES,
    ProtocolError,
    RevokedShares,
    parse,
)

AT = 1_800_000_000


def _frame(shares) -> str:
    return json.dumps({"v": 1, "type": "revoked_shares", "shares": shares})


def test_a_list_of_share_ids_is_accepted():
    message = parse(_frame([{"share": "812", "at": AT, "from_attempt": 2},
                            {"share": "team-a:job_1.2", "at": AT + 5, "from_attempt": 2}]), PORTAL_MESSAGES)
    assert isinstance(message, RevokedShares)
    assert [(s.share, s.at, s.from_attempt) for s in message.shares] == [
        ("812", AT, 2), ("team-a:job_1.2", AT + 5, 2)]


@pytest.mark.parametrize("attempt", [0, -1, tokens.MAX_ATTEMPT + 2, "2", 2.0, None])
def test_attempts_the_server_could_not_take_are_refused(attempt):
    with pytest.raises(ProtocolError) as refused:
        parse(_frame([{"share": "1", "at": AT, "from_attempt": attempt}]), PORTAL_MESSAGES)
    assert "shares[0].from_attempt" in str(refused.value)


def test_an_entry_must_say_from_which_attempt_tokens_stay_valid():
    with pytest.raises(ProtocolError, match="from_attempt"):
        parse(_frame([{"share": "1", "at": AT}]), PORTAL_MESSAGES)


@pytest.mark.parametrize("share", ["", "a b", "x\n", "a/b", "ü", "a" * 129, "812\n813 0", 812])
def test_ids_the_server_could_not_take_are_refused(share):
    # A newline or space in an id would forge a second line of the server's file.
    with pytest.raises(ProtocolError) as refused:
        parse(_frame([{"share": share, "at": AT, "from_attempt": 2}]), PORTAL_MESSAGES)
    assert refused.value.code == "invalid_message"
    assert "shares[0].share" in str(refused.value)


@pytest.mark.parametrize("at", [-1, 0, 4_102_444_801, "1800000000", 1.8e9, None])
def test_times_out_of_range_or_of_the_wrong_type_are_refused(at):
    with pytest.raises(ProtocolError):
        parse(_frame([{"share": "1", "at": at, "from_attempt": 2}]), PORTAL_MESSAGES)


def test_more_than_the_limit_is_refused_and_the_limit_is_accepted():
    entries = [{"share": str(i), "at": AT, "from_attempt": 2} for i in range(MAX_REVOKED_SHARES + 1)]
    with pytest.raises(ProtocolError) as refused:
        parse(_frame(entries), PORTAL_MESSAGES)
    assert "at most 4096" in str(refused.value)
    assert len(parse(_frame(entries[:-1]), PORTAL_MESSAGES).shares) == MAX_REVOKED_SHARES


def test_a_share_listed_twice_or_an_unknown_field_is_refused():
    with pytest.raises(ProtocolError, match="the same share twice"):
        parse(_frame([{"share": "1", "at": AT, "from_attempt": 2}, {"share": "1", "at": AT + 1, "from_attempt": 2}]),
              PORTAL_MESSAGES)
    with pytest.raises(ProtocolError):
        parse(_frame([{"share": "1", "at": AT, "from_attempt": 2, "gpu": "GPU-1"}]), PORTAL_MESSAGES)


def test_only_the_portal_sends_it():
    with pytest.raises(ProtocolError):
        parse(_frame([]), AGENT_MESSAGES)


@pytest.mark.parametrize("share", ["812", "team-a:job_1.2", "a" * 128, "", "a b", "x\n", "a/b", "ü", "a" * 129])
def test_a_share_id_is_revocable_exactly_when_a_token_may_carry_it(share):
    """A share whose token was issued can be revoked, and no id is revocable that no token names."""
    terms = tokens.ShareTerms(share=share, gpu="GPU-1", memory_bytes=0, request=0.5, limit=0.5)
    try:
        terms.validate()
        carried = True
    except tokens.TokenError:
        carried = False
    try:
        parse(_frame([{"share": share, "at": AT, "from_attempt": 2}]), PORTAL_MESSAGES)
        revocable = True
    except ProtocolError:
        revocable = False
    assert carried == revocable
