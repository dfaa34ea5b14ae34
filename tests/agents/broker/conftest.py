"""A share broker process per test (tests/agents/broker/process.py), with the shares the tests name
defined by the test as the node agent would, tied to the test's session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agents.broker.process import BrokerProcess


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "broker.sock", tmp_path / "broker.log").start()
    for share in ("s1", "s2", "sa", "sb"):
        proc.define(share, "GPU-t", request=0.5, limit=1.0)
    yield proc
    proc.stop()
