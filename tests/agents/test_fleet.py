"""Many simulated agents in one process, each with its own token, connection and sequence."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from agents.fleet import main as fleet_main

REPO = Path(__file__).resolve().parents[2]
DEMO = str(REPO / "deploy" / "inventory" / "demo.yaml")


@pytest.mark.asyncio
async def test_a_fleet_process_runs_one_authenticated_stream_per_node(portal, tmp_path):
    tokens = {"a100-node-2": "tok-a100-2", "v100-node-1": "tok-v100-1", "t4-node-1": "tok-t4-1"}
    portal.other_tokens = set(tokens.values())
    (tmp_path / "tokens.yaml").write_text("".join(f"{n}: {t}\n" for n, t in tokens.items()))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agents.fleet", "--portal", f"http://127.0.0.1:{portal.port}",
        "--simulate", DEMO, "--tokens", str(tmp_path / "tokens.yaml"), "--interval", "0.1",
        cwd=REPO, stderr=asyncio.subprocess.PIPE,
    )
    try:
        await portal.wait_for(
            lambda: len(portal.streams) == 3 and all(len(s) >= 10 for s in portal.streams.values()),
            timeout=30,
        )
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), 15)
    assert process.returncode == 0, stderr.decode()
    assert sorted(h.node for h in portal.hellos) == sorted(tokens)
    sent = {h[1]["Authorization"] for h in portal.handshakes}
    assert sent == {f"Bearer {t}" for t in tokens.values()}
    for samples in portal.streams.values():
        assert sorted(samples) == list(range(1, max(samples) + 1))


@pytest.mark.parametrize(
    ("tokens", "extra", "says"),
    [
        ("a100-node-1: ok\nnot-a-node: ok\n", [], "node 'not-a-node' is not in"),
        ("a100-node-1: has space\n", [], "a100-node-1: a node token is"),
        ("- a\n- b\n", [], "must map node names to tokens"),
        ("a100-node-1: ok\n", ["--nodes", "t4-node-1"], "has no token for 't4-node-1'"),
    ],
)
def test_bad_fleet_arguments_are_refused_clearly(tmp_path, capsys, tokens, extra, says):
    (tmp_path / "tokens.yaml").write_text(tokens)
    with pytest.raises(SystemExit) as exited:
        fleet_main(["--portal", "http://x", "--simulate", DEMO, "--tokens", str(tmp_path / "tokens.yaml"),
                    *extra])
    assert exited.value.code == 2
    assert says in capsys.readouterr().err
