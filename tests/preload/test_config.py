"""The environment is read strictly: a clear message, and never a looser share than asked for."""

from __future__ import annotations

import re

import pytest

from .conftest import Env


def effective_share(env: Env) -> tuple[str, tuple[float, float, str] | None]:
    """Runs a short launch loop and reads the share the library settled on from its info log."""
    result = env.with_(TESSERA_LOG_LEVEL="info").run("kernel_loop", "--seconds", "0.2", "--kernel-us", "100")
    assert result.returncode == 0, result.stderr
    m = re.search(r"compute share request ([\d.]+) limit ([\d.]+) priority (\w+)", result.stderr)
    return result.stderr, (float(m[1]), float(m[2]), m[3]) if m else None


@pytest.mark.parametrize(
    ("request_", "limit", "expected", "message"),
    [
        ("0.3", "0.7", (0.3, 0.7), None),
        ("0.3", None, (0.3, 0.3), None),  # no limit: no burst above the request
        (None, "0.6", (0.6, 0.6), None),
        ("0.8", "0.4", (0.4, 0.4), "exceeds TESSERA_GPU_LIMIT"),
        ("0.5", "lots", (0.5, 0.5), 'TESSERA_GPU_LIMIT="lots" is not a share'),
        ("1.5", "1.0", (0.01, 1.0), 'TESSERA_GPU_REQUEST="1.5" is not a share'),
        ("0", "0.5", (0.01, 0.5), 'TESSERA_GPU_REQUEST="0" is not a share'),
        ("nan", "nan", (0.01, 0.01), "is not a share"),
    ],
)
def test_gpu_request_reading(capped: Env, request_, limit, expected, message) -> None:
    stderr, share = effective_share(capped.with_(TESSERA_GPU_REQUEST=request_, TESSERA_GPU_LIMIT=limit))
    assert share is not None, stderr
    assert share[:2] == pytest.approx(expected)
    if message:
        assert message in stderr
    else:
        assert "error" not in stderr


def test_no_share_given_means_no_gate(capped: Env) -> None:
    stderr, share = effective_share(capped)
    assert share is None
    assert "unreachable" not in stderr  # the broker is never asked


@pytest.mark.parametrize(("value", "expected", "complaint"), [("high", "high", False), ("low", "low", False),
                                                              ("urgent", "low", True)])
def test_priority_reading(capped: Env, value: str, expected: str, complaint: bool) -> None:
    stderr, share = effective_share(capped.with_(TESSERA_GPU_REQUEST="0.5", TESSERA_PRIORITY=value))
    assert share is not None and share[2] == expected
    assert ("TESSERA_PRIORITY" in stderr) == complaint


def test_bad_log_level_is_named(capped: Env) -> None:
    result = capped.with_(TESSERA_LOG_LEVEL="chatty").run("hog", 1, 1, 0)
    assert 'TESSERA_LOG_LEVEL="chatty"' in result.stderr


def test_bad_share_id_is_replaced_not_trusted(capped: Env) -> None:
    env = capped.with_(TESSERA_SHARE_ID="../../etc/passwd", TESSERA_GPU_MEMORY_LIMIT="1Gi")
    result = env.run("hog", 1, 1, 0)
    assert "TESSERA_SHARE_ID may hold only" in result.stderr
