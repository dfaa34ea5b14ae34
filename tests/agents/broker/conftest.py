"""A share broker process per test (tests/agents/broker/process.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agents.broker.process import BrokerProcess


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "broker.sock", tmp_path / "broker.log").start()
    yield proc
    proc.stop()
