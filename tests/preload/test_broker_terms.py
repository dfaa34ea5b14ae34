"""The real library against a broker that takes terms only from the node's agent: a process that
edits its environment to claim the whole GPU at high priority is held to its share's terms, and one
that names another reservation's share is refused (and falls back to its own local bucket)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.agents.broker.process import BrokerProcess
from tests.preload.conftest import TEST_BIN, Env

pytestmark = pytest.mark.slow

SECONDS = 4


def test_claims_in_the_environment_are_ignored_and_another_share_is_refused(capped: Env) -> None:
    broker = BrokerProcess(capped.root / "broker.sock", capped.root / "broker.log").start()
    broker.define("small", "0", request=0.2, limit=0.2, priority="low")  # the agent's word
    claims = capped.with_(TESSERA_SHARE_ID="small", TESSERA_GPU_REQUEST="1.0", TESSERA_GPU_LIMIT="1.0",
                          TESSERA_PRIORITY="high", TESSERA_BROKER_SOCKET=str(broker.socket_path),
                          TESSERA_LOG_LEVEL="info")
    cmd = [str(TEST_BIN / "kernel_loop"), "--seconds", str(SECONDS), "--kernel-us", "1000"]
    try:
        # a process of another pod (its own session) naming the same share
        impostor = subprocess.Popen(cmd, env=claims.vars, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, start_new_session=True)
        stdout, stderr = claims.popen("kernel_loop", *cmd[1:]).communicate(timeout=SECONDS + 60)
        impostor_out, impostor_err = impostor.communicate(timeout=SECONDS + 60)
        share = broker.query()["gpus"]["0"]["shares"]["small"]
        stats = broker.query()
    finally:
        broker.stop()
    assert "connected to the share broker" in stderr
    assert (share["request"], share["limit"], share["priority"]) == (0.2, 0.2, "low")
    served = json.loads(stdout)
    # held to the agent's limit of 0.2 (the first second's window included), not the 1.0 it claimed
    assert served["busy_s"] / served["wall_s"] <= 0.3, served
    assert share["used_total_s"] <= 0.2 * SECONDS + 0.3
    assert "share broker refused this process (ERR refused:" in impostor_err
    assert "not in share small's sessions" in impostor_err
    assert stats["refused_hellos"] >= 1
    assert impostor.returncode == 0 and json.loads(impostor_out)["busy_s"] > 0
