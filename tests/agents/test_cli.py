"""The command line, run as a real process: help, clear refusals, and a simulated agent end to end."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO = "deploy/inventory/demo.yaml"


def agent_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agents", *args],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_help_describes_the_agent_and_its_options():
    done = agent_cli("--help")
    assert done.returncode == 0
    for word in ("--portal", "--token-file", "--simulate", "--node", "--buffer-seconds", "PROTOCOL.md"):
        assert word in done.stdout


def test_the_console_script_points_at_the_cli():
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "tessera-agent"]
    assert script.value == "agents.__main__:main"
    from agents.__main__ import main

    assert script.load() is main


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        ([], {}, "the following arguments are required: --portal"),
        (["--portal", "http://x"], {"TESSERA_AGENT_TOKEN": ""}, "no node token"),
        (["--portal", "ftp://portal", "--token", "t"], {}, "must start with http://, https://, ws:// or wss://"),
        (["--portal", "http://x", "--token", "two words"], {}, "--token: a node token is"),
        (["--portal", "http://x", "--token", "t", "--token-file", "f"], {}, "not allowed with argument"),
        (["--portal", "http://x", "--token-file", "/nonexistent/token"], {},
         "--token-file /nonexistent/token: cannot read"),
        (["--portal", "http://x", "--token", "t", "--interval", "0"], {}, "--interval: 0 is out of range"),
        (["--portal", "http://x", "--token", "t", "--interval", "fast"], {}, "'fast' is not a number"),
        (["--portal", "http://x", "--token", "t", "--buffer-seconds", "60"], {}, "out of range (600 to"),
        (["--portal", "http://x", "--token", "t", "--simulate", "missing.yaml"], {},
         "--simulate missing.yaml: no such file"),
        (["--portal", "http://x", "--token", "t", "--simulate", DEMO], {}, "choose one with --node"),
        (["--portal", "http://x", "--token", "t", "--simulate", DEMO, "--node", "gpu-9"], {},
         "no node named 'gpu-9'"),
        (["--portal", "http://x", "--token", "t", "--seed", "3"], {}, "--seed only applies with --simulate"),
        (["--portal", "http://x", "--token", "t", "--simulate", DEMO, "--node", "t4-node-1",
          "--broker-socket", "/run/b.sock"], {}, "--broker-socket does not apply with --simulate"),
        (["--portal", "http://x", "--token", "t", "--node", "Bad_Name"], {}, "not a Kubernetes node name"),
        (["--portal", "http://x", "--token", "t", "--simulate", DEMO, "--node", "t4-node-1",
          "--remote-server", "gpu-1:7470"], {}, "--remote-server 'gpu-1:7470': give NODE=HOST:PORT"),
        (["--portal", "http://x", "--token", "t", "--no-gpus", "--simulate", DEMO], {},
         "--no-gpus is a node without GPUs: it takes neither --simulate nor --broker-socket"),
        (["--portal", "http://x", "--token", "t", "--no-gpus", "--reserved-cpu", "-5"], {},
         "--reserved-cpu: -5 is out of range"),
        (["--portal", "http://x", "--token", "t", "--no-gpus", "--node", "n1", "--reserved-memory", "16777216"], {},
         "this node's CPU and memory: nothing left for pods"),
        (["--portal", "http://x", "--token", "t", "--no-gpus", "--node", "n1", "--proc-root", "/nonexistent"], {},
         "this node's CPU and memory: cannot read /nonexistent/meminfo"),
    ],
)
def test_bad_arguments_are_refused_with_a_clear_message(args, env, says):
    done = agent_cli(*args, env={"TESSERA_AGENT_TOKEN": "", **env})
    assert done.returncode == 2
    assert says in done.stderr
    assert "Traceback" not in done.stderr


def test_a_bad_inventory_is_refused_naming_the_file_and_field(tmp_path):
    bad = tmp_path / "fleet.yaml"
    bad.write_text("nodes:\n- name: n1\n  gpus: [{model: T4, memory_mib: lots}]\n")
    done = agent_cli("--portal", "http://x", "--token", "t", "--simulate", str(bad))
    assert done.returncode == 2
    assert f"{bad}: nodes[0].gpus[0].memory_mib: Input should be a valid integer" in done.stderr


def test_without_a_gpu_driver_the_agent_says_so_and_points_at_simulate():
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # any failure means: no usable driver here
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVIDIA driver")
    done = agent_cli("--portal", "http://127.0.0.1:9", "--token", "t", "--node", "gpu-1")
    assert done.returncode == 1
    assert "cannot initialise NVML" in done.stderr and "--simulate" in done.stderr


@pytest.mark.asyncio
async def test_a_simulated_agent_process_streams_until_sigterm_and_exits_cleanly(portal, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(portal.token + "\n")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agents", "--portal", f"http://127.0.0.1:{portal.port}",
        "--token-file", str(token_file), "--simulate", DEMO, "--node", "a100-node-1",
        "--interval", "0.1", "--seed", "5", "--log-level", "DEBUG",
        cwd=REPO, stderr=asyncio.subprocess.PIPE,
    )
    try:
        await portal.wait_for(lambda: portal.last_seq >= 10, timeout=30)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), 15)
    log = stderr.decode()
    assert process.returncode == 0, log
    assert portal.handshakes[0][1]["Authorization"] == f"Bearer {portal.token}"
    assert portal.hellos[0].node == "a100-node-1" and len(portal.hellos[0].gpus) == 8
    assert sorted(portal.stored) == list(range(1, portal.last_seq + 1))
    assert "stopped; 0 samples were still unacknowledged" in log
    assert portal.token not in log  # the token never reaches the log
