"""Every launch path passes the gate: with the local bucket at request 0.2, each path gets ~20% of
the device; without a share set, the same loop gets all of it."""

from __future__ import annotations

import json
import time

import pytest

from .conftest import LIBRARY, Env, fake_env

PATHS = ["launch", "launch_ptsz", "ex", "ex_ptsz", "coop", "coop_ptsz", "graph", "graph_ptsz"]
SECONDS = 4.0


@pytest.fixture(scope="module")
def fractions(built, tmp_path_factory) -> dict[str, float]:
    root = tmp_path_factory.mktemp("paths")
    base = Env(root, fake_env(root)).with_(LD_PRELOAD=str(LIBRARY))
    start_at = f"{time.time() + 1.0:.6f}"
    procs = {}
    for path in [*PATHS, "ungated"]:
        env = base.with_(FAKE_GPU_UUID=f"gpu-{path}")
        if path != "ungated":
            env = env.with_(TESSERA_GPU_REQUEST="0.2", TESSERA_GPU_LIMIT="1.0")
        launch = "launch" if path == "ungated" else path
        args = ["--seconds", SECONDS, "--kernel-us", 1000, "--start-at", start_at, "--path", launch]
        procs[path] = env.popen("kernel_loop", *args)
    out = {}
    for path, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr
        r = json.loads(stdout)
        out[path] = r["busy_s"] / r["wall_s"]
    return out


@pytest.mark.parametrize("path", PATHS)
def test_launch_path_is_gated(fractions: dict[str, float], path: str) -> None:
    assert fractions[path] == pytest.approx(0.2, abs=0.04)


def test_without_a_share_the_loop_owns_the_device(fractions: dict[str, float]) -> None:
    assert fractions["ungated"] > 0.9
