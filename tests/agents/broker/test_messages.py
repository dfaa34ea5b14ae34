"""The broker's line parser: any bytes are either a valid message or a ProtocolError, never a crash."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.broker.protocol import Acquire, Drain, Hello, ProtocolError, Release, grant_line, parse_line

VERBS = [b"HELLO", b"ACQUIRE", b"RELEASE", b"DRAIN", b"QUERY", b"GRANT", b""]
KEYS = [b"v", b"share", b"gpu", b"pid", b"request", b"limit", b"priority", b"used_us", b"idle", b"x"]
SAMPLES = [b"1", b"0", b"0.5", b"1.0", b"high", b"low", b"nan", b"-1", b"1e9", b"GPU-1", b"a" * 200]
VALUES = st.one_of(st.binary(max_size=12), st.sampled_from(SAMPLES))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash_the_parser(raw: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        parse_line(raw)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(VERBS), st.lists(st.tuples(st.sampled_from(KEYS), VALUES), max_size=9))
def test_near_miss_messages_parse_or_are_refused(verb: bytes, fields: list[tuple[bytes, bytes]]) -> None:
    line = b" ".join([verb, *(k + b"=" + v for k, v in fields)])
    try:
        message = parse_line(line + b"\n")
    except ProtocolError:
        return
    if isinstance(message, Hello):
        assert 0 < message.request <= message.limit <= 1
        assert 1 <= message.pid < 2**31
    if isinstance(message, Acquire | Release):
        assert message.used_s >= 0


def test_a_valid_hello() -> None:
    m = parse_line(b"HELLO v=1 share=res-1 gpu=GPU-ab:0 pid=42 request=0.25 limit=0.5 priority=high\n")
    assert m == Hello(share="res-1", gpu="GPU-ab:0", pid=42, request=0.25, limit=0.5, high_priority=True)


def test_drain_takes_no_fields() -> None:
    assert parse_line(b"DRAIN") == Drain()
    with pytest.raises(ProtocolError):
        parse_line(b"DRAIN used_us=5")


@pytest.mark.parametrize("quota", [0.0, 1e-9, 0.004, 0.05])
def test_grants_are_at_least_a_microsecond(quota: float) -> None:
    assert int(grant_line(quota).split(b"=")[1]) >= 1
