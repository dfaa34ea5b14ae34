"""A launching thread that wakes late to the token it asked for (descheduled on a busy machine, or in a
signal handler) finds the token handed back as idle: it must ask again, not wait for ever."""

from __future__ import annotations

import json

import pytest

from tests.agents.broker.process import BrokerProcess

from .conftest import Env

pytestmark = pytest.mark.slow

SECONDS = 4


@pytest.mark.parametrize(("via", "at_least"), [("local bucket", 0.15), ("broker", 0.5)])
def test_a_launcher_that_wakes_late_keeps_launching(capped: Env, via: str, at_least: float) -> None:
    broker = BrokerProcess(capped.root / "broker.sock", capped.root / "broker.log").start() if via == "broker" else None
    env = capped.with_(TESSERA_GPU_REQUEST="0.3", TESSERA_GPU_LIMIT="1.0", TESSERA_SHARE_ID="late")
    if broker is not None:
        broker.define("late", "0", request=0.3, limit=1.0)
        env = env.with_(TESSERA_BROKER_SOCKET=str(broker.socket_path))
    try:
        # every 80 ms the launching thread is held up for 20 ms: often just as its token arrives
        result = env.run("kernel_loop", "--seconds", SECONDS, "--kernel-us", 1000, "--stall-ms", 20, timeout=60)
    finally:
        if broker is not None:
            broker.stop()
    assert result.returncode == 0, result.stderr
    r = json.loads(result.stdout)
    # a process that lost its demand stops launching after its first late wake-up (a few % of the run)
    assert r["busy_s"] / r["wall_s"] >= at_least, r
