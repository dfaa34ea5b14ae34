"""The GPU node's side (listener and worker) built with AddressSanitizer and UndefinedBehaviorSanitizer,
serving both programs, a client killed mid-launch and a client that breaks the protocol: no report."""

from __future__ import annotations

import secrets
import signal
import socket
import struct
import subprocess
import time

import pytest

from agents.remote.probe import probe

from .conftest import LIBRARY, REMOTE, Client, GpuHost, MiB, hello_bytes, image, make, parse_kv

pytestmark = pytest.mark.slow


def runtime(name: str) -> str:
    out = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_server_side_is_clean_under_asan_and_ubsan(built, tmp_path) -> None:
    make("remote-sanitize")
    host = GpuHost(
        tmp_path, secrets.token_hex(32).encode(),
        server_bin=REMOTE / "asan" / "tessera-remote-server", worker_bin=REMOTE / "asan" / "tessera-remote-worker",
        # the sanitizer runtime must come first in the initial library list, before the preload library
        preload=f"{runtime('libasan.so.8')} {LIBRARY}",
        extra_env={"ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:exitcode=66", "UBSAN_OPTIONS": "print_stacktrace=1"},
    ).start()
    try:
        client = Client(host.address, host.token(memory=256 * MiB))
        for program, args in (("drv_prog", [image("cubin"), "--over", 256 * MiB]),
                              ("drv_prog", [image("fatbin")]), ("rt_prog", ["--over", 256 * MiB])):
            r = client.run(program, *args, "--bytes", 9 * MiB + 123, "--launches", 3, "--kernel-us", 1000)
            assert r.returncode == 0, r.stdout + r.stderr
            assert parse_kv(r.stdout)["copy_ok"] == "1"
        victim = client.popen("drv_prog", image("cubin"), "--launches", 100, "--kernel-us", 20000)
        for line in victim.stdout:
            if line.startswith("memset_ok"):
                break
        time.sleep(0.3)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        with socket.create_connection(("127.0.0.1", host.port), timeout=10) as s:
            s.sendall(struct.pack("<IIQ", 1, 20, 0) + b"\0" * 20)  # a hello without a valid token
            s.recv(64)
        # the listener's own paths: partial hellos pushed out by the per-address cap, a probe among them
        crowd = [socket.create_connection(("127.0.0.1", host.port), timeout=10) for _ in range(12)]
        for i, s in enumerate(crowd):
            s.sendall(hello_bytes(host.token())[:1 + i])
        assert probe(host.address, pings=2, nbytes=1 << 16).rtt_ms > 0
        for s in crowd:
            s.close()
        deadline = time.monotonic() + 20
        while "freed" not in host.log and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "freed" in host.log
    finally:
        host.stop()
    assert "Sanitizer" not in host.log, host.log[-4000:]
    assert "runtime error" not in host.log, host.log[-4000:]


def test_the_client_library_is_clean_under_tsan_with_many_threads(gpu_host: GpuHost) -> None:
    make("remote-sanitize")
    client = Client(gpu_host.address, gpu_host.token(),
                    extra_env={"LD_LIBRARY_PATH": str(REMOTE / "tsan"), "TSAN_OPTIONS": "halt_on_error=1 exitcode=66"})
    r = client.run(str(REMOTE / "tsan" / "mt_prog"), image("cubin"), 6, 10, timeout=300)
    assert "ThreadSanitizer" not in r.stderr, r.stderr[-4000:]
    assert r.returncode == 0, r.stdout + r.stderr
    assert parse_kv(r.stdout)["ok"] == "1"
