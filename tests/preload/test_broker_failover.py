"""The library outlives its broker: it falls back to the local bucket when the broker dies and
returns to the broker when it is back."""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.agents.broker.process import BrokerProcess

from .conftest import Env

pytestmark = pytest.mark.slow


def test_broker_dies_and_returns(capped: Env) -> None:
    broker = BrokerProcess(capped.root / "broker.sock", capped.root / "broker.log").start()
    broker.define("job", "0", request=0.3, limit=1.0)  # as the node's agent does, again after the restart
    env = capped.with_(TESSERA_GPU_REQUEST="0.3", TESSERA_GPU_LIMIT="1.0", TESSERA_SHARE_ID="job",
                       TESSERA_BROKER_SOCKET=str(broker.socket_path), TESSERA_LOG_LEVEL="info")
    proc = env.popen("kernel_loop", "--seconds", 9, "--kernel-us", 1000)
    try:
        time.sleep(3)
        assert broker.query()["gpus"]["0"]["shares"]["job"]["clients"] == 1
        broker.stop(signal.SIGKILL)  # no goodbye: the socket just goes dead
        time.sleep(3)
        broker.start()
        stdout, stderr = proc.communicate(timeout=30)
        after = broker.query()["gpus"]["0"]["shares"]["job"]
    finally:
        if proc.poll() is None:
            proc.kill()
        broker.stop()
    assert proc.returncode == 0, stderr
    assert "lost the share broker" in stderr
    assert stderr.count("connected to the share broker") == 2  # at the start and after the return
    assert after["used_total_s"] > 1.0  # tokens from the new broker
    busy = json.loads(stdout)["busy_s"]
    # ~3 s alone on the broker, ~3 s at 0.3 locally, ~2 s back on the broker: never stuck
    assert 4.0 < busy < 8.5
