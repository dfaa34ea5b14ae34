"""ThreadSanitizer and AddressSanitizer builds of the library under many launching, allocating threads
(and a fork), with the broker and with the local token bucket."""

from __future__ import annotations

import subprocess

import pytest

from tests.agents.broker.process import BrokerProcess

from .conftest import BUILD, Env, GiB, make, parse_kv

pytestmark = pytest.mark.slow


def runtime(name: str) -> str:
    out = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.fixture(scope="module")
def sanitized(built) -> None:
    make("sanitize")


@pytest.mark.parametrize("sanitizer", ["tsan", "asan"])
@pytest.mark.parametrize("with_broker", [True, False], ids=["broker", "local-bucket"])
def test_many_launching_threads_are_clean(sanitized, bare: Env, sanitizer: str, with_broker: bool) -> None:
    runtime_lib = runtime("libtsan.so.2" if sanitizer == "tsan" else "libasan.so.8")
    env = bare.with_(
        # the sanitizer runtime must come first in the initial library list
        LD_PRELOAD=f"{runtime_lib} {BUILD / f'libtessera_preload_{sanitizer}.so'}",
        TESSERA_GPU_MEMORY_LIMIT="1Gi",
        TESSERA_GPU_REQUEST="0.5",
        TSAN_OPTIONS="halt_on_error=1 exitcode=66",
        ASAN_OPTIONS="detect_leaks=0 halt_on_error=1",
    )
    broker = None
    if with_broker:
        broker = BrokerProcess(bare.root / "broker.sock", bare.root / "broker.log").start()
        broker.define("default", "0", request=0.5, limit=1.0)  # the library's share and GPU when unnamed
        env = env.with_(TESSERA_BROKER_SOCKET=str(broker.socket_path))
    try:
        result = env.run(f"stress_{sanitizer}", 16, 3000, GiB, 200, timeout=240)
    finally:
        if broker:
            broker.stop()
    assert "Sanitizer" not in result.stderr, result.stderr[-4000:]
    assert result.returncode == 0, result.stderr[-4000:]
    out = parse_kv(result.stdout)
    assert out["failed"] == 0
    assert out["free"] == out["total"] == GiB  # every byte came back
